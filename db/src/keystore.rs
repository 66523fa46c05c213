//! The keystore in PostgreSQL: one row per entry, secrets sealed with the key-encryption key.

use std::sync::Arc;

use meshca_keystore::{
    validate_name, validate_prefix, Creation, Keystore, KeystoreError, NewEntry, Secret,
};

use crate::database::{pool_error, Database};
use crate::error::DbError;
use crate::kek::KeyEncryptionKey;

/// The advisory lock that serializes [`Keystore::create_if_absent`] across replicas ("meshca" and 2).
const CREATE_LOCK: i64 = 0x6d65_7368_6361_0002;

/// The `meshca_meta` row that tells whether a key-encryption key is the database's.
const KEY_CHECK: &str = "key-encryption-key-check";
/// What that row holds, sealed.
const KEY_CHECK_TEXT: &[u8] = b"meshca: this database's key-encryption key";

/// A [`Keystore`] in a PostgreSQL database, shared by every replica that uses it.
///
/// Public data is stored as written; secrets are sealed with the key-encryption key, bound to their
/// entry's name. Names follow the same rules as the file keystore's, and `list` sorts them bytewise.
#[derive(Debug)]
pub struct PostgresKeystore {
    db: Arc<Database>,
    key: Arc<KeyEncryptionKey>,
}

impl PostgresKeystore {
    /// The keystore in `db`. The first replica to open the database records a value sealed with its
    /// key; a replica whose key does not open it is refused ([`DbError::WrongKey`]), before it could
    /// write a secret no other replica can read.
    pub fn open(db: Arc<Database>, key: KeyEncryptionKey) -> Result<PostgresKeystore, DbError> {
        let key = Arc::new(key);
        let ours = key.seal(KEY_CHECK, KEY_CHECK_TEXT)?;
        let stored: Vec<u8> = db.block_on("check the key-encryption key", |pool| async move {
            let client = pool.get().await.map_err(pool_error("connect"))?;
            let action = "check the key-encryption key";
            let select = "SELECT value FROM meshca_meta WHERE key = $1";
            // Read first: a database that only reads (a standby) still opens with its key.
            if let Some(row) = client
                .query_opt(select, &[&KEY_CHECK])
                .await
                .map_err(DbError::database(action))?
            {
                return Ok(row.get(0));
            }
            client
                .execute(
                    "INSERT INTO meshca_meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
                    &[&KEY_CHECK, &ours],
                )
                .await
                .map_err(DbError::database(action))?;
            let row = client
                .query_one(select, &[&KEY_CHECK])
                .await
                .map_err(DbError::database(action))?;
            Ok(row.get(0))
        })?;
        match key.open(KEY_CHECK, &stored) {
            Some(text) if text.as_slice() == KEY_CHECK_TEXT => Ok(PostgresKeystore { db, key }),
            _ => Err(DbError::WrongKey),
        }
    }

    /// The database it keeps its entries in.
    pub fn database(&self) -> &Arc<Database> {
        &self.db
    }

    fn put(&self, name: &str, data: &[u8], secret: bool) -> Result<(), KeystoreError> {
        validate_name(name)?;
        let stored = self.stored(name, data, secret)?;
        let name = name.to_owned();
        self.db
            .block_on("write a keystore entry", |pool| async move {
                let client = pool.get().await.map_err(pool_error("connect"))?;
                client
                    .execute(
                        "INSERT INTO meshca_entries (name, secret, data) VALUES ($1, $2, $3)
                         ON CONFLICT (name) DO UPDATE
                         SET secret = EXCLUDED.secret, data = EXCLUDED.data, updated_at = now()",
                        &[&name, &secret, &stored],
                    )
                    .await
                    .map_err(DbError::database(format!("write keystore entry {name}")))?;
                Ok(())
            })
            .map_err(keystore_error)
    }

    /// What a row holds for `data`: sealed when it is a secret.
    fn stored(&self, name: &str, data: &[u8], secret: bool) -> Result<Vec<u8>, KeystoreError> {
        match secret {
            true => self.key.seal(name, data).map_err(keystore_error),
            false => Ok(data.to_vec()),
        }
    }

    /// The row of `name`: whether it is a secret, and its stored bytes.
    fn row(&self, name: &str) -> Result<Option<(bool, Vec<u8>)>, KeystoreError> {
        validate_name(name)?;
        let name = name.to_owned();
        self.db
            .block_on("read a keystore entry", |pool| async move {
                let client = pool.get().await.map_err(pool_error("connect"))?;
                let row = client
                    .query_opt(
                        "SELECT secret, data FROM meshca_entries WHERE name = $1",
                        &[&name],
                    )
                    .await
                    .map_err(DbError::database(format!("read keystore entry {name}")))?;
                Ok(row.map(|row| (row.get(0), row.get(1))))
            })
            .map_err(keystore_error)
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
            rows.push((entry.name().to_owned(), entry.is_secret(), stored));
        }
        let outcome = self
            .db
            .block_on("create keystore entries", |pool| async move {
                let mut client = pool.get().await.map_err(pool_error("connect"))?;
                let action = "create keystore entries";
                let tx = client
                    .transaction()
                    .await
                    .map_err(DbError::database(action))?;
                // Held until the transaction ends: one creator at a time, in every replica.
                tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CREATE_LOCK])
                    .await
                    .map_err(DbError::database(action))?;
                let names: Vec<&str> = rows.iter().map(|(name, _, _)| name.as_str()).collect();
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
                for (name, secret, stored) in &rows {
                    tx.execute(
                        "INSERT INTO meshca_entries (name, secret, data) VALUES ($1, $2, $3)",
                        &[name, secret, stored],
                    )
                    .await
                    .map_err(DbError::database(format!("create keystore entry {name}")))?;
                }
                tx.commit().await.map_err(DbError::database(action))?;
                Ok(Ok(()))
            })
            .map_err(keystore_error)?;
        match outcome {
            Ok(()) => Ok(Creation::Created),
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
