//! `meshca bundle fetch`: fetch a federation peer's bundle endpoint as meshca would (the endpoint
//! authenticated by its profile, the answer bounded and checked), and print what it serves; `meshca
//! bundle show`: what a running daemon's own endpoint serves.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use meshca_federation::fetch::{check_url, fetch as fetch_bundle, system_roots, EndpointAuth};
use meshca_federation::{pem_roots, BundleLimits, SpiffeBundle};
use meshca_identity::{SpiffeId, TrustDomain};
use rustls_pki_types::CertificateDer;

use crate::cli::{BundleFetchArgs, BundleFormat, BundleShowArgs};
use crate::InvalidInput;

pub async fn show(args: BundleShowArgs) -> anyhow::Result<ExitCode> {
    let invalid = |message: String| anyhow::Error::new(InvalidInput(message));
    let trust_domain = match args.trust_domain {
        Some(td) => {
            TrustDomain::parse(&td).map_err(|e| invalid(format!("--trust-domain {td:?}: {e}")))?
        }
        None => {
            let served = super::status::admin_get(&args.admin, "/api/bundles").await?;
            let domains: Vec<String> = served
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["trust_domain"].as_str().map(str::to_owned))
                .collect();
            match domains.as_slice() {
                [one] => TrustDomain::parse(one)
                    .context("the daemon named a trust domain that does not parse")?,
                [] => anyhow::bail!(
                    "the daemon serves no bundle endpoint (federation.endpoints is empty)"
                ),
                many => {
                    return Err(invalid(format!(
                        "the daemon serves several trust domains; pick one with --trust-domain: {}",
                        many.join(", ")
                    )))
                }
            }
        }
    };
    let document = super::status::admin_get(
        &args.admin,
        &format!("/api/bundles/{}", trust_domain.as_str()),
    )
    .await?;
    let bytes = serde_json::to_vec(&document)?;
    let bundle = SpiffeBundle::parse(&trust_domain, &bytes, BundleLimits::default())
        .context("the daemon served a bundle that does not read")?;
    print_bundle(&bundle, args.format);
    Ok(ExitCode::SUCCESS)
}

fn print_bundle(bundle: &SpiffeBundle, format: BundleFormat) {
    match format {
        BundleFormat::Spiffe => println!("{}", String::from_utf8_lossy(&bundle.to_json())),
        BundleFormat::Pem => print!("{}", bundle.x509_pem()),
    }
    eprintln!(
        "{}: {} X.509 and {} JWT authorities, sequence {}, refresh hint {}",
        bundle.trust_domain().as_str(),
        bundle.x509_authorities().len(),
        bundle.jwt_authorities().len(),
        bundle.sequence.map_or("none".to_owned(), |s| s.to_string()),
        bundle
            .refresh_hint
            .map_or("none".to_owned(), |h| format!("{} s", h.as_secs())),
    );
}

pub async fn fetch(args: BundleFetchArgs) -> anyhow::Result<ExitCode> {
    let invalid = |message: String| anyhow::Error::new(InvalidInput(message));
    check_url(&args.url).map_err(|e| invalid(e.to_string()))?;
    let spiffe_id = args
        .spiffe_id
        .as_deref()
        .map(|id| SpiffeId::parse(id).map_err(|e| invalid(format!("--spiffe-id {id:?}: {e}"))))
        .transpose()?;
    let trust_domain = match (&args.trust_domain, &spiffe_id) {
        (Some(td), _) => {
            TrustDomain::parse(td).map_err(|e| invalid(format!("--trust-domain {td:?}: {e}")))?
        }
        (None, Some(id)) => id.trust_domain().clone(),
        (None, None) => {
            return Err(invalid(
                "--web needs --trust-domain: the bundle's trust domain".into(),
            ))
        }
    };
    if !(args.timeout > 0.0 && args.timeout <= 3600.0) {
        return Err(invalid(format!(
            "--timeout {}: from more than 0 to 3600 seconds",
            args.timeout
        )));
    }
    let limits = BundleLimits::default();
    let auth = match (spiffe_id, &args.bundle_file) {
        (Some(id), Some(file)) => {
            let bytes = read(file, "--bundle-file")?;
            let bundle = SpiffeBundle::parse_initial(id.trust_domain(), &bytes, limits)
                .map_err(|e| invalid(format!("{}: {e}", file.display())))?;
            EndpointAuth::Spiffe { id, bundle }
        }
        _ => {
            let roots = match &args.ca_file {
                Some(file) => pem_certificates(file)?,
                None => system_roots()?,
            };
            EndpointAuth::Web { roots }
        }
    };
    let timeout = Duration::from_secs_f64(args.timeout);
    let bundle = fetch_bundle(&args.url, &trust_domain, &auth, timeout, limits)
        .await
        .with_context(|| {
            format!(
                "fetching the bundle of {} from {}",
                trust_domain.as_str(),
                args.url
            )
        })?;
    print_bundle(&bundle, args.format);
    Ok(ExitCode::SUCCESS)
}

/// An operator's file, bounded like a bundle; `flag` names it in errors.
fn read(path: &Path, flag: &str) -> anyhow::Result<Vec<u8>> {
    let max = BundleLimits::default().max_bytes as u64;
    meshca_files::read(path, max, flag)
        .map_err(|e| anyhow::Error::new(InvalidInput(format!("{}: {e}", path.display()))))
}

fn pem_certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let bytes = read(path, "--ca-file")?;
    pem_roots(&bytes)
        .map_err(|e| anyhow::Error::new(InvalidInput(format!("{}: {e}", path.display()))))
}
