//! Fixtures shared by the unit tests (see tests/fixtures/README.md).

/// A checked-in RSA-2048 PKCS#8 key, so tests need not generate one.
pub(crate) fn rsa_2048_pkcs8_pem() -> &'static str {
    include_str!("../tests/fixtures/rsa-2048.key.pem")
}
