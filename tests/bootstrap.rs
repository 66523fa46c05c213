//! `meshca bootstrap`: the Envoy bootstrap for a token's proxy, and clear refusals of bad input. (Envoy
//! itself validates and runs these bootstraps in tests/interop/test_envoy.py.)

mod common;

use common::Env;

fn bootstrap(env: &Env, args: &[&str]) -> common::Run {
    let mut all = vec!["bootstrap", "--config", env.cfg()];
    all.extend_from_slice(args);
    env.cli(&all)
}

#[test]
fn a_bootstrap_names_the_tokens_proxy_and_takes_every_secret_from_meshca() {
    let env = Env::new();
    let token = env.token("default", "web-1", &["--tag", "kuma.io/service=web"]);
    let file = token.file.to_str().expect("UTF-8");
    let run = bootstrap(
        &env,
        &[
            "--token-file",
            file,
            "--admin-port",
            "19901",
            "--inbound",
            "15006:8080",
            "--outbound",
            "15001=api.internal:15006@spiffe://default/api",
        ],
    )
    .ok();
    let yaml = &run.stdout;
    assert!(
        yaml.contains("id: default.web-1") && yaml.contains("cluster: web"),
        "{yaml}"
    );
    let socket = env.data.join("sds.sock");
    assert!(
        yaml.contains(&format!("path: {}", socket.display())),
        "the unix socket of the settings, absolute:\n{yaml}"
    );
    assert!(yaml.contains("port_value: 19901"), "{yaml}");
    assert_eq!(
        yaml.matches(&format!("Bearer {}", token.token)).count(),
        4,
        "{yaml}"
    );
    assert!(yaml.contains("require_client_certificate: true"), "{yaml}");
    assert!(yaml.contains("exact: spiffe://default/api"), "{yaml}");
}

#[test]
fn bad_input_exits_2_naming_what_to_fix() {
    let env = Env::new();
    let garbage = env.root().join("garbage.token");
    std::fs::write(&garbage, "not a token").expect("writable");
    let run = bootstrap(&env, &["--token-file", garbage.to_str().expect("UTF-8")]);
    assert_eq!(run.code(), Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("garbage.token") && run.stderr.contains("not a meshca token"),
        "{}",
        run.stderr
    );

    let token = env.token("default", "web-1", &[]);
    let file = token.file.to_str().expect("UTF-8");
    let missing_ca = env.root().join("nowhere.pem");
    let run = bootstrap(
        &env,
        &[
            "--token-file",
            file,
            "--server",
            "127.0.0.1:5678",
            "--sds-ca",
            missing_ca.to_str().expect("UTF-8"),
        ],
    );
    assert_eq!(run.code(), Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("--sds-ca") && run.stderr.contains("nowhere.pem"),
        "{}",
        run.stderr
    );

    let run = bootstrap(&env, &["--token-file", file, "--server", "nowhere"]);
    assert_eq!(run.code(), Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("expected unix:///path or host:port"),
        "{}",
        run.stderr
    );

    for (flag, value, expected) in [
        ("--inbound", "8080", "PORT:APP_PORT"),
        ("--outbound", "15001=api:80@web", "SPIFFE_ID"),
    ] {
        let run = bootstrap(&env, &["--token-file", file, flag, value]);
        assert_eq!(run.code(), Some(2), "{}", run.stderr);
        assert!(
            run.stderr.contains(expected),
            "{flag} {value}: {}",
            run.stderr
        );
    }
}

#[test]
fn listeners_envoy_could_not_all_bind_exit_2_naming_the_flags() {
    let env = Env::new();
    let token = env.token("default", "web-1", &[]);
    let file = token.file.to_str().expect("UTF-8");
    for (flags, named) in [
        (
            &["--outbound", "15001=api:80", "--outbound", "15001=db:5432"][..],
            &["--outbound 15001=api:80", "--outbound 15001=db:5432"][..],
        ),
        (
            &["--admin-port", "9901", "--inbound", "9901:8080"],
            &["--admin-port 9901", "--inbound 9901:8080"],
        ),
        (
            &["--inbound", "8080:80", "--outbound", "8080=api:80"],
            &["--inbound 8080:80", "--outbound 8080=api:80"],
        ),
    ] {
        let mut args = vec!["--token-file", file];
        args.extend_from_slice(flags);
        let run = bootstrap(&env, &args);
        assert_eq!(run.code(), Some(2), "{flags:?}: {run}");
        assert!(
            named.iter().all(|flag| run.stderr.contains(flag)),
            "{flags:?}: names both flags: {run}"
        );
        assert!(run.stdout.is_empty(), "nothing printed: {run}");
    }
}
