//! The schema, created and migrated by the daemon itself: numbered migrations, applied in order under
//! an advisory lock so that replicas starting together apply each once.

use deadpool_postgres::Client;

use crate::error::pool_error;
use crate::error::DbError;

/// The advisory lock held while the schema is checked and migrated ("meshca" and 1).
const MIGRATE_LOCK: i64 = 0x6d65_7368_6361_0001;

/// Each migration: the version it brings the schema to, and its statements.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        "CREATE TABLE meshca_entries (
        name text PRIMARY KEY,
        secret boolean NOT NULL,
        data bytea NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE meshca_meta (
        key text PRIMARY KEY,
        value bytea NOT NULL
    );
    CREATE TABLE meshca_revoked_tokens (
        id text PRIMARY KEY,
        note text NOT NULL,
        revoked_at timestamptz NOT NULL DEFAULT now()
    );",
    ),
    (
        2,
        "CREATE TABLE meshca_replicas (
        name text PRIMARY KEY,
        started_at timestamptz NOT NULL,
        heartbeat_at timestamptz NOT NULL,
        proxies integer NOT NULL,
        streams integer NOT NULL
    );",
    ),
    (
        3,
        "ALTER TABLE meshca_replicas
        ADD COLUMN gate jsonb,
        ADD COLUMN gate_version bigint NOT NULL DEFAULT 0;",
    ),
    (
        4,
        "CREATE TABLE meshca_proxies (
        mesh text NOT NULL,
        name text NOT NULL,
        replica text NOT NULL,
        ca_id text NOT NULL,
        issuer text NOT NULL,
        chain text NOT NULL,
        key bytea NOT NULL,
        not_after bigint NOT NULL,
        updated_at timestamptz NOT NULL,
        PRIMARY KEY (mesh, name)
    );",
    ),
    (
        // Rows are tagged (see the integrity module); rows written before have no tag until a replica
        // with the key-encryption key tags them, once, as found.
        5,
        "ALTER TABLE meshca_entries
        ADD COLUMN version bigint NOT NULL DEFAULT 0,
        ADD COLUMN tag bytea;
    ALTER TABLE meshca_proxies ADD COLUMN tag bytea;",
    ),
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// Brings the schema to [`SCHEMA_VERSION`]; returns it. A schema newer than that is an error, and
/// left untouched.
pub(crate) async fn migrate(client: &mut Client) -> Result<i32, DbError> {
    // A schema that is current needs no lock and no DDL: read first, so that a database open for
    // reading only (a standby, `default_transaction_read_only`) still serves what needs no write.
    if let Some(found) = current_version(client).await? {
        if found > SCHEMA_VERSION {
            return Err(DbError::SchemaTooNew {
                found,
                known: SCHEMA_VERSION,
            });
        }
        if found == SCHEMA_VERSION {
            return Ok(found);
        }
    }
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATE_LOCK])
        .await
        .map_err(DbError::database("take the schema lock"))?;
    let migrated = apply(client).await;
    // Released whatever happened: the connection goes back to the pool.
    let released = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATE_LOCK])
        .await;
    let version = migrated?;
    released.map_err(DbError::database("release the schema lock"))?;
    Ok(version)
}

/// The schema's version, read without writing; `None` before the version table exists.
async fn current_version(client: &mut Client) -> Result<Option<i32>, DbError> {
    let exists: bool = client
        .query_one("SELECT to_regclass('meshca_schema') IS NOT NULL", &[])
        .await
        .map_err(DbError::database("look for the schema version table"))?
        .get(0);
    if !exists {
        return Ok(None);
    }
    let row = client
        .query_opt("SELECT version FROM meshca_schema", &[])
        .await
        .map_err(DbError::database("read the schema version"))?;
    Ok(row.map(|row| row.get(0)))
}

async fn apply(client: &mut Client) -> Result<i32, DbError> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS meshca_schema (
                one boolean PRIMARY KEY DEFAULT true CHECK (one),
                version integer NOT NULL
            );
            INSERT INTO meshca_schema (version) VALUES (0) ON CONFLICT DO NOTHING;",
        )
        .await
        .map_err(DbError::database("create the schema version table"))?;
    let found: i32 = client
        .query_one("SELECT version FROM meshca_schema", &[])
        .await
        .map_err(DbError::database("read the schema version"))?
        .get(0);
    if found > SCHEMA_VERSION {
        return Err(DbError::SchemaTooNew {
            found,
            known: SCHEMA_VERSION,
        });
    }
    for (version, statements) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        let action = format!("migrate the schema to version {version}");
        let tx = client
            .transaction()
            .await
            .map_err(DbError::database(action.clone()))?;
        tx.batch_execute(statements)
            .await
            .map_err(DbError::database(action.clone()))?;
        tx.execute("UPDATE meshca_schema SET version = $1", &[version])
            .await
            .map_err(DbError::database(action.clone()))?;
        tx.commit().await.map_err(DbError::database(action))?;
        tracing::info!(version, "database schema migrated");
    }
    Ok(found.max(SCHEMA_VERSION))
}

/// meshca's tables in the database's search path (what [`Database::drop_meshca_tables`] removes).
const MESHCA_TABLES: &str = "SELECT tablename::text FROM pg_tables
    WHERE schemaname = current_schema() AND tablename LIKE 'meshca\\_%' ORDER BY tablename";

impl crate::Database {
    /// The meshca tables the database holds (none in an empty one).
    pub async fn meshca_tables(&self) -> Result<Vec<String>, DbError> {
        self.run("list meshca's tables", |pool| async move {
            let client = pool.get().await.map_err(pool_error("connect"))?;
            let rows = client
                .query(MESHCA_TABLES, &[])
                .await
                .map_err(DbError::database("list meshca's tables"))?;
            Ok(rows.iter().map(|row| row.get(0)).collect())
        })
        .await
    }

    /// Removes every meshca table and what it holds, leaving the database as it was before meshca
    /// first used it. For drills on a throwaway database; nothing else calls it.
    pub async fn drop_meshca_tables(&self) -> Result<(), DbError> {
        let tables = self.meshca_tables().await?;
        if tables.is_empty() {
            return Ok(());
        }
        let statement = format!(
            "DROP TABLE {}",
            tables
                .iter()
                .map(|t| format!("\"{}\"", t.replace('"', "\"\"")))
                .collect::<Vec<_>>()
                .join(", ")
        );
        self.run("remove meshca's tables", move |pool| async move {
            let client = pool.get().await.map_err(pool_error("connect"))?;
            client
                .batch_execute(&statement)
                .await
                .map_err(DbError::database("remove meshca's tables"))?;
            Ok(())
        })
        .await
    }
}
