use proptest::prelude::*;

use super::*;

fn parsed(text: &str) -> Selector {
    parse_selector(text).unwrap_or_else(|error| panic!("{text:?} should parse: {error}"))
}

#[test]
fn every_form_parses_and_writes_back_the_same() {
    for text in [
        "unix:uid:0",
        "unix:uid:4294967295",
        "unix:user:billing",
        "unix:gid:1001",
        "unix:group:domain users@example.com",
        "unix:supplementary_gid:27",
        "unix:supplementary_group:sudo",
        "unix:path:/usr/local/bin/billing",
        "unix:path:/opt/a b/c:d",
        "unix:sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "systemd:unit:billing.service",
        "systemd:unit:getty@tty1.service",
    ] {
        assert_eq!(parsed(text).to_string(), text);
    }
}

#[test]
fn a_digest_in_capitals_is_written_in_lowercase() {
    let upper = "unix:sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855";
    assert_eq!(parsed(upper).to_string(), upper.to_lowercase());
    assert_eq!(parsed(upper), parsed(&upper.to_lowercase()));
}

fn error_of(text: &str) -> SelectorError {
    match parse_selector(text) {
        Ok(selector) => panic!("{text:?} should be refused, parsed as {selector}"),
        Err(error) => error,
    }
}

#[test]
fn unknown_types_are_refused_with_the_known_ones_listed() {
    for text in [
        "unix:pid:1",
        "uid:1",
        "UNIX:uid:1",
        "k8s:ns:default",
        "",
        "unix:uid",
    ] {
        let error = error_of(text);
        assert!(
            matches!(error, SelectorError::UnknownType { .. }),
            "{text:?}: {error}"
        );
        assert!(
            error.to_string().contains("unix:supplementary_gid:"),
            "{error}"
        );
    }
}

#[test]
fn ids_must_be_plain_decimal() {
    for text in [
        "unix:uid:",
        "unix:uid:-1",
        "unix:uid:+1",
        "unix:uid:007",
        "unix:uid: 1",
        "unix:gid:1 ",
        "unix:gid:4294967296",
        "unix:supplementary_gid:0x10",
    ] {
        let error = error_of(text);
        assert!(
            matches!(error, SelectorError::Id { .. }),
            "{text:?}: {error}"
        );
        assert!(error.to_string().contains(&format!("{text:?}")), "{error}");
    }
}

#[test]
fn names_must_be_names() {
    let long = format!("unix:user:{}", "a".repeat(MAX_NAME_LEN + 1));
    for text in [
        "unix:user:",
        "unix:user: root",
        "unix:group:a:b",
        "unix:group:a\nb",
        &long,
    ] {
        let error = error_of(text);
        assert!(
            matches!(error, SelectorError::Name { .. }),
            "{text:?}: {error}"
        );
    }
    parsed(&format!("unix:user:{}", "a".repeat(MAX_NAME_LEN)));
}

#[test]
fn paths_must_be_absolute_and_canonical() {
    let long = format!("unix:path:/{}", "a".repeat(MAX_PATH_LEN));
    for (text, says) in [
        ("unix:path:", "absolute"),
        ("unix:path:usr/bin/x", "absolute"),
        ("unix:path:/", "root"),
        ("unix:path:/usr/bin/", "directory"),
        ("unix:path:/usr//bin/x", "canonical"),
        ("unix:path:/usr/./bin/x", "canonical"),
        ("unix:path:/usr/../bin/x", "canonical"),
        ("unix:path:/usr/bin/x\n", "control"),
        (long.as_str(), "4096"),
    ] {
        let error = error_of(text);
        assert!(
            matches!(error, SelectorError::Path { .. }),
            "{text:?}: {error}"
        );
        assert!(error.to_string().contains(says), "{text:?}: {error}");
    }
}

#[test]
fn digests_must_be_64_hex_digits() {
    let good = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    let bad = [
        String::from("unix:sha256:"),
        format!("unix:sha256:{}", &good[..63]),
        format!("unix:sha256:{good}0"),
        format!("unix:sha256:{}g", &good[..63]),
        format!("unix:sha256:{}é", &good[..62]),
    ];
    for text in &bad {
        let error = error_of(text);
        assert!(
            matches!(error, SelectorError::Sha256 { .. }),
            "{text:?}: {error}"
        );
    }
}

#[test]
fn units_must_be_services() {
    let long = format!("systemd:unit:{}.service", "a".repeat(MAX_UNIT_LEN));
    for text in [
        "systemd:unit:",
        "systemd:unit:.service",
        "systemd:unit:billing",
        "systemd:unit:session-3.scope",
        "systemd:unit:a b.service",
        "systemd:unit:a/b.service",
        &long,
    ] {
        let error = error_of(text);
        assert!(
            matches!(error, SelectorError::Unit { .. }),
            "{text:?}: {error}"
        );
    }
}

#[test]
fn a_registration_matches_when_the_caller_has_all_its_selectors() {
    let caller: Selectors = [
        "unix:uid:1001",
        "unix:user:billing",
        "unix:path:/usr/bin/billing",
    ]
    .into_iter()
    .map(parsed)
    .collect();
    assert!(caller.contains_all(&[parsed("unix:uid:1001")]));
    assert!(caller.contains_all(&[
        parsed("unix:path:/usr/bin/billing"),
        parsed("unix:uid:1001")
    ]));
    assert!(!caller.contains_all(&[parsed("unix:uid:1001"), parsed("unix:gid:1001")]));
    assert!(!caller.contains_all(&[parsed("unix:uid:0")]));
    assert_eq!(caller.len(), 3);
}

#[test]
fn the_constructors_refuse_what_parsing_refuses() {
    assert_eq!(Selector::user("a:b"), None);
    assert_eq!(Selector::group(""), None);
    assert_eq!(
        Selector::supplementary_group("x\u{fffd}").map(|s| s.to_string()),
        Some("unix:supplementary_group:x\u{fffd}".into())
    );
    assert_eq!(Selector::path("relative"), None);
    assert_eq!(Selector::systemd_unit("x\u{fffd}.service"), None);
    assert_eq!(
        Selector::path("/usr/bin/x"),
        Some(parsed("unix:path:/usr/bin/x"))
    );
}

fn selector_text() -> impl Strategy<Value = String> {
    let name = "[a-zA-Z0-9_][a-zA-Z0-9_ .@-]{0,30}[a-zA-Z0-9_]";
    prop_oneof![
        any::<u32>().prop_map(|id| format!("unix:uid:{id}")),
        any::<u32>().prop_map(|id| format!("unix:gid:{id}")),
        any::<u32>().prop_map(|id| format!("unix:supplementary_gid:{id}")),
        name.prop_map(|name| format!("unix:user:{name}")),
        name.prop_map(|name| format!("unix:group:{name}")),
        name.prop_map(|name| format!("unix:supplementary_group:{name}")),
        prop::collection::vec("[^/\u{0}-\u{1f}\u{7f}-\u{9f}]{1,20}", 1..6)
            .prop_filter("canonical components", |parts| parts
                .iter()
                .all(|p| p != "." && p != ".."))
            .prop_map(|parts| format!("unix:path:/{}", parts.join("/"))),
        "[0-9a-f]{64}".prop_map(|hex| format!("unix:sha256:{hex}")),
        "[a-zA-Z0-9:_.@-]{1,40}".prop_map(|unit| format!("systemd:unit:{unit}.service")),
    ]
}

proptest! {
    #[test]
    fn canonical_forms_round_trip(text in selector_text()) {
        let selector = parse_selector(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(selector.to_string(), text);
    }

    #[test]
    fn parsing_never_panics_and_its_output_is_canonical(text in any::<String>()) {
        if let Ok(selector) = parse_selector(&text) {
            prop_assert_eq!(parse_selector(&selector.to_string()), Ok(selector));
        }
    }

    #[test]
    fn parsing_never_panics_after_a_known_type(
        prefix in prop::sample::select(TYPES.iter().map(|(prefix, _)| *prefix).collect::<Vec<_>>()),
        value in any::<String>(),
    ) {
        let text = format!("{prefix}{value}");
        if let Ok(selector) = parse_selector(&text) {
            prop_assert_eq!(parse_selector(&selector.to_string()), Ok(selector));
        }
    }
}
