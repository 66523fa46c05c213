//! A kill at any write of a federation fetch leaves a daemon that needs no human. `meshca serve` follows a
//! peer's bundle endpoint (written in the tests from the standard alone, never with meshca's code) and is
//! killed with SIGKILL (the `MESHCA_TEST_CRASH_AT=N` hook of `meshca_keystore::crash_point`) at its Nth
//! write, rename or removal, for every N of a start that fetches the peer's new bundle and persists it:
//! each restart reaches ready holding a bundle of the peer (the initial one or the fetched one, never
//! nothing and never a broken one) and then holds the fetched one.

mod common;
#[path = "../federation/tests/peer/mod.rs"]
mod peer;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use common::{http_get, wait_for, Daemon, Env};
use meshca_keystore::CRASH_AT_ENV;

/// The relationship with the peer, for every mesh, its initial bundle in `initial`.
fn relationship(url: &str, initial: &Path) -> String {
    format!(
        "type: FederationRelationship\nname: partner\nmesh: \"*\"\nspec:\n  trustDomain: peer.example\n  bundleEndpoint: {{url: \"{url}\", profile: https_spiffe, spiffeID: \"{}\"}}\n  initialBundle: {{file: {}}}\n",
        peer::ENDPOINT_ID,
        initial.display()
    )
}

/// The daemon's view of the peer: its sequence and where it came from; `None` while it holds nothing,
/// or does not answer (it may have just been killed).
fn peer_held(daemon: &Daemon) -> Option<(u64, String)> {
    let response = http_get(daemon.admin, "/api/status").ok()?;
    let status: serde_json::Value = serde_json::from_str(&response.body).ok()?;
    let entry = status["federation"]
        .as_array()?
        .iter()
        .find(|e| e["trust_domain"] == "peer.example")?
        .clone();
    Some((
        entry["sequence"].as_u64()?,
        entry["held_from"].as_str()?.to_owned(),
    ))
}

#[test]
fn a_kill_at_any_write_of_a_fetch_and_its_persisting_leaves_a_daemon_that_holds_the_peer() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let (one, two) = (peer::Ca::new("peer.example"), peer::Ca::new("peer.example"));
    // The peer serves sequence 2 (both CAs); the relationship starts from sequence 1 (the first).
    let endpoint = runtime.block_on(peer::Endpoint::start(
        one.svid(peer::ENDPOINT_ID),
        "200 OK",
        peer::bundle_json(&[one.jwk(), two.jwk()], 2),
    ));
    let env = Env::new();
    let initial = env.root().join("partner.json");
    std::fs::write(&initial, peer::bundle_json(&[one.jwk()], 1)).expect("written");
    // The data directory after a first start without the relationship, copied afresh before every run.
    assert_eq!(env.start().stop().code(), Some(0));
    let template = env.root().join("template");
    env.save_data(&template);
    env.write_resource("partner.yaml", &relationship(&endpoint.url(), &initial));

    let prefix = format!("{CRASH_AT_ENV}: crash point ");
    let mut steps = Vec::new();
    let renamed = |steps: &[String]| {
        steps
            .iter()
            .any(|s| s.starts_with("rename ") && s.ends_with("federation/peer.example.json"))
    };
    // The start's last crash point and the fetch's writes run side by side, so the numbers of the
    // fetch's crash points shift from run to run: a pass can step over its rename. Passes go on (at
    // most 5) until one kill has landed on it; every kill of every pass is checked.
    for _pass in 0..5 {
        if renamed(&steps) {
            break;
        }
        scan(&env, &template, &prefix, &mut steps);
    }
    assert!(
        renamed(&steps),
        "no crash point renamed the peer's bundle into place: {steps:#?}"
    );
}

/// Kills a start at crash point 1, 2, … until a start runs past the last one; each restart must hold
/// the peer's initial or fetched bundle at once, then the fetched one. Adds each kill's step to `steps`.
fn scan(env: &Env, template: &std::path::Path, prefix: &str, steps: &mut Vec<String>) {
    for at in 1.. {
        env.restore_data(template);
        let armed = |cmd: &mut Command| {
            cmd.env(CRASH_AT_ENV, at.to_string());
        };
        // Killed at crash point `at` (before ready, or in the fetch's persisting after it), or past the
        // last one: then the run held the fetched bundle and stopped cleanly.
        let (status, log) = match env.try_start_with(armed) {
            Err(exit) => exit,
            Ok(mut daemon) => {
                let fetched = wait_for("the fetch persisted, or the kill", || {
                    if let Some(status) = daemon.exited() {
                        return Some(Err(status));
                    }
                    let stored = env.keystore().join("federation/peer.example.json");
                    let held = peer_held(&daemon)?;
                    (held.0 == 2 && stored.exists()).then_some(Ok(()))
                });
                match fetched {
                    Ok(()) => {
                        assert_eq!(daemon.stop().code(), Some(0));
                        break;
                    }
                    Err(status) => (status, daemon.log()),
                }
            }
        };
        assert_eq!(
            status.signal(),
            Some(9),
            "meshca serve ended ({status}) otherwise than killed at crash point {at}:\n{log}"
        );
        let step = log
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{prefix}{at}: ")))
            .unwrap_or_else(|| panic!("no crash point {at} in the log:\n{log}"))
            .to_owned();
        let what = format!("killed at crash point {at} ({step})");
        steps.push(step);

        // The restart holds a bundle of the peer at once, whatever the kill left, then the fetched one.
        let daemon = env
            .try_start_with(|_| {})
            .unwrap_or_else(|(status, log)| panic!("{what}: the restart exited {status}:\n{log}"));
        // (The trust comes from the initial bundle until the importer's first turn; its status says
        // so from that turn on.)
        let (sequence, from) = wait_for(&format!("{what}: a bundle held"), || peer_held(&daemon));
        assert!(
            (sequence == 1 && from == "initialBundle")
                || (sequence == 2 && ["stored", "fetched"].contains(&from.as_str())),
            "{what}: held sequence {sequence} from {from}"
        );
        wait_for(&format!("{what}: the fetched bundle"), || {
            peer_held(&daemon).filter(|(sequence, _)| *sequence == 2)
        });
        assert_eq!(daemon.stop().code(), Some(0), "{what}");
    }
}
