//! `meshca workload fetch`: ask a SPIFFE Workload API socket what this process would get, print it,
//! and with `x509 --write DIR` write it as `meshca issue` does.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::Context;
use meshca_ca::CertInfo;
use meshca_workload::client::{
    parse_endpoint, Certificates, WorkloadClient, X509Context, ENDPOINT_SOCKET_VAR,
};
use serde::Serialize;

use super::issue::{write_files, Files};
use crate::cli::{Output, WorkloadFetch, WorkloadFetchArgs};
use crate::InvalidInput;

pub async fn run(args: WorkloadFetchArgs) -> anyhow::Result<ExitCode> {
    let socket = socket(&args)?;
    let mut client = WorkloadClient::connect(&socket).await?;
    match args.what {
        WorkloadFetch::X509(x509) => {
            let context = client.fetch_x509().await?;
            let written = match &x509.write {
                Some(dir) => Some(write(dir, &context)?),
                None => None,
            };
            print_x509(&context, written, x509.output)
        }
        WorkloadFetch::Bundles(out) => {
            let bundles = client.fetch_bundles().await?;
            let report = BundlesReport {
                trust_domains: bundles
                    .iter()
                    .map(|(td, certs)| {
                        Ok(TrustDomainReport {
                            trust_domain: td.to_string(),
                            cas: describe(certs, &format!("the bundle of {td}"))?,
                        })
                    })
                    .collect::<anyhow::Result<_>>()?,
            };
            print_bundles(&report, out.output)
        }
        WorkloadFetch::Jwt(jwt) => {
            let spiffe_id = jwt
                .spiffe_id
                .as_deref()
                .map(|id| {
                    id.parse().map_err(|e| {
                        anyhow::Error::new(InvalidInput(format!("--spiffe-id {id:?}: {e}")))
                    })
                })
                .transpose()?;
            let tokens = client.fetch_jwt(jwt.audience, spiffe_id.as_ref()).await?;
            let report = JwtReport {
                svids: tokens
                    .iter()
                    .map(|t| JwtEntry {
                        spiffe_id: t.spiffe_id.to_string(),
                        hint: t.hint.clone(),
                        token: t.token.as_str(),
                    })
                    .collect(),
            };
            match jwt.output {
                Output::Json => super::print_json(&report)?,
                Output::Human => {
                    for entry in &report.svids {
                        println!("{}{}", entry.spiffe_id, hint_note(&entry.hint));
                        println!("{}", entry.token);
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `--socket`, else `SPIFFE_ENDPOINT_SOCKET` (unset or empty: not given), else the settings'
/// first `workloadApi.listen` socket.
fn socket(args: &WorkloadFetchArgs) -> anyhow::Result<PathBuf> {
    if let Some(value) = &args.socket {
        return parse_endpoint(value).map_err(|e| InvalidInput(format!("--socket: {e}")).into());
    }
    if let Some(value) = std::env::var_os(ENDPOINT_SOCKET_VAR).filter(|v| !v.is_empty()) {
        return parse_endpoint(&value)
            .map_err(|e| InvalidInput(format!("{ENDPOINT_SOCKET_VAR}: {e}")).into());
    }
    let settings = super::load_settings(args.config.config.as_deref())?;
    let first = settings.workload_api.listen.first().ok_or_else(|| {
        InvalidInput(format!(
            "no --socket, no {ENDPOINT_SOCKET_VAR}, and the settings turn the Workload API off (workloadApi.listen is empty)"
        ))
    })?;
    std::path::absolute(first)
        .with_context(|| format!("workloadApi.listen: cannot resolve {}", first.display()))
}

/// Writes the default SVID's files into `dir`; returns what was written.
fn write(dir: &Path, context: &X509Context) -> anyhow::Result<Written> {
    let default = context
        .svids
        .first()
        .context("the Workload API sent no SVID")?;
    let federated: Vec<(String, String)> = context
        .federated
        .iter()
        .map(|(td, certs)| (format!("federated-{td}.pem"), certs.to_pem()))
        .collect();
    let files = Files {
        svid: default.chain.to_pem(),
        key: default.key.to_pem(),
        bundle: default.bundle.to_pem(),
        extra: federated,
    };
    write_files(dir, "--write", &files, None)?;
    let path = |name: &str| dir.join(name).display().to_string();
    Ok(Written {
        svid: path("svid.pem"),
        key: path("key.pem"),
        bundle: path("bundle.pem"),
        federated: files.extra.iter().map(|(name, _)| path(name)).collect(),
    })
}

/// `meshca inspect`'s view of each certificate; `what` names them in an error.
fn describe(certs: &Certificates, what: &str) -> anyhow::Result<Vec<CertInfo>> {
    meshca_ca::inspect_pem(certs.to_pem().as_bytes())
        .with_context(|| format!("the Workload API sent {what} that cannot be read"))
}

/// `x509 --output json`.
#[derive(Serialize)]
struct X509Report {
    /// The SVIDs, the default first.
    svids: Vec<SvidEntry>,
    /// The other trust domains this process's SVIDs trust.
    federated_trust_domains: Vec<String>,
    /// With `--write`: the files written.
    written: Option<Written>,
}

#[derive(Serialize)]
struct SvidEntry {
    spiffe_id: String,
    hint: String,
    issuer: String,
    not_before: String,
    not_after: String,
    key: String,
    chain_length: usize,
    trust_domain: String,
    bundle_cas: usize,
}

#[derive(Serialize)]
struct Written {
    svid: String,
    key: String,
    bundle: String,
    federated: Vec<String>,
}

fn print_x509(
    context: &X509Context,
    written: Option<Written>,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let mut svids = Vec::with_capacity(context.svids.len());
    for svid in &context.svids {
        let chain = describe(&svid.chain, &format!("an SVID of {}", svid.spiffe_id))?;
        let leaf = chain.first().with_context(|| {
            format!(
                "the Workload API sent an empty chain for {}",
                svid.spiffe_id
            )
        })?;
        svids.push(SvidEntry {
            spiffe_id: svid.spiffe_id.to_string(),
            hint: svid.hint.clone(),
            issuer: leaf.issuer.clone(),
            not_before: leaf.not_before.clone(),
            not_after: leaf.not_after.clone(),
            key: leaf.key.clone(),
            chain_length: chain.len(),
            trust_domain: svid.spiffe_id.trust_domain().to_string(),
            bundle_cas: svid.bundle.0.len(),
        });
    }
    let report = X509Report {
        svids,
        federated_trust_domains: context.federated.keys().map(|td| td.to_string()).collect(),
        written,
    };
    match output {
        Output::Json => super::print_json(&report)?,
        Output::Human => {
            let now = SystemTime::now();
            for (i, s) in report.svids.iter().enumerate() {
                let default = if i == 0 { " (default)" } else { "" };
                println!("SVID {} of {}{default}", i + 1, report.svids.len());
                println!("  SPIFFE ID:   {}", s.spiffe_id);
                println!(
                    "  hint:        {}",
                    if s.hint.is_empty() { "(none)" } else { &s.hint }
                );
                println!("  issuer:      {}", s.issuer);
                println!("  not after:   {}{}", s.not_after, left(&s.not_after, now));
                println!("  key:         {}", s.key);
                println!("  chain:       {} certificate(s)", s.chain_length);
                println!("  bundle:      {} ({} CA(s))", s.trust_domain, s.bundle_cas);
            }
            let federated = if report.federated_trust_domains.is_empty() {
                "(none)".to_owned()
            } else {
                report.federated_trust_domains.join(", ")
            };
            println!("federated trust domains: {federated}");
            if let Some(w) = &report.written {
                eprintln!("wrote {}, {}, {}", w.svid, w.key, w.bundle);
                for f in &w.federated {
                    eprintln!("wrote {f}");
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `bundles --output json`.
#[derive(Serialize)]
struct BundlesReport {
    trust_domains: Vec<TrustDomainReport>,
}

#[derive(Serialize)]
struct TrustDomainReport {
    trust_domain: String,
    cas: Vec<CertInfo>,
}

fn print_bundles(report: &BundlesReport, output: Output) -> anyhow::Result<ExitCode> {
    match output {
        Output::Json => super::print_json(report)?,
        Output::Human => {
            let now = SystemTime::now();
            for td in &report.trust_domains {
                println!("{} ({} CA(s))", td.trust_domain, td.cas.len());
                for ca in &td.cas {
                    let subject = if ca.subject.is_empty() {
                        "(empty subject)"
                    } else {
                        &ca.subject
                    };
                    println!("  {subject}");
                    println!("    expires {}{}", ca.not_after, left(&ca.not_after, now));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `jwt --output json`.
#[derive(Serialize)]
struct JwtReport<'a> {
    svids: Vec<JwtEntry<'a>>,
}

#[derive(Serialize)]
struct JwtEntry<'a> {
    spiffe_id: String,
    hint: String,
    token: &'a str,
}

fn hint_note(hint: &str) -> String {
    if hint.is_empty() {
        String::new()
    } else {
        format!(" (hint {hint})")
    }
}

/// ` (in 2d11h)` for an RFC 3339 time, or nothing when it does not parse.
fn left(rfc3339: &str, now: SystemTime) -> String {
    let Ok(at) =
        time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
    else {
        return String::new();
    };
    let now = time::OffsetDateTime::from(now);
    format!(
        " (in {})",
        super::human_duration((at - now).whole_seconds())
    )
}
