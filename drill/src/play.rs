//! Plays a [`Script`] against an in-process daemon: the steady state, the edits (waiting where a staged
//! script says so), convergence, with handshakes counted throughout. Simulated proxies by default, real
//! Envoy sidecars with `--envoy`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::anyhow;
use meshca_auth::{Claims, ProxyType};
use meshca_control::{Detail, StatusReply};
use rustls_pki_types::CertificateDer;

use super::agents::Agents;
use super::envoy::{EnvoyRing, RingMember, RingTraffic, Sidecar, Topology};
use super::fleet::{Fleet, Member, Reach, States, Stuck};
use super::pause;
use super::proxy::ProxyTls;
use super::report::{Header, Outcome, Report};
use super::sandbox::Sandbox;
use super::scenario::{Edit, Script, Wait, MESH};
use super::tls::{issued_by, PeerCheck};
use super::traffic::Traffic;
use meshca_daemon::{Daemon, DaemonOptions};

/// Concurrent handshake workers.
pub(super) const WORKERS: usize = 4;
/// How long the fleet may take to reach the steady state, to satisfy a staged wait, and to converge
/// after the edits.
pub(super) const CONVERGE_TIMEOUT: Duration = Duration::from_secs(120);

/// Minimum handshakes per phase out of `handshakes`: a fifth for `steady` and `converged`, the rest for
/// the change; at least one each.
pub(super) fn phase_minimums(handshakes: u64) -> [u64; 3] {
    let edge = (handshakes / 5).max(1);
    let middle = handshakes.saturating_sub(2 * edge).max(1);
    [edge, middle, edge]
}

/// What to drill.
#[derive(Clone, Debug)]
pub struct Options {
    /// How many proxies (at least 2).
    pub proxies: usize,
    /// The daemon's ordering gate.
    pub gate: bool,
    /// Seeds apply delays and handshake pairs.
    pub seed: u64,
    /// Minimum handshakes over the three phases.
    pub handshakes: u64,
    /// Real Envoy sidecars from this binary instead of simulated proxies.
    pub envoy: Option<PathBuf>,
    /// CA keys in this PKCS#11 token instead of the sandbox's keystore.
    pub pkcs11: Option<meshca_config::Pkcs11Settings>,
    /// Once the steady state is reached, wait for a line on standard input before the change (time to
    /// open the console).
    pub pause: bool,
    /// How many simulated proxies (the first ones) withhold their ACKs from the first edit on; fewer
    /// than `proxies`, and 0 with `envoy`.
    pub stuck: usize,
}

impl Options {
    fn phase_minimums(&self) -> [u64; 3] {
        phase_minimums(self.handshakes)
    }

    fn header(&self, script: &Script) -> Header {
        Header {
            scenario: script.name,
            gate: self.gate,
            proxies: self.proxies,
            envoy: self.envoy.is_some(),
            agents: script.agents,
            seed: self.seed,
            stuck: self.stuck,
        }
    }

    /// What an error about convergence adds when proxies are stuck on purpose.
    fn stuck_note(&self) -> String {
        if self.stuck == 0 {
            return String::new();
        }
        format!(
            " ({} proxies withhold their ACKs on purpose: --stuck)",
            self.stuck
        )
    }
}

/// Plays `script` and reports. An error means the drill could not even start (or reach its steady
/// state); problems after that are in the report.
pub async fn run(script: Script, options: Options) -> anyhow::Result<Report> {
    if options.stuck > 0 && options.envoy.is_some() {
        return Err(anyhow!(
            "stuck proxies are simulated ones: they cannot be asked of Envoy sidecars"
        ));
    }
    if options.stuck >= options.proxies {
        return Err(anyhow!(
            "{} stuck proxies out of {}: at least one proxy must still ACK",
            options.stuck,
            options.proxies
        ));
    }
    let (sandbox, daemon) = start_daemon(&script, &options).await?;
    let result = match options.envoy.clone() {
        Some(envoy) => with_envoy(&script, &options, &daemon, &sandbox, envoy).await,
        None => simulated(&script, &options, &daemon, &sandbox).await,
    };
    daemon.stop().await;
    match &options.pkcs11 {
        Some(pkcs11) => {
            let settings = sandbox.settings_with_token(pkcs11);
            let token =
                tokio::task::spawn_blocking(move || crate::token::clean_up(&settings)).await??;
            Ok(result?.with_token(token))
        }
        None => result,
    }
}

/// A sandbox with the steady-state resources and an in-process daemon serving them.
async fn start_daemon(script: &Script, options: &Options) -> anyhow::Result<(Sandbox, Daemon)> {
    let sandbox = Sandbox::new()?;
    tracing::info!(dir = %sandbox.root().display(), scenario = script.name, "drill: starting an in-process daemon");
    let uid = rustix::process::geteuid().as_raw();
    for (name, yaml) in &script.initial_files(options.proxies, uid) {
        sandbox.write_resource(name, yaml)?;
    }
    let settings = match &options.pkcs11 {
        Some(pkcs11) => sandbox.settings_with_token(pkcs11),
        None => sandbox.settings(),
    };
    let daemon = Daemon::start(
        settings,
        DaemonOptions {
            gate: options.gate,
            watch_files: false,
        },
    )
    .await?;
    eprintln!(
        "drill: watch it in the console at http://{}/ (read-only, live; gone when the drill ends)",
        daemon.admin_addr
    );
    Ok((sandbox, daemon))
}

async fn simulated(
    script: &Script,
    options: &Options,
    daemon: &Daemon,
    sandbox: &Sandbox,
) -> anyhow::Result<Report> {
    let specs = script.members(options.proxies);
    let contexts: Vec<String> = script.contexts().into_keys().collect();
    let target = daemon
        .unix_target()
        .ok_or_else(|| anyhow!("the drill daemon has no unix SDS socket"))?;
    let mint = |claims: &meshca_auth::Claims| Ok(daemon.mint_token(claims)?);
    let agents = if script.agents > 0 {
        let sds = daemon
            .sds_addrs
            .iter()
            .find_map(unix_path)
            .ok_or_else(|| anyhow!("the drill daemon has no unix SDS socket"))?;
        let servers = |_| vec![sds.clone()];
        Some(Agents::start(sandbox.root(), script.agents, servers, &mint, &|_| {}).await?)
    } else {
        None
    };
    let workload_sockets = match &agents {
        Some(agents) => agents.sockets(),
        None if script.workloads => vec![daemon
            .workload_addrs
            .iter()
            .find_map(unix_path)
            .ok_or_else(|| anyhow!("the drill daemon has no Workload API socket"))?],
        None => Vec::new(),
    };
    // Flipped right before the first edit: from then on the stuck proxies withhold their ACKs.
    let (withhold, signal) = tokio::sync::watch::channel(false);
    let reach = Reach {
        targets: vec![target],
        mint: &mint,
        workload_sockets,
        stuck: (options.stuck > 0).then(|| Stuck {
            count: options.stuck,
            signal,
        }),
    };
    let result = match Fleet::start(&reach, &specs, &contexts, options.seed) {
        Ok(mut fleet) => {
            let result =
                play_simulated(script, options, daemon, sandbox, &mut fleet, &withhold).await;
            fleet.stop().await;
            result
        }
        Err(error) => Err(error),
    };
    if let Some(agents) = agents {
        agents.stop().await;
    }
    result
}

pub(super) fn unix_path(addr: &meshca_serve::BoundAddr) -> Option<std::path::PathBuf> {
    match addr {
        meshca_serve::BoundAddr::Unix(path) => Some(path.clone()),
        _ => None,
    }
}

async fn play_simulated(
    script: &Script,
    options: &Options,
    daemon: &Daemon,
    sandbox: &Sandbox,
    fleet: &mut Fleet,
    withhold: &tokio::sync::watch::Sender<bool>,
) -> anyhow::Result<Report> {
    let members = fleet.members.clone();
    // Steady: every proxy presents its initial ID, and accepts every service's initial ID (proxies that
    // connected early learn the IDs of later ones from pushes they apply one by one).
    let steady = fleet
        .wait_until(CONVERGE_TIMEOUT, |states| {
            every(&members, states, |m, s| {
                s.spiffe_id == m.initial_id && accepts(script, s, Stage::Initial)
            })
        })
        .await?;
    if !steady {
        return Err(anyhow!(
            "the steady state was not reached: within {CONVERGE_TIMEOUT:?} not every proxy applied its identity (e.g. {}) and its trust",
            members.first().map_or("", |m| m.initial_id.as_str())
        ));
    }
    let old_ca = steady_ca(&fleet.states())?;
    tracing::info!(proxies = options.proxies, "drill: steady state");

    let [steady_min, change_min, converged_min] = options.phase_minimums();
    let mut traffic = Traffic::start(
        members.clone(),
        script.hubs(),
        options.seed,
        WORKERS,
        "steady",
    );
    let mut outcome = Outcome::default();
    let change = async {
        traffic.wait_handshakes(steady_min).await?;
        if options.pause {
            pause::for_enter(|| std::io::stdin().lock()).await;
        }
        traffic.begin_phase(script.change_phase);
        let started = Instant::now();
        if options.stuck > 0 {
            let names: Vec<&str> = members[..options.stuck]
                .iter()
                .map(|m| m.name.as_str())
                .collect();
            eprintln!(
                "drill: {} proxies ({}) now withhold their ACKs on purpose (--stuck): the daemon waits for them until rollout.ackTimeout, and the drill will not converge",
                options.stuck,
                names.join(", ")
            );
            withhold.send_replace(true);
        }
        for edit in &script.edits {
            apply(daemon, sandbox, edit).await?;
            if let Some(wait) = &edit.wait {
                let done = fleet
                    .wait_until(CONVERGE_TIMEOUT, |states| {
                        every(&members, states, |m, s| satisfies(wait, script, m, s))
                    })
                    .await?;
                if !done {
                    return Err(anyhow!(
                        "staged: within {CONVERGE_TIMEOUT:?} not every proxy reached {wait:?}{}",
                        options.stuck_note()
                    ));
                }
                tracing::info!(?wait, "drill: every proxy is there");
            }
        }
        tracing::info!("drill: every edit applied by the daemon; waiting for the proxies");
        let converged = fleet
            .wait_until(CONVERGE_TIMEOUT, |states| {
                is_converged(&members, &script.hubs(), states, &old_ca)
            })
            .await?;
        if !converged {
            return Err(anyhow!(
                "no convergence within {CONVERGE_TIMEOUT:?}: {}; the daemon counts proxies by issuer as {}{}",
                progress(&members, &fleet.states(), &old_ca),
                issuers(daemon).await,
                options.stuck_note()
            ));
        }
        outcome.converge_seconds = Some(started.elapsed().as_secs_f64());
        tracing::info!(seconds = ?started.elapsed(), "drill: converged");
        traffic.wait_handshakes(change_min).await?;
        traffic.begin_phase("converged");
        traffic.wait_handshakes(converged_min).await
    };
    if let Err(error) = change.await {
        outcome.error = Some(format!("{error:#}"));
    }
    let phases = traffic.stop().await;
    outcome.nacks = fleet.nacks();
    Ok(Report::new(options.header(script), phases, outcome))
}

/// Whether `check` holds for every member's applied state (none missing).
pub(super) fn every(
    members: &[Member],
    states: &States,
    check: impl Fn(&Member, &ProxyTls) -> bool,
) -> bool {
    members
        .iter()
        .zip(states)
        .all(|(member, state)| state.as_ref().is_some_and(|s| check(member, s)))
}

/// The initial or the final IDs of a script.
#[derive(Clone, Copy, Debug)]
pub(super) enum Stage {
    Initial,
    Final,
}

/// The `stage` SPIFFE ID of the servers checked with `context`, as the script says.
fn id_of(script: &Script, context: &str, stage: Stage) -> Option<String> {
    let (initial, last) = script.contexts().remove(context)?;
    Some(match stage {
        Stage::Initial => initial,
        Stage::Final => last,
    })
}

/// Whether every context with SAN matchers a proxy applied accepts the `stage` ID of its servers (a
/// zone egress applies none).
fn accepts(script: &Script, state: &ProxyTls, stage: Stage) -> bool {
    script
        .contexts()
        .into_iter()
        .all(|(name, (initial, last))| {
            let id = match stage {
                Stage::Initial => initial,
                Stage::Final => last,
            };
            state
                .services
                .get(&name)
                .is_none_or(|context| context.ids.contains(&id))
        })
}

/// Whether a proxy has reached what a staged edit waits for.
fn satisfies(wait: &Wait, script: &Script, member: &Member, state: &ProxyTls) -> bool {
    match wait {
        Wait::FinalIdsAccepted => accepts(script, state, Stage::Final),
        Wait::DomainTrusted(domain) => state.bundle.contains_key(*domain),
        Wait::FinalIdPresented => state.spiffe_id == member.final_id,
    }
}

/// Writes and removes the files of `edit` (or changes `defaults.mesh`) and has the daemon apply them
/// (snapshot published, not yet delivered).
async fn apply(daemon: &Daemon, sandbox: &Sandbox, edit: &Edit) -> anyhow::Result<()> {
    for (name, content) in &edit.files {
        match content {
            Some(yaml) => sandbox.write_resource(name, yaml)?,
            None => sandbox.remove_resource(name)?,
        }
    }
    let outcome = match edit.default_mesh {
        Some(mesh) => daemon.set_default_mesh(Some(mesh.to_owned())).await?,
        None => daemon.reload_resources().await?,
    };
    match outcome {
        Ok(()) => {
            tracing::info!(edit = edit.what, "drill: resource update applied");
            Ok(())
        }
        Err(errors) => {
            let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
            Err(anyhow!(
                "the daemon rejected the drill's edit ({}): {}",
                edit.what,
                lines.join("; ")
            ))
        }
    }
}

/// The CA that issued the first proxy's certificate in the steady state: the one the scenario replaces.
pub(super) fn steady_ca(states: &States) -> anyhow::Result<CertificateDer<'static>> {
    let first = states
        .first()
        .and_then(Option::as_ref)
        .ok_or_else(|| anyhow!("steady state: the first proxy holds nothing"))?;
    let top = first
        .chain
        .last()
        .ok_or_else(|| anyhow!("steady state: the first proxy's chain is empty"))?;
    first
        .cas()
        .find(|ca| issued_by(top, ca))
        .cloned()
        .ok_or_else(|| {
            anyhow!("steady state: the first proxy does not trust the CA of its own certificate")
        })
}

/// Whether `state` trusts `ca` anywhere: its bundle or a context with SAN matchers.
pub(super) fn trusts(state: &ProxyTls, ca: &CertificateDer<'_>) -> bool {
    state.cas().any(|c| c == ca)
        || state
            .services
            .values()
            .flat_map(|context| context.bundle.values().flatten())
            .any(|c| c == ca)
}

/// Converged: every proxy presents its final SPIFFE ID in a certificate from a CA it trusts, neither
/// presents a certificate from the old CA nor trusts it any more, and every pair the traffic makes would
/// handshake now (the client's check accepts the server's certificate, the server's bundle the client's).
pub(super) fn is_converged(
    members: &[Member],
    hubs: &[usize],
    states: &States,
    old: &CertificateDer<'_>,
) -> bool {
    let Some(states) = states
        .iter()
        .map(Option::as_deref)
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    // The CA each proxy's certificate comes from, found in its own bundle.
    let Some(issuers) = states
        .iter()
        .map(|state| {
            let top = state.chain.last()?;
            state.cas().find(|ca| issued_by(top, ca))
        })
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    let settled = members
        .iter()
        .zip(&states)
        .zip(&issuers)
        .all(|((member, state), issuer)| {
            state.spiffe_id == member.final_id && *issuer != old && !trusts(state, old)
        });
    // The pairs the traffic makes: any two proxies, or any proxy calling a hub.
    let all: Vec<usize> = (0..members.len()).collect();
    let servers = if hubs.is_empty() { &all[..] } else { hubs };
    let is_client = |c: usize| !hubs.contains(&c);
    settled
        && servers.iter().all(|&s| {
            (0..members.len())
                .filter(|&c| c != s && is_client(c))
                .all(|c| {
                    let (client, server) = (states[c], states[s]);
                    let accepted = match &members[s].check {
                        PeerCheck::Exact(id) => {
                            *id == server.spiffe_id && client.cas().any(|ca| ca == issuers[s])
                        }
                        PeerCheck::Context(name) => {
                            client.services.get(name).is_some_and(|context| {
                                context.ids.contains(&server.spiffe_id)
                                    && context.bundle.values().flatten().any(|ca| ca == issuers[s])
                            })
                        }
                    };
                    accepted && server.cas().any(|ca| ca == issuers[c])
                })
        })
}

/// Where the fleet stands, for a timeout message.
pub(super) fn progress(members: &[Member], states: &States, old: &CertificateDer<'_>) -> String {
    let mut missing = 0;
    let mut presenting_old = 0;
    let mut trusting_old = 0;
    let mut not_final = 0;
    for (member, state) in members.iter().zip(states) {
        let Some(state) = state else {
            missing += 1;
            continue;
        };
        if state.chain.last().is_some_and(|cert| issued_by(cert, old)) {
            presenting_old += 1;
        }
        if trusts(state, old) {
            trusting_old += 1;
        }
        if state.spiffe_id != member.final_id {
            not_final += 1;
        }
    }
    format!(
        "of {} proxies, {presenting_old} still present a certificate from the old CA, {trusting_old} still trust it, {not_final} do not present their final SPIFFE ID, {missing} hold nothing",
        states.len()
    )
}

/// The daemon's count of connected proxies by issuer, for messages.
async fn issuers(daemon: &Daemon) -> String {
    let status = match daemon.status.get(Detail::Summary).await {
        Ok(reply) => reply.status,
        Err(e) => return format!("unknown ({e})"),
    };
    status
        .meshes
        .iter()
        .find(|m| m.name == MESH)
        .map(|m| format!("{:?}", m.proxies_by_issuer))
        .unwrap_or_default()
}

/// The daemon's view: no rollout step waits, and (when the script names one issuer for everybody) every
/// connected proxy of `mesh` holds a certificate from `final_issuer`.
pub(super) async fn daemon_converged(
    daemon: &Daemon,
    mesh: &str,
    final_issuer: Option<&str>,
    proxies: usize,
) -> bool {
    let Ok(StatusReply { status, .. }) = daemon.status.get(Detail::Summary).await else {
        return false;
    };
    let Some(mesh) = status.meshes.iter().find(|m| m.name == mesh) else {
        return false;
    };
    let issuers_done = final_issuer.is_none_or(|issuer| {
        mesh.proxies_by_issuer == BTreeMap::from([(issuer.to_owned(), proxies)])
    });
    issuers_done && status.rollout.is_empty()
}

/// The same scenario with real Envoy sidecars in a ring (see [`super::envoy`]).
async fn with_envoy(
    script: &Script,
    options: &Options,
    daemon: &Daemon,
    sandbox: &Sandbox,
    envoy: PathBuf,
) -> anyhow::Result<Report> {
    let members = ring_members(script, options.proxies);
    let mint = |member: &RingMember| mint_for(daemon, member);
    let topology = if script.hubs().is_empty() {
        Topology::Ring {
            by_service: script.by_service(),
        }
    } else {
        Topology::Star
    };
    let socket = sandbox.root().join("sds.sock");
    let ring = EnvoyRing::start(
        &envoy,
        sandbox.root(),
        &[socket],
        &members,
        topology,
        &mint,
        options.seed,
    )
    .await?;
    for (name, delay) in &ring.laggards {
        tracing::info!(proxy = %name, ?delay, "drill: this Envoy's SDS is relayed late");
    }
    let result = play_envoy(script, options, daemon, sandbox, &ring).await;
    ring.stop().await;
    result
}

/// The script's proxies as Envoy sidecars.
pub(super) fn ring_members(script: &Script, proxies: usize) -> Vec<RingMember> {
    script
        .members(proxies)
        .into_iter()
        .map(|m| RingMember {
            name: m.name,
            mesh: m.mesh,
            egress: m.egress,
            labels: m.labels,
            renews: m.renews,
            service: m.service,
            initial_id: m.initial_id,
            final_id: m.final_id,
            sds: None,
        })
        .collect()
}

/// A token for `member`, signed with `daemon`'s key.
pub(super) fn mint_for(daemon: &Daemon, member: &RingMember) -> anyhow::Result<String> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let (kind, tags) = if member.egress {
        (ProxyType::ZoneEgress, BTreeMap::new())
    } else {
        let tags = BTreeMap::from([("kuma.io/service".to_owned(), member.service.clone())]);
        (ProxyType::Dataplane, tags)
    };
    let claims = Claims::new(
        kind,
        &member.mesh,
        &member.name,
        member.labels.clone(),
        tags,
        Duration::from_secs(24 * 3600),
        now,
    )?;
    Ok(daemon.mint_token(&claims)?)
}

async fn play_envoy(
    script: &Script,
    options: &Options,
    daemon: &Daemon,
    sandbox: &Sandbox,
    ring: &EnvoyRing,
) -> anyhow::Result<Report> {
    wait_for_initial_ids(script, ring).await?;
    let before = ring.presented_serials().await;
    let [steady_min, change_min, converged_min] = options.phase_minimums();
    let mut traffic = RingTraffic::start(ring, options.seed, WORKERS, "steady");
    let mut outcome = Outcome::default();
    let change = async {
        traffic.wait_requests(steady_min).await?;
        if options.pause {
            pause::for_enter(|| std::io::stdin().lock()).await;
        }
        traffic.begin_phase(script.change_phase);
        let started = Instant::now();
        for edit in &script.edits {
            apply(daemon, sandbox, edit).await?;
            if let Some(wait) = &edit.wait {
                poll_until(&format!("every Envoy to reach {wait:?}"), || async {
                    for sidecar in &ring.sidecars {
                        if !envoy_satisfies(wait, sidecar, script).await {
                            return false;
                        }
                    }
                    true
                })
                .await?;
                tracing::info!(?wait, "drill: every Envoy is there");
            }
        }
        tracing::info!("drill: every edit applied by the daemon; waiting for the Envoys");
        let proxies = ring.sidecars.len();
        let converged = poll_until("every Envoy to present its final identity", || async {
            let serials = ring.presented_serials().await;
            let renewed = serials
                .iter()
                .zip(&before)
                .zip(&ring.sidecars)
                .all(|((now, then), sidecar)| now.is_some() && (!sidecar.renews || now != then));
            let mut finals = true;
            for sidecar in &ring.sidecars {
                finals = finals && sidecar.presents(&sidecar.final_id).await;
            }
            renewed && finals && daemon_converged(daemon, MESH, script.final_issuer, proxies).await
        })
        .await;
        if let Err(e) = converged {
            return Err(anyhow!(
                "{e}; the daemon counts proxies by issuer as {}",
                issuers(daemon).await
            ));
        }
        outcome.converge_seconds = Some(started.elapsed().as_secs_f64());
        tracing::info!(seconds = ?started.elapsed(), "drill: every Envoy presents its final certificate");
        traffic.wait_requests(change_min).await?;
        traffic.begin_phase("converged");
        traffic.wait_requests(converged_min).await
    };
    if let Err(error) = change.await {
        outcome.error = Some(format!("{error:#}"));
    }
    let phases = traffic.stop().await;
    Ok(Report::new(options.header(script), phases, outcome))
}

/// Whether an Envoy has reached what a staged edit waits for, from its admin interface.
async fn envoy_satisfies(wait: &Wait, sidecar: &Sidecar, script: &Script) -> bool {
    match wait {
        Wait::FinalIdsAccepted => envoy_accepts(script, sidecar, Stage::Final).await,
        Wait::DomainTrusted(domain) => sidecar
            .applied_secret("system_trust_bundle")
            .await
            .is_some_and(|bundle| names_domain(&bundle, domain)),
        Wait::FinalIdPresented => sidecar.presents(&sidecar.final_id).await,
    }
}

/// Waits until every Envoy of `ring` accepts its peers' initial SPIFFE IDs (see [`envoy_accepts`]): the
/// steady state a drill starts from.
pub(super) async fn wait_for_initial_ids(script: &Script, ring: &EnvoyRing) -> anyhow::Result<()> {
    poll_until(
        "every Envoy to accept its peers' initial SPIFFE IDs",
        || async {
            for sidecar in &ring.sidecars {
                if !envoy_accepts(script, sidecar, Stage::Initial).await {
                    return false;
                }
            }
            true
        },
    )
    .await
}

/// Whether the `meshservice:` context an Envoy's outbound validates with (Envoy asks only for what a
/// cluster uses) accepts the `stage` ID of its service. True for a sidecar that pins an ID.
pub(super) async fn envoy_accepts(script: &Script, sidecar: &Sidecar, stage: Stage) -> bool {
    let Some(service) = &sidecar.validates_with else {
        return true;
    };
    let name = format!("meshservice:{service}");
    let Some(id) = id_of(script, &name, stage) else {
        return false;
    };
    let id = format!("\"{id}\"");
    sidecar
        .applied_secret(&name)
        .await
        .is_some_and(|context| context.to_string().contains(&id))
}

/// Whether a secret's JSON holds an object named `domain` (a SPIFFE validator trust domain entry).
pub(super) fn names_domain(value: &serde_json::Value, domain: &str) -> bool {
    match value {
        serde_json::Value::Object(map) => {
            map.get("name").is_some_and(|name| name == domain)
                || map.values().any(|v| names_domain(v, domain))
        }
        serde_json::Value::Array(items) => items.iter().any(|v| names_domain(v, domain)),
        _ => false,
    }
}

/// Polls `done` every 100 ms (Envoy's admin interface has nothing to wait on) until it holds, or fails
/// after [`CONVERGE_TIMEOUT`] naming `what`.
pub(super) async fn poll_until<F, Fut>(what: &str, done: F) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        if done().await {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(anyhow!("waited {CONVERGE_TIMEOUT:?} for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
#[path = "stuck_tests.rs"]
mod stuck_tests;

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
            pkcs11: None,
            pause: false,
            stuck: 0,
        };
        assert_eq!(options.phase_minimums(), [2000, 6000, 2000]);
        let tiny = Options {
            handshakes: 1,
            ..options.clone()
        };
        assert_eq!(tiny.phase_minimums(), [1, 1, 1]);
    }

    #[test]
    fn a_trust_domain_is_found_anywhere_in_a_secret() {
        let secret = serde_json::json!({
            "name": "system_trust_bundle",
            "secret": {"validation_context": {"custom_validator_config": {"typed_config": {
                "trust_domains": [{"name": "old.example"}, {"name": "new.example"}]
            }}}}
        });
        assert!(names_domain(&secret, "new.example"));
        assert!(!names_domain(&secret, "other.example"));
    }
}
