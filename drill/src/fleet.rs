//! A fleet of simulated proxies connected to an in-process daemon, and waiting on what they applied.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context};
use meshca_auth::ProxyType;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::proxy::{self, Counters, ProxySpec, ProxyTls};
use super::tls::{ClientIds, PeerCheck};
use super::workload;

/// How long the drill's tokens are valid: far longer than any drill runs.
const TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// One proxy to simulate.
#[derive(Clone, Debug)]
pub struct MemberSpec {
    /// Its mesh (of its token).
    pub mesh: String,
    /// Its name, e.g. `p-3`.
    pub name: String,
    /// Its `kuma.io/service` tag (none for a zone egress).
    pub service: String,
    /// Its labels (fixed in its token).
    pub labels: BTreeMap<String, String>,
    /// The SPIFFE ID it presents in the steady state.
    pub initial_id: String,
    /// The SPIFFE ID it presents once the scenario has converged.
    pub final_id: String,
    /// How clients check it as a server.
    pub check: PeerCheck,
    /// A zone egress (a `zone-egress` token; it validates sidecars with `ALL`) rather than a sidecar.
    pub egress: bool,
    /// Whether the scenario gives it a new certificate.
    pub renews: bool,
}

/// A running simulated proxy, as its peers see it.
#[derive(Clone, Debug)]
pub struct Member {
    /// Its name.
    pub name: String,
    /// The SPIFFE ID it presents in the steady state.
    pub initial_id: String,
    /// The SPIFFE ID it presents once the scenario has converged.
    pub final_id: String,
    /// How clients check it as a server.
    pub check: PeerCheck,
    /// What servers accept from it as a client: its initial or its final ID.
    pub ids: ClientIds,
    /// What it has applied (`None` until it holds every secret it subscribes to).
    pub state: watch::Receiver<Option<Arc<ProxyTls>>>,
}

/// The applied state of every member, in member order.
pub type States = [Option<Arc<ProxyTls>>];

/// The simulated proxies of a drill.
#[derive(Debug)]
pub struct Fleet {
    /// The proxies, in the order given.
    pub members: Vec<Member>,
    applied: watch::Receiver<u64>,
    counters: Arc<Counters>,
    tasks: JoinSet<anyhow::Result<()>>,
}

/// How a fleet reaches the daemon: where SDS listens (one target per replica) and how tokens are
/// minted.
pub struct Reach<'a> {
    /// SDS targets (`unix:///…`): member `i` connects to target `i % n` first and fails over to the
    /// next ones in order.
    pub targets: Vec<String>,
    /// Signs a token for claims.
    pub mint: &'a dyn Fn(&meshca_auth::Claims) -> anyhow::Result<String>,
    /// When not empty, the members are workloads on these Workload API sockets rather than proxies on
    /// SDS: member `i` on socket `i % n`.
    pub workload_sockets: Vec<std::path::PathBuf>,
    /// The first `count` proxies (in member order) withhold their ACKs once `signal` holds `true` (see
    /// [`ProxySpec::withhold`]); workloads ignore it.
    pub stuck: Option<Stuck>,
}

/// Proxies told to withhold their ACKs from some moment on (the drill's `--stuck`).
#[derive(Clone, Debug)]
pub struct Stuck {
    /// How many, from the first member.
    pub count: usize,
    /// Turns `true` when they stop ACKing.
    pub signal: watch::Receiver<bool>,
}

impl std::fmt::Debug for Reach<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reach")
            .field("targets", &self.targets)
            .field("stuck", &self.stuck)
            .finish_non_exhaustive()
    }
}

impl Fleet {
    /// Mints a token per member (its mesh and labels, tag `kuma.io/service`) and connects each as
    /// `reach` says. Member `i` draws its apply delays from `seed ^ i`. Sidecars subscribe to
    /// `contexts` (the validation contexts with SAN matchers they check servers with).
    pub fn start(
        reach: &Reach<'_>,
        specs: &[MemberSpec],
        contexts: &[String],
        seed: u64,
    ) -> anyhow::Result<Fleet> {
        if reach.targets.is_empty() {
            return Err(anyhow!("the drill has no SDS target"));
        }
        let now_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .context("the system clock is before 1970")?
            .as_secs();
        let counters = Arc::new(Counters::default());
        let applied = counters.applied.subscribe();
        let mut tasks = JoinSet::new();
        let mut members = Vec::with_capacity(specs.len());
        for (index, spec) in specs.iter().enumerate() {
            let (state_tx, state) = watch::channel(None);
            members.push(Member {
                name: spec.name.clone(),
                initial_id: spec.initial_id.clone(),
                final_id: spec.final_id.clone(),
                check: spec.check.clone(),
                ids: ClientIds(BTreeSet::from([
                    spec.initial_id.clone(),
                    spec.final_id.clone(),
                ])),
                state,
            });
            if !reach.workload_sockets.is_empty() {
                let socket = reach.workload_sockets[index % reach.workload_sockets.len()].clone();
                let name = spec.name.clone();
                let seed = seed ^ index as u64;
                tasks.spawn(workload::run(
                    socket,
                    name,
                    seed,
                    state_tx,
                    counters.clone(),
                ));
                continue;
            }
            let (kind, tags) = if spec.egress {
                (ProxyType::ZoneEgress, BTreeMap::new())
            } else {
                let tags = BTreeMap::from([("kuma.io/service".to_owned(), spec.service.clone())]);
                (ProxyType::Dataplane, tags)
            };
            let claims = meshca_auth::Claims::new(
                kind,
                spec.mesh.clone(),
                spec.name.clone(),
                spec.labels.clone(),
                tags,
                TOKEN_LIFETIME,
                now_unix,
            )
            .with_context(|| format!("{}: cannot make token claims", spec.name))?;
            let token = (reach.mint)(&claims)?;
            let first = index % reach.targets.len();
            let targets = reach.targets[first..]
                .iter()
                .chain(&reach.targets[..first])
                .cloned()
                .collect();
            tasks.spawn(proxy::run(
                ProxySpec {
                    mesh: spec.mesh.clone(),
                    name: spec.name.clone(),
                    token,
                    targets,
                    seed: seed ^ index as u64,
                    trust: if spec.egress {
                        proxy::ALL
                    } else {
                        proxy::TRUST
                    }
                    .to_owned(),
                    contexts: if spec.egress {
                        Vec::new()
                    } else {
                        contexts.to_vec()
                    },
                    withhold: reach
                        .stuck
                        .as_ref()
                        .filter(|stuck| index < stuck.count)
                        .map(|stuck| stuck.signal.clone()),
                },
                state_tx,
                counters.clone(),
            ));
        }
        Ok(Fleet {
            members,
            applied,
            counters,
            tasks,
        })
    }

    /// The applied state of every member right now.
    pub fn states(&self) -> Vec<Option<Arc<ProxyTls>>> {
        self.members
            .iter()
            .map(|m| m.state.borrow().clone())
            .collect()
    }

    /// Waits until `done` holds for the fleet's applied states, re-checking after every apply.
    /// `Ok(false)` when `timeout` passed first; an error when a proxy's stream ended.
    pub async fn wait_until(
        &mut self,
        timeout: Duration,
        done: impl Fn(&States) -> bool,
    ) -> anyhow::Result<bool> {
        let waiting = async {
            loop {
                // Mark the count seen before looking, so an apply in between wakes us.
                self.applied.borrow_and_update();
                if done(&self.states()) {
                    return Ok(());
                }
                tokio::select! {
                    changed = self.applied.changed() => {
                        changed.map_err(|_| anyhow!("every drill proxy has stopped"))?;
                    }
                    ended = self.tasks.join_next() => return Err(match ended {
                        Some(Ok(Err(error))) => error,
                        Some(Ok(Ok(()))) => anyhow!("a drill proxy stopped"),
                        Some(Err(error)) => anyhow!("a drill proxy task failed: {error}"),
                        None => anyhow!("the drill has no proxies"),
                    }),
                }
            }
        };
        match tokio::time::timeout(timeout, waiting).await {
            Ok(Ok(())) => Ok(true),
            Ok(Err(error)) => Err(error),
            Err(_) => Ok(false),
        }
    }

    /// How many responses the proxies rejected (NACKed) so far.
    pub fn nacks(&self) -> u64 {
        self.counters.nacks.load(Ordering::Relaxed)
    }

    /// How many streams were re-opened on another replica so far.
    pub fn moves(&self) -> u64 {
        self.counters.moves.load(Ordering::Relaxed)
    }

    /// Closes every stream.
    pub async fn stop(mut self) {
        self.tasks.shutdown().await;
    }
}
