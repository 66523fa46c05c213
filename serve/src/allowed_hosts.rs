//! Which `Host` an HTTP listener for operators (the daemon's admin API and console, the agent's
//! status) answers to, against DNS rebinding: a web page on a name its owner controls can rebind that
//! name to `127.0.0.1` and read the listener from an operator's browser as a same-origin page. The
//! browser still sends the page's own name as `Host`, so the listener answers only names it is reachable
//! as: IP addresses (no page has one of those as its name and can rebind it), `localhost`, this
//! machine's host name, and the names the operator configured. Any other gets 421 Misdirected Request
//! and reads nothing.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use http::{header, HeaderMap, Uri};

use crate::shown;

/// The host names the admin listener answers to besides IP addresses.
#[derive(Clone, Debug)]
pub struct AllowedHosts {
    names: Arc<BTreeSet<String>>,
}

impl AllowedHosts {
    /// `localhost`, the machine's host name (`/proc/sys/kernel/hostname`) and `configured` (e.g.
    /// `admin.allowedHosts`, lower case).
    pub fn new(configured: &[String]) -> AllowedHosts {
        let mut names: BTreeSet<String> = configured.iter().cloned().collect();
        names.insert("localhost".to_owned());
        if let Ok(hostname) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            let hostname = hostname.trim().to_ascii_lowercase();
            if !hostname.is_empty() {
                names.insert(hostname);
            }
        }
        AllowedHosts {
            names: Arc::new(names),
        }
    }

    /// Whether a request whose `Host` (or `:authority`) is `authority` is answered.
    fn allows(&self, authority: &str) -> bool {
        let Some(host) = host_of(authority) else {
            return false;
        };
        if host.parse::<IpAddr>().is_ok() {
            return true;
        }
        let host = host.to_ascii_lowercase();
        let host = host.strip_suffix('.').unwrap_or(&host);
        self.names.contains(host) || host.ends_with(".localhost")
    }
}

/// The host of an authority (`name`, `name:port`, `1.2.3.4:port`, `[::1]:port`), without the port
/// and the IPv6 brackets; `None` for what is not one.
fn host_of(authority: &str) -> Option<&str> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return (after.is_empty() || valid_port(after.strip_prefix(':')?)).then_some(host);
    }
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if valid_port(port) && !host.contains(':') => Some(host),
        Some(_) => None,
        None => Some(authority),
    };
    host.filter(|host| !host.is_empty())
}

fn valid_port(port: &str) -> bool {
    !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit())
}

/// Why a request with these headers and URI is refused (the body of a 421, naming the host and
/// `setting`, where more names can be allowed), or `None` when it is answered. A request with neither a
/// `Host` header nor an authority (HTTP/1.0 from a script) cannot come from a browser and is answered.
pub fn refusal(
    hosts: &AllowedHosts,
    headers: &HeaderMap,
    uri: &Uri,
    setting: &str,
) -> Option<String> {
    let named: Vec<String> = headers
        .get_all(header::HOST)
        .iter()
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
        .chain(uri.authority().map(|a| a.as_str().to_owned()))
        .collect();
    let refused = named.iter().find(|authority| !hosts.allows(authority))?;
    Some(format!(
        "421 Misdirected Request: this listener does not answer to the host {}; use its IP address or \
         localhost{setting}\n",
        shown(refused)
    ))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn hosts(configured: &[&str]) -> AllowedHosts {
        let configured: Vec<String> = configured.iter().map(|s| (*s).to_owned()).collect();
        AllowedHosts::new(&configured)
    }

    #[test]
    fn addresses_localhost_and_configured_names_are_answered() {
        let hosts = hosts(&["ca.example.com"]);
        for authority in [
            "127.0.0.1",
            "127.0.0.1:5681",
            "10.1.2.3:80",
            "[::1]:5681",
            "[::1]",
            "localhost:5681",
            "LOCALHOST",
            "localhost.:5681",
            "console.localhost:5681",
            "ca.example.com:5681",
            "CA.Example.COM.",
        ] {
            assert!(hosts.allows(authority), "{authority}");
        }
    }

    #[test]
    fn other_names_are_refused() {
        let hosts = hosts(&["ca.example.com"]);
        for authority in [
            "rebind.attacker.example:5681",
            "ca.example.com.attacker.example",
            "localhost.attacker.example",
            "example.com",
            "",
            ":5681",
            "[::1",
            "[::1]x",
            "a:b:c",
            "host:99999999",
        ] {
            assert!(!hosts.allows(authority), "{authority:?}");
        }
    }

    #[test]
    fn this_machines_host_name_is_answered() {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("a host name");
        let hostname = hostname.trim();
        assert!(hosts(&[]).allows(&format!("{hostname}:5681")), "{hostname}");
    }

    proptest! {
        #[test]
        fn any_authority_is_judged_without_panicking(authority in ".{0,80}") {
            let _ = hosts(&["ca.example.com"]).allows(&authority);
        }

        #[test]
        fn a_name_not_listed_is_refused(label in "[a-z][a-z0-9-]{0,20}", port in 1u16..) {
            prop_assume!(label != "localhost");
            let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            prop_assume!(label != hostname.trim());
            let authority = format!("{label}.attacker.example:{port}");
            prop_assert!(!hosts(&["ca.example.com"]).allows(&authority));
        }
    }
}
