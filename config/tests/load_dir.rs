//! Loading whole resource directories: fixtures under tests/fixtures, plus generated ones.

use std::path::{Path, PathBuf};

use meshca_config::{
    default_resources_yaml, load_dir, BackendKind, DataSource, LoadLimits, ResourceError, Resources,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn load_err(dir: &Path) -> Vec<ResourceError> {
    match load_dir(dir, &Default::default()) {
        Ok(resources) => panic!("expected errors, got {resources:#?}"),
        Err(errors) => errors,
    }
}

#[test]
fn good_directory_loads_and_ignores_other_files() {
    let dir = fixture("good");
    let resources = load_dir(&dir, &Default::default()).unwrap_or_else(|errors| {
        panic!(
            "fixture must load: {:#?}",
            errors.iter().map(ToString::to_string).collect::<Vec<_>>()
        )
    });
    assert_eq!(
        resources.meshes.keys().collect::<Vec<_>>(),
        ["default", "plain"]
    );
    assert_eq!(resources.mesh_identities.len(), 1);
    assert_eq!(resources.mesh_trusts.len(), 1);
    assert_eq!(resources.dataplanes.len(), 1);
    assert_eq!(resources.mesh_services.len(), 1);
    assert_eq!(resources.zone_egresses.len(), 1);

    let mtls = resources
        .mesh("default")
        .and_then(|m| m.mtls.as_ref())
        .expect("mtls");
    let Some(BackendKind::Provided { cert, key }) = mtls.enabled().map(|b| &b.kind) else {
        panic!("ca-2 is a provided backend: {mtls:?}");
    };
    // Relative paths are resolved against the resource file's directory.
    assert_eq!(cert, &DataSource::File(dir.join("ca.pem")));
    assert!(cert
        .read(1 << 20)
        .expect("fixture ca.pem")
        .starts_with(b"-----BEGIN CERTIFICATE-----"));
    assert_eq!(key, &DataSource::File("/etc/meshca/ca-key.pem".into()));

    let dp = resources.dataplane("default", "web-1").expect("web-1");
    assert_eq!(dp.source.file, dir.join("20-workloads.yml"));
    assert_eq!(dp.source.document, 3);
    let web = &resources.mesh_identities[0];
    assert!(web.matches(&dp.labels));
}

#[test]
fn every_error_of_every_file_is_reported() {
    let dir = fixture("bad");
    let rendered: Vec<String> = load_err(&dir).iter().map(ToString::to_string).collect();
    let a = dir.join("a.yaml").display().to_string();
    let b = dir.join("b.yaml").display().to_string();
    assert_eq!(rendered.len(), 4, "{rendered:#?}");
    assert!(
        rendered[0].starts_with(&format!(
            "{a}: Mesh/default: mtls.enabledBackends: unknown field `enabledBackends`"
        )),
        "{rendered:#?}"
    );
    assert_eq!(
        rendered[1],
        format!("{a}: Mesh/other: mtls.backends[0].conf.caCert.RSAbits: must be 2048, 3072 or 4096, got 1024")
    );
    assert_eq!(
        rendered[2],
        format!("{b}: Dataplane/default/web-1: networking.inbound[0].tags: every inbound needs a kuma.io/service tag naming its service")
    );
    assert_eq!(
        rendered[3],
        format!("{b}: MeshIdentity/missing/api: mesh: no Mesh named \"missing\" (defined: default, other)")
    );
}

#[test]
fn duplicates_across_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("a.yaml"), "type: Mesh\nname: m\n").expect("write");
    std::fs::write(dir.path().join("b.yml"), "type: Mesh\nname: m\n").expect("write");
    let errors = load_err(dir.path());
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].file, dir.path().join("b.yml"));
    assert!(
        errors[0].message.contains(&format!(
            "already defined in {} (document 1)",
            dir.path().join("a.yaml").display()
        )),
        "{}",
        errors[0]
    );
}

#[test]
fn empty_directory_and_the_default_resources() {
    let dir = tempfile::tempdir().expect("temp dir");
    assert_eq!(
        load_dir(dir.path(), &Default::default()),
        Ok(Resources::default())
    );
    std::fs::write(dir.path().join("default.yaml"), default_resources_yaml()).expect("write");
    let resources = load_dir(dir.path(), &Default::default()).expect("the default resources load");
    assert!(resources.mesh("default").is_some());
    assert_eq!(resources.identities_in("default").count(), 1);
}

#[test]
fn missing_directory_is_an_error() {
    let errors = load_err(Path::new("/nonexistent/meshca/resources"));
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0]
            .to_string()
            .starts_with("/nonexistent/meshca/resources: cannot read the resources directory"),
        "{}",
        errors[0]
    );
}

fn only_error(dir: &Path, limits: &LoadLimits) -> String {
    let errors = match load_dir(dir, limits) {
        Ok(resources) => panic!("expected an error, got {resources:#?}"),
        Err(errors) => errors,
    };
    assert_eq!(errors.len(), 1, "{errors:#?}");
    errors[0].to_string()
}

#[test]
fn hostile_files_are_refused_quickly_and_by_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Nested 50,000 deep: the YAML parser would take tens of seconds; the pre-scan refuses it.
    let deep = format!("{}{}", "{a: ".repeat(50_000), "}".repeat(50_000));
    std::fs::write(dir.path().join("deep.yaml"), &deep).expect("write");
    let started = std::time::Instant::now();
    let error = only_error(dir.path(), &LoadLimits::default());
    assert!(
        error.contains("deep.yaml") && error.contains("limits.yamlDepth"),
        "{error}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    std::fs::remove_file(dir.path().join("deep.yaml")).expect("remove");

    // Too large.
    std::fs::write(dir.path().join("big.yaml"), "# padding\n".repeat(200)).expect("write");
    let small = LoadLimits {
        file_bytes: 1000,
        ..LoadLimits::default()
    };
    let error = only_error(dir.path(), &small);
    assert!(
        error.contains("big.yaml") && error.contains("limits.resourceFileBytes"),
        "{error}"
    );
    std::fs::remove_file(dir.path().join("big.yaml")).expect("remove");

    // Too many files.
    for i in 0..3 {
        std::fs::write(dir.path().join(format!("{i}.yaml")), "").expect("write");
    }
    let few = LoadLimits {
        files: 2,
        ..LoadLimits::default()
    };
    let error = only_error(dir.path(), &few);
    assert!(error.contains("limits.resourceFiles"), "{error}");
    assert!(load_dir(dir.path(), &LoadLimits::default()).is_ok());

    // A FIFO: refused, never opened for a blocking read.
    let fifo = dir.path().join("pipe.yaml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let error = only_error(dir.path(), &LoadLimits::default());
    assert!(
        error.contains("pipe.yaml") && error.contains("not a regular file"),
        "{error}"
    );
}

#[test]
fn data_sources_are_bounded_and_regular() {
    let big = DataSource::Inline(vec![b'x'; 100]);
    let error = big.read(99).expect_err("over the limit");
    assert!(
        error.to_string().contains("limits.dataSourceBytes"),
        "{error}"
    );
    assert_eq!(big.read(100).expect("at the limit").len(), 100);
    let error = DataSource::File("/dev/zero".into())
        .read(1 << 20)
        .expect_err("a device is refused, not read until memory runs out");
    assert!(error.to_string().contains("/dev/zero"), "{error}");
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("key.pem");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let error = DataSource::File(fifo)
        .read(1 << 20)
        .expect_err("a FIFO is refused");
    assert!(error.to_string().contains("a FIFO"), "{error}");
}
