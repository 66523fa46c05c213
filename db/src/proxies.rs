//! Each proxy's served identity, shared by every replica: the certificate chain a replica issued to a
//! proxy and its private key, sealed with the key-encryption key (or no key, for a proxy a `meshca
//! agent` serves: the agent holds it). A replica a proxy moves to (its own
//! died, or the proxy was moved) serves it the identity it already holds instead of nothing until a new
//! one is ready, so the rollout gate counts it from its first response. Each row is tagged over all its
//! columns and its proxy's name: one changed, or moved to another proxy, is refused.

use std::sync::Arc;

use zeroize::Zeroizing;

use crate::database::Database;
use crate::error::pool_error;
use crate::error::DbError;
use crate::integrity;
use crate::kek::{KeyEncryptionKey, RowTag};

/// The tag label of a proxy's row (`meshca_proxies`).
const PROXY: &str = "meshca_proxies v1";

/// One proxy's identity as a replica issued it.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyRecord {
    /// The proxy's mesh.
    pub mesh: String,
    /// The proxy's name.
    pub name: String,
    /// The replica that issued it.
    pub replica: String,
    /// The id of the CA that issued it.
    pub ca_id: String,
    /// The issuer as the status names it (e.g. `backend ca-2`).
    pub issuer: String,
    /// The certificate chain, PEM, leaf first.
    pub chain_pem: String,
    /// The private key, PEM; `None` when a `meshca agent` holds it (the certificate is over the
    /// agent's key, which never leaves its host). Stored sealed, or as an empty value when `None`.
    pub key_pem: Option<Zeroizing<String>>,
    /// When the leaf expires, Unix seconds.
    pub not_after: i64,
}

impl std::fmt::Debug for ProxyRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyRecord")
            .field("mesh", &self.mesh)
            .field("name", &self.name)
            .field("replica", &self.replica)
            .field("ca_id", &self.ca_id)
            .field("issuer", &self.issuer)
            .field("not_after", &self.not_after)
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// The proxies' identities in a database.
#[derive(Debug, Clone)]
pub struct ProxyRecords {
    db: Arc<Database>,
    key: Arc<KeyEncryptionKey>,
}

/// How a key-less record (an agent holds the key) stores its key: an empty value, which no sealed key
/// is (every one starts with its format byte and nonce). The row's tag covers it like a sealed key.
const NO_KEY: &[u8] = &[];

/// The name a proxy's key is sealed under: a sealed key moved to another proxy's row does not open.
fn sealed_name(mesh: &str, name: &str) -> String {
    format!("proxy/{mesh}/{name}/key.pem")
}

/// The tag of `record`'s row, whose key is stored `sealed`.
fn tag<'k>(key: &'k KeyEncryptionKey, record: &ProxyRecord, sealed: &[u8]) -> RowTag<'k> {
    let mut tag = key.row_tag(PROXY);
    for field in [
        &record.mesh,
        &record.name,
        &record.replica,
        &record.ca_id,
        &record.issuer,
        &record.chain_pem,
    ] {
        tag.field(field.as_bytes());
    }
    tag.field(sealed).field(&record.not_after.to_be_bytes());
    tag
}

impl ProxyRecords {
    /// The records in `db`, sealed with `key`.
    pub fn new(db: Arc<Database>, key: KeyEncryptionKey) -> ProxyRecords {
        ProxyRecords::with_key(db, Arc::new(key))
    }

    pub(crate) fn with_key(db: Arc<Database>, key: Arc<KeyEncryptionKey>) -> ProxyRecords {
        ProxyRecords { db, key }
    }

    /// Writes `records` in one statement, each replacing the proxy's previous one.
    pub async fn put(&self, records: &[ProxyRecord]) -> Result<(), DbError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut columns: [Vec<String>; 6] = Default::default();
        let mut keys: Vec<Vec<u8>> = Vec::with_capacity(records.len());
        let mut tags: Vec<Vec<u8>> = Vec::with_capacity(records.len());
        let mut not_after: Vec<i64> = Vec::with_capacity(records.len());
        for r in records {
            let sealed = match &r.key_pem {
                Some(key_pem) => self
                    .key
                    .seal(&sealed_name(&r.mesh, &r.name), key_pem.as_bytes())?,
                None => NO_KEY.to_vec(),
            };
            tags.push(tag(&self.key, r, &sealed).sign());
            keys.push(sealed);
            for (column, value) in columns.iter_mut().zip([
                &r.mesh,
                &r.name,
                &r.replica,
                &r.ca_id,
                &r.issuer,
                &r.chain_pem,
            ]) {
                column.push(value.clone());
            }
            not_after.push(r.not_after);
        }
        self.db
            .run("write proxies' identities", move |pool| async move {
                let client = pool.get().await.map_err(pool_error("connect"))?;
                let [mesh, name, replica, ca_id, issuer, chain] = &columns;
                client
                    .execute(
                        "INSERT INTO meshca_proxies
                             (mesh, name, replica, ca_id, issuer, chain, key, not_after, tag, updated_at)
                         SELECT *, now() FROM unnest($1::text[], $2::text[], $3::text[], $4::text[],
                                                     $5::text[], $6::text[], $7::bytea[], $8::int8[],
                                                     $9::bytea[])
                         ON CONFLICT (mesh, name) DO UPDATE SET replica = EXCLUDED.replica,
                             ca_id = EXCLUDED.ca_id, issuer = EXCLUDED.issuer, chain = EXCLUDED.chain,
                             key = EXCLUDED.key, not_after = EXCLUDED.not_after, tag = EXCLUDED.tag,
                             updated_at = now()",
                        &[mesh, name, replica, ca_id, issuer, chain, &keys, &not_after, &tags],
                    )
                    .await
                    .map_err(DbError::database("write proxies' identities"))?;
                Ok(())
            })
            .await
    }

    /// The identity last issued to `mesh`.`name`, if any. A row whose tag fails, or whose key does not
    /// open, is an error.
    pub async fn get(&self, mesh: &str, name: &str) -> Result<Option<ProxyRecord>, DbError> {
        let (m, n) = (mesh.to_owned(), name.to_owned());
        let row = self
            .db
            .run("read a proxy's identity", move |pool| async move {
                let client = pool.get().await.map_err(pool_error("connect"))?;
                client
                    .query_opt(
                        "SELECT replica, ca_id, issuer, chain, key, not_after, tag FROM meshca_proxies
                         WHERE mesh = $1 AND name = $2",
                        &[&m, &n],
                    )
                    .await
                    .map_err(DbError::database("read a proxy's identity"))
            })
            .await?;
        let Some(row) = row else { return Ok(None) };
        let sealed: Vec<u8> = row.get(4);
        let stored_tag: Option<Vec<u8>> = row.get(6);
        let mut record = ProxyRecord {
            mesh: mesh.to_owned(),
            name: name.to_owned(),
            replica: row.get(0),
            ca_id: row.get(1),
            issuer: row.get(2),
            chain_pem: row.get(3),
            key_pem: None,
            not_after: row.get(5),
        };
        integrity::check(stored_tag.as_deref(), tag(&self.key, &record, &sealed))
            .map_err(|why| integrity::refuse(&format!("proxy record {mesh}/{name}"), why))?;
        if sealed == NO_KEY {
            return Ok(Some(record));
        }
        let key = self
            .key
            .open(&sealed_name(mesh, name), &sealed)
            .ok_or_else(|| DbError::Unsealable {
                name: sealed_name(mesh, name),
            })?;
        record.key_pem = Some(
            std::str::from_utf8(&key)
                .map(|pem| Zeroizing::new(pem.to_owned()))
                .map_err(|_| DbError::Unsealable {
                    name: sealed_name(mesh, name),
                })?,
        );
        Ok(Some(record))
    }
}
