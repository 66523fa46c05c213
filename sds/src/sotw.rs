//! `StreamSecrets`: the state-of-the-world protocol.
//!
//! Every response holds all asked resources that are available, under one version that
//! is a hash of their content. A request carrying the last nonce is an ACK or NACK, one
//! carrying an older nonce is ignored, and a request that changes the names is a new
//! subscription.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use meshca_auth::Claims;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use crate::authn;
use crate::events::StreamEvent;
use crate::metrics::SdsMetrics;
use crate::names::{self, Resolved};
use crate::registry::StreamKind;
use crate::secret::SECRET_TYPE_URL;
use crate::service::Shared;
use crate::session::{self, Session};
use crate::snapshot::Snapshot;

type Outbound = mpsc::Sender<Result<DiscoveryResponse, Status>>;

/// Drives one stream until the proxy leaves or an error ends it (sent as the status).
pub(crate) async fn run(
    shared: Arc<Shared>,
    claims: Claims,
    inbound: Streaming<DiscoveryRequest>,
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
    mut inbound: Streaming<DiscoveryRequest>,
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
    let mut session = Session::open(shared, claims, ctx, Some(StreamKind::Sotw));
    let snapshot = tokio::select! {
        snapshot = session.wait_for_identity() => snapshot?,
        () = tx.closed() => return Ok(()),
    };
    let mut stream = SotwStream::new(session, tx.clone(), snapshot);
    stream.on_request(first, true).await?;
    loop {
        tokio::select! {
            () = tx.closed() => return Ok(()),
            snapshot = stream.session.next_change() => stream.on_snapshot(snapshot?).await?,
            received = inbound.message() => match received {
                Ok(Some(request)) => stream.on_request(request, false).await?,
                Ok(None) => return Ok(()),
                Err(status) => {
                    tracing::debug!(proxy = %stream.session.key(), %status, "stream ended");
                    return Ok(());
                }
            },
        }
    }
}

/// The last response sent on a stream.
struct Sent {
    nonce: String,
    version: String,
    resources: Vec<String>,
    /// The newest snapshot generation whose content equals this response.
    generation: u64,
    /// When it was sent, for the ACK-lag metric.
    sent_at: Instant,
}

struct SotwStream {
    session: Session,
    tx: Outbound,
    snapshot: Arc<Snapshot>,
    names: Vec<String>,
    last_sent: Option<Sent>,
    acked: bool,
    nonce_seq: u64,
    logged_unknown: HashSet<String>,
}

impl SotwStream {
    fn new(session: Session, tx: Outbound, snapshot: Arc<Snapshot>) -> Self {
        Self {
            session,
            tx,
            snapshot,
            names: Vec::new(),
            last_sent: None,
            acked: false,
            nonce_seq: 0,
            logged_unknown: HashSet::new(),
        }
    }

    async fn on_request(&mut self, request: DiscoveryRequest, first: bool) -> Result<(), Status> {
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
        let fresh = request.response_nonce.is_empty();
        if !fresh {
            let current = self
                .last_sent
                .as_ref()
                .is_some_and(|sent| sent.nonce == request.response_nonce);
            if !current {
                tracing::debug!(
                    proxy = %self.session.key(),
                    nonce = %request.response_nonce,
                    "ignoring a request with a stale nonce"
                );
                return Ok(());
            }
            self.on_reply(&request);
        }
        let names = names::dedup(request.resource_names);
        let changed = as_set(&names) != as_set(&self.names);
        if changed {
            self.names = names;
            let resources = self.names.clone();
            self.session.update_info(|info| info.resources = resources);
        }
        if fresh || changed {
            self.respond(fresh).await?;
        }
        Ok(())
    }

    /// Handles the ACK or NACK of the last response.
    fn on_reply(&mut self, request: &DiscoveryRequest) {
        let Some(sent) = &self.last_sent else { return };
        let shared = &self.session.shared;
        let proxy = self.session.key().clone();
        if let Some(error) = &request.error_detail {
            SdsMetrics::incr(&shared.metrics.nacks);
            tracing::warn!(
                proxy = %proxy,
                resources = ?sent.resources,
                version = %sent.version,
                message = %error.message,
                "proxy rejected secrets (NACK); it keeps its previous ones"
            );
            self.acked = false;
            let message = error.message.clone();
            self.session.update_info(|info| {
                info.nacks += 1;
                info.last_nack = Some(message.clone());
            });
            self.session.emit(StreamEvent::Nacked {
                stream: self.session.id,
                proxy,
                generation: sent.generation,
                resources: sent.resources.clone(),
                version: sent.version.clone(),
                message,
            });
        } else if request.version_info == sent.version {
            SdsMetrics::incr(&shared.metrics.acks);
            shared.metrics.ack_lag.observe(sent.sent_at.elapsed());
            self.acked = true;
            self.record_ack();
        } else {
            tracing::debug!(
                proxy = %proxy,
                version = %request.version_info,
                "reply to the last nonce with an unexpected version; not an ACK"
            );
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
        self.respond(false).await
    }

    /// Sends the current state if it differs from the last response (or always, when
    /// `force`d by a fresh request). When it does not differ, the last response is deemed
    /// to be of the current generation.
    async fn respond(&mut self, force: bool) -> Result<(), Status> {
        let Some((version, items)) = self.compute() else {
            return Ok(());
        };
        let generation = self.snapshot.generation;
        if let Some(sent) = self.last_sent.as_mut() {
            if !force && sent.version == version {
                if sent.generation != generation {
                    sent.generation = generation;
                    if self.acked {
                        self.record_ack();
                    }
                }
                return Ok(());
            }
        }
        self.send(version, items).await
    }

    fn compute(&mut self) -> Option<(String, Vec<(String, Resolved)>)> {
        let selection = names::select(&self.snapshot, &self.session.ctx, &self.names);
        for name in selection.unknown {
            if self.logged_unknown.insert(name.clone()) {
                tracing::warn!(
                    proxy = %self.session.key(),
                    resource = %name,
                    "proxy asked for an unknown secret name; it is not served"
                );
            }
        }
        if selection.items.is_empty() {
            return None;
        }
        let version = names::response_version(
            selection
                .items
                .iter()
                .map(|(name, _, version)| (name.as_str(), version.as_str())),
        );
        let items = selection
            .items
            .into_iter()
            .map(|(name, resolved, _)| (name, resolved))
            .collect();
        Some((version, items))
    }

    async fn send(
        &mut self,
        version: String,
        items: Vec<(String, Resolved)>,
    ) -> Result<(), Status> {
        self.nonce_seq += 1;
        let nonce = format!("{}-{}", self.session.id, self.nonce_seq);
        let resources = items
            .iter()
            .map(|(name, resolved)| resolved.to_any(name))
            .collect();
        let names: Vec<String> = items.into_iter().map(|(name, _)| name).collect();
        let response = DiscoveryResponse {
            version_info: version.clone(),
            resources,
            type_url: SECRET_TYPE_URL.to_owned(),
            nonce: nonce.clone(),
            ..Default::default()
        };
        if self.tx.send(Ok(response)).await.is_err() {
            return Err(Status::cancelled("the proxy went away"));
        }
        SdsMetrics::incr(&self.session.shared.metrics.responses_pushed);
        tracing::debug!(proxy = %self.session.key(), %version, resources = ?names, "pushed secrets");
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

fn as_set(names: &[String]) -> BTreeSet<&str> {
    names.iter().map(String::as_str).collect()
}
