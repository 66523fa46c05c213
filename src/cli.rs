//! The command line (docs/cli.md lists it for operators).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The version and the commit it was built from (`build.rs`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("MESHCA_COMMIT"),
    ")"
);

/// meshca: a certificate authority and SDS identity issuer for service meshes.
#[derive(Debug, Parser)]
#[command(name = "meshca", version = VERSION, about, propagate_version = true)]
pub struct Cli {
    /// Log format on stderr (`RUST_LOG` selects what is logged).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// How a command prints its result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// For people.
    #[default]
    Human,
    /// One JSON document, for tools.
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon (with no settings file: embedded defaults).
    Serve(ConfigArg),
    /// Check the settings and resource files; print every error.
    Validate(ValidateArgs),
    /// Mint a proxy token signed with the daemon's key, or revoke one.
    Token(TokenArgs),
    /// Write svid.pem, key.pem and bundle.pem for a workload that is not Envoy.
    Issue(IssueArgs),
    /// Talk to a running daemon's SDS endpoint as Envoy would.
    #[command(subcommand)]
    Sds(SdsCommand),
    /// Decode a PEM certificate, chain or bundle.
    Inspect(InspectArgs),
    /// Show meshes, backends, proxies and expiring certificates of a running daemon.
    Status(StatusArgs),
    /// Measure throughput; prints one JSON line.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Play a rotation or migration against live simulated proxies.
    #[cfg_attr(not(feature = "drills"), command(hide = true))]
    Drill(DrillArgs),
    /// Print an Envoy bootstrap (YAML) for the proxy a token names.
    Bootstrap(BootstrapArgs),
    /// Ask a SPIFFE Workload API socket what this process would get.
    #[command(subcommand)]
    Workload(WorkloadCommand),
    /// Serve the SPIFFE Workload API on this host, with identities from meshca servers and keys
    /// made here (each flag overrides its `agent.*` setting and `MESHCA_AGENT_*` variable).
    Agent(AgentArgs),
    /// SPIFFE bundles of federated trust domains.
    #[command(subcommand)]
    Bundle(BundleCommand),
    /// Print a shell completion script for meshca (e.g. `meshca completions bash > /etc/bash_completion.d/meshca`).
    Completions(CompletionsArgs),
    /// Write a man page (roff) for meshca and for each of its commands into a directory (`scripts/package`).
    #[command(hide = true)]
    Manpages(ManpagesArgs),
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManpagesArgs {
    /// The directory to write `meshca.1`, `meshca-serve.1`, ... into (created if missing).
    pub dir: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum BundleCommand {
    /// Print the SPIFFE bundle a running daemon's bundle endpoint serves (federation.endpoints).
    Show(BundleShowArgs),
    /// Fetch a peer's bundle endpoint as meshca would, check what it serves, and print it.
    Fetch(BundleFetchArgs),
}

#[derive(Debug, Args)]
pub struct BundleShowArgs {
    /// The trust domain whose bundle to print; may be left out when the daemon serves one.
    #[arg(long, value_name = "TD")]
    pub trust_domain: Option<String>,
    /// What to print: the SPIFFE bundle (JSON), or its X.509 authorities as PEM.
    #[arg(long, value_enum, default_value_t = BundleFormat::Spiffe)]
    pub format: BundleFormat,
    /// The daemon's admin address.
    #[arg(long, default_value = "127.0.0.1:5681")]
    pub admin: String,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("profile").required(true).args(["spiffe_id", "web"])))]
pub struct BundleFetchArgs {
    /// The bundle endpoint, https://HOST[:PORT]/PATH.
    pub url: String,
    /// https_spiffe: the SPIFFE ID the endpoint's X.509-SVID must carry (its trust domain is the
    /// bundle's unless --trust-domain says otherwise).
    #[arg(long, requires = "bundle_file", value_name = "spiffe://TD/PATH")]
    pub spiffe_id: Option<String>,
    /// https_spiffe: the bundle held for the endpoint's trust domain (a SPIFFE bundle or PEM), which
    /// its SVID must chain to.
    #[arg(long, value_name = "FILE")]
    pub bundle_file: Option<PathBuf>,
    /// https_web: the endpoint presents a Web PKI certificate for the URL's host.
    #[arg(long)]
    pub web: bool,
    /// https_web: the roots to check it by (PEM); default: the system's.
    #[arg(long, requires = "web", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// The trust domain the bundle is of (required with --web).
    #[arg(long, value_name = "TD")]
    pub trust_domain: Option<String>,
    /// How long the fetch may take, in seconds.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub timeout: f64,
    /// What to print: the SPIFFE bundle (JSON), or its X.509 authorities as PEM.
    #[arg(long, value_enum, default_value_t = BundleFormat::Spiffe)]
    pub format: BundleFormat,
}

/// How `meshca bundle` prints a bundle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BundleFormat {
    /// The SPIFFE bundle, JSON.
    #[default]
    Spiffe,
    /// The X.509 authorities, PEM.
    Pem,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The meshca servers' SDS listeners, tried in order: host:port, https://host:port or
    /// unix:///path, comma separated (agent.servers).
    #[arg(long)]
    pub server: Option<String>,
    /// The file holding this host's agent token, `meshca token --type agent --name HOST`
    /// (agent.tokenFile).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// PEM of the CA that signs the servers' SDS certificates, for TLS (agent.sdsCa).
    #[arg(long)]
    pub sds_ca: Option<PathBuf>,
    /// The Workload API socket, unix:///PATH (agent.listen; default unix:///run/meshca/workload.sock).
    #[arg(long)]
    pub listen: Option<String>,
    /// The status listener, a loopback IP:port (agent.admin; default 127.0.0.1:9911).
    #[arg(long)]
    pub admin: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum WorkloadCommand {
    /// Fetch this process's X.509-SVIDs, the bundles, or JWT-SVIDs (first answer only).
    Fetch(WorkloadFetchArgs),
}

#[derive(Debug, Args)]
pub struct WorkloadFetchArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The Workload API socket, `unix:///absolute/path`; default: `SPIFFE_ENDPOINT_SOCKET`, else the
    /// first `workloadApi.listen` socket of the settings.
    #[arg(long, value_name = "unix:///PATH")]
    pub socket: Option<std::ffi::OsString>,
    #[command(subcommand)]
    pub what: WorkloadFetch,
}

/// What `meshca workload fetch` asks for.
#[derive(Debug, Subcommand)]
pub enum WorkloadFetch {
    /// X.509-SVIDs with their keys and bundles (`FetchX509SVID`).
    X509(WorkloadX509Args),
    /// Every trust domain's CAs (`FetchX509Bundles`).
    Bundles(OutputArg),
    /// JWT-SVIDs for an audience (`FetchJWTSVID`).
    Jwt(WorkloadJwtArgs),
}

#[derive(Debug, Args)]
pub struct WorkloadX509Args {
    /// Write the default SVID into DIR: svid.pem (chain, leaf first), key.pem (PKCS#8, 0600),
    /// bundle.pem (its trust domain's CAs) and federated-<trust domain>.pem for each other one.
    #[arg(long, value_name = "DIR")]
    pub write: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct WorkloadJwtArgs {
    /// An audience the token is for (repeatable; at least one).
    #[arg(long, required = true)]
    pub audience: Vec<String>,
    /// Only the token of this SPIFFE ID (one of this process's).
    #[arg(long)]
    pub spiffe_id: Option<String>,
    #[arg(long, value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct OutputArg {
    #[arg(long, value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct BootstrapArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// File holding the proxy token (`meshca token`); it goes into the bootstrap.
    #[arg(long)]
    pub token_file: PathBuf,
    /// SDS address: `unix:///path` or `host:port` (TLS); default: the first unix listener in the settings.
    #[arg(long)]
    pub server: Option<String>,
    /// PEM file of the CA that signs meshca's SDS certificate, for `--server host:port`
    /// (default: `<dataDir>/sds-ca.pem`).
    #[arg(long)]
    pub sds_ca: Option<PathBuf>,
    /// Envoy's admin port, on 127.0.0.1.
    #[arg(long, default_value_t = 9901)]
    pub admin_port: u16,
    /// `PORT:APP_PORT`: an mTLS listener on PORT forwarding to the local app on APP_PORT (repeatable).
    #[arg(long, value_name = "PORT:APP_PORT")]
    pub inbound: Vec<meshca_sds::bootstrap::Inbound>,
    /// `LOCAL_PORT=HOST:PORT[@SPIFFE_ID|@meshservice:NAME]`: a loopback listener whose cluster originates
    /// mTLS to HOST:PORT, accepting only SPIFFE_ID, or the identities of MeshService NAME through its
    /// `meshservice:NAME` validation context, when given (repeatable).
    #[arg(
        long,
        value_name = "LOCAL_PORT=HOST:PORT[@SPIFFE_ID|@meshservice:NAME]"
    )]
    pub outbound: Vec<meshca_sds::bootstrap::Outbound>,
    /// Open a new upstream connection (a new mTLS handshake) for every outbound request, as the drills
    /// do to see every certificate change at once.
    #[arg(long)]
    pub one_request_per_connection: bool,
}

#[derive(Debug, Args)]
pub struct ConfigArg {
    /// The settings file (YAML). Without it, embedded defaults and `MESHCA_*` variables apply.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Resource directories to check instead of the one the settings name.
    pub dirs: Vec<PathBuf>,
    #[arg(long, value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The proxy's mesh (required, except for an agent's token, which names none).
    #[arg(long)]
    pub mesh: Option<String>,
    /// The proxy's name (its node id is `<mesh>.<name>`), or the agent's (what registrations' `spec.agent`
    /// names).
    #[arg(long, required_unless_present = "revoke")]
    pub name: Option<String>,
    /// The kind of proxy, or `agent` for a `meshca agent`.
    #[arg(long = "type", value_enum, default_value_t = ProxyKind::Dataplane)]
    pub proxy_type: ProxyKind,
    /// A dataplane label, `K=V`; repeatable. Fixed in the token: the proxy cannot claim others.
    #[arg(long = "label", value_name = "K=V")]
    pub labels: Vec<String>,
    /// An inbound tag, `K=V` (e.g. `kuma.io/service=web`); repeatable.
    #[arg(long = "tag", value_name = "K=V")]
    pub tags: Vec<String>,
    /// How long the token is valid (e.g. 24h, 30d, 1y).
    #[arg(long, default_value = "24h")]
    pub valid_for: String,
    /// Revoke the token with this id instead of minting one (the daemon stops serving it at once).
    #[arg(long, value_name = "TOKEN_ID", conflicts_with_all = ["mesh", "name", "labels", "tags"])]
    pub revoke: Option<String>,
    #[arg(long, value_enum, default_value_t)]
    pub output: Output,
}

/// The kind of proxy a token is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProxyKind {
    Dataplane,
    ZoneEgress,
    /// A `meshca agent`: no mesh, and nothing but the WorkloadRegistrations that name it.
    Agent,
}

#[derive(Debug, Args)]
pub struct IssueArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Directory to write svid.pem, key.pem (0600) and bundle.pem into.
    #[arg(long)]
    pub out: PathBuf,
    /// A running daemon's SDS address (`unix:///path` or `host:port`).
    #[arg(long, requires = "token_file", conflicts_with_all = ["mesh", "name"])]
    pub server: Option<String>,
    /// File holding the proxy token (for --server).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA that signs the daemon's SDS TLS certificate (default: `<dataDir>/sds-ca.pem`).
    #[arg(long)]
    pub server_ca: Option<PathBuf>,
    /// Issue straight from the local keystore for this mesh...
    #[arg(long, requires = "name")]
    pub mesh: Option<String>,
    /// ...and this dataplane.
    #[arg(long, requires = "mesh")]
    pub name: Option<String>,
    /// Keep the files renewed (atomic replace, then run --exec).
    #[arg(long)]
    pub watch: bool,
    /// Command run (through `sh -c`) after each write.
    #[arg(long)]
    pub exec: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum SdsCommand {
    /// Fetch secrets by name and print them (private keys are redacted).
    Fetch(SdsFetchArgs),
}

#[derive(Debug, Args)]
pub struct SdsFetchArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// SDS address (`unix:///path` or `host:port`); default: the first listener in the settings.
    #[arg(long)]
    pub server: Option<String>,
    /// File holding the proxy token.
    #[arg(long)]
    pub token_file: PathBuf,
    /// Node id (default: `<mesh>.<name>` from the token).
    #[arg(long)]
    pub node_id: Option<String>,
    /// PEM file of the CA that signs the daemon's SDS TLS certificate (default: `<dataDir>/sds-ca.pem`).
    #[arg(long)]
    pub server_ca: Option<PathBuf>,
    /// Resource names, e.g. `default system_trust_bundle`.
    #[arg(required = true)]
    pub names: Vec<String>,
    #[arg(long, value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A PEM file: certificate, chain or bundle.
    pub file: PathBuf,
    #[arg(long, value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The daemon's admin address.
    #[arg(long, default_value = "127.0.0.1:5681")]
    pub admin: String,
    #[arg(long, value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// SVIDs per second on one thread, beside the raw ring floor from the same run.
    Issuance(BenchIssuanceArgs),
    /// SDS fan-out: many idle streams, memory per stream, and how fast a CA rotation reaches them all.
    #[cfg_attr(not(feature = "drills"), command(hide = true))]
    Sds(BenchSdsArgs),
    /// Workload API fan-out: many idle `FetchX509SVID` streams of one process, memory per stream, and
    /// how fast a CA rotation reaches them all.
    #[cfg_attr(not(feature = "drills"), command(hide = true))]
    Workload(BenchWorkloadArgs),
    /// Many `meshca agent`s (simulated, one connection each) against one server: memory per agent,
    /// and how fast a CA rotation reaches every agent and renews every certificate.
    #[cfg_attr(not(feature = "drills"), command(hide = true))]
    Agents(BenchAgentsArgs),
    /// Federation: what following many peers' bundle endpoints costs the daemon (in its own process),
    /// and how fast a peer's new CA reaches SDS and Workload API streams.
    #[cfg_attr(not(feature = "drills"), command(hide = true))]
    Federation(BenchFederationArgs),
    /// The client half of `bench sds` and `bench workload` when it runs in its own process: reads its
    /// plan on stdin.
    #[command(hide = true)]
    SdsClient,
}

#[derive(Debug, Args)]
pub struct BenchWorkloadArgs {
    /// How many concurrent `FetchX509SVID` streams (all from one process, which the bench daemon's
    /// limits make room for).
    #[arg(long, default_value_t = 10_000)]
    pub streams: usize,
    /// How many HTTP/2 connections to the Workload API socket carry them (streams are spread evenly);
    /// default: 16, or as many as `limits.streamsPerConnection` needs.
    #[arg(long)]
    pub connections: Option<usize>,
    /// The bench daemon's `workloadApi.ackAfter`, in seconds: how long after a message is written it
    /// counts as applied, which the rotation waits for between its steps (so the SVID latency includes
    /// it, the bundle latency does not). Default: the daemon's default.
    #[arg(long, default_value_t = 1.0)]
    pub ack_after: f64,
    /// Serve the streams through a `meshca agent` (in the bench's process, beside the daemon) instead
    /// of the daemon's own socket: the agent makes the keys, and acknowledges a state once every
    /// stream was sent it. `--ack-after` is then the agent's.
    #[arg(long)]
    pub agent: bool,
    /// How many registrations there are: the streams all match the first; the others select other
    /// uids, so none is served (with `--agent`, every one names the agent, and the server certifies
    /// each through it).
    #[arg(long, default_value_t = 1)]
    pub registrations: usize,
    #[command(flatten)]
    pub run: BenchRunArgs,
}

#[derive(Debug, Args)]
pub struct BenchFederationArgs {
    /// How many peers (SPIFFE bundle endpoints in the bench's process, `https_web`) the daemon follows;
    /// 0 measures it following none.
    #[arg(long, default_value_t = 100)]
    pub relationships: usize,
    /// The `spiffe_refresh_hint` the peers serve, in whole seconds from 30 to 3600.
    #[arg(long, default_value_t = 30.0)]
    pub refresh: f64,
    /// How long the daemon's CPU time is read over, once every peer was fetched.
    #[arg(long, default_value_t = 65.0)]
    pub seconds: f64,
    /// How many SDS streams, and then Workload API streams, a peer's new CA must reach; 0 skips it.
    #[arg(long, default_value_t = 10_000)]
    pub streams: usize,
    /// How long the setup, and then each reach, may take, in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
}

#[derive(Debug, Args)]
pub struct BenchAgentsArgs {
    /// How many agents, each with its own connection and `Sync` stream.
    #[arg(long, default_value_t = 1_000)]
    pub agents: usize,
    /// How many WorkloadRegistrations (each on its own Dataplane) name each agent.
    #[arg(long, default_value_t = 1)]
    pub registrations: usize,
    #[command(flatten)]
    pub run: BenchRunArgs,
}

/// What `bench sds` and `bench workload` share.
#[derive(Debug, Args)]
pub struct BenchRunArgs {
    /// How long the streams stay idle before the memory is read.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// How long the setup, and then the rotation, may take before the bench fails.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
    /// Where the clients run: in a child process (the daemon's memory is then its own) or in this one.
    #[arg(long, value_enum, default_value_t = BenchClient::Process)]
    pub client: BenchClient,
}

#[derive(Debug, Args)]
pub struct BenchSdsArgs {
    /// How many concurrent `StreamSecrets` streams.
    #[arg(long, default_value_t = 10_000)]
    pub streams: usize,
    /// How many HTTP/2 connections to the unix socket carry them (streams are spread evenly); default: 50,
    /// or as many as `limits.streamsPerConnection` needs.
    #[arg(long)]
    pub connections: Option<usize>,
    /// How many proxies own the streams (round-robin); default: one proxy per stream.
    #[arg(long)]
    pub proxies: Option<usize>,
    /// Every K-th stream also asks for the proxy's identity (`default`); 0: none does.
    #[arg(long, default_value_t = 4)]
    pub identity_every: usize,
    /// How many extensions the node of each stream's first request lists, as Envoy's does: the
    /// default makes it the size Envoy 1.40 sends (about 61 KB); 0 sends a bare node.
    #[arg(long, default_value_t = 420)]
    pub node_extensions: usize,
    /// Follow the daemon's web console with this many clients from before the streams open until the
    /// rotation is measured, as browsers would: each holds the event stream (`/console/events`) and
    /// fetches the overview fragment on every update. The report counts their updates and fetches; a
    /// client refused (the console follows at most 16) or cut off fails the bench. They run in this
    /// process, beside the daemon.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub console_clients: usize,
    #[command(flatten)]
    pub run: BenchRunArgs,
}

/// Where `bench sds` and `bench workload` run their clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchClient {
    /// A child process (`meshca bench sds-client`).
    Process,
    /// The bench's own process, beside the daemon.
    InProcess,
}

#[derive(Debug, Args)]
pub struct BenchIssuanceArgs {
    /// How long each half of the measurement runs.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Also measure a wave of this many RSA-2048 leaves on one thread, started with `--keys-ahead` keys
    /// generated ahead (as the daemon's issuance threads keep them), against generating every key in
    /// the wave; 0 skips it (RSA keys take tens of milliseconds each)
    #[arg(long, default_value_t = 0)]
    pub rsa_wave: usize,
    /// Keys generated ahead for `--rsa-wave` (the daemon's `issuance.keysAhead` default)
    #[arg(long, default_value_t = meshca_config::DEFAULT_KEYS_AHEAD)]
    pub keys_ahead: usize,
    /// Also measure issuance with the CA key in the PKCS#11 token of `keystore.pkcs11` in the settings
    /// (`--config` or `MESHCA_KEYSTORE_PKCS11_*`): on one thread, and on `--threads` threads beside the
    /// software key on as many. The CA key made for it is destroyed afterwards.
    #[arg(long)]
    pub pkcs11: bool,
    /// Threads for `--pkcs11`'s parallel figures (default: the machine's cores, as the daemon's issuance
    /// threads).
    #[arg(long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub config: ConfigArg,
}

#[derive(Debug, Args)]
pub struct DrillArgs {
    /// The scenario to play.
    #[arg(value_enum)]
    pub scenario: DrillScenario,
    /// How many simulated proxies (each an SDS stream and a TLS peer).
    #[arg(long, default_value_t = 50)]
    pub proxies: usize,
    /// The daemon's ordering gate (docs/rotation.md); `off` shows the failures it prevents.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub gate: Switch,
    /// Seeds the proxies' apply delays and the handshake pairs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The least number of handshakes over all phases (with `--envoy`, requests: each is a new handshake).
    #[arg(long, default_value_t = 10_000)]
    pub handshakes: u64,
    /// Run real Envoy sidecars (this Envoy binary) started from `meshca bootstrap` output instead of
    /// simulated proxies; some of them are made late on purpose, as slow proxies are.
    #[arg(long, value_name = "PATH")]
    pub envoy: Option<std::path::PathBuf>,
    /// Follow the staged, provider-less migration flow step by step, waiting for every proxy between
    /// steps, instead of the one-step edit (migrate-to-meshidentity and trust-domain).
    #[arg(long)]
    pub staged: bool,
    /// `workload`: serve the workloads through two `meshca agent`s (run in the drill's process, each
    /// with its own Workload API socket and agent token) instead of the daemon's own socket; with
    /// `--postgres`, the agents list every replica and one replica is killed mid-rotation.
    #[arg(long)]
    pub agent: bool,
    /// `failover` (and `workload --agent`): the PostgreSQL database the replicas share,
    /// `postgres://user@host:port/db`; it must hold no meshca tables, and holds none again at the end.
    /// The password comes from MESHCA_KEYSTORE_POSTGRES_PASSWORD.
    #[arg(long, value_name = "URL")]
    pub postgres: Option<String>,
    /// `failover`: how many replicas serve the proxies (the last one is killed).
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// Make the drill's CA keys in the PKCS#11 token of `keystore.pkcs11` in the settings (`--config`
    /// or `MESHCA_KEYSTORE_PKCS11_*`), and destroy them afterwards.
    #[arg(long)]
    pub pkcs11: bool,
    /// Once the steady state is reached, wait for Enter (a line on standard input) before the change,
    /// while the traffic runs: time to open the console the drill prints and watch the change live. A
    /// closed standard input (EOF) does not wait. Not with the failover drill.
    #[arg(long)]
    pub pause: bool,
    /// Make the first N simulated proxies withhold their ACKs from the first edit on (they read the
    /// daemon's responses but neither apply nor answer them), to see what the rollout gate waits for:
    /// it names them and waits up to `rollout.ackTimeout` (30 s by default), then goes on without
    /// them. Their handshakes fail and the drill does not converge: that is what was asked for, and the
    /// report says so. Fewer than --proxies; not with --envoy, --postgres or the workload drill.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub stuck: usize,
    #[command(flatten)]
    pub config: ConfigArg,
    #[arg(long, value_enum, default_value_t)]
    pub output: Output,
}

/// The drills meshca can play.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DrillScenario {
    /// Switch a mesh from builtin CA ca-1 to ca-2 in one edit, then remove ca-1 at once.
    CaRotation,
    /// Add a MeshIdentity with a provider selecting every dataplane to a legacy mTLS mesh, then switch
    /// legacy mTLS off at once; clients validate servers with `meshservice:` contexts.
    #[value(name = "migrate-to-meshidentity")]
    MigrateToMeshidentity,
    /// Move the mesh's MeshIdentity to another trust domain in one edit; clients validate servers with
    /// `meshservice:` contexts.
    TrustDomain,
    /// Sidecars of two meshes call a zone egress while the default mesh's CA is rotated and the default
    /// mesh is switched to the other one.
    Egress,
    /// Replicas on one PostgreSQL database (`--postgres`) serve the proxies, spread over them; the
    /// mesh's CA is rotated, and one replica is killed in the middle. Its proxies move to the others.
    Failover,
    /// The ca-rotation drill with workloads on the SPIFFE Workload API (each a Dataplane and a
    /// WorkloadRegistration) instead of proxies on SDS.
    Workload,
    /// Two daemons of two trust domains, federated both ways through their bundle endpoints; proxies
    /// of each call the other's while both rotate their CA in one edit. With `--envoy`, a ring of
    /// Envoy sidecars alternating the two trust domains.
    Federation,
}

/// On or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    On,
    Off,
}
