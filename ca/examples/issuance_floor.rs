//! Rough issuance-vs-floor comparison for development: `cargo run -p meshca-ca --release --example
//! issuance_floor`. The real benchmark is `meshca bench issuance` (BENCHMARKS.md).

use std::time::{Duration, Instant, SystemTime};

use meshca_ca::{CaParams, CertificateAuthority, SvidRequest};
use meshca_identity::{KeyAlgorithm, SpiffeId, TrustDomain};

fn rate(mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(2) {
        f();
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let now = SystemTime::now();
    let params = CaParams {
        trust_domain: TrustDomain::parse("default.zone-1.mesh.local")?,
        key_algorithm: KeyAlgorithm::EcdsaP256,
        validity: Duration::from_secs(86_400 * 365),
        name: "bench".into(),
    };
    let ca = CertificateAuthority::generate(&params, now)?;
    let req = SvidRequest {
        spiffe_id: SpiffeId::parse("spiffe://default.zone-1.mesh.local/workload/web")?,
        key_algorithm: KeyAlgorithm::EcdsaP256,
        lifetime: Duration::from_secs(86_400),
    };
    meshca_ca::floor_once()?;
    let floor = rate(|| {
        let _ = std::hint::black_box(meshca_ca::floor_once());
    });
    let issue = rate(|| {
        let svid = ca.issue(&req, now);
        std::hint::black_box(&svid);
    });
    println!(
        "{{\"floor_per_s\":{floor:.0},\"issue_per_s\":{issue:.0},\"ratio\":{:.3}}}",
        issue / floor
    );
    Ok(())
}
