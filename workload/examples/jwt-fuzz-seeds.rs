//! Writes the JWT-SVID fuzz targets' seeds (docs/fuzzing.md): a P-256 key used for nothing but fuzzing
//! (`workload/fuzz/seeds/jwt-key.pk8`, created if absent), the JWT-SVIDs it signed
//! (`workload/fuzz/seeds/jwt-svids.txt`, the only inputs the `jwt_svid` target may see accepted), a
//! copy of each and a few near misses in `workload/fuzz/corpus/jwt_svid/`, and JWK Sets in
//! `workload/fuzz/corpus/jwks/`.
//!
//! `cargo run -p meshca-workload --example jwt-fuzz-seeds -- workload/fuzz`

use std::path::{Path, PathBuf};

use meshca_workload::jwt::{mint, JwksDocument, JwtSigningKey};

/// When the seeds are issued; the target validates them 100 seconds later.
const ISSUED_AT: u64 = 1_800_000_000;
/// Ten years.
const LIFETIME: u64 = 10 * 365 * 86_400;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fuzz = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or("usage: jwt-fuzz-seeds <fuzz dir>")?,
    );
    let key_path = fuzz.join("seeds/jwt-key.pk8");
    let key = match std::fs::read(&key_path) {
        Ok(pkcs8) => JwtSigningKey::from_pkcs8(&pkcs8)?,
        Err(_) => {
            let key = JwtSigningKey::generate()?;
            std::fs::create_dir_all(fuzz.join("seeds"))?;
            let pkcs8 = key.pkcs8().ok_or("a generated key is a software key")?;
            std::fs::write(&key_path, pkcs8.as_slice())?;
            key
        }
    };
    let audiences: [&[&str]; 3] = [
        &["db"],
        &["db", "cache"],
        &["spiffe://example.org/db", "db"],
    ];
    let ids = [
        "spiffe://example.org/ns/default/sa/web",
        "spiffe://example.org/web",
        "spiffe://example.org/a/b/c",
    ];
    let mut tokens = Vec::new();
    for (id, audiences) in ids.iter().zip(audiences) {
        let audiences: Vec<String> = audiences.iter().map(|a| (*a).to_owned()).collect();
        tokens.push(mint(&key, id, &audiences, ISSUED_AT, ISSUED_AT + LIFETIME)?);
    }
    std::fs::write(fuzz.join("seeds/jwt-svids.txt"), tokens.join("\n") + "\n")?;

    let corpus = fuzz.join("corpus/jwt_svid");
    std::fs::create_dir_all(&corpus)?;
    let mut seeds = tokens.clone();
    let first = &tokens[0];
    let (header, rest) = first.split_once('.').ok_or("a token has three segments")?;
    let (payload, signature) = rest.split_once('.').ok_or("a token has three segments")?;
    // Near misses: unsigned, another algorithm, a field too many, a byte flipped, a segment short.
    let b64 = |json: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    };
    seeds.push(format!(
        "{}.{payload}.",
        b64(r#"{"alg":"none","typ":"JWT"}"#)
    ));
    let kid = key.kid();
    seeds.push(format!(
        "{}.{payload}.{signature}",
        b64(&format!(r#"{{"alg":"RS256","kid":"{kid}","typ":"JWT"}}"#))
    ));
    seeds.push(format!(
        "{}.{payload}.{signature}",
        b64(&format!(r#"{{"alg":"ES256","jku":"x","kid":"{kid}"}}"#))
    ));
    seeds.push(format!("{header}.{payload}.{}", flip_first(signature)));
    seeds.push(format!("{header}.{payload}"));
    write_all(&corpus, &seeds)?;

    let jwks = fuzz.join("corpus/jwks");
    std::fs::create_dir_all(&jwks)?;
    let own = JwksDocument::new([key.public(), JwtSigningKey::generate()?.public()]).to_bytes();
    let mixed = br#"{"keys":[{"kty":"RSA","kid":"r","n":"AQAB","e":"AQAB"},{"kty":"EC","crv":"P-256","use":"x509-svid","x5c":["AA"]}],"spiffe_sequence":1,"spiffe_refresh_hint":300}"#;
    std::fs::write(jwks.join("seed-0"), own)?;
    std::fs::write(jwks.join("seed-1"), mixed)?;
    std::fs::write(
        fuzz.join("seeds/jwks.json"),
        JwksDocument::new([key.public()]).to_bytes(),
    )?;
    Ok(())
}

/// The base64url segment with its first character changed.
fn flip_first(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    let mut chars = segment.chars();
    out.push(if chars.next() == Some('A') { 'B' } else { 'A' });
    out.extend(chars);
    out
}

fn write_all(dir: &Path, seeds: &[String]) -> std::io::Result<()> {
    for (i, seed) in seeds.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i}")), seed)?;
    }
    Ok(())
}
