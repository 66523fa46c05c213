//! Prometheus metrics (docs/operations.md), exposed on the admin listener at `/metrics`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::rollouts::Timeline;

use meshca_control::{
    seconds_until, GateEvent, Issuer, RolloutStep, Scope, Status, StepChange, Telemetry, World,
};

/// Labels of per-issuer metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IssuerLabels {
    /// Mesh name.
    pub mesh: String,
    /// `backend <name>` or `MeshIdentity <name>`.
    pub issuer: String,
}

/// Labels of reconcile metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScopeLabels {
    /// `full` (every connected proxy) or `proxies` (only those an event touched).
    pub scope: String,
}

/// Labels of per-mesh gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MeshLabels {
    /// Mesh name.
    pub mesh: String,
}

/// The daemon's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    issued: Family<IssuerLabels, Counter>,
    failed: Family<IssuerLabels, Counter>,
    issuance_seconds: Histogram,
    reconcile_seconds: Family<ScopeLabels, Histogram>,
    reconciled_proxies: Family<ScopeLabels, Counter>,
    rejected_updates: Counter,
    revocation_reload_failures: Counter,
    earliest_cert_expiry: Gauge,
    earliest_ca_expiry: Gauge,
    connected_proxies: Family<MeshLabels, Gauge>,
    proxies_by_issuer: Family<IssuerLabels, Gauge>,
    rollout_waits: Family<StepLabels, Counter>,
    rollout_timeouts: Family<StepLabels, Counter>,
    removed_while_presented: Family<MeshLabels, Counter>,
    ca_expiry: Family<CaLabels, Gauge>,
    /// Labelled with this replica's name, and without a sample until a database is observed (a daemon
    /// on files has none).
    database_up: Family<ReplicaLabels, Gauge>,
    replica_proxies: Family<ReplicaLabels, Gauge>,
    replica_heartbeat_age: Family<ReplicaLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Bumped when something the status shows changes without a new snapshot (a rejected update, a
    /// rollout wait that starts or times out): the console's event streams follow it.
    status_changes: tokio::sync::watch::Sender<u64>,
    /// The last rollouts, for the console.
    timeline: std::sync::Mutex<Timeline>,
}

/// Labels of per-replica gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaLabels {
    /// `replica.name`.
    pub replica: String,
}

/// Labels of per-CA metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CaLabels {
    /// Mesh name.
    pub mesh: String,
    /// `backend <name>` or `MeshIdentity <name>`.
    pub ca: String,
    /// The first 16 hex digits of the CA's id (tells the CAs of a rotation apart).
    pub id: String,
}

/// Labels of rollout metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    /// Mesh name.
    pub mesh: String,
    /// `trust-before-identity`, `break-last` or `identity-ack`.
    pub step: String,
}

/// Reads the SDS server's counters at scrape time.
#[derive(Debug)]
struct SdsCollector(Arc<meshca_serve::StreamMetrics>);

impl Collector for SdsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let m = &self.0;
        let get = meshca_serve::StreamMetrics::get;
        let gauge = ConstGauge::new(get(&m.streams_open) as i64);
        gauge.encode(encoder.encode_descriptor(
            "meshca_sds_streams",
            "Open SDS streams",
            None,
            gauge.metric_type(),
        )?)?;
        for (name, help, value) in [
            (
                "meshca_sds_pushes",
                "SDS responses sent",
                get(&m.responses_pushed),
            ),
            (
                "meshca_sds_acks",
                "SDS responses ACKed by proxies",
                get(&m.acks),
            ),
            (
                "meshca_sds_nacks",
                "SDS responses NACKed by proxies",
                get(&m.nacks),
            ),
            (
                "meshca_sds_auth_failures",
                "SDS requests refused for authentication",
                get(&m.auth_failures),
            ),
            (
                "meshca_sds_connections_shed",
                "SDS connections closed on accept because their listener was at limits.sdsConnections",
                get(&m.connections_shed),
            ),
            (
                "meshca_sds_connections_keepalive_closed",
                "SDS connections closed because their client did not answer the HTTP/2 keepalive ping",
                get(&m.connections_keepalive_closed),
            ),
            (
                "meshca_sds_over_limit",
                "SDS streams and requests refused for going over a limit (streams per proxy, names)",
                get(&m.over_limit),
            ),
            (
                "meshca_sds_log_lines_suppressed",
                "Log lines about SDS clients left out by the per-minute warning limit",
                get(&m.log_lines_suppressed),
            ),
            (
                "meshca_library_log_lines_suppressed",
                "Warnings of the HTTP libraries (h2, hyper, rustls) a peer can cause, left out by \
                 limits.warningsPerMinute",
                meshca_serve::library_logs::suppressed(),
            ),
        ] {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        let (sum, count, buckets) = m.ack_lag.read();
        let mut lag = encoder.encode_descriptor(
            "meshca_sds_ack_lag_seconds",
            "Time from an SDS push to the proxy's ACK",
            None,
            prometheus_client::metrics::MetricType::Histogram,
        )?;
        lag.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            sum, count, &buckets, None,
        )?;
        Ok(())
    }
}

/// Reads the database layer's count of refused rows at scrape time.
#[derive(Debug)]
struct RefusedRowsCollector;

impl Collector for RefusedRowsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counter = ConstCounter::new(meshca_db::refused_rows());
        counter.encode(encoder.encode_descriptor(
            "meshca_database_rows_refused",
            "Database rows refused because they fail their authentication (changed outside meshca, moved to another name, untagged, or an older copy put back); keystore.type: postgres only",
            None,
            counter.metric_type(),
        )?)
    }
}

/// Whether the PKCS#11 token answers, read at scrape time (`keystore.pkcs11` only).
#[derive(Debug)]
struct TokenCollector(meshca_hsm::Token);

impl Collector for TokenCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gauge = ConstGauge::new(i64::from(self.0.status().up));
        let labels = [("token", self.0.label().to_owned())];
        let mut metric = encoder.encode_descriptor(
            "meshca_keystore_token_up",
            "1 while the PKCS#11 token holding the CA keys answers; 0 while it does not, when nothing new is signed",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric.encode_family(&labels)?)
    }
}

/// What `register_issuance` registers, in the order of its names there.
type IssuanceMetrics = (
    Family<IssuerLabels, Counter>,
    Family<IssuerLabels, Counter>,
    Histogram,
    Family<ScopeLabels, Histogram>,
    Family<ScopeLabels, Counter>,
    Counter,
    Counter,
);

/// What `register_replicas` registers, in the order of its names there.
type ReplicaMetrics = (
    Family<ReplicaLabels, Gauge>,
    Family<ReplicaLabels, Gauge>,
    Family<ReplicaLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
);

/// What `register_rollout` registers, in the order of its names there.
type RolloutMetrics = (
    Gauge,
    Gauge,
    Family<MeshLabels, Gauge>,
    Family<IssuerLabels, Gauge>,
    Family<StepLabels, Counter>,
    Family<StepLabels, Counter>,
    Family<MeshLabels, Counter>,
    Family<CaLabels, Gauge>,
);

/// Registers `metric` under `name` with `help`, and returns it to be updated.
fn register<M: prometheus_client::registry::Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

impl Metrics {
    /// Registers every metric; SDS counters are read from `sds` at scrape time.
    pub fn new(
        sds: Arc<meshca_serve::StreamMetrics>,
        token: Option<meshca_hsm::Token>,
        federation: Option<crate::federation::FederationCollector>,
    ) -> Metrics {
        let mut registry = Registry::default();
        let (
            issued,
            failed,
            issuance_seconds,
            reconcile_seconds,
            reconciled_proxies,
            rejected_updates,
            revocation_reload_failures,
        ) = Metrics::register_issuance(&mut registry);
        let (database_up, replica_proxies, replica_heartbeat_age) =
            Metrics::register_replicas(&mut registry);
        let (
            earliest_cert_expiry,
            earliest_ca_expiry,
            connected_proxies,
            proxies_by_issuer,
            rollout_waits,
            rollout_timeouts,
            removed_while_presented,
            ca_expiry,
        ) = Metrics::register_rollout(&mut registry);
        registry.register_collector(Box::new(SdsCollector(sds)));
        registry.register_collector(Box::new(RefusedRowsCollector));
        if let Some(token) = token {
            registry.register_collector(Box::new(TokenCollector(token)));
        }
        if let Some(federation) = federation {
            registry.register_collector(Box::new(federation));
        }
        Metrics {
            registry,
            issued,
            failed,
            issuance_seconds,
            reconcile_seconds,
            reconciled_proxies,
            rejected_updates,
            revocation_reload_failures,
            earliest_cert_expiry,
            earliest_ca_expiry,
            connected_proxies,
            proxies_by_issuer,
            rollout_waits,
            rollout_timeouts,
            removed_while_presented,
            ca_expiry,
            database_up,
            replica_proxies,
            replica_heartbeat_age,
            status_changes: tokio::sync::watch::Sender::new(0),
            timeline: std::sync::Mutex::default(),
        }
    }

    /// Follows changes of the status that come without a new snapshot.
    pub fn status_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.status_changes.subscribe()
    }

    /// The last rollouts (held while the guard lives: read, and let go).
    pub fn timeline(&self) -> std::sync::MutexGuard<'_, Timeline> {
        self.timeline
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many times the status changed without a new snapshot.
    pub fn status_version(&self) -> u64 {
        *self.status_changes.borrow()
    }

    fn status_changed(&self) {
        self.status_changes.send_modify(|n| *n += 1);
    }

    /// Issuance and reconciles: what was issued or failed and how long it took, rejected updates and revocation reloads.
    fn register_issuance(registry: &mut Registry) -> IssuanceMetrics {
        let issued = register(
            registry,
            "meshca_certificates_issued",
            "Certificates issued",
            Family::<IssuerLabels, Counter>::default(),
        );
        let failed = register(
            registry,
            "meshca_certificates_failed",
            "Certificates that failed to issue or verify",
            Family::<IssuerLabels, Counter>::default(),
        );
        let issuance_seconds = register(
            registry,
            "meshca_issuance_seconds",
            "Time to issue and verify one certificate",
            Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
        );
        let reconcile_seconds = register(
            registry,
            "meshca_reconcile_seconds",
            "Time the control loop spent on one reconcile, by scope (full: every connected proxy; proxies: those an event touched; acks: a batch of ACKs during a rollout; deferred: quiet proxies a full reconcile left for later turns; trust: a federated bundle change, which only the bundles carry)",
            Family::<ScopeLabels, Histogram>::new_with_constructor(
                reconcile_histogram as fn() -> _,
            ),
        );
        let reconciled_proxies = register(
            registry,
            "meshca_reconciled_proxies",
            "Proxies decided by reconciles, by scope",
            Family::<ScopeLabels, Counter>::default(),
        );
        let rejected_updates = register(
            registry,
            "meshca_rejected_updates",
            "Resource updates rejected as invalid",
            Counter::default(),
        );
        let revocation_reload_failures = register(
            registry,
            "meshca_revocation_reload_failures",
            "Reloads of the token revocation list that failed (missing, unreadable or invalid); the previous list stays in force",
            Counter::default(),
        );
        (
            issued,
            failed,
            issuance_seconds,
            reconcile_seconds,
            reconciled_proxies,
            rejected_updates,
            revocation_reload_failures,
        )
    }

    /// Replicas on one database: whether it answers, and what each replica reported.
    fn register_replicas(registry: &mut Registry) -> ReplicaMetrics {
        let database_up = register(
            registry,
            "meshca_database_up",
            "1 while the replicas' PostgreSQL database answers this replica, 0 while it does not (keystore.type: postgres only)",
            Family::<ReplicaLabels, Gauge>::default(),
        );
        let replica_proxies = register(
            registry,
            "meshca_replica_proxies",
            "Proxies each replica of the database served at its last heartbeat",
            Family::<ReplicaLabels, Gauge>::default(),
        );
        let replica_heartbeat_age = register(
            registry,
            "meshca_replica_heartbeat_age_seconds",
            "Seconds since each replica of the database last heartbeated, as last read",
            Family::<ReplicaLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default(),
        );
        (database_up, replica_proxies, replica_heartbeat_age)
    }

    /// Expiries, connected proxies, and rotations: who holds what, and the rollout gate's waits.
    fn register_rollout(registry: &mut Registry) -> RolloutMetrics {
        let earliest_cert_expiry = register(
            registry,
            "meshca_earliest_certificate_expiry_seconds",
            "Seconds until the earliest served proxy certificate expires",
            Gauge::default(),
        );
        let earliest_ca_expiry = register(
            registry,
            "meshca_earliest_ca_expiry_seconds",
            "Seconds until the earliest CA expires",
            Gauge::default(),
        );
        let connected_proxies = register(
            registry,
            "meshca_connected_proxies",
            "Proxies with at least one SDS stream",
            Family::<MeshLabels, Gauge>::default(),
        );
        let proxies_by_issuer = register(
            registry,
            "meshca_rotation_proxies",
            "Connected proxies holding a certificate from each issuer (rotation progress)",
            Family::<IssuerLabels, Gauge>::default(),
        );
        let rollout_waits = register(
            registry,
            "meshca_rollout_waits",
            "Rollout steps that waited for proxies to ACK (docs/rotation.md)",
            Family::<StepLabels, Counter>::default(),
        );
        let rollout_timeouts = register(
            registry,
            "meshca_rollout_timeouts",
            "Rollout steps that proceeded after rollout.ackTimeout without every ACK",
            Family::<StepLabels, Counter>::default(),
        );
        let removed_while_presented = register(
            registry,
            "meshca_ca_removed_while_presented",
            "CAs removed from the configuration while connected proxies still presented their certificates",
            Family::<MeshLabels, Counter>::default(),
        );
        let ca_expiry = register(
            registry,
            "meshca_ca_expiry_seconds",
            "Seconds until each CA expires, by mesh and backend or MeshIdentity",
            Family::<CaLabels, Gauge>::default(),
        );
        (
            earliest_cert_expiry,
            earliest_ca_expiry,
            connected_proxies,
            proxies_by_issuer,
            rollout_waits,
            rollout_timeouts,
            removed_while_presented,
            ca_expiry,
        )
    }

    /// Records what the database told replica `this` of the replicas: `None` while it does not answer.
    pub fn observe_replicas(&self, this: &str, replicas: Option<&[meshca_db::ReplicaRecord]>) {
        self.database_up
            .get_or_create(&ReplicaLabels {
                replica: this.to_owned(),
            })
            .set(i64::from(replicas.is_some()));
        let Some(replicas) = replicas else { return };
        self.replica_proxies.clear();
        self.replica_heartbeat_age.clear();
        for replica in replicas {
            let labels = ReplicaLabels {
                replica: replica.name.clone(),
            };
            self.replica_proxies
                .get_or_create(&labels)
                .set(i64::from(replica.proxies));
            self.replica_heartbeat_age
                .get_or_create(&labels)
                .set(replica.heartbeat_age_seconds);
        }
    }

    /// Counts a failed reload of the token revocation list.
    pub fn revocation_reload_failed(&self) {
        self.revocation_reload_failures.inc();
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            tracing::error!("metrics could not be encoded");
        }
        out
    }

    /// Updates the gauges derived from the status.
    /// Sets the gauges that describe the owner's state from a status built now.
    pub fn observe(&self, status: &Status, world: &World) {
        self.observe_status(status);
        self.observe_cas(world, SystemTime::now());
    }

    fn observe_status(&self, status: &Status) {
        self.earliest_cert_expiry
            .set(status.earliest_cert_expiry_seconds.unwrap_or(0));
        self.earliest_ca_expiry
            .set(status.earliest_ca_expiry_seconds.unwrap_or(0));
        self.connected_proxies.clear();
        self.proxies_by_issuer.clear();
        for mesh in &status.meshes {
            self.connected_proxies
                .get_or_create(&MeshLabels {
                    mesh: mesh.name.clone(),
                })
                .set(mesh.connected_proxies as i64);
            for (issuer, count) in &mesh.proxies_by_issuer {
                let labels = IssuerLabels {
                    mesh: mesh.name.clone(),
                    issuer: issuer.clone(),
                };
                self.proxies_by_issuer
                    .get_or_create(&labels)
                    .set(*count as i64);
            }
        }
    }

    /// Sets the expiry gauge of every CA of `world`, and makes the counters of each of its meshes and
    /// issuers exist at 0: a counter that first appears at 1 is no increase to Prometheus (`increase()`
    /// and `rate()` need a sample before the event), so an alert on the first failure or timeout would
    /// never fire.
    fn observe_cas(&self, world: &World, now: SystemTime) {
        self.ca_expiry.clear();
        let mut meshes = std::collections::BTreeSet::new();
        for (mesh, ca, loaded) in world.authorities() {
            let id = loaded.ca.id();
            let issuer = IssuerLabels {
                mesh: mesh.to_owned(),
                issuer: ca.clone(),
            };
            let _ = self.issued.get_or_create(&issuer);
            let _ = self.failed.get_or_create(&issuer);
            let labels = CaLabels {
                mesh: mesh.to_owned(),
                ca,
                id: id[..id.len().min(16)].to_owned(),
            };
            let seconds = seconds_until(loaded.ca.not_after(), now);
            self.ca_expiry.get_or_create(&labels).set(seconds);
            meshes.insert(mesh.to_owned());
        }
        for mesh in meshes {
            for step in ROLLOUT_STEPS {
                let labels = StepLabels {
                    mesh: mesh.clone(),
                    step: step.as_str().into(),
                };
                let _ = self.rollout_waits.get_or_create(&labels);
                let _ = self.rollout_timeouts.get_or_create(&labels);
            }
            let _ = self
                .removed_while_presented
                .get_or_create(&MeshLabels { mesh });
        }
    }
}

impl Telemetry for Metrics {
    fn issued(&self, mesh: &str, issuer: &Issuer, took: Duration) {
        self.issued
            .get_or_create(&IssuerLabels {
                mesh: mesh.into(),
                issuer: issuer.to_string(),
            })
            .inc();
        self.issuance_seconds.observe(took.as_secs_f64());
    }

    fn reconciled(&self, scope: Scope, proxies: usize, took: Duration) {
        let labels = ScopeLabels {
            scope: scope.as_str().to_owned(),
        };
        self.reconcile_seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        self.reconciled_proxies
            .get_or_create(&labels)
            .inc_by(proxies as u64);
    }

    fn issue_failed(&self, mesh: &str, issuer: &Issuer) {
        self.failed
            .get_or_create(&IssuerLabels {
                mesh: mesh.into(),
                issuer: issuer.to_string(),
            })
            .inc();
    }

    fn rejected_update(&self) {
        self.rejected_updates.inc();
        self.status_changed();
    }

    fn gate_event(&self, mesh: &str, event: GateEvent) {
        let step = |step: RolloutStep| StepLabels {
            mesh: mesh.into(),
            step: step.as_str().into(),
        };
        match event {
            GateEvent::WaitStarted(s) => self.rollout_waits.get_or_create(&step(s)).inc(),
            GateEvent::TimedOut(s) => self.rollout_timeouts.get_or_create(&step(s)).inc(),
            GateEvent::RemovedWhilePresented => self
                .removed_while_presented
                .get_or_create(&MeshLabels { mesh: mesh.into() })
                .inc(),
        };
        self.timeline().gate_event(mesh, event, SystemTime::now());
        self.status_changed();
    }

    fn rollout_step(&self, change: &StepChange) {
        self.timeline().step(change, SystemTime::now());
        self.status_changed();
    }
}

/// Every rollout step, for the counters made to exist at 0 ([`Metrics::observe_cas`]).
const ROLLOUT_STEPS: [RolloutStep; 5] = [
    RolloutStep::TrustBeforeIdentity,
    RolloutStep::SansBeforeIdentity,
    RolloutStep::IdentityAck,
    RolloutStep::BreakLast,
    RolloutStep::Federation,
];

/// The step's place in [`ROLLOUT_STEPS`]: a step added to the enum fails to compile here until it is
/// listed there too.
#[cfg(test)]
fn step_index(step: RolloutStep) -> usize {
    match step {
        RolloutStep::TrustBeforeIdentity => 0,
        RolloutStep::SansBeforeIdentity => 1,
        RolloutStep::IdentityAck => 2,
        RolloutStep::BreakLast => 3,
        RolloutStep::Federation => 4,
    }
}

/// Buckets of a reconcile: from 50 µs (one proxy) to about 27 s.
fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 20))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rollout_step_is_listed_once() {
        for (i, step) in ROLLOUT_STEPS.into_iter().enumerate() {
            assert_eq!(step_index(step), i);
        }
    }

    #[test]
    fn exposition_names_every_documented_family() {
        let metrics = Metrics::new(Arc::default(), None, None);
        metrics.issued(
            "default",
            &Issuer::Backend("ca-1".into()),
            Duration::from_millis(1),
        );
        metrics.reconciled(Scope::Proxies, 1, Duration::from_micros(200));
        metrics.gate_event("default", GateEvent::WaitStarted(RolloutStep::BreakLast));
        metrics.gate_event("default", GateEvent::TimedOut(RolloutStep::IdentityAck));
        metrics.gate_event("default", GateEvent::RemovedWhilePresented);
        let keystore = meshca_keystore::MemoryKeystore::new();
        let settings = meshca_config::Settings::default();
        let yaml = "type: Mesh\nname: default\nmtls:\n  enabledBackend: ca-1\n  backends:\n    - {name: ca-1, type: builtin}\n";
        let parsed = meshca_config::parse_str(std::path::Path::new("m.yaml"), yaml).expect("valid");
        let resources = meshca_config::Resources::from_resources(parsed).expect("valid");
        let now = std::time::SystemTime::now();
        let src = meshca_control::CaSource {
            keystore: &keystore,
            mode: meshca_control::LoadMode::Apply,
            settings: &settings,
            previous: None,
            now,
        };
        let world = meshca_control::World::load(resources, &src).expect("valid");
        metrics.observe_cas(&world, now);
        let text = metrics.encode();
        for family in [
            "meshca_certificates_issued_total{mesh=\"default\",issuer=\"backend ca-1\"} 1",
            "meshca_issuance_seconds_count 1",
            "meshca_reconcile_seconds_count{scope=\"proxies\"} 1",
            "meshca_reconciled_proxies_total{scope=\"proxies\"} 1",
            "meshca_sds_streams 0",
            "meshca_sds_pushes_total",
            "meshca_sds_acks_total",
            "meshca_sds_nacks_total",
            "meshca_sds_ack_lag_seconds_bucket{le=\"+Inf\"} 0",
            "meshca_earliest_certificate_expiry_seconds",
            "meshca_earliest_ca_expiry_seconds",
            "meshca_rejected_updates_total",
            "meshca_revocation_reload_failures_total 0",
            "meshca_database_rows_refused_total 0",
            "meshca_rollout_waits_total{mesh=\"default\",step=\"break-last\"} 1",
            "meshca_rollout_timeouts_total{mesh=\"default\",step=\"identity-ack\"} 1",
            "meshca_ca_removed_while_presented_total{mesh=\"default\"} 1",
            "meshca_ca_expiry_seconds{mesh=\"default\",ca=\"backend ca-1\",id=\"",
        ] {
            assert!(text.contains(family), "{family} missing from:\n{text}");
        }
    }
}
