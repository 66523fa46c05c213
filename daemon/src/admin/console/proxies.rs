//! `/proxies`: every dataplane with its certificate, filtered by mesh, service, issuer, SPIFFE ID text or
//! expiry within N seconds (query parameters, so a filtered view is a link to share).

use axum::extract::{Query, State};
use axum::response::Response;
use maud::{html, Markup};
use meshca_control::{DataplaneStatus, Detail};
use serde::Deserialize;

use super::super::AdminState;

/// The filters of the table, all optional.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Filter {
    mesh: Option<String>,
    /// A `kuma.io/service` of one of its inbounds.
    service: Option<String>,
    issuer: Option<String>,
    /// Text the SPIFFE ID or the name contains (a service's name finds its proxies).
    search: Option<String>,
    /// Only certificates expiring within this many seconds.
    expiring: Option<i64>,
}

impl Filter {
    fn keeps(&self, dp: &DataplaneStatus) -> bool {
        let nonempty =
            |v: &Option<String>| v.as_deref().filter(|v| !v.is_empty()).map(str::to_owned);
        nonempty(&self.mesh).is_none_or(|m| dp.mesh == m)
            && nonempty(&self.service).is_none_or(|n| dp.services.contains(&n))
            && nonempty(&self.issuer).is_none_or(|i| dp.issuer.as_deref() == Some(i.as_str()))
            && nonempty(&self.search).is_none_or(|s| {
                dp.name.contains(&s) || dp.spiffe_id.as_deref().is_some_and(|id| id.contains(&s))
            })
            && self
                .expiring
                .is_none_or(|n| dp.expires_in_seconds.is_some_and(|e| e <= n))
    }
}

/// The whole page.
pub(super) async fn page(State(s): State<AdminState>, Query(filter): Query<Filter>) -> Response {
    match s.status.get(Detail::Full).await {
        Ok(reply) => {
            let rows: Vec<&DataplaneStatus> = reply
                .status
                .dataplanes
                .iter()
                .filter(|dp| filter.keeps(dp))
                .collect();
            super::page(
                "proxies",
                render(&filter, &rows, reply.status.dataplanes.len()),
            )
        }
        Err(e) => super::page(
            "proxies",
            html! { p.error { "no status: " (e.to_string()) } },
        ),
    }
}

fn render(filter: &Filter, rows: &[&DataplaneStatus], total: usize) -> Markup {
    html! {
        form.filters method="get" action="/proxies" {
            label { "mesh " input name="mesh" value=[filter.mesh.as_deref()]; }
            label { "service " input name="service" value=[filter.service.as_deref()]; }
            label { "issuer " input name="issuer" value=[filter.issuer.as_deref()]; }
            label { "name or SPIFFE ID " input name="search" value=[filter.search.as_deref()]; }
            label { "expiring within (s) " input name="expiring" type="number" value=[filter.expiring]; }
            button type="submit" { "filter" }
        }
        p { (rows.len()) " of " (total) " proxies" }
        table.proxies {
            thead { tr { th { "mesh" } th { "name" } th { "service" } th { "SPIFFE ID" } th { "issuer" } th { "expires" }
                th { "regenerations" } th { "streams" } th { "NACKs" } } }
            tbody {
                @for dp in rows {
                    tr data-proxy=(format!("{}/{}", dp.mesh, dp.name)) {
                        td { (dp.mesh) }
                        td { a href=(super::proxy_href(&dp.mesh, &dp.name)) { (dp.name) } }
                        td { (dp.services.join(", ")) }
                        td { (dp.spiffe_id.as_deref().unwrap_or("—")) }
                        td { (dp.issuer.as_deref().unwrap_or("—")) }
                        td { (dp.not_after.as_deref().unwrap_or(dp.reason.as_deref().unwrap_or("—"))) }
                        td { (dp.regenerations) } td { (dp.streams) }
                        td title=[dp.last_nack.as_deref()] { (dp.nacks) }
                    }
                }
            }
        }
    }
}
