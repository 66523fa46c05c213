//! `limits:` in the settings file: every bound on what the outside world can make the daemon hold,
//! wait for or write (SECURITY.md lists them with their reasons).
//!
//! The limits are declared once, in the table below; the file layer, the environment variables,
//! the resolved [`Limits`] and their checks all come from it.

use serde::{Deserialize, Serialize};

use crate::Duration;

/// Declares every limit: its field, type, default and settings-file key.
macro_rules! limits {
    ($(
        $(#[doc = $doc:literal])+
        $field:ident: $ty:ty = $default:expr, $key:literal;
    )+) => {
        /// `limits:` in the settings file; every value is greater than zero.
        #[derive(Clone, Debug, PartialEq, Eq, Serialize)]
        #[serde(rename_all = "camelCase")]
        pub struct Limits {
            $( $(#[doc = $doc])+ pub $field: $ty, )+
        }

        impl Default for Limits {
            fn default() -> Self {
                Limits { $( $field: $default, )+ }
            }
        }

        /// One layer of `limits:` (the file or the environment); `None` means "not set here".
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        pub(super) struct LimitsLayer {
            $( pub(super) $field: Option<$ty>, )+
        }

        /// Every limit's settings path (`limits.<key>`).
        pub(super) const LIMIT_FIELDS: &[&str] = &[$( concat!("limits.", $key), )+];

        impl LimitsLayer {
            /// Whether the limit at `path` (one of [`LIMIT_FIELDS`]) is set in this layer.
            pub(super) fn is_set(&self, path: &str) -> bool {
                match path {
                    $( concat!("limits.", $key) => self.$field.is_some(), )+
                    _ => false,
                }
            }

            /// Sets the limit at `path` from an environment variable's text.
            pub(super) fn set(&mut self, path: &str, value: &str) -> Result<(), LimitError> {
                match path {
                    $( concat!("limits.", $key) => {
                        self.$field = Some(value.parse().map_err(|e| LimitError::Malformed {
                            expected: <$ty as LimitValue>::EXPECTED,
                            value: value.to_owned(),
                            reason: format!("{e}"),
                        })?);
                    } )+
                    other => unreachable!("{other} is not a limit"),
                }
                Ok(())
            }

            /// The limits this layer sets over the defaults; each is checked to be above zero.
            pub(super) fn resolve(self) -> Result<Limits, LimitError> {
                let defaults = Limits::default();
                Ok(Limits {
                    $( $field: match self.$field {
                        Some(value) if value.is_zero() => {
                            return Err(LimitError::Zero { path: concat!("limits.", $key) });
                        }
                        Some(value) => value,
                        None => defaults.$field,
                    }, )+
                })
            }
        }
    };
}

/// Why a limit's value was refused; the caller names where it was set.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(super) enum LimitError {
    /// An environment variable's text is not a value of the limit's kind.
    #[error("expected {expected}, got {value:?}: {reason}")]
    Malformed {
        /// How a value of the limit is written.
        expected: &'static str,
        /// The text given.
        value: String,
        /// Why it did not parse.
        reason: String,
    },
    /// The limit at `path` is zero, which would refuse everything it bounds.
    #[error("must be greater than zero")]
    Zero {
        /// `limits.<key>`.
        path: &'static str,
    },
}

impl LimitError {
    /// The settings path of the limit, where the error knows it.
    pub(super) fn path(&self) -> Option<&'static str> {
        match self {
            LimitError::Zero { path } => Some(path),
            LimitError::Malformed { .. } => None,
        }
    }
}

/// What a limit can be: a count, a size in bytes or a duration.
trait LimitValue {
    /// How a value is written, for error messages.
    const EXPECTED: &'static str;
    fn is_zero(&self) -> bool;
}

impl LimitValue for u32 {
    const EXPECTED: &'static str = "a whole number";
    fn is_zero(&self) -> bool {
        *self == 0
    }
}

impl LimitValue for u64 {
    const EXPECTED: &'static str = "a number of bytes";
    fn is_zero(&self) -> bool {
        *self == 0
    }
}

impl LimitValue for Duration {
    const EXPECTED: &'static str = "a duration such as 10s";
    fn is_zero(&self) -> bool {
        self.0.is_zero()
    }
}

const MIB: u64 = 1024 * 1024;

limits! {
    /// Open connections per SDS listener; more are closed at once (default 16384). The daemon
    /// lowers it, with a warning, when the open-file limit cannot hold every listener's share.
    sds_connections: u32 = 16_384, "sdsConnections";
    /// Open connections to the admin HTTP server (default 64).
    admin_connections: u32 = 64, "adminConnections";
    /// Time a new connection has to finish its TLS handshake and open its first stream (SDS), or
    /// to send a request's head (admin); also the SDS TLS handshake limit (default 10s).
    connect_timeout: Duration = Duration::from_secs(10), "connectTimeout";
    /// Time an SDS connection may stay open with no stream (default 60s).
    idle_timeout: Duration = Duration::from_secs(60), "idleTimeout";
    /// Concurrent streams on one SDS connection, advertised to the client (default 1024: one connection may carry many proxies, as a shared client or a bench does).
    streams_per_connection: u32 = 1024, "streamsPerConnection";
    /// Concurrent SDS streams of one proxy, over all its connections (default 256: Envoy opens
    /// one stream per secret).
    streams_per_proxy: u32 = 256, "streamsPerProxy";
    /// Resource names one SDS stream may subscribe to (default 256).
    names_per_stream: u32 = 256, "namesPerStream";
    /// Resource names one proxy may subscribe to over all its streams (default 4096).
    names_per_proxy: u32 = 4096, "namesPerProxy";
    /// The longest resource name accepted, in bytes (default 512).
    name_bytes: u32 = 512, "nameBytes";
    /// The largest SDS request message, in bytes (default 1 MiB).
    request_bytes: u32 = 1024 * 1024, "requestBytes";
    /// Warnings logged per proxy (and per listener for unauthenticated peers) per minute; the rest
    /// are counted and summarised (default 10).
    warnings_per_minute: u32 = 10, "warningsPerMinute";
    /// The largest resource file read, in bytes (default 4 MiB).
    resource_file_bytes: u64 = 4 * MIB, "resourceFileBytes";
    /// Resource files read from the resources directory (default 10000).
    resource_files: u32 = 10_000, "resourceFiles";
    /// How deeply a resource document may nest mappings and sequences (default 64).
    yaml_depth: u32 = 64, "yamlDepth";
    /// The largest certificate or key a data source (`file`, `inline`, `inlineString`) may hold,
    /// in bytes (default 1 MiB).
    data_source_bytes: u64 = MIB, "dataSourceBytes";
    /// Open connections per Workload API socket; more are closed at once (default 1024).
    workload_connections: u32 = 1024, "workloadConnections";
    /// Open connections one user (uid) may hold on a Workload API socket, so that no user takes every
    /// slot from the others; more are closed at once (default 256, a quarter of the default
    /// `workloadConnections`).
    workload_connections_per_uid: u32 = 256, "workloadConnectionsPerUid";
    /// Concurrent Workload API streams of one caller (one process), over all its connections
    /// (default 64).
    workload_streams_per_caller: u32 = 64, "workloadStreamsPerCaller";
    /// Time a Workload API connection may stay open with no stream (default 60s, as SDS's).
    workload_idle_timeout: Duration = Duration::from_secs(60), "workloadIdleTimeout";
    /// The largest Workload API request message, in bytes (default 64 KiB).
    workload_request_bytes: u32 = 64 * 1024, "workloadRequestBytes";
    /// Audiences one JWT-SVID request may ask for (default 32).
    jwt_audiences_per_request: u32 = 32, "jwtAudiencesPerRequest";
    /// The longest audience accepted, in bytes (default 1024).
    jwt_audience_bytes: u32 = 1024, "jwtAudienceBytes";
    /// Signed JWT-SVIDs kept for reuse until they near their expiry (default 4096).
    jwt_svid_cache_entries: u32 = 4096, "jwtSvidCacheEntries";
    /// Bytes the kept JWT-SVIDs may take, tokens and their audiences counted (default 16 MiB).
    jwt_svid_cache_bytes: u64 = 16 * MIB, "jwtSvidCacheBytes";
    /// Bytes the kept JWT-SVIDs of one SPIFFE ID may take (default 1 MiB).
    jwt_svid_cache_bytes_per_identity: u64 = MIB, "jwtSvidCacheBytesPerIdentity";
    /// `Sync` streams one agent (one agent token name) may hold open at once, over every SDS
    /// listener (default 4).
    agent_streams_per_agent: u32 = 4, "agentStreamsPerAgent";
    /// The largest message a `meshca agent` may send (key requests, acknowledgements), in bytes
    /// (default 1 MiB).
    agent_message_bytes: u32 = 1024 * 1024, "agentMessageBytes";
    /// The largest SPIFFE bundle read from a federation peer's bundle endpoint or an initial bundle
    /// file, in bytes (default 256 KiB).
    federation_bundle_bytes: u64 = 256 * 1024, "federationBundleBytes";
    /// Keys one federated SPIFFE bundle may hold (default 256).
    federation_bundle_keys: u32 = 256, "federationBundleKeys";
    /// Time one fetch of a peer's bundle endpoint may take, connecting included (default 10s).
    federation_fetch_timeout: Duration = Duration::from_secs(10), "federationFetchTimeout";
    /// Open connections per bundle endpoint meshca serves; more are closed at once (default 256).
    federation_endpoint_connections: u32 = 256, "federationEndpointConnections";
}

impl Limits {
    /// [`Limits::connect_timeout`] as a standard duration.
    pub fn connect_timeout(&self) -> std::time::Duration {
        self.connect_timeout.as_std()
    }

    /// [`Limits::idle_timeout`] as a standard duration.
    pub fn idle_timeout(&self) -> std::time::Duration {
        self.idle_timeout.as_std()
    }

    /// [`Limits::workload_idle_timeout`] as a standard duration.
    pub fn workload_idle_timeout(&self) -> std::time::Duration {
        self.workload_idle_timeout.as_std()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limit_is_settable_and_checked_above_zero() {
        for path in LIMIT_FIELDS {
            let mut layer = LimitsLayer::default();
            let value = if path.ends_with("Timeout") { "5s" } else { "7" };
            assert_eq!(layer.set(path, value), Ok(()), "{path}");
            assert!(layer.is_set(path), "{path}");
            assert!(layer.resolve().is_ok(), "{path}");

            let mut zero = LimitsLayer::default();
            let value = if path.ends_with("Timeout") { "0s" } else { "0" };
            zero.set(path, value).expect("zero parses");
            let error = zero.resolve().expect_err("zero is refused");
            assert_eq!(error, LimitError::Zero { path });
            assert_eq!(error.path(), Some(*path));
            assert_eq!(error.to_string(), "must be greater than zero");
        }
    }

    #[test]
    fn unset_limits_are_the_defaults() {
        assert_eq!(LimitsLayer::default().resolve(), Ok(Limits::default()));
        let mut layer = LimitsLayer::default();
        layer.set("limits.namesPerStream", "12").expect("set");
        let limits = layer.resolve().expect("valid");
        assert_eq!(limits.names_per_stream, 12);
        assert_eq!(limits.name_bytes, Limits::default().name_bytes);
    }

    #[test]
    fn a_malformed_value_says_what_was_expected() {
        let mut layer = LimitsLayer::default();
        let error = layer
            .set("limits.connectTimeout", "soon")
            .expect_err("not a duration")
            .to_string();
        assert!(error.starts_with("expected a duration"), "{error}");
        let error = layer
            .set("limits.sdsConnections", "-1")
            .expect_err("negative")
            .to_string();
        assert!(error.starts_with("expected a whole number"), "{error}");
    }
}
