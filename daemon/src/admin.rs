//! The admin HTTP listener (docs/operations.md): readiness, health, metrics, the JSON API, and the web console
//! (`console`, a child of this module: it reads the same `AdminState`).

mod console;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use meshca_sds::{StreamInfo, StreamRegistry};
use meshca_serve::{shown, LogBudget};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::metrics::Metrics;
use super::replica::DatabaseView;
use super::stalled_writes::StalledWrites;
use meshca_control::{
    DataplaneStatus, Detail, LoopHealth, Status, StatusHandle, StatusUnavailable,
};

/// What the admin handlers read.
#[derive(Clone, Debug)]
pub struct AdminState {
    /// Asks the owner for its status (built when asked for).
    pub status: StatusHandle,
    /// Open SDS streams.
    pub streams: StreamRegistry,
    /// Metrics to expose.
    pub metrics: Arc<Metrics>,
    /// Set once every CA is loaded and SDS listens.
    pub ready: Arc<AtomicBool>,
    /// Whether the control loop keeps turning.
    pub owner_health: Arc<LoopHealth>,
    /// The replicas' database, as the heartbeat last heard it (`keystore.type: postgres` only).
    pub database: Option<tokio::sync::watch::Receiver<Arc<DatabaseView>>>,
    /// The Workload API's registrations, the callers of this server's own socket and the JWT-SVID keys.
    pub workloads: WorkloadsView,
    /// The agents connected over the agent protocol.
    pub agents: meshca_agent_server::Agents,
    /// The PKCS#11 token holding the CA keys (`keystore.pkcs11`).
    pub token: Option<meshca_hsm::Token>,
    /// The snapshots the owner publishes: the console's event streams follow them.
    pub snapshots: tokio::sync::watch::Receiver<Arc<meshca_control::Snapshot>>,
    /// The console's open event streams and its last rendered overview.
    pub console: console::Console,
    /// The `Host` names answered (`admin.allowedHosts`, besides addresses and `localhost`).
    pub allowed_hosts: super::admin_hosts::AllowedHosts,
    /// The federation peers followed, for `/api/status` (`federation`).
    pub federation: super::federation::FederationView,
    /// What each bundle endpoint serves, for `/api/bundles/{trust domain}` (`meshca bundle show`).
    pub served_bundles: super::bundle_endpoints::ServedBundles,
}

/// What the admin API reads to list the Workload API's registrations and the callers they match.
#[derive(Clone, Debug)]
pub struct WorkloadsView {
    /// The snapshots SDS and the Workload API serve (their registrations and identities).
    pub snapshots: tokio::sync::watch::Receiver<Arc<meshca_control::Snapshot>>,
    /// The open streams on this server's own Workload API socket (`None` when `workloadApi.listen` is
    /// empty: agents may still serve registrations).
    pub callers: Option<meshca_workload::Callers>,
    /// The JWT-SVID signing keys, for `/api/status` (`jwt_keys`).
    pub jwt_keys: meshca_workload::jwt_keys::JwtKeys,
}

/// One registration as `/api/workloads` shows it: what it says, the SPIFFE ID it serves now, and the
/// open streams of the callers it matched.
#[derive(Debug, Serialize)]
struct RegistrationView {
    mesh: String,
    name: String,
    dataplane: String,
    selectors: Vec<String>,
    agent: Option<String>,
    hint: Option<String>,
    /// The SPIFFE ID its callers get, once the identity is ready.
    spiffe_id: Option<String>,
    /// Why its callers get no SVID, when they get none.
    no_identity: Option<String>,
    /// Why no caller can reach it, when none can: a registration for this server while its own
    /// socket is off.
    not_served: Option<&'static str>,
    streams: Vec<meshca_workload::CallerStream>,
}

/// Why a registration without `agent` has no callers when this server's own socket is off.
const OWN_SOCKET_OFF: &str =
    "this server's own Workload API socket is off (workloadApi.listen is empty)";

impl WorkloadsView {
    fn registrations(&self) -> Vec<RegistrationView> {
        let snapshot = self.snapshots.borrow().clone();
        let streams = self
            .callers
            .as_ref()
            .map(meshca_workload::Callers::list)
            .unwrap_or_default();
        snapshot
            .registrations
            .iter()
            .map(|r| {
                let key = format!("{}/{}", r.proxy.mesh, r.name);
                let (spiffe_id, no_identity) = match snapshot.proxies.get(&r.proxy) {
                    Some(meshca_control::ProxyEntry::Ready(identity)) => {
                        (Some(identity.spiffe_id.clone()), None)
                    }
                    Some(
                        meshca_control::ProxyEntry::NoIdentity { reason }
                        | meshca_control::ProxyEntry::Refused { reason },
                    ) => (None, Some(reason.clone())),
                    Some(meshca_control::ProxyEntry::Pending) | None => (None, None),
                };
                RegistrationView {
                    mesh: r.proxy.mesh.to_string(),
                    name: r.name.clone(),
                    dataplane: r.proxy.name.to_string(),
                    selectors: r.selectors.iter().map(ToString::to_string).collect(),
                    agent: r.agent.clone(),
                    hint: r.hint.clone(),
                    spiffe_id,
                    no_identity,
                    not_served: (r.agent.is_none() && self.callers.is_none())
                        .then_some(OWN_SOCKET_OFF),
                    streams: streams
                        .iter()
                        .filter(|s| s.registrations.contains(&key))
                        .cloned()
                        .collect(),
                }
            })
            .collect()
    }
}

/// How long a scrape of `/metrics` waits for the control loop to refresh the state gauges (well inside
/// Prometheus's default scrape timeout of 10 s).
const METRICS_STATUS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long one turn of the control loop may take before `/ready` says the daemon is stuck.
const LOOP_STALL: std::time::Duration = std::time::Duration::from_secs(30);

/// A dataplane with its SDS streams.
#[derive(Debug, Serialize)]
struct DataplaneView {
    #[serde(flatten)]
    dataplane: DataplaneStatus,
    /// The last version the proxy ACKed on any of its streams.
    last_acked_version: Option<String>,
    sds_streams: Vec<StreamInfo>,
}

fn dataplane_view(dp: DataplaneStatus, all: &[StreamInfo]) -> DataplaneView {
    let sds_streams: Vec<StreamInfo> = all
        .iter()
        .filter(|s| *s.proxy.mesh == *dp.mesh && *s.proxy.name == *dp.name)
        .cloned()
        .collect();
    DataplaneView {
        last_acked_version: sds_streams
            .iter()
            .rev()
            .find_map(|s| s.last_acked_version.clone()),
        dataplane: dp,
        sds_streams,
    }
}

/// The router, separate from the listener so tests can call it directly.
pub fn router(state: AdminState) -> Router {
    let hosts = state.allowed_hosts.clone();
    Router::new()
        .route("/ready", get(ready))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/api/status", get(status))
        .route("/api/meshes", get(meshes))
        .route("/api/meshes/{mesh}", get(mesh))
        .route("/api/dataplanes", get(dataplanes))
        .route("/api/dataplanes/{mesh}/{name}", get(dataplane))
        .route("/api/streams", get(streams))
        .route("/api/rejected-update", get(rejected))
        .route("/api/replicas", get(replicas))
        .route("/api/workloads", get(workloads))
        .route("/api/agents", get(agents))
        .route("/api/bundles", get(served_bundles))
        .route("/api/bundles/{trust_domain}", get(served_bundle))
        .merge(console::routes())
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(
            hosts,
            super::admin_hosts::check,
        ))
}

async fn ready(State(s): State<AdminState>) -> Response {
    if !s.ready.load(Ordering::Acquire) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: CAs loading or SDS not listening yet\n",
        )
            .into_response();
    }
    let token_down = s
        .token
        .as_ref()
        .map(|t| (t.label().to_owned(), t.status()))
        .filter(|(_, status)| !status.up)
        .map(|(label, status)| {
            let since = meshca_control::rfc3339(status.since);
            (
                label,
                TokenDown {
                    reason: status.reason,
                    since,
                },
            )
        });
    match s.owner_health.busy_for(std::time::SystemTime::now()) {
        Some(busy) if busy > LOOP_STALL => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: the control loop has been busy with one step for {}s; new proxies and renewals wait\n",
                busy.as_secs()
            ),
        )
            .into_response(),
        // A token that stopped answering stops new signatures, not serving: what is issued stays valid,
        // and every replica sharing the token is in the same state, so the replica stays ready and says
        // what waits.
        _ if token_down.is_some() => {
            let (label, status) = token_down.unwrap_or_default();
            (
                StatusCode::OK,
                format!(
                    "ready, serving what is issued; the PKCS#11 token {label:?} does not answer ({}) since {}: no new certificate is signed until it does\n",
                    status.reason.as_deref().unwrap_or("no reason given"),
                    status.since,
                ),
            )
                .into_response()
        }
        // Every replica loses the database together: pulling them all would leave proxies nowhere to
        // reconnect, so a replica stays ready and says what waits.
        _ => match s.database.as_ref().map(|view| view.borrow().clone()) {
            Some(view) if !view.up && view.error.is_some() => (
                StatusCode::OK,
                format!(
                    "ready, serving what this replica holds; the database does not answer ({}); waiting for it: {}\n",
                    view.error.as_deref().unwrap_or_default(),
                    view.waiting.join("; ")
                ),
            )
                .into_response(),
            _ => (StatusCode::OK, "ready\n").into_response(),
        },
    }
}

/// Why `/ready` says the token is down.
#[derive(Debug, Default)]
struct TokenDown {
    reason: Option<String>,
    since: String,
}

/// The owner's status, or the response that says why there is none.
async fn current(s: &AdminState, detail: Detail) -> Result<meshca_control::StatusReply, Response> {
    s.status.get(detail).await.map_err(|e: StatusUnavailable| {
        (StatusCode::SERVICE_UNAVAILABLE, format!("no status: {e}\n")).into_response()
    })
}

async fn metrics(State(s): State<AdminState>) -> Response {
    // Gauges that describe the owner's state are read from a status built now (without the
    // per-dataplane list); counters and histograms were counted as things happened. While the loop
    // is busy with one long step, the scrape still answers, with the gauges of the last scrape.
    match s
        .status
        .get_within(Detail::Summary, METRICS_STATUS_WAIT)
        .await
    {
        Ok(reply) => s.metrics.observe(&reply.status, &reply.world),
        Err(e) => tracing::debug!("metrics: state gauges not refreshed: {e}"),
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
        .into_response()
}

/// The status document with each dataplane's SDS streams added.
async fn status(State(s): State<AdminState>) -> Response {
    let (mut status, world): (Status, _) = match current(&s, Detail::Full).await {
        Ok(reply) => (reply.status, reply.world),
        Err(response) => return response,
    };
    let federation = s
        .federation
        .relationships(&world, std::time::SystemTime::now());
    let all = s.streams.list();
    let dataplanes: Vec<DataplaneView> = std::mem::take(&mut status.dataplanes)
        .into_iter()
        .map(|d| dataplane_view(d, &all))
        .collect();
    let database = s.database.as_ref().map(|view| view.borrow().clone());
    let workloads = s.workloads.registrations();
    let jwt_keys = s.workloads.jwt_keys.status();
    let document = serde_json::to_value(&status).and_then(|mut document| {
        document["dataplanes"] = serde_json::to_value(dataplanes)?;
        document["workload_registrations"] = serde_json::to_value(workloads)?;
        document["jwt_keys"] = serde_json::to_value(jwt_keys)?;
        document["federation"] = serde_json::to_value(federation)?;
        document["federation_endpoints"] = serde_json::Value::Array(
            s.served_bundles
                .iter()
                .map(|(td, (served, fetches))| {
                    super::bundle_endpoints::endpoint_status(td, served, fetches)
                })
                .collect(),
        );
        if let Some(database) = database {
            document["database"] = serde_json::to_value(&*database)?;
        }
        if let Some(token) = &s.token {
            let status = token.status();
            document["keystore_token"] = serde_json::json!({
                "label": token.label(),
                "module": token.module(),
                "up": status.up,
                "since": meshca_control::rfc3339(status.since),
                "reason": status.reason,
            });
        }
        Ok(document)
    });
    match document {
        Ok(document) => Json(document).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the status could not be encoded: {e}\n"),
        )
            .into_response(),
    }
}

/// The trust domains whose bundle an endpoint serves, with each bundle's sequence.
async fn served_bundles(State(s): State<AdminState>) -> Response {
    let list: Vec<serde_json::Value> = s
        .served_bundles
        .iter()
        .map(|(td, (served, _))| {
            let served = served.borrow();
            serde_json::json!({
                "trust_domain": td.to_string(),
                "sequence": served.as_ref().and_then(|b| b.bundle.sequence),
                "x509_authorities": served.as_ref().map_or(0, |b| b.bundle.x509_authorities().len()),
                "jwt_authorities": served.as_ref().map_or(0, |b| b.bundle.jwt_authorities().len()),
            })
        })
        .collect();
    Json(list).into_response()
}

/// The SPIFFE bundle an endpoint serves now, byte for byte.
async fn served_bundle(
    State(s): State<AdminState>,
    axum::extract::Path(trust_domain): axum::extract::Path<String>,
) -> Response {
    let served = s
        .served_bundles
        .iter()
        .find(|(td, _)| td.as_str() == trust_domain)
        .map(|(_, (served, _))| served.borrow().clone());
    match served {
        Some(Some(bundle)) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            bundle.json,
        )
            .into_response(),
        Some(None) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the endpoint has no bundle to serve yet\n",
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!(
                "no bundle endpoint serves trust domain {} (federation.endpoints)\n",
                meshca_serve::shown(&trust_domain)
            ),
        )
            .into_response(),
    }
}

async fn meshes(State(s): State<AdminState>) -> Response {
    match current(&s, Detail::Summary).await {
        Ok(reply) => Json(reply.status.meshes).into_response(),
        Err(response) => response,
    }
}

async fn mesh(State(s): State<AdminState>, Path(name): Path<String>) -> Response {
    let status = match current(&s, Detail::Summary).await {
        Ok(reply) => reply.status,
        Err(response) => return response,
    };
    match status.meshes.into_iter().find(|m| m.name == name) {
        Some(m) => Json(m).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no mesh named {}\n", shown(&name)),
        )
            .into_response(),
    }
}

async fn dataplanes(State(s): State<AdminState>) -> Response {
    let dps = match current(&s, Detail::Full).await {
        Ok(reply) => reply.status.dataplanes,
        Err(response) => return response,
    };
    let all = s.streams.list();
    let views: Vec<DataplaneView> = dps.into_iter().map(|d| dataplane_view(d, &all)).collect();
    Json(views).into_response()
}

async fn dataplane(
    State(s): State<AdminState>,
    Path((mesh, name)): Path<(String, String)>,
) -> Response {
    let dps = match current(&s, Detail::Full).await {
        Ok(reply) => reply.status.dataplanes,
        Err(response) => return response,
    };
    let found = dps.into_iter().find(|d| d.mesh == mesh && d.name == name);
    match found {
        Some(d) => Json(dataplane_view(d, &s.streams.list())).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no dataplane {} in mesh {}\n", shown(&name), shown(&mesh)),
        )
            .into_response(),
    }
}

/// The Workload API's registrations, each with the callers' streams it serves (and, when this
/// server's own socket is off, why its own registrations have none: agents may serve the others).
async fn workloads(State(s): State<AdminState>) -> Json<Vec<RegistrationView>> {
    Json(s.workloads.registrations())
}

async fn agents(State(s): State<AdminState>) -> Json<Vec<meshca_agent_server::AgentStatus>> {
    Json(s.agents.list())
}

async fn streams(State(s): State<AdminState>) -> Json<Vec<StreamInfo>> {
    Json(s.streams.list())
}

async fn rejected(State(s): State<AdminState>) -> Response {
    match current(&s, Detail::Summary).await {
        Ok(reply) => Json(reply.status.last_rejected_update).into_response(),
        Err(response) => response,
    }
}

/// Serves the admin API on `listener` until `shutdown`.
///
/// At most `limits.connections` connections are served at once (more are closed when accepted,
/// with a warning a few times a minute), and a client that takes longer than `limits.head_timeout`
/// to send a request's head (or to start the next one on a kept-alive connection), or that leaves a
/// response unread that long, is disconnected.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    limits: AdminLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let service = hyper_util::service::TowerToHyperService::new(router(state));
    let slots = Arc::new(Semaphore::new(limits.connections));
    let shed_logged = LogBudget::new(limits.warnings_per_minute);
    let connections = TaskTracker::new();
    loop {
        let (stream, _) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "the admin API failed to accept a connection");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => continue,
                    }
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            if let Some(suppressed) = shed_logged.admit() {
                tracing::warn!(
                    limit = limits.connections,
                    suppressed,
                    "the admin API is at its connection limit (limits.adminConnections): new connections are closed at once until some close"
                );
            }
            continue;
        };
        let service = service.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.head_timeout)
                .serve_connection(
                    hyper_util::rt::TokioIo::new(StalledWrites::new(stream, limits.head_timeout)),
                    service,
                );
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = result {
                tracing::debug!(%error, "admin connection ended with an error");
            }
            drop(slot);
        });
    }
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Pause after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_ERROR_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// Bounds on admin API clients (the `limits:` settings).
#[derive(Clone, Copy, Debug)]
pub struct AdminLimits {
    /// Connections served at once.
    pub connections: usize,
    /// Time a client has to send a request's head, and to take a byte of a response being written.
    pub head_timeout: std::time::Duration,
    /// Warnings about shed connections logged per minute.
    pub warnings_per_minute: u32,
}

/// Why the admin listener could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for the admin API on {addr} (admin.listen): {error}")]
pub(crate) struct AdminListenError {
    /// `admin.listen`.
    addr: SocketAddr,
    /// Why.
    error: std::io::Error,
}

/// Binds the admin listener, naming the address on failure.
pub(crate) async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, AdminListenError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|error| AdminListenError { addr, error })
}

/// The replicas of the database and whether it answers; 404 for a daemon on files.
async fn replicas(State(s): State<AdminState>) -> Response {
    match &s.database {
        Some(view) => Json(view.borrow().clone()).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "no replicas: this daemon keeps its keys in files (keystore.type: file)\n",
        )
            .into_response(),
    }
}
