//! Trust before identity across trust domains: the trust domains meshca serves bundle endpoints for,
//! and when each of their authorities was first served. A new CA of an exported trust domain issues
//! only once its anchors have been served for one refresh hint plus `federation.fetchMargin`, so every
//! peer polling as told holds it before any certificate from it reaches them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshca_identity::TrustDomain;

use crate::trust::CaTrust;

/// When each served authority (by the lowercase hex SHA-256 of its DER) was first served, by trust
/// domain, as the bundle endpoints report it.
pub type ServedSince = BTreeMap<TrustDomain, BTreeMap<String, SystemTime>>;

/// The exported trust domains and what their endpoints served.
#[derive(Clone, Debug, Default)]
pub(crate) struct Exported {
    domains: BTreeSet<TrustDomain>,
    /// One refresh hint plus the fetch margin.
    wait: Duration,
    served: Arc<ServedSince>,
}

/// Where a CA stands with the peers of its trust domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PeersHold {
    /// Its trust domain is not exported (or it is, and peers polling as told hold it).
    Yes,
    /// Its endpoint has not served its anchors yet.
    NotServed,
    /// Served since `since`: peers polling as told hold it at `ready_at`.
    Soon {
        since: SystemTime,
        ready_at: SystemTime,
    },
}

impl Exported {
    /// Trust domains `domains` are served, and peers are given `wait` to fetch.
    pub(crate) fn new(domains: BTreeSet<TrustDomain>, wait: Duration) -> Exported {
        Exported {
            domains,
            wait,
            served: Arc::default(),
        }
    }

    /// Takes in what the endpoints served; whether it changed.
    pub(crate) fn set_served(&mut self, served: Arc<ServedSince>) -> bool {
        if *self.served == *served {
            return false;
        }
        self.served = served;
        true
    }

    /// Whether peers hold `ca` at `now`: every one of its anchors served for the wait.
    pub(crate) fn peers_hold(&self, ca: &CaTrust, now: SystemTime) -> PeersHold {
        if !self.domains.contains(&ca.trust_domain) {
            return PeersHold::Yes;
        }
        match self.served_since(ca) {
            None => PeersHold::NotServed,
            Some(since) if now >= since + self.wait => PeersHold::Yes,
            Some(since) => PeersHold::Soon {
                since,
                ready_at: since + self.wait,
            },
        }
    }

    /// The wait peers are given: one refresh hint plus the fetch margin.
    pub(crate) fn wait(&self) -> Duration {
        self.wait
    }

    /// Since when every anchor of `ca` has been served; `None` while one is not.
    fn served_since(&self, ca: &CaTrust) -> Option<SystemTime> {
        let served = self.served.get(&ca.trust_domain)?;
        let mut since = SystemTime::UNIX_EPOCH;
        for pem in ca.pems.iter() {
            let Some(der) = ::pem::parse(pem).ok().map(::pem::Pem::into_contents) else {
                continue;
            };
            let d = ring::digest::digest(&ring::digest::SHA256, &der);
            let id: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
            since = since.max(*served.get(&id)?);
        }
        Some(since)
    }
}
