//! The errors of the database layer. Messages name the setting, file or operation, and never hold a
//! password, a key or a stored value.

use std::path::PathBuf;

/// Why a database operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// `keystore.postgres.url` does not parse.
    #[error("keystore.postgres.url: {0}")]
    Url(String),
    /// A file the settings name (the password, the key-encryption key, the server CA) is unusable.
    #[error("{}: {message}", file.display())]
    File {
        /// The file.
        file: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The database refused or failed an operation, or could not be reached.
    #[error("database: cannot {action}: {detail}")]
    Database {
        /// What was being done.
        action: String,
        /// The client's or the server's error.
        detail: String,
    },
    /// The database did not answer within `keystore.postgres.timeout`.
    #[error("database: cannot {action}: no answer within {seconds}s (keystore.postgres.timeout)")]
    Timeout {
        /// What was being done.
        action: String,
        /// The timeout.
        seconds: u64,
    },
    /// The schema was created by a newer meshca.
    #[error(
        "database: its schema is version {found}, newer than this meshca knows ({known}): run the newer \
         meshca, or restore a backup made before it migrated the database"
    )]
    SchemaTooNew {
        /// The database's schema version.
        found: i32,
        /// The newest version this build knows.
        known: i32,
    },
    /// The key-encryption key does not open what the database holds.
    #[error(
        "keystore.postgres.keyEncryptionKeyFile: this key does not open the values the database holds; \
         every replica must use the key the database was first used with"
    )]
    WrongKey,
    /// The PKCS#11 token that keeps the key-encryption key failed.
    #[error("keystore.pkcs11: {0}")]
    Token(#[source] meshca_hsm::HsmError),
    /// The key file given to move a database to the token is not the key the token keeps.
    #[error(
        "keystore.postgres.keyEncryptionKeyFile is not the key-encryption key the PKCS#11 token keeps for          this database: remove the setting (the token's key is the database's), or restore the right file"
    )]
    TokenKeyDiffers,
    /// Sealing failed (the system's random source).
    #[error("cannot seal a secret: {0}")]
    Crypto(String),
    /// A sealed value does not open with this key-encryption key (another key sealed it, it was
    /// sealed for another row, or it was changed).
    #[error("database: the sealed value of {name} does not open with keystore.postgres.keyEncryptionKeyFile")]
    Unsealable {
        /// What it is the value of.
        name: String,
    },
    /// A row fails its authentication (see the `integrity` module): it is never used. The message
    /// names the row and why.
    #[error(
        "database: refused {row}: {reason}. meshca trusts no row of the database it cannot \
         authenticate: find who wrote it, and restore the row from a backup"
    )]
    Refused {
        /// The row: `keystore entry NAME`, `proxy record MESH/NAME`, `revoked tokens`.
        row: String,
        /// Why it was refused.
        reason: String,
    },
    /// A value is not one the database may hold.
    #[error("{0}")]
    Invalid(String),
}

impl DbError {
    /// Whether trying again later may succeed: the database did not answer, or answered with an
    /// error of its own. A setting, a file, the schema or the key being wrong is not retryable.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, DbError::Database { .. } | DbError::Timeout { .. })
    }

    /// A database error while doing `action`.
    pub(crate) fn database(
        action: impl Into<String>,
    ) -> impl FnOnce(tokio_postgres::Error) -> Self {
        let action = action.into();
        move |e| DbError::Database {
            action,
            detail: describe(&e),
        }
    }
}

/// A client error with its cause: the server's message, or the I/O error, not only "db error".
fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    match std::error::Error::source(e) {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    }
}

/// A pool error while doing `action`.
pub(crate) fn pool_error(
    action: &'static str,
) -> impl FnOnce(deadpool_postgres::PoolError) -> DbError {
    move |e| match e {
        deadpool_postgres::PoolError::Backend(e) => DbError::database(action)(e),
        other => DbError::Database {
            action: action.into(),
            detail: other.to_string(),
        },
    }
}
