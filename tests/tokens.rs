//! Proxy tokens: `meshca token` says when a token expires; against a running daemon, labels fixed in a token
//! cannot contradict the Dataplane file, and a revoked token stops working (fetches and open streams).

mod common;

use common::{pem_certs, uri_sans, wait_for, Env, DATAPLANE_WEB_1, MESH_BUILTIN};

fn env_with_web_1() -> Env {
    let env = Env::new();
    env.write_resource("mesh.yaml", MESH_BUILTIN);
    env.write_resource("dataplanes.yaml", DATAPLANE_WEB_1);
    env
}

fn assert_permission_denied(run: &common::Run) {
    assert_ne!(run.code(), Some(0), "{run}");
    assert!(
        run.stderr.contains("PermissionDenied") || run.stderr.contains("permission"),
        "{run}"
    );
    assert!(
        !run.stdout.contains("BEGIN CERTIFICATE"),
        "a refused proxy got a certificate: {run}"
    );
}

#[test]
fn minted_token_says_its_expiry_as_a_utc_date_and_the_time_left() {
    let env = Env::new();
    let valid_for = std::time::Duration::from_secs(2 * 86_400 + 12 * 3600);
    let before = std::time::SystemTime::now() + valid_for;
    let run = env
        .cli(&[
            "token",
            "--config",
            env.cfg(),
            "--mesh",
            "default",
            "--name",
            "web-1",
            "--valid-for",
            "2d12h",
        ])
        .ok();
    let after = std::time::SystemTime::now() + valid_for;
    assert!(!run.stderr.contains("unix time"), "{run}");
    let until = run
        .stderr
        .split_once("valid until ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no expiry in the output: {run}"));
    // RFC 3339 in UTC with whole seconds sorts as text: the expiry lies between the two clock reads.
    let (earliest, latest) = (
        meshca_control::rfc3339(before),
        meshca_control::rfc3339(after),
    );
    assert!(
        until.ends_with('Z') && earliest.as_str() <= until && until <= latest.as_str(),
        "expiry {until:?} is not between {earliest} and {latest}: {run}"
    );
    assert!(
        run.stderr.contains("(2d11h left)") || run.stderr.contains("(2d12h left)"),
        "the time left, as `meshca status` shows a certificate's expiry: {run}"
    );
}

#[test]
fn token_whose_labels_contradict_the_dataplane_file_is_refused() {
    let env = env_with_web_1();
    let daemon = env.start();
    let bad = env.token("default", "web-1", &["--label", "app=db"]);
    let run = env.fetch(&bad, &["default"]);
    assert_permission_denied(&run);
    assert!(
        run.stderr.contains("app=db") && run.stderr.contains("app=web"),
        "the message says which label conflicts: {run}"
    );
    // The daemon records the refusal as it handles the connection; poll until the status shows it.
    let dp = wait_for("the refusal in the dataplane's status", || {
        let dp = daemon.admin_json("/api/dataplanes/default/web-1");
        dp["refused_token"]
            .as_str()
            .is_some_and(|r| r.contains("app=db"))
            .then_some(dp)
    });
    assert!(dp["spiffe_id"].is_null(), "{dp}");
}

#[test]
fn token_agreeing_with_the_dataplane_file_gets_the_files_identity() {
    let env = env_with_web_1();
    let _daemon = env.start();
    // A token with the file's own labels and service, and one with no labels at all: both agree.
    for extra in [
        &["--label", "app=web", "--tag", "kuma.io/service=web"][..],
        &[][..],
    ] {
        let token = env.token("default", "web-1", extra);
        let chain = env.fetch_identity(&token);
        let certs = pem_certs(&chain);
        assert!(!certs.is_empty());
        assert_eq!(
            uri_sans(&certs[0]),
            ["spiffe://default/web"],
            "legacy mTLS: spiffe://<mesh>/<kuma.io/service> (token flags {extra:?})"
        );
        meshca_ca::check_svid_rules(&certs[0]).expect("the SVID follows the SPIFFE rules");
    }
}

#[test]
fn contradicting_token_is_refused_while_the_legitimate_proxy_is_connected() {
    let env = env_with_web_1();
    let _daemon = env.start();
    let good = env.token("default", "web-1", &["--label", "app=web"]);
    let (_watch, _) = env.hold_stream(&good);
    let bad = env.token("default", "web-1", &["--label", "app=db"]);
    let run = env.fetch(&bad, &["default"]);
    assert_permission_denied(&run);
}

#[test]
fn contradicting_token_does_not_disturb_the_legitimate_proxy() {
    let env = env_with_web_1();
    let daemon = env.start();
    let good = env.token("default", "web-1", &["--label", "app=web"]);
    let (mut watch, serial) = env.hold_stream(&good);

    let bad = env.token("default", "web-1", &["--label", "app=db"]);
    let _ = env.fetch(&bad, &["default"]);

    // A second request of the legitimate proxy, processed after the contradicting one.
    let run = env.fetch(&good, &["default"]);
    assert_eq!(
        run.code(),
        Some(0),
        "the legitimate proxy was refused: {run}"
    );
    let dp = daemon.admin_json("/api/dataplanes/default/web-1");
    assert_eq!(
        dp["serial"].as_str(),
        Some(serial.as_str()),
        "the legitimate proxy's certificate was dropped and re-issued: {dp}"
    );
    assert_eq!(dp["regenerations"], 0, "{dp}");
    assert!(
        watch.exited().is_none(),
        "the legitimate proxy's stream was closed: {}",
        watch.log()
    );
}

#[test]
fn revoked_token_stops_working_for_fetches_and_open_streams() {
    let env = env_with_web_1();
    let _daemon = env.start();
    let token = env.token("default", "web-1", &[]);
    assert_eq!(token.id.len(), 32, "a token id is 32 hex digits: {token:?}");
    env.fetch_identity(&token);

    // A workload holding an SDS stream open with the token.
    let (mut watch, _) = env.hold_stream(&token);

    env.cli(&["token", "--config", env.cfg(), "--revoke", &token.id])
        .ok();
    let revoked = std::fs::read_to_string(env.data.join("revoked-tokens"))
        .expect("the revocation list was written");
    assert!(revoked.lines().any(|l| l.trim() == token.id), "{revoked}");

    // The daemon picks the list up from its file watcher: poll until fetches fail.
    let refused = wait_for("fetches with the revoked token to fail", || {
        let run = env.fetch(&token, &["default"]);
        (run.code() != Some(0)).then_some(run)
    });
    assert!(
        refused.stderr.contains("Unauthenticated") && refused.stderr.contains("revoked"),
        "{refused}"
    );
    assert!(!refused.stdout.contains("BEGIN CERTIFICATE"), "{refused}");

    // The open stream is closed too.
    let status = wait_for("the revoked workload's stream to be closed", || {
        watch.exited()
    });
    assert!(!status.success(), "{}", watch.log());
    assert!(watch.log().contains("revoked"), "{}", watch.log());

    // Other tokens of the same proxy still work.
    let fresh = env.token("default", "web-1", &[]);
    env.fetch_identity(&fresh);
}

#[test]
fn an_agent_token_names_no_mesh_and_bootstraps_no_envoy() {
    let env = Env::new();
    let run = env
        .cli(&[
            "token",
            "--config",
            env.cfg(),
            "--type",
            "agent",
            "--name",
            "host-1",
        ])
        .ok();
    assert!(run.stderr.contains("for agent:host-1 (agent)"), "{run}");
    let token = run.stdout.trim().to_owned();
    let claims = meshca_auth::Verifier::read_unverified(&token).expect("a meshca token");
    assert_eq!(claims.proxy_type, meshca_auth::ProxyType::Agent);
    assert_eq!((claims.mesh.as_str(), claims.name.as_str()), ("", "host-1"));

    // What an agent's token cannot carry, and what a proxy's must: usage errors naming the flags.
    for (args, says) in [
        (
            &["--type", "agent", "--name", "h", "--mesh", "default"][..],
            "--mesh",
        ),
        (
            &["--type", "agent", "--name", "h", "--label", "a=b"][..],
            "--label",
        ),
        (&["--name", "web-1"][..], "--mesh is required"),
    ] {
        let run = env.cli(&[&["token", "--config", env.cfg()][..], args].concat());
        assert_eq!(run.code(), Some(2), "{run}");
        assert!(run.stderr.contains(says), "{run}");
    }

    let file = env.root().join("agent.token");
    std::fs::write(&file, &token).expect("writable");
    let run = env.cli(&[
        "bootstrap",
        "--config",
        env.cfg(),
        "--token-file",
        file.to_str().expect("UTF-8"),
    ]);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(run.stderr.contains("an agent's token"), "{run}");
}
