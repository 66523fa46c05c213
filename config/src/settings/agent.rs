//! `agent:` in the settings file: what `meshca agent` connects to and where it serves.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use serde::Serialize;

/// A meshca server's SDS listener, as the agent reaches it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerAddr {
    /// `host:port` (TLS when the agent has the SDS CA, else plaintext, which servers accept on
    /// loopback only) or `https://host:port` (TLS, always).
    Tcp {
        /// `host:port`.
        addr: String,
        /// The host, which the server's certificate must name.
        host: String,
        /// Written `https://`: TLS is required.
        https: bool,
    },
    /// `unix:///path`.
    Unix(PathBuf),
}

/// Why a server address is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{address:?} is not a server address: {reason}")]
pub struct ServerAddrError {
    /// What was written.
    pub address: String,
    /// What is wrong.
    pub reason: &'static str,
}

impl FromStr for ServerAddr {
    type Err = ServerAddrError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = |reason| ServerAddrError {
            address: text.to_owned(),
            reason,
        };
        if let Some(path) = text.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(error("a unix socket is written unix:///absolute/path"));
            }
            return Ok(ServerAddr::Unix(PathBuf::from(path)));
        }
        let (addr, https) = match text.strip_prefix("https://") {
            Some(rest) => (rest.trim_end_matches('/'), true),
            None => (text, false),
        };
        if addr.contains("://") {
            return Err(error(
                "expected host:port, https://host:port or unix:///path",
            ));
        }
        let Some((host, port)) = addr.rsplit_once(':') else {
            return Err(error(
                "expected host:port, https://host:port or unix:///path",
            ));
        };
        if port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(error("the port must be a number from 1 to 65535"));
        }
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || host.contains(['/', ' ']) {
            return Err(error("the host is missing or malformed"));
        }
        Ok(ServerAddr::Tcp {
            addr: addr.to_owned(),
            host: host.to_owned(),
            https,
        })
    }
}

impl fmt::Display for ServerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerAddr::Tcp {
                addr, https: true, ..
            } => write!(f, "https://{addr}"),
            ServerAddr::Tcp { addr, .. } => f.write_str(addr),
            ServerAddr::Unix(path) => write!(f, "unix://{}", path.display()),
        }
    }
}

impl Serialize for ServerAddr {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ServerAddr {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// `agent:` in the settings file (read by `meshca agent` only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSettings {
    /// The meshca servers, tried in order; `meshca agent` needs at least one.
    pub servers: Vec<ServerAddr>,
    /// The file holding the agent's token (`meshca token --type agent`); `meshca agent` needs it.
    pub token_file: Option<PathBuf>,
    /// PEM of the CAs that sign the servers' SDS certificates (TLS to TCP servers).
    pub sds_ca: Option<PathBuf>,
    /// The Workload API socket (default `/run/meshca/workload.sock`). Shown as `unix://PATH`.
    #[serde(serialize_with = "unix_url")]
    pub listen: PathBuf,
    /// The admin listener, loopback only (default `127.0.0.1:9911`).
    pub admin: SocketAddr,
}

fn unix_url<S: serde::Serializer>(
    path: &std::path::Path,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&format_args!("unix://{}", path.display()))
}

/// `agent.listen` unless set.
pub const DEFAULT_AGENT_LISTEN: &str = "/run/meshca/workload.sock";

/// `agent.admin` unless set.
pub const DEFAULT_AGENT_ADMIN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9911);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_addresses_parse() {
        assert_eq!(
            "ca.example:5678".parse::<ServerAddr>(),
            Ok(ServerAddr::Tcp {
                addr: "ca.example:5678".into(),
                host: "ca.example".into(),
                https: false
            })
        );
        assert_eq!(
            "https://10.0.0.1:5678".parse::<ServerAddr>(),
            Ok(ServerAddr::Tcp {
                addr: "10.0.0.1:5678".into(),
                host: "10.0.0.1".into(),
                https: true
            })
        );
        assert_eq!(
            "unix:///run/meshca/sds.sock".parse::<ServerAddr>(),
            Ok(ServerAddr::Unix("/run/meshca/sds.sock".into()))
        );
        for bad in [
            "ca.example",
            "http://ca:1",
            "ca:0",
            ":5678",
            "unix://rel",
            "ca:x",
        ] {
            assert!(bad.parse::<ServerAddr>().is_err(), "{bad}");
        }
        assert_eq!(
            "https://ca:1".parse::<ServerAddr>().map(|a| a.to_string()),
            Ok("https://ca:1".to_owned())
        );
    }
}
