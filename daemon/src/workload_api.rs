//! The Workload API socket of `meshca serve`: bound with the other listeners, served beside SDS.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use meshca_config::Settings;
use meshca_keystore::Keystore;
use meshca_serve::{BoundListeners, ListenError, Listener, StreamLimits};
use meshca_workload::jwt::CacheLimits;
use meshca_workload::jwt_keys::{JwtKeys, JwtKeysError};
use meshca_workload::{WorkloadApi, WorkloadOptions};
use tokio_util::sync::CancellationToken;

use crate::error::TaskError;

/// Why the Workload API could not be started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WorkloadApiError {
    /// Its sockets could not be bound.
    #[error("cannot start the Workload API (workloadApi.listen)")]
    Bind(#[source] ListenError),
    /// The JWT-SVID signing keys could not be loaded or made.
    #[error("cannot load the JWT-SVID signing keys")]
    JwtKeys(#[source] JwtKeysError),
}

/// Binds the sockets of `workloadApi.listen`; `None` when the list is empty (the API is off).
pub(crate) async fn bind(settings: &Settings) -> Result<Option<BoundListeners>, WorkloadApiError> {
    let paths = &settings.workload_api.listen;
    if paths.is_empty() {
        tracing::info!("the Workload API is off (workloadApi.listen is empty)");
        return Ok(None);
    }
    let listeners = paths
        .iter()
        .map(|path| Listener::UnixForAnyUser(path.clone()))
        .collect();
    let bound = meshca_serve::bind(listeners)
        .await
        .map_err(WorkloadApiError::Bind)?;
    for addr in bound.local_addrs() {
        tracing::info!(%addr, "Workload API listening");
    }
    for path in paths {
        warn_if_unreachable(path);
    }
    Ok(Some(bound))
}

/// Says so when a directory above the socket keeps other users out: the socket itself is open to
/// everyone (callers are told apart by their process), but only processes that can reach it get
/// anything, which is a safe choice the operator should know they made.
fn warn_if_unreachable(socket: &Path) {
    let Ok(absolute) = std::path::absolute(socket) else {
        return;
    };
    for dir in absolute.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        if meta.permissions().mode() & 0o001 == 0 {
            tracing::info!(
                socket = %socket.display(),
                dir = %dir.display(),
                "only users allowed into {} reach the Workload API socket; put it in a directory every workload may enter (e.g. /run/meshca) for workloads of other users",
                dir.display()
            );
            return;
        }
    }
}

/// Loads the JWT-SVID signing keys from `keystore` and starts their rotation, which runs for as long
/// as the keys are held (the Workload API server holds them).
pub(crate) async fn jwt_keys(
    keystore: Arc<dyn Keystore>,
    options: &WorkloadOptions,
) -> Result<JwtKeys, WorkloadApiError> {
    let keys = JwtKeys::load(keystore, options)
        .await
        .map_err(WorkloadApiError::JwtKeys)?;
    keys.spawn_rotation();
    Ok(keys)
}

/// The Workload API's options and connection limits from the settings.
pub(crate) fn options(settings: &Settings, sds: &StreamLimits) -> (WorkloadOptions, StreamLimits) {
    let limits = &settings.limits;
    let options = WorkloadOptions {
        ack_after: settings.workload_api.ack_after.as_std(),
        jwt_key_lifetime: settings.workload_api.jwt_key_lifetime.as_std(),
        streams_per_caller: to_usize(limits.workload_streams_per_caller),
        connections_per_uid: to_usize(limits.workload_connections_per_uid),
        request_bytes: to_usize(limits.workload_request_bytes),
        warnings_per_minute: limits.warnings_per_minute,
        jwt_audiences_per_request: to_usize(limits.jwt_audiences_per_request),
        jwt_audience_bytes: to_usize(limits.jwt_audience_bytes),
        jwt_svid_cache: jwt_cache_limits(limits),
        ..WorkloadOptions::default()
    };
    let connections = StreamLimits {
        connections_per_listener: to_usize(limits.workload_connections),
        idle_timeout: limits.workload_idle_timeout(),
        request_bytes: to_usize(limits.workload_request_bytes),
        ..sds.clone()
    };
    (options, connections)
}

/// The JWT-SVID cache's limits from the settings.
pub(crate) fn jwt_cache_limits(limits: &meshca_config::Limits) -> CacheLimits {
    CacheLimits {
        entries: to_usize(limits.jwt_svid_cache_entries),
        bytes: usize::try_from(limits.jwt_svid_cache_bytes).unwrap_or(usize::MAX),
        bytes_per_identity: usize::try_from(limits.jwt_svid_cache_bytes_per_identity)
            .unwrap_or(usize::MAX),
    }
}

fn to_usize(value: u32) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// Serves `api`, and `sds` to Envoys set up for a SPIRE agent's socket, on `bound` until `shutdown`
/// fires.
pub(crate) async fn serve(
    bound: BoundListeners,
    api: WorkloadApi,
    sds: meshca_sds::SdsServer,
    limits: StreamLimits,
    shutdown: CancellationToken,
) -> Result<(), TaskError> {
    let policy = api.conn_policy(limits);
    // Its streams end with the SDS listeners': they stand on the same hub, whose snapshot dispatcher
    // closes every wait when the hub's streams are closed.
    bound
        .serve_service(
            api.routes(Some(sds.attested_routes())),
            policy,
            || {},
            shutdown,
        )
        .await
        .map_err(TaskError::WorkloadApi)
}
