//! This replica among those of one database: its heartbeat, what the others said in theirs, and
//! whether the database answers. A replica that loses the database keeps serving what it holds.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meshca_db::{ReplicaRecord, Replicas};
use meshca_sds::StreamRegistry;
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;

/// The fastest heartbeat, however short `replica.leaseTimeout` is.
const MIN_HEARTBEAT: Duration = Duration::from_millis(200);

/// What the database said last, for the status and `/ready`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DatabaseView {
    /// This replica's name.
    pub replica: String,
    /// Whether the database answered the last heartbeat.
    pub up: bool,
    /// Why it did not, while it does not.
    pub error: Option<String>,
    /// What waits for the database while it does not answer.
    pub waiting: Vec<&'static str>,
    /// Every replica, as of the last answer (kept while the database does not answer).
    pub replicas: Vec<ReplicaRecord>,
}

/// What waits for the database while it is unreachable (everything else is served from memory).
const WAITS_FOR_DATABASE: [&str; 2] = [
    "a resource update that needs a CA this replica has not loaded (a new backend, MeshIdentity or rotation generation) is rejected until it answers",
    "tokens revoked through other replicas are refused here only once it answers",
];

/// The heartbeat: every third of `lease`, records this replica's proxies and streams and reads every
/// replica's, until `shutdown`. Publishes what it learns on `view`.
pub struct Heartbeat {
    /// The replicas table.
    pub replicas: Replicas,
    /// `replica.name`.
    pub name: String,
    /// `replica.leaseTimeout`.
    pub lease: Duration,
    /// This replica's open streams.
    pub streams: StreamRegistry,
    /// Where the view is published.
    pub view: watch::Sender<Arc<DatabaseView>>,
    /// Where the gauges go.
    pub metrics: Arc<Metrics>,
}

impl Heartbeat {
    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let every = (self.lease / 3).max(MIN_HEARTBEAT);
        loop {
            self.beat(started).await;
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    async fn beat(&self, started: f64) {
        let proxies = u32::try_from(self.streams.connected_proxies()).unwrap_or(u32::MAX);
        let streams = u32::try_from(self.streams.len()).unwrap_or(u32::MAX);
        let heard = async {
            self.replicas
                .heartbeat(&self.name, started, proxies, streams)
                .await?;
            self.replicas.list(self.lease).await
        }
        .await;
        let was_up = self.view.borrow().up;
        match heard {
            Ok(replicas) => {
                if !was_up {
                    tracing::info!(replica = %self.name, replicas = replicas.len(), "the database answers");
                }
                self.metrics.observe_replicas(&self.name, Some(&replicas));
                self.view.send_replace(Arc::new(DatabaseView {
                    replica: self.name.clone(),
                    up: true,
                    error: None,
                    waiting: Vec::new(),
                    replicas,
                }));
            }
            Err(e) => {
                let first = was_up || self.view.borrow().error.is_none();
                if first {
                    tracing::error!(
                        replica = %self.name,
                        "the database does not answer; serving and renewing from what this replica holds. Waiting for it: {}. {e}",
                        WAITS_FOR_DATABASE.join("; ")
                    );
                }
                self.metrics.observe_replicas(&self.name, None);
                let replicas = self.view.borrow().replicas.clone();
                self.view.send_replace(Arc::new(DatabaseView {
                    replica: self.name.clone(),
                    up: false,
                    error: Some(e.to_string()),
                    waiting: WAITS_FOR_DATABASE.to_vec(),
                    replicas,
                }));
            }
        }
    }
}
