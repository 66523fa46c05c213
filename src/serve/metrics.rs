//! Prometheus metrics (DESIGN §10), exposed on the admin listener at `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::plan::Issuer;
use super::status::Status;

/// Labels of per-issuer metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IssuerLabels {
    /// Mesh name.
    pub mesh: String,
    /// `backend <name>` or `MeshIdentity <name>`.
    pub issuer: String,
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
    /// Resource updates rejected.
    pub rejected_updates: Counter,
    earliest_cert_expiry: Gauge,
    earliest_ca_expiry: Gauge,
    connected_proxies: Family<MeshLabels, Gauge>,
}

/// Reads the SDS server's counters at scrape time.
#[derive(Debug)]
struct SdsCollector(Arc<meshca_sds::SdsMetrics>);

impl Collector for SdsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let m = &self.0;
        let get = meshca_sds::SdsMetrics::get;
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
        ] {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

impl Metrics {
    /// Registers every metric; SDS counters are read from `sds` at scrape time.
    pub fn new(sds: Arc<meshca_sds::SdsMetrics>) -> Metrics {
        let mut registry = Registry::default();
        let issued = Family::<IssuerLabels, Counter>::default();
        registry.register(
            "meshca_certificates_issued",
            "Certificates issued",
            issued.clone(),
        );
        let failed = Family::<IssuerLabels, Counter>::default();
        registry.register(
            "meshca_certificates_failed",
            "Certificates that failed to issue or verify",
            failed.clone(),
        );
        let issuance_seconds = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        registry.register(
            "meshca_issuance_seconds",
            "Time to issue and verify one certificate",
            issuance_seconds.clone(),
        );
        let rejected_updates = Counter::default();
        registry.register(
            "meshca_rejected_updates",
            "Resource updates rejected as invalid",
            rejected_updates.clone(),
        );
        let earliest_cert_expiry = Gauge::default();
        registry.register(
            "meshca_earliest_certificate_expiry_seconds",
            "Seconds until the earliest served proxy certificate expires",
            earliest_cert_expiry.clone(),
        );
        let earliest_ca_expiry = Gauge::default();
        registry.register(
            "meshca_earliest_ca_expiry_seconds",
            "Seconds until the earliest CA expires",
            earliest_ca_expiry.clone(),
        );
        let connected_proxies = Family::<MeshLabels, Gauge>::default();
        registry.register(
            "meshca_connected_proxies",
            "Proxies with at least one SDS stream",
            connected_proxies.clone(),
        );
        registry.register_collector(Box::new(SdsCollector(sds)));
        Metrics {
            registry,
            issued,
            failed,
            issuance_seconds,
            rejected_updates,
            earliest_cert_expiry,
            earliest_ca_expiry,
            connected_proxies,
        }
    }

    /// Counts one issued certificate.
    pub fn issued(&self, mesh: &str, issuer: &Issuer, took: Duration) {
        self.issued
            .get_or_create(&IssuerLabels {
                mesh: mesh.into(),
                issuer: issuer.to_string(),
            })
            .inc();
        self.issuance_seconds.observe(took.as_secs_f64());
    }

    /// Counts one failed issuance.
    pub fn issue_failed(&self, mesh: &str, issuer: &Issuer) {
        self.failed
            .get_or_create(&IssuerLabels {
                mesh: mesh.into(),
                issuer: issuer.to_string(),
            })
            .inc();
    }

    /// Updates the gauges derived from the status.
    pub fn observe_status(&self, status: &Status) {
        self.earliest_cert_expiry
            .set(status.earliest_cert_expiry_seconds.unwrap_or(0));
        self.earliest_ca_expiry
            .set(status.earliest_ca_expiry_seconds.unwrap_or(0));
        self.connected_proxies.clear();
        for mesh in &status.meshes {
            self.connected_proxies
                .get_or_create(&MeshLabels {
                    mesh: mesh.name.clone(),
                })
                .set(mesh.connected_proxies as i64);
        }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            tracing::error!("metrics could not be encoded");
        }
        out
    }
}
