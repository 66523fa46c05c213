//! The ordering gate (docs/rotation.md) over real SDS `StreamSecrets` streams against `meshca serve`.
//!
//! Each proxy is a hand-driven stream subscribed to `default` and `system_trust_bundle` that ACKs only
//! when the test says so, so a test can hold a proxy back and watch what the daemon does meanwhile:
//! trust before identity, break last, a disconnected proxy blocking nothing, and `rollout.ackTimeout`.
//! Every certificate a stream receives is checked against the bundle that stream held before it.

mod common;

use std::time::{Duration, Instant, SystemTime};

use common::sds_proxy::{SdsProxy, PUSH_TIMEOUT};
use common::{Daemon, Env};
use meshca_identity::SpiffeId;
use serde_json::Value;
use tokio::task::block_in_place;

const MESH: &str = "default";
/// The SPIFFE ID of every proxy here (they all serve `kuma.io/service=web`).
const WEB_ID: &str = "spiffe://default/web";
/// Long enough that no step of tests 1–3 can time out: what they see is ordering by ACKs alone.
const NO_TIMEOUT: &str = "rollout: {ackTimeout: 10m}\n";

/// The Mesh `default` at each step of a rotation from builtin `ca-1` to builtin `ca-2`.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Only ca-1.
    Ca1,
    /// The one-edit switch: ca-2 defined and enabled, ca-1 kept as a secondary backend.
    Switch,
    /// ca-1 removed.
    Ca2Only,
}

fn backend_yaml(name: &str) -> String {
    format!(
        "    - name: {name}\n      type: builtin\n      dpCert: {{rotation: {{expiration: 1h}}}}\n      conf: {{caCert: {{expiration: 1y}}}}\n"
    )
}

fn mesh_yaml(step: Step) -> String {
    let (enabled, secondary, backends) = match step {
        Step::Ca1 => ("ca-1", "", backend_yaml("ca-1")),
        Step::Switch => (
            "ca-2",
            "  secondaryBackends: [ca-1]\n",
            backend_yaml("ca-1") + &backend_yaml("ca-2"),
        ),
        Step::Ca2Only => ("ca-2", "", backend_yaml("ca-2")),
    };
    format!(
        "type: Mesh\nname: {MESH}\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: {enabled}\n{secondary}  backends:\n{backends}"
    )
}

fn web_id() -> SpiffeId {
    SpiffeId::parse(WEB_ID).expect("WEB_ID is a valid SPIFFE ID")
}

/// Lowercase hex SHA-256 of a DER certificate: how meshca names a CA (`ca.id` in `/api/status`).
fn fingerprint(der: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, der)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A certificate's subject as x509-parser prints it.
fn subject(der: &[u8]) -> String {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).expect("a parsable CA certificate");
    cert.subject().to_string()
}

/// Whether `chain` is a valid SVID for [`WEB_ID`] under the single anchor `ca`.
fn issued_by(chain: &[Vec<u8>], ca: &[u8]) -> bool {
    meshca_ca::verify_svid(chain, &[ca.to_vec()], &web_id(), SystemTime::now()).is_ok()
}

/// Connects `<mesh>.<name>` serving `kuma.io/service=web`.
async fn proxy(env: &Env, name: &str) -> SdsProxy {
    SdsProxy::connect(env, MESH, name, &["--tag", "kuma.io/service=web"], WEB_ID).await
}

/// Starts the daemon on Mesh `default` with ca-1.
fn start(settings: &str) -> (Env, Daemon) {
    let env = Env::with_settings(settings);
    env.write_resource("mesh.yaml", &mesh_yaml(Step::Ca1));
    let daemon = block_in_place(|| env.start());
    (env, daemon)
}

/// Polls `/api/status` until `accept` returns `Some`.
fn poll_status<T>(daemon: &Daemon, what: &str, accept: impl FnMut(&Value) -> Option<T>) -> T {
    block_in_place(|| daemon.wait_json("/api/status", what, accept))
}

/// The id of the CA of backend `name` of Mesh `default`, once the daemon shows it.
fn backend_ca_id(daemon: &Daemon, name: &str) -> String {
    poll_status(daemon, &format!("backend {name} to have a CA"), |v| {
        let mesh = v["meshes"].as_array()?.iter().find(|m| m["name"] == MESH)?;
        let backend = mesh["mtls"]["backends"]
            .as_array()?
            .iter()
            .find(|b| b["name"] == name)?;
        backend["ca"]["id"].as_str().map(str::to_owned)
    })
}

/// Polls until `/api/status` shows a rollout wait of `step` for the CA `ca` waiting exactly for `proxies`.
fn wait_for_rollout(daemon: &Daemon, step: &str, ca: &[u8], proxies: &[&str]) -> Value {
    let ca = subject(ca);
    poll_status(
        daemon,
        &format!("a {step} wait for {ca} naming {proxies:?}"),
        |v| {
            v["rollout"]
                .as_array()?
                .iter()
                .find(|w| {
                    w["mesh"] == MESH
                        && w["step"] == step
                        && w["ca"] == ca.as_str()
                        && w["waiting_for"] == serde_json::json!(proxies)
                        && w["waiting_count"] == proxies.len()
                })
                .cloned()
        },
    )
}

/// Polls `/api/streams` until each proxy's stream has ACKed the version the proxy last ACKed.
fn wait_acked(daemon: &Daemon, proxies: &[&SdsProxy]) {
    let wanted: Vec<(String, String)> = proxies
        .iter()
        .map(|p| {
            let version = p.acked.clone().expect("the proxy ACKed something");
            (p.name.clone(), version)
        })
        .collect();
    block_in_place(|| {
        daemon.wait_json("/api/streams", "the ACKs to be recorded", |v| {
            let streams = v.as_array()?;
            wanted
                .iter()
                .all(|(name, version)| {
                    streams.iter().any(|s| {
                        s["proxy"]["mesh"] == MESH
                            && s["proxy"]["name"] == name.as_str()
                            && s["last_acked_version"] == version.as_str()
                    })
                })
                .then_some(())
        })
    });
}

/// `issuer` of `/api/dataplanes/default/<name>`, once it equals `issuer`.
fn wait_issuer(daemon: &Daemon, name: &str, issuer: &str) {
    let path = format!("/api/dataplanes/{MESH}/{name}");
    block_in_place(|| {
        daemon.wait_json(&path, &format!("{name}'s issuer to be {issuer}"), |v| {
            (v["issuer"] == issuer).then_some(())
        })
    });
}

/// The proxies connect and ACK their first push; returns the one CA (ca-1) they all trust.
async fn steady_state(daemon: &Daemon, proxies: &mut [&mut SdsProxy]) -> Vec<u8> {
    let ca1_id = backend_ca_id(daemon, "ca-1");
    for p in proxies.iter_mut() {
        let first = p.next("the first push").await.clone();
        assert_eq!(first.trust_domains, [MESH], "{}: one trust domain", p.name);
        assert_eq!(first.bundle.len(), 1, "{}: only ca-1 is trusted", p.name);
        assert_eq!(
            fingerprint(&first.bundle[0]),
            ca1_id,
            "{}: the bundle holds ca-1",
            p.name
        );
        assert!(issued_by(&first.chain, &first.bundle[0]), "{}", p.name);
        p.ack().await;
    }
    let ca1 = proxies[0].last().bundle[0].clone();
    let all: Vec<&SdsProxy> = proxies.iter().map(|p| &**p).collect();
    wait_acked(daemon, &all);
    ca1
}

/// Writes the switch and awaits, on every stream, the bundle with both CAs; returns ca-2. No
/// certificate may change with it: ca-2 may not issue before that bundle is ACKed.
async fn switch(env: &Env, daemon: &Daemon, ca1: &[u8], proxies: &mut [&mut SdsProxy]) -> Vec<u8> {
    env.write_resource("mesh.yaml", &mesh_yaml(Step::Switch));
    after_switch(daemon, ca1, proxies).await
}

async fn after_switch(daemon: &Daemon, ca1: &[u8], proxies: &mut [&mut SdsProxy]) -> Vec<u8> {
    let ca2_id = backend_ca_id(daemon, "ca-2");
    let mut ca2 = None;
    for p in proxies.iter_mut() {
        let before = p.last().chain.clone();
        let got = p
            .next_until("a bundle with two CAs", PUSH_TIMEOUT, |r| {
                r.bundle.len() == 2
            })
            .await;
        assert!(got.trusts(ca1), "{}: ca-1 is still trusted", p.name);
        let new = got
            .bundle
            .iter()
            .find(|c| c.as_slice() != ca1)
            .expect("two CAs, one of them ca-1")
            .clone();
        assert_eq!(fingerprint(&new), ca2_id, "{}: the new CA is ca-2", p.name);
        assert_eq!(
            got.chain, before,
            "{}: the certificate did not change with the trust",
            p.name
        );
        ca2 = Some(new);
    }
    ca2.expect("at least one proxy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delayed_ack_holds_back_the_new_ca() {
    let (env, daemon) = start(NO_TIMEOUT);
    let mut a = proxy(&env, "a").await;
    let mut b = proxy(&env, "b").await;
    let ca1 = steady_state(&daemon, &mut [&mut a, &mut b]).await;
    let ca2 = switch(&env, &daemon, &ca1, &mut [&mut a, &mut b]).await;

    a.ack().await;
    let wait = wait_for_rollout(&daemon, "trust-before-identity", &ca2, &["default.b"]);
    assert!(
        wait["timeout_in_seconds"].as_i64().unwrap_or(0) > 0,
        "{wait}"
    );
    a.drain();
    b.drain();
    for p in [&a, &b] {
        assert!(
            p.received.iter().all(|r| issued_by(&r.chain, &ca1)),
            "{}: a certificate from ca-2 arrived before b ACKed its bundle",
            p.name
        );
    }
    let dp = block_in_place(|| daemon.admin_json("/api/dataplanes/default/a"));
    assert_eq!(dp["issuer"], "backend ca-1", "{dp}");

    b.ack().await;
    for p in [&mut a, &mut b] {
        let got = p
            .next_until("a certificate from ca-2", PUSH_TIMEOUT, |r| {
                issued_by(&r.chain, &ca2)
            })
            .await;
        assert!(got.trusts(&ca1) && got.trusts(&ca2), "{}", p.name);
    }
    // Each new certificate is trusted by the other proxy's current bundle, too.
    assert!(issued_by(&a.last().chain, &ca2) && b.last().trusts(&ca2));
    assert!(issued_by(&b.last().chain, &ca2) && a.last().trusts(&ca2));
    wait_issuer(&daemon, "a", "backend ca-2");
    wait_issuer(&daemon, "b", "backend ca-2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ca_removed_right_after_the_switch_stays_until_replacements_are_acked() {
    let (env, daemon) = start(NO_TIMEOUT);
    let mut a = proxy(&env, "a").await;
    let mut b = proxy(&env, "b").await;
    let ca1 = steady_state(&daemon, &mut [&mut a, &mut b]).await;

    let mark = [a.received.len(), b.received.len()];
    env.write_resource("mesh.yaml", &mesh_yaml(Step::Switch));
    env.write_resource("mesh.yaml", &mesh_yaml(Step::Ca2Only));
    let ca2 = after_switch(&daemon, &ca1, &mut [&mut a, &mut b]).await;
    a.ack().await;
    b.ack().await;
    for p in [&mut a, &mut b] {
        let got = p
            .next_until("a certificate from ca-2", PUSH_TIMEOUT, |r| {
                issued_by(&r.chain, &ca2)
            })
            .await;
        assert!(
            got.trusts(&ca1),
            "{}: ca-1 stays while proxies present it",
            p.name
        );
    }

    a.ack().await;
    let wait = wait_for_rollout(&daemon, "break-last", &ca1, &["default.b"]);
    assert!(
        wait["timeout_in_seconds"].as_i64().unwrap_or(0) > 0,
        "{wait}"
    );
    a.drain();
    b.drain();
    for (p, from) in [(&a, mark[0]), (&b, mark[1])] {
        assert!(
            p.received[from..].iter().all(|r| r.trusts(&ca1)),
            "{}: ca-1 left the bundle before b ACKed its replacement",
            p.name
        );
    }
    wait_metric(&daemon, "meshca_ca_removed_while_presented_total");

    b.ack().await;
    for p in [&mut a, &mut b] {
        let got = p
            .next_until("a bundle without ca-1", PUSH_TIMEOUT, |r| !r.trusts(&ca1))
            .await;
        assert_eq!(
            got.bundle,
            std::slice::from_ref(&ca2),
            "{}: only ca-2 remains",
            p.name
        );
        assert!(issued_by(&got.chain, &ca2), "{}", p.name);
    }
    poll_status(&daemon, "the rollout to finish", |v| {
        v["rollout"].as_array()?.is_empty().then_some(())
    });
}

/// The snapshot generation `/api/status` shows.
fn generation(daemon: &Daemon) -> u64 {
    let status = block_in_place(|| daemon.admin_json("/api/status"));
    status["generation"]
        .as_u64()
        .unwrap_or_else(|| panic!("no generation in {status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_rollout_step_leaves_the_daemon_idle() {
    let (env, daemon) = start(NO_TIMEOUT);
    let mut a = proxy(&env, "a").await;
    let mut b = proxy(&env, "b").await;
    let ca1 = steady_state(&daemon, &mut [&mut a, &mut b]).await;
    let ca2 = switch(&env, &daemon, &ca1, &mut [&mut a, &mut b]).await;
    a.ack().await;
    wait_for_rollout(&daemon, "trust-before-identity", &ca2, &["default.b"]);

    // Nothing happens until b ACKs, so the daemon has nothing new to publish: once the last event is
    // handled, the generation stays put.
    let mut previous = None;
    let settled = poll_status(&daemon, "the snapshot generation to stop advancing", |v| {
        let now = v["generation"].as_u64()?;
        let same = previous == Some(now);
        previous = Some(now);
        same.then_some(now)
    });
    for _ in 0..20 {
        assert_eq!(
            generation(&daemon),
            settled,
            "the daemon publishes new snapshots while nothing changes"
        );
    }

    b.ack().await;
    a.next_until("a certificate from ca-2", PUSH_TIMEOUT, |r| {
        issued_by(&r.chain, &ca2)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_disconnected_proxy_blocks_nothing() {
    let (env, daemon) = start(NO_TIMEOUT);
    let mut a = proxy(&env, "a").await;
    let mut b = proxy(&env, "b").await;
    let mut c = proxy(&env, "c").await;
    let ca1 = steady_state(&daemon, &mut [&mut a, &mut b, &mut c]).await;
    let ca2 = switch(&env, &daemon, &ca1, &mut [&mut a, &mut b, &mut c]).await;

    a.ack().await;
    c.ack().await;
    wait_for_rollout(&daemon, "trust-before-identity", &ca2, &["default.b"]);
    a.drain();
    assert!(issued_by(&a.last().chain, &ca1), "a waits for b");

    b.disconnect();
    for p in [&mut a, &mut c] {
        p.next_until("a certificate from ca-2", PUSH_TIMEOUT, |r| {
            issued_by(&r.chain, &ca2)
        })
        .await;
    }
    let dp = block_in_place(|| daemon.admin_json("/api/dataplanes/default/b"));
    assert_eq!(dp["connected"], false, "{dp}");
    wait_issuer(&daemon, "a", "backend ca-2");
}

/// The sum of the samples of counter `name` (e.g. `meshca_rollout_timeouts_total`) for mesh `default`.
fn metric_sum(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{'))
                && l.contains(&format!("mesh=\"{MESH}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls `/metrics` until counter `name` of mesh `default` is above zero.
fn wait_metric(daemon: &Daemon, name: &str) {
    block_in_place(|| {
        common::wait_for(&format!("{name} > 0"), || {
            let m = daemon.admin_get("/metrics");
            (metric_sum(&m.body, name) > 0.0).then_some(())
        })
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ack_timeout_bounds_a_proxy_that_never_acks() {
    let timeout = Duration::from_secs(2);
    let (env, daemon) = start("rollout: {ackTimeout: 2s}\n");
    let mut a = proxy(&env, "a").await;
    let mut b = proxy(&env, "b").await;
    let ca1 = steady_state(&daemon, &mut [&mut a, &mut b]).await;
    let metrics = block_in_place(|| daemon.admin_get("/metrics"));
    assert_eq!(
        metric_sum(&metrics.body, "meshca_rollout_timeouts_total"),
        0.0,
        "{}",
        metrics.body
    );

    let edited = Instant::now();
    let ca2 = switch(&env, &daemon, &ca1, &mut [&mut a, &mut b]).await;
    a.ack().await;
    // b never ACKs.
    a.next_until("a certificate from ca-2", PUSH_TIMEOUT, |r| {
        issued_by(&r.chain, &ca2)
    })
    .await;
    let waited = edited.elapsed();
    assert!(
        waited >= timeout - Duration::from_millis(100),
        "ca-2 issued after {waited:?}, before the {timeout:?} timeout, although b never ACKed"
    );
    wait_metric(&daemon, "meshca_rollout_timeouts_total");
    // The daemon says whom it stopped waiting for.
    block_in_place(|| {
        common::wait_for("the timeout to be logged naming default.b", || {
            daemon
                .log()
                .lines()
                .any(|l| l.contains("rollout.ackTimeout passed") && l.contains("default.b"))
                .then_some(())
        })
    });
}
