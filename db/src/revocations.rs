//! Revoked proxy tokens, shared by every replica: one row per token id. Adding one is a single
//! transaction under a lock, so revocations from several replicas or `meshca token --revoke` runs never
//! overwrite each other.
//!
//! A row removed from the table would accept its token again, and no tag on a row can tell that it is
//! gone, so the set is authenticated as a whole: `meshca_meta` holds a serial number and a tag over it
//! and every id, in order, both written in the transaction that adds an id. A list that does not match
//! (an id removed or added outside meshca), or whose serial is older than one this replica read before
//! (an older list put back), is refused: the caller keeps the list it read last.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use crate::database::{locked_transaction, Database};
use crate::error::pool_error;
use crate::error::DbError;
use crate::integrity::{self, Refusal};
use crate::kek::{KeyEncryptionKey, RowTag};

/// The most revoked ids read at once (a list longer than this is refused, never cut short: a cut list
/// would accept a revoked token).
pub const MAX_REVOKED: i64 = 1_000_000;

/// The `meshca_meta` row that authenticates the set: its serial (8 bytes, big-endian), then its tag.
const DIGEST: &str = "revoked-tokens-digest";
/// The tag label of that row.
const LABEL: &str = "meshca_revoked_tokens v1";
/// How the refused set is named in errors and the log.
const ROW: &str = "the revoked tokens (table meshca_revoked_tokens)";
/// The advisory lock held while a revocation is added ("meshca" and 3).
const REVOKE_LOCK: i64 = 0x6d65_7368_6361_0003;

/// The revoked token ids in a database.
#[derive(Debug, Clone)]
pub struct TokenRevocations {
    db: Arc<Database>,
    key: Arc<KeyEncryptionKey>,
    /// The newest serial this replica read or wrote.
    newest: Arc<AtomicI64>,
}

impl TokenRevocations {
    /// The revocations kept in `db`, authenticated with `key`. The database must have been opened
    /// with [`crate::PostgresKeystore::open`] once, which authenticates its set the first time.
    pub fn new(db: Arc<Database>, key: KeyEncryptionKey) -> TokenRevocations {
        TokenRevocations::with_key(db, Arc::new(key))
    }

    pub(crate) fn with_key(db: Arc<Database>, key: Arc<KeyEncryptionKey>) -> TokenRevocations {
        TokenRevocations {
            db,
            key,
            newest: Arc::new(AtomicI64::new(0)),
        }
    }

    /// Every revoked id, sorted. A set that fails its authentication is an error.
    pub async fn ids(&self) -> Result<Vec<String>, DbError> {
        let (key, newest) = (self.key.clone(), self.newest.clone());
        self.db
            .run("read the revoked tokens", |pool| {
                read_ids(pool, key, newest)
            })
            .await
    }

    /// [`TokenRevocations::ids`] for callers outside an async runtime.
    pub fn ids_blocking(&self) -> Result<Vec<String>, DbError> {
        let (key, newest) = (self.key.clone(), self.newest.clone());
        self.db.block_on("read the revoked tokens", |pool| {
            read_ids(pool, key, newest)
        })
    }

    /// Revokes `id` with `note`; returns whether it was new. Refused while the set fails its
    /// authentication: adding to it would vouch for what someone else changed.
    pub fn revoke(&self, id: &str, note: &str) -> Result<bool, DbError> {
        let (id, note) = (id.to_owned(), note.to_owned());
        let (key, newest) = (self.key.clone(), self.newest.clone());
        self.db.block_on("revoke a token", |pool| async move {
            let action = format!("revoke token {id}");
            let mut client = pool.get().await.map_err(pool_error("connect"))?;
            let tx = locked_transaction(&mut client, REVOKE_LOCK, &action).await?;
            let (mut ids, serial) = authenticated(&tx, &key, &newest).await?;
            let Err(at) = ids.binary_search(&id) else {
                return Ok(false);
            };
            if ids.len() as i64 >= MAX_REVOKED {
                return Err(too_many(&action));
            }
            ids.insert(at, id.clone());
            tx.execute(
                "INSERT INTO meshca_revoked_tokens (id, note) VALUES ($1, $2)",
                &[&id, &note],
            )
            .await
            .map_err(DbError::database(action.clone()))?;
            let serial = serial + 1;
            write_digest(&tx, &key, serial, &ids).await?;
            tx.commit().await.map_err(DbError::database(action))?;
            newest.fetch_max(serial, Ordering::Relaxed);
            Ok(true)
        })
    }
}

/// Starts the authenticated set of a database new to meshca: empty. A database that already holds
/// revocations or their tag is left as it is (its check value was removed, not new): authenticating
/// what it holds now would accept whatever someone removed.
pub(crate) async fn start_empty(
    tx: &deadpool_postgres::Transaction<'_>,
    key: &KeyEncryptionKey,
) -> Result<(), DbError> {
    let action = "authenticate the revoked tokens";
    let present = tx
        .query_opt(
            "SELECT 1 FROM meshca_revoked_tokens UNION ALL SELECT 1 FROM meshca_meta WHERE key = $1 LIMIT 1",
            &[&DIGEST],
        )
        .await
        .map_err(DbError::database(action))?;
    match present {
        Some(_) => Ok(()),
        None => write_digest(tx, key, 1, &[]).await,
    }
}

/// Authenticates the set as it is (a database whose rows were written untagged): returns how many ids
/// it holds.
pub(crate) async fn authenticate_as_found(
    tx: &deadpool_postgres::Transaction<'_>,
    key: &KeyEncryptionKey,
) -> Result<usize, DbError> {
    let ids = select_ids(tx, "authenticate the revoked tokens").await?;
    write_digest(tx, key, 1, &ids).await?;
    Ok(ids.len())
}

async fn read_ids(
    pool: deadpool_postgres::Pool,
    key: Arc<KeyEncryptionKey>,
    newest: Arc<AtomicI64>,
) -> Result<Vec<String>, DbError> {
    let action = "read the revoked tokens";
    let mut client = pool.get().await.map_err(pool_error("connect"))?;
    // One snapshot: the ids and the tag a writer committed together.
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(DbError::database(action))?;
    let (ids, _) = authenticated(&tx, &key, &newest).await?;
    tx.commit().await.map_err(DbError::database(action))?;
    Ok(ids)
}

/// The ids and the serial of the set, once its tag matches and its serial is not older than one seen.
async fn authenticated(
    tx: &deadpool_postgres::Transaction<'_>,
    key: &KeyEncryptionKey,
    newest: &AtomicI64,
) -> Result<(Vec<String>, i64), DbError> {
    let action = "read the revoked tokens";
    let ids = select_ids(tx, action).await?;
    let digest: Option<Vec<u8>> = tx
        .query_opt("SELECT value FROM meshca_meta WHERE key = $1", &[&DIGEST])
        .await
        .map_err(DbError::database(action))?
        .map(|row| row.get(0));
    let refuse = |why| integrity::refuse(ROW, why);
    let Some((serial, stored)) = digest
        .as_deref()
        .and_then(|d| d.split_first_chunk::<8>())
        .map(|(serial, tag)| (i64::from_be_bytes(*serial), tag))
    else {
        return Err(refuse(Refusal::Untagged));
    };
    integrity::check(Some(stored), tag(key, serial, &ids)).map_err(refuse)?;
    let seen = newest.fetch_max(serial, Ordering::Relaxed);
    if serial < seen {
        return Err(refuse(Refusal::Older {
            version: serial,
            seen,
        }));
    }
    Ok((ids, serial))
}

async fn select_ids(
    tx: &deadpool_postgres::Transaction<'_>,
    action: &str,
) -> Result<Vec<String>, DbError> {
    let rows = tx
        .query(
            "SELECT id FROM meshca_revoked_tokens ORDER BY id COLLATE \"C\" LIMIT $1",
            &[&(MAX_REVOKED + 1)],
        )
        .await
        .map_err(DbError::database(action))?;
    if rows.len() as i64 > MAX_REVOKED {
        return Err(too_many(action));
    }
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

async fn write_digest(
    tx: &deadpool_postgres::Transaction<'_>,
    key: &KeyEncryptionKey,
    serial: i64,
    ids: &[String],
) -> Result<(), DbError> {
    let mut value = serial.to_be_bytes().to_vec();
    value.extend_from_slice(&tag(key, serial, ids).sign());
    tx.execute(
        "INSERT INTO meshca_meta (key, value) VALUES ($1, $2)
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        &[&DIGEST, &value],
    )
    .await
    .map_err(DbError::database("authenticate the revoked tokens"))?;
    Ok(())
}

/// The tag of the set `ids` (sorted bytewise) at `serial`.
fn tag<'k>(key: &'k KeyEncryptionKey, serial: i64, ids: &[String]) -> RowTag<'k> {
    let mut tag = key.row_tag(LABEL);
    tag.field(&serial.to_be_bytes())
        .field(&(ids.len() as u64).to_be_bytes());
    for id in ids {
        tag.field(id.as_bytes());
    }
    tag
}

fn too_many(action: &str) -> DbError {
    DbError::Database {
        action: action.into(),
        detail: format!("more than {MAX_REVOKED} revoked tokens"),
    }
}
