//! `/proxies/{mesh}/{name}`: one proxy: its certificate, why it has none, its NACKs, and each open
//! stream with the resources it subscribes to and the version it ACKed last.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use meshca_control::{DataplaneStatus, Detail, ProxyKey};

use super::super::AdminState;

/// The page of one proxy; 404 when no dataplane has that name.
pub(super) async fn page(
    State(s): State<AdminState>,
    Path((mesh, name)): Path<(String, String)>,
) -> Response {
    let title = format!("proxy {mesh}/{name}");
    let key = ProxyKey::new(mesh.as_str(), name.as_str());
    match s.status.get(Detail::Dataplane(key)).await {
        Ok(reply) => match reply.status.dataplanes.first() {
            Some(dp) => super::page(&title, render(dp, reply.status.generation)),
            None => {
                let body = html! {
                    p.error { "No dataplane " b { (name) } " in mesh " b { (mesh) } "." }
                    p { a href="/proxies" { "every proxy" } }
                };
                (StatusCode::NOT_FOUND, super::page(&title, body)).into_response()
            }
        },
        Err(e) => super::page(&title, html! { p.error { "no status: " (e.to_string()) } }),
    }
}

fn render(dp: &DataplaneStatus, generation: u64) -> Markup {
    let row = |label: &str, value: Option<&str>| {
        html! { tr { th { (label) } td { (value.unwrap_or("—")) } } }
    };
    html! {
        section.proxy data-proxy=(format!("{}/{}", dp.mesh, dp.name)) {
            h2 { "Proxy " (dp.name) " in mesh " (dp.mesh) }
            table.certificate {
                tbody {
                    (row("connected", Some(if dp.connected { "yes" } else { "no" })))
                    (row("services", Some(&dp.services.join(", "))))
                    (row("SPIFFE ID", dp.spiffe_id.as_deref()))
                    (row("issuer", dp.issuer.as_deref()))
                    (row("serial", dp.serial.as_deref()))
                    (row("expires", dp.not_after.as_deref()))
                    (row("regenerations", Some(&dp.regenerations.to_string())))
                    (row("no certificate because", dp.reason.as_deref()))
                    (row("token refused because", dp.refused_token.as_deref()))
                    (row("NACKs", Some(&dp.nacks.to_string())))
                    (row("last NACK", dp.last_nack.as_deref()))
                }
            }
        }
        section.streams {
            h2 { (dp.streams) " open streams" }
            p { "The latest snapshot is generation " (generation) ". A stream ACKs one version for all the resources it subscribes to." }
            table.streams {
                thead { tr { th { "resources" } th { "ACKed version" } th { "ACKed generation" } th { "token" } } }
                tbody {
                    @for stream in &dp.stream_details {
                        tr {
                            td {
                                @if stream.resources.is_empty() { "(a fetch)" }
                                @for r in &stream.resources { code { (r) } " " }
                            }
                            td { (stream.acked_version.as_deref().unwrap_or("none yet")) }
                            td { @match stream.acked_generation { Some(g) => (g), None => "—" } }
                            td { (if stream.zone_egress { "zone egress" } else { "dataplane" }) }
                        }
                    }
                }
            }
        }
    }
}
