//! The proxy-record sync of replicas on one database: records the identities this replica issues,
//! for the others, and looks up the ones other replicas issued, so that a proxy that moves to another
//! replica keeps its certificate.

use std::time::{Duration, UNIX_EPOCH};

use meshca_control::{IssuedIdentity, ProxyKey, SecretPem};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{ProxyRecord, ProxyRecords};

/// The most identities written in one statement.
const RECORD_BATCH: usize = 1000;

/// Records the identities this replica issues, for the others, and answers the owner's lookups of
/// identities other replicas issued. A write that fails is logged and dropped: a proxy that moves
/// then gets nothing from its new replica until it is issued a certificate there, as without a
/// database.
pub struct RecordSync {
    /// The records.
    pub records: ProxyRecords,
    /// `replica.name`.
    pub name: String,
    /// Identities the owner issued.
    pub issued: mpsc::UnboundedReceiver<Vec<IssuedIdentity>>,
    /// Proxies the owner asks about.
    pub lookups: mpsc::UnboundedReceiver<ProxyKey>,
    /// The answers.
    pub found: mpsc::UnboundedSender<(ProxyKey, Option<IssuedIdentity>)>,
}

impl std::fmt::Debug for RecordSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordSync")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl RecordSync {
    /// Runs until `shutdown` or the owner is gone.
    pub async fn run(self, shutdown: CancellationToken) {
        let RecordSync {
            records,
            name,
            mut issued,
            mut lookups,
            found,
        } = self;
        let writer = {
            let records = records.clone();
            async move {
                let mut failing = false;
                while let Some(mut batch) = issued.recv().await {
                    while let Ok(more) = issued.try_recv() {
                        batch.extend(more);
                    }
                    for chunk in batch.chunks(RECORD_BATCH) {
                        let rows: Vec<ProxyRecord> =
                            chunk.iter().map(|i| to_record(&name, i)).collect();
                        let started = std::time::Instant::now();
                        let written = records.put(&rows).await;
                        tracing::debug!(
                            rows = rows.len(),
                            micros = started.elapsed().as_micros() as u64,
                            "recorded proxies' identities"
                        );
                        match written {
                            Ok(()) if failing => {
                                failing = false;
                                tracing::info!(
                                    "proxies' identities are recorded in the database again"
                                );
                            }
                            Ok(()) => {}
                            Err(e) if !failing => {
                                failing = true;
                                tracing::warn!("cannot record proxies' identities in the database; a proxy that moves from this replica gets nothing from the next until it issues one: {e}");
                            }
                            Err(_) => {}
                        }
                    }
                }
            }
        };
        let reader = async move {
            while let Some(key) = lookups.recv().await {
                let held = match records.get(&key.mesh, &key.name).await {
                    Ok(held) => held.and_then(|r| from_record(&r)),
                    Err(e) => {
                        tracing::debug!(proxy = %key, "cannot read the proxy's recorded identity: {e}");
                        None
                    }
                };
                if found.send((key, held)).is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = writer => {}
            () = reader => {}
        }
    }
}

fn to_record(replica: &str, issued: &IssuedIdentity) -> ProxyRecord {
    ProxyRecord {
        mesh: issued.key.mesh.to_string(),
        name: issued.key.name.to_string(),
        replica: replica.to_owned(),
        ca_id: issued.ca_id.clone(),
        issuer: issued.issuer.clone(),
        chain_pem: issued.chain_pem.clone(),
        key_pem: issued
            .key_pem
            .as_ref()
            .map(|key| zeroize::Zeroizing::new(key.expose().to_owned())),
        not_after: issued
            .not_after
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
    }
}

fn from_record(record: &ProxyRecord) -> Option<IssuedIdentity> {
    let not_after = UNIX_EPOCH + Duration::from_secs(u64::try_from(record.not_after).ok()?);
    Some(IssuedIdentity {
        key: ProxyKey::new(record.mesh.clone(), record.name.clone()),
        issuer: record.issuer.clone(),
        ca_id: record.ca_id.clone(),
        chain_pem: record.chain_pem.clone(),
        key_pem: record
            .key_pem
            .as_ref()
            .map(|key| SecretPem::new(key.to_string())),
        not_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issued_identity_reads_back_from_its_record() {
        let issued = IssuedIdentity {
            key: ProxyKey::new("default", "web-1"),
            issuer: "backend ca-1".into(),
            ca_id: "ab".repeat(32),
            chain_pem: "CHAIN".into(),
            key_pem: Some(SecretPem::new("KEY".into())),
            not_after: UNIX_EPOCH + Duration::from_secs(1_900_000_000),
        };
        // One whose key an agent holds reads back without one.
        let keyless = IssuedIdentity {
            key_pem: None,
            ..issued.clone()
        };
        let record_keyless = to_record("meshca-a", &keyless);
        assert!(record_keyless.key_pem.is_none());
        assert!(from_record(&record_keyless)
            .expect("a valid record")
            .key_pem
            .is_none());
        let record = to_record("meshca-a", &issued);
        assert_eq!(record.replica, "meshca-a");
        assert_eq!(record.not_after, 1_900_000_000);
        let back = from_record(&record).expect("a valid record");
        assert_eq!(back.key, issued.key);
        assert_eq!(
            (back.issuer, back.ca_id, back.chain_pem, back.not_after),
            (
                issued.issuer,
                issued.ca_id,
                issued.chain_pem,
                issued.not_after
            )
        );
        assert_eq!(back.key_pem.as_ref().map(SecretPem::expose), Some("KEY"));
        let mut negative = record;
        negative.not_after = -1;
        assert!(
            from_record(&negative).is_none(),
            "a negative expiry is no identity"
        );
    }
}
