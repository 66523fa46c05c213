//! `--stuck`: a proxy told to withhold its ACKs keeps its stream but applies and answers nothing, and
//! the daemon's rollout gate names it as the proxy it waits for, then goes on without it.

use std::sync::Arc;
use std::time::Duration;

use meshca_control::Detail;
use tokio::sync::watch;

use super::*;
use crate::bench::console::ConsoleClients;
use crate::scenario::Scenario;

/// Long enough for the test to see the gate wait (status updates reach it within a second), short
/// enough to see it give up.
const ACK_TIMEOUT: Duration = Duration::from_secs(8);

/// Whether a rollout wait of the daemon names `node` as one it waits for.
async fn waits_for(daemon: &Daemon, node: &str) -> bool {
    let status = daemon
        .status
        .get(Detail::Summary)
        .await
        .expect("the daemon answers status queries")
        .status;
    status
        .rollout
        .iter()
        .any(|wait| wait.waiting_for.iter().any(|n| n == node))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_proxy_stops_acking_and_the_gate_waits_for_it_by_name() {
    let script = Script::new(Scenario::CaRotation, false);
    let proxies = 3;
    let sandbox = Sandbox::new().expect("a sandbox");
    let uid = rustix::process::geteuid().as_raw();
    for (name, yaml) in &script.initial_files(proxies, uid) {
        sandbox.write_resource(name, yaml).expect("writable");
    }
    let mut settings = sandbox.settings();
    settings.rollout.ack_timeout = ACK_TIMEOUT.into();
    let daemon = Daemon::start(
        settings,
        DaemonOptions {
            gate: true,
            watch_files: false,
        },
    )
    .await
    .expect("the daemon starts");
    let mint = |claims: &meshca_auth::Claims| Ok(daemon.mint_token(claims)?);
    let (withhold, signal) = watch::channel(false);
    let reach = Reach {
        targets: vec![daemon.unix_target().expect("a unix SDS socket")],
        mint: &mint,
        workload_sockets: Vec::new(),
        stuck: Some(Stuck { count: 1, signal }),
    };
    let contexts: Vec<String> = script.contexts().into_keys().collect();
    let mut fleet =
        Fleet::start(&reach, &script.members(proxies), &contexts, 7).expect("the fleet starts");
    let members = fleet.members.clone();

    // Before the signal the stuck proxy behaves: the steady state is reached by everyone.
    let steady = fleet
        .wait_until(CONVERGE_TIMEOUT, |states| {
            every(&members, states, |m, s| s.spiffe_id == m.initial_id)
        })
        .await
        .expect("no proxy fails");
    assert!(steady, "the steady state within {CONVERGE_TIMEOUT:?}");
    let old_ca = steady_ca(&fleet.states()).expect("a steady CA");
    let stuck_before = members[0]
        .state
        .borrow()
        .clone()
        .expect("p-0 holds its state");
    assert!(!waits_for(&daemon, "default.p-0").await);

    // The console's event stream follows every status change (a rollout wait that starts included).
    let console = ConsoleClients::start(daemon.admin_addr, 1)
        .await
        .expect("the console follows");
    let mut updates = console.progress(0).expect("client 0");
    withhold.send_replace(true);
    let edit = script.edits.first().expect("ca-rotation has an edit");
    apply(&daemon, &sandbox, edit)
        .await
        .expect("the edit applies");

    let named = tokio::time::timeout(ACK_TIMEOUT, async {
        loop {
            if waits_for(&daemon, "default.p-0").await {
                return;
            }
            updates.changed().await.expect("the console client follows");
        }
    })
    .await;
    assert!(
        named.is_ok(),
        "the rollout never named the stuck proxy p-0 as one it waits for"
    );

    // The gate proceeds without it once rollout.ackTimeout passed: the others present certificates
    // from the new CA, while the stuck proxy applied nothing since the signal.
    let others = &members[1..];
    let moved_on = fleet
        .wait_until(ACK_TIMEOUT + CONVERGE_TIMEOUT, |states| {
            every(others, &states[1..], |_, s| {
                s.chain.last().is_some_and(|top| !issued_by(top, &old_ca))
            })
        })
        .await
        .expect("no proxy fails");
    assert!(
        moved_on,
        "the others never got a certificate from the new CA"
    );
    let stuck_after = members[0]
        .state
        .borrow()
        .clone()
        .expect("p-0 holds its state");
    assert!(
        Arc::ptr_eq(&stuck_before, &stuck_after),
        "the stuck proxy applied a response after the signal"
    );
    assert!(stuck_after
        .chain
        .last()
        .is_some_and(|top| issued_by(top, &old_ca)));

    console
        .finish(daemon.generation(), Duration::from_secs(10))
        .await
        .expect("the console client followed to the end");
    fleet.stop().await;
    daemon.stop().await;
}
