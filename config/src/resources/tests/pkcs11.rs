//! A CA's private key named by a `pkcs11:` URI, in a Mesh's provided backend and in a MeshIdentity's
//! bundled CA.

use meshca_hsm::Pkcs11Uri;

use super::*;

fn provided_mesh(cert: &str, key: &str) -> String {
    format!(
        "type: Mesh\nname: m\nmtls:\n  enabledBackend: ca\n  backends:\n  - name: ca\n    type: provided\n    conf:\n      cert: {cert}\n      key: {key}\n"
    )
}

fn provided_identity(certificate: &str, private_key: &str) -> String {
    format!(
        "type: MeshIdentity\nname: i\nmesh: m\nspec:\n  provider:\n    type: Bundled\n    bundled:\n      ca:\n        certificate: {certificate}\n        privateKey: {private_key}\n"
    )
}

fn uri(text: &str) -> Pkcs11Uri {
    Pkcs11Uri::parse(text).expect("a valid URI")
}

#[test]
fn a_provided_backend_key_may_be_in_the_token() {
    let Resource::Mesh(mesh) = one(&provided_mesh(
        "{file: ca.pem}",
        r#"{pkcs11: "pkcs11:token=meshca;object=ca-1"}"#,
    )) else {
        panic!("expected a Mesh");
    };
    let backend = mesh.mtls.as_ref().and_then(|m| m.enabled()).expect("ca");
    assert_eq!(
        backend.kind,
        BackendKind::Provided {
            cert: DataSource::File("/r/ca.pem".into()),
            key: DataSource::Pkcs11(uri("pkcs11:token=meshca;object=ca-1")),
        }
    );
}

#[test]
fn a_bundled_ca_key_may_be_in_the_token_with_or_without_its_type() {
    for private_key in [
        r#"{pkcs11: "pkcs11:object=ca-1;type=private;id=%01%02"}"#,
        r#"{type: Pkcs11, pkcs11: "pkcs11:id=%01%02;object=ca-1;type=private"}"#,
    ] {
        let Resource::MeshIdentity(identity) = one(&provided_identity(
            "{type: File, file: {path: /ca.pem}}",
            private_key,
        )) else {
            panic!("expected a MeshIdentity");
        };
        let Some(Provider::Bundled(Bundled {
            ca: BundledCa::Provided { private_key, .. },
            ..
        })) = identity.provider
        else {
            panic!("expected a provided CA: {identity:?}");
        };
        assert_eq!(
            private_key,
            DataSource::Pkcs11(uri("pkcs11:object=ca-1;type=private;id=%01%02"))
        );
    }
}

#[test]
fn a_certificate_cannot_be_in_the_token() {
    let key = r#"{pkcs11: "pkcs11:object=ca-1"}"#;
    for (text, field) in [
        (
            provided_mesh(r#"{pkcs11: "pkcs11:object=ca-1;type=cert"}"#, key),
            "mtls.backends[0].conf.cert.pkcs11",
        ),
        (
            provided_identity(r#"{pkcs11: "pkcs11:object=ca-1"}"#, key),
            "spec.provider.bundled.ca.certificate.pkcs11",
        ),
        (
            provided_identity(r#"{type: Pkcs11, pkcs11: "pkcs11:object=ca-1"}"#, key),
            "spec.provider.bundled.ca.certificate.pkcs11",
        ),
        (
            provided_identity("{type: Pkcs11}", key),
            "spec.provider.bundled.ca.certificate.type",
        ),
    ] {
        let e = one_error(&text);
        assert_error(
            &e,
            field,
            "a certificate cannot live in a PKCS#11 token; only the key may be a pkcs11: URI",
        );
        assert_eq!(e.file, Path::new(FILE));
        assert!(e.resource.is_some(), "{e}");
    }
}

#[test]
fn a_uri_that_does_not_parse_is_refused_with_the_parsers_reason() {
    for (uri, reason) in [
        (
            "pkcs11:token=a;token=b",
            r#"attribute "token" is given twice"#,
        ),
        ("file:/k.pem", r#"it must start with "pkcs11:""#),
        (
            "pkcs11:object=ca%2",
            r#"attribute "object": "%2" is not a percent-escape"#,
        ),
        (
            "pkcs11:object=ca-1;label=x",
            r#"unknown path attribute "label""#,
        ),
    ] {
        let e = one_error(&provided_mesh(
            "{file: ca.pem}",
            &format!("{{pkcs11: {uri:?}}}"),
        ));
        assert_error(&e, "mtls.backends[0].conf.key.pkcs11", reason);
        assert!(e.to_string().starts_with("/r/test.yaml: Mesh/m: "), "{e}");
    }
    // A PIN is refused, and never repeated.
    let e = one_error(&provided_identity(
        "{type: File, file: {path: /ca.pem}}",
        r#"{pkcs11: "pkcs11:object=ca-1?pin-value=hunter2"}"#,
    ));
    assert_error(
        &e,
        "spec.provider.bundled.ca.privateKey.pkcs11",
        "keystore.pkcs11.pinFile or MESHCA_KEYSTORE_PKCS11_PIN",
    );
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

#[test]
fn a_uri_must_name_a_private_key() {
    for (uri, reason) in [
        (
            "pkcs11:object=ca-1;type=cert",
            "type=cert: a CA key is a private key",
        ),
        ("pkcs11:object=kek;type=secret-key", "type=secret-key"),
        ("pkcs11:token=meshca", "names no key: give object="),
        ("pkcs11:", "names no key"),
    ] {
        let e = one_error(&provided_mesh(
            "{file: ca.pem}",
            &format!("{{pkcs11: {uri:?}}}"),
        ));
        assert_error(&e, "mtls.backends[0].conf.key.pkcs11", reason);
        let e = one_error(&provided_identity(
            "{type: File, file: {path: /ca.pem}}",
            &format!("{{pkcs11: {uri:?}}}"),
        ));
        assert_error(&e, "spec.provider.bundled.ca.privateKey.pkcs11", reason);
    }
    // An id alone names a key.
    one(&provided_mesh(
        "{file: ca.pem}",
        r#"{pkcs11: "pkcs11:id=%2A"}"#,
    ));
}

#[test]
fn pkcs11_is_one_choice_among_the_others() {
    let e = one_error(&provided_mesh(
        "{file: ca.pem}",
        r#"{file: k.pem, pkcs11: "pkcs11:object=ca-1"}"#,
    ));
    assert_error(
        &e,
        "mtls.backends[0].conf.key",
        "set exactly one of file, inline, inlineString, secret or pkcs11; found file and pkcs11",
    );
    let e = one_error(&provided_mesh("{file: ca.pem}", "{}"));
    assert_error(
        &e,
        "mtls.backends[0].conf.key",
        "set exactly one of file, inline, inlineString, secret or pkcs11",
    );
    let e = one_error(&provided_identity(
        "{type: File, file: {path: /ca.pem}}",
        r#"{type: File, file: {path: /k.pem}, pkcs11: "pkcs11:object=ca-1"}"#,
    ));
    assert_error(
        &e,
        "spec.provider.bundled.ca.privateKey.pkcs11",
        "not allowed when type is File",
    );
    let e = one_error(&provided_identity(
        "{type: File, file: {path: /ca.pem}}",
        "{type: Pkcs11}",
    ));
    assert_error(
        &e,
        "spec.provider.bundled.ca.privateKey.pkcs11",
        "required when type is Pkcs11",
    );
    // A builtin backend makes its own key: none may be named.
    let e = one_error(
        "type: Mesh\nname: m\nmtls:\n  backends:\n  - name: b\n    type: builtin\n    conf:\n      key: {pkcs11: \"pkcs11:object=ca-1\"}\n",
    );
    assert_error(
        &e,
        "mtls.backends[0].conf.key",
        "not allowed for a builtin backend",
    );
}

#[test]
fn a_key_in_the_token_has_no_bytes_and_shows_its_uri() {
    let source = DataSource::Pkcs11(uri("pkcs11:token=meshca;object=ca%201;type=private"));
    let e = source.read(1 << 20).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    let message = e.to_string();
    assert!(
        message.contains("pkcs11:token=meshca;object=ca%201;type=private"),
        "{message}"
    );
    assert!(message.contains("in a PKCS#11 token"), "{message}");
    assert_eq!(
        source.to_string(),
        "pkcs11:token=meshca;object=ca%201;type=private"
    );
    assert_eq!(
        format!("{source:?}"),
        "Pkcs11(pkcs11:token=meshca;object=ca%201;type=private)"
    );
}
