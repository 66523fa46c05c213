use proptest::prelude::*;

use super::*;

fn parse(s: &str) -> Result<Selector, SelectorError> {
    s.parse()
}

#[test]
fn accepts_every_canonical_form() {
    let sha = "0123456789abcdef".repeat(4);
    for (text, kind, value) in [
        ("unix:uid:0", SelectorKind::Uid, "0"),
        ("unix:uid:4294967295", SelectorKind::Uid, "4294967295"),
        ("unix:user:billing", SelectorKind::User, "billing"),
        ("unix:gid:1001", SelectorKind::Gid, "1001"),
        ("unix:group:wheel", SelectorKind::Group, "wheel"),
        (
            "unix:supplementary_gid:27",
            SelectorKind::SupplementaryGid,
            "27",
        ),
        (
            "unix:supplementary_group:docker",
            SelectorKind::SupplementaryGroup,
            "docker",
        ),
        (
            "unix:path:/usr/local/bin/billing",
            SelectorKind::Path,
            "/usr/local/bin/billing",
        ),
        ("unix:path:/a:b c", SelectorKind::Path, "/a:b c"),
        (
            &format!("unix:sha256:{sha}"),
            SelectorKind::Sha256,
            sha.as_str(),
        ),
        (
            "systemd:unit:billing.service",
            SelectorKind::SystemdUnit,
            "billing.service",
        ),
        (
            "systemd:unit:getty@tty1.service",
            SelectorKind::SystemdUnit,
            "getty@tty1.service",
        ),
    ] {
        let selector = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(selector.kind(), kind, "{text}");
        assert_eq!(selector.value(), value, "{text}");
        assert_eq!(selector.to_string(), text);
        assert_eq!(Selector::new(kind, value), Ok(selector));
    }
}

#[test]
fn numeric_selectors_from_ids() {
    assert_eq!(
        Selector::id(SelectorKind::Uid, 1001).map(|s| s.to_string()),
        Some("unix:uid:1001".to_owned())
    );
    assert_eq!(
        Selector::id(SelectorKind::SupplementaryGid, 0).map(|s| s.to_string()),
        Some("unix:supplementary_gid:0".to_owned())
    );
    assert_eq!(Selector::id(SelectorKind::User, 1), None);
}

#[track_caller]
fn refused(text: &str, expected: &str) {
    match parse(text) {
        Ok(s) => panic!("{text:?} was accepted as {s}"),
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains(expected),
                "{text:?}: expected {expected:?} in {message:?}"
            );
        }
    }
}

#[test]
fn refuses_other_forms_saying_what_is_wrong() {
    let sha = "0123456789abcdef".repeat(4);
    refused("", "expected TYPE:KIND:VALUE");
    refused("unix", "expected TYPE:KIND:VALUE");
    refused("unix:uid", "expected TYPE:KIND:VALUE");
    refused("k8s:ns:default", "unknown selector kind \"k8s:ns\"");
    refused("unix:pid:1", "accepted: unix:uid:N, unix:user:NAME");
    refused("UNIX:uid:1", "unknown selector kind");
    refused(
        "unix:uid:",
        "invalid unix:uid selector value \"\": must not be empty",
    );
    refused("unix:uid:-1", "decimal number");
    refused("unix:uid:+1", "decimal number");
    refused("unix:uid:01", "without sign or leading zeros");
    refused("unix:gid:4294967296", "decimal number");
    refused("unix:supplementary_gid:x", "decimal number");
    refused("unix:user:", "must not be empty");
    refused("unix:user:bill ing", "whitespace");
    refused("unix:group:a\tb", "whitespace");
    refused("unix:supplementary_group:a\u{7}", "control");
    refused(
        &format!("unix:user:{}", "u".repeat(257)),
        "longer than 256 bytes",
    );
    refused("unix:path:usr/bin/x", "absolute path");
    refused("unix:path:./x", "absolute path");
    for path in [
        "/usr//bin/x",
        "/usr/bin/./x",
        "/usr/../bin/x",
        "/usr/bin/",
        "/",
    ] {
        refused(&format!("unix:path:{path}"), "resolved path");
    }
    refused("unix:path:", "must not be empty");
    refused("unix:path:/a\0b", "NUL");
    refused(
        &format!("unix:path:/{}", "p".repeat(4096)),
        "longer than 4096 bytes",
    );
    refused(&format!("unix:sha256:{}", sha.to_uppercase()), "lowercase");
    refused(&format!("unix:sha256:{}A", &sha[1..]), "lowercase");
    refused(
        &format!("unix:sha256:{}", &sha[1..]),
        "64 lowercase hex digits",
    );
    refused(&format!("unix:sha256:{sha}0"), "64 lowercase hex digits");
    refused(
        &format!("unix:sha256:{}g", &sha[1..]),
        "64 lowercase hex digits",
    );
    refused("systemd:unit:billing", "NAME.service");
    refused("systemd:unit:.service", "NAME.service");
    refused("systemd:unit:billing.socket", "NAME.service");
    refused("systemd:unit:a b.service", "whitespace");
}

#[test]
fn long_input_is_cut_in_errors() {
    let error = parse(&format!("unix:path:{}", "x".repeat(100_000)))
        .expect_err("relative")
        .to_string();
    assert!(error.len() < 300, "{error}");
}

#[test]
fn serializes_as_its_text() {
    let selector = parse("unix:uid:1001").expect("valid");
    assert_eq!(
        serde_json::to_string(&selector).expect("json"),
        "\"unix:uid:1001\""
    );
    let back: Selector = serde_json::from_str("\"unix:uid:1001\"").expect("json");
    assert_eq!(back, selector);
    assert!(serde_json::from_str::<Selector>("\"unix:uid:x\"").is_err());
}

/// Any valid selector, built from its parts.
fn any_selector() -> impl Strategy<Value = Selector> {
    let id = |kind| any::<u32>().prop_map(move |n| format!("{}:{n}", SelectorKind::prefix(kind)));
    let name = |kind: SelectorKind| {
        "[!-~\u{a1}-\u{17f}]{1,40}".prop_map(move |n| format!("{}:{n}", kind.prefix()))
    };
    prop_oneof![
        id(SelectorKind::Uid),
        id(SelectorKind::Gid),
        id(SelectorKind::SupplementaryGid),
        name(SelectorKind::User),
        name(SelectorKind::Group),
        name(SelectorKind::SupplementaryGroup),
        prop::collection::vec("[^/\u{0}]{1,12}", 1..5)
            .prop_filter("canonical", |parts| parts
                .iter()
                .all(|p| p != "." && p != ".."))
            .prop_map(|parts| format!("unix:path:/{}", parts.join("/"))),
        "[0-9a-f]{64}".prop_map(|h| format!("unix:sha256:{h}")),
        "[!-~]{1,30}".prop_map(|u| format!("systemd:unit:{u}.service")),
    ]
    .prop_map(|text| match text.parse::<Selector>() {
        Ok(selector) => selector,
        Err(e) => panic!("generated {text:?} is refused: {e}"),
    })
}

proptest! {
    #[test]
    fn display_and_parse_round_trip(selector in any_selector()) {
        let text = selector.to_string();
        prop_assert_eq!(text.parse::<Selector>(), Ok(selector.clone()));
        prop_assert_eq!(Selector::new(selector.kind(), selector.value()), Ok(selector));
    }

    #[test]
    fn parsing_arbitrary_text_never_panics(text in any::<String>()) {
        if let Ok(selector) = text.parse::<Selector>() {
            prop_assert_eq!(selector.to_string(), text);
        }
    }

    #[test]
    fn parsing_near_selectors_never_panics(
        prefix in prop::sample::select(SelectorKind::ALL.to_vec()),
        rest in "\\PC{0,80}",
    ) {
        let text = format!("{}:{rest}", prefix.prefix());
        if let Ok(selector) = text.parse::<Selector>() {
            prop_assert_eq!(selector.to_string(), text);
        }
    }
}
