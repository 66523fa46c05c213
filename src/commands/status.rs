//! `meshca status`: a running daemon's meshes, backends, proxies and expiring certificates.

use std::process::ExitCode;

use anyhow::{anyhow, Context};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

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

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn human_duration(secs: i64) -> String {
    let (sign, secs) = if secs < 0 { ("-", -secs) } else { ("", secs) };
    let (d, h, m) = (secs / 86_400, secs % 86_400 / 3600, secs % 3600 / 60);
    if d > 0 {
        format!("{sign}{d}d{h}h")
    } else if h > 0 {
        format!("{sign}{h}h{m}m")
    } else {
        format!("{sign}{m}m{}s", secs % 60)
    }
}

pub async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let status = admin_get(&args.admin, "/api/status").await?;
    if args.output == Output::Json {
        super::print_json(&status)?;
        return Ok(ExitCode::SUCCESS);
    }
    let empty = Vec::new();
    for mesh in status["meshes"].as_array().unwrap_or(&empty) {
        println!("mesh {}", s(&mesh["name"]));
        if let Some(mtls) = mesh["mtls"].as_object() {
            println!("  mTLS enabled backend: {}", s(&mtls["enabled_backend"]));
            for b in mtls["backends"].as_array().unwrap_or(&empty) {
                let ca = &b["ca"];
                let expiry = ca["expires_in_seconds"]
                    .as_i64()
                    .map(human_duration)
                    .unwrap_or_else(|| "-".into());
                println!(
                    "    backend {} ({}, {}): CA expires in {expiry}",
                    s(&b["name"]),
                    s(&b["type"]),
                    s(&b["role"])
                );
            }
        }
        for id in mesh["mesh_identities"].as_array().unwrap_or(&empty) {
            let ready = id["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
                .map(|c| format!("{}/{}", s(&c["status"]), s(&c["reason"])))
                .unwrap_or_default();
            println!(
                "  MeshIdentity {} ({}, trust domain {}): Ready={ready}",
                s(&id["name"]),
                s(&id["provider"]),
                s(&id["trust_domain"])
            );
        }
        for t in mesh["mesh_trusts"].as_array().unwrap_or(&empty) {
            println!(
                "  MeshTrust {} ({}): {} ({} CA)",
                s(&t["name"]),
                s(&t["origin"]),
                s(&t["trust_domain"]),
                s(&t["certificates"])
            );
        }
        let connected = mesh["connected_proxies"].as_u64().unwrap_or(0);
        if let Some(by) = mesh["proxies_by_issuer"].as_object() {
            let parts: Vec<String> = by
                .iter()
                .map(|(k, v)| format!("{k}: {}/{connected}", s(v)))
                .collect();
            println!(
                "  proxies: {connected} connected{}{}",
                if parts.is_empty() { "" } else { "; " },
                parts.join(", ")
            );
        }
    }
    println!();
    println!(
        "{:<12} {:<20} {:<10} {:<48} {:<10}",
        "MESH", "DATAPLANE", "CONNECTED", "SPIFFE ID", "EXPIRES"
    );
    for dp in status["dataplanes"].as_array().unwrap_or(&empty) {
        let expires = dp["expires_in_seconds"]
            .as_i64()
            .map(human_duration)
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<12} {:<20} {:<10} {:<48} {:<10}",
            s(&dp["mesh"]),
            s(&dp["name"]),
            if dp["connected"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
            s(&dp["spiffe_id"]),
            expires
        );
        if let Some(reason) = dp["reason"].as_str() {
            println!("    no identity: {reason}");
        }
        if dp["nacks"].as_u64().unwrap_or(0) > 0 {
            println!(
                "    {} NACK(s), last: {}",
                s(&dp["nacks"]),
                s(&dp["last_nack"])
            );
        }
    }
    let waits = status["rollout"].as_array().unwrap_or(&empty);
    if !waits.is_empty() {
        println!();
        println!("rollout in progress:");
        for w in waits {
            let names: Vec<String> = w["waiting_for"]
                .as_array()
                .unwrap_or(&empty)
                .iter()
                .map(s)
                .collect();
            println!(
                "  mesh {}: {} for CA {} since {}: waiting for {} prox{} ({}){}",
                s(&w["mesh"]),
                s(&w["step"]),
                s(&w["ca"]),
                s(&w["since"]),
                s(&w["waiting_count"]),
                if w["waiting_count"].as_u64() == Some(1) {
                    "y"
                } else {
                    "ies"
                },
                names.join(", "),
                w["timeout_in_seconds"]
                    .as_i64()
                    .map(|t| format!("; proceeds anyway in {}", human_duration(t)))
                    .unwrap_or_default()
            );
        }
    }
    if let Some(r) = status["last_rejected_update"].as_object() {
        println!();
        println!(
            "last resource update REJECTED at {} (the previous configuration keeps serving):",
            s(&r["at"])
        );
        for e in r["errors"].as_array().unwrap_or(&empty) {
            println!(
                "  {}: {}: {}: {}",
                s(&e["file"]),
                s(&e["resource"]),
                s(&e["field"]),
                s(&e["message"])
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
