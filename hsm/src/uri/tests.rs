use std::collections::BTreeMap;

use proptest::prelude::*;

use super::error::Ordinal;
use super::*;

fn refused(text: &str) -> UriError {
    match Pkcs11Uri::parse(text) {
        Ok(uri) => panic!("{text:?} parsed as {uri:?}"),
        Err(e) => e,
    }
}

/// Parses, then checks that the canonical form parses back to the same value.
fn parsed(text: &str) -> Pkcs11Uri {
    let uri = Pkcs11Uri::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let canonical = uri.to_string();
    assert_eq!(
        Pkcs11Uri::parse(&canonical).as_ref(),
        Ok(&uri),
        "{canonical:?}"
    );
    uri
}

#[test]
fn rfc_7512_examples_without_a_pin() {
    assert_eq!(parsed("pkcs11:"), Pkcs11Uri::default());
    assert_eq!(parsed("pkcs11:").to_string(), "pkcs11:");

    let uri = parsed("pkcs11:object=my-pubkey;type=public");
    assert_eq!(uri.object(), Some("my-pubkey"));
    assert_eq!(uri.object_type(), Some(ObjectType::Public));
    assert_eq!(uri.token(), None);
    assert_eq!(uri.id(), None);

    let uri = parsed("pkcs11:object=my-sign-key;type=private?module-name=mypkcs11");
    assert_eq!(uri.object_type(), Some(ObjectType::Private));
    assert_eq!(uri.details.module_name.as_deref(), Some("mypkcs11"));

    let uri = parsed("pkcs11:object=my-sign-key;type=private?module-path=/mnt/libmypkcs11.so.1");
    assert_eq!(uri.module_path(), Some("/mnt/libmypkcs11.so.1"));
    assert_eq!(
        uri.to_string(),
        "pkcs11:object=my-sign-key;type=private?module-path=/mnt/libmypkcs11.so.1"
    );

    let uri = parsed("pkcs11:slot-description=Sun%20Metaslot");
    assert_eq!(
        uri.details.slot_description.as_deref(),
        Some("Sun Metaslot")
    );

    let uri = parsed(
        "pkcs11:library-manufacturer=Snake%20Oil,%20Inc.;library-description=Soft%20Token%20Library;library-version=1.23",
    );
    assert_eq!(
        uri.details.library_manufacturer.as_deref(),
        Some("Snake Oil, Inc.")
    );
    assert_eq!(
        uri.details.library_description.as_deref(),
        Some("Soft Token Library")
    );
    assert_eq!(uri.details.library_version.as_deref(), Some("1.23"));

    // Escapes in either case; `id` is binary.
    let uri = parsed(
        "pkcs11:token=My%20token%25%20created%20by%20Joe;library-version=3;id=%01%02%03%Ba%dd%Ca%fe%04%05%06",
    );
    assert_eq!(uri.token(), Some("My token% created by Joe"));
    assert_eq!(
        uri.id(),
        Some(&[0x01, 0x02, 0x03, 0xba, 0xdd, 0xca, 0xfe, 0x04, 0x05, 0x06][..])
    );
    assert_eq!(
        uri.to_string(),
        "pkcs11:token=My%20token%25%20created%20by%20Joe;id=%01%02%03%BA%DD%CA%FE%04%05%06;library-version=3"
    );

    let uri = parsed(
        "pkcs11:token=A%20name%20with%20a%20substring%20%25%3B;object=my-certificate;type=cert",
    );
    assert_eq!(uri.token(), Some("A name with a substring %;"));
    assert_eq!(uri.object_type(), Some(ObjectType::Cert));

    let uri = parsed(
        "pkcs11:token=Name%20with%20a%20small%20A%20with%20acute:%20%C3%A1;object=my-certificate;type=cert",
    );
    assert_eq!(uri.token(), Some("Name with a small A with acute: á"));
}

#[test]
fn rfc_7512_examples_with_a_pin_are_refused() {
    for (text, attribute) in [
        (
            "pkcs11:object=my-key;type=private?pin-source=file:/etc/token",
            "pin-source",
        ),
        (
            "pkcs11:token=The%20Software%20PKCS%2311%20Softtoken;manufacturer=Snake%20Oil,%20Inc.;model=1.0;object=my-certificate;type=cert;id=%69%95%3E%5C%F4%BD%EC%91;serial=?pin-source=file:/etc/token_pin",
            "pin-source",
        ),
        (
            "pkcs11:token=Software%20PKCS%2311%20softtoken;manufacturer=Snake%20Oil,%20Inc.?pin-value=the-pin",
            "pin-value",
        ),
    ] {
        let e = refused(text);
        assert_eq!(e, UriError::Pin { attribute }, "{text}");
        let message = e.to_string();
        assert!(message.contains(attribute), "{message}");
        assert!(
            message.contains("keystore.pkcs11.pinFile")
                && message.contains("MESHCA_KEYSTORE_PKCS11_PIN"),
            "{message}"
        );
        assert!(!message.contains("the-pin") && !message.contains("/etc/token"));
    }
}

#[test]
fn the_pin_is_refused_before_its_value_is_read() {
    // A malformed PIN is never quoted back either.
    let e = refused("pkcs11:token=a?pin-value=s3cr%zz t");
    assert_eq!(
        e,
        UriError::Pin {
            attribute: "pin-value"
        }
    );
    assert!(!e.to_string().contains("s3cr"));
    // Misplaced in the path, it is refused as a PIN all the same.
    assert_eq!(
        refused("pkcs11:pin-source=file:/p;token=a"),
        UriError::Pin {
            attribute: "pin-source"
        }
    );
}

#[test]
fn scheme() {
    for text in [
        "http://x",
        "pkcs12:token=a",
        "",
        "pkcs11",
        "token=a",
        "pkcs1:",
    ] {
        let e = refused(text);
        assert!(matches!(e, UriError::Scheme { .. }), "{text}: {e:?}");
        assert!(e.to_string().contains("pkcs11:"), "{e}");
    }
    // The scheme is case-insensitive (RFC 3986); the canonical form is lower case.
    assert_eq!(parsed("PKCS11:token=a").to_string(), "pkcs11:token=a");
    // A multi-byte character where the scheme ends is not a panic.
    assert!(matches!(refused("pkcs1é:"), UriError::Scheme { .. }));
}

#[test]
fn duplicates() {
    for (text, attribute) in [
        ("pkcs11:token=a;token=b", "token"),
        ("pkcs11:id=%01;object=o;id=%01", "id"),
        ("pkcs11:type=private;type=private", "type"),
        ("pkcs11:slot-id=1;slot-id=2", "slot-id"),
        ("pkcs11:x-a=1;x-a=2", "x-a"),
        ("pkcs11:?module-path=/a&module-path=/b", "module-path"),
        ("pkcs11:?x-q=1&x-q=1", "x-q"),
    ] {
        let e = refused(text);
        assert_eq!(
            e,
            UriError::Duplicate {
                attribute: attribute.into()
            },
            "{text}"
        );
        assert!(e.to_string().contains(&format!("{attribute:?}")), "{e}");
    }
}

#[test]
fn empty_names_and_missing_values() {
    for (text, component, position) in [
        ("pkcs11:token=a;;object=b", "path", 2),
        ("pkcs11:token=a;", "path", 2),
        ("pkcs11:=a", "path", 1),
        ("pkcs11:;", "path", 1),
        ("pkcs11:?module-name=a&", "query", 2),
        ("pkcs11:?=x", "query", 1),
    ] {
        let e = refused(text);
        assert_eq!(
            e,
            UriError::EmptyName {
                component,
                position
            },
            "{text}"
        );
        assert!(e.to_string().contains(component), "{e}");
    }
    assert_eq!(
        refused("pkcs11:token=a;;").to_string().split(' ').nth(1),
        Some("2nd")
    );
    let e = refused("pkcs11:token");
    assert_eq!(
        e,
        UriError::MissingValue {
            attribute: "token".into()
        }
    );
    assert!(e.to_string().contains("\"token\""), "{e}");
    // An empty value is a value.
    assert_eq!(parsed("pkcs11:serial=").serial(), Some(""));
}

#[test]
fn unknown_attributes() {
    let e = refused("pkcs11:token=a;label=b");
    assert_eq!(
        e,
        UriError::UnknownAttribute {
            component: "path",
            attribute: "label".into(),
            known: PATH_NAMES,
        }
    );
    assert!(e.to_string().contains("\"label\""), "{e}");
    // Names are case-sensitive.
    assert!(matches!(
        refused("pkcs11:Token=a"),
        UriError::UnknownAttribute { attribute, .. } if attribute == "Token"
    ));
    // A path attribute in the query, and the reverse.
    assert!(matches!(
        refused("pkcs11:?token=a"),
        UriError::UnknownAttribute { component: "query", attribute, .. } if attribute == "token"
    ));
    assert!(matches!(
        refused("pkcs11:module-path=/x"),
        UriError::UnknownAttribute { component: "path", attribute, .. } if attribute == "module-path"
    ));
    // RFC 7512's own example of vendor attributes without the x- prefix.
    assert!(matches!(
        refused("pkcs11:token=my-token;object=my-certificate;type=cert;vendor-aaa=value-a"),
        UriError::UnknownAttribute { attribute, .. } if attribute == "vendor-aaa"
    ));
    // A long name is cut in the message.
    let long = "n".repeat(500);
    let message = refused(&format!("pkcs11:{long}=1")).to_string();
    assert!(message.len() < 400, "{message}");
}

#[test]
fn vendor_attributes_are_kept_and_ignored() {
    let uri = parsed("pkcs11:x-b=2;object=k;x-a=%41?x-q=/p&module-name=m");
    assert_eq!(uri.object(), Some("k"));
    assert_eq!(
        uri.details.vendor_path,
        BTreeMap::from([
            ("x-a".to_owned(), "A".to_owned()),
            ("x-b".to_owned(), "2".to_owned())
        ])
    );
    assert_eq!(
        uri.to_string(),
        "pkcs11:object=k;x-a=A;x-b=2?module-name=m&x-q=/p"
    );
    for name in ["x-", "x-a.b", "x-é"] {
        let e = refused(&format!("pkcs11:{name}=1"));
        assert_eq!(
            e,
            UriError::VendorName {
                attribute: name.into()
            }
        );
        assert!(e.to_string().contains(&format!("{name:?}")), "{e}");
    }
}

#[test]
fn unknown_type() {
    for value in ["secret", "Private", "", "%70rivate%00"] {
        let e = refused(&format!("pkcs11:object=k;type={value}"));
        assert!(matches!(e, UriError::UnknownType { .. }), "{value}: {e:?}");
        assert!(e.to_string().contains("\"type\""), "{e}");
    }
    // Escaped, a type is still a type.
    assert_eq!(
        parsed("pkcs11:type=secret%2Dkey").object_type(),
        Some(ObjectType::SecretKey)
    );
    for t in ObjectType::ALL {
        assert_eq!(parsed(&format!("pkcs11:type={t}")).object_type(), Some(t));
    }
}

#[test]
fn bad_escapes() {
    for (text, escape) in [
        ("pkcs11:object=a%2", "%2"),
        ("pkcs11:object=a%", "%"),
        ("pkcs11:object=%g0", "%g0"),
        ("pkcs11:object=%0g", "%0g"),
        ("pkcs11:id=%%41", "%%4"),
        ("pkcs11:object=%-1", "%-1"),
    ] {
        let e = refused(text);
        let attribute = if text.contains("id=") { "id" } else { "object" };
        assert_eq!(
            e,
            UriError::BadEscape {
                attribute: attribute.into(),
                escape: escape.into()
            },
            "{text}"
        );
        assert!(e.to_string().contains(&format!("{attribute:?}")), "{e}");
    }
    // A multi-byte character right after `%` is not a panic.
    assert!(matches!(
        refused("pkcs11:object=%é"),
        UriError::BadEscape { escape, .. } if escape == "%é"
    ));
}

#[test]
fn characters_that_must_be_encoded() {
    for (text, attribute, character, encoded) in [
        ("pkcs11:object=my key", "object", ' ', "%20"),
        ("pkcs11:token=clé", "token", 'é', "%C3%A9"),
        ("pkcs11:object=a/b", "object", '/', "%2F"),
        ("pkcs11:object=a#b", "object", '#', "%23"),
        ("pkcs11:object=a\"b", "object", '"', "%22"),
        ("pkcs11:?module-path=a;b", "module-path", ';', "%3B"),
    ] {
        let e = refused(text);
        assert_eq!(
            e,
            UriError::Unencoded {
                attribute: attribute.into(),
                character,
                encoded: encoded.into()
            },
            "{text}"
        );
        assert!(e.to_string().contains(encoded), "{e}");
    }
    // Reserved characters RFC 7512 allows as is, in the path and (with / ? |) in the query.
    let uri = parsed("pkcs11:object=a:b@c!$'()*+,=&[]~?module-path=/x?y|z:=");
    assert_eq!(uri.object(), Some("a:b@c!$'()*+,=&[]~"));
    assert_eq!(uri.module_path(), Some("/x?y|z:="));
}

#[test]
fn text_must_be_utf8_but_id_is_binary() {
    let e = refused("pkcs11:object=%C3%28");
    assert_eq!(
        e,
        UriError::NotUtf8 {
            attribute: "object".into()
        }
    );
    assert!(e.to_string().contains("\"object\""), "{e}");
    assert!(matches!(
        refused("pkcs11:?module-name=%FF"),
        UriError::NotUtf8 { attribute } if attribute == "module-name"
    ));
    assert_eq!(
        parsed("pkcs11:id=%C3%28%FF").id(),
        Some(&[0xc3, 0x28, 0xff][..])
    );
    // `id` as given unencoded is the bytes of its text, written back fully encoded.
    let uri = parsed("pkcs11:id=ab");
    assert_eq!(uri.id(), Some(&b"ab"[..]));
    assert_eq!(uri.to_string(), "pkcs11:id=%61%62");
}

#[test]
fn numbers() {
    assert_eq!(parsed("pkcs11:slot-id=0042").slot_id(), Some(42));
    assert_eq!(
        parsed("pkcs11:slot-id=0042").to_string(),
        "pkcs11:slot-id=42"
    );
    assert_eq!(
        parsed(&format!("pkcs11:slot-id={}", u64::MAX)).slot_id(),
        Some(u64::MAX)
    );
    for value in [
        "",
        "-1",
        "+1",
        "1.0",
        "0x10",
        "18446744073709551616",
        "%31a",
    ] {
        let e = refused(&format!("pkcs11:slot-id={value}"));
        assert!(
            matches!(&e, UriError::BadNumber { attribute, .. } if attribute == "slot-id"),
            "{value}: {e:?}"
        );
        assert!(e.to_string().contains("\"slot-id\""), "{e}");
    }
    for value in ["", "1.", ".1", "1.2.3", "v1", "1,2"] {
        let e = refused(&format!("pkcs11:library-version={value}"));
        assert!(
            matches!(&e, UriError::BadNumber { attribute, .. } if attribute == "library-version"),
            "{value}: {e:?}"
        );
    }
}

#[test]
fn length() {
    let at_limit = format!("pkcs11:object={}", "a".repeat(MAX_URI_BYTES - 14));
    assert_eq!(at_limit.len(), MAX_URI_BYTES);
    parsed(&at_limit);
    let over = format!("{at_limit}a");
    let e = refused(&over);
    assert_eq!(e, UriError::TooLong { len: over.len() });
    assert!(e.to_string().contains("4096"), "{e}");
    // `id` is written back three bytes a byte: its canonical form is bounded too.
    let id = format!("pkcs11:id={}", "a".repeat(2000));
    assert!(matches!(refused(&id), UriError::TooLong { len: 6010 }));
}

#[test]
fn key_constructor() {
    let uri = Pkcs11Uri::key("meshca", "ca-1 (mesh default)", &[0x00, 0xff, b'a']);
    assert_eq!(uri.token(), Some("meshca"));
    assert_eq!(uri.object(), Some("ca-1 (mesh default)"));
    assert_eq!(uri.id(), Some(&[0x00, 0xff, b'a'][..]));
    assert_eq!(uri.object_type(), Some(ObjectType::Private));
    assert_eq!(
        uri.to_string(),
        "pkcs11:token=meshca;object=ca-1%20(mesh%20default);type=private;id=%00%FF%61"
    );
    assert_eq!(Pkcs11Uri::parse(&uri.to_string()), Ok(uri));
}

#[test]
fn ordinals() {
    let ordinals: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111]
        .into_iter()
        .map(|n| Ordinal(n).to_string())
        .collect();
    assert_eq!(
        ordinals,
        [
            "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st",
            "111th"
        ]
    );
}

/// Any text, control characters and every reserved character included.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9 ;?&=%/:#.-]{0,12}",
        proptest::collection::vec(any::<char>(), 0..12).prop_map(String::from_iter),
    ]
}

fn vendor_attributes() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map("x-[A-Za-z0-9_-]{1,6}", text(), 0..3)
}

fn object_type() -> impl Strategy<Value = ObjectType> {
    proptest::sample::select(ObjectType::ALL.to_vec())
}

prop_compose! {
    fn any_uri()(
        token in proptest::option::of(text()),
        manufacturer in proptest::option::of(text()),
        model in proptest::option::of(text()),
        serial in proptest::option::of(text()),
        object in proptest::option::of(text()),
        object_type in proptest::option::of(object_type()),
        id in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)),
        library in (
            proptest::option::of(text()),
            proptest::option::of(text()),
            proptest::option::of("[0-9]{1,3}(\\.[0-9]{1,3})?"),
        ),
        slot in (
            proptest::option::of(any::<u64>()),
            proptest::option::of(text()),
            proptest::option::of(text()),
        ),
        vendor_path in vendor_attributes(),
        module_name in proptest::option::of(text()),
        module_path in proptest::option::of(text()),
        vendor_query in vendor_attributes(),
    ) -> Pkcs11Uri {
        Pkcs11Uri {
            token,
            object,
            object_type,
            id,
            details: Box::new(Details {
                manufacturer,
                model,
                serial,
                library_manufacturer: library.0,
                library_description: library.1,
                library_version: library.2,
                slot_id: slot.0,
                slot_description: slot.1,
                slot_manufacturer: slot.2,
                vendor_path,
                module_name,
                module_path,
                vendor_query,
            }),
        }
    }
}

/// Text shaped like a URI: the scheme, then names, separators, escapes and other characters.
fn uri_like() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("token=".to_owned()),
        Just("id=".to_owned()),
        Just("type=".to_owned()),
        Just("slot-id=".to_owned()),
        Just("library-version=".to_owned()),
        Just("x-v=".to_owned()),
        Just("pin-value=".to_owned()),
        Just("module-path=".to_owned()),
        Just("private".to_owned()),
        "[;?&=%.0-9a-fA-F]",
        "%[0-9a-fA-F]{0,2}",
        any::<char>().prop_map(String::from),
    ];
    proptest::collection::vec(piece, 0..24).prop_map(|pieces| format!("pkcs11:{}", pieces.concat()))
}

proptest! {
    #[test]
    fn canonical_form_round_trips(uri in any_uri()) {
        let canonical = uri.to_string();
        prop_assert_eq!(Pkcs11Uri::parse(&canonical), Ok(uri.clone()), "{}", canonical);
        // Canonical means one spelling: printing again gives the same text.
        prop_assert_eq!(Pkcs11Uri::parse(&canonical).map(|u| u.to_string()), Ok(canonical));
    }

    #[test]
    fn parse_never_panics(text in any::<String>()) {
        let _ = Pkcs11Uri::parse(&text);
        let _ = Pkcs11Uri::parse(&format!("pkcs11:{text}"));
    }

    #[test]
    fn whatever_parses_round_trips(text in uri_like()) {
        if let Ok(uri) = Pkcs11Uri::parse(&text) {
            prop_assert_eq!(Pkcs11Uri::parse(&uri.to_string()), Ok(uri));
        }
    }
}
