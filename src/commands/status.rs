//! `meshca status`: a running daemon's meshes, backends, proxies and expiring certificates.

use std::process::ExitCode;

use anyhow::{anyhow, Context};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use meshca_control::{
    BundleKey, DataplaneStatus, EgressStatus, MeshStatus, Rejected, RolloutStep, Status, Wait,
};
use serde_json::Value;

use super::human_duration;
use crate::cli::{Output, StatusArgs};

/// GETs `path` from the admin API and parses the JSON body.
pub async fn admin_get(admin: &str, path: &str) -> anyhow::Result<Value> {
    let uri: hyper::Uri = format!("http://{admin}{path}")
        .parse()
        .with_context(|| format!("--admin {admin:?} is not host:port"))?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let response = client.get(uri).await.map_err(|e| {
        anyhow!("cannot reach the admin API at {admin}: {e} (is `meshca serve` running?)")
    })?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| anyhow!("reading the admin API response: {e}"))?
        .to_bytes();
    if !status.is_success() {
        return Err(anyhow!(
            "the admin API answered {status}: {}",
            String::from_utf8_lossy(&body).trim()
        ));
    }
    serde_json::from_slice(&body).context("the admin API answered something that is not JSON")
}

pub async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let document = admin_get(&args.admin, "/api/status").await?;
    if args.output == Output::Json {
        super::print_json(&document)?;
        return Ok(ExitCode::SUCCESS);
    }
    let database = document.get("database").cloned();
    let token = document.get("keystore_token").cloned();
    let workloads = document.get("workload_registrations").cloned();
    let federation = document.get("federation").cloned();
    let endpoints = document.get("federation_endpoints").cloned();
    let status: Status = serde_json::from_value(document)
        .context("the admin API's status document is not one this meshca understands")?;
    for mesh in &status.meshes {
        print_mesh(mesh);
    }
    print_egress(&status.egress);
    println!();
    print_dataplanes(&status.dataplanes);
    print_rollout(&status.rollout);
    if let Some(workloads) = workloads {
        print_workloads(&workloads);
    }
    if let Some(federation) = federation {
        print_federation(&federation);
    }
    if let Some(endpoints) = endpoints {
        print_endpoints(&endpoints);
    }
    if let Some(rejected) = &status.last_rejected_update {
        print_rejected(rejected);
    }
    if let Some(database) = database {
        print_database(&database);
    }
    if let Some(token) = token {
        print_token(&token);
    }
    Ok(ExitCode::SUCCESS)
}

/// The Workload API's registrations, each with the SPIFFE ID it serves and the callers' open streams.
fn print_workloads(registrations: &serde_json::Value) {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_owned();
    let registrations = registrations
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    println!();
    println!("Workload API registrations: {}", registrations.len());
    for r in registrations {
        let selectors: Vec<String> = r["selectors"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        let serves = match (r["spiffe_id"].as_str(), r["no_identity"].as_str()) {
            (Some(id), _) => id.to_owned(),
            (None, Some(reason)) => format!("no identity: {reason}"),
            (None, None) => "identity not ready yet".to_owned(),
        };
        let on = r["agent"]
            .as_str()
            .map_or_else(|| "this server".to_owned(), |a| format!("agent {a}"));
        println!(
            "  {}/{} → dataplane {} ({serves}), on {on}, selectors [{}]",
            text(&r["mesh"]),
            text(&r["name"]),
            text(&r["dataplane"]),
            selectors.join(", ")
        );
        if let Some(reason) = r["not_served"].as_str() {
            println!("    no caller reaches it: {reason}");
        }
        for stream in r["streams"].as_array().into_iter().flatten() {
            println!(
                "    {} by pid {} (uid {}, gid {})",
                text(&stream["method"]),
                stream["pid"],
                stream["uid"],
                stream["gid"]
            );
        }
    }
}

/// Each federated trust domain: its endpoint, the bundle held, its age and condition, the last fetch.
fn print_federation(federation: &serde_json::Value) {
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    let peers = federation.as_array().map(Vec::as_slice).unwrap_or_default();
    if peers.is_empty() {
        return;
    }
    println!();
    println!("Federated trust domains: {}", peers.len());
    for p in peers {
        let relationships: Vec<String> = p["relationships"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        println!(
            "  {} ({}): {} {}, for {}",
            text(&p["trust_domain"]),
            text(&p["condition"]),
            text(&p["profile"]),
            text(&p["url"]),
            relationships.join(", ")
        );
        println!(
            "    holds {} X.509 and {} JWT authorities from {}, sequence {}, {} s old; fetches ok {}, failed {}, refused {}; next {}",
            text(&p["x509_authorities"]),
            text(&p["jwt_authorities"]),
            text(&p["held_from"]),
            text(&p["sequence"]),
            text(&p["age_seconds"]),
            text(&p["fetches"]["ok"]),
            text(&p["fetches"]["failed"]),
            text(&p["fetches"]["refused"]),
            text(&p["next_fetch"]),
        );
        if let Some(error) = p["last_error"].as_str() {
            println!("    last fetch: {error}");
        }
    }
}

/// Each bundle endpoint meshca serves: the sequence, since when each authority, who fetched it.
fn print_endpoints(endpoints: &serde_json::Value) {
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    let endpoints = endpoints.as_array().map(Vec::as_slice).unwrap_or_default();
    if endpoints.is_empty() {
        return;
    }
    println!();
    println!("Bundle endpoints served: {}", endpoints.len());
    for e in endpoints {
        println!(
            "  {}: sequence {}, {} JWT authorities",
            text(&e["trust_domain"]),
            text(&e["sequence"]),
            text(&e["jwt_authorities"])
        );
        for a in e["x509_authorities"].as_array().into_iter().flatten() {
            let id = text(&a["id"]);
            let since = match &a["served_since"] {
                serde_json::Value::Null => "the first bundle served".to_owned(),
                v => text(v),
            };
            let retired = match &a["retired_until"] {
                serde_json::Value::Null => String::new(),
                until => format!(
                    " (its CA was removed: served until {}, when the last certificate it signed expires)",
                    text(until)
                ),
            };
            println!(
                "    authority {}… served since {since}{retired}",
                &id[..id.len().min(16)]
            );
        }
        for f in e["fetched_by"].as_array().into_iter().flatten() {
            println!(
                "    fetched by {}: {} times, last {} (sequence {})",
                text(&f["peer"]),
                text(&f["fetches"]),
                text(&f["last"]),
                text(&f["sequence"])
            );
        }
    }
}

/// The PKCS#11 token holding the CA keys (`keystore.pkcs11`).
fn print_token(token: &serde_json::Value) {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_owned();
    println!();
    if token["up"].as_bool() == Some(true) {
        println!(
            "PKCS#11 token {:?}: answers (module {})",
            text(&token["label"]),
            text(&token["module"])
        );
    } else {
        println!(
            "PKCS#11 token {:?}: DOES NOT ANSWER since {}: {}; no new certificate is signed until it does (module {})",
            text(&token["label"]),
            text(&token["since"]),
            text(&token["reason"]),
            text(&token["module"])
        );
    }
}

/// The replicas' database and every replica's last heartbeat (`keystore.type: postgres`).
fn print_database(database: &serde_json::Value) {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_owned();
    println!();
    match database["up"].as_bool() {
        Some(true) => println!(
            "database: answers (this replica: {})",
            text(&database["replica"])
        ),
        _ => {
            println!(
                "database: DOES NOT ANSWER (this replica: {}): {}",
                text(&database["replica"]),
                text(&database["error"])
            );
            for waiting in database["waiting"].as_array().into_iter().flatten() {
                println!("  waiting: {}", text(waiting));
            }
        }
    }
    println!(
        "{:<24} {:>14} {:>8} {:>8}  state",
        "replica", "heartbeat", "proxies", "streams"
    );
    for replica in database["replicas"].as_array().into_iter().flatten() {
        let age = replica["heartbeat_age_seconds"]
            .as_f64()
            .unwrap_or(f64::NAN);
        let state = match replica["live"].as_bool() {
            Some(true) => "live",
            _ => "gone (lease expired)",
        };
        println!(
            "{:<24} {:>14} {:>8} {:>8}  {state}",
            text(&replica["name"]),
            format!("{age:.1}s ago"),
            replica["proxies"].as_u64().unwrap_or(0),
            replica["streams"].as_u64().unwrap_or(0),
        );
    }
    let peers: Vec<String> = database["rollout_peers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|peer| match peer["readable"].as_bool() {
            Some(true) if peer["gone"].as_bool() == Some(true) => format!(
                "{} (gone: its last state holds while its proxies reconnect)",
                text(&peer["name"])
            ),
            Some(true) => text(&peer["name"]),
            _ => format!(
                "{} (state not readable: holds every step)",
                text(&peer["name"])
            ),
        })
        .collect();
    match peers.is_empty() {
        true => println!("rollouts gated with: this replica alone"),
        false => println!("rollouts gated with: {}", peers.join(", ")),
    }
}

/// `-` for what is absent.
fn or_dash(value: Option<&str>) -> &str {
    value.unwrap_or("-")
}

fn print_mesh(mesh: &MeshStatus) {
    println!("mesh {}", mesh.name);
    if let Some(mtls) = &mesh.mtls {
        println!(
            "  mTLS enabled backend: {}",
            or_dash(mtls.enabled_backend.as_deref())
        );
        for b in &mtls.backends {
            let expiry =
                b.ca.as_ref()
                    .map_or_else(|| "-".into(), |ca| human_duration(ca.expires_in_seconds));
            println!(
                "    backend {} ({}, {}): CA expires in {expiry}",
                b.name,
                b.kind.as_str(),
                b.role.as_str()
            );
        }
    }
    for id in &mesh.mesh_identities {
        let ready = id
            .conditions
            .iter()
            .find(|c| c.kind == "Ready")
            .map(|c| match c.reason.as_str() {
                // Who issues instead of meshca (SPIRE, or a Kuma extension by name).
                "ManagedExternally" => format!("{}/{} ({})", c.status, c.reason, c.message),
                _ => format!("{}/{}", c.status, c.reason),
            })
            .unwrap_or_default();
        // What keeps it from being Ready (e.g. DependenciesReady=False/MeshServicesDisabled), in full.
        let why = id
            .conditions
            .iter()
            .find(|c| c.kind != "Ready" && c.status == "False")
            .map(|c| format!("; {}=False/{}: {}", c.kind, c.reason, c.message))
            .unwrap_or_default();
        println!(
            "  MeshIdentity {} ({}, trust domain {}): Ready={ready}{why}",
            id.name, id.provider, id.trust_domain
        );
    }
    for t in &mesh.mesh_trusts {
        let kept_in = t
            .keystore_path
            .as_ref()
            .map(|p| format!(", keystore {p}"))
            .unwrap_or_default();
        println!(
            "  MeshTrust {} ({}): {} ({} CA{kept_in})",
            t.name,
            t.origin.as_str(),
            t.trust_domain,
            t.certificates
        );
    }
    let connected = mesh.connected_proxies;
    let parts: Vec<String> = mesh
        .proxies_by_issuer
        .iter()
        .map(|(issuer, n)| format!("{issuer}: {n}/{connected}"))
        .collect();
    println!(
        "  proxies: {connected} connected{}{}",
        if parts.is_empty() { "" } else { "; " },
        parts.join(", ")
    );
}

fn print_dataplanes(dataplanes: &[DataplaneStatus]) {
    println!(
        "{:<12} {:<20} {:<10} {:<48} {:<10}",
        "MESH", "DATAPLANE", "CONNECTED", "SPIFFE ID", "EXPIRES"
    );
    for dp in dataplanes {
        let expires = dp
            .expires_in_seconds
            .map_or_else(|| "-".into(), human_duration);
        println!(
            "{:<12} {:<20} {:<10} {:<48} {:<10}",
            dp.mesh,
            dp.name,
            if dp.connected { "yes" } else { "no" },
            or_dash(dp.spiffe_id.as_deref()),
            expires
        );
        if let Some(reason) = &dp.reason {
            println!("    no identity: {reason}");
        }
        if let Some(refused) = &dp.refused_token {
            println!("    token refused: {refused}");
        }
        if dp.nacks > 0 {
            println!(
                "    {} NACK(s), last: {}",
                dp.nacks,
                or_dash(dp.last_nack.as_deref())
            );
        }
    }
}

fn print_egress(egress: &EgressStatus) {
    match (&egress.mesh, &egress.reason) {
        (Some(mesh), _) => println!(
            "zone egress identity: mesh {mesh} ({}), {}; accepted IDs: {}",
            egress
                .chosen_by
                .map_or_else(|| "-".to_owned(), |c| c.to_string()),
            or_dash(egress.issuer.as_deref()),
            if egress.spiffe_ids.is_empty() {
                "none yet".to_owned()
            } else {
                egress.spiffe_ids.join(", ")
            }
        ),
        (None, Some(reason)) => println!("zone egress identity: none: {reason}"),
        (None, None) => {}
    }
}

fn print_rollout(waits: &[Wait]) {
    if waits.is_empty() {
        return;
    }
    println!();
    println!("rollout in progress:");
    for w in waits {
        println!("{}", rollout_line(w));
    }
}

/// One waiting rollout step. A `sans-before-identity` step waits on a SPIFFE ID in a `meshservice:`
/// context (its `ca` says which), every other step on a CA.
fn rollout_line(w: &Wait) -> String {
    let scope = match &w.mesh {
        BundleKey::Egress => "the zone egress bundle".to_owned(),
        BundleKey::Mesh(mesh) => format!("mesh {mesh}"),
    };
    let subject = match w.step {
        RolloutStep::SansBeforeIdentity => w.ca.clone(),
        _ => format!("CA {}", w.ca),
    };
    if w.step == RolloutStep::Federation {
        // No timeout shortens it: it ends when peers polling as told hold the CA.
        return format!(
            "  {scope}: {} for {subject} since {}: waiting for {}; issues from it in {}",
            w.step,
            w.since,
            w.waiting_for.join(", "),
            human_duration(w.timeout_in_seconds)
        );
    }
    format!(
        "  {scope}: {} for {subject} since {}: waiting for {} prox{} ({}); proceeds anyway in {}",
        w.step,
        w.since,
        w.waiting_count,
        if w.waiting_count == 1 { "y" } else { "ies" },
        w.waiting_for.join(", "),
        human_duration(w.timeout_in_seconds)
    )
}

fn print_rejected(rejected: &Rejected) {
    println!();
    println!(
        "last resource update REJECTED at {} (the previous configuration keeps serving):",
        rejected.at
    );
    for e in &rejected.errors {
        println!("  {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(step: RolloutStep, ca: &str) -> Wait {
        Wait {
            mesh: BundleKey::mesh("default"),
            step,
            ca: ca.into(),
            since: "2026-11-23T07:00:00Z".into(),
            timeout_in_seconds: 25,
            waiting_for: vec!["default.client-1".into()],
            waiting_count: 1,
        }
    }

    #[test]
    fn a_rollout_line_names_the_ca_or_the_spiffe_id_it_waits_on() {
        assert_eq!(
            rollout_line(&wait(RolloutStep::TrustBeforeIdentity, "CN=ca-2")),
            "  mesh default: trust-before-identity for CA CN=ca-2 since 2026-11-23T07:00:00Z: waiting for 1 proxy (default.client-1); proceeds anyway in 0m25s"
        );
        assert_eq!(
            rollout_line(&wait(
                RolloutStep::SansBeforeIdentity,
                "spiffe://default/b/web-1 in meshservice:web"
            )),
            "  mesh default: sans-before-identity for spiffe://default/b/web-1 in meshservice:web since 2026-11-23T07:00:00Z: waiting for 1 proxy (default.client-1); proceeds anyway in 0m25s"
        );
    }
}
