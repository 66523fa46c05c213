//! Writes the token fuzz target's seeds (docs/fuzzing.md): a P-256 key used for nothing but fuzzing
//! (`auth/fuzz/seeds/token-key.pk8`, created if absent), the tokens it signed
//! (`auth/fuzz/seeds/tokens.txt`, the only inputs the target may see accepted) and a copy of each in
//! `auth/fuzz/corpus/token/`.
//!
//! `cargo run -p meshca-auth --example fuzz-tokens -- auth/fuzz`

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use meshca_auth::{Claims, ProxyType, SigningKey};

/// When the seeds are issued; the target verifies them 100 seconds later.
const ISSUED_AT: u64 = 1_800_000_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fuzz = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or("usage: fuzz-tokens <fuzz dir>")?,
    );
    let key_path = fuzz.join("seeds/token-key.pk8");
    let key = match std::fs::read(&key_path) {
        Ok(pkcs8) => SigningKey::from_pkcs8(&pkcs8)?,
        Err(_) => {
            let (key, pkcs8) = SigningKey::generate()?;
            std::fs::write(&key_path, &*pkcs8)?;
            key
        }
    };
    let ten_years = Duration::from_secs(10 * 365 * 86_400);
    let labels = BTreeMap::from([("app".to_owned(), "web".to_owned())]);
    let tags = BTreeMap::from([(
        "kuma.io/service".to_owned(),
        "web_default_svc_80".to_owned(),
    )]);
    let claims = [
        Claims::new_dataplane(
            "default",
            "web-1",
            BTreeMap::new(),
            BTreeMap::new(),
            ten_years,
            ISSUED_AT,
        )?,
        Claims::new_dataplane("default", "web-2", labels, tags, ten_years, ISSUED_AT)?,
        Claims::new(
            ProxyType::ZoneEgress,
            "default",
            "egress-1",
            BTreeMap::new(),
            BTreeMap::new(),
            ten_years,
            ISSUED_AT,
        )?,
    ];
    let corpus = fuzz.join("corpus/token");
    std::fs::create_dir_all(&corpus)?;
    let mut list = String::new();
    for (i, claims) in claims.iter().enumerate() {
        let token = key.mint(claims)?;
        std::fs::write(corpus.join(format!("seed-{i}")), &token)?;
        list.push_str(&token);
        list.push('\n');
    }
    std::fs::write(fuzz.join("seeds/tokens.txt"), list)?;
    Ok(())
}
