//! `/`: every mesh with its CAs and the rollout now in progress, the zone egress identity, the last
//! rejected update, and the token and database when there are.

use axum::extract::State;
use axum::response::Response;
use maud::{html, Markup};
use meshca_control::{CaStatus, Detail, MeshStatus, Status};

use super::super::admin::AdminState;

/// The whole page.
pub(super) async fn page(State(s): State<AdminState>) -> Response {
    match s.status.get(Detail::Summary).await {
        Ok(reply) => super::page(
            "overview",
            html! { div #overview { (render(&reply.status)) } },
        ),
        Err(e) => super::page(
            "overview",
            html! { p.error { "no status: " (e.to_string()) } },
        ),
    }
}

/// The part the script refreshes.
pub(super) async fn fragment(State(s): State<AdminState>) -> Response {
    match s.status.get(Detail::Summary).await {
        Ok(reply) => super::fragment(render(&reply.status)),
        Err(e) => super::fragment(html! { p.error { "no status: " (e.to_string()) } }),
    }
}

/// The overview of `status`.
pub(crate) fn render(status: &Status) -> Markup {
    html! {
        @for mesh in &status.meshes {
            (mesh_section(mesh, status))
        }
        @if status.meshes.is_empty() {
            p { "No mesh yet: add a Mesh resource." }
        }
        section.egress {
            h2 { "Zone egress" }
            @match (&status.egress.mesh, &status.egress.issuer) {
                (Some(mesh), Some(issuer)) => p { "identity from mesh " b { (mesh) } ", issued by " (issuer) },
                _ => p { "no egress identity: " (status.egress.reason.as_deref().unwrap_or("none configured")) },
            }
        }
        @if let Some(rejected) = &status.last_rejected_update {
            section.rejected {
                h2 { "Rejected update (" (rejected.at) ")" }
                ul {
                    @for e in &rejected.errors {
                        li { code { (e.file) } " " (e.resource) " " code { (e.field) } ": " (e.message) }
                    }
                }
            }
        }
    }
}

fn mesh_section(mesh: &MeshStatus, status: &Status) -> Markup {
    let on_issuer: Vec<(&String, &usize)> = mesh.proxies_by_issuer.iter().collect();
    let waits: Vec<_> = status
        .rollout
        .iter()
        .filter(|w| w.mesh.to_string() == mesh.name)
        .collect();
    html! {
        section.mesh data-mesh=(mesh.name) {
            h2 { "Mesh " (mesh.name) }
            p.proxies { (mesh.connected_proxies) " connected proxies" }
            @if !on_issuer.is_empty() {
                div.bars {
                    @for (issuer, count) in &on_issuer {
                        (bar(issuer, **count, mesh.connected_proxies))
                    }
                }
            }
            @if let Some(mtls) = &mesh.mtls {
                table.backends {
                    thead { tr { th { "backend" } th { "role" } th { "CA" } th { "expires" } } }
                    tbody {
                        @for b in &mtls.backends {
                            tr { td { (b.name) } td { (b.role.as_str()) } (ca_cells(b.ca.as_ref())) }
                        }
                    }
                }
            }
            @if !mesh.mesh_identities.is_empty() {
                table.identities {
                    thead { tr { th { "MeshIdentity" } th { "trust domain" } th { "conditions" } th { "CA" } th { "expires" } } }
                    tbody {
                        @for i in &mesh.mesh_identities {
                            tr {
                                td { (i.name) } td { (i.trust_domain) }
                                td { @for c in &i.conditions { span.condition title=(c.message) { (c.kind) "=" (c.status) } " " } }
                                (ca_cells(i.ca.as_ref()))
                            }
                        }
                    }
                }
            }
            @if waits.is_empty() {
                p.rollout.idle { "No rollout waits." }
            } @else {
                div.rollout {
                    h3 { "Rollout in progress" }
                    @for w in &waits {
                        p.wait data-timeout=(w.timeout_in_seconds) {
                            b { (w.step.as_str()) } " for CA " (w.ca) " since " (w.since) ": waits for "
                            (w.waiting_count) " proxies"
                            @if !w.waiting_for.is_empty() { " (" (w.waiting_for.join(", ")) ")" }
                            "; proceeds anyway in " span.countdown { (w.timeout_in_seconds) } " s"
                        }
                    }
                }
            }
        }
    }
}

fn ca_cells(ca: Option<&CaStatus>) -> Markup {
    html! {
        @match ca {
            Some(ca) => {
                td title=(ca.id) { (ca.subject) }
                td { (ca.not_after) }
            }
            None => { td { "—" } td { "—" } }
        }
    }
}

/// A bar of `count` proxies out of `total` on `issuer`.
fn bar(issuer: &str, count: usize, total: usize) -> Markup {
    let percent = (count * 100).checked_div(total).unwrap_or(0);
    html! {
        div.bar {
            span.label { (issuer) ": " span.count { (count) } " / " (total) }
            progress max=(total) value=(count) { (percent) "%" }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped() {
        let markup = bar("<script>alert(1)</script>", 1, 2).into_string();
        assert!(!markup.contains("<script>"), "{markup}");
        assert!(markup.contains("&lt;script&gt;"), "{markup}");
    }
}
