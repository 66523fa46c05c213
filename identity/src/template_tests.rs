use super::*;
use crate::identity_template::{IdentityError, IdentityTemplate};
use crate::SpiffeIdError;
use proptest::prelude::*;

fn labels(pairs: &[(&str, &str)]) -> LabelMap {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn render(template: &str, labels: &LabelMap) -> Result<String, TemplateError> {
    let vars = TemplateVars {
        mesh: "default",
        zone: "zone-1",
        labels,
    };
    Template::parse(template)?.render(&vars)
}

#[test]
fn renders_every_variable_and_label() {
    let l = labels(&[
        (NAMESPACE_LABEL, "shop"),
        (SERVICE_ACCOUNT_LABEL, "web-sa"),
        (WORKLOAD_LABEL, "web"),
        ("app", "frontend"),
        ("a\"b", "quoted"),
    ]);
    let cases = [
        ("{{ .Mesh }}", "default"),
        ("{{.Zone}}", "zone-1"),
        ("{{   .Namespace\t}}", "shop"),
        ("/sa/{{ .ServiceAccount }}", "/sa/web-sa"),
        ("/workload/{{ .Workload }}", "/workload/web"),
        ("/{{ label \"app\" }}/x", "/frontend/x"),
        ("/{{label `app`}}", "/frontend"),
        ("{{ label \"a\\\"b\" }}", "quoted"),
        (
            "{{ .Mesh }}.{{ .Zone }}.mesh.local",
            "default.zone-1.mesh.local",
        ),
        ("plain text } }} {", "plain text } }} {"),
        ("", ""),
    ];
    for (template, want) in cases {
        assert_eq!(render(template, &l).as_deref(), Ok(want), "{template}");
    }
}

#[test]
fn parse_errors_carry_the_offset() {
    let cases: Vec<(&str, TemplateError)> = vec![
        (
            "a{{ .Cluster }}",
            TemplateError::UnknownVariable {
                name: "Cluster".into(),
                offset: 4,
            },
        ),
        (
            "{{ .mesh }}",
            TemplateError::UnknownVariable {
                name: "mesh".into(),
                offset: 3,
            },
        ),
        (
            "{{ env \"X\" }}",
            TemplateError::UnknownFunction {
                name: "env".into(),
                offset: 3,
            },
        ),
        (
            "{{ Mesh }}",
            TemplateError::UnknownFunction {
                name: "Mesh".into(),
                offset: 3,
            },
        ),
        ("/x/{{ .Mesh", TemplateError::Unclosed { offset: 3 }),
        ("ok {{", TemplateError::Unclosed { offset: 3 }),
        ("{{ }}", TemplateError::EmptyAction { offset: 0 }),
        (
            "{{ .Mesh .Zone }}",
            TemplateError::UnexpectedText { offset: 9 },
        ),
        (
            "{{ label \"a\" \"b\" }}",
            TemplateError::UnexpectedText { offset: 13 },
        ),
    ];
    for (template, want) in cases {
        assert_eq!(Template::parse(template), Err(want), "{template}");
    }
    for bad in [
        "{{ label app }}",
        "{{ label \"app }}",
        "{{ label }}",
        "{{ label \"a\\n\" }}",
        "{{ label `x }}",
    ] {
        assert!(
            matches!(Template::parse(bad), Err(TemplateError::BadQuoting { .. })),
            "{bad}: {:?}",
            Template::parse(bad)
        );
    }
}

#[test]
fn missing_label_is_named() {
    let err = render("/workload/{{ .Workload }}", &labels(&[])).expect_err("label is missing");
    assert_eq!(
        err,
        TemplateError::MissingLabel {
            label: WORKLOAD_LABEL.into()
        }
    );
    assert!(err.to_string().contains("kuma.io/workload"));
    let err = render("{{ label \"team\" }}", &labels(&[])).expect_err("label is missing");
    assert!(err.to_string().contains("\"team\""));
}

#[test]
fn uses_labels_sees_every_label_reader() {
    for (t, uses) in [
        ("{{ .Mesh }}.{{ .Zone }}", false),
        ("literal", false),
        ("{{ .Namespace }}", true),
        ("{{ .ServiceAccount }}", true),
        ("{{ .Workload }}", true),
        ("{{ label \"x\" }}", true),
    ] {
        assert_eq!(
            Template::parse(t).expect("valid").uses_labels(),
            uses,
            "{t}"
        );
    }
}

#[test]
fn identity_defaults_render_the_documented_id() {
    let l = labels(&[(WORKLOAD_LABEL, "web")]);
    let vars = TemplateVars {
        mesh: "default",
        zone: "zone-1",
        labels: &l,
    };
    let id = IdentityTemplate::parse(None, None)
        .expect("defaults parse")
        .render(&vars)
        .expect("renders");
    assert_eq!(
        id.as_str(),
        "spiffe://default.zone-1.mesh.local/workload/web"
    );
}

#[test]
fn identity_errors_quote_the_rendered_string() {
    let l = labels(&[(WORKLOAD_LABEL, "Web Server"), (NAMESPACE_LABEL, "ns")]);
    let vars = TemplateVars {
        mesh: "Default",
        zone: "zone-1",
        labels: &l,
    };

    // Nothing is lowercased: an uppercase mesh name gives an invalid trust domain.
    let err = IdentityTemplate::parse(None, Some("/ns/{{ .Namespace }}"))
        .expect("parses")
        .render(&vars)
        .expect_err("uppercase trust domain");
    assert!(
        matches!(err, IdentityError::InvalidTrustDomain { ref rendered, source: SpiffeIdError::UppercaseTrustDomain { .. } } if rendered == "Default.zone-1.mesh.local"),
        "{err:?}"
    );
    assert!(err.to_string().contains("\"Default.zone-1.mesh.local\""));

    let vars = TemplateVars {
        mesh: "default",
        ..vars
    };
    let err = IdentityTemplate::parse(Some("td"), None)
        .expect("parses")
        .render(&vars)
        .expect_err("space");
    assert!(
        matches!(err, IdentityError::InvalidId { ref rendered, source: SpiffeIdError::PathChar { ch: ' ', .. } } if rendered == "spiffe://td/workload/Web Server"),
        "{err:?}"
    );

    let err = IdentityTemplate::parse(Some("td"), Some(""))
        .expect("parses")
        .render(&vars)
        .expect_err("root");
    assert_eq!(
        err,
        IdentityError::RootId {
            rendered: "spiffe://td".into()
        }
    );

    let err = IdentityTemplate::parse(Some("td"), Some("ns"))
        .expect("parses")
        .render(&vars)
        .expect_err("no slash");
    assert!(matches!(
        err,
        IdentityError::InvalidId {
            source: SpiffeIdError::PathWithoutSlash,
            ..
        }
    ));

    assert_eq!(
        IdentityTemplate::parse(Some("{{ .Namespace }}.local"), None),
        Err(IdentityError::TrustDomainUsesLabels)
    );
    assert!(matches!(
        IdentityTemplate::parse(None, Some("{{ .Nope }}")),
        Err(IdentityError::PathTemplate(
            TemplateError::UnknownVariable { .. }
        ))
    ));
}

proptest! {
    #[test]
    fn parse_never_panics(input in ".{0,64}") {
        let _ = Template::parse(&input);
    }

    #[test]
    fn parse_never_panics_on_template_like_input(
        parts in proptest::collection::vec(
            prop_oneof![
                Just("{{".to_string()), Just("}}".to_string()), Just("\"".to_string()),
                Just("`".to_string()), Just("\\".to_string()), Just(" label ".to_string()),
                Just(".Mesh".to_string()), "[a-zé ]{0,3}",
            ],
            0..12,
        )
    ) {
        let input: String = parts.concat();
        if let Ok(t) = Template::parse(&input) {
            let l = LabelMap::new();
            let _ = t.render(&TemplateVars { mesh: "m", zone: "z", labels: &l });
        }
    }

    #[test]
    fn literal_templates_render_to_themselves(input in ".{0,64}") {
        prop_assume!(!input.contains("{{"));
        let l = LabelMap::new();
        let t = Template::parse(&input).expect("a literal always parses");
        prop_assert!(!t.uses_labels());
        prop_assert_eq!(t.render(&TemplateVars { mesh: "m", zone: "z", labels: &l }).expect("renders"), input);
    }
}

#[test]
fn reads_label_sees_the_workload_however_it_is_written() {
    for (t, reads) in [
        ("/workload/{{ .Workload }}", true),
        ("/w/{{.Workload}}", true),
        ("/w/{{ label \"kuma.io/workload\" }}", true),
        ("/w/{{ label `kuma.io/workload` }}", true),
        ("/ns/{{ .Namespace }}/sa/{{ .ServiceAccount }}", false),
        ("/w/{{ label \"kuma.io/workloads\" }}", false),
        ("/workload/static", false),
    ] {
        assert_eq!(
            Template::parse(t)
                .expect("valid")
                .reads_label(WORKLOAD_LABEL),
            reads,
            "{t}"
        );
    }
}
