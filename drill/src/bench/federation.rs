//! `meshca bench federation` (BENCHMARKS.md): what following federation peers costs the daemon, and how
//! fast a peer's new bundle reaches the streams.
//!
//! - **Cost**: `meshca serve` runs in its own process and follows `--relationships` peers, each a
//!   SPIFFE bundle endpoint (`https_web`) in the bench's process answering its own trust domain's bundle
//!   with a `spiffe_refresh_hint` of `--refresh`. Once every peer has been fetched, the daemon's CPU time
//!   (`/proc/<pid>/stat`) is read over `--seconds`, with the fetches the peers answered meanwhile.
//! - **Reach**: an in-process daemon follows one peer for mesh `default`. `--streams` SDS streams
//!   (`system_trust_bundle`, Envoy-sized first requests) and then as many Workload API `FetchX509SVID`
//!   streams (clients in their own process) are opened and left idle; the peer adds a CA to its bundle
//!   and the daemon fetches it at once (as on SIGHUP). Per stream, the time from just before that fetch
//!   until the stream holds the new CA.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use bytes::Bytes;
use meshca_daemon::{Daemon, Error};
use meshca_federation::export::{
    serve, server_config, EndpointLimits, FetchLog, ServedBundle, WebCertificate,
};
use meshca_federation::{SpiffeBundle, X509Authority};
use meshca_identity::TrustDomain;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose, SanType};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::fleet::{FleetPlan, Reach, Streams};
use super::harness::{self, mesh_yaml, round, seconds, BenchClient, Clients, RunOptions, MESH};
use super::reconciles::Reconciles;
use super::{cpu_seconds, quantile, rss_bytes, sds, workload};
use crate::sandbox::Sandbox;

/// What `meshca bench federation` is asked for, before it is checked.
#[derive(Clone, Debug)]
pub struct FederationArgs {
    /// How many peers the daemon follows in the cost half; 0 measures the daemon following none.
    pub relationships: usize,
    /// The refresh hint the peers serve, in seconds (the daemon polls at it, 30 s at the least).
    pub refresh: f64,
    /// How long the daemon's CPU time is read over, in seconds.
    pub seconds: f64,
    /// How many SDS streams, and then Workload API streams, the new bundle must reach; 0 skips it.
    pub streams: usize,
    /// How long the setup, and then the reach, may take, in seconds.
    pub timeout: f64,
}

impl Default for FederationArgs {
    /// The defaults of `meshca bench federation`.
    fn default() -> FederationArgs {
        FederationArgs {
            relationships: 100,
            refresh: 30.0,
            seconds: 65.0,
            streams: 10_000,
            timeout: 60.0,
        }
    }
}

/// The peers' bundle endpoints, in the bench's process: `https_web` with one certificate for
/// 127.0.0.1 from a CA of the bench's (the relationships' `caFile`), each serving the bundle of its own
/// trust domain `peer-<i>.example`.
struct Peers {
    ca_file: PathBuf,
    endpoints: Vec<Endpoint>,
    refresh: Duration,
    shutdown: CancellationToken,
}

struct Endpoint {
    trust_domain: TrustDomain,
    addr: SocketAddr,
    authorities: Vec<X509Authority>,
    sequence: u64,
    served: watch::Sender<Option<ServedBundle>>,
    fetches: FetchLog,
}

/// A SPIFFE CA of `td`: self-signed, with its trust domain's URI.
fn spiffe_ca(td: &TrustDomain) -> anyhow::Result<X509Authority> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.subject_alt_names = vec![SanType::URI(format!("spiffe://{td}").try_into()?)];
    let cert = params.self_signed(&KeyPair::generate()?)?;
    X509Authority::from_der(cert.der().to_vec(), td).map_err(|e| anyhow!("{td}: {e}"))
}

/// Writes a Web PKI CA (its certificate to `dir/web-ca.pem`) and a server certificate and key for
/// 127.0.0.1 from it; returns their paths.
fn web_certificate(dir: &Path) -> anyhow::Result<(PathBuf, PathBuf, PathBuf)> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate()?;
    let ca = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.subject_alt_names = vec![SanType::IpAddress(Ipv4Addr::LOCALHOST.into())];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let paths = (
        dir.join("web-ca.pem"),
        dir.join("web.pem"),
        dir.join("web-key.pem"),
    );
    std::fs::write(&paths.0, ca.pem())?;
    std::fs::write(&paths.1, cert.pem())?;
    std::fs::write(&paths.2, key.serialize_pem())?;
    Ok(paths)
}

impl Peers {
    async fn start(dir: &Path, count: usize, refresh: Duration) -> anyhow::Result<Peers> {
        let (ca_file, cert_file, key_file) = web_certificate(dir)?;
        let certificate = Arc::new(WebCertificate::load(cert_file, key_file)?);
        let tls = Arc::new(server_config(certificate).map_err(|e| anyhow!("{e}"))?);
        let shutdown = CancellationToken::new();
        let mut endpoints = Vec::with_capacity(count);
        for i in 0..count {
            let trust_domain = TrustDomain::parse(&format!("peer-{i}.example"))
                .map_err(|e| anyhow!("peer {i}: {e}"))?;
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
            let addr = listener.local_addr()?;
            let (served, watched) = watch::channel(None);
            let fetches = FetchLog::default();
            tokio::spawn(serve(
                listener,
                tls.clone(),
                watched,
                EndpointLimits {
                    connections: 16,
                    handshake: Duration::from_secs(10),
                },
                fetches.clone(),
                shutdown.clone(),
            ));
            let mut endpoint = Endpoint {
                authorities: vec![spiffe_ca(&trust_domain)?],
                trust_domain,
                addr,
                sequence: 0,
                served,
                fetches,
            };
            endpoint.publish(refresh);
            endpoints.push(endpoint);
        }
        Ok(Peers {
            ca_file,
            endpoints,
            refresh,
            shutdown,
        })
    }

    /// One FederationRelationship per peer, for mesh `default`.
    fn relationships_yaml(&self) -> String {
        self.endpoints
            .iter()
            .enumerate()
            .map(|(i, e)| {
                format!(
                    "type: FederationRelationship\nname: peer-{i}\nmesh: {MESH}\nspec:\n  trustDomain: {}\n  bundleEndpoint: {{url: \"https://{}/\", profile: https_web, caFile: {}}}\n",
                    e.trust_domain,
                    e.addr,
                    self.ca_file.display()
                )
            })
            .collect::<Vec<_>>()
            .join("---\n")
    }

    /// Bundles answered so far, by every endpoint.
    fn fetches(&self) -> u64 {
        self.endpoints
            .iter()
            .flat_map(|e| e.fetches.peers())
            .map(|(_, f)| f.count)
            .sum()
    }

    /// Whether every endpoint has answered at least once.
    fn all_fetched(&self) -> bool {
        self.endpoints.iter().all(|e| !e.fetches.peers().is_empty())
    }

    /// Adds a new CA to peer `i`'s bundle, under the next sequence.
    fn add_ca(&mut self, i: usize) -> anyhow::Result<()> {
        let endpoint = &mut self.endpoints[i];
        endpoint
            .authorities
            .push(spiffe_ca(&endpoint.trust_domain)?);
        endpoint.publish(self.refresh);
        Ok(())
    }
}

impl Endpoint {
    fn publish(&mut self, refresh: Duration) {
        self.sequence += 1;
        let mut bundle = SpiffeBundle::new(
            self.trust_domain.clone(),
            self.authorities.clone(),
            Vec::new(),
        );
        bundle.sequence = Some(self.sequence);
        bundle.refresh_hint = Some(refresh);
        let json = Bytes::from(bundle.to_json());
        self.served.send_replace(Some(ServedBundle {
            bundle,
            json,
            served_since: Default::default(),
            retired: Default::default(),
        }));
    }
}

impl Drop for Peers {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Polls `done` every 100 ms until it holds; an error naming `what` after `timeout`.
async fn poll(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() > deadline {
            return Err(anyhow!("waited {timeout:?} for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// What following the peers cost the daemon.
#[derive(Debug)]
pub struct Cost {
    /// The window's length.
    pub seconds: f64,
    /// The daemon's CPU time over it.
    pub daemon_cpu_seconds: f64,
    /// Bundles the peers answered over it.
    pub fetches: u64,
    /// The daemon's resident memory at the end.
    pub daemon_rss_bytes: u64,
    /// Seconds until the daemon served and every peer had been fetched once, from its start.
    pub first_fetches_seconds: f64,
}

/// The cost half: the daemon in its own process, following `relationships` peers.
pub async fn measure_cost(
    relationships: usize,
    refresh: Duration,
    window: Duration,
    timeout: Duration,
) -> anyhow::Result<Cost> {
    let sandbox = Sandbox::new()?;
    let peers = Peers::start(sandbox.root(), relationships, refresh).await?;
    sandbox.write_resource("mesh.yaml", &mesh_yaml(false))?;
    if relationships > 0 {
        sandbox.write_resource("federation.yaml", &peers.relationships_yaml())?;
    }
    let root = sandbox.root();
    let config = root.join("meshca.yaml");
    std::fs::write(
        &config,
        format!(
            "dataDir: {data}\nresources: {resources}\nsds:\n  listen: [\"unix://{sds}\"]\nadmin:\n  listen: 127.0.0.1:0\nworkloadApi:\n  listen: [\"unix://{workload}\"]\n",
            data = root.join("data").display(),
            resources = root.join("resources").display(),
            sds = root.join("sds.sock").display(),
            workload = root.join("workload.sock").display(),
        ),
    )?;
    let log = root.join("meshca.log");
    let exe = std::env::current_exe().context("cannot find the meshca executable")?;
    let mut daemon = tokio::process::Command::from(meshca_daemon::children::without_secrets(
        std::process::Command::new(&exe),
    ))
    .arg("serve")
    .arg("--config")
    .arg(&config)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log)?)
    .kill_on_drop(true)
    .spawn()
    .with_context(|| format!("cannot start {} serve", exe.display()))?;
    let pid = daemon
        .id()
        .ok_or_else(|| anyhow!("the daemon exited at once"))?;
    let started = Instant::now();
    let result = async {
        // Serving (its SDS socket is bound once it has loaded and started) and every peer fetched.
        let socket = root.join("sds.sock");
        poll(
            "the daemon to serve and fetch every peer once",
            timeout,
            || (socket.exists() && peers.all_fetched()) || matches!(daemon.try_wait(), Ok(Some(_))),
        )
        .await?;
        if let Ok(Some(status)) = daemon.try_wait() {
            return Err(anyhow!(
                "the daemon exited ({status}): {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        }
        let first_fetches_seconds = started.elapsed().as_secs_f64();
        let (cpu0, fetches0) = (cpu_seconds(Some(pid))?, peers.fetches());
        let window_started = Instant::now();
        tokio::time::sleep(window).await;
        let (cpu1, fetches1) = (cpu_seconds(Some(pid))?, peers.fetches());
        Ok(Cost {
            seconds: window_started.elapsed().as_secs_f64(),
            daemon_cpu_seconds: cpu1 - cpu0,
            fetches: fetches1 - fetches0,
            daemon_rss_bytes: rss_bytes(Some(pid))?,
            first_fetches_seconds,
        })
    }
    .await;
    // SIGTERM: the daemon stops as it would under systemd.
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).ok_or_else(|| anyhow!("pid 0"))?,
        rustix::process::Signal::TERM,
    );
    if tokio::time::timeout(Duration::from_secs(20), daemon.wait())
        .await
        .is_err()
    {
        let _ = daemon.kill().await;
    }
    result
}

/// How a new foreign CA reached one kind of stream.
#[derive(Debug)]
pub struct Reached {
    /// Seconds until every stream held what it asked for.
    pub setup_seconds: f64,
    /// From just before the fetch.
    pub reach: Reach,
    /// The daemon's CPU seconds from the fetch until every stream held the new CA (the bench's process
    /// is the daemon's alone: the clients run in their own).
    pub daemon_cpu_seconds: f64,
    /// The control loop's own time on the change (the streams' fan-out runs outside it), with the
    /// streams' events it caused: their ACKs.
    pub loop_seconds: f64,
    /// Of that, the reconciles of the change itself (`trust`, or `full` and `deferred` when it
    /// reached the proxies), as the daemon's `meshca_reconcile_seconds` accounts for them.
    pub change_seconds: f64,
    /// The reconciles the change cost, by scope, as the daemon accounts for them.
    pub reconciles: Reconciles,
}

/// The reach half: an in-process daemon following one peer, `streams` SDS streams and then as many
/// Workload API streams.
pub async fn measure_reach(run: RunOptions) -> anyhow::Result<(Reached, Reached)> {
    let sandbox = Sandbox::new()?;
    // A long hint: no fetch but the bench's own.
    let mut peers = Peers::start(sandbox.root(), 1, Duration::from_secs(3600)).await?;
    sandbox.write_resource("mesh.yaml", &mesh_yaml(false))?;
    sandbox.write_resource("federation.yaml", &peers.relationships_yaml())?;
    let uid = rustix::process::geteuid().as_raw();
    sandbox.write_resource("workload.yaml", &workload::bench_registration(uid))?;
    let settings = workload::settings_for(&sandbox, &run);
    let socket = settings
        .workload_api
        .listen
        .first()
        .ok_or_else(|| anyhow!("the bench daemon has no Workload API socket"))?
        .clone();
    let td = peers.endpoints[0].trust_domain.clone();
    harness::with_daemon(&sandbox, settings, async |daemon, _, clients| {
        let mut held = daemon.federation.held();
        tokio::time::timeout(run.timeout, held.wait_for(|h| h.contains_key(&td)))
            .await
            .map_err(|_| anyhow!("the daemon did not fetch the peer within {:?}", run.timeout))?
            .map_err(|_| anyhow!("the daemon stopped"))?;
        let target = daemon
            .unix_target()
            .ok_or_else(|| anyhow!("the bench daemon has no unix SDS socket"))?;
        let sds_plan = sds::fleet_plan(daemon, target, &sds::Options::trust_only(run))?;
        let on_sds = reach(daemon, &mut peers, clients, sds_plan, run).await?;
        if let Some(fleet) = clients.take() {
            fleet.stop().await;
        }
        let workload_plan = FleetPlan {
            target: format!("unix://{}", socket.display()),
            connections: run.connections,
            streams: Streams::Workload {
                count: run.streams,
                trust_only: true,
            },
        };
        let on_workload = reach(daemon, &mut peers, clients, workload_plan, run).await?;
        Ok((on_sds, on_workload))
    })
    .await
}

/// Opens `plan`'s streams, leaves them idle, then has the peer add a CA and the daemon fetch it.
async fn reach(
    daemon: &Daemon,
    peers: &mut Peers,
    clients: &mut Option<Clients>,
    plan: FleetPlan,
    run: RunOptions,
) -> anyhow::Result<Reached> {
    let (idle, fleet) = harness::open_idle(plan, run, clients).await?;
    fleet.arm().await?;
    let cpu0 = cpu_seconds(None)?;
    let reconciles_before = Reconciles::read(daemon.admin_addr).await?;
    let loop_before = daemon.loop_health().work();
    peers.add_ca(0)?;
    if !daemon.federation.refresh(&peers.endpoints[0].trust_domain) {
        return Err(anyhow!("the daemon does not follow the peer"));
    }
    let reach = fleet.wait_reached(run.timeout).await?;
    let daemon_cpu_seconds = cpu_seconds(None)? - cpu0;
    let loop_after = sds::loop_idle(daemon, loop_before.turns + 1).await?;
    let reconciles = Reconciles::read(daemon.admin_addr)
        .await?
        .since(&reconciles_before);
    Ok(Reached {
        setup_seconds: idle.setup_seconds,
        reach,
        daemon_cpu_seconds,
        loop_seconds: (loop_after.busy - loop_before.busy).as_secs_f64(),
        change_seconds: ["trust", "full", "deferred"]
            .iter()
            .map(|scope| reconciles.seconds(scope))
            .sum(),
        reconciles,
    })
}

/// What to measure, checked.
#[derive(Clone, Copy, Debug)]
struct Options {
    relationships: usize,
    refresh: Duration,
    window: Duration,
    /// The reach half; `None` skips it.
    reach: Option<RunOptions>,
    timeout: Duration,
}

impl Options {
    fn from_args(args: &FederationArgs) -> Result<Options, Error> {
        let refresh = seconds("--refresh", args.refresh, false)?;
        // The daemon polls at a peer's hint only within these bounds.
        if !(30..=3600).contains(&refresh.as_secs()) || refresh.subsec_nanos() != 0 {
            return Err(Error::invalid_input(format!(
                "--refresh is a whole number of seconds from 30 to 3600 (the daemon polls a peer at its hint within these bounds), got {}",
                args.refresh
            )));
        }
        let reach = (args.streams > 0)
            .then(|| {
                RunOptions::new(
                    (args.streams, None, workload::DEFAULT_CONNECTIONS),
                    (0.0, args.timeout),
                    BenchClient::Process,
                )
            })
            .transpose()?;
        Ok(Options {
            relationships: args.relationships,
            refresh,
            window: seconds("--seconds", args.seconds, false)?,
            reach,
            timeout: seconds("--timeout", args.timeout, false)?,
        })
    }
}

fn latencies(reached: &Reached) -> serde_json::Value {
    let ms = |v: Option<f64>| v.map(|v| round(v, 4));
    let reach = &reached.reach;
    json!({
        "setup_seconds": round(reached.setup_seconds, 3),
        "reached": reach.reached,
        "failed": reach.failed,
        "p50_seconds": ms(quantile(&reach.latencies, 0.5)),
        "p99_seconds": ms(quantile(&reach.latencies, 0.99)),
        "max_seconds": ms(reach.latencies.last().copied()),
        "daemon_cpu_seconds": round(reached.daemon_cpu_seconds, 2),
        "loop_seconds": round(reached.loop_seconds, 6),
        "change_loop_seconds": round(reached.change_seconds, 6),
        "reconciles": reached.reconciles.to_json(),
        "first_error": reach.first_error,
    })
}

fn report(
    options: &Options,
    cost: &Cost,
    reached: Option<&(Reached, Reached)>,
) -> serde_json::Value {
    let share = cost.daemon_cpu_seconds / cost.seconds;
    json!({
        "bench": "federation",
        "relationships": options.relationships,
        "refresh_seconds": options.refresh.as_secs(),
        "window_seconds": round(cost.seconds, 2),
        "first_fetches_seconds": round(cost.first_fetches_seconds, 2),
        "fetches": cost.fetches,
        "fetches_per_second": round(cost.fetches as f64 / cost.seconds, 2),
        "daemon_cpu_seconds": round(cost.daemon_cpu_seconds, 2),
        "daemon_cpu_share_of_a_core": round(share, 4),
        "daemon_cpu_ms_per_fetch": (cost.fetches > 0).then(|| round(cost.daemon_cpu_seconds * 1000.0 / cost.fetches as f64, 2)),
        "daemon_rss_bytes": cost.daemon_rss_bytes,
        "streams": options.reach.map(|r| r.streams),
        "sds": reached.map(|(sds, _)| latencies(sds)),
        "workload": reached.map(|(_, workload)| latencies(workload)),
    })
}

/// Why a run failed: the peers not fetched as often as their hint says, or a stream not reached.
fn failure(options: &Options, cost: &Cost, reached: Option<&(Reached, Reached)>) -> Option<String> {
    // Each peer is fetched at its hint, shortened by up to a tenth: any window holds at least as many
    // of its fetches as whole hints fit in it.
    let expected = options.relationships as u64
        * (cost.seconds / options.refresh.as_secs_f64()).floor() as u64;
    if cost.fetches < expected {
        return Some(format!(
            "the peers answered {} fetches in {:.0} s, fewer than the {expected} their refresh hint asks for",
            cost.fetches, cost.seconds
        ));
    }
    let (sds, workload) = reached?;
    [("SDS", sds), ("Workload API", workload)]
        .into_iter()
        .find_map(|(api, r)| {
            let run = options.reach?;
            harness::unreached(&r.reach, &run).map(|e| format!("{api}: {e}"))
        })
}

/// `meshca bench federation`: prints one JSON line; exit 1 unless the peers were fetched at their hint
/// and the new bundle reached every stream in time.
pub async fn run(args: FederationArgs) -> anyhow::Result<ExitCode> {
    let options = Options::from_args(&args)?;
    let cost = measure_cost(
        options.relationships,
        options.refresh,
        options.window,
        options.timeout,
    )
    .await?;
    let reached = match options.reach {
        Some(run) => Some(measure_reach(run).await?),
        None => None,
    };
    let error = failure(&options, &cost, reached.as_ref());
    Ok(harness::conclude(
        &report(&options, &cost, reached.as_ref()),
        error,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relationships_load_and_bad_sizes_are_refused() {
        let dir = tempfile::tempdir().expect("a directory");
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        let peers = runtime
            .block_on(Peers::start(dir.path(), 3, Duration::from_secs(30)))
            .expect("peers");
        std::fs::write(dir.path().join("mesh.yaml"), mesh_yaml(false)).expect("written");
        std::fs::write(
            dir.path().join("federation.yaml"),
            peers.relationships_yaml(),
        )
        .expect("written");
        let resources = meshca_config::load_dir(dir.path(), &Default::default())
            .unwrap_or_else(|errors| panic!("{errors:?}"));
        assert_eq!(resources.federation_relationships.len(), 3);
        drop(peers);
        let refused =
            |args: FederationArgs| Options::from_args(&args).expect_err("refused").to_string();
        assert!(refused(FederationArgs {
            refresh: 10.0,
            ..FederationArgs::default()
        })
        .contains("--refresh"));
        assert!(refused(FederationArgs {
            seconds: 0.0,
            ..FederationArgs::default()
        })
        .contains("--seconds"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peers_new_ca_reaches_every_sds_and_workload_stream() {
        let mut run = RunOptions::in_process(20, 2);
        run.timeout = Duration::from_secs(60);
        let (sds, workload) = measure_reach(run).await.expect("the bench runs");
        for (api, r) in [("sds", &sds), ("workload", &workload)] {
            assert_eq!(r.reach.failed, 0, "{api}: {:?}", r.reach.first_error);
            assert_eq!(r.reach.reached, 20, "{api}");
            assert_eq!(r.reach.identity_streams, 0, "{api}: trust only");
            assert!(
                r.loop_seconds > 0.0,
                "{api}: the change is a turn of the loop"
            );
            // The daemon accounts for it as a trust reconcile, which decides no proxy.
            assert_eq!(r.reconciles.count("trust"), 1, "{api}: {:?}", r.reconciles);
            assert_eq!(r.reconciles.count("full"), 0, "{api}: {:?}", r.reconciles);
            assert_eq!(
                r.reconciles.count("deferred"),
                0,
                "{api}: {:?}",
                r.reconciles
            );
            assert!(r.change_seconds > 0.0 && r.change_seconds <= r.loop_seconds);
        }
    }
}
