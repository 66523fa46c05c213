//! The CA key the daemon makes in a PKCS#11 token cannot be read out of it: `CKA_VALUE` is refused.
//!
//! This test opens the token itself, after the daemon (a child process) made the key. SoftHSM2 reads
//! `SOFTHSM2_CONF` from the environment when its module is initialised, so this binary has no test
//! harness: `main` sets the variable first, while it is the process's only thread.

mod common;

use common::{Env, DATAPLANE_WEB_1, MESH_BUILTIN};
use meshca_hsm::{KeySelector, Pkcs11Uri, Token};
use meshca_identity::KeyAlgorithm;
use meshca_testhsm::TestToken;
use zeroize::Zeroizing;

fn main() {
    let token = TestToken::new();
    std::env::set_var("SOFTHSM2_CONF", token.conf());
    let env = Env::with_settings(&token.settings_yaml("file")).with_vars(token.env());
    env.write_resource("mesh.yaml", MESH_BUILTIN);
    env.write_resource("web-1.yaml", DATAPLANE_WEB_1);
    let daemon = env.start();
    daemon.stop();

    let ca = env.keystore().join("ca/default/backend/ca-1");
    let reference = std::fs::read_to_string(ca.join("key.pkcs11")).expect("the key's URI");
    let uri = Pkcs11Uri::parse(reference.trim()).expect("a pkcs11: URI");
    let cert = std::fs::read(ca.join("cert.pem")).expect("the CA certificate");
    let der = pem::parse(&cert).expect("PEM").into_contents();
    let (_, parsed) = x509_parser::parse_x509_certificate(&der).expect("a certificate");
    let public_key = parsed.public_key().subject_public_key.data.to_vec();

    let opened = Token::open(
        &token.module(),
        token.label(),
        Zeroizing::new(token.pin().to_owned()),
    )
    .expect("the test opens the token");
    let key = opened
        .find_key(
            KeySelector {
                label: uri.object(),
                id: uri.id(),
            },
            KeyAlgorithm::EcdsaP256,
            &public_key,
        )
        .expect("the daemon's CA key, proven by a signature");
    assert_eq!(
        uri.object(),
        Some(hex::encode(ring::digest::digest(&ring::digest::SHA256, &der)).as_str()),
        "labelled with the CA's id"
    );
    assert!(
        !key.value_is_readable().expect("the token answers"),
        "the token hands out the CA key's CKA_VALUE"
    );
    println!("test the_daemon_s_ca_key_cannot_be_read_out_of_the_token ... ok");
}
