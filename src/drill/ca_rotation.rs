//! `meshca drill ca-rotation`: a mesh on builtin CA ca-1 switches to ca-2 in one
//! edit (ca-1 kept as secondary) and, without waiting, a second edit removes ca-1. With the ordering
//! gate (docs/rotation.md) no handshake between the simulated proxies may fail; without it, some do.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::anyhow;
use rustls_pki_types::CertificateDer;

use std::collections::BTreeMap;

use meshca_auth::Claims;

use super::envoy::{EnvoyRing, RingMember, RingTraffic};
use super::fleet::{Fleet, MemberSpec, States};
use super::report::{Header, Outcome, Report};
use super::sandbox::Sandbox;
use super::tls::issued_by;
use super::traffic::Traffic;
use crate::serve::{Daemon, DaemonOptions};

/// The scenario's name on the command line and in reports.
pub const NAME: &str = "ca-rotation";
/// The mesh the drill runs in.
const MESH: &str = "default";
/// How many services the proxies are spread over (`kuma.io/service=svc-<i % SERVICES>`).
const SERVICES: usize = 5;
/// Concurrent handshake workers.
const WORKERS: usize = 4;
/// How long the fleet may take to reach the steady state, and to converge after the edits.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(120);

/// What to drill.
#[derive(Clone, Debug)]
pub struct Options {
    /// How many simulated proxies (at least 2).
    pub proxies: usize,
    /// The daemon's ordering gate.
    pub gate: bool,
    /// Seeds apply delays and handshake pairs.
    pub seed: u64,
    /// Minimum handshakes over the three phases.
    pub handshakes: u64,
    /// Real Envoy sidecars from this binary instead of simulated proxies.
    pub envoy: Option<PathBuf>,
}

impl Options {
    /// Minimum handshakes per phase: a fifth for `steady` and `converged`, the rest for `rotation`.
    fn phase_minimums(&self) -> [u64; 3] {
        let edge = (self.handshakes / 5).max(1);
        let middle = self.handshakes.saturating_sub(2 * edge).max(1);
        [edge, middle, edge]
    }
}

/// The Mesh resource at each step of the scenario.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// ca-1 only.
    Ca1,
    /// ca-2 issues, ca-1 still trusted (the one-edit three-step rotation).
    Switch,
    /// ca-1 removed.
    Ca2,
}

fn backend(name: &str) -> String {
    format!(
        "    - name: {name}\n      type: builtin\n      dpCert: {{rotation: {{expiration: 1h}}}}\n      conf: {{caCert: {{expiration: 1y}}}}\n"
    )
}

fn mesh_yaml(step: Step) -> String {
    let (enabled, secondary, backends) = match step {
        Step::Ca1 => ("ca-1", "", backend("ca-1")),
        Step::Switch => (
            "ca-2",
            "  secondaryBackends: [ca-1]\n",
            backend("ca-1") + &backend("ca-2"),
        ),
        Step::Ca2 => ("ca-2", "", backend("ca-2")),
    };
    format!("type: Mesh\nname: {MESH}\nmtls:\n  enabledBackend: {enabled}\n{secondary}  backends:\n{backends}")
}

/// Proxy `p-<i>` serves `svc-<i % 5>`; its peers expect `spiffe://default/svc-<i % 5>`.
fn members(count: usize) -> Vec<MemberSpec> {
    (0..count)
        .map(|i| {
            let service = format!("svc-{}", i % SERVICES);
            MemberSpec {
                name: format!("p-{i}"),
                expected_id: format!("spiffe://{MESH}/{service}"),
                service,
            }
        })
        .collect()
}

/// Plays the scenario against an in-process daemon and reports. An error means the drill could not
/// even start (or reach its steady state); problems after that are in the report.
pub async fn run(options: Options) -> anyhow::Result<Report> {
    if let Some(envoy) = options.envoy.clone() {
        return run_with_envoy(options, envoy).await;
    }
    let (sandbox, daemon) = start_daemon(options.gate).await?;
    let mut fleet = match Fleet::start(&daemon, MESH, &members(options.proxies), options.seed) {
        Ok(fleet) => fleet,
        Err(error) => {
            daemon.stop().await;
            return Err(error);
        }
    };
    let result = play(&daemon, &sandbox, &mut fleet, options.clone()).await;
    fleet.stop().await;
    daemon.stop().await;
    result
}

/// A sandbox with the steady-state mesh (ca-1) and an in-process daemon serving it.
async fn start_daemon(gate: bool) -> anyhow::Result<(Sandbox, Daemon)> {
    let sandbox = Sandbox::new()?;
    tracing::info!(dir = %sandbox.root().display(), "drill: starting an in-process daemon");
    sandbox.write_resource("mesh.yaml", &mesh_yaml(Step::Ca1))?;
    let daemon = Daemon::start(
        sandbox.settings(),
        DaemonOptions {
            gate,
            watch_files: false,
        },
    )
    .await?;
    Ok((sandbox, daemon))
}

async fn play(
    daemon: &Daemon,
    sandbox: &Sandbox,
    fleet: &mut Fleet,
    options: Options,
) -> anyhow::Result<Report> {
    let expected: Vec<String> = fleet
        .members
        .iter()
        .map(|m| m.expected_id.clone())
        .collect();
    let steady = fleet
        .wait_until(CONVERGE_TIMEOUT, |states| {
            states
                .iter()
                .zip(&expected)
                .all(|(state, id)| state.as_ref().is_some_and(|state| state.spiffe_id == *id))
        })
        .await?;
    if !steady {
        return Err(anyhow!(
            "the steady state was not reached: within {CONVERGE_TIMEOUT:?} not every proxy applied its identity ({}) and a bundle",
            "spiffe://default/svc-<i % 5>"
        ));
    }
    let ca1 = single_ca(&fleet.states())?;
    tracing::info!(proxies = options.proxies, "drill: steady state on ca-1");

    let [steady_min, rotation_min, converged_min] = options.phase_minimums();
    let mut traffic = Traffic::start(fleet.members.clone(), options.seed, WORKERS, "steady");
    let mut outcome = Outcome::default();
    let rotation = async {
        traffic.wait_handshakes(steady_min).await?;
        traffic.begin_phase("rotation");
        let started = Instant::now();
        edit(daemon, sandbox, Step::Switch).await?;
        edit(daemon, sandbox, Step::Ca2).await?;
        tracing::info!("drill: both edits applied by the daemon; waiting for the proxies");
        let converged = fleet
            .wait_until(CONVERGE_TIMEOUT, |states| is_converged(states, &ca1))
            .await?;
        if !converged {
            let daemon_view = daemon
                .status
                .borrow()
                .meshes
                .iter()
                .find(|m| m.name == MESH)
                .map(|m| format!("{:?}", m.proxies_by_issuer))
                .unwrap_or_default();
            return Err(anyhow!(
                "no convergence within {CONVERGE_TIMEOUT:?}: {}; the daemon counts proxies by issuer as {daemon_view}",
                progress(&fleet.states(), &ca1)
            ));
        }
        outcome.converge_seconds = Some(started.elapsed().as_secs_f64());
        tracing::info!(seconds = ?started.elapsed(), "drill: converged on ca-2");
        traffic.wait_handshakes(rotation_min).await?;
        traffic.begin_phase("converged");
        traffic.wait_handshakes(converged_min).await
    };
    if let Err(error) = rotation.await {
        outcome.error = Some(format!("{error:#}"));
    }
    let phases = traffic.stop().await;
    outcome.nacks = fleet.nacks();
    let header = Header {
        scenario: NAME,
        gate: options.gate,
        proxies: options.proxies,
        envoy: false,
        seed: options.seed,
    };
    Ok(Report::new(header, phases, outcome))
}

/// The same scenario with real Envoy sidecars in a ring (see [`super::envoy`]).
async fn run_with_envoy(options: Options, envoy: PathBuf) -> anyhow::Result<Report> {
    let (sandbox, daemon) = start_daemon(options.gate).await?;
    let members: Vec<RingMember> = members(options.proxies)
        .into_iter()
        .map(|m| RingMember {
            name: m.name,
            service: m.service,
            spiffe_id: m.expected_id,
        })
        .collect();
    let mint = |member: &RingMember| -> anyhow::Result<String> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        let tags = BTreeMap::from([("kuma.io/service".to_owned(), member.service.clone())]);
        let claims = Claims::new_dataplane(
            MESH,
            &member.name,
            BTreeMap::new(),
            tags,
            Duration::from_secs(24 * 3600),
            now,
        )?;
        daemon.mint_token(&claims)
    };
    let socket = sandbox.root().join("sds.sock");
    let ring = EnvoyRing::start(
        &envoy,
        sandbox.root(),
        &socket,
        &members,
        &mint,
        options.seed,
    )
    .await;
    let ring = match ring {
        Ok(ring) => ring,
        Err(error) => {
            daemon.stop().await;
            return Err(error);
        }
    };
    for (name, delay) in &ring.laggards {
        tracing::info!(proxy = %name, ?delay, "drill: this Envoy's SDS is relayed late");
    }
    let result = play_with_envoy(&daemon, &sandbox, &ring, &options).await;
    ring.stop().await;
    daemon.stop().await;
    result
}

async fn play_with_envoy(
    daemon: &Daemon,
    sandbox: &Sandbox,
    ring: &EnvoyRing,
    options: &Options,
) -> anyhow::Result<Report> {
    let before = ring.presented_serials().await;
    let [steady_min, rotation_min, converged_min] = options.phase_minimums();
    let mut traffic = RingTraffic::start(ring, options.seed, WORKERS, "steady");
    let mut outcome = Outcome::default();
    let rotation = async {
        traffic.wait_requests(steady_min).await?;
        traffic.begin_phase("rotation");
        let started = Instant::now();
        edit(daemon, sandbox, Step::Switch).await?;
        edit(daemon, sandbox, Step::Ca2).await?;
        tracing::info!("drill: both edits applied by the daemon; waiting for the Envoys");
        let deadline = started + CONVERGE_TIMEOUT;
        loop {
            let serials = ring.presented_serials().await;
            let renewed = serials
                .iter()
                .zip(&before)
                .all(|(now, then)| now.is_some() && now != then);
            if renewed && daemon_converged(daemon, ring.sidecars.len()) {
                break;
            }
            if Instant::now() > deadline {
                return Err(anyhow!(
                    "no convergence within {CONVERGE_TIMEOUT:?}: the daemon counts proxies by issuer as {}",
                    issuers(daemon)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        outcome.converge_seconds = Some(started.elapsed().as_secs_f64());
        tracing::info!(seconds = ?started.elapsed(), "drill: every Envoy presents a ca-2 certificate");
        traffic.wait_requests(rotation_min).await?;
        traffic.begin_phase("converged");
        traffic.wait_requests(converged_min).await
    };
    if let Err(error) = rotation.await {
        outcome.error = Some(format!("{error:#}"));
    }
    let phases = traffic.stop().await;
    let header = Header {
        scenario: NAME,
        gate: options.gate,
        proxies: options.proxies,
        envoy: true,
        seed: options.seed,
    };
    Ok(Report::new(header, phases, outcome))
}

/// The daemon's view: every connected proxy of the mesh holds (has ACKed) a ca-2 certificate, and no
/// rollout step waits.
fn daemon_converged(daemon: &Daemon, proxies: usize) -> bool {
    let status = daemon.status.borrow();
    let Some(mesh) = status.meshes.iter().find(|m| m.name == MESH) else {
        return false;
    };
    let all_on_ca2 = mesh.proxies_by_issuer.len() == 1
        && mesh
            .proxies_by_issuer
            .iter()
            .all(|(issuer, count)| issuer.contains("ca-2") && *count == proxies);
    all_on_ca2 && status.rollout.is_empty()
}

fn issuers(daemon: &Daemon) -> String {
    let status = daemon.status.borrow();
    status
        .meshes
        .iter()
        .find(|m| m.name == MESH)
        .map(|m| format!("{:?}", m.proxies_by_issuer))
        .unwrap_or_default()
}

/// Writes the Mesh of `step` and has the daemon apply it (snapshot published, not yet delivered).
async fn edit(daemon: &Daemon, sandbox: &Sandbox, step: Step) -> anyhow::Result<()> {
    sandbox.write_resource("mesh.yaml", &mesh_yaml(step))?;
    match daemon.reload_resources().await? {
        Ok(()) => {
            tracing::info!(?step, "drill: resource update applied");
            Ok(())
        }
        Err(errors) => {
            let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
            Err(anyhow!(
                "the daemon rejected the drill's {step:?} update: {}",
                lines.join("; ")
            ))
        }
    }
}

/// The one CA every proxy trusts in the steady state (ca-1).
fn single_ca(states: &States) -> anyhow::Result<CertificateDer<'static>> {
    let mut found: Option<&CertificateDer<'static>> = None;
    for state in states.iter().flatten() {
        let cas: Vec<_> = state.cas().collect();
        match (cas.as_slice(), found) {
            ([ca], None) => found = Some(ca),
            ([ca], Some(seen)) if *ca == seen => {}
            _ => {
                return Err(anyhow!(
                    "steady state: every proxy should trust exactly the one CA ca-1, one trusts {} CAs or another one",
                    cas.len()
                ))
            }
        }
    }
    found
        .cloned()
        .ok_or_else(|| anyhow!("steady state: no proxy holds a bundle"))
}

/// Converged: every proxy presents a certificate from the same new CA, the only one it trusts.
fn is_converged(states: &States, old: &CertificateDer<'_>) -> bool {
    let mut new: Option<&CertificateDer<'static>> = None;
    states.iter().all(|state| {
        let Some(state) = state else { return false };
        let cas: Vec<_> = state.cas().collect();
        let [ca] = cas.as_slice() else { return false };
        let same = *new.get_or_insert(ca) == *ca;
        let top = state.chain.last();
        same && *ca != old && top.is_some_and(|cert| issued_by(cert, ca))
    })
}

/// Where the fleet stands, for a timeout message.
fn progress(states: &States, old: &CertificateDer<'_>) -> String {
    let mut missing = 0;
    let mut presenting_old = 0;
    let mut trusting_old = 0;
    for state in states {
        let Some(state) = state else {
            missing += 1;
            continue;
        };
        if state.chain.last().is_some_and(|cert| issued_by(cert, old)) {
            presenting_old += 1;
        }
        if state.cas().any(|ca| ca == old) {
            trusting_old += 1;
        }
    }
    format!(
        "of {} proxies, {presenting_old} still present a ca-1 certificate, {trusting_old} still trust ca-1, {missing} hold nothing",
        states.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_minimums_add_up_to_the_total() {
        let options = Options {
            proxies: 50,
            gate: true,
            seed: 1,
            handshakes: 10_000,
            envoy: None,
        };
        assert_eq!(options.phase_minimums(), [2000, 6000, 2000]);
        let tiny = Options {
            handshakes: 1,
            ..options.clone()
        };
        assert_eq!(tiny.phase_minimums(), [1, 1, 1]);
    }

    #[test]
    fn every_step_is_a_valid_mesh() {
        for step in [Step::Ca1, Step::Switch, Step::Ca2] {
            let dir = tempfile::tempdir().expect("a temp dir");
            std::fs::write(dir.path().join("mesh.yaml"), mesh_yaml(step)).expect("writable");
            if let Err(errors) = meshca_config::load_dir(dir.path(), &Default::default()) {
                panic!("{step:?}: {errors:?}\n{}", mesh_yaml(step));
            }
        }
    }

    #[test]
    fn members_spread_over_five_services() {
        let m = members(7);
        assert_eq!(m[3].name, "p-3");
        assert_eq!(m[6].service, "svc-1");
        assert_eq!(m[6].expected_id, "spiffe://default/svc-1");
    }
}
