//! `meshca bench sds` (BENCHMARKS.md): an in-process daemon serving mesh `default` from builtin CA ca-1,
//! N `StreamSecrets` streams to it, the daemon's memory before and after they open, then one edit that
//! switches the mesh to ca-2 (ca-1 kept as secondary) and, per stream, the time from the reload call
//! until the stream receives a bundle holding ca-2.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context};
use meshca_config::Settings;

use super::child::ChildFleet;
use super::fleet::{FleetPlan, Reach, StreamFleet, StreamPlan};
use super::{cpu_seconds, quantile, rss_bytes};
use crate::sandbox::Sandbox;
use meshca_daemon::Error;
use meshca_daemon::{Daemon, DaemonOptions};

/// The mesh the bench runs in.
const MESH: &str = "default";
/// How many services the proxies are spread over (`kuma.io/service=svc-<i % SERVICES>`).
const SERVICES: usize = 5;
/// How long the bench's tokens are valid: far longer than any run.
const TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// What to measure.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Concurrent streams.
    pub streams: usize,
    /// HTTP/2 connections carrying them.
    pub connections: usize,
    /// Proxies owning them (round-robin).
    pub proxies: usize,
    /// Every K-th stream also asks for `default`; 0: none.
    pub identity_every: usize,
    /// Extensions listed by the node of each first request.
    pub node_extensions: usize,
    /// How long the streams stay idle before the memory is read.
    pub idle: Duration,
    /// How long setup, and then the rotation, may take.
    pub timeout: Duration,
    /// Where the clients run.
    pub client: BenchClient,
}

impl Options {
    fn from_args(args: &SdsArgs) -> Result<Options, Error> {
        let seconds = |name: &str, value: f64, zero_ok: bool| {
            let ok = value.is_finite() && (value > 0.0 || (zero_ok && value == 0.0));
            ok.then(|| Duration::from_secs_f64(value)).ok_or_else(|| {
                Error::invalid_input(format!(
                    "{name} must be a positive number of seconds, got {value}"
                ))
            })
        };
        // The bench daemon runs with the default limits: say which one a size would hit, rather than
        // watching streams wait for a slot that never comes.
        let limits = Settings::default().limits;
        let per_connection = limits.streams_per_connection as usize;
        let per_proxy = limits.streams_per_proxy as usize;
        let connections = args.connections.unwrap_or_else(|| {
            args.streams
                .div_ceil(per_connection)
                .max(DEFAULT_CONNECTIONS)
        });
        if args.streams == 0 || connections == 0 {
            return Err(Error::invalid_input(
                "--streams and --connections must be at least 1",
            ));
        }
        if args.streams.div_ceil(connections) > per_connection {
            return Err(Error::invalid_input(format!(
                "--streams {} over --connections {connections} puts more than limits.streamsPerConnection ({per_connection}) streams on a connection: use at least --connections {}",
                args.streams,
                args.streams.div_ceil(per_connection)
            )));
        }
        let proxies = args.proxies.unwrap_or(args.streams);
        if !(1..=args.streams).contains(&proxies) {
            return Err(Error::invalid_input(format!(
                "--proxies must be between 1 and --streams ({}), got {proxies}",
                args.streams
            )));
        }
        if args.streams.div_ceil(proxies) > per_proxy {
            return Err(Error::invalid_input(format!(
                "--streams {} over --proxies {proxies} gives a proxy more than limits.streamsPerProxy ({per_proxy}) streams: use at least --proxies {}",
                args.streams,
                args.streams.div_ceil(per_proxy)
            )));
        }
        Ok(Options {
            streams: args.streams,
            connections,
            proxies,
            identity_every: args.identity_every,
            node_extensions: args.node_extensions,
            idle: seconds("--seconds", args.seconds, true)?,
            timeout: seconds("--timeout", args.timeout, false)?,
            client: args.client,
        })
    }
}

/// What `meshca bench sds` is asked for, before it is checked against the daemon's limits.
#[derive(Clone, Debug)]
pub struct SdsArgs {
    /// How many concurrent `StreamSecrets` streams.
    pub streams: usize,
    /// How many HTTP/2 connections carry them; `None`: 50, or as many as the limits need.
    pub connections: Option<usize>,
    /// How many proxies own the streams (round-robin); `None`: one proxy per stream.
    pub proxies: Option<usize>,
    /// Every K-th stream also asks for the proxy's identity; 0: none does.
    pub identity_every: usize,
    /// How many extensions the node of each stream's first request lists.
    pub node_extensions: usize,
    /// How long the streams stay idle before the memory is read, in seconds.
    pub seconds: f64,
    /// How long the setup, and then the rotation, may take, in seconds.
    pub timeout: f64,
    /// Where the simulated proxies run.
    pub client: BenchClient,
}

impl Default for SdsArgs {
    /// The defaults of `meshca bench sds`.
    fn default() -> SdsArgs {
        SdsArgs {
            streams: 10_000,
            connections: None,
            proxies: None,
            identity_every: 4,
            node_extensions: 420,
            seconds: 2.0,
            timeout: 60.0,
            client: BenchClient::Process,
        }
    }
}

/// Where `bench sds` runs its clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchClient {
    /// A child process (`meshca bench sds-client`).
    Process,
    /// The bench's own process, beside the daemon.
    InProcess,
}

/// Connections the bench opens unless more are needed or `--connections` says otherwise.
const DEFAULT_CONNECTIONS: usize = 50;

/// What single events cost while every other stream sits idle: the control loop's own time (turns it
/// spent, whatever else it waited on), which should not grow with the fleet.
#[derive(Debug, Default)]
pub struct EventCosts {
    /// The loop's time on the no-op reload (the files are read on another thread); the median of
    /// [`EVENT_SAMPLES`] reloads.
    pub noop_reload_loop: Duration,
    /// A new proxy opening a connection and a stream: from opening it until its identity arrives (the
    /// median of [`EVENT_SAMPLES`] proxies, like the two below).
    pub connect: Duration,
    /// The loop's time on that connect (registration, one reconcile, one certificate).
    pub connect_loop: Duration,
    /// The loop's time on the ACK of that response.
    pub ack_loop: Duration,
}

/// What one run measured.
#[derive(Debug)]
pub struct Outcome {
    /// Seconds until every stream held its secrets.
    pub setup_seconds: f64,
    /// The bench process before any stream.
    pub rss_before: u64,
    /// The bench process with every stream open and idle.
    pub rss_idle: u64,
    /// The client process with every stream open and idle (clients in their own process only).
    pub client_rss_idle: Option<u64>,
    /// How long `reload_resources` took (load, reconcile, publish).
    pub reload_seconds: f64,
    /// How long a reload of unchanged resources took, with every stream idle (the median of
    /// [`EVENT_SAMPLES`]): a per-event cost that should not grow with the fleet.
    pub noop_reload_seconds: f64,
    /// Whether those reloads published a snapshot (they should not: nothing changed).
    pub noop_reload_published: bool,
    /// What single events cost the control loop with every other stream idle.
    pub events: EventCosts,
    /// How the rotation reached the streams.
    pub reach: Reach,
    /// Snapshots the daemon published while the streams opened, and during the rotation.
    pub generations: (u64, u64),
    /// The CPU seconds the daemon and the client process used from the switch to ca-2 until the rotation
    /// had reached every stream (clients in their own process only: otherwise the two share one).
    pub rotation_cpu: Option<(f64, f64)>,
}

fn backend(name: &str) -> String {
    format!(
        "    - name: {name}\n      type: builtin\n      dpCert: {{rotation: {{expiration: 24h}}}}\n      conf: {{caCert: {{expiration: 1y}}}}\n"
    )
}

/// The Mesh on ca-1 alone, or switched to ca-2 with ca-1 still trusted.
fn mesh_yaml(switched: bool) -> String {
    let (enabled, secondary, backends) = if switched {
        (
            "ca-2",
            "  secondaryBackends: [ca-1]\n",
            backend("ca-1") + &backend("ca-2"),
        )
    } else {
        ("ca-1", "", backend("ca-1"))
    };
    format!("type: Mesh\nname: {MESH}\nmtls:\n  enabledBackend: {enabled}\n{secondary}  backends:\n{backends}")
}

/// One token per proxy; stream `i` belongs to proxy `p-<i % proxies>`.
fn fleet_plan(daemon: &Daemon, target: String, options: &Options) -> anyhow::Result<FleetPlan> {
    let now_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("the system clock is before 1970")?
        .as_secs();
    let mut tokens = Vec::with_capacity(options.proxies);
    for p in 0..options.proxies {
        let name = format!("p-{p}");
        let tags = BTreeMap::from([(
            "kuma.io/service".to_owned(),
            format!("svc-{}", p % SERVICES),
        )]);
        let claims = meshca_auth::Claims::new_dataplane(
            MESH,
            name.clone(),
            BTreeMap::new(),
            tags,
            TOKEN_LIFETIME,
            now_unix,
        )
        .with_context(|| format!("{name}: cannot make token claims"))?;
        tokens.push((format!("{MESH}.{name}"), daemon.mint_token(&claims)?));
    }
    let streams = (0..options.streams)
        .map(|i| {
            let (node_id, token) = &tokens[i % options.proxies];
            StreamPlan {
                node_id: node_id.clone(),
                token: token.clone(),
                identity: options.identity_every > 0 && i % options.identity_every == 0,
            }
        })
        .collect();
    Ok(FleetPlan {
        target,
        connections: options.connections,
        node_extensions: options.node_extensions,
        streams,
    })
}

/// The fleet, wherever it runs.
enum Clients {
    Local(StreamFleet, Instant),
    Child(Box<ChildFleet>),
}

impl Clients {
    async fn start(plan: FleetPlan, options: &Options) -> anyhow::Result<Clients> {
        Ok(match options.client {
            BenchClient::InProcess => {
                Clients::Local(StreamFleet::open(plan).await?, Instant::now())
            }
            BenchClient::Process => {
                Clients::Child(Box::new(ChildFleet::spawn(plan, options.timeout).await?))
            }
        })
    }

    /// Setup seconds and, for a child, its memory.
    async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<(f64, Option<u64>)> {
        match self {
            Clients::Local(fleet, started) => {
                fleet.wait_ready(timeout).await?;
                Ok((started.elapsed().as_secs_f64(), None))
            }
            Clients::Child(child) => {
                let (setup, rss) = child.wait_ready().await?;
                Ok((setup, Some(rss)))
            }
        }
    }

    async fn arm(&mut self) -> anyhow::Result<()> {
        match self {
            Clients::Local(fleet, _) => {
                fleet.arm();
                Ok(())
            }
            Clients::Child(child) => child.arm().await,
        }
    }

    async fn wait_reached(&mut self, timeout: Duration) -> anyhow::Result<Reach> {
        match self {
            Clients::Local(fleet, _) => Ok(fleet.wait_reached(timeout).await),
            Clients::Child(child) => child.wait_reached().await,
        }
    }

    /// The CPU seconds the client process has used so far (clients in their own process only).
    fn cpu_seconds(&self) -> anyhow::Result<Option<f64>> {
        match self {
            Clients::Local(..) => Ok(None),
            Clients::Child(child) => {
                let pid = child
                    .pid()
                    .ok_or_else(|| anyhow!("the client process has exited"))?;
                cpu_seconds(Some(pid)).map(Some)
            }
        }
    }

    async fn stop(self) {
        match self {
            Clients::Local(fleet, _) => fleet.stop().await,
            Clients::Child(child) => child.stop().await,
        }
    }
}

/// Runs the whole bench against a fresh in-process daemon.
pub async fn measure(options: &Options) -> anyhow::Result<Outcome> {
    let sandbox = Sandbox::new()?;
    sandbox.write_resource("mesh.yaml", &mesh_yaml(false))?;
    let daemon = Daemon::start(
        sandbox.settings(),
        DaemonOptions {
            gate: true,
            watch_files: false,
        },
    )
    .await?;
    let mut clients = None;
    let result = play(&daemon, &sandbox, options, &mut clients).await;
    if let Some(clients) = clients {
        clients.stop().await;
    }
    daemon.stop().await;
    result
}

async fn play(
    daemon: &Daemon,
    sandbox: &Sandbox,
    options: &Options,
    clients: &mut Option<Clients>,
) -> anyhow::Result<Outcome> {
    let target = daemon
        .unix_target()
        .ok_or_else(|| anyhow!("the bench daemon has no unix SDS socket"))?;
    let plan = fleet_plan(daemon, target.clone(), options)?;
    // Held until the idle memory is read, so that its freed copy cannot make room for the streams.
    let kept = plan.clone();
    let rss_before = rss_bytes(None)?;
    let generation = || daemon.generation();
    let start_generation = generation();
    let fleet = clients.insert(Clients::start(plan, options).await?);
    let (setup_seconds, client_rss_idle) = fleet.wait_ready(options.timeout).await?;
    tracing::info!(
        streams = options.streams,
        setup_seconds,
        "bench: every stream holds its secrets"
    );
    tokio::time::sleep(options.idle).await;
    let rss_idle = rss_bytes(None)?;
    drop(kept);
    // Single events are measured with the daemon idle too: no proxy left for a later turn of its loop,
    // no certificate being issued (proxies whose streams ask only for trust may get theirs after setup).
    quiescent(daemon, options.timeout).await?;
    // Single events are short and the machine is shared: each is measured several times, one after
    // the other, and the median reported.
    // One event that touches nothing: the same resources again.
    let before_noop = generation();
    let mut events = EventCosts::default();
    let mut noops = Vec::with_capacity(EVENT_SAMPLES);
    for _ in 0..EVENT_SAMPLES {
        let loop_before = daemon.loop_health().work();
        let noop_started = Instant::now();
        reload(daemon, "the unchanged resources").await?;
        let took = noop_started.elapsed();
        let busy = loop_idle(daemon, loop_before.turns + 1).await?.busy - loop_before.busy;
        noops.push((took, busy));
    }
    let middle = |mut values: Vec<Duration>| {
        values.sort();
        values[values.len() / 2]
    };
    let noop_reload_seconds = middle(noops.iter().map(|n| n.0).collect()).as_secs_f64();
    events.noop_reload_loop = middle(noops.iter().map(|n| n.1).collect());
    let noop_reload_published = generation() != before_noop;
    // Each proxy event on a proxy of its own.
    let mut samples = Vec::with_capacity(EVENT_SAMPLES);
    for i in 0..EVENT_SAMPLES {
        samples.push(one_proxy(daemon, &target, &format!("bench-late-{i}")).await?);
    }
    let median = |pick: fn(&EventCosts) -> Duration| middle(samples.iter().map(pick).collect());
    events.connect = median(|e| e.connect);
    events.connect_loop = median(|e| e.connect_loop);
    events.ack_loop = median(|e| e.ack_loop);
    let idle_generation = generation();

    sandbox.write_resource("mesh.yaml", &mesh_yaml(true))?;
    fleet.arm().await?;
    // The bench process is the daemon's alone when the clients run in their own.
    let cpu = |fleet: &Clients| -> anyhow::Result<Option<(f64, f64)>> {
        let Some(client) = fleet.cpu_seconds()? else {
            return Ok(None);
        };
        Ok(Some((cpu_seconds(None)?, client)))
    };
    let cpu_before = cpu(fleet)?;
    let reload_started = Instant::now();
    reload(daemon, "the switch to ca-2").await?;
    let reload_seconds = reload_started.elapsed().as_secs_f64();
    let reach = fleet.wait_reached(options.timeout).await?;
    let rotation_cpu = match (cpu_before, cpu(fleet)?) {
        (Some((daemon0, client0)), Some((daemon1, client1))) => {
            Some((daemon1 - daemon0, client1 - client0))
        }
        _ => None,
    };
    let generations = (
        idle_generation - start_generation,
        generation() - idle_generation,
    );
    Ok(Outcome {
        generations,
        setup_seconds,
        rss_before,
        rss_idle,
        client_rss_idle,
        reload_seconds,
        noop_reload_seconds,
        noop_reload_published,
        events,
        reach,
        rotation_cpu,
    })
}

/// Waits until the control loop has finished at least `turns` turns and is between two: its work then.
async fn loop_idle(daemon: &Daemon, turns: u64) -> anyhow::Result<meshca_control::Work> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let work = daemon.loop_health().work();
        if work.turns >= turns && daemon.loop_health().busy_for(SystemTime::now()).is_none() {
            return Ok(work);
        }
        if Instant::now() > deadline {
            return Err(anyhow!(
                "the control loop did not finish its turn within 30s"
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until the daemon's loop has nothing left to do but wait for events.
async fn quiescent(daemon: &Daemon, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while daemon.loop_health().backlog() > 0 {
        if Instant::now() > deadline {
            return Err(anyhow!(
                "the control loop still had {} proxies or certificates to handle after {timeout:?}",
                daemon.loop_health().backlog()
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// How many times a single event is measured: the no-op reload, and a connect and an ACK (each on a
/// proxy of its own).
const EVENT_SAMPLES: usize = 5;

/// One more proxy, `name`, on a connection of its own, while every other stream is idle: how long until it
/// holds its identity, and what its connect and its ACK cost the control loop.
async fn one_proxy(daemon: &Daemon, target: &str, name: &str) -> anyhow::Result<EventCosts> {
    let mut events = EventCosts::default();
    let now_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("the system clock is before 1970")?
        .as_secs();
    let tags = BTreeMap::from([("kuma.io/service".to_owned(), "late".to_owned())]);
    let claims = meshca_auth::Claims::new_dataplane(
        MESH,
        name,
        BTreeMap::new(),
        tags,
        TOKEN_LIFETIME,
        now_unix,
    )
    .context("cannot make the late proxy's claims")?;
    let token = daemon.mint_token(&claims)?;
    let node_id = format!("{MESH}.{name}");
    let names = vec!["default".to_owned()];
    let before = daemon.loop_health().work();
    let started = Instant::now();
    let client = meshca_sds::SdsClient::connect(target, None, token).await?;
    let (requests, mut responses) = client.open_stream(&node_id, &names, None, 4).await?;
    let response = responses
        .message()
        .await?
        .ok_or_else(|| anyhow!("the late proxy's stream ended without a response"))?;
    events.connect = started.elapsed();
    let connected = loop_idle(daemon, before.turns + 1).await?;
    events.connect_loop = connected.busy - before.busy;
    let ack = envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest {
        version_info: response.version_info.clone(),
        resource_names: names,
        type_url: response.type_url.clone(),
        response_nonce: response.nonce.clone(),
        ..Default::default()
    };
    requests
        .send(ack)
        .await
        .map_err(|_| anyhow!("the late proxy's stream closed before its ACK"))?;
    let acked = loop_idle(daemon, connected.turns + 1).await?;
    events.ack_loop = acked.busy - connected.busy;
    // Closing the stream is one more event; the next sample starts after the loop handled it.
    drop(requests);
    drop(responses);
    loop_idle(daemon, acked.turns + 1).await?;
    Ok(events)
}

/// Has the daemon reload its resources; an error when it rejects them (`what` names the edit).
async fn reload(daemon: &Daemon, what: &str) -> anyhow::Result<()> {
    match daemon.reload_resources().await? {
        Ok(()) => Ok(()),
        Err(errors) => {
            let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
            Err(anyhow!("the daemon rejected {what}: {}", lines.join("; ")))
        }
    }
}

fn round(value: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (value * scale).round() / scale
}

/// The JSON line of a run.
fn report(options: &Options, outcome: &Outcome) -> serde_json::Value {
    let ms = |v: Option<f64>| v.map(|v| round(v, 4));
    let reach = &outcome.reach;
    let per_stream =
        outcome.rss_idle.saturating_sub(outcome.rss_before) as f64 / options.streams as f64;
    serde_json::json!({
        "bench": "sds",
        "streams": options.streams,
        "connections": options.connections,
        "proxies": options.proxies,
        "identity_streams": reach.identity_streams,
        "node_extensions": options.node_extensions,
        "client": match options.client {
            BenchClient::Process => "process",
            BenchClient::InProcess => "in-process",
        },
        "setup_seconds": round(outcome.setup_seconds, 3),
        "rss_before_bytes": outcome.rss_before,
        "rss_idle_bytes": outcome.rss_idle,
        "bytes_per_idle_stream": per_stream.round(),
        "client_rss_idle_bytes": outcome.client_rss_idle,
        "reload_seconds": ms(Some(outcome.reload_seconds)),
        "noop_reload_seconds": ms(Some(outcome.noop_reload_seconds)),
        "noop_reload_published": outcome.noop_reload_published,
        "noop_reload_loop_seconds": round(outcome.events.noop_reload_loop.as_secs_f64(), 6),
        "connect_seconds": round(outcome.events.connect.as_secs_f64(), 6),
        "connect_loop_seconds": round(outcome.events.connect_loop.as_secs_f64(), 6),
        "ack_loop_seconds": round(outcome.events.ack_loop.as_secs_f64(), 6),
        "rotation_p50_seconds": ms(quantile(&reach.latencies, 0.5)),
        "rotation_p99_seconds": ms(quantile(&reach.latencies, 0.99)),
        "rotation_max_seconds": ms(reach.latencies.last().copied()),
        "reached": reach.reached,
        "identity_p50_seconds": ms(quantile(&reach.identity_latencies, 0.5)),
        "identity_p99_seconds": ms(quantile(&reach.identity_latencies, 0.99)),
        "identity_max_seconds": ms(reach.identity_latencies.last().copied()),
        "daemon_cpu_rotation_seconds": outcome.rotation_cpu.map(|(daemon, _)| round(daemon, 2)),
        "client_cpu_rotation_seconds": outcome.rotation_cpu.map(|(_, client)| round(client, 2)),
        "identity_reached": reach.identity_reached,
        "failed": reach.failed,
        "nacks": reach.nacks,
        "responses_rotation": reach.responses,
        "snapshots_setup": outcome.generations.0,
        "snapshots_rotation": outcome.generations.1,
    })
}

/// `meshca bench sds`: prints one JSON line; exit 1 unless the rotation reached every stream in time.
pub async fn run(args: SdsArgs) -> anyhow::Result<ExitCode> {
    let options = Options::from_args(&args)?;
    let outcome = measure(&options).await?;
    println!("{}", report(&options, &outcome));
    let reach = &outcome.reach;
    if reach.reached == options.streams {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "error: the rotation reached {} of {} streams within {:?} ({} failed); first error: {}",
        reach.reached,
        options.streams,
        options.timeout,
        reach.failed,
        reach.first_error.as_deref().unwrap_or("none reported"),
    );
    Ok(ExitCode::from(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_meshes_are_valid() {
        for switched in [false, true] {
            let dir = tempfile::tempdir().expect("a temp dir");
            std::fs::write(dir.path().join("mesh.yaml"), mesh_yaml(switched)).expect("writable");
            if let Err(errors) = meshca_config::load_dir(dir.path(), &Default::default()) {
                panic!("{errors:?}\n{}", mesh_yaml(switched));
            }
        }
    }

    fn options(args: &[&str]) -> Result<Options, Error> {
        let mut parsed = SdsArgs::default();
        for pair in args.chunks(2) {
            let value = pair[1];
            match pair[0] {
                "--streams" => parsed.streams = value.parse().expect("a number"),
                "--connections" => parsed.connections = Some(value.parse().expect("a number")),
                "--proxies" => parsed.proxies = Some(value.parse().expect("a number")),
                other => panic!("no option {other} here"),
            }
        }
        Options::from_args(&parsed)
    }

    #[test]
    fn sizes_that_a_default_limit_would_stop_are_refused_naming_it() {
        let o = options(&["--streams", "100000"]).expect("enough connections by default");
        assert_eq!(o.connections, 98);
        assert_eq!(options(&[]).expect("defaults").connections, 50);
        let e = options(&["--streams", "100000", "--connections", "50"])
            .expect_err("2,000 streams per connection")
            .to_string();
        assert!(
            e.contains("limits.streamsPerConnection (1024)") && e.contains("--connections 98"),
            "{e}"
        );
        let e = options(&["--streams", "10000", "--proxies", "10"])
            .expect_err("1,000 streams per proxy")
            .to_string();
        assert!(
            e.contains("limits.streamsPerProxy (256)") && e.contains("--proxies 40"),
            "{e}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rotation_reaches_every_stream() {
        let options = Options {
            streams: 200,
            connections: 4,
            proxies: 150,
            identity_every: 4,
            node_extensions: 3,
            idle: Duration::ZERO,
            timeout: Duration::from_secs(60),
            client: BenchClient::InProcess,
        };
        let outcome = measure(&options).await.expect("the bench runs");
        let reach = &outcome.reach;
        assert_eq!(reach.failed, 0, "{:?}", reach.first_error);
        assert_eq!(reach.nacks, 0, "{:?}", reach.first_error);
        assert_eq!(reach.reached, 200);
        assert_eq!(reach.latencies.len(), 200);
        assert_eq!(reach.identity_streams, 50);
        assert_eq!(reach.identity_reached, 50);
        assert!(
            reach.responses >= 250,
            "a bundle per stream and a certificate per identity stream: {}",
            reach.responses
        );
        assert!(outcome.rss_idle > 0 && outcome.rss_before > 0);
        assert!(
            !outcome.noop_reload_published,
            "a reload that changes nothing pushes nothing"
        );
        assert!(
            outcome.events.connect > Duration::ZERO && outcome.events.connect_loop > Duration::ZERO,
            "{:?}",
            outcome.events
        );
        assert!(
            outcome.events.ack_loop > Duration::ZERO,
            "{:?}",
            outcome.events
        );
        let line = report(&options, &outcome);
        assert_eq!(line["noop_reload_published"], false);
        assert_eq!(line["reached"], 200);
        assert_eq!(line["bench"], "sds");
    }
}
