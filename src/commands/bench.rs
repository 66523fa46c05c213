//! `meshca bench issuance`: SVIDs per second beside the raw ring floor, from the same run.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use meshca_ca::{CaParams, CertificateAuthority, SvidRequest};
use meshca_identity::KeyAlgorithm;

use crate::cli::BenchIssuanceArgs;
use crate::InvalidInput;

/// Calls `f` repeatedly for `span` on this thread; returns calls per second.
fn rate(span: Duration, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    // A short warm-up so neither side pays for first-touch costs.
    for _ in 0..50 {
        f()?;
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < span {
        for _ in 0..64 {
            f()?;
        }
        n += 64;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

pub fn issuance(args: BenchIssuanceArgs) -> anyhow::Result<ExitCode> {
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        return Err(InvalidInput(format!(
            "--seconds must be a positive number, got {}",
            args.seconds
        ))
        .into());
    }
    let span = Duration::from_secs_f64(args.seconds);
    let now = SystemTime::now();
    let ca = CertificateAuthority::generate(
        &CaParams {
            trust_domain: "bench.mesh.local".parse()?,
            key_algorithm: KeyAlgorithm::EcdsaP256,
            validity: Duration::from_secs(365 * 24 * 3600),
            name: "bench".into(),
        },
        now,
    )?;
    let req = SvidRequest {
        spiffe_id: "spiffe://bench.mesh.local/workload/bench".parse()?,
        key_algorithm: KeyAlgorithm::EcdsaP256,
        lifetime: Duration::from_secs(24 * 3600),
    };
    // Floor, pipeline, daemon, floor again: the floor is the mean of both so drift during the run is
    // shared. The daemon's work per certificate is the pipeline plus the check before publishing (the
    // chain verified once against the CA's anchors, read once) and the key's PEM for SDS.
    let floor_a = rate(span / 2, || Ok(meshca_ca::floor_once()?))?;
    let svid = rate(span, || {
        std::hint::black_box(ca.issue(&req, now)?);
        Ok(())
    })?;
    let daemon = rate(span, || {
        let svid = ca.issue(&req, now)?;
        ca.verify_issued(&svid.chain_der, &req.spiffe_id, now)?;
        std::hint::black_box(svid.key.to_pem());
        Ok(())
    })?;
    let floor_b = rate(span / 2, || Ok(meshca_ca::floor_once()?))?;
    let floor = (floor_a + floor_b) / 2.0;
    let ratio = |x: f64| (x / floor * 1000.0).round() / 1000.0;
    let line = serde_json::json!({
        "bench": "issuance",
        "key_algorithm": "ecdsa-p256",
        "seconds": args.seconds,
        "threads": 1,
        "floor_per_sec": floor.round(),
        "svid_per_sec": svid.round(),
        "ratio": ratio(svid),
        "daemon_per_sec": daemon.round(),
        "daemon_ratio": ratio(daemon),
    });
    println!("{line}");
    Ok(ExitCode::SUCCESS)
}
