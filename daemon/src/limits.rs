//! The `limits:` settings turned into what the SDS server and the admin API enforce, fitted to the
//! open-file limit the daemon runs under.

use meshca_config::Settings;
use meshca_serve::StreamLimits;

use super::admin::AdminLimits;

/// Descriptors kept for everything but client connections: keystore and resource files, the
/// file watcher, the runtime, logs.
const RESERVED_DESCRIPTORS: u64 = 256;

/// What the SDS server and the admin API enforce.
#[derive(Clone, Debug)]
pub(crate) struct ServeLimits {
    pub(crate) sds: StreamLimits,
    pub(crate) admin: AdminLimits,
    /// The Workload API's options and connection limits.
    pub(crate) workload: (meshca_workload::WorkloadOptions, StreamLimits),
}

impl ServeLimits {
    /// The limits of `settings`. Connection limits that together would need more descriptors than
    /// the process may open are lowered to fit (with a warning): past the open-file limit, accepts
    /// fail for every listener at once, where a lowered limit sheds only the busy listener's
    /// newest connections.
    pub(crate) fn from_settings(settings: &Settings) -> ServeLimits {
        let limits = &settings.limits;
        let mut sds = StreamLimits {
            connections_per_listener: to_usize(limits.sds_connections),
            connect_timeout: limits.connect_timeout(),
            idle_timeout: limits.idle_timeout(),
            streams_per_connection: limits.streams_per_connection,
            streams_per_proxy: to_usize(limits.streams_per_proxy),
            names_per_stream: to_usize(limits.names_per_stream),
            names_per_proxy: to_usize(limits.names_per_proxy),
            name_bytes: to_usize(limits.name_bytes),
            request_bytes: to_usize(limits.request_bytes),
            warnings_per_minute: limits.warnings_per_minute,
        };
        let admin = AdminLimits {
            connections: to_usize(limits.admin_connections),
            head_timeout: limits.connect_timeout(),
            warnings_per_minute: limits.warnings_per_minute,
        };
        let listeners = settings.sds.listen.len();
        if let Some(open_files) = raise_open_file_limit() {
            let fitted = fit_connections(open_files, listeners, &sds, &admin);
            if fitted < sds.connections_per_listener {
                // The default adapts quietly; a value the operator chose is worth a warning.
                let chosen =
                    limits.sds_connections != meshca_config::Limits::default().sds_connections;
                let message = format!(
                    "limits.sdsConnections ({}) does not fit the open-file limit ({open_files}): each of the {listeners} SDS listeners takes at most {fitted} connections; raise the limit (systemd LimitNOFILE=, ulimit -n) to allow more",
                    sds.connections_per_listener
                );
                if chosen {
                    tracing::warn!("{message}");
                } else {
                    tracing::info!("{message}");
                }
                sds.connections_per_listener = fitted;
            }
        }
        let workload = super::workload_api::options(settings, &sds);
        ServeLimits {
            sds,
            admin,
            workload,
        }
    }
}

/// Connections each SDS listener can have when `open_files` descriptors are all the process gets.
fn fit_connections(
    open_files: u64,
    listeners: usize,
    sds: &StreamLimits,
    admin: &AdminLimits,
) -> usize {
    let for_clients = open_files
        .saturating_sub(RESERVED_DESCRIPTORS)
        .saturating_sub(admin.connections as u64);
    let per_listener = for_clients / (listeners.max(1) as u64);
    usize::try_from(per_listener)
        .unwrap_or(usize::MAX)
        .clamp(1, sds.connections_per_listener)
}

/// Raises the soft open-file limit to the hard one, as a server with many connections should, and
/// returns the limit now in force (`None` when unknown or unlimited).
fn raise_open_file_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => limit = raised,
            Err(error) => {
                tracing::debug!(%error, "could not raise the open-file limit to its maximum");
            }
        }
    }
    limit.current
}

fn to_usize(value: impl TryInto<usize>) -> usize {
    value.try_into().unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn admin() -> AdminLimits {
        AdminLimits {
            connections: 64,
            head_timeout: Duration::from_secs(10),
            warnings_per_minute: 10,
        }
    }

    #[test]
    fn connection_limits_fit_the_descriptors_the_process_has() {
        let sds = StreamLimits::default();
        // 1024 descriptors, two listeners: (1024 - 256 - 64) / 2.
        assert_eq!(fit_connections(1024, 2, &sds, &admin()), 352);
        assert_eq!(
            fit_connections(1 << 20, 2, &sds, &admin()),
            sds.connections_per_listener,
            "a generous limit leaves the setting as it is"
        );
        assert_eq!(
            fit_connections(100, 2, &sds, &admin()),
            1,
            "every listener keeps at least one"
        );
    }
}
