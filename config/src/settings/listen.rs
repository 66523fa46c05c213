//! Listen addresses: a unix socket path or a TCP socket address.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// Where a server listens: `unix:///abs/path`, `unix://./relative/path`, or an `IP:port` such as
/// `127.0.0.1:5678` or `[::1]:5678` (host names are not resolved).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ListenAddr {
    /// A unix domain socket at this path (relative paths are relative to the working directory).
    Unix(PathBuf),
    /// A TCP socket address.
    Tcp(SocketAddr),
}

/// The error for a listen address that is neither `unix://PATH` nor `IP:port`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid listen address {0:?}: expected unix:///absolute/path, unix://./relative/path or IP:port such as 127.0.0.1:5678 or [::1]:5678"
)]
pub struct ListenAddrError(pub String);

const UNIX_SCHEME: &str = "unix://";

impl FromStr for ListenAddr {
    type Err = ListenAddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.strip_prefix(UNIX_SCHEME) {
            Some("") => Err(ListenAddrError(s.to_owned())),
            Some(path) => Ok(ListenAddr::Unix(PathBuf::from(path))),
            None => s
                .parse::<SocketAddr>()
                .map(ListenAddr::Tcp)
                .map_err(|_| ListenAddrError(s.to_owned())),
        }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Unix(path) => write!(f, "{UNIX_SCHEME}{}", path.display()),
            ListenAddr::Tcp(addr) => write!(f, "{addr}"),
        }
    }
}

impl serde::Serialize for ListenAddr {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ListenAddr {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!(
            "unix:///run/meshca/sds.sock".parse(),
            Ok(ListenAddr::Unix("/run/meshca/sds.sock".into()))
        );
        assert_eq!(
            "unix://./meshca-data/sds.sock".parse(),
            Ok(ListenAddr::Unix("./meshca-data/sds.sock".into()))
        );
        assert_eq!(
            "0.0.0.0:5678".parse(),
            Ok(ListenAddr::Tcp(SocketAddr::from(([0, 0, 0, 0], 5678))))
        );
        assert_eq!(
            "[::1]:5678".parse::<ListenAddr>().map(|a| a.to_string()),
            Ok("[::1]:5678".to_owned())
        );
    }

    #[test]
    fn rejects_others() {
        for bad in [
            "",
            "unix://",
            "unix:/x",
            "localhost:5678",
            "127.0.0.1",
            "tcp://1.2.3.4:5",
        ] {
            assert_eq!(
                bad.parse::<ListenAddr>(),
                Err(ListenAddrError(bad.to_owned())),
                "{bad}"
            );
        }
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "unix:///a/b.sock",
            "unix://./rel.sock",
            "127.0.0.1:1",
            "[::1]:5678",
        ] {
            assert_eq!(
                s.parse::<ListenAddr>().map(|a| a.to_string()),
                Ok(s.to_owned())
            );
        }
    }
}
