//! `meshca bench sds` (BENCHMARKS.md): an in-process daemon serving mesh `default` from builtin CA ca-1,
//! N `StreamSecrets` streams to it, the daemon's memory before and after they open, then one edit that
//! switches the mesh to ca-2 (ca-1 kept as secondary) and, per stream, the time from the reload call
//! until the stream receives a bundle holding ca-2.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context};
use meshca_config::Settings;

use super::console::{ConsoleClients, Followed};
use super::fleet::{FleetPlan, StreamPlan, Streams};
use super::harness::{self, mesh_yaml, reload, round, Clients, Idle, Rotation, RunOptions, MESH};
use crate::sandbox::Sandbox;
pub use harness::BenchClient;
use meshca_daemon::Daemon;
use meshca_daemon::Error;
/// How many services the proxies are spread over (`kuma.io/service=svc-<i % SERVICES>`).
const SERVICES: usize = 5;
/// How long the bench's tokens are valid: far longer than any run.
const TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// What to measure.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Proxies owning them (round-robin).
    pub proxies: usize,
    /// Every K-th stream also asks for `default`; 0: none.
    pub identity_every: usize,
    /// Extensions listed by the node of each first request.
    pub node_extensions: usize,
    /// Console clients following the daemon's web console through the whole run.
    pub console_clients: usize,
    /// How it runs.
    pub run: RunOptions,
}

impl Options {
    /// Streams of one proxy each, Envoy-sized, that ask for trust only (`system_trust_bundle`).
    pub(super) fn trust_only(run: RunOptions) -> Options {
        let defaults = SdsArgs::default();
        Options {
            proxies: run.streams,
            identity_every: 0,
            node_extensions: defaults.node_extensions,
            console_clients: 0,
            run,
        }
    }

    fn from_args(args: &SdsArgs) -> Result<Options, Error> {
        // The bench daemon runs with the default limits: say which one a size would hit, rather than
        // watching streams wait for a slot that never comes.
        let run = RunOptions::new(
            (args.streams, args.connections, DEFAULT_CONNECTIONS),
            (args.seconds, args.timeout),
            args.client,
        )?;
        let per_proxy = Settings::default().limits.streams_per_proxy as usize;
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
            proxies,
            identity_every: args.identity_every,
            node_extensions: args.node_extensions,
            console_clients: args.console_clients,
            run,
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
    /// How many console clients follow the daemon's web console through the run (see
    /// [`super::console`]).
    pub console_clients: usize,
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
            console_clients: 0,
            seconds: 2.0,
            timeout: 60.0,
            client: BenchClient::Process,
        }
    }
}

/// Connections the bench opens unless more are needed or `--connections` says otherwise.
const DEFAULT_CONNECTIONS: usize = 50;

/// What single events cost while every other stream sits idle: the control loop's own time (turns it
/// spent, whatever else it waited on), which should not grow with the fleet. Each is measured
/// [`EVENT_SAMPLES`] times, one after the other.
#[derive(Debug, Default)]
pub struct EventCosts {
    /// The loop's time on the no-op reload (the files are read on another thread).
    pub noop_reload_loop: Spread,
    /// A new proxy opening a connection and a stream: from opening it until its identity arrives (each
    /// sample a proxy of its own, like the two below).
    pub connect: Spread,
    /// The loop's time on that connect (registration, one reconcile, one certificate).
    pub connect_loop: Spread,
    /// The loop's time on the ACK of that response.
    pub ack_loop: Spread,
    /// The loop's time on a reload that adds (or removes) one WorkloadRegistration with the Dataplane it
    /// names, which no stream belongs to.
    pub registration_loop: Spread,
}

/// The quartiles of one event's samples. A turn of the loop takes tens of microseconds on a machine
/// it shares with the bench client: one sample can be three times the next, so the median of many is
/// the figure, and the quartiles say how far the samples spread.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spread {
    pub p25: Duration,
    pub p50: Duration,
    pub p75: Duration,
}

impl Spread {
    /// The quartiles of `samples` (none: zero).
    fn of(mut samples: Vec<Duration>) -> Spread {
        samples.sort_unstable();
        let at = |q: usize| {
            samples
                .get((samples.len().saturating_sub(1)) * q / 4)
                .copied()
                .unwrap_or_default()
        };
        Spread {
            p25: at(1),
            p50: at(2),
            p75: at(3),
        }
    }

    /// The median in seconds, and the quartiles, for the JSON line.
    fn seconds(&self) -> (f64, [f64; 2]) {
        let s = |d: Duration| round(d.as_secs_f64(), 6);
        (s(self.p50), [s(self.p25), s(self.p75)])
    }
}

/// What one proxy's connect and ACK cost ([`one_proxy`]).
struct ProxySample {
    connect: Duration,
    connect_loop: Duration,
    ack_loop: Duration,
}

/// What one run measured.
#[derive(Debug)]
pub struct Outcome {
    /// The streams opened and idle.
    pub idle: Idle,
    /// How long a reload of unchanged resources took, with every stream idle (the median of
    /// [`EVENT_SAMPLES`]): a per-event cost that should not grow with the fleet.
    pub noop_reload_seconds: f64,
    /// Whether those reloads published a snapshot (they should not: nothing changed).
    pub noop_reload_published: bool,
    /// What single events cost the control loop with every other stream idle.
    pub events: EventCosts,
    /// The rotation.
    pub rotation: Rotation,
    /// Snapshots the daemon published while the streams opened, and during the rotation.
    pub generations: (u64, u64),
    /// What each console client followed.
    pub console: Vec<Followed>,
}

/// How long the console clients may take, once the rotation is measured, to fetch the overview of the
/// daemon's last snapshot (updates are sent at most every 250 ms).
const CONSOLE_CATCH_UP: Duration = Duration::from_secs(10);

/// One token per proxy; stream `i` belongs to proxy `p-<i % proxies>`.
pub(super) fn fleet_plan(
    daemon: &Daemon,
    target: String,
    options: &Options,
) -> anyhow::Result<FleetPlan> {
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
    let streams = (0..options.run.streams)
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
        connections: options.run.connections,
        streams: Streams::Sds {
            node_extensions: options.node_extensions,
            streams,
        },
    })
}

/// Runs the whole bench against a fresh in-process daemon.
pub async fn measure(options: &Options) -> anyhow::Result<Outcome> {
    let sandbox = Sandbox::new()?;
    sandbox.write_resource("mesh.yaml", &mesh_yaml(false))?;
    harness::with_daemon(
        &sandbox,
        sandbox.settings(),
        async |daemon, sandbox, clients| play(daemon, sandbox, options, clients).await,
    )
    .await
}

/// Runs the bench with the console clients following the daemon from before the streams open until
/// the rotation is measured.
async fn play(
    daemon: &Daemon,
    sandbox: &Sandbox,
    options: &Options,
    clients: &mut Option<Clients>,
) -> anyhow::Result<Outcome> {
    let console = ConsoleClients::start(daemon.admin_addr, options.console_clients).await?;
    let mut outcome = measured(daemon, sandbox, options, clients).await?;
    outcome.console = console
        .finish(daemon.generation(), CONSOLE_CATCH_UP)
        .await?;
    Ok(outcome)
}

async fn measured(
    daemon: &Daemon,
    sandbox: &Sandbox,
    options: &Options,
    clients: &mut Option<Clients>,
) -> anyhow::Result<Outcome> {
    let target = daemon
        .unix_target()
        .ok_or_else(|| anyhow!("the bench daemon has no unix SDS socket"))?;
    let plan = fleet_plan(daemon, target.clone(), options)?;
    let generation = || daemon.generation();
    let start_generation = generation();
    let (idle, fleet) = harness::open_idle(plan, options.run, clients).await?;
    // Single events are measured with the daemon idle too: no proxy left for a later turn of its loop,
    // no certificate being issued (proxies whose streams ask only for trust may get theirs after setup).
    quiescent(daemon, options.run.timeout).await?;
    // Single events are short and the machine is shared: each is measured many times, one after the
    // other (see `Spread`).
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
    let noop_reload_seconds = Spread::of(noops.iter().map(|n| n.0).collect())
        .p50
        .as_secs_f64();
    events.noop_reload_loop = Spread::of(noops.iter().map(|n| n.1).collect());
    let noop_reload_published = generation() != before_noop;
    // One registration more, then one fewer, each a reload: what a registration change costs the loop.
    let mut registrations = Vec::with_capacity(EVENT_SAMPLES);
    for i in 0..EVENT_SAMPLES {
        let file = "bench-registration.yaml";
        let change = if i % 2 == 0 {
            sandbox.write_resource(file, &registration_yaml(i))
        } else {
            sandbox.remove_resource(file)
        };
        change.context("cannot change the bench's registration")?;
        let loop_before = daemon.loop_health().work();
        reload(daemon, "a registration change").await?;
        let busy = loop_idle(daemon, loop_before.turns + 1).await?.busy - loop_before.busy;
        registrations.push(busy);
    }
    if EVENT_SAMPLES % 2 == 1 {
        sandbox.remove_resource("bench-registration.yaml")?;
        reload(daemon, "the registration's removal").await?;
    }
    events.registration_loop = Spread::of(registrations);
    // Each proxy event on a proxy of its own.
    let mut samples = Vec::with_capacity(EVENT_SAMPLES);
    for i in 0..EVENT_SAMPLES {
        samples.push(one_proxy(daemon, &target, &format!("bench-late-{i}")).await?);
    }
    let spread =
        |pick: fn(&ProxySample) -> Duration| Spread::of(samples.iter().map(pick).collect());
    events.connect = spread(|e| e.connect);
    events.connect_loop = spread(|e| e.connect_loop);
    events.ack_loop = spread(|e| e.ack_loop);
    let idle_generation = generation();

    let rotation = harness::rotate(daemon, sandbox, fleet, options.run.timeout).await?;
    let generations = (
        idle_generation - start_generation,
        generation() - idle_generation,
    );
    Ok(Outcome {
        idle,
        noop_reload_seconds,
        noop_reload_published,
        events,
        rotation,
        generations,
        console: Vec::new(),
    })
}

/// Waits until the control loop has finished at least `turns` turns and is between two: its work then.
pub(super) async fn loop_idle(daemon: &Daemon, turns: u64) -> anyhow::Result<meshca_control::Work> {
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

/// A WorkloadRegistration of sample `i` and the Dataplane it names, for a uid no process of the bench
/// runs as.
fn registration_yaml(i: usize) -> String {
    format!(
        "type: Dataplane\nmesh: {MESH}\nname: bench-registered-{i}\nlabels: {{kuma.io/workload: \
         bench-registered}}\nnetworking:\n  address: 127.0.0.1\n  inbound: [{{port: 1, tags: \
         {{kuma.io/service: bench-registered}}}}]\n---\ntype: WorkloadRegistration\nmesh: {MESH}\nname: \
         bench-registration-{i}\nspec:\n  dataplane: bench-registered-{i}\n  selectors: \
         [\"unix:uid:{}\"]\n",
        4_000_000_000u32 - i as u32
    )
}

/// How many times a single event is measured: the no-op reload, the registration change, and a connect
/// and an ACK (each on a proxy of its own). Five were too few: one run's five no-op reloads read 33 to
/// 98 µs. The median of a hundred moves only as the machine does from run to run.
const EVENT_SAMPLES: usize = 101;

/// One more proxy, `name`, on a connection of its own, while every other stream is idle: how long until it
/// holds its identity, and what its connect and its ACK cost the control loop.
async fn one_proxy(daemon: &Daemon, target: &str, name: &str) -> anyhow::Result<ProxySample> {
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
    let connect = started.elapsed();
    let connected = loop_idle(daemon, before.turns + 1).await?;
    let connect_loop = connected.busy - before.busy;
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
    let ack_loop = acked.busy - connected.busy;
    // Closing the stream is one more event; the next sample starts after the loop handled it.
    drop(requests);
    drop(responses);
    loop_idle(daemon, acked.turns + 1).await?;
    Ok(ProxySample {
        connect,
        connect_loop,
        ack_loop,
    })
}

/// The JSON line of a run.
fn report(options: &Options, outcome: &Outcome) -> serde_json::Value {
    let reach = &outcome.rotation.reach;
    let mut own = serde_json::json!({
        "bench": "sds",
        "proxies": options.proxies,
        "identity_streams": reach.identity_streams,
        "node_extensions": options.node_extensions,
        "noop_reload_seconds": round(outcome.noop_reload_seconds, 4),
        "noop_reload_published": outcome.noop_reload_published,
        "nacks": reach.nacks,
        "console_clients": options.console_clients,
        "console_updates": Followed::total(&outcome.console).updates,
        "console_fetches": Followed::total(&outcome.console).fetches,
    });
    let events = &outcome.events;
    for (name, spread) in [
        ("noop_reload_loop", &events.noop_reload_loop),
        ("connect", &events.connect),
        ("connect_loop", &events.connect_loop),
        ("ack_loop", &events.ack_loop),
        ("registration_loop", &events.registration_loop),
    ] {
        let (median, quartiles) = spread.seconds();
        own[format!("{name}_seconds")] = median.into();
        own[format!("{name}_quartiles_seconds")] = serde_json::json!(quartiles);
    }
    let measured = (&outcome.idle, &outcome.rotation, outcome.generations);
    harness::report(&options.run, "identity", measured, own)
}

/// `meshca bench sds`: prints one JSON line; exit 1 unless the rotation reached every stream in time.
pub async fn run(args: SdsArgs) -> anyhow::Result<ExitCode> {
    let options = Options::from_args(&args)?;
    let outcome = measure(&options).await?;
    let error = harness::unreached(&outcome.rotation.reach, &options.run);
    Ok(harness::conclude(&report(&options, &outcome), error))
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
        assert_eq!(o.run.connections, 98);
        assert_eq!(options(&[]).expect("defaults").run.connections, 50);
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
            proxies: 150,
            identity_every: 4,
            node_extensions: 3,
            console_clients: 0,
            run: RunOptions::in_process(200, 4),
        };
        let outcome = measure(&options).await.expect("the bench runs");
        let reach = &outcome.rotation.reach;
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
        assert!(outcome.idle.rss_idle > 0 && outcome.idle.rss_before > 0);
        assert!(
            !outcome.noop_reload_published,
            "a reload that changes nothing pushes nothing"
        );
        assert!(
            outcome.events.connect.p50 > Duration::ZERO
                && outcome.events.connect_loop.p50 > Duration::ZERO,
            "{:?}",
            outcome.events
        );
        assert!(
            outcome.events.ack_loop.p50 > Duration::ZERO,
            "{:?}",
            outcome.events
        );
        assert!(
            outcome.events.registration_loop.p50 > Duration::ZERO,
            "a registration change is a turn of the loop: {:?}",
            outcome.events
        );
        let line = report(&options, &outcome);
        for name in [
            "noop_reload_loop",
            "connect",
            "connect_loop",
            "ack_loop",
            "registration_loop",
        ] {
            let median = line[format!("{name}_seconds")].as_f64();
            let quartiles = &line[format!("{name}_quartiles_seconds")];
            let (p25, p75) = (quartiles[0].as_f64(), quartiles[1].as_f64());
            assert!(
                [p25, median, p75].iter().all(Option::is_some) && p25 <= median && median <= p75,
                "{name}: {line}"
            );
        }
        assert_eq!(line["noop_reload_published"], false);
        assert_eq!(line["reached"], 200);
        assert_eq!(line["bench"], "sds");
    }

    #[test]
    fn a_spread_is_the_quartiles_of_its_samples() {
        let ms = Duration::from_millis;
        let spread = Spread::of((1..=9).rev().map(ms).collect());
        assert_eq!(
            spread,
            Spread {
                p25: ms(3),
                p50: ms(5),
                p75: ms(7)
            }
        );
        assert_eq!(spread.seconds(), (0.005, [0.003, 0.007]));
        assert_eq!(Spread::of(Vec::new()), Spread::default());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn console_clients_follow_the_rotation() {
        let options = Options {
            proxies: 40,
            identity_every: 4,
            node_extensions: 0,
            console_clients: 2,
            run: RunOptions::in_process(40, 2),
        };
        let outcome = measure(&options).await.expect("the bench runs");
        assert_eq!(outcome.rotation.reach.reached, 40);
        let console = &outcome.console;
        assert_eq!(console.len(), 2);
        // `finish` checked that each fetched the overview of the daemon's last snapshot, after the
        // rotation.
        let last = outcome.generations.0 + outcome.generations.1;
        for client in console {
            assert!(client.updates >= 1 && client.fetches >= 1, "{console:?}");
            assert!(client.generation >= last, "{console:?}");
        }
        let line = report(&options, &outcome);
        let total = Followed::total(console);
        assert_eq!(line["console_clients"], 2);
        assert_eq!(line["console_updates"], total.updates);
        assert_eq!(line["console_fetches"], total.fetches);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_console_client_refused_fails_the_bench() {
        let options = Options {
            proxies: 4,
            identity_every: 0,
            node_extensions: 0,
            console_clients: 17,
            run: RunOptions::in_process(4, 1),
        };
        let error = measure(&options)
            .await
            .expect_err("the console follows at most 16 browsers")
            .to_string();
        assert!(
            error.contains("console client 16") && error.contains("503"),
            "{error}"
        );
    }
}
