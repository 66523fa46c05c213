//! `DeltaSecrets`: the incremental protocol.
//!
//! The proxy subscribes and unsubscribes per resource and says which versions it already
//! holds; each response carries only resources whose version differs from what the proxy
//! holds, plus `removed_resources` for subscribed ones that stopped existing. ACK/NACK by
//! nonce as in the state-of-the-world protocol; subscription changes are applied whatever
//! the nonce.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};
use meshca_auth::Claims;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use crate::authn;
use crate::events::StreamEvent;
use crate::metrics::SdsMetrics;
use crate::names::{self, Lookup, Resolved};
use crate::registry::StreamKind;
use crate::secret::SECRET_TYPE_URL;
use crate::service::Shared;
use crate::session::{self, Session};
use crate::snapshot::Snapshot;

type Outbound = mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>;

/// Drives one delta stream until the proxy leaves or an error ends it.
pub(crate) async fn run(
    shared: Arc<Shared>,
    claims: Claims,
    inbound: Streaming<DeltaDiscoveryRequest>,
    tx: Outbound,
) {
    if let Err(status) = serve(shared, claims, inbound, &tx).await {
        // The proxy may already be gone; then there is nobody to tell.
        let _ = tx.send(Err(status)).await;
    }
}

async fn serve(
    shared: Arc<Shared>,
    claims: Claims,
    mut inbound: Streaming<DeltaDiscoveryRequest>,
    tx: &Outbound,
) -> Result<(), Status> {
    let first = tokio::select! {
        first = session::first_request(&shared, inbound.message()) => first?,
        () = tx.closed() => return Ok(()),
    };
    let Some(first) = first else { return Ok(()) };
    authn::check_first_node(first.node.as_ref(), &authn::proxy_key(&claims))
        .map_err(|status| shared.auth_failure(status))?;
    let ctx = authn::proxy_context(&claims, first.node.as_ref());
    let mut session = Session::open(shared, claims, ctx, Some(StreamKind::Delta));
    let snapshot = tokio::select! {
        snapshot = session.wait_for_identity() => snapshot?,
        () = tx.closed() => return Ok(()),
    };
    let mut stream = DeltaStream::new(session, tx.clone(), snapshot);
    stream.on_request(first, true).await?;
    loop {
        tokio::select! {
            () = tx.closed() => return Ok(()),
            snapshot = stream.session.next_change() => stream.on_snapshot(snapshot?).await?,
            received = inbound.message() => match received {
                Ok(Some(request)) => stream.on_request(request, false).await?,
                Ok(None) => return Ok(()),
                Err(status) => {
                    tracing::debug!(proxy = %stream.session.key(), %status, "delta stream ended");
                    return Ok(());
                }
            },
        }
    }
}

/// The last response sent on a delta stream.
struct Sent {
    nonce: String,
    version: String,
    /// Resources it updated or removed.
    resources: Vec<String>,
    generation: u64,
    /// When it was sent, for the ACK-lag metric.
    sent_at: Instant,
}

struct DeltaStream {
    session: Session,
    tx: Outbound,
    snapshot: Arc<Snapshot>,
    subscribed: BTreeSet<String>,
    /// What the proxy holds, as far as we know: name → version.
    held: HashMap<String, String>,
    last_sent: Option<Sent>,
    acked: bool,
    nonce_seq: u64,
    logged_unknown: HashSet<String>,
}

/// What has to go out to bring the proxy up to date.
#[derive(Default)]
struct Diff {
    updates: Vec<(String, Resolved, String)>,
    removed: Vec<String>,
}

impl DeltaStream {
    fn new(session: Session, tx: Outbound, snapshot: Arc<Snapshot>) -> Self {
        Self {
            session,
            tx,
            snapshot,
            subscribed: BTreeSet::new(),
            held: HashMap::new(),
            last_sent: None,
            acked: false,
            nonce_seq: 0,
            logged_unknown: HashSet::new(),
        }
    }

    async fn on_request(
        &mut self,
        request: DeltaDiscoveryRequest,
        first: bool,
    ) -> Result<(), Status> {
        if !first {
            authn::check_later_node(request.node.as_ref(), self.session.key())
                .map_err(|status| self.session.shared.auth_failure(status))?;
        }
        if !request.type_url.is_empty() && request.type_url != SECRET_TYPE_URL {
            return Err(Status::invalid_argument(format!(
                "this is a secret discovery service: type_url must be {SECRET_TYPE_URL:?}, not {:?}",
                request.type_url
            )));
        }
        if first {
            self.held.extend(request.initial_resource_versions);
        }
        let mut changed = false;
        for name in request.resource_names_subscribe {
            if name == "*" {
                tracing::debug!(proxy = %self.session.key(), "wildcard subscription ignored: SDS serves named secrets only");
                continue;
            }
            changed |= self.subscribed.insert(name);
        }
        for name in request.resource_names_unsubscribe {
            changed |= self.subscribed.remove(&name);
            self.held.remove(&name);
        }
        if changed {
            let resources: Vec<String> = self.subscribed.iter().cloned().collect();
            self.session.update_info(|info| info.resources = resources);
        }
        if !request.response_nonce.is_empty() {
            let current = self
                .last_sent
                .as_ref()
                .is_some_and(|sent| sent.nonce == request.response_nonce);
            if current {
                self.on_reply(request.error_detail.map(|status| status.message));
            } else {
                tracing::debug!(
                    proxy = %self.session.key(),
                    nonce = %request.response_nonce,
                    "ignoring the ACK/NACK part of a request with a stale nonce"
                );
            }
        }
        if first || changed {
            self.respond().await?;
        }
        Ok(())
    }

    fn on_reply(&mut self, error: Option<String>) {
        let Some(sent) = &self.last_sent else { return };
        let metrics = &self.session.shared.metrics;
        match error {
            Some(message) => {
                SdsMetrics::incr(&metrics.nacks);
                tracing::warn!(
                    proxy = %self.session.key(),
                    resources = ?sent.resources,
                    version = %sent.version,
                    message = %message,
                    "proxy rejected secrets (NACK); it keeps its previous ones"
                );
                self.acked = false;
                let last = message.clone();
                self.session.update_info(|info| {
                    info.nacks += 1;
                    info.last_nack = Some(last);
                });
                self.session.emit(StreamEvent::Nacked {
                    stream: self.session.id,
                    proxy: self.session.key().clone(),
                    generation: sent.generation,
                    resources: sent.resources.clone(),
                    version: sent.version.clone(),
                    message,
                });
            }
            None => {
                SdsMetrics::incr(&metrics.acks);
                metrics.ack_lag.observe(sent.sent_at.elapsed());
                self.acked = true;
                self.record_ack();
            }
        }
    }

    fn record_ack(&self) {
        let Some(sent) = &self.last_sent else { return };
        let (version, generation) = (sent.version.clone(), sent.generation);
        self.session.update_info(|info| {
            info.last_acked_version = Some(version);
            info.acked_generation = Some(generation);
        });
        self.session.emit(StreamEvent::Acked {
            stream: self.session.id,
            proxy: self.session.key().clone(),
            generation: sent.generation,
            resources: sent.resources.clone(),
            version: sent.version.clone(),
        });
    }

    async fn on_snapshot(&mut self, snapshot: Arc<Snapshot>) -> Result<(), Status> {
        self.snapshot = snapshot;
        self.respond().await
    }

    /// Sends what the proxy lacks; when it lacks nothing, the last response is deemed to
    /// be of the current generation.
    async fn respond(&mut self) -> Result<(), Status> {
        let diff = self.diff();
        if diff.updates.is_empty() && diff.removed.is_empty() {
            let generation = self.snapshot.generation;
            if let Some(sent) = self.last_sent.as_mut() {
                if sent.generation != generation {
                    sent.generation = generation;
                    if self.acked {
                        self.record_ack();
                    }
                }
            }
            return Ok(());
        }
        self.send(diff).await
    }

    fn diff(&mut self) -> Diff {
        let mut diff = Diff::default();
        for name in &self.subscribed {
            match names::resolve(&self.snapshot, &self.session.ctx, name) {
                Lookup::Found(resolved) => {
                    let version = resolved.version();
                    if self.held.get(name) != Some(&version) {
                        diff.updates.push((name.clone(), resolved, version));
                    }
                }
                lookup => {
                    if let Lookup::Unknown = lookup {
                        if self.logged_unknown.insert(name.clone()) {
                            tracing::warn!(
                                proxy = %self.session.key(),
                                resource = %name,
                                "proxy asked for an unknown secret name; it is not served"
                            );
                        }
                    }
                    if self.held.contains_key(name) {
                        diff.removed.push(name.clone());
                    }
                }
            }
        }
        diff
    }

    async fn send(&mut self, diff: Diff) -> Result<(), Status> {
        self.nonce_seq += 1;
        let nonce = format!("{}-{}", self.session.id, self.nonce_seq);
        let version = names::response_version(
            diff.updates
                .iter()
                .map(|(name, _, version)| (name.as_str(), version.as_str()))
                .chain(diff.removed.iter().map(|name| (name.as_str(), "removed"))),
        );
        let resources = diff
            .updates
            .iter()
            .map(|(name, resolved, version)| Resource {
                name: name.clone(),
                version: version.clone(),
                resource: Some(resolved.to_any(name)),
                ..Default::default()
            })
            .collect();
        let response = DeltaDiscoveryResponse {
            system_version_info: version.clone(),
            resources,
            type_url: SECRET_TYPE_URL.to_owned(),
            removed_resources: diff.removed.clone(),
            nonce: nonce.clone(),
            ..Default::default()
        };
        if self.tx.send(Ok(response)).await.is_err() {
            return Err(Status::cancelled("the proxy went away"));
        }
        SdsMetrics::incr(&self.session.shared.metrics.responses_pushed);
        let mut names = Vec::with_capacity(diff.updates.len() + diff.removed.len());
        for (name, _, resource_version) in diff.updates {
            self.held.insert(name.clone(), resource_version);
            names.push(name);
        }
        for name in diff.removed {
            self.held.remove(&name);
            names.push(name);
        }
        tracing::debug!(proxy = %self.session.key(), %version, resources = ?names, "pushed secret changes");
        let sent_version = version.clone();
        self.session
            .update_info(|info| info.last_sent_version = sent_version);
        self.last_sent = Some(Sent {
            nonce,
            version,
            resources: names,
            generation: self.snapshot.generation,
            sent_at: Instant::now(),
        });
        self.acked = false;
        Ok(())
    }
}
