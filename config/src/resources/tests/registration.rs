use std::time::Duration;

use super::*;

const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// A registration document with `spec` as given (a flow mapping's inside or block lines).
fn registration(spec: &str) -> String {
    format!("type: WorkloadRegistration\nmesh: default\nname: billing-batch\nspec:\n{spec}")
}

const VALID_SPEC: &str =
    "  dataplane: billing-1\n  selectors: [unix:uid:1001, unix:path:/usr/local/bin/billing]\n";

#[test]
fn valid_registration_with_every_field() {
    let Resource::WorkloadRegistration(r) = one(&format!(
        r#"
type: WorkloadRegistration
mesh: default
name: billing-batch
labels: {{team: billing}}
spec:
  dataplane: billing-1
  selectors:
    - unix:uid:1001
    - unix:user:billing
    - unix:gid:1002
    - unix:group:billing
    - unix:supplementary_gid:27
    - unix:supplementary_group:docker
    - unix:path:/usr/local/bin/billing
    - unix:sha256:{SHA}
    - systemd:unit:billing.service
  agent: host-1
  hint: billing
  jwtSvid: {{expiry: 10m}}
"#
    )) else {
        panic!("expected a WorkloadRegistration");
    };
    assert_eq!(r.name, "billing-batch");
    assert_eq!(r.mesh, "default");
    assert_eq!(r.labels.get("team").map(String::as_str), Some("billing"));
    assert_eq!(r.dataplane, "billing-1");
    let selectors: Vec<String> = r.selectors.iter().map(ToString::to_string).collect();
    assert_eq!(
        selectors,
        [
            "unix:uid:1001",
            "unix:user:billing",
            "unix:gid:1002",
            "unix:group:billing",
            "unix:supplementary_gid:27",
            "unix:supplementary_group:docker",
            "unix:path:/usr/local/bin/billing",
            &format!("unix:sha256:{SHA}"),
            "systemd:unit:billing.service",
        ]
    );
    assert_eq!(r.agent.as_deref(), Some("host-1"));
    assert_eq!(r.hint.as_deref(), Some("billing"));
    assert_eq!(r.jwt_svid_expiry, Duration::from_secs(600));
    assert_eq!(r.source.document, 1);
    assert_eq!(
        Resource::WorkloadRegistration(r).id(),
        "WorkloadRegistration/default/billing-batch"
    );
}

#[test]
fn optional_fields_default() {
    let Resource::WorkloadRegistration(r) = one(&registration(VALID_SPEC)) else {
        panic!("expected a WorkloadRegistration");
    };
    assert_eq!(r.agent, None);
    assert_eq!(r.hint, None);
    assert_eq!(r.jwt_svid_expiry, Duration::from_secs(300));
    assert_eq!(r.jwt_svid_expiry, crate::DEFAULT_JWT_SVID_EXPIRY);
    let Resource::WorkloadRegistration(r) =
        one(&registration(&format!("{VALID_SPEC}  jwtSvid: {{}}\n")))
    else {
        panic!("expected a WorkloadRegistration");
    };
    assert_eq!(r.jwt_svid_expiry, Duration::from_secs(300));
}

/// The single error of a registration with `spec`; it names the file and the resource.
#[track_caller]
fn spec_error(spec: &str, field: &str, message: &str) {
    let e = one_error(&registration(spec));
    assert_error(&e, field, message);
    assert_eq!(e.file, Path::new(FILE), "{e}");
    assert_eq!(
        e.resource.as_deref(),
        Some("WorkloadRegistration/default/billing-batch"),
        "{e}"
    );
}

#[test]
fn dataplane_is_required_and_a_name() {
    spec_error("  selectors: [unix:uid:1]\n", "spec.dataplane", "required");
    spec_error(
        "  dataplane: Billing_1\n  selectors: [unix:uid:1]\n",
        "spec.dataplane",
        "not a valid name",
    );
}

#[test]
fn selectors_are_required_non_empty_and_valid() {
    spec_error("  dataplane: d\n", "spec.selectors", "required");
    spec_error(
        "  dataplane: d\n  selectors: []\n",
        "spec.selectors",
        "at least one selector is required",
    );
    for (selector, message) in [
        (
            format!("unix:sha256:{}", SHA.to_uppercase()),
            "lowercase".to_owned(),
        ),
        (
            "unix:sha256:abc".to_owned(),
            "64 lowercase hex digits".to_owned(),
        ),
        (
            "unix:path:bin/billing".to_owned(),
            "absolute path".to_owned(),
        ),
        (
            "k8s:ns:default".to_owned(),
            "unknown selector kind \"k8s:ns\"; accepted: unix:uid:N".to_owned(),
        ),
        ("unix:uid:x".to_owned(), "decimal number".to_owned()),
        ("'unix:user:a b'".to_owned(), "whitespace".to_owned()),
        ("systemd:unit:billing".to_owned(), "NAME.service".to_owned()),
        ("uid".to_owned(), "expected TYPE:KIND:VALUE".to_owned()),
    ] {
        spec_error(
            &format!("  dataplane: d\n  selectors: [unix:uid:1, {selector}]\n"),
            "spec.selectors[1]",
            &message,
        );
    }
}

#[test]
fn a_repeated_selector_is_refused() {
    spec_error(
        "  dataplane: d\n  selectors: [unix:uid:1, unix:gid:2, unix:uid:1]\n",
        "spec.selectors[2]",
        "unix:uid:1 is listed twice (also spec.selectors[0])",
    );
}

#[test]
fn every_bad_field_is_reported() {
    let errors = errors(&registration(
        "  selectors: [unix:uid:01, unix:path:x]\n  agent: Host\n  hint: ''\n  jwtSvid: {expiry: 0s}\n",
    ));
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.dataplane",
            "spec.selectors[0]",
            "spec.selectors[1]",
            "spec.agent",
            "spec.hint",
            "spec.jwtSvid.expiry",
        ],
        "{errors:#?}"
    );
}

#[test]
fn expiry_is_a_duration_up_to_a_day() {
    for (expiry, message) in [
        ("0s", "must be greater than zero"),
        ("25h", "longer than a day"),
        ("2d", "longer than a day"),
        ("soon", "invalid duration"),
        ("-5m", "cannot be negative"),
    ] {
        spec_error(
            &format!("{VALID_SPEC}  jwtSvid: {{expiry: {expiry}}}\n"),
            "spec.jwtSvid.expiry",
            message,
        );
    }
    for (expiry, secs) in [
        ("24h", 86_400),
        ("1d", 86_400),
        ("1h30m", 5400),
        ("30s", 30),
    ] {
        let Resource::WorkloadRegistration(r) = one(&registration(&format!(
            "{VALID_SPEC}  jwtSvid: {{expiry: {expiry}}}\n"
        ))) else {
            panic!("expected a WorkloadRegistration");
        };
        assert_eq!(r.jwt_svid_expiry, Duration::from_secs(secs), "{expiry}");
    }
}

#[test]
fn hint_is_short_printable_and_not_empty() {
    spec_error(
        &format!("{VALID_SPEC}  hint: ''\n"),
        "spec.hint",
        "must not be empty",
    );
    spec_error(
        &format!("{VALID_SPEC}  hint: {}\n", "h".repeat(1025)),
        "spec.hint",
        "is 1025 bytes long; at most 1024",
    );
    spec_error(
        &format!("{VALID_SPEC}  hint: \"a\\u0007b\"\n"),
        "spec.hint",
        "control character",
    );
    let Resource::WorkloadRegistration(r) = one(&registration(&format!(
        "{VALID_SPEC}  hint: {}\n",
        "h".repeat(1024)
    ))) else {
        panic!("expected a WorkloadRegistration");
    };
    assert_eq!(r.hint.map(|h| h.len()), Some(1024));
}

#[test]
fn agent_is_a_name() {
    spec_error(
        &format!("{VALID_SPEC}  agent: host_1\n"),
        "spec.agent",
        "not a valid name",
    );
    spec_error(
        &format!("{VALID_SPEC}  agent: ''\n"),
        "spec.agent",
        "must not be empty",
    );
}

#[test]
fn unknown_fields_are_refused() {
    spec_error(
        &format!("{VALID_SPEC}  selector: [unix:uid:1]\n"),
        "spec.selector",
        "unknown field `selector`",
    );
    spec_error(
        &format!("{VALID_SPEC}  jwtSvid: {{expiry: 5m, ttl: 5m}}\n"),
        "spec.jwtSvid.ttl",
        "unknown field `ttl`",
    );
    let e = one_error(
        "type: WorkloadRegistration\nmesh: default\nname: r\nspec: {dataplane: d, selectors: [unix:uid:1]}\nextra: 1\n",
    );
    assert_error(&e, "extra", "unknown field `extra`");
    let e = one_error("type: WorkloadRegistration\nmesh: default\nname: r\n");
    assert_error(&e, "", "missing field `spec`");
    assert_eq!(
        e.resource.as_deref(),
        Some("WorkloadRegistration/default/r")
    );
}

#[test]
fn mesh_is_required() {
    let e = one_error(
        "type: WorkloadRegistration\nname: r\nspec: {dataplane: d, selectors: [unix:uid:1]}\n",
    );
    assert_error(
        &e,
        "mesh",
        "required: the name of the Mesh this WorkloadRegistration belongs to",
    );
}
