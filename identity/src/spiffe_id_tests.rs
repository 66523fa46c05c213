//! Vectors written from the rules of the SPIFFE-ID standard (standards/SPIFFE-ID.md), in the spirit of
//! go-spiffe's spiffeid tests, plus property tests.

use super::*;
use proptest::prelude::*;

#[test]
fn valid_ids_parse_into_their_parts() {
    let table: &[(&str, &str, &str)] = &[
        ("spiffe://trustdomain", "trustdomain", ""),
        ("spiffe://example.org/path", "example.org", "/path"),
        (
            "spiffe://example.org/path1/path2",
            "example.org",
            "/path1/path2",
        ),
        (
            "spiffe://trust-domain.org/workload",
            "trust-domain.org",
            "/workload",
        ),
        ("spiffe://trust_domain.org/a", "trust_domain.org", "/a"),
        ("spiffe://0123456789/x", "0123456789", "/x"),
        ("spiffe://td/ns/default/sa/web", "td", "/ns/default/sa/web"),
        (
            "spiffe://td/Mixed-Case_Path.v1",
            "td",
            "/Mixed-Case_Path.v1",
        ),
        // Only segments that are exactly "." or ".." are forbidden.
        ("spiffe://td/...", "td", "/..."),
        ("spiffe://td/.hidden/a..b", "td", "/.hidden/a..b"),
        ("spiffe://a.b.c.d-e_f/p", "a.b.c.d-e_f", "/p"),
    ];
    for (input, td, path) in table {
        let id = SpiffeId::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!(id.trust_domain().as_str(), *td, "{input}");
        assert_eq!(id.path(), *path, "{input}");
        assert_eq!(id.as_str(), *input);
        assert_eq!(id.to_string(), *input);
        assert_eq!(id.is_root(), path.is_empty());
    }
}

#[test]
fn invalid_ids_name_the_rule_they_break() {
    use SpiffeIdError as E;
    let long_td = "a".repeat(256);
    let long_td_id = format!("spiffe://{long_td}/p");
    let long_path_id = format!("spiffe://td/{}", "a".repeat(2048));
    let table: Vec<(&str, SpiffeIdError)> = vec![
        ("", E::Empty),
        ("example.org/path", E::WrongScheme),
        ("SPIFFE://example.org/path", E::WrongScheme),
        ("Spiffe://example.org/path", E::WrongScheme),
        ("http://example.org/path", E::WrongScheme),
        ("spiffe:/example.org", E::WrongScheme),
        ("spiffe:example.org", E::WrongScheme),
        ("spiffe//example.org", E::WrongScheme),
        ("spiffe://", E::MissingTrustDomain),
        ("spiffe:///path", E::MissingTrustDomain),
        (
            "spiffe://Example.org/p",
            E::UppercaseTrustDomain { ch: 'E', offset: 9 },
        ),
        (
            "spiffe://example.ORG",
            E::UppercaseTrustDomain {
                ch: 'O',
                offset: 17,
            },
        ),
        ("spiffe://example.org:8080/p", E::Port { offset: 20 }),
        ("spiffe://user@example.org/p", E::Userinfo { offset: 13 }),
        ("spiffe://user:pass@example.org", E::Port { offset: 13 }),
        ("spiffe://example.org?query", E::Query { offset: 20 }),
        ("spiffe://example.org/p?query", E::Query { offset: 22 }),
        ("spiffe://example.org#frag", E::Fragment { offset: 20 }),
        ("spiffe://example.org/p#frag", E::Fragment { offset: 22 }),
        ("spiffe://exa%41mple.org", E::PercentEncoding { offset: 12 }),
        (
            "spiffe://example.org/p%41th",
            E::PercentEncoding { offset: 22 },
        ),
        (
            "spiffe://exa mple.org",
            E::TrustDomainChar {
                ch: ' ',
                offset: 12,
            },
        ),
        (
            "spiffe://exa$mple.org",
            E::TrustDomainChar {
                ch: '$',
                offset: 12,
            },
        ),
        (
            "spiffe://[::1]/p",
            E::TrustDomainChar { ch: '[', offset: 9 },
        ),
        (
            "spiffe://exämple.org",
            E::TrustDomainChar {
                ch: 'ä',
                offset: 11,
            },
        ),
        ("spiffe://example.org/", E::TrailingSlash),
        ("spiffe://example.org/path/", E::TrailingSlash),
        ("spiffe://example.org//path", E::EmptySegment { offset: 20 }),
        ("spiffe://example.org/a//b", E::EmptySegment { offset: 22 }),
        (
            "spiffe://example.org/.",
            E::DotSegment {
                segment: ".".into(),
                offset: 20,
            },
        ),
        (
            "spiffe://example.org/..",
            E::DotSegment {
                segment: "..".into(),
                offset: 20,
            },
        ),
        (
            "spiffe://example.org/a/./b",
            E::DotSegment {
                segment: ".".into(),
                offset: 22,
            },
        ),
        (
            "spiffe://example.org/a/../b",
            E::DotSegment {
                segment: "..".into(),
                offset: 22,
            },
        ),
        (
            "spiffe://example.org/pa$th",
            E::PathChar {
                ch: '$',
                offset: 23,
            },
        ),
        (
            "spiffe://example.org/pa th",
            E::PathChar {
                ch: ' ',
                offset: 23,
            },
        ),
        (
            "spiffe://example.org/pa\\th",
            E::PathChar {
                ch: '\\',
                offset: 23,
            },
        ),
        (
            "spiffe://example.org/päth",
            E::PathChar {
                ch: 'ä',
                offset: 22,
            },
        ),
        (&long_td_id, E::TrustDomainTooLong { len: 256 }),
        (
            &long_path_id,
            E::TooLong {
                len: long_path_id.len(),
            },
        ),
    ];
    for (input, want) in table {
        assert_eq!(SpiffeId::parse(input), Err(want.clone()), "{input:?}");
        // Every error renders to a message an operator can read.
        assert!(!want.to_string().is_empty());
    }
}

#[test]
fn limits_are_inclusive() {
    let td = "a".repeat(255);
    assert!(TrustDomain::parse(&td).is_ok());
    let prefix = format!("spiffe://{td}/");
    let id = format!("{prefix}{}", "b".repeat(MAX_ID_LEN - prefix.len()));
    assert_eq!(id.len(), MAX_ID_LEN);
    assert!(SpiffeId::parse(&id).is_ok());
}

#[test]
fn trust_domains_are_bare_names() {
    assert_eq!(
        TrustDomain::parse("example.org").map(|t| t.id()),
        Ok("spiffe://example.org".into())
    );
    assert_eq!(
        TrustDomain::parse(""),
        Err(SpiffeIdError::MissingTrustDomain)
    );
    assert!(TrustDomain::parse("spiffe://example.org").is_err());
    assert!(TrustDomain::parse("example.org/path").is_err());
    assert!("Example.org".parse::<TrustDomain>().is_err());
}

#[test]
fn new_checks_the_path() {
    let td = TrustDomain::parse("example.org").expect("valid trust domain");
    let id = SpiffeId::new(&td, "/ns/web").expect("valid path");
    assert_eq!(id.as_str(), "spiffe://example.org/ns/web");
    assert_eq!(
        id,
        SpiffeId::parse("spiffe://example.org/ns/web").expect("valid")
    );
    assert!(SpiffeId::new(&td, "").expect("root").is_root());
    assert_eq!(
        SpiffeId::new(&td, "ns"),
        Err(SpiffeIdError::PathWithoutSlash)
    );
    assert_eq!(
        SpiffeId::new(&td, "/ns/"),
        Err(SpiffeIdError::TrailingSlash)
    );
    assert!(matches!(
        SpiffeId::new(&td, "/a/.."),
        Err(SpiffeIdError::DotSegment { .. })
    ));
}

fn segment() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9._-]{1,12}".prop_filter("dot segments are invalid", |s| s != "." && s != "..")
}

proptest! {
    #[test]
    fn ids_from_valid_parts_round_trip(
        td in "[a-z0-9._-]{1,40}",
        segments in proptest::collection::vec(segment(), 0..6),
    ) {
        let path: String = segments.iter().map(|s| format!("/{s}")).collect();
        let text = format!("spiffe://{td}{path}");
        let id = SpiffeId::parse(&text).expect("built from valid parts");
        prop_assert_eq!(id.as_str(), text.as_str());
        prop_assert_eq!(id.trust_domain().as_str(), td.as_str());
        prop_assert_eq!(id.path(), path.as_str());
        prop_assert_eq!(id.to_string().parse::<SpiffeId>().expect("round trip"), id.clone());
        let td = TrustDomain::parse(&td).expect("valid");
        prop_assert_eq!(SpiffeId::new(&td, &path).expect("valid"), id);
    }

    #[test]
    fn a_char_outside_the_path_alphabet_is_rejected(
        before in segment(),
        after in "[a-zA-Z0-9._-]{0,8}",
        bad in any::<char>().prop_filter("outside the alphabet", |c| {
            !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/'))
        }),
    ) {
        let text = format!("spiffe://example.org/{before}{bad}{after}");
        prop_assert!(SpiffeId::parse(&text).is_err());
    }

    #[test]
    fn a_char_outside_the_trust_domain_alphabet_is_rejected(
        before in "[a-z0-9._-]{0,8}",
        after in "[a-z0-9._-]{0,8}",
        bad in any::<char>().prop_filter("outside the alphabet", |c| {
            !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '_' | '/'))
        }),
    ) {
        let text = format!("spiffe://{before}{bad}{after}/p");
        prop_assert!(SpiffeId::parse(&text).is_err());
        let td = format!("{before}{bad}{after}");
        prop_assert!(TrustDomain::parse(&td).is_err());
    }

    #[test]
    fn parse_never_panics(input in ".{0,80}") {
        let _ = SpiffeId::parse(&input);
        let _ = TrustDomain::parse(&input);
    }
}
