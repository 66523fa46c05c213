//! `meshca validate` and settings validation: exit codes, messages naming file/resource/field, and no side
//! effects on the data directory.

mod common;

use common::{Env, MESH_BUILTIN};

/// A MeshIdentity whose SPIFFE ID path uses a template variable that does not exist.
const IDENTITY_UNKNOWN_VARIABLE: &str = r#"
type: MeshIdentity
name: web-id
mesh: default
spec:
  selector: {dataplane: {matchLabels: {}}}
  spiffeID:
    trustDomain: "{{ .Mesh }}.mesh.local"
    path: "/workload/{{ .Foo }}"
  provider:
    type: Bundled
    bundled:
      autogenerate: {enabled: true}
"#;

/// A Mesh whose provided backend reads a certificate file that does not exist.
const MESH_PROVIDED_MISSING_FILE: &str = "
type: Mesh
name: other
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: ext
  backends:
    - name: ext
      type: provided
      conf:
        cert: {file: /nonexistent/meshca-test/ca.pem}
        key: {file: /nonexistent/meshca-test/ca-key.pem}
";

/// A Mesh whose enabledBackend names no defined backend.
const MESH_UNKNOWN_ENABLED_BACKEND: &str = "
type: Mesh
name: broken
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: ca-9
  backends:
    - name: ca-1
      type: builtin
";

fn dir_with(env: &Env, name: &str, files: &[(&str, &str)]) -> String {
    let dir = env.root().join(name);
    std::fs::create_dir(&dir).expect("the temp dir is writable");
    for (file, yaml) in files {
        std::fs::write(dir.join(file), yaml).expect("the temp dir is writable");
    }
    dir.to_str().expect("UTF-8").to_owned()
}

/// Validation must never touch the daemon's data directory (no keystore, no generated CA).
fn assert_no_keystore(env: &Env) {
    assert!(
        !env.keystore().exists(),
        "validate created a keystore at {}",
        env.keystore().display()
    );
}

fn errors_of(json: &serde_json::Value) -> Vec<serde_json::Value> {
    json["errors"]
        .as_array()
        .expect("`errors` is a list")
        .clone()
}

#[test]
fn validate_names_file_resource_and_field_of_every_error_in_two_bad_files() {
    let env = Env::new();
    // Same mesh for the identity: MeshIdentity/default/web-id needs Mesh default.
    let bad = dir_with(
        &env,
        "bad",
        &[
            (
                "identity.yaml",
                &format!("{MESH_BUILTIN}---{IDENTITY_UNKNOWN_VARIABLE}"),
            ),
            ("provided.yaml", MESH_PROVIDED_MISSING_FILE),
        ],
    );

    let run = env.cli(&["validate", "--config", env.cfg(), &bad]);
    assert_eq!(run.code(), Some(2), "{run}");
    let err = &run.stderr;
    for needle in [
        "identity.yaml",
        "MeshIdentity/default/web-id",
        "spec.spiffeID",
        ".Foo",
        "provided.yaml",
        "Mesh/other",
        "mtls.backends[0]",
        "/nonexistent/meshca-test/ca.pem",
    ] {
        assert!(err.contains(needle), "stderr lacks {needle:?}: {run}");
    }

    let json = env.cli(&["validate", "--config", env.cfg(), &bad, "--output", "json"]);
    assert_eq!(json.code(), Some(2), "{json}");
    let v = json.json();
    assert_eq!(v["valid"], false, "{json}");
    let errors = errors_of(&v);
    assert_eq!(errors.len(), 2, "one error per bad resource: {json}");
    let identity = errors
        .iter()
        .find(|e| e["resource"] == "MeshIdentity/default/web-id")
        .unwrap_or_else(|| panic!("no error for the MeshIdentity: {json}"));
    assert!(identity["file"]
        .as_str()
        .unwrap_or("")
        .ends_with("identity.yaml"));
    assert!(identity["field"]
        .as_str()
        .unwrap_or("")
        .contains("spiffeID"));
    assert!(identity["message"].as_str().unwrap_or("").contains(".Foo"));
    let provided = errors
        .iter()
        .find(|e| e["resource"] == "Mesh/other")
        .unwrap_or_else(|| panic!("no error for the provided backend: {json}"));
    assert!(provided["file"]
        .as_str()
        .unwrap_or("")
        .ends_with("provided.yaml"));
    assert_eq!(provided["field"], "mtls.backends[0]");

    assert_no_keystore(&env);
}

#[test]
fn validate_reports_enabled_backend_that_names_no_backend() {
    let env = Env::new();
    let bad = dir_with(&env, "bad", &[("mesh.yaml", MESH_UNKNOWN_ENABLED_BACKEND)]);

    let run = env.cli(&["validate", "--config", env.cfg(), &bad]);
    assert_eq!(run.code(), Some(2), "{run}");
    for needle in ["mesh.yaml", "Mesh/broken", "mtls.enabledBackend", "ca-9"] {
        assert!(
            run.stderr.contains(needle),
            "stderr lacks {needle:?}: {run}"
        );
    }

    let json = env.cli(&["validate", "--config", env.cfg(), &bad, "--output", "json"]);
    assert_eq!(json.code(), Some(2), "{json}");
    let v = json.json();
    assert_eq!(v["valid"], false);
    let errors = errors_of(&v);
    assert_eq!(errors.len(), 1, "{json}");
    assert_eq!(errors[0]["resource"], "Mesh/broken");
    assert_eq!(errors[0]["field"], "mtls.enabledBackend");
    assert_no_keystore(&env);
}

#[test]
fn validate_reports_structural_and_template_errors_of_different_files_together() {
    let env = Env::new();
    let bad = dir_with(
        &env,
        "bad",
        &[
            ("broken.yaml", MESH_UNKNOWN_ENABLED_BACKEND),
            (
                "identity.yaml",
                &format!("{MESH_BUILTIN}---{IDENTITY_UNKNOWN_VARIABLE}"),
            ),
        ],
    );
    let json = env.cli(&["validate", "--config", env.cfg(), &bad, "--output", "json"]);
    assert_eq!(json.code(), Some(2), "{json}");
    let resources: Vec<String> = errors_of(&json.json())
        .iter()
        .map(|e| e["resource"].as_str().unwrap_or("").to_owned())
        .collect();
    assert!(
        resources.iter().any(|r| r == "Mesh/broken"),
        "missing Mesh/broken: {json}"
    );
    assert!(
        resources.iter().any(|r| r == "MeshIdentity/default/web-id"),
        "`validate` must print every error, but the MeshIdentity's unknown variable is not reported: {json}"
    );
}

#[test]
fn validate_accepts_a_good_directory_without_creating_a_keystore() {
    let env = Env::new();
    let good = dir_with(
        &env,
        "good",
        &[
            ("mesh.yaml", MESH_BUILTIN),
            ("dataplanes.yaml", common::DATAPLANE_WEB_1),
        ],
    );
    let run = env.cli(&["validate", "--config", env.cfg(), &good]);
    assert_eq!(run.code(), Some(0), "{run}");
    assert!(run.stdout.contains("valid"), "{run}");

    let json = env.cli(&["validate", "--config", env.cfg(), &good, "--output", "json"]);
    assert_eq!(json.code(), Some(0), "{json}");
    let v = json.json();
    assert_eq!(v["valid"], true, "{json}");
    assert!(errors_of(&v).is_empty(), "{json}");
    assert_no_keystore(&env);
}

/// A MeshIdentity with an autogenerated CA whose MeshTrust meshca creates.
const IDENTITY_CREATING_TRUST: &str = "
type: MeshIdentity
name: web-id
mesh: default
spec:
  selector: {dataplane: {matchLabels: {app: web}}}
  provider:
    type: Bundled
    bundled: {meshTrustCreation: Enabled, autogenerate: {enabled: true}}
";

#[test]
fn validate_of_cas_to_generate_prints_the_verdict_and_no_daemon_log() {
    let env = Env::new();
    // Labelled as the identity's path needs, or the Dataplane's refusal would be warned of.
    let web_1 = common::DATAPLANE_WEB_1.replace(
        "labels: {app: web}",
        "labels: {app: web, kuma.io/workload: web-1}",
    );
    assert_ne!(web_1, common::DATAPLANE_WEB_1);
    let good = dir_with(
        &env,
        "good",
        &[
            ("mesh.yaml", MESH_BUILTIN),
            ("identity.yaml", IDENTITY_CREATING_TRUST),
            ("dataplanes.yaml", &web_1),
        ],
    );
    for output in ["human", "json"] {
        let run = env.cli(&["validate", "--config", env.cfg(), &good, "--output", output]);
        assert_eq!(run.code(), Some(0), "{run}");
        // A builtin backend and an autogenerated identity CA: nothing is generated that lasts, so
        // nothing says so, and no line of the daemon's log ("generated a new CA", "created the
        // MeshTrust") reaches the operator.
        for needle in ["INFO", "generated", "created"] {
            assert!(
                !run.stderr.contains(needle),
                "validate logs as the daemon does ({needle:?}): {run}"
            );
        }
        assert!(
            run.stderr.trim().is_empty(),
            "a valid directory prints only the verdict: {run}"
        );
    }
    let run = env.cli(&["validate", "--config", env.cfg(), &good]);
    assert!(run.stdout.starts_with("valid: settings and "), "{run}");
    assert_eq!(
        env.cli(&["validate", "--config", env.cfg(), &good, "--output", "json"])
            .json()["valid"],
        true
    );
    assert_no_keystore(&env);
}

#[test]
fn serve_with_an_unknown_settings_key_exits_2_and_names_the_key() {
    let env = Env::with_settings("bogusSetting: 1\n");
    let run = env.cli(&["serve", "--config", env.cfg()]);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(run.stderr.contains("bogusSetting"), "{run}");
    assert!(
        run.stderr.contains("meshca.yaml"),
        "the message names the file: {run}"
    );
    assert!(
        !env.data.exists(),
        "a rejected start must not create the data dir"
    );

    // A nested unknown key is named with its path.
    let nested = Env::with_settings("issuance: {keyAlgoritm: ecdsa-p256}\n");
    let run = nested.cli(&["serve", "--config", nested.cfg()]);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(run.stderr.contains("issuance.keyAlgoritm"), "{run}");
}

/// A MeshIdentity with five violations: an enum value, a template, exclusive fields, a data source and a
/// duration.
const IDENTITY_MANY_VIOLATIONS: &str = r#"
type: MeshIdentity
name: web-id
mesh: default
spec:
  selector: {dataplane: {matchLabels: {app: web}}}
  spiffeID:
    trustDomain: "{{ .Mesh }.mesh.local"
  provider:
    type: Bundled
    bundled:
      meshTrustCreation: Test
      certificateParameters: {expiry: 1fortnight}
      autogenerate: {enabled: true}
      ca:
        certificate: {type: File}
        privateKey: {type: File, file: {path: /k.pem}}
"#;

#[test]
fn validate_reports_every_violation_of_one_resource_each_with_its_field() {
    let env = Env::new();
    let bad = dir_with(
        &env,
        "bad",
        &[
            ("mesh.yaml", MESH_BUILTIN),
            ("identity.yaml", IDENTITY_MANY_VIOLATIONS),
        ],
    );
    let expected = [
        ("spec.spiffeID.trustDomain", "unclosed action"),
        (
            "spec.provider.bundled.meshTrustCreation",
            r#""Test" must be one of ["Enabled", "Disabled"]"#,
        ),
        (
            "spec.provider.bundled.certificateParameters.expiry",
            "1fortnight",
        ),
        (
            "spec.provider.bundled.ca",
            "shouldn't be defined once using autogenerated",
        ),
        (
            "spec.provider.bundled.ca.certificate.file",
            "required when type is File",
        ),
    ];

    let run = env.cli(&["validate", "--config", env.cfg(), &bad]);
    assert_eq!(run.code(), Some(2), "{run}");
    for (field, message) in expected {
        let line = format!("identity.yaml: MeshIdentity/default/web-id: {field}: ");
        assert!(
            run.stderr
                .lines()
                .any(|l| l.contains(&line) && l.contains(message)),
            "stderr lacks {line}...{message}: {run}"
        );
    }
    assert!(
        run.stderr.contains("5 error(s); nothing would be applied"),
        "{run}"
    );

    let json = env.cli(&["validate", "--config", env.cfg(), &bad, "--output", "json"]);
    assert_eq!(json.code(), Some(2), "{json}");
    let found: Vec<(String, String)> = errors_of(&json.json())
        .iter()
        .map(|e| {
            assert_eq!(e["resource"], "MeshIdentity/default/web-id", "{e}");
            (
                e["field"].as_str().unwrap_or("").to_owned(),
                e["message"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        found.iter().map(|(f, _)| f.as_str()).collect::<Vec<_>>(),
        expected.map(|(f, _)| f),
        "{json}"
    );
    assert_no_keystore(&env);
}

#[test]
fn validate_of_a_missing_resources_directory_says_what_serve_would_do() {
    let env = Env::new();
    let missing = env.root().join("no-resources-yet");
    let run = env.cli(&[
        "validate",
        "--config",
        env.cfg(),
        missing.to_str().expect("UTF-8"),
    ]);
    assert_eq!(run.code(), Some(2), "{run}");
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains("no-resources-yet"))
        .unwrap_or_else(|| panic!("the directory is named: {run}"));
    assert!(
        line.contains(": cannot read the resources directory")
            && line.contains("`meshca serve` creates it"),
        "{line}"
    );
    assert!(!line.contains(": :"), "no empty resource or field: {line}");
}

/// What the operator wrote that meshca ignores is valid, and `validate` says so in its own report (the
/// JSON's `warnings`, or `warning:` lines), never as log lines: an unknown `MESHCA_*` variable, and the
/// identities of a MeshService of this zone, which meshca computes itself.
#[test]
fn validate_reports_what_it_ignores_as_warnings_of_its_own() {
    let env = Env::new();
    let service = "type: MeshService\nname: web\nmesh: default\nspec:\n  selector: {dataplaneTags: {kuma.io/service: web}}\n  ports: [{port: 80, targetPort: 8080}]\n  identities: [{type: SpiffeID, value: \"spiffe://stale.example/listed\"}]\n";
    let dir = dir_with(
        &env,
        "with-ignored",
        &[
            ("mesh.yaml", MESH_BUILTIN),
            ("dataplanes.yaml", common::DATAPLANE_WEB_1),
            ("service.yaml", service),
        ],
    );
    let args = ["validate", "--config", env.cfg(), &dir, "--output", "json"];
    let mut cmd = env.command(&args);
    cmd.env("MESHCA_NOT_A_SETTING", "1");
    let run = env.cli_with(cmd, &args);
    assert_eq!(run.code(), Some(0), "{run}");
    let report = run.json();
    assert_eq!(report["valid"], true, "{run}");
    let warnings = report["warnings"].as_array().expect("a warnings list");
    let fields: Vec<(&str, &str)> = warnings
        .iter()
        .map(|w| {
            (
                w["resource"].as_str().expect("a resource"),
                w["field"].as_str().expect("a field"),
            )
        })
        .collect();
    assert_eq!(
        fields,
        [
            ("settings", "MESHCA_NOT_A_SETTING"),
            ("MeshService/default/web", "spec.identities"),
        ],
        "{run}"
    );
    assert!(
        warnings[1]["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("service.yaml")),
        "{run}"
    );
    assert!(
        run.stderr.trim().is_empty(),
        "warnings are in the report, not log lines: {run}"
    );
    let mut cmd = env.command(&["validate", "--config", env.cfg(), &dir]);
    cmd.env("MESHCA_NOT_A_SETTING", "1");
    let human = env.cli_with(cmd, &["validate"]);
    assert_eq!(human.code(), Some(0), "{human}");
    assert!(
        human.stderr.contains(
            "warning: (environment): settings: MESHCA_NOT_A_SETTING: not a meshca setting"
        ),
        "{human}"
    );
    assert!(!human.stderr.contains(" WARN "), "no log line: {human}");
}

#[test]
fn validate_notes_a_mesh_that_means_more_to_meshca_than_to_kuma() {
    let env = Env::new();
    let rotating = "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: ca-2\n  secondaryBackends: [ca-1]\n  backends:\n    - {name: ca-1, type: builtin}\n    - {name: ca-2, type: builtin}\n";
    let one = "type: Mesh\nname: other\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: ca-1\n  backends:\n    - {name: ca-1, type: builtin}\n";
    let dir = dir_with(
        &env,
        "meshes",
        &[("default.yaml", rotating), ("other.yaml", one)],
    );
    let run = env.cli(&["validate", "--config", env.cfg(), &dir, "--output", "json"]);
    assert_eq!(run.code(), Some(0), "valid: {run}");
    let v = run.json();
    let notes = v["notes"].as_array().expect("notes");
    assert_eq!(notes.len(), 1, "only the Mesh with two backends: {v}");
    assert_eq!(notes[0]["resource"], "Mesh/default");
    assert_eq!(notes[0]["field"], "mtls.secondaryBackends");
    assert!(
        notes[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("Kuma 2.14 allows one backend per Mesh")),
        "{v}"
    );
    let human = env.cli(&["validate", "--config", env.cfg(), &dir]);
    assert!(
        human.stderr.contains("note: ") && human.stderr.contains("Mesh/default"),
        "{human}"
    );
}
