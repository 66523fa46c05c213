//! The key-encryption key kept sealed by a PKCS#11 token (`keystore.pkcs11` without
//! `keystore.postgres.keyEncryptionKeyFile`): the database holds the key only as the token sealed it,
//! so neither a dump of the database nor a replica's disk holds anything that unseals a secret; each
//! replica asks the token to open it when it starts.

use meshca_hsm::Token;
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

use crate::database::{locked_transaction, Database};
use crate::error::pool_error;
use crate::error::DbError;
use crate::kek::KeyEncryptionKey;

/// The `meshca_meta` row holding the key-encryption key as the token sealed it.
const SEALED_BY_TOKEN: &str = "key-encryption-key-sealed-by-token";

/// The advisory lock under which the first replica records the sealed key ("meshca" and 3).
const SEAL_LOCK: i64 = 0x6d65_7368_6361_0003;

impl KeyEncryptionKey {
    /// The database's key-encryption key, opened by `token`. The first replica to start makes it (or,
    /// given `import`, the key of `keystore.postgres.keyEncryptionKeyFile`, to move a database to the
    /// token), has the token seal it and records that; every replica opens the recorded one. With
    /// `import` and a key already recorded, the two must be the same key.
    pub fn from_token(
        db: &Database,
        token: &Token,
        import: Option<Zeroizing<[u8; 32]>>,
    ) -> Result<KeyEncryptionKey, DbError> {
        let (recorded, imported) = match read(db)? {
            Some(sealed) => (sealed, false),
            None => {
                let key = match &import {
                    Some(key) => key.clone(),
                    None => {
                        let mut key = Zeroizing::new([0u8; 32]);
                        SystemRandom::new().fill(&mut key[..]).map_err(|_| {
                            DbError::Crypto("the system's random source failed".into())
                        })?;
                        key
                    }
                };
                let sealed = token.seal(&key[..]).map_err(DbError::Token)?;
                let (recorded, ours) = record(db, sealed)?;
                (recorded, ours && import.is_some())
            }
        };
        let opened = token.open_sealed(&recorded).map_err(DbError::Token)?;
        let key: Zeroizing<[u8; 32]> =
            Zeroizing::new(opened.as_slice().try_into().map_err(|_| {
                DbError::Crypto("the token opened a key of the wrong length".into())
            })?);
        if let Some(file_key) = &import {
            if file_key[..] != key[..] {
                return Err(DbError::TokenKeyDiffers);
            }
            if imported {
                tracing::warn!(
                    "the key-encryption key of keystore.postgres.keyEncryptionKeyFile is now kept sealed by \
                     the PKCS#11 token: remove the setting and destroy the file on every replica"
                );
            }
        }
        Ok(KeyEncryptionKey::from_bytes(&key))
    }
}

/// The recorded sealed key, if any.
fn read(db: &Database) -> Result<Option<Vec<u8>>, DbError> {
    let action = "read the key-encryption key sealed by the token";
    db.block_on(action, |pool| async move {
        let client = pool.get().await.map_err(pool_error("connect"))?;
        let row = client
            .query_opt(
                "SELECT value FROM meshca_meta WHERE key = $1",
                &[&SEALED_BY_TOKEN],
            )
            .await
            .map_err(DbError::database(action))?;
        Ok(row.map(|r| r.get::<_, Vec<u8>>(0)))
    })
}

/// Records `sealed` unless another replica recorded its own first; returns what is recorded and
/// whether it is ours.
fn record(db: &Database, sealed: Vec<u8>) -> Result<(Vec<u8>, bool), DbError> {
    let action = "record the key-encryption key sealed by the token";
    db.block_on(action, |pool| async move {
        let mut client = pool.get().await.map_err(pool_error("connect"))?;
        let tx = locked_transaction(&mut client, SEAL_LOCK, action).await?;
        let inserted = tx
            .execute(
                "INSERT INTO meshca_meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
                &[&SEALED_BY_TOKEN, &sealed],
            )
            .await
            .map_err(DbError::database(action))?;
        let row = tx
            .query_one(
                "SELECT value FROM meshca_meta WHERE key = $1",
                &[&SEALED_BY_TOKEN],
            )
            .await
            .map_err(DbError::database(action))?;
        tx.commit().await.map_err(DbError::database(action))?;
        Ok((row.get::<_, Vec<u8>>(0), inserted == 1))
    })
}
