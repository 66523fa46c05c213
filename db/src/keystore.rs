//! The keystore in PostgreSQL: one row per entry, secrets sealed with the key-encryption key, every row
//! tagged with a key derived from it.

use std::sync::Arc;

use meshca_keystore::{
    validate_name, validate_prefix, Creation, Keystore, KeystoreError, NewEntry, Secret,
};

use crate::database::{locked_transaction, Database};
use crate::error::pool_error;
use crate::error::DbError;
use crate::integrity::{self, entry_tag, next_version, Versions};
use crate::kek::KeyEncryptionKey;
use crate::proxies::ProxyRecords;
use crate::revocations::{self, TokenRevocations};

/// The advisory lock that serializes [`Keystore::create_if_absent`] across replicas ("meshca" and 2).
const CREATE_LOCK: i64 = 0x6d65_7368_6361_0002;

/// The `meshca_meta` row that tells whether a key-encryption key is the database's.
const KEY_CHECK: &str = "key-encryption-key-check";
/// What that row holds, sealed, once the database's rows are tagged.
const KEY_CHECK_TEXT: &[u8] = b"meshca: this database's key-encryption key; its rows are tagged";
/// What that row held, sealed, when meshca did not tag rows yet.
const UNTAGGED_KEY_CHECK_TEXT: &[u8] = b"meshca: this database's key-encryption key";

/// A [`Keystore`] in a PostgreSQL database, shared by every replica that uses it.
///
/// Public data is stored as written; secrets are sealed with the key-encryption key, bound to their
/// entry's name. Every row carries a version and a tag (see the `integrity` module): a row that fails
/// it is refused ([`KeystoreError::Refused`]), never returned. Names follow the same rules as the file
/// keystore's, and `list` sorts them bytewise.
#[derive(Debug)]
pub struct PostgresKeystore {
    db: Arc<Database>,
    key: Arc<KeyEncryptionKey>,
    versions: Versions,
}

impl PostgresKeystore {
    /// The keystore in `db`. The first replica to open the database records a value sealed with its
    /// key; a replica whose key does not open it is refused ([`DbError::WrongKey`]), before it could
    /// write a secret no other replica can read.
    ///
    /// A database last used by a meshca that did not tag its rows (its check value is the older one)
    /// has them tagged here, once, as found, in the transaction that records the newer check value: see
    /// SECURITY.md. From then on an untagged row is refused like a changed one.
    pub fn open(db: Arc<Database>, key: KeyEncryptionKey) -> Result<PostgresKeystore, DbError> {
        let key = Arc::new(key);
        let ours = key.seal(KEY_CHECK, KEY_CHECK_TEXT)?;
        let (key, tagged) = db.block_on("check the key-encryption key", |pool| async move {
            let mut client = pool.get().await.map_err(pool_error("connect"))?;
            let action = "check the key-encryption key";
            let select = "SELECT value FROM meshca_meta WHERE key = $1";
            // Read first: a database whose check value is current needs no write, so one that only
            // reads (a standby) still opens with its key.
            if let Some(row) = client
                .query_opt(select, &[&KEY_CHECK])
                .await
                .map_err(DbError::database(action))?
            {
                let stored: Vec<u8> = row.get(0);
                if key
                    .open(KEY_CHECK, &stored)
                    .is_some_and(|text| text.as_slice() == KEY_CHECK_TEXT)
                {
                    return Ok((key, None));
                }
            }
            // One replica at a time checks, and tags an older database.
            let tx = locked_transaction(&mut client, CREATE_LOCK, action).await?;
            let inserted = tx
                .execute(
                    "INSERT INTO meshca_meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
                    &[&KEY_CHECK, &ours],
                )
                .await
                .map_err(DbError::database(action))?;
            if inserted == 1 {
                // A database new to meshca: its revoked tokens start as an authenticated empty set.
                revocations::start_empty(&tx, &key).await?;
            }
            let row = tx
                .query_one(select, &[&KEY_CHECK])
                .await
                .map_err(DbError::database(action))?;
            let stored: Vec<u8> = row.get(0);
            let tagged = match key.open(KEY_CHECK, &stored) {
                Some(text) if text.as_slice() == KEY_CHECK_TEXT => None,
                Some(text) if text.as_slice() == UNTAGGED_KEY_CHECK_TEXT => {
                    let tagged = tag_as_found(&tx, &key).await?;
                    tx.execute(
                        "UPDATE meshca_meta SET value = $2 WHERE key = $1",
                        &[&KEY_CHECK, &ours],
                    )
                    .await
                    .map_err(DbError::database(action))?;
                    Some(tagged)
                }
                _ => return Err(DbError::WrongKey),
            };
            tx.commit().await.map_err(DbError::database(action))?;
            Ok((key, tagged))
        })?;
        if let Some(found) = tagged {
            tracing::warn!(
                entries = found.entries,
                revoked_tokens = found.revoked,
                proxy_records_dropped = found.proxies,
                "the database's rows were written by a meshca that did not authenticate them: they are \
                 tagged now, as found, and from now on a row changed outside meshca is refused; proxies' \
                 recorded identities were dropped and are recorded again as they renew"
            );
        }
        Ok(PostgresKeystore {
            db,
            key,
            versions: Versions::default(),
        })
    }

    /// The proxies' identities in the same database, tagged and sealed with the same key.
    pub fn proxy_records(&self) -> ProxyRecords {
        ProxyRecords::with_key(self.db.clone(), self.key.clone())
    }

    /// The revoked tokens in the same database, authenticated with the same key.
    pub fn revocations(&self) -> TokenRevocations {
        TokenRevocations::with_key(self.db.clone(), self.key.clone())
    }

    /// The database it keeps its entries in.
    pub fn database(&self) -> &Arc<Database> {
        &self.db
    }

    fn put(&self, name: &str, data: &[u8], secret: bool) -> Result<(), KeystoreError> {
        validate_name(name)?;
        let stored = self.stored(name, data, secret)?;
        let (key, name_owned) = (self.key.clone(), name.to_owned());
        let newest = self.versions.newest(name);
        let version = self
            .db
            .block_on("write a keystore entry", |pool| async move {
                let name = name_owned;
                let action = format!("write keystore entry {name}");
                let mut client = pool.get().await.map_err(pool_error("connect"))?;
                let tx = client
                    .transaction()
                    .await
                    .map_err(DbError::database(action.clone()))?;
                let previous: Option<i64> = tx
                    .query_opt(
                        "SELECT version FROM meshca_entries WHERE name = $1 FOR UPDATE",
                        &[&name],
                    )
                    .await
                    .map_err(DbError::database(action.clone()))?
                    .map(|row| row.get(0));
                let version = next_version(previous.max(newest), &name)?;
                let tag = entry_tag(&key, &name, secret, version, &stored).sign();
                tx.execute(
                    "INSERT INTO meshca_entries (name, secret, data, version, tag) VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (name) DO UPDATE
                     SET secret = EXCLUDED.secret, data = EXCLUDED.data, version = EXCLUDED.version,
                         tag = EXCLUDED.tag, updated_at = now()",
                    &[&name, &secret, &stored, &version, &tag],
                )
                .await
                .map_err(DbError::database(action.clone()))?;
                tx.commit().await.map_err(DbError::database(action))?;
                Ok(version)
            })
            .map_err(keystore_error)?;
        // Its own write is the newest this replica knows: an older one put back is refused.
        let _ = self.versions.saw(name, version);
        Ok(())
    }

    /// What a row holds for `data`: sealed when it is a secret.
    fn stored(&self, name: &str, data: &[u8], secret: bool) -> Result<Vec<u8>, KeystoreError> {
        match secret {
            true => self.key.seal(name, data).map_err(keystore_error),
            false => Ok(data.to_vec()),
        }
    }

    /// The row of `name`, authenticated: whether it is a secret, and its stored bytes. A row whose tag
    /// fails, or older than one this replica read before, is an error.
    fn row(&self, name: &str) -> Result<Option<(bool, Vec<u8>)>, KeystoreError> {
        validate_name(name)?;
        let name_owned = name.to_owned();
        let row = self
            .db
            .block_on("read a keystore entry", |pool| async move {
                let name = name_owned;
                let client = pool.get().await.map_err(pool_error("connect"))?;
                let row = client
                    .query_opt(
                        "SELECT secret, data, version, tag FROM meshca_entries WHERE name = $1",
                        &[&name],
                    )
                    .await
                    .map_err(DbError::database(format!("read keystore entry {name}")))?;
                Ok(row.map(|row| {
                    let tag: Option<Vec<u8>> = row.get(3);
                    (row.get(0), row.get(1), row.get(2), tag)
                }))
            })
            .map_err(keystore_error)?;
        let Some((secret, data, version, tag)) = row else {
            return Ok(None);
        };
        let data: Vec<u8> = data;
        integrity::check(
            tag.as_deref(),
            entry_tag(&self.key, name, secret, version, &data),
        )
        .and_then(|()| self.versions.saw(name, version))
        .map_err(|why| refused(name, why))?;
        Ok(Some((secret, data)))
    }
}

impl Keystore for PostgresKeystore {
    fn get_secret(&self, name: &str) -> Result<Option<Secret>, KeystoreError> {
        match self.row(name)? {
            None => Ok(None),
            Some((true, sealed)) => match self.key.open(name, &sealed) {
                Some(plain) => Ok(Some(Secret::from(plain.to_vec()))),
                None => Err(KeystoreError::Unsealable {
                    name: name.to_owned(),
                }),
            },
            Some((false, _)) => Err(wrong_kind(name, false)),
        }
    }

    fn put_secret(&self, name: &str, data: &[u8]) -> Result<(), KeystoreError> {
        self.put(name, data, true)
    }

    fn get_public(&self, name: &str) -> Result<Option<Vec<u8>>, KeystoreError> {
        match self.row(name)? {
            None => Ok(None),
            Some((false, data)) => Ok(Some(data)),
            Some((true, _)) => Err(wrong_kind(name, true)),
        }
    }

    fn put_public(&self, name: &str, data: &[u8]) -> Result<(), KeystoreError> {
        self.put(name, data, false)
    }

    fn create_if_absent(&self, entries: &[NewEntry<'_>]) -> Result<Creation, KeystoreError> {
        let mut rows = Vec::with_capacity(entries.len());
        for entry in entries {
            validate_name(entry.name())?;
            let stored = self.stored(entry.name(), entry.data(), entry.is_secret())?;
            let version = next_version(self.versions.newest(entry.name()), entry.name())
                .map_err(keystore_error)?;
            let tag =
                entry_tag(&self.key, entry.name(), entry.is_secret(), version, &stored).sign();
            rows.push(NewRow {
                name: entry.name().to_owned(),
                secret: entry.is_secret(),
                stored,
                version,
                tag,
            });
        }
        let written: Vec<(String, i64)> =
            rows.iter().map(|r| (r.name.clone(), r.version)).collect();
        let outcome = self
            .db
            .block_on("create keystore entries", |pool| async move {
                let mut client = pool.get().await.map_err(pool_error("connect"))?;
                let action = "create keystore entries";
                // One creator at a time, in every replica.
                let tx = locked_transaction(&mut client, CREATE_LOCK, action).await?;
                let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
                let present: Vec<String> = tx
                    .query(
                        "SELECT name FROM meshca_entries WHERE name = ANY($1)",
                        &[&names],
                    )
                    .await
                    .map_err(DbError::database(action))?
                    .iter()
                    .map(|row| row.get(0))
                    .collect();
                if !present.is_empty() {
                    let missing: Vec<String> = names
                        .iter()
                        .filter(|n| !present.iter().any(|p| p == *n))
                        .map(|n| n.to_string())
                        .collect();
                    return Ok(Err((present, missing)));
                }
                for r in &rows {
                    tx.execute(
                        "INSERT INTO meshca_entries (name, secret, data, version, tag)
                         VALUES ($1, $2, $3, $4, $5)",
                        &[&r.name, &r.secret, &r.stored, &r.version, &r.tag],
                    )
                    .await
                    .map_err(DbError::database(format!(
                        "create keystore entry {}",
                        r.name
                    )))?;
                }
                tx.commit().await.map_err(DbError::database(action))?;
                Ok(Ok(()))
            })
            .map_err(keystore_error)?;
        match outcome {
            Ok(()) => {
                for (name, version) in written {
                    let _ = self.versions.saw(&name, version);
                }
                Ok(Creation::Created)
            }
            Err((_, missing)) if missing.is_empty() => Ok(Creation::Existing),
            Err((present, missing)) => Err(KeystoreError::PartlyPresent { present, missing }),
        }
    }

    fn delete(&self, name: &str) -> Result<(), KeystoreError> {
        validate_name(name)?;
        let name = name.to_owned();
        self.db
            .block_on("delete a keystore entry", |pool| async move {
                let client = pool.get().await.map_err(pool_error("connect"))?;
                client
                    .execute("DELETE FROM meshca_entries WHERE name = $1", &[&name])
                    .await
                    .map_err(DbError::database(format!("delete keystore entry {name}")))?;
                Ok(())
            })
            .map_err(keystore_error)
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, KeystoreError> {
        validate_prefix(prefix)?;
        let prefix = prefix.to_owned();
        self.db
            .block_on("list keystore entries", |pool| async move {
                let client = pool.get().await.map_err(pool_error("connect"))?;
                let rows = client
                    .query(
                        // Bytewise order, as the file keystore sorts names.
                        "SELECT name FROM meshca_entries WHERE starts_with(name, $1)
                         ORDER BY name COLLATE \"C\"",
                        &[&prefix],
                    )
                    .await
                    .map_err(DbError::database(format!(
                        "list keystore entries under {prefix:?}"
                    )))?;
                Ok(rows.iter().map(|row| row.get(0)).collect())
            })
            .map_err(keystore_error)
    }
}

/// One row [`Keystore::create_if_absent`] writes.
struct NewRow {
    name: String,
    secret: bool,
    stored: Vec<u8>,
    version: i64,
    tag: Vec<u8>,
}

/// What [`tag_as_found`] tagged.
struct TaggedAsFound {
    entries: usize,
    revoked: usize,
    proxies: u64,
}

/// Tags every row of a database whose rows were written untagged, as they are: the entries, and the
/// revoked tokens as a set. Proxies' recorded identities are dropped instead (each is written again
/// when its proxy's certificate renews; until then a proxy that moves replica gets a new one).
async fn tag_as_found(
    tx: &deadpool_postgres::Transaction<'_>,
    key: &KeyEncryptionKey,
) -> Result<TaggedAsFound, DbError> {
    let action = "tag the database's rows";
    let rows = tx
        .query("SELECT name, secret, data FROM meshca_entries", &[])
        .await
        .map_err(DbError::database(action))?;
    let (mut names, mut versions, mut tags) = (Vec::new(), Vec::new(), Vec::new());
    for row in &rows {
        let name: String = row.get(0);
        let version = next_version(None, &name)?;
        let data: Vec<u8> = row.get(2);
        tags.push(entry_tag(key, &name, row.get(1), version, &data).sign());
        versions.push(version);
        names.push(name);
    }
    tx.execute(
        "UPDATE meshca_entries AS e SET version = t.version, tag = t.tag
         FROM unnest($1::text[], $2::int8[], $3::bytea[]) AS t(name, version, tag)
         WHERE e.name = t.name",
        &[&names, &versions, &tags],
    )
    .await
    .map_err(DbError::database(action))?;
    let proxies = tx
        .execute("DELETE FROM meshca_proxies WHERE tag IS NULL", &[])
        .await
        .map_err(DbError::database(action))?;
    let revoked = revocations::authenticate_as_found(tx, key).await?;
    Ok(TaggedAsFound {
        entries: names.len(),
        revoked,
        proxies,
    })
}

/// The keystore error for entry `name` refused for `why` (logged and counted).
fn refused(name: &str, why: integrity::Refusal) -> KeystoreError {
    KeystoreError::Refused {
        name: name.to_owned(),
        message: integrity::refuse(&format!("keystore entry {name}"), why).to_string(),
    }
}

fn keystore_error(e: DbError) -> KeystoreError {
    KeystoreError::Database(e.to_string())
}

fn wrong_kind(name: &str, secret: bool) -> KeystoreError {
    let (stored, asked) = match secret {
        true => ("a secret", "public data"),
        false => ("public data", "a secret"),
    };
    KeystoreError::WrongKind {
        name: name.to_owned(),
        stored,
        asked,
    }
}
