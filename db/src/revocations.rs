//! Revoked proxy tokens, shared by every replica: one row per token id. Adding one is a single insert,
//! so revocations from several replicas or `meshca token --revoke` runs never overwrite each other.

use std::sync::Arc;

use crate::database::{pool_error, Database};
use crate::error::DbError;

/// The most revoked ids read at once (a list longer than this is refused, never cut short: a cut list
/// would accept a revoked token).
pub const MAX_REVOKED: i64 = 1_000_000;

/// The revoked token ids in a database.
#[derive(Debug, Clone)]
pub struct TokenRevocations {
    db: Arc<Database>,
}

impl TokenRevocations {
    /// The revocations kept in `db`.
    pub fn new(db: Arc<Database>) -> TokenRevocations {
        TokenRevocations { db }
    }

    /// Every revoked id, sorted.
    pub async fn ids(&self) -> Result<Vec<String>, DbError> {
        self.db.run("read the revoked tokens", read_ids).await
    }

    /// [`TokenRevocations::ids`] for callers outside an async runtime.
    pub fn ids_blocking(&self) -> Result<Vec<String>, DbError> {
        self.db.block_on("read the revoked tokens", read_ids)
    }

    /// Revokes `id` with `note`; returns whether it was new.
    pub fn revoke(&self, id: &str, note: &str) -> Result<bool, DbError> {
        let (id, note) = (id.to_owned(), note.to_owned());
        self.db.block_on("revoke a token", |pool| async move {
            let client = pool.get().await.map_err(pool_error("connect"))?;
            let added = client
                .execute(
                    "INSERT INTO meshca_revoked_tokens (id, note) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
                    &[&id, &note],
                )
                .await
                .map_err(DbError::database(format!("revoke token {id}")))?;
            Ok(added == 1)
        })
    }
}

async fn read_ids(pool: deadpool_postgres::Pool) -> Result<Vec<String>, DbError> {
    let client = pool.get().await.map_err(pool_error("connect"))?;
    let action = "read the revoked tokens";
    let rows = client
        .query(
            "SELECT id FROM meshca_revoked_tokens ORDER BY id COLLATE \"C\" LIMIT $1",
            &[&(MAX_REVOKED + 1)],
        )
        .await
        .map_err(DbError::database(action))?;
    if rows.len() as i64 > MAX_REVOKED {
        return Err(DbError::Database {
            action: action.into(),
            detail: format!(
                "more than {MAX_REVOKED} revoked tokens; remove those whose tokens have expired"
            ),
        });
    }
    Ok(rows.iter().map(|row| row.get(0)).collect())
}
