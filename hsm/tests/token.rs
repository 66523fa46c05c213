//! The token against a real SoftHSM2 token, made in a temporary directory. SoftHSM2 reads its
//! configuration from `SOFTHSM2_CONF` when the module is initialised, so this binary has one test, which
//! sets it before anything else runs, and goes through the steps in order.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;

use meshca_hsm::{HsmError, KeySelector, Token};
use meshca_identity::KeyAlgorithm;
use ring::signature;
use zeroize::Zeroizing;

const MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";

#[test]
fn a_softhsm2_token_end_to_end() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let tokens = init_token(dir.path());
    let module = Path::new(MODULE);
    assert!(
        module.is_file(),
        "SoftHSM2 is not installed (Debian: apt-get install softhsm2): this test fails rather than skips"
    );

    // Opening: each mistake names what to fix.
    let err = Token::open(
        Path::new("/nonexistent/libpkcs11.so"),
        "meshca",
        pin("1234"),
    )
    .expect_err("no module");
    assert!(matches!(err, HsmError::Module { .. }), "{err}");
    assert!(err.to_string().contains("keystore.pkcs11.module"), "{err}");
    let err = Token::open(module, "other", pin("1234")).expect_err("no such token");
    assert!(matches!(err, HsmError::NoToken { .. }), "{err}");
    assert!(
        err.to_string().contains("\"other\"") && err.to_string().contains("meshca"),
        "{err}"
    );
    let err = Token::open(module, "meshca", pin("9999")).expect_err("wrong PIN");
    assert!(matches!(err, HsmError::WrongPin { .. }), "{err}");
    assert!(!err.to_string().contains("9999"), "{err}");
    assert!(err.to_string().contains("pinFile"), "{err}");
    // SoftHSM2 counts no wrong attempts: twenty in a row, and the right PIN still opens it (a real HSM
    // would lock the PIN; `HsmError::PinLocked` is what meshca then says, and the daemon never retries
    // a refused PIN on its own: below).
    for _ in 0..20 {
        let err = Token::open(module, "meshca", pin("0000")).expect_err("wrong PIN");
        assert!(matches!(err, HsmError::WrongPin { .. }), "{err}");
    }

    let token = Token::open(module, "meshca", pin("1234")).expect("opens");
    assert!(token.status().up);
    let again = Token::open(module, "meshca", pin("1234")).expect("shares the open token");
    assert_eq!(again.label(), "meshca");

    // Keys made in the token sign what verifies with their public key, and never leave it.
    for algorithm in [
        KeyAlgorithm::EcdsaP256,
        KeyAlgorithm::EcdsaP384,
        KeyAlgorithm::Rsa2048,
    ] {
        let key = token
            .generate_key(algorithm, &format!("test-{algorithm}"))
            .expect("generates");
        let message = b"a certificate's to-be-signed bytes";
        let signed = key.sign(message).expect("signs");
        verify(algorithm, key.public_key(), message, &signed);
        assert!(
            !key.value_is_readable().expect("answers"),
            "CKA_VALUE must be refused"
        );

        let found = token
            .find_key(
                KeySelector {
                    label: Some(&format!("test-{algorithm}")),
                    id: None,
                },
                algorithm,
                key.public_key(),
            )
            .expect("found by label");
        assert_eq!(found.id(), key.id());
        verify(
            algorithm,
            found.public_key(),
            message,
            &found.sign(message).expect("signs"),
        );
    }

    // Finding: by id, a relabelled key, a key that is not the certificate's, one that is not there.
    let mut key = token
        .generate_key(KeyAlgorithm::EcdsaP256, "to-relabel")
        .expect("generates");
    key.relabel("ca-0123").expect("relabels");
    let by_id = token
        .find_key(
            KeySelector {
                label: Some("ca-0123"),
                id: Some(key.id()),
            },
            KeyAlgorithm::EcdsaP256,
            key.public_key(),
        )
        .expect("found by its new label and id");
    assert_eq!(by_id.label(), "ca-0123");
    let other = token
        .generate_key(KeyAlgorithm::EcdsaP256, "other")
        .expect("generates");
    let err = token
        .find_key(
            KeySelector {
                label: Some("ca-0123"),
                id: None,
            },
            KeyAlgorithm::EcdsaP256,
            other.public_key(),
        )
        .expect_err("not that certificate's key");
    assert!(matches!(err, HsmError::KeyMismatch { .. }), "{err}");
    let err = token
        .find_key(
            KeySelector {
                label: Some("ca-0123"),
                id: None,
            },
            KeyAlgorithm::EcdsaP384,
            key.public_key(),
        )
        .expect_err("not that algorithm");
    assert!(matches!(err, HsmError::KeyMismatch { .. }), "{err}");
    let err = token
        .find_key(
            KeySelector {
                label: Some("absent"),
                id: None,
            },
            KeyAlgorithm::EcdsaP256,
            key.public_key(),
        )
        .expect_err("absent");
    assert!(matches!(err, HsmError::KeyNotFound { .. }), "{err}");
    other.destroy().expect("destroys");

    // Sealing: what the token sealed opens only through it, and a changed value does not open.
    let sealed = token.seal(&[42u8; 32]).expect("seals");
    assert!(
        !sealed.windows(32).any(|w| w == [42u8; 32]),
        "the secret is not in the sealed value"
    );
    assert_eq!(
        token.open_sealed(&sealed).expect("opens").as_slice(),
        &[42u8; 32]
    );
    let again = token
        .seal(&[42u8; 32])
        .expect("seals again with the same key");
    assert_eq!(again[..18], sealed[..18], "the same key id");
    assert_ne!(again, sealed, "a fresh IV each time");
    let mut changed = sealed.clone();
    *changed.last_mut().expect("not empty") ^= 1;
    let err = token.open_sealed(&changed).expect_err("changed");
    assert!(matches!(err, HsmError::Unseal { .. }), "{err}");
    let mut other_key = sealed.clone();
    other_key[2] ^= 1;
    let err = token.open_sealed(&other_key).expect_err("no such key");
    assert!(matches!(err, HsmError::KeyNotFound { .. }), "{err}");
    assert!(
        err.to_string().contains("holds no AES key labelled"),
        "{err}"
    );

    // Several threads sign at once, each in a session of its own.
    thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for i in 0..25u8 {
                    let msg = [i; 16];
                    verify(
                        KeyAlgorithm::EcdsaP256,
                        key.public_key(),
                        &msg,
                        &key.sign(&msg).expect("signs"),
                    );
                }
            });
        }
    });

    // The token goes away: signing is refused, the status says why; it comes back: signing resumes.
    let away = dir.path().join("tokens.away");
    std::fs::rename(&tokens, &away).expect("moves the tokens away");
    let err = key.sign(b"x").expect_err("the token is gone");
    assert!(matches!(err, HsmError::Unavailable { .. }), "{err}");
    let status = token.status();
    assert!(!status.up);
    assert!(status.reason.is_some());
    assert!(matches!(key.sign(b"x"), Err(HsmError::Unavailable { .. })));
    assert!(!token.recover(), "still away");
    std::fs::rename(&away, &tokens).expect("moves the tokens back");
    assert!(token.recover(), "back");
    assert!(token.status().up);
    let signed = key.sign(b"again").expect("signs after the token returned");
    verify(KeyAlgorithm::EcdsaP256, key.public_key(), b"again", &signed);

    // The token goes away and another token with the same label and another PIN takes its place: the
    // PIN is refused once, said in the status, and never tried again, not even once the right token is
    // back (every try would count against a real HSM's PIN).
    std::fs::rename(&tokens, &away).expect("moves the tokens away");
    assert!(!token.check(), "gone");
    std::fs::create_dir(&tokens).expect("a tokens directory for the impostor");
    init_token_in(dir.path(), "4321");
    assert!(!token.recover(), "the PIN is refused");
    let reason = token.status().reason.expect("a reason");
    assert!(
        reason.contains("not tried again") && reason.contains("pinFile"),
        "{reason}"
    );
    std::fs::remove_dir_all(&tokens).expect("removes the impostor");
    std::fs::rename(&away, &tokens).expect("moves the tokens back");
    assert!(!token.recover(), "no second login");
    assert_eq!(token.status().reason.as_deref(), Some(reason.as_str()));
}

fn pin(p: &str) -> Zeroizing<String> {
    Zeroizing::new(p.to_owned())
}

fn verify(algorithm: KeyAlgorithm, public_key: &[u8], message: &[u8], signed: &[u8]) {
    let verifier: &dyn signature::VerificationAlgorithm = match algorithm {
        KeyAlgorithm::EcdsaP256 => &signature::ECDSA_P256_SHA256_ASN1,
        KeyAlgorithm::EcdsaP384 => &signature::ECDSA_P384_SHA384_ASN1,
        _ => &signature::RSA_PKCS1_2048_8192_SHA256,
    };
    signature::UnparsedPublicKey::new(verifier, public_key)
        .verify(message, signed)
        .expect("the signature verifies with the key's public key");
}

/// A SoftHSM2 token labelled `meshca`, PIN 1234, in `dir`; points this process at it.
fn init_token(dir: &Path) -> PathBuf {
    let tokens = dir.join("tokens");
    std::fs::create_dir(&tokens).expect("creates the tokens directory");
    let conf = dir.join("softhsm2.conf");
    std::fs::write(
        &conf,
        format!(
            "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
            tokens.display()
        ),
    )
    .expect("writes the configuration");
    init_token_in(dir, "1234");
    // The only test of this binary: nothing else reads the environment yet.
    std::env::set_var("SOFTHSM2_CONF", &conf);
    tokens
}

/// `softhsm2-util --init-token` of a token labelled `meshca` with user PIN `user_pin` in `dir`'s tokens
/// directory.
fn init_token_in(dir: &Path, user_pin: &str) {
    let conf = dir.join("softhsm2.conf");
    let status = Command::new("softhsm2-util")
        .args([
            "--init-token",
            "--free",
            "--label",
            "meshca",
            "--pin",
            user_pin,
            "--so-pin",
            "5678",
        ])
        .env("SOFTHSM2_CONF", &conf)
        .status()
        .expect(
            "softhsm2-util runs: SoftHSM2 must be installed (Debian: apt-get install softhsm2)",
        );
    assert!(status.success(), "softhsm2-util --init-token failed");
}
