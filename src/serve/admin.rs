//! The admin HTTP listener (docs/operations.md): readiness, health, metrics and the JSON API.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use meshca_sds::{StreamInfo, StreamRegistry};
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;
use meshca_control::{DataplaneStatus, Status};

/// What the admin handlers read.
#[derive(Clone, Debug)]
pub struct AdminState {
    /// The owner's latest status.
    pub status: watch::Receiver<Arc<Status>>,
    /// Open SDS streams.
    pub streams: StreamRegistry,
    /// Metrics to expose.
    pub metrics: Arc<Metrics>,
    /// Set once every CA is loaded and SDS listens.
    pub ready: Arc<AtomicBool>,
}

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
        .filter(|s| s.proxy.mesh == dp.mesh && s.proxy.name == dp.name)
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
        .with_state(state)
}

async fn ready(State(s): State<AdminState>) -> Response {
    if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: CAs loading or SDS not listening yet\n",
        )
            .into_response()
    }
}

async fn metrics(State(s): State<AdminState>) -> Response {
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
    let mut status = (**s.status.borrow()).clone();
    let all = s.streams.list();
    let dataplanes: Vec<DataplaneView> = std::mem::take(&mut status.dataplanes)
        .into_iter()
        .map(|d| dataplane_view(d, &all))
        .collect();
    let document = serde_json::to_value(&status).and_then(|mut document| {
        document["dataplanes"] = serde_json::to_value(dataplanes)?;
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

async fn meshes(State(s): State<AdminState>) -> Response {
    Json(s.status.borrow().meshes.clone()).into_response()
}

async fn mesh(State(s): State<AdminState>, Path(name): Path<String>) -> Response {
    match s.status.borrow().meshes.iter().find(|m| m.name == name) {
        Some(m) => Json(m.clone()).into_response(),
        None => (StatusCode::NOT_FOUND, format!("no mesh named {name:?}\n")).into_response(),
    }
}

async fn dataplanes(State(s): State<AdminState>) -> Json<Vec<DataplaneView>> {
    let all = s.streams.list();
    let dps = s.status.borrow().dataplanes.clone();
    Json(dps.into_iter().map(|d| dataplane_view(d, &all)).collect())
}

async fn dataplane(
    State(s): State<AdminState>,
    Path((mesh, name)): Path<(String, String)>,
) -> Response {
    let found = s
        .status
        .borrow()
        .dataplanes
        .iter()
        .find(|d| d.mesh == mesh && d.name == name)
        .cloned();
    match found {
        Some(d) => Json(dataplane_view(d, &s.streams.list())).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no dataplane {mesh}/{name}\n"),
        )
            .into_response(),
    }
}

async fn streams(State(s): State<AdminState>) -> Json<Vec<StreamInfo>> {
    Json(s.streams.list())
}

async fn rejected(State(s): State<AdminState>) -> Response {
    Json(s.status.borrow().last_rejected_update.clone()).into_response()
}

/// Serves the admin API on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// Binds the admin listener, naming the address on failure.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!("cannot listen for the admin API on {addr} (admin.listen): {e}")
    })
}
