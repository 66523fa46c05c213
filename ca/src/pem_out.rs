//! PEM encoding; secrets are encoded into a buffer sized once, so no copy is left behind by a reallocation.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use zeroize::Zeroizing;

const LINE: usize = 48; // 48 bytes of DER give the customary 64 base64 characters per line.

fn encoded_len(label: &str, der_len: usize) -> usize {
    let b64 = der_len.div_ceil(3) * 4;
    let lines = der_len.div_ceil(LINE);
    // "-----BEGIN " + label + "-----\n" + body + newlines + "-----END " + label + "-----\n"
    11 + label.len() + 6 + b64 + lines + 9 + label.len() + 6
}

fn encode_into(out: &mut String, label: &str, der: &[u8]) {
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    for chunk in der.chunks(LINE) {
        STANDARD.encode_string(chunk, out);
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
}

/// Encodes secret DER as PEM into a zeroizing buffer that never reallocates.
pub(crate) fn encode_secret(label: &str, der: &[u8]) -> Zeroizing<String> {
    let mut out = Zeroizing::new(String::with_capacity(encoded_len(label, der.len())));
    encode_into(&mut out, label, der);
    debug_assert!(out.len() <= out.capacity());
    out
}

/// Appends one `CERTIFICATE` PEM block to `out`.
pub(crate) fn push_cert(out: &mut String, der: &[u8]) {
    out.reserve(encoded_len("CERTIFICATE", der.len()));
    encode_into(out, "CERTIFICATE", der);
}

/// One `CERTIFICATE` PEM block.
pub(crate) fn cert(der: &[u8]) -> String {
    let mut out = String::new();
    push_cert(&mut out, der);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_matches_the_pem_crate_and_fits_its_capacity() {
        for len in [0usize, 1, 47, 48, 49, 100, 1217] {
            let der: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let ours = encode_secret("PRIVATE KEY", &der);
            assert_eq!(ours.len(), encoded_len("PRIVATE KEY", len), "len {len}");
            let parsed = ::pem::parse(ours.as_bytes()).expect("valid PEM");
            assert_eq!(parsed.tag(), "PRIVATE KEY");
            assert_eq!(parsed.contents(), der.as_slice());
        }
    }
}
