//! Drills with real Envoy sidecars (`meshca drill SCENARIO --envoy PATH`): a ring of Envoys started from
//! `meshca bootstrap` output, each with an mTLS inbound listener in front of one small HTTP app and an
//! outbound listener that validates the next Envoy (pinned to its SPIFFE ID, or with the
//! `meshservice:` context of its service); or a star, where every sidecar calls the first Envoy, a zone
//! egress, and validates it with `system_trust_bundle_egress`. HTTP requests through every pair, each on a
//! new upstream connection (a new mTLS handshake). Some Envoys are laggards: a relay in front of meshca's
//! SDS socket delays what meshca sends them by a seeded amount, as slow proxies in a real mesh are late.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::rng::SplitMix64;
use super::traffic::{current_phase, record, PhaseTally, Phases, Recorder};
use meshca_sds::bootstrap::{Bootstrap, Inbound, Outbound, Peer, SdsTarget};

/// How long one request through a pair may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the Envoys may take to start and hold their certificates.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// The shortest and longest delay a laggard's SDS relay adds (seeded in between).
pub const LAG: (Duration, Duration) = (Duration::from_millis(1500), Duration::from_millis(3000));

/// One sidecar of the ring.
#[derive(Debug)]
pub struct Sidecar {
    /// `p-<i>`.
    pub name: String,
    /// The SPIFFE ID it presents in the steady state.
    pub initial_id: String,
    /// The SPIFFE ID it presents once the scenario has converged.
    pub final_id: String,
    /// Whether the scenario gives it a new certificate (its serial must change).
    pub renews: bool,
    /// The MeshService whose `meshservice:` context its outbound validates the next sidecar with.
    pub validates_with: Option<String>,
    admin: SocketAddr,
    /// Where the app sends requests through it, and to whom (none for the hub of a star).
    outbound: Option<(SocketAddr, usize)>,
    child: Child,
    log: PathBuf,
}

/// What the ring is made of: its members' names, services and IDs.
#[derive(Clone, Debug)]
pub struct RingMember {
    /// `p-<i>`.
    pub name: String,
    /// The mesh of its token.
    pub mesh: String,
    /// A zone egress (a `zone-egress` token) rather than a sidecar.
    pub egress: bool,
    /// Its labels (fixed in its token).
    pub labels: std::collections::BTreeMap<String, String>,
    /// Whether the scenario gives it a new certificate.
    pub renews: bool,
    /// Its `kuma.io/service`.
    pub service: String,
    /// The SPIFFE ID it presents in the steady state.
    pub initial_id: String,
    /// The SPIFFE ID it presents once the scenario has converged.
    pub final_id: String,
    /// Its own daemon's SDS socket, when the drill runs daemons that are not replicas of one CA
    /// (federation: one per trust domain); `None` for the ring's replicas.
    pub sds: Option<PathBuf>,
}

/// Who calls whom.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// Member `i` calls member `i + 1` (the last calls the first), validating it with the `meshservice:`
    /// context of its service when `by_service`, else pinned to its initial SPIFFE ID.
    Ring {
        /// Validate by MeshService context.
        by_service: bool,
    },
    /// Every member calls the first one, a zone egress, validating it with `system_trust_bundle_egress`.
    Star,
}

impl Topology {
    /// Whom member `i` of `members` calls, and how it checks that peer.
    fn target(self, i: usize, members: &[RingMember]) -> anyhow::Result<Option<(usize, Peer)>> {
        match self {
            Topology::Ring { by_service } => {
                let next = (i + 1) % members.len();
                let peer = if by_service {
                    Peer::MeshService(members[next].service.clone())
                } else {
                    Peer::SpiffeId(
                        meshca_identity::SpiffeId::parse(&members[next].initial_id)
                            .map_err(|e| anyhow!("{e}"))?,
                    )
                };
                Ok(Some((next, peer)))
            }
            Topology::Star if i == 0 => Ok(None),
            Topology::Star => Ok(Some((0, Peer::ZoneEgress))),
        }
    }
}

/// The Envoys, the app behind them and the laggards' relays.
#[derive(Debug)]
pub struct EnvoyRing {
    /// The sidecars (and the egress, first in a star), in member order.
    pub sidecars: Vec<Sidecar>,
    /// Which sidecars lag, with their delay.
    pub laggards: Vec<(String, Duration)>,
    tasks: JoinSet<()>,
}

/// Mints a token for a member (the daemon's key).
pub type MintToken<'a> = &'a dyn Fn(&RingMember) -> anyhow::Result<String>;

impl EnvoyRing {
    /// Starts the app, the laggards' relays and one Envoy per member, calling each other as `topology`
    /// says, and waits until every Envoy is LIVE and presents its initial SPIFFE ID.
    pub async fn start(
        envoy: &Path,
        dir: &Path,
        sds_sockets: &[PathBuf],
        members: &[RingMember],
        topology: Topology,
        mint: MintToken<'_>,
        seed: u64,
    ) -> anyhow::Result<EnvoyRing> {
        let mut tasks = JoinSet::new();
        let app = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let app_port = app.local_addr()?.port();
        tasks.spawn(serve_app(app));
        let mut rng = SplitMix64::new(seed ^ 0x1a66_0000_0000_0000);
        let count = members.len();
        // About a quarter of the ring lags, at least one sidecar.
        let laggard_count = (count / 4).max(1);
        let mut laggards = Vec::new();
        let ports: Vec<SidecarPorts> = free_ports(3 * count)?
            .chunks_exact(3)
            .map(|p| SidecarPorts {
                admin: p[0],
                inbound: p[1],
                outbound: p[2],
            })
            .collect();
        let mut sidecars = Vec::with_capacity(count);
        for (i, member) in members.iter().enumerate() {
            let target = topology.target(i, members)?;
            // Each sidecar lists every replica, its own first (member i's is replica i mod n), unless
            // it has a daemon of its own.
            let first = i % sds_sockets.len().max(1);
            let mut sockets: Vec<PathBuf> = match &member.sds {
                Some(own) => vec![own.clone()],
                None => sds_sockets[first..]
                    .iter()
                    .chain(&sds_sockets[..first])
                    .cloned()
                    .collect(),
            };
            if i < laggard_count {
                let span = (LAG.1 - LAG.0).as_millis() as u64;
                let delay = LAG.0 + Duration::from_millis(rng.below(span.max(1)));
                relay_sockets(&mut tasks, dir, i, &mut sockets, delay)?;
                laggards.push((member.name.clone(), delay));
            }
            let sds = match <[PathBuf; 1]>::try_from(sockets) {
                Ok([one]) => SdsTarget::Unix(one),
                Err(several) => SdsTarget::UnixReplicas(several),
            };
            let token = mint(member)?;
            let bootstrap = Bootstrap {
                claims: meshca_auth::Verifier::read_unverified(&token)?,
                token,
                sds,
                admin_port: ports[i].admin,
                inbound: vec![Inbound {
                    port: ports[i].inbound,
                    app_port,
                }],
                outbound: target
                    .iter()
                    .map(|(to, peer)| Outbound {
                        local_port: ports[i].outbound,
                        host: "127.0.0.1".to_owned(),
                        port: ports[*to].inbound,
                        peer: peer.clone(),
                    })
                    .collect(),
                one_request_per_connection: true,
            };
            let (child, log) = spawn_envoy(envoy, dir, i, &bootstrap)?;
            sidecars.push(Sidecar::new(member, &target, ports[i], child, log));
        }
        let mut ring = EnvoyRing {
            sidecars,
            laggards,
            tasks,
        };
        ring.wait_until_live().await?;
        Ok(ring)
    }

    /// Waits until every Envoy is LIVE and presents its initial SPIFFE ID; fails when one exits or
    /// the start takes longer than [`START_TIMEOUT`].
    async fn wait_until_live(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        for sidecar in &mut self.sidecars {
            loop {
                if let Ok(Some(status)) = sidecar.child.try_wait() {
                    let log = std::fs::read_to_string(&sidecar.log).unwrap_or_default();
                    return Err(anyhow!("Envoy {} exited ({status}):\n{log}", sidecar.name));
                }
                if sidecar.is_live().await && sidecar.presents(&sidecar.initial_id).await {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(anyhow!(
                        "Envoy {} did not go LIVE holding {} within {START_TIMEOUT:?} (log: {})",
                        sidecar.name,
                        sidecar.initial_id,
                        sidecar.log.display()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// The serial numbers each sidecar presents now (from its admin `/certs`).
    pub async fn presented_serials(&self) -> Vec<Option<String>> {
        let mut serials = Vec::with_capacity(self.sidecars.len());
        for sidecar in &self.sidecars {
            serials.push(sidecar.presented_serial().await);
        }
        serials
    }

    /// Stops every Envoy, the app and the relays.
    pub async fn stop(mut self) {
        for sidecar in &mut self.sidecars {
            let _ = sidecar.child.kill().await;
        }
        self.tasks.shutdown().await;
    }
}

/// The loopback ports of one sidecar: its admin, its inbound listener and its outbound one.
#[derive(Clone, Copy, Debug)]
struct SidecarPorts {
    admin: u16,
    inbound: u16,
    outbound: u16,
}

/// Puts a relay that delays every byte by `delay` in front of each of a laggard's SDS sockets.
fn relay_sockets(
    tasks: &mut JoinSet<()>,
    dir: &Path,
    member: usize,
    sockets: &mut [PathBuf],
    delay: Duration,
) -> anyhow::Result<()> {
    for (r, socket) in sockets.iter_mut().enumerate() {
        let relay = dir.join(format!("relay-{member}-{r}.sock"));
        let listener = UnixListener::bind(&relay)
            .with_context(|| format!("cannot bind the relay {}", relay.display()))?;
        tasks.spawn(relay_with_delay(listener, socket.clone(), delay));
        *socket = relay;
    }
    Ok(())
}

/// Writes member `i`'s bootstrap and starts its Envoy, logging to a file beside it.
fn spawn_envoy(
    envoy: &Path,
    dir: &Path,
    i: usize,
    bootstrap: &Bootstrap,
) -> anyhow::Result<(Child, PathBuf)> {
    let config = dir.join(format!("envoy-{i}.yaml"));
    std::fs::write(&config, bootstrap.to_yaml()?)
        .with_context(|| format!("cannot write {}", config.display()))?;
    let log = dir.join(format!("envoy-{i}.log"));
    let out = std::fs::File::create(&log)?;
    let child = Command::from(meshca_daemon::children::without_secrets(
        std::process::Command::new(envoy),
    ))
    .arg("-c")
    .arg(&config)
    .args([
        "--disable-hot-restart",
        "--concurrency",
        "1",
        "--log-level",
        "error",
    ])
    .stdout(out.try_clone()?)
    .stderr(out)
    .stdin(Stdio::null())
    .kill_on_drop(true)
    .spawn()
    .with_context(|| format!("cannot start Envoy {}", envoy.display()))?;
    Ok((child, log))
}

impl Sidecar {
    /// The sidecar of `member`, started as `child`, calling `target` if it calls anyone.
    fn new(
        member: &RingMember,
        target: &Option<(usize, Peer)>,
        ports: SidecarPorts,
        child: Child,
        log: PathBuf,
    ) -> Sidecar {
        Sidecar {
            name: member.name.clone(),
            initial_id: member.initial_id.clone(),
            final_id: member.final_id.clone(),
            renews: member.renews,
            validates_with: match target {
                Some((_, Peer::MeshService(service))) => Some(service.clone()),
                _ => None,
            },
            admin: SocketAddr::from(([127, 0, 0, 1], ports.admin)),
            outbound: target
                .as_ref()
                .map(|(to, _)| (SocketAddr::from(([127, 0, 0, 1], ports.outbound)), *to)),
            child,
            log,
        }
    }

    async fn is_live(&self) -> bool {
        matches!(admin_get(self.admin, "/ready").await, Some(body) if body.trim() == "LIVE")
    }

    /// Whether the certificate Envoy holds (admin `/certs`) carries `spiffe_id`.
    pub async fn presents(&self, spiffe_id: &str) -> bool {
        admin_get(self.admin, "/certs")
            .await
            .is_some_and(|certs| certs.contains(spiffe_id))
    }

    /// The secret `name` as Envoy applied it (admin `/config_dump`, its active dynamic secrets), as JSON.
    pub async fn applied_secret(&self, name: &str) -> Option<serde_json::Value> {
        let body = admin_get(self.admin, "/config_dump?resource=dynamic_active_secrets").await?;
        let dump: serde_json::Value = serde_json::from_str(&body).ok()?;
        dump["configs"]
            .as_array()?
            .iter()
            .find(|secret| secret["name"] == name)
            .cloned()
    }

    async fn presented_serial(&self) -> Option<String> {
        let body = admin_get(self.admin, "/certs").await?;
        let certs: serde_json::Value = serde_json::from_str(&body).ok()?;
        certs["certificates"].as_array()?.iter().find_map(|entry| {
            entry["cert_chain"][0]["serial_number"]
                .as_str()
                .map(str::to_owned)
        })
    }
}

/// The app behind every inbound listener: 200 with the caller's identity (`x-forwarded-client-cert`).
async fn serve_app(listener: tokio::net::TcpListener) {
    let app = axum::Router::new().fallback(|headers: axum::http::HeaderMap| async move {
        headers
            .get("x-forwarded-client-cert")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    });
    if let Err(error) = axum::serve(listener, app).await {
        tracing::warn!(%error, "drill: the app behind the Envoys stopped");
    }
}

/// Forwards connections from `listener` to meshca's SDS socket, holding back everything meshca sends by
/// `delay` (in order), so the Envoy behind it sees every secret late and ACKs late.
async fn relay_with_delay(listener: UnixListener, upstream: PathBuf, delay: Duration) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            return;
        };
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let Ok(server) = UnixStream::connect(&upstream).await else {
                return;
            };
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            let to_server = tokio::spawn(async move {
                let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
            });
            let (tx, mut rx) = mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
            let reader = tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    match server_read.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            let due = tokio::time::Instant::now() + delay;
                            if tx.send((due, buf[..n].to_vec())).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
            while let Some((due, chunk)) = rx.recv().await {
                tokio::time::sleep_until(due).await;
                if client_write.write_all(&chunk).await.is_err() {
                    break;
                }
            }
            reader.abort();
            to_server.abort();
        });
    }
}

/// Requests through every pair of the ring, counted per phase.
#[derive(Debug)]
pub struct RingTraffic {
    phases: Phases,
    workers: JoinSet<()>,
}

/// Where one worker sends requests: per sidecar, its outbound address, its name and IDs, and the next
/// one's name.
#[derive(Clone, Debug)]
struct Route {
    outbound: SocketAddr,
    caller: String,
    caller_ids: [String; 2],
    callee: String,
}

impl RingTraffic {
    /// Starts `workers` request loops over the ring's pairs, counting into `first_phase`.
    pub fn start(ring: &EnvoyRing, seed: u64, workers: usize, first_phase: &'static str) -> Self {
        let phases = Phases::new(first_phase);
        let routes: Arc<Vec<Route>> = Arc::new(
            ring.sidecars
                .iter()
                .filter_map(|s| {
                    let (outbound, to) = s.outbound?;
                    Some(Route {
                        outbound,
                        caller: s.name.clone(),
                        caller_ids: [s.initial_id.clone(), s.final_id.clone()],
                        callee: ring.sidecars[to].name.clone(),
                    })
                })
                .collect(),
        );
        let mut set = JoinSet::new();
        for worker in 0..workers as u64 {
            let rng = SplitMix64::new(seed ^ 0x2e9e_0000_0000_0000 ^ worker);
            set.spawn(request_loop(routes.clone(), phases.recorder(), rng));
        }
        RingTraffic {
            phases,
            workers: set,
        }
    }

    /// Ends the current phase and counts from now on into `name`.
    pub fn begin_phase(&self, name: &'static str) {
        self.phases.begin_phase(name);
    }

    /// Waits until the current phase has counted at least `requests`.
    pub async fn wait_requests(&mut self, requests: u64) -> anyhow::Result<()> {
        self.phases.wait_count(requests).await
    }

    /// Stops the workers (a request in flight is not counted) and returns every phase's tally.
    pub async fn stop(mut self) -> Vec<PhaseTally> {
        self.workers.shutdown().await;
        self.phases.finish()
    }
}

async fn request_loop(routes: Arc<Vec<Route>>, tally: Recorder, mut rng: SplitMix64) {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http();
    loop {
        let route = &routes[rng.below(routes.len() as u64) as usize];
        let phase = current_phase(&tally);
        let outcome = request(&client, route).await;
        record(&tally, phase, outcome);
    }
}

/// One request `caller → callee`; the error is the report message and the bare reason (Envoy's).
async fn request(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    route: &Route,
) -> Result<(), (String, String)> {
    let pair = format!("{} → {}", route.caller, route.callee);
    let uri: hyper::Uri = match format!("http://{}/", route.outbound).parse() {
        Ok(uri) => uri,
        Err(error) => return Err((format!("{pair}: {error}"), error.to_string())),
    };
    let sent = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let response = client.get(uri).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, String::from_utf8_lossy(&body).into_owned()))
    })
    .await;
    let reason = match sent {
        Err(_) => format!("no response within {REQUEST_TIMEOUT:?}"),
        Ok(Err(error)) => format!("the caller's Envoy did not answer: {error}"),
        Ok(Ok((status, body))) if status.is_success() => {
            // The caller presents its initial or its final SPIFFE ID; the app sees which in the
            // `x-forwarded-client-cert` the callee's Envoy sets (`…;URI=<id>`, to the end or a `;`).
            let seen = body.split(';').find_map(|part| part.strip_prefix("URI="));
            if seen.is_some_and(|id| route.caller_ids.iter().any(|c| c == id)) {
                return Ok(());
            }
            format!("the app saw another caller: {body:.200}")
        }
        Ok(Ok((status, body))) => format!("{status}: {}", body.trim()),
    };
    Err((format!("{pair}: {reason}"), reason))
}

async fn admin_get(addr: SocketAddr, path: &str) -> Option<String> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let uri: hyper::Uri = format!("http://{addr}{path}").parse().ok()?;
    let response = tokio::time::timeout(Duration::from_secs(5), client.get(uri))
        .await
        .ok()?
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some(String::from_utf8_lossy(&body).into_owned())
}

/// `count` distinct free ports. Each stays bound until all are chosen, so the kernel cannot hand one
/// out twice: Envoy binds its listeners with `SO_REUSEPORT`, and two sidecars given the same port would
/// both listen on it and split its connections between them.
fn free_ports(count: usize) -> anyhow::Result<Vec<u16>> {
    let held = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()
        .context("cannot find free ports for the Envoys")?;
    held.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

#[cfg(test)]
mod tests {
    use super::free_ports;

    #[test]
    fn the_ports_given_to_the_envoys_are_all_different() {
        let ports = free_ports(600).expect("free ports");
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), 600, "a port was handed out twice");
        assert!(!distinct.contains(&0));
    }
}
