//! Issuing a proxy's certificate: when one is needed, and how it is made, checked and kept.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use meshca_ca::Svid;

use super::{Issued, Leaf, Owner, Previous};
use crate::bundles;
use crate::plan::{self, Desired};
use crate::pool;
use crate::snapshot::{ProxyIdentity, ProxyKey, SecretPem};
use crate::standalone::issue_verified;

impl Owner {
    /// Whether `key` needs a new certificate to hold `desired`: it has none, its issuer, SPIFFE ID or
    /// MeshIdentity changed, or it is due for renewal.
    pub(super) fn needs_issue(&self, key: &ProxyKey, desired: &Desired, now: SystemTime) -> bool {
        match self.issued.get(key) {
            None => true,
            Some(issued) => {
                issued.ca_id != desired.ca.id()
                    || issued.leaf.spiffe_id != desired.spiffe_id
                    || issued.identity_name != desired.identity_name
                    || now >= issued.renew_at
                    || now >= issued.leaf.not_after
            }
        }
    }

    /// Issues every certificate of `jobs` on the issuance pool (new key, signature and the check before
    /// publishing, in parallel), then keeps them in job order. A certificate that fails either step is
    /// counted and logged, and nothing is kept for its proxy.
    pub(super) fn issue_all(
        &mut self,
        jobs: &[(ProxyKey, &Desired)],
        generation: u64,
        now: SystemTime,
    ) {
        let made = pool::run_all(jobs, self.config.workers, |(_, desired)| {
            let started = Instant::now();
            (issue_verified(desired, now), started.elapsed())
        });
        for ((key, desired), (result, took)) in jobs.iter().zip(made) {
            match result {
                Ok(svid) => self.keep(key, desired, svid, took, generation, now),
                Err(e) => {
                    self.telemetry.issue_failed(&key.mesh, &desired.issuer);
                    tracing::error!(proxy = %key, issuer = %desired.issuer, "certificate not issued: {e}");
                }
            }
        }
    }

    /// Keeps a certificate issued and checked for `key`, remembering what it replaces (break last).
    fn keep(
        &mut self,
        key: &ProxyKey,
        desired: &Desired,
        svid: Svid,
        took: Duration,
        generation: u64,
        now: SystemTime,
    ) {
        self.telemetry.issued(&key.mesh, &desired.issuer, took);
        let wave = self
            .wave
            .entry((key.mesh.to_string(), desired.issuer.to_string()))
            .or_default();
        wave.0 += 1;
        wave.1 += took;
        let renew_at = plan::renewal_time(
            svid.not_before,
            svid.not_after,
            self.config.renew_at,
            jitter(),
        );
        let old = self.issued.get(key);
        let regenerations = old.map_or(0, |i| i.regenerations + 1);
        let ca_trust = bundles::ca_trust(
            &desired.trusted_in,
            svid.spiffe_id.trust_domain().as_str(),
            &desired.ca,
        );
        // Break last: until the proxy ACKs this certificate, peers may still see the one it replaces,
        // from another CA or with another SPIFFE ID, or any it was issued before and has not ACKed.
        let spiffe_id = svid.spiffe_id.to_string();
        let Svid {
            spiffe_id: leaf_id,
            chain_pem,
            key: leaf_key,
            not_after,
            serial,
            ..
        } = svid;
        let mut previous = old.map(|o| o.previous.clone()).unwrap_or_default();
        if let Some(old) = old.filter(|_| self.gate.enabled()) {
            let replaced = Previous {
                ca_trust: old.ca_trust.clone(),
                spiffe_id: old.published.spiffe_id.clone(),
            };
            let changes = old.ca_trust != ca_trust || replaced.spiffe_id != spiffe_id;
            if changes && !previous.contains(&replaced) {
                previous.push(replaced);
            }
        }
        let published = Arc::new(ProxyIdentity {
            spiffe_id,
            identity_name: desired.identity_name.clone(),
            chain_pem,
            key_pem: SecretPem::new(leaf_key.to_pem().to_string()),
        });
        tracing::debug!(proxy = %key, spiffe_id = %leaf_id, issuer = %desired.issuer, serial = %serial, "issued certificate");
        self.issued.insert(
            key.clone(),
            Issued {
                leaf: Leaf {
                    spiffe_id: leaf_id,
                    not_after,
                    serial,
                },
                issuer: desired.issuer.clone(),
                ca_id: desired.ca.id().to_owned(),
                identity_name: desired.identity_name.clone(),
                renew_at,
                regenerations,
                published,
                ca_trust,
                previous,
                first_served_in: generation,
                issued_at: now,
            },
        );
    }
}

/// A uniform number in `[0, 1)` from the system's secure random source (0.5 if it fails: the jitter
/// only spreads renewals).
fn jitter() -> f64 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    if ring::rand::SystemRandom::new().fill(&mut b).is_err() {
        return 0.5;
    }
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}
