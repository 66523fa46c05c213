//! `/`: every mesh with its CAs and the rollout now in progress, the zone egress identity, the last
//! rejected update, and the token and database when there are.

use std::collections::BTreeSet;

use axum::extract::State;
use axum::response::Response;
use maud::{html, Markup, PreEscaped};
use meshca_control::{CaStatus, Detail, MeshStatus, RolloutStep, Status, Wait};

use super::super::AdminState;
use crate::replica::DatabaseView;
use crate::rollouts::{Rollout, Timeline};

/// The whole page.
pub(super) async fn page(State(s): State<AdminState>) -> Response {
    let overview = s.console.overview(&s).await;
    super::page(
        "overview",
        html! { div #overview { (PreEscaped(&*overview)) } },
    )
}

/// The part the script refreshes.
pub(super) async fn fragment(State(s): State<AdminState>) -> Response {
    let overview = s.console.overview(&s).await;
    super::fragment(PreEscaped(overview.to_string()))
}

/// The overview now, rendered (the console shares it between the browsers that ask at once).
pub(super) async fn build(s: &AdminState) -> String {
    let (status, federation) = match s.status.get(Detail::Summary).await {
        Ok(reply) => (
            render(&reply.status, &s.metrics.timeline()),
            federation(s, &reply.world),
        ),
        Err(e) => (
            html! { p.error { "no status: " (e.to_string()) } },
            html! {},
        ),
    };
    let database = s.database.as_ref().map(|view| view.borrow().clone());
    let token = s.token.as_ref().map(|t| (t.label().to_owned(), t.status()));
    html! {
        (status)
        (federation)
        (state(database.as_deref(), token.as_ref()))
    }
    .into_string()
}

/// The trust domains followed (each relationship: its endpoint, the bundle held, its age and condition,
/// the last fetch) and the bundles served (their sequence, since when each authority, who fetched);
/// nothing when there is no federation.
fn federation(s: &AdminState, world: &meshca_control::World) -> Markup {
    let followed = s
        .federation
        .relationships(world, std::time::SystemTime::now());
    let followed = serde_json::to_value(followed).unwrap_or_default();
    let served: Vec<serde_json::Value> = s
        .served_bundles
        .iter()
        .map(|(td, (bundle, fetches))| {
            crate::bundle_endpoints::endpoint_status(td, bundle, fetches)
        })
        .collect();
    let followed = followed.as_array().cloned().unwrap_or_default();
    if followed.is_empty() && served.is_empty() {
        return html! {};
    }
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "–".to_owned(),
        other => other.to_string(),
    };
    html! {
        section.federation {
            h2 { "Federation" }
            @if !followed.is_empty() {
                table.followed {
                    thead { tr {
                        th { "trust domain" } th { "for" } th { "endpoint" } th { "bundle held" }
                        th { "age" } th { "condition" } th { "fetches" } th { "last fetch" } th { "next" }
                    } }
                    tbody {
                        @for p in &followed {
                            tr data-condition=(text(&p["condition"])) {
                                td { (text(&p["trust_domain"])) }
                                td { (p["relationships"].as_array().map(|r| r.iter().map(text).collect::<Vec<_>>().join(", ")).unwrap_or_default()) }
                                td { (text(&p["profile"])) " " code { (text(&p["url"])) } }
                                td { "from " (text(&p["held_from"])) ", sequence " (text(&p["sequence"])) ", "
                                     (text(&p["x509_authorities"])) " X.509 and " (text(&p["jwt_authorities"])) " JWT authorities" }
                                td { (text(&p["age_seconds"])) " s" }
                                td { @if p["condition"] == "Stale" { b.error { "Stale" } } @else { "Fresh" } }
                                td { "ok " (text(&p["fetches"]["ok"])) ", failed " (text(&p["fetches"]["failed"])) ", refused " (text(&p["fetches"]["refused"])) }
                                td { (text(&p["last_attempt"])) @if let Some(e) = p["last_error"].as_str() { br; span.error { (e) } } }
                                td { (text(&p["next_fetch"])) }
                            }
                        }
                    }
                }
            }
            @for e in &served {
                p.served {
                    "Bundle endpoint of " b { (text(&e["trust_domain"])) } " serves sequence " (text(&e["sequence"])) ", "
                    (e["x509_authorities"].as_array().map_or(0, Vec::len)) " X.509 authorities."
                    @for a in e["x509_authorities"].as_array().into_iter().flatten().filter(|a| !a["retired_until"].is_null()) {
                        " A removed CA (" code { (text(&a["id"]).chars().take(16).collect::<String>()) "…" } ") is served until " (text(&a["retired_until"])) ", when the last certificate it signed expires."
                    }
                }
                @if let Some(fetchers) = e["fetched_by"].as_array().filter(|f| !f.is_empty()) {
                    ul.fetched {
                        @for f in fetchers {
                            li { "fetched by " code { (text(&f["peer"])) } ": " (text(&f["fetches"])) " times, last " (text(&f["last"])) " (sequence " (text(&f["sequence"])) ")" }
                        }
                    }
                }
            }
        }
    }
}

/// Where the state is kept: the database and its replicas, or files; and the PKCS#11 token.
fn state(
    database: Option<&DatabaseView>,
    token: Option<&(String, meshca_hsm::TokenStatus)>,
) -> Markup {
    html! {
        section.state {
            h2 { "State and keys" }
            @match database {
                Some(db) => {
                    p.database data-up=(db.up) {
                        "PostgreSQL database: "
                        @if db.up { b { "answers" } } @else {
                            b.error { "DOES NOT ANSWER" } " (" (db.error.as_deref().unwrap_or("no answer")) ")"
                        }
                        "; this replica is " b { (db.replica) } "."
                    }
                    @if !db.up {
                        ul { @for w in &db.waiting { li { "waits: " (w) } } }
                    }
                    table.replicas {
                        thead { tr { th { "replica" } th { "live" } th { "last heartbeat" } th { "proxies" } th { "streams" } th { "started" } } }
                        tbody {
                            @for r in &db.replicas {
                                tr {
                                    td { (r.name) } td { (if r.live { "yes" } else { "gone" }) }
                                    td { (format!("{:.1}", r.heartbeat_age_seconds)) " s ago" }
                                    td { (r.proxies) } td { (r.streams) } td { (r.started_at) }
                                }
                            }
                        }
                    }
                }
                None => p.database { "Files in the data directory: one replica, no database." }
            }
            @if let Some((label, status)) = token {
                p.token data-up=(status.up) {
                    "CA keys in PKCS#11 token " b { (label) } ": "
                    @if status.up { "answers" } @else {
                        b.error { "DOES NOT ANSWER" }
                        " (" (status.reason.as_deref().unwrap_or("no answer")) "): nothing new is signed until it returns"
                    }
                    " since " (meshca_control::rfc3339(status.since)) "."
                }
            }
        }
    }
}

/// The overview of `status`.
pub(crate) fn render(status: &Status, timeline: &Timeline) -> Markup {
    html! {
        @for mesh in &status.meshes {
            (mesh_section(mesh, status, timeline.latest(&mesh.name)))
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

fn mesh_section(mesh: &MeshStatus, status: &Status, rollout: Option<&Rollout>) -> Markup {
    let mut waits: Vec<&Wait> = status
        .rollout
        .iter()
        .filter(|w| w.mesh.to_string() == mesh.name)
        .collect();
    waits.sort_by_key(|w| position(w.step));
    let issuing = issuing(mesh);
    let issuers: BTreeSet<&str> = issuing
        .iter()
        .map(String::as_str)
        .chain(mesh.proxies_by_issuer.keys().map(String::as_str))
        .collect();
    html! {
        section.mesh data-mesh=(mesh.name) {
            h2 { "Mesh " (mesh.name) }
            p.proxies { (mesh.connected_proxies) " connected proxies" }
            div.bars {
                @for issuer in &issuers {
                    (bar(
                        issuer,
                        mesh.proxies_by_issuer.get(*issuer).copied().unwrap_or(0),
                        mesh.connected_proxies,
                        issuing.iter().any(|i| i == issuer),
                    ))
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
            (rollout_picture(&waits, rollout))
        }
    }
}

/// Who issues in `mesh` now, spelled as the proxies' issuers are: the enabled backend, and every
/// MeshIdentity meshca holds a CA for.
fn issuing(mesh: &MeshStatus) -> Vec<String> {
    let backend = mesh
        .mtls
        .as_ref()
        .and_then(|m| m.enabled_backend.as_ref())
        .map(|name| format!("backend {name}"));
    let identities = mesh
        .mesh_identities
        .iter()
        .filter(|i| i.ca.is_some())
        .map(|i| format!("MeshIdentity {}", i.name));
    backend.into_iter().chain(identities).collect()
}

/// The steps of a rollout, in the order the gate takes them, with what each one guarantees.
const STEPS: [(RolloutStep, &str, &str); 5] = [
    (
        RolloutStep::TrustBeforeIdentity,
        "Trust before identity",
        "every proxy trusts the new CA before any proxy presents a certificate from it",
    ),
    (
        RolloutStep::Federation,
        "Federation",
        "peers of the trust domain fetched the new CA from its bundle endpoint before anything is issued from it",
    ),
    (
        RolloutStep::SansBeforeIdentity,
        "SANs before identity",
        "every client accepts a new SPIFFE ID before a proxy presents it",
    ),
    (
        RolloutStep::IdentityAck,
        "Identity",
        "proxies get certificates from the new CA; each one is waited for until it ACKs",
    ),
    (
        RolloutStep::BreakLast,
        "Break last",
        "a removed CA stays trusted until no connected proxy presents it",
    ),
];

/// Where `step` comes in a rollout.
fn position(step: RolloutStep) -> usize {
    STEPS
        .iter()
        .position(|(s, ..)| *s == step)
        .unwrap_or(STEPS.len())
}

/// Where a step stands in the mesh's rollout: waiting now, done, still to come (after the first step
/// that waits), or not needed (skipped, or the rollout is over without it).
fn step_state(step: RolloutStep, waits: &[&Wait], rollout: Option<&Rollout>) -> &'static str {
    let first_waiting = waits.iter().map(|w| position(w.step)).min();
    if waits.iter().any(|w| w.step == step) {
        "waiting"
    } else if rollout.is_some_and(|r| r.ended_step(step)) {
        "done"
    } else if first_waiting.is_some_and(|first| position(step) > first) {
        "to come"
    } else {
        "not needed"
    }
}

/// What a step waits for the proxies to ACK.
fn acked_resource(step: RolloutStep) -> &'static str {
    match step {
        RolloutStep::TrustBeforeIdentity => {
            "the mesh's trust (system_trust_bundle, and the meshservice: contexts that carry it)"
        }
        RolloutStep::SansBeforeIdentity => "the meshservice: context named above",
        RolloutStep::IdentityAck => "their new identity certificate",
        RolloutStep::BreakLast => {
            "their new identity certificate (until then they present the old CA's)"
        }
        RolloutStep::Federation => {
            "nothing: the peers of the trust domain fetch its bundle endpoint as their refresh hint tells them"
        }
    }
}

/// The mesh's rollout as steps (the waiting one marked), who each wait is for and its countdown, and
/// when the last rollout began and ended.
fn rollout_picture(waits: &[&Wait], rollout: Option<&Rollout>) -> Markup {
    let when = rollout.map(|r| {
        (
            meshca_control::rfc3339(r.started),
            r.ended.map(meshca_control::rfc3339),
        )
    });
    html! {
        div.rollout data-state=(if waits.is_empty() { "idle" } else { "in-progress" }) {
            @match (&when, waits.is_empty()) {
                (_, false) => h3 { "Rollout in progress"
                    @if let Some((started, _)) = &when { " since " (started) } },
                (Some((started, Some(ended))), true) => h3 { "Last rollout: " (started) " to " (ended) },
                _ => p.idle { "No rollout waits." },
            }
            @if !waits.is_empty() || when.is_some() {
                ol.steps {
                    @for (step, title, guarantee) in STEPS {
                        @let state = step_state(step, waits, rollout);
                        li.step data-step=(step.as_str()) data-state=(state) {
                            b { (title) } " — " (guarantee)
                            " " span.state { (state) }
                        }
                    }
                }
            }
            @for w in waits {
                p.wait data-step=(w.step.as_str()) data-timeout=(w.timeout_in_seconds) {
                    b { (w.step.as_str()) } " for " (w.ca) " since " (w.since) ": waits for "
                    span.waiting-count { (w.waiting_count) }
                    (if w.waiting_count == 1 { " proxy" } else { " proxies" })
                    " to ACK " (acked_resource(w.step))
                    @if !w.waiting_for.is_empty() {
                        " (" span.waiting-for { (w.waiting_for.join(", ")) } ")"
                    }
                    "; proceeds anyway in " span.countdown { (w.timeout_in_seconds) } " s"
                }
            }
            @if when.is_some() {
                p { a href="/rollouts" { "timeline of the last rollouts" } }
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

/// A bar of `count` proxies out of `total` on `issuer`; `issuing` marks who issues now.
fn bar(issuer: &str, count: usize, total: usize, issuing: bool) -> Markup {
    let percent = (count * 100).checked_div(total).unwrap_or(0);
    html! {
        div.bar.issuing[issuing] data-issuer=(issuer) {
            span.label {
                (issuer) ": " span.count { (count) } " / " span.total { (total) }
                @if issuing { " (issuing)" } @else { " (replaced)" }
            }
            progress max=(total) value=(count) { (percent) "%" }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(step: RolloutStep) -> Wait {
        Wait {
            mesh: meshca_control::BundleKey::mesh("m"),
            step,
            ca: "CN=ca-2".into(),
            since: "2026-11-28T00:00:00Z".into(),
            timeout_in_seconds: 30,
            waiting_for: vec!["m.p-0".into()],
            waiting_count: 1,
        }
    }

    #[test]
    fn steps_after_the_first_waiting_one_are_to_come_and_those_before_not_needed() {
        let trust = wait(RolloutStep::TrustBeforeIdentity);
        let break_last = wait(RolloutStep::BreakLast);
        let waits = [&trust, &break_last];
        let state = |step| step_state(step, &waits, None);
        assert_eq!(state(RolloutStep::TrustBeforeIdentity), "waiting");
        assert_eq!(state(RolloutStep::SansBeforeIdentity), "to come");
        assert_eq!(state(RolloutStep::IdentityAck), "to come");
        assert_eq!(state(RolloutStep::BreakLast), "waiting");
        let identity = wait(RolloutStep::IdentityAck);
        let state = |step| step_state(step, &[&identity], None);
        assert_eq!(state(RolloutStep::TrustBeforeIdentity), "not needed");
        assert_eq!(state(RolloutStep::BreakLast), "to come");
        assert_eq!(step_state(RolloutStep::BreakLast, &[], None), "not needed");
    }

    #[test]
    fn values_are_escaped() {
        let markup = bar("<script>alert(1)</script>", 1, 2, true).into_string();
        assert!(!markup.contains("<script>"), "{markup}");
        assert!(markup.contains("&lt;script&gt;"), "{markup}");
    }
}
