//! The daemon's side of federation: the importer started with the settings' limits, its status in
//! `/api/status` and its metrics.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshca_config::Settings;
use meshca_control::World;
use meshca_federation::import::{ImportOptions, FIRST_RETRY, REFRESH_BOUNDS};
use meshca_federation::{Importer, PeerStatuses};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use serde::Serialize;
use tokio::sync::watch;

/// How the importer fetches, from the settings.
pub(crate) fn import_options(settings: &Settings) -> ImportOptions {
    ImportOptions {
        limits: meshca_control::bundle_limits(settings),
        timeout: settings.limits.federation_fetch_timeout.as_std(),
        // A peer is polled no more often than every 30 s, or this daemon's own refresh hint if lower
        // (only an in-process daemon, such as a drill's, can be given one: the settings file cannot).
        refresh: (*REFRESH_BOUNDS.start()).min(settings.federation.refresh_hint.as_std())
            ..=*REFRESH_BOUNDS.end(),
        retry: FIRST_RETRY,
        stale_after: settings.federation.stale_after.as_std(),
    }
}

/// The importer as the admin API and the metrics read it.
#[derive(Clone, Debug)]
pub struct FederationView {
    /// The importer.
    pub importer: Importer,
    /// `federation.staleAfter`.
    pub stale_after: Duration,
}

/// One federated trust domain in `/api/status` (`federation`).
#[derive(Debug, Serialize)]
pub(crate) struct RelationshipView {
    trust_domain: String,
    /// The FederationRelationships naming it, `mesh/name`.
    relationships: Vec<String>,
    url: String,
    profile: &'static str,
    /// `nothing`, `initialBundle`, `stored` or `fetched`.
    held_from: meshca_federation::HeldFrom,
    sequence: Option<u64>,
    refresh_hint_seconds: Option<u64>,
    x509_authorities: usize,
    jwt_authorities: usize,
    fetched_at: Option<String>,
    age_seconds: Option<u64>,
    /// The condition: `Fresh`, or `Stale` (older than `federation.staleAfter`, or nothing held).
    condition: &'static str,
    last_attempt: Option<String>,
    last_error: Option<String>,
    next_fetch: Option<String>,
    fetches: meshca_federation::import::FetchCounts,
}

impl FederationView {
    /// Every followed peer's status at `now`, with the relationships `world` names for it.
    pub(crate) fn relationships(&self, world: &World, now: SystemTime) -> Vec<RelationshipView> {
        let statuses = self.importer.status().borrow().clone();
        statuses
            .iter()
            .map(|(td, s)| RelationshipView {
                trust_domain: td.to_string(),
                relationships: world
                    .federation
                    .get(td)
                    .map(|d| {
                        d.relationships
                            .iter()
                            .map(|(mesh, name)| format!("{mesh}/{name}"))
                            .collect()
                    })
                    .unwrap_or_default(),
                url: s.url.clone(),
                profile: s.profile,
                held_from: s.held_from,
                sequence: s.sequence,
                refresh_hint_seconds: s.refresh_hint.map(|h| h.as_secs()),
                x509_authorities: s.x509_authorities,
                jwt_authorities: s.jwt_authorities,
                fetched_at: s.fetched_at.map(meshca_control::rfc3339),
                age_seconds: s.age(now).map(|a| a.as_secs()),
                condition: if s.is_stale(now, self.stale_after) {
                    "Stale"
                } else {
                    "Fresh"
                },
                last_attempt: s.last_attempt.map(meshca_control::rfc3339),
                last_error: s.last_error.clone(),
                next_fetch: s.next_fetch.map(meshca_control::rfc3339),
                fetches: s.fetches,
            })
            .collect()
    }
}

/// A gauge's value for one peer, if it has one.
type GaugeOf<'a> = dyn Fn(&meshca_federation::PeerStatus) -> Option<i64> + 'a;

/// The federation metrics, read from the importer's status at scrape time.
#[derive(Debug)]
pub(crate) struct FederationCollector {
    pub(crate) status: watch::Receiver<Arc<PeerStatuses>>,
    pub(crate) stale_after: Duration,
}

impl Collector for FederationCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let statuses = self.status.borrow().clone();
        if statuses.is_empty() {
            return Ok(());
        }
        let now = SystemTime::now();
        let gauges: [(&str, &str, &GaugeOf<'_>); 3] = [
            (
                "meshca_federation_bundle_age_seconds",
                "Seconds since a fetch last confirmed the bundle held for a federated trust domain (since it was first held, for an initial bundle never confirmed)",
                &|s| s.age(now).map(|a| i64::try_from(a.as_secs()).unwrap_or(i64::MAX)),
            ),
            (
                "meshca_federation_bundle_stale",
                "1 while the bundle held for a federated trust domain is older than federation.staleAfter, or none is held; it keeps serving",
                &|s| Some(i64::from(s.is_stale(now, self.stale_after))),
            ),
            (
                "meshca_federation_bundle_sequence",
                "The spiffe_sequence of the bundle held for a federated trust domain",
                &|s| s.sequence.map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
            ),
        ];
        for (name, help, value) in gauges {
            let mut metric =
                encoder.encode_descriptor(name, help, None, ConstGauge::new(0i64).metric_type())?;
            for (td, s) in statuses.iter() {
                if let Some(v) = value(s) {
                    let labels = [("trust_domain", td.to_string())];
                    ConstGauge::new(v).encode(metric.encode_family(&labels)?)?;
                }
            }
        }
        let mut metric = encoder.encode_descriptor(
            "meshca_federation_fetches",
            "Fetches of federated trust domains' bundle endpoints, by result: ok (accepted), failed (no answer, an HTTP error, TLS), refused (the answer was refused whole)",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for (td, s) in statuses.iter() {
            for (result, n) in [
                ("ok", s.fetches.ok),
                ("failed", s.fetches.failed),
                ("refused", s.fetches.refused),
            ] {
                let labels = [
                    ("trust_domain", td.to_string()),
                    ("result", result.to_owned()),
                ];
                ConstCounter::new(n).encode(metric.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
