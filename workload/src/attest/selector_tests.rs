use proptest::prelude::*;

use super::*;

fn parsed(text: &str) -> Selector {
    parse_selector(text).unwrap_or_else(|error| panic!("{text:?} should parse: {error}"))
}

#[test]
fn what_attestation_makes_is_what_an_operator_writes() {
    let digest = [0xab; 32];
    let made = [
        (uid(1001), "unix:uid:1001"),
        (gid(0), "unix:gid:0"),
        (supplementary_gid(27), "unix:supplementary_gid:27"),
        (user("billing"), "unix:user:billing"),
        (group("staff"), "unix:group:staff"),
        (supplementary_group("sudo"), "unix:supplementary_group:sudo"),
        (
            path("/usr/local/bin/billing"),
            "unix:path:/usr/local/bin/billing",
        ),
        (sha256(digest), &*format!("unix:sha256:{}", "ab".repeat(32))),
        (
            systemd_unit("getty@tty1.service"),
            "systemd:unit:getty@tty1.service",
        ),
    ];
    for (selector, text) in made {
        let selector = selector.unwrap_or_else(|| panic!("{text} is made"));
        assert_eq!(selector.to_string(), text);
        assert_eq!(selector, parsed(text));
    }
}

#[test]
fn values_a_registration_cannot_name_give_no_selector() {
    assert_eq!(user("domain users"), None, "whitespace");
    assert_eq!(group(""), None);
    assert_eq!(path("relative/bin"), None);
    assert_eq!(path("/usr//bin/x"), None, "not canonical");
    assert_eq!(systemd_unit("session-3.scope"), None);
}

#[test]
fn a_registration_matches_when_the_caller_has_all_its_selectors() {
    let caller: Selectors = ["unix:uid:1001", "unix:gid:1001", "unix:path:/usr/bin/app"]
        .into_iter()
        .map(parsed)
        .collect();
    assert!(caller.contains_all(&[parsed("unix:uid:1001")]));
    assert!(caller.contains_all(&[parsed("unix:uid:1001"), parsed("unix:path:/usr/bin/app")]));
    assert!(!caller.contains_all(&[parsed("unix:uid:1001"), parsed("unix:gid:0")]));
    assert!(!caller.contains_all(&[parsed("unix:uid:100")]));
}

proptest! {
    #[test]
    fn made_ids_round_trip(id in any::<u32>()) {
        for selector in [uid(id), gid(id), supplementary_gid(id)] {
            let selector = selector.expect("every id is a selector");
            prop_assert_eq!(parsed(&selector.to_string()), selector);
        }
    }

    #[test]
    fn made_names_and_paths_parse_back_or_are_not_made(text in any::<String>()) {
        for selector in [user(&text), group(&text), path(&text), systemd_unit(&text)].into_iter().flatten() {
            prop_assert_eq!(parsed(&selector.to_string()), selector);
        }
    }
}
