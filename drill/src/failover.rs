//! `meshca drill failover`: several replicas on one PostgreSQL database serve a fleet of simulated
//! proxies, spread over them; a CA rotation runs, and one replica is killed in its middle. Its proxies
//! move to the others (each proxy lists every replica, as Envoy's SDS cluster does) and the rotation
//! completes. Handshakes between every pair are counted throughout, as in the other drills.
//!
//! The database must be empty of meshca tables: the drill creates them (the replicas do, starting on
//! it) and removes them at the end, leaving it as it found it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use meshca_config::{
    KeystoreSettings, KeystoreType, PostgresSettings, ReplicaSettings, POSTGRES_PASSWORD_ENV,
};
use meshca_db::{Database, DbOptions};
use zeroize::Zeroizing;

use super::agents::Agents;
use super::envoy::{EnvoyRing, RingMember, RingTraffic, Topology};
use super::fleet::{Fleet, Reach};
use super::play::{
    every, is_converged, mint_for, phase_minimums, poll_until, progress, ring_members, steady_ca,
    wait_for_initial_ids, CONVERGE_TIMEOUT, WORKERS,
};
use super::report::{FailoverReport, Header, Outcome, Report};
use super::sandbox::Sandbox;
use super::scenario::Scenario;
use super::scenario::{Edit, Script};
use super::traffic::Traffic;
use meshca_daemon::{Daemon, DaemonOptions};

/// The lease of the drill's replicas: short, so that the killed one counts as gone soon.
const LEASE: Duration = Duration::from_secs(3);

/// What to drill.
#[derive(Clone, Debug)]
pub struct Options {
    /// `postgres://user@host:port/database` of an empty database.
    pub postgres: String,
    /// How many replicas (2 or more); the last one is killed.
    pub replicas: usize,
    /// How many proxies, spread over the replicas.
    pub proxies: usize,
    /// The replicas' ordering gate.
    pub gate: bool,
    /// Seeds apply delays and handshake pairs.
    pub seed: u64,
    /// Minimum handshakes over the three phases (with `envoy`, requests: each a new handshake).
    pub handshakes: u64,
    /// Real Envoy sidecars from this binary instead of simulated proxies; each one's SDS cluster
    /// lists every replica.
    pub envoy: Option<PathBuf>,
    /// With more than 0: the members are workloads on the Workload API behind this many `meshca
    /// agent`s, each listing every replica, the first one starting on the replica that is killed.
    pub agents: usize,
}

/// Plays the drill and reports. An error means it could not start (the database is not empty or
/// not reachable, a replica did not start, the steady state was not reached).
pub async fn run(options: Options) -> anyhow::Result<Report> {
    let database = connect(&options.postgres)?;
    let tables = database.meshca_tables().await?;
    if !tables.is_empty() {
        return Err(anyhow!(
            "--postgres: the database already holds meshca tables ({}); the failover drill needs an empty database, which it leaves empty again",
            tables.join(", ")
        ));
    }
    let result = with_replicas(&options).await;
    let cleaned = database.drop_meshca_tables().await;
    let mut report = result?;
    if let Err(e) = cleaned {
        report.ok = false;
        report.error = Some(format!(
            "could not remove the drill's tables from the database: {e}"
        ));
    }
    Ok(report)
}

fn connect(url: &str) -> anyhow::Result<Database> {
    let password = std::env::var(POSTGRES_PASSWORD_ENV)
        .ok()
        .map(Zeroizing::new);
    Database::connect_as_is(&DbOptions {
        url: url.to_owned(),
        password,
        ca_file: None,
        timeout: Duration::from_secs(10),
        max_connections: 2,
    })
    .map_err(|e| anyhow!("--postgres: {e}"))
}

/// The replicas, each in a sandbox of its own, sharing a key-encryption key; the drill.
async fn with_replicas(options: &Options) -> anyhow::Result<Report> {
    let script = if options.agents > 0 {
        let mut script = Script::new(Scenario::Workload, false).behind_agents(options.agents);
        script.change_phase = "failover";
        script
    } else {
        Script::new(Scenario::Failover, false)
    };
    let uid = rustix::process::geteuid().as_raw();
    let shared = Sandbox::new()?;
    let kek = shared.root().join("kek");
    write_random_key(&kek)?;
    let mut sandboxes = Vec::with_capacity(options.replicas);
    let mut daemons = Vec::with_capacity(options.replicas);
    for index in 0..options.replicas {
        let sandbox = Sandbox::new()?;
        for (name, yaml) in &script.initial_files(options.proxies, uid) {
            sandbox.write_resource(name, yaml)?;
        }
        let mut settings = sandbox.settings();
        settings.keystore = KeystoreSettings {
            kind: KeystoreType::Postgres,
            postgres: Some(PostgresSettings {
                url: options.postgres.clone(),
                password_file: None,
                key_encryption_key_file: Some(kek.clone()),
                ca_file: None,
                timeout: meshca_config::DEFAULT_POSTGRES_TIMEOUT,
                max_connections: meshca_config::DEFAULT_POSTGRES_MAX_CONNECTIONS,
            }),
            pkcs11: None,
        };
        settings.replica = ReplicaSettings {
            name: replica_name(index),
            lease_timeout: meshca_config::Duration(LEASE),
        };
        tracing::info!(replica = %replica_name(index), dir = %sandbox.root().display(), "drill: starting a replica");
        let daemon = Daemon::start(
            settings,
            DaemonOptions {
                gate: options.gate,
                watch_files: false,
            },
        )
        .await
        .with_context(|| format!("replica {} did not start", replica_name(index)))?;
        sandboxes.push(sandbox);
        daemons.push(Some(daemon));
    }
    let result = match &options.envoy {
        Some(envoy) => play_envoy(options, &script, &shared, &sandboxes, &mut daemons, envoy).await,
        None => play(options, &script, &shared, &sandboxes, &mut daemons).await,
    };
    for daemon in daemons.into_iter().flatten() {
        daemon.stop().await;
    }
    result
}

fn replica_name(index: usize) -> String {
    format!("drill-{}", char::from(b'a' + (index % 26) as u8))
}

/// 32 random bytes, readable by the owner only.
fn write_random_key(path: &std::path::Path) -> anyhow::Result<()> {
    use ring::rand::SecureRandom;
    let mut key = Zeroizing::new([0u8; 32]);
    ring::rand::SystemRandom::new()
        .fill(&mut *key)
        .map_err(|_| anyhow!("the system's random source failed"))?;
    std::fs::write(path, key.as_slice())
        .with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict {}", path.display()))
}

async fn play(
    options: &Options,
    script: &Script,
    shared: &Sandbox,
    sandboxes: &[Sandbox],
    daemons: &mut [Option<Daemon>],
) -> anyhow::Result<Report> {
    let targets = daemons
        .iter()
        .flatten()
        .map(|d| {
            d.unix_target()
                .ok_or_else(|| anyhow!("a drill replica has no unix SDS socket"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let minter = daemons[0].as_ref().ok_or_else(|| anyhow!("no replica"))?;
    let mint = |claims: &meshca_auth::Claims| Ok(minter.mint_token(claims)?);
    let agents = if script.agents > 0 {
        let sockets: Vec<PathBuf> = sandboxes
            .iter()
            .map(|s| s.root().join("sds.sock"))
            .collect();
        // Agent 0 starts on the replica that is killed, the others on the ones before it; each
        // lists every replica, as an agent of a fleet lists every server.
        let servers = |index: usize| {
            let first = (sockets.len() - 1 + sockets.len() - index % sockets.len()) % sockets.len();
            sockets[first..]
                .iter()
                .chain(&sockets[..first])
                .cloned()
                .collect()
        };
        Some(Agents::start(shared.root(), script.agents, servers, &mint, &|_| {}).await?)
    } else {
        None
    };
    let reach = Reach {
        targets,
        mint: &mint,
        workload_sockets: agents.as_ref().map(Agents::sockets).unwrap_or_default(),
        stuck: None,
    };
    let specs = script.members(options.proxies);
    let contexts: Vec<String> = script.contexts().into_keys().collect();
    let mut result = match Fleet::start(&reach, &specs, &contexts, options.seed) {
        Ok(mut fleet) => {
            let result = play_fleet(options, script, sandboxes, daemons, &mut fleet).await;
            fleet.stop().await;
            result
        }
        Err(error) => Err(error),
    };
    if let Some(agents) = agents {
        // Behind agents, the streams that move are the agents' own, one per agent.
        if let Ok(Report {
            failover: Some(failover),
            ..
        }) = &mut result
        {
            failover.moved_streams = Some(agents.moved());
        }
        agents.stop().await;
    }
    result
}

async fn play_fleet(
    options: &Options,
    script: &Script,
    sandboxes: &[Sandbox],
    daemons: &mut [Option<Daemon>],
    fleet: &mut Fleet,
) -> anyhow::Result<Report> {
    let members = fleet.members.clone();
    let steady = fleet
        .wait_until(CONVERGE_TIMEOUT, |states| {
            every(&members, states, |m, s| s.spiffe_id == m.initial_id)
        })
        .await?;
    if !steady {
        return Err(anyhow!(
            "the steady state was not reached: within {CONVERGE_TIMEOUT:?} not every proxy applied its identity"
        ));
    }
    let old_ca = steady_ca(&fleet.states())?;
    let victim = daemons.len() - 1;
    tracing::info!(
        proxies = options.proxies,
        replicas = daemons.len(),
        "drill: steady state"
    );

    let [edge, middle, _] = phase_minimums(options.handshakes);
    let mut traffic = Traffic::start(
        members.clone(),
        script.hubs(),
        options.seed,
        WORKERS,
        "steady",
    );
    let mut outcome = Outcome::default();
    let change = async {
        traffic.wait_handshakes(edge).await?;
        traffic.begin_phase(script.change_phase);
        let started = Instant::now();
        let [switch, remove] = &script.edits[..] else {
            return Err(anyhow!("the rotation script has two edits"));
        };
        apply_everywhere(daemons, sandboxes, switch).await?;
        // Killed in the middle of the rotation, as soon as every replica has applied the switch:
        // its proxies may or may not have the new trust yet, and no certificate from the new CA is
        // served yet. A proxy that moves is served, by its new replica, the identity it holds (from
        // the database) with the current trust, and counted by that replica's gate from then on.
        if let Some(daemon) = daemons[victim].take() {
            tracing::info!(replica = %replica_name(victim), "drill: killing a replica");
            daemon.kill();
        }
        apply_everywhere(daemons, sandboxes, remove).await?;
        tracing::info!(
            "drill: every edit applied by the surviving replicas; waiting for the proxies"
        );
        let converged = fleet
            .wait_until(CONVERGE_TIMEOUT, |states| {
                is_converged(&members, &script.hubs(), states, &old_ca)
            })
            .await?;
        if !converged {
            return Err(anyhow!(
                "no convergence within {CONVERGE_TIMEOUT:?}: {}",
                progress(&members, &fleet.states(), &old_ca)
            ));
        }
        outcome.converge_seconds = Some(started.elapsed().as_secs_f64());
        tracing::info!(seconds = ?started.elapsed(), "drill: converged");
        traffic.wait_handshakes(middle).await?;
        traffic.begin_phase("converged");
        traffic.wait_handshakes(edge).await
    };
    if let Err(error) = change.await {
        outcome.error = Some(format!("{error:#}"));
    }
    let phases = traffic.stop().await;
    outcome.nacks = fleet.nacks();
    let header = header(options, script);
    let mut report = Report::new(header, phases, outcome);
    report.failover = Some(FailoverReport {
        replicas: daemons.len(),
        killed: replica_name(victim),
        moved_streams: Some(fleet.moves()),
    });
    Ok(report)
}

fn header(options: &Options, script: &Script) -> Header {
    Header {
        scenario: script.name,
        gate: options.gate,
        proxies: options.proxies,
        envoy: options.envoy.is_some(),
        agents: script.agents,
        seed: options.seed,
        stuck: 0,
    }
}

/// The same with real Envoy sidecars in a ring (see [`super::envoy`]), each listing every replica
/// in its SDS cluster, a quarter of them with their SDS relayed late.
async fn play_envoy(
    options: &Options,
    script: &Script,
    shared: &Sandbox,
    sandboxes: &[Sandbox],
    daemons: &mut [Option<Daemon>],
    envoy: &Path,
) -> anyhow::Result<Report> {
    let sockets: Vec<PathBuf> = sandboxes
        .iter()
        .map(|s| s.root().join("sds.sock"))
        .collect();
    let members: Vec<RingMember> = ring_members(script, options.proxies);
    let minter = daemons[0].as_ref().ok_or_else(|| anyhow!("no replica"))?;
    let mint = |member: &RingMember| mint_for(minter, member);
    let topology = Topology::Ring {
        by_service: script.by_service(),
    };
    let ring = EnvoyRing::start(
        envoy,
        shared.root(),
        &sockets,
        &members,
        topology,
        &mint,
        options.seed,
    )
    .await?;
    let result = play_ring(options, script, sandboxes, daemons, &ring).await;
    ring.stop().await;
    result
}

async fn play_ring(
    options: &Options,
    script: &Script,
    sandboxes: &[Sandbox],
    daemons: &mut [Option<Daemon>],
    ring: &EnvoyRing,
) -> anyhow::Result<Report> {
    wait_for_initial_ids(script, ring).await?;
    let before = ring.presented_serials().await;
    let victim = daemons.len() - 1;
    let [edge, middle, _] = phase_minimums(options.handshakes);
    let mut traffic = RingTraffic::start(ring, options.seed, WORKERS, "steady");
    let mut outcome = Outcome::default();
    let change = async {
        traffic.wait_requests(edge).await?;
        traffic.begin_phase(script.change_phase);
        let started = Instant::now();
        let [switch, remove] = &script.edits[..] else {
            return Err(anyhow!("the rotation script has two edits"));
        };
        apply_everywhere(daemons, sandboxes, switch).await?;
        if let Some(daemon) = daemons[victim].take() {
            tracing::info!(replica = %replica_name(victim), "drill: killing a replica");
            daemon.kill();
        }
        apply_everywhere(daemons, sandboxes, remove).await?;
        tracing::info!(
            "drill: every edit applied by the surviving replicas; waiting for the Envoys"
        );
        let converged = poll_until(
            "every Envoy to present a new certificate from the new CA",
            || async {
                let serials = ring.presented_serials().await;
                let renewed = serials
                    .iter()
                    .zip(&before)
                    .all(|(now, then)| now.is_some() && now != then);
                renewed
                    && survivors_converged(daemons, script.final_issuer, ring.sidecars.len()).await
            },
        )
        .await;
        if let Err(e) = converged {
            let serials = ring.presented_serials().await;
            let renewed = serials
                .iter()
                .zip(&before)
                .filter(|(now, then)| now.is_some() && now != then)
                .count();
            return Err(anyhow!(
                "{e}: {renewed} of {} Envoys present a new certificate; the surviving replicas say {}",
                before.len(),
                survivors(daemons).await
            ));
        }
        outcome.converge_seconds = Some(started.elapsed().as_secs_f64());
        tracing::info!(seconds = ?started.elapsed(), "drill: every Envoy presents its final certificate");
        traffic.wait_requests(middle).await?;
        traffic.begin_phase("converged");
        traffic.wait_requests(edge).await
    };
    if let Err(error) = change.await {
        outcome.error = Some(format!("{error:#}"));
    }
    let phases = traffic.stop().await;
    let mut report = Report::new(header(options, script), phases, outcome);
    report.failover = Some(FailoverReport {
        replicas: daemons.len(),
        killed: replica_name(victim),
        moved_streams: None,
    });
    Ok(report)
}

/// What each surviving replica serves and waits for, for a message.
async fn survivors(daemons: &[Option<Daemon>]) -> String {
    let mut out = Vec::new();
    for daemon in daemons.iter().flatten() {
        match daemon.status.get(meshca_control::Detail::Summary).await {
            Ok(reply) => {
                let issuers: Vec<String> = reply
                    .status
                    .meshes
                    .iter()
                    .map(|m| format!("{:?}", m.proxies_by_issuer))
                    .collect();
                let waits: Vec<String> = reply
                    .status
                    .rollout
                    .iter()
                    .map(|w| format!("{} waits for {:?}", w.step, w.waiting_for))
                    .collect();
                out.push(format!(
                    "proxies by issuer {}, {}",
                    issuers.join(" "),
                    if waits.is_empty() {
                        "no wait".to_owned()
                    } else {
                        waits.join("; ")
                    }
                ));
            }
            Err(e) => out.push(format!("no status ({e})")),
        }
    }
    out.join(" | ")
}

/// Whether the surviving replicas together serve at least `proxies` proxies (an Envoy may hold
/// streams to several replicas), each from `final_issuer`, with no rollout step waiting.
async fn survivors_converged(
    daemons: &[Option<Daemon>],
    final_issuer: Option<&str>,
    proxies: usize,
) -> bool {
    let mut served = 0;
    for daemon in daemons.iter().flatten() {
        let Ok(reply) = daemon.status.get(meshca_control::Detail::Summary).await else {
            return false;
        };
        if !reply.status.rollout.is_empty() {
            return false;
        }
        for mesh in &reply.status.meshes {
            for (issuer, count) in &mesh.proxies_by_issuer {
                if final_issuer.is_some_and(|f| f != issuer) {
                    return false;
                }
                served += count;
            }
        }
    }
    served >= proxies
}

/// Writes `edit`'s files into every live replica's resources and has each apply them, all at once.
async fn apply_everywhere(
    daemons: &[Option<Daemon>],
    sandboxes: &[Sandbox],
    edit: &Edit,
) -> anyhow::Result<()> {
    let mut applying = Vec::new();
    for (daemon, sandbox) in daemons.iter().zip(sandboxes) {
        let Some(daemon) = daemon else { continue };
        for (name, content) in &edit.files {
            match content {
                Some(yaml) => sandbox.write_resource(name, yaml)?,
                None => sandbox.remove_resource(name)?,
            }
        }
        applying.push(daemon.reload_resources());
    }
    for outcome in futures::future::join_all(applying).await {
        if let Err(errors) = outcome? {
            let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
            return Err(anyhow!(
                "a replica rejected the drill's edit ({}): {}",
                edit.what,
                lines.join("; ")
            ));
        }
    }
    tracing::info!(
        edit = edit.what,
        "drill: resource update applied by every live replica"
    );
    Ok(())
}
