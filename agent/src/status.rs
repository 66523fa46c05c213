//! What the agent tells its operator: `/ready`, `/api/status` and `/metrics` (Prometheus) on its admin
//! listener (loopback, and only to requests naming an address, `localhost` or this host: see
//! [`meshca_serve::allowed_hosts`]). Never a key, a token or a certificate's content.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use meshca_serve::allowed_hosts::{self, AllowedHosts};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::local::RegistrationStatus;
use crate::AgentError;

/// The connection to the servers, as the status shows it.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerStatus {
    /// The server the agent is connected to, if any.
    pub connected: Option<String>,
    /// Since when it is connected, or since when it is not (unix seconds).
    pub since: Option<u64>,
    /// The last connection failure.
    pub last_error: Option<String>,
}

/// Everything `/api/status` shows.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// The agent's name (from its token).
    pub agent: String,
    /// The server connection.
    pub server: ServerStatus,
    /// The version of the last state received on the current (or last) stream.
    pub last_version_received: Option<u64>,
    /// The last version acknowledged.
    pub last_version_acknowledged: Option<u64>,
    /// Whether a state is served on the Workload API socket.
    pub serving: bool,
    /// The Workload API streams open on this host.
    pub open_streams: usize,
    /// The registrations that name this agent.
    pub registrations: Vec<RegistrationWithStreams>,
}

/// One registration with its open streams.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistrationWithStreams {
    /// The registration.
    #[serde(flatten)]
    pub registration: RegistrationStatus,
    /// Its Workload API streams open on this host.
    pub open_streams: u32,
}

/// The status, shared between the agent and its admin listener.
#[derive(Debug, Clone)]
pub struct StatusHandle(Arc<watch::Sender<AgentStatus>>);

impl Default for StatusHandle {
    fn default() -> Self {
        StatusHandle(Arc::new(watch::Sender::new(AgentStatus::default())))
    }
}

impl StatusHandle {
    /// A copy of the current status.
    pub fn get(&self) -> AgentStatus {
        self.0.borrow().clone()
    }

    /// Every change of the status, as it happens.
    pub fn subscribe(&self) -> watch::Receiver<AgentStatus> {
        self.0.subscribe()
    }

    /// Changes the status.
    pub(crate) fn update(&self, change: impl FnOnce(&mut AgentStatus)) {
        self.0.send_modify(change);
    }

    /// Whether the agent is ready, or why not.
    pub fn ready(&self) -> Result<(), String> {
        let status = self.get();
        if status.serving {
            return Ok(());
        }
        Err(match status.server.last_error {
            Some(error) => format!("no state received from any server yet; last error: {error}"),
            None => "no state received from any server yet".to_owned(),
        })
    }
}

/// Unix seconds now.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Binds the admin listener at `addr`.
pub(crate) async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, AgentError> {
    if !addr.ip().is_loopback() {
        return Err(AgentError::AdminNotLoopback { addr });
    }
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| AgentError::AdminBind { addr, source })
}

/// Serves `/ready` and `/api/status` until `shutdown` fires.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    status: StatusHandle,
    shutdown: CancellationToken,
) {
    let hosts = AllowedHosts::new(&[]);
    let app = Router::new()
        .route("/ready", get(ready))
        .route("/api/status", get(api_status))
        .route("/metrics", get(metrics))
        .with_state(status)
        .layer(axum::middleware::from_fn_with_state(hosts, check_host));
    if let Err(error) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
    {
        tracing::error!(%error, "the agent's admin listener failed");
    }
}

/// Answers only requests for the listener's address, `localhost` or this host's name: a web page that
/// rebinds its own name to the loopback address reads nothing (421).
async fn check_host(
    State(hosts): State<AllowedHosts>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match allowed_hosts::refusal(&hosts, request.headers(), request.uri(), "") {
        None => next.run(request).await,
        Some(body) => (StatusCode::MISDIRECTED_REQUEST, body).into_response(),
    }
}

async fn ready(State(status): State<StatusHandle>) -> Response {
    match status.ready() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response(),
    }
}

async fn api_status(State(status): State<StatusHandle>) -> Json<AgentStatus> {
    Json(status.get())
}

async fn metrics(State(status): State<StatusHandle>) -> Response {
    match render_metrics(&status.get(), unix_now()) {
        Ok(text) => (
            StatusCode::OK,
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response(),
    }
}

/// The status as Prometheus metrics (OpenMetrics text) at `now` (unix seconds).
fn render_metrics(status: &AgentStatus, now: u64) -> Result<String, std::fmt::Error> {
    use prometheus_client::metrics::gauge::ConstGauge;
    let mut registry = prometheus_client::registry::Registry::default();
    let connected = status.server.connected.is_some();
    registry.register(
        "meshca_agent_server_connected",
        "1 while the agent holds a stream to a meshca server, 0 while it has none",
        ConstGauge::new(i64::from(connected)),
    );
    // Since when the agent has no server (since it started, if it never had one); 0 while connected.
    let without = match (connected, status.server.since) {
        (false, Some(since)) => now.saturating_sub(since),
        _ => 0,
    };
    registry.register(
        "meshca_agent_server_disconnected_seconds",
        "seconds since the agent last had a meshca server (0 while it has one)",
        ConstGauge::new(i64::try_from(without).unwrap_or(i64::MAX)),
    );
    registry.register(
        "meshca_agent_serving",
        "1 once the agent serves a state on its Workload API socket",
        ConstGauge::new(i64::from(status.serving)),
    );
    registry.register(
        "meshca_agent_workload_streams",
        "Workload API streams open on this host",
        ConstGauge::new(i64::try_from(status.open_streams).unwrap_or(i64::MAX)),
    );
    registry.register(
        "meshca_agent_registrations",
        "WorkloadRegistrations naming this agent",
        ConstGauge::new(i64::try_from(status.registrations.len()).unwrap_or(i64::MAX)),
    );
    let without_identity = status
        .registrations
        .iter()
        .filter(|r| r.registration.spiffe_id.is_none())
        .count();
    registry.register(
        "meshca_agent_registrations_without_identity",
        "registrations naming this agent for which it holds no certificate",
        ConstGauge::new(i64::try_from(without_identity).unwrap_or(i64::MAX)),
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_without_a_server_says_so_and_for_how_long() {
        let status = AgentStatus {
            server: ServerStatus {
                connected: None,
                since: Some(1_000),
                last_error: Some("connection refused".into()),
            },
            ..AgentStatus::default()
        };
        let text = render_metrics(&status, 1_090).expect("encoded");
        assert!(text.contains("meshca_agent_server_connected 0\n"), "{text}");
        assert!(
            text.contains("meshca_agent_server_disconnected_seconds 90\n"),
            "{text}"
        );
        assert!(text.contains("meshca_agent_serving 0\n"), "{text}");
        assert!(
            !text.contains("connection refused"),
            "no error text in metrics"
        );
        let connected = AgentStatus {
            server: ServerStatus {
                connected: Some("https://ca-1:5678".into()),
                since: Some(1_000),
                last_error: None,
            },
            serving: true,
            open_streams: 3,
            ..AgentStatus::default()
        };
        let text = render_metrics(&connected, 1_090).expect("encoded");
        assert!(text.contains("meshca_agent_server_connected 1\n"), "{text}");
        assert!(
            text.contains("meshca_agent_server_disconnected_seconds 0\n"),
            "{text}"
        );
        assert!(text.contains("meshca_agent_workload_streams 3\n"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
