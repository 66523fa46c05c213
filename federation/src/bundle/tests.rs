use proptest::prelude::*;
use rcgen::{
    BasicConstraints, CertificateParams, IsCa, KeyPair, SanType, PKCS_ECDSA_P256_SHA256,
    PKCS_ECDSA_P384_SHA384,
};

use super::*;

fn td(name: &str) -> TrustDomain {
    TrustDomain::parse(name).expect("a trust domain")
}

/// A self-signed certificate, DER: a CA of `trust_domain` unless `ca` is false.
fn certificate(
    algorithm: &'static rcgen::SignatureAlgorithm,
    trust_domain: &str,
    ca: bool,
) -> Vec<u8> {
    let key = KeyPair::generate_for(algorithm).expect("a key");
    let mut params = CertificateParams::default();
    if ca {
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    }
    params.subject_alt_names = vec![SanType::URI(
        format!("spiffe://{trust_domain}")
            .try_into()
            .expect("a URI"),
    )];
    params
        .self_signed(&key)
        .expect("a certificate")
        .der()
        .to_vec()
}

fn authority(der: Vec<u8>) -> X509Authority {
    X509Authority::from_der(der, &td("example.org")).expect("a CA of example.org")
}

fn ec_jwt(kid: &str, fill: u8) -> JwtAuthority {
    JwtAuthority {
        kid: kid.into(),
        key: JwkKey::Ec {
            curve: EcCurve::P256,
            x: vec![fill; 32],
            y: vec![fill.wrapping_add(1); 32],
        },
    }
}

fn sample() -> SpiffeBundle {
    let mut bundle = SpiffeBundle::new(
        td("example.org"),
        vec![
            authority(certificate(&PKCS_ECDSA_P256_SHA256, "example.org", true)),
            authority(certificate(&PKCS_ECDSA_P384_SHA384, "example.org", true)),
        ],
        vec![
            ec_jwt("key-1", 7),
            JwtAuthority {
                kid: "rsa-1".into(),
                key: JwkKey::Rsa {
                    n: vec![0xc1; 256],
                    e: vec![1, 0, 1],
                },
            },
        ],
    );
    bundle.sequence = Some(42);
    bundle.refresh_hint = Some(Duration::from_secs(300));
    bundle
}

fn parse(bytes: &[u8]) -> Result<SpiffeBundle, BundleError> {
    SpiffeBundle::parse(&td("example.org"), bytes, BundleLimits::default())
}

/// `bundle`'s JSON, changed by `edit`.
fn edited_from(bundle: &SpiffeBundle, edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut document: Value = serde_json::from_slice(&bundle.to_json()).expect("JSON");
    edit(&mut document);
    serde_json::to_vec(&document).expect("JSON")
}

/// A sample bundle's JSON, changed by `edit`.
fn edited(edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    edited_from(&sample(), edit)
}

fn field_of(error: BundleError) -> String {
    match error {
        BundleError::Field { field, .. } => field,
        other => panic!("not a field error: {other}"),
    }
}

#[test]
fn a_bundle_reads_back_as_written_in_the_standard_form() {
    let bundle = sample();
    let json = bundle.to_json();
    let document: Value = serde_json::from_slice(&json).expect("JSON");
    assert_eq!(document["spiffe_sequence"], 42);
    assert_eq!(document["spiffe_refresh_hint"], 300);
    let keys = document["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 4);
    assert_eq!(keys[0]["use"], "x509-svid");
    assert_eq!(keys[0]["kty"], "EC");
    assert_eq!(keys[0]["crv"], "P-256");
    assert!(keys[0].get("kid").is_none(), "an x509-svid key has no kid");
    assert_eq!(keys[0]["x5c"].as_array().map(Vec::len), Some(1));
    assert_eq!(keys[1]["crv"], "P-384");
    assert_eq!(keys[2]["use"], "jwt-svid");
    assert_eq!(keys[2]["kid"], "key-1");
    assert!(keys[2].get("x5c").is_none());
    assert_eq!(keys[3]["kty"], "RSA");
    assert_eq!(keys[3]["e"], "AQAB");

    let read = parse(&json).expect("it reads");
    assert_eq!(read, bundle);
    assert_eq!(read.to_json(), json, "one canonical form");
}

#[test]
fn elements_of_unknown_use_key_type_or_curve_are_skipped() {
    let bundle = sample();
    let json = edited_from(&bundle, |d| {
        let keys = d["keys"].as_array_mut().expect("keys");
        keys.push(serde_json::json!({"use": "sig", "kty": "EC", "crv": "P-256"}));
        keys.push(serde_json::json!({"kty": "EC", "crv": "P-256", "x": "", "y": ""}));
        keys.push(serde_json::json!({"use": "jwt-svid", "kty": "OKP", "crv": "Ed25519", "x": "AA", "kid": "ed"}));
        keys.push(serde_json::json!({"use": "jwt-svid", "kty": "EC", "crv": "P-521", "x": "AA", "y": "AA", "kid": "p521"}));
    });
    assert_eq!(parse(&json).expect("it reads"), bundle);
}

#[test]
fn an_x509_key_holds_exactly_one_ca_certificate_of_its_trust_domain_with_its_own_key() {
    let other = STANDARD.encode(certificate(&PKCS_ECDSA_P256_SHA256, "example.org", true));
    let two = edited(|d| {
        d["keys"][0]["x5c"]
            .as_array_mut()
            .expect("x5c")
            .push(other.clone().into())
    });
    assert_eq!(field_of(parse(&two).expect_err("refused")), "keys[0].x5c");

    let leaf = STANDARD.encode(certificate(&PKCS_ECDSA_P256_SHA256, "example.org", false));
    let not_ca = edited(|d| d["keys"][0]["x5c"][0] = leaf.clone().into());
    let error = parse(&not_ca).expect_err("refused");
    assert!(
        error.to_string().contains("not a CA certificate"),
        "{error}"
    );

    let foreign = STANDARD.encode(certificate(&PKCS_ECDSA_P256_SHA256, "evil.example", true));
    let foreign = edited(|d| d["keys"][0]["x5c"][0] = foreign.clone().into());
    let error = parse(&foreign).expect_err("refused");
    assert!(error.to_string().contains("evil.example"), "{error}");

    let swapped = edited(|d| d["keys"][0]["x5c"][0] = other.clone().into());
    let error = parse(&swapped).expect_err("refused");
    assert_eq!(field_of(error), "keys[0]");

    let garbage = edited(|d| d["keys"][1]["x5c"][0] = "not base64!".into());
    assert_eq!(
        field_of(parse(&garbage).expect_err("refused")),
        "keys[1].x5c[0]"
    );
}

/// A change to a bundle's JSON.
type Edit = Box<dyn Fn(&mut Value)>;

#[test]
fn a_malformed_element_refuses_the_whole_bundle_naming_it() {
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|d| d["keys"][2]["kid"] = "".into()), "keys[2].kid"),
        (
            Box::new(|d| d["keys"][3]["kid"] = "key-1".into()),
            "keys[3].kid",
        ),
        (
            Box::new(|d| {
                d["keys"][2].as_object_mut().expect("key").remove("kid");
            }),
            "keys[2].kid",
        ),
        (Box::new(|d| d["keys"][2]["x"] = "AAAA".into()), "keys[2].x"),
        (Box::new(|d| d["keys"][2]["y"] = 7.into()), "keys[2].y"),
        (Box::new(|d| d["keys"][3]["n"] = "AAEC".into()), "keys[3].n"),
        (Box::new(|d| d["keys"][3]["e"] = "".into()), "keys[3].e"),
        (Box::new(|d| d["keys"][0]["use"] = 1.into()), "keys[0].use"),
        (Box::new(|d| d["keys"][1] = "a key".into()), "keys[1]"),
        (
            Box::new(|d| d["spiffe_sequence"] = (-1).into()),
            "spiffe_sequence",
        ),
        (
            Box::new(|d| d["spiffe_refresh_hint"] = 1.5.into()),
            "spiffe_refresh_hint",
        ),
        (Box::new(|d| d["keys"] = "none".into()), "keys"),
        (
            Box::new(|d| {
                d.as_object_mut().expect("object").remove("keys");
            }),
            "keys",
        ),
    ];
    for (edit, at) in cases {
        let error = parse(&edited(edit)).expect_err("refused");
        assert_eq!(field_of(error.clone()), at, "{error}");
    }
}

#[test]
fn a_bundle_is_bounded_and_must_hold_an_authority() {
    let json = sample().to_json();
    let tight = BundleLimits {
        max_bytes: json.len() - 1,
        max_keys: 256,
    };
    assert!(matches!(
        SpiffeBundle::parse(&td("example.org"), &json, tight),
        Err(BundleError::TooLarge { .. })
    ));
    let few = BundleLimits {
        max_bytes: 1 << 20,
        max_keys: 3,
    };
    assert_eq!(
        SpiffeBundle::parse(&td("example.org"), &json, few),
        Err(BundleError::TooManyKeys { count: 4, max: 3 })
    );
    assert_eq!(
        parse(br#"{"keys": [{"use": "sig", "kty": "EC"}], "spiffe_sequence": 1}"#),
        Err(BundleError::NoAuthority)
    );
    assert!(matches!(parse(b"[]"), Err(BundleError::NotJson(_))));
    assert!(matches!(
        parse(b"{\"keys\": ["),
        Err(BundleError::NotJson(_))
    ));
    // Without a sequence or a hint (both optional), a bundle still reads.
    let bare = edited(|d| {
        let object = d.as_object_mut().expect("object");
        object.remove("spiffe_sequence");
        object.remove("spiffe_refresh_hint");
    });
    let read = parse(&bare).expect("it reads");
    assert_eq!((read.sequence, read.refresh_hint), (None, None));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_bytes_are_read_or_refused_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = parse(&bytes);
    }

    #[test]
    fn any_bundle_of_jwt_keys_reads_back_as_written(
        keys in proptest::collection::vec((any::<u8>(), any::<bool>()), 1..8),
        sequence in proptest::option::of(any::<u64>()),
        hint in proptest::option::of(0..=u64::MAX / 2),
    ) {
        let authorities = keys
            .iter()
            .enumerate()
            .map(|(i, (fill, rsa))| JwtAuthority {
                kid: format!("k{i}"),
                key: if *rsa {
                    JwkKey::Rsa { n: vec![fill | 0x80; 256 + usize::from(*fill)], e: vec![3] }
                } else {
                    ec_jwt("", *fill).key
                },
            })
            .collect();
        let mut bundle = SpiffeBundle::new(td("example.org"), Vec::new(), authorities);
        bundle.sequence = sequence;
        bundle.refresh_hint = hint.map(Duration::from_secs);
        let json = bundle.to_json();
        prop_assert_eq!(parse(&json), Ok(bundle));
    }

    /// Any one value of a valid bundle replaced by another JSON value: read or refused, never a panic,
    /// and what is read renders to a document that reads back the same.
    #[test]
    fn a_valid_bundle_with_one_value_changed_is_read_or_refused_cleanly(
        index in 0usize..4,
        name in prop::sample::select(vec!["use", "kty", "crv", "x", "y", "n", "e", "kid", "x5c"]),
        value in prop_oneof![
            Just(Value::Null),
            any::<i64>().prop_map(Value::from),
            ".{0,40}".prop_map(Value::from),
            Just(serde_json::json!([])),
            Just(serde_json::json!({})),
        ],
    ) {
        let json = edited(|d| d["keys"][index][name] = value);
        if let Ok(read) = parse(&json) {
            let again = read.to_json();
            prop_assert_eq!(parse(&again), Ok(read));
        }
    }
}

#[test]
fn an_initial_bundle_is_a_spiffe_bundle_or_pem_certificates() {
    let bundle = sample();
    let json = bundle.to_json();
    let read = SpiffeBundle::parse_initial(&td("example.org"), &json, BundleLimits::default());
    assert_eq!(read, Ok(bundle.clone()));

    let pem = bundle.x509_pem();
    let read =
        SpiffeBundle::parse_initial(&td("example.org"), pem.as_bytes(), BundleLimits::default())
            .expect("PEM reads");
    assert_eq!(read.x509_authorities(), bundle.x509_authorities());
    assert!(read.jwt_authorities().is_empty());

    let key = pem::encode(&pem::Pem::new("PRIVATE KEY", vec![1, 2, 3]));
    let with_key = format!("{pem}{key}");
    let error = SpiffeBundle::parse_initial(
        &td("example.org"),
        with_key.as_bytes(),
        BundleLimits::default(),
    )
    .expect_err("refused");
    assert_eq!(field_of(error), "PEM block 2");
    assert_eq!(
        SpiffeBundle::parse_initial(&td("example.org"), b"no PEM here", BundleLimits::default()),
        Err(BundleError::NoAuthority)
    );
}
