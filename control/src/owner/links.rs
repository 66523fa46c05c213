//! The owner's link to the other replicas' record of issued identities: what it hands out to be
//! recorded, and which proxies it asked about.

use super::adopt::{IssuedIdentity, RecordLink};
use crate::snapshot::{ProxyHashSet, ProxyKey};

/// Where issued identities are recorded and recorded ones looked up (replicas on a database); without
/// a link, nothing is recorded or looked up.
#[derive(Debug, Default)]
pub(super) struct RecordLinks {
    link: Option<RecordLink>,
    /// Identities issued since the last batch was sent.
    to_record: Vec<IssuedIdentity>,
    /// Proxies whose recorded identity was asked for and has not come back.
    looking_up: ProxyHashSet,
}

impl RecordLinks {
    /// Records and looks up through `link` from now on.
    pub fn connect(&mut self, link: RecordLink) {
        self.link = Some(link);
    }

    /// Queues `identity` to be recorded with the next batch.
    pub fn record(&mut self, identity: impl FnOnce() -> IssuedIdentity) {
        if self.link.is_some() {
            self.to_record.push(identity());
        }
    }

    /// Sends the queued identities.
    pub fn flush(&mut self) {
        if let Some(link) = &self.link {
            if !self.to_record.is_empty() {
                // The receiver is gone only while the daemon stops.
                let _ = link.issued.send(std::mem::take(&mut self.to_record));
            }
        }
    }

    /// Asks for the identity another replica issued to `key`, unless it is asked for already.
    pub fn look_up(&mut self, key: &ProxyKey) {
        let Some(link) = &self.link else {
            return;
        };
        if !self.looking_up.insert(key.clone()) {
            return;
        }
        if link.lookups.send(key.clone()).is_err() {
            self.looking_up.remove(key);
        }
    }

    /// Notes that the answer for `key` came back.
    pub fn answered(&mut self, key: &ProxyKey) {
        self.looking_up.remove(key);
    }
}
