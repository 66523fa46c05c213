//! One pool of connections to PostgreSQL, on a runtime of its own, so that the synchronous keystore
//! interface can wait on it from any thread, inside the daemon's runtime or not.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use tokio_postgres_rustls::MakeRustlsConnect;
use zeroize::Zeroizing;

use crate::error::{pool_error, DbError};
use crate::schema;

/// How to reach the database.
#[derive(Clone)]
pub struct DbOptions {
    /// `postgres://user@host:port/database[?sslmode=disable|prefer|require]`, without a password.
    pub url: String,
    /// The password, from `keystore.postgres.passwordFile` or `MESHCA_KEYSTORE_POSTGRES_PASSWORD`.
    pub password: Option<Zeroizing<String>>,
    /// PEM certificates of the CAs the server's certificate must chain to; the system's roots when
    /// `None`. A server that offers TLS is always verified.
    pub ca_file: Option<PathBuf>,
    /// How long connecting, or one operation, may take.
    pub timeout: Duration,
    /// The most connections the pool opens.
    pub max_connections: usize,
}

impl std::fmt::Debug for DbOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbOptions")
            .field("url", &self.url)
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("ca_file", &self.ca_file)
            .field("timeout", &self.timeout)
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

/// A connection pool and the runtime its connections live on. The schema is current once
/// [`Database::connect`] returns.
pub struct Database {
    runtime: Option<tokio::runtime::Runtime>,
    pool: Pool,
    timeout: Duration,
    url: String,
}

impl Database {
    /// Connects, and creates or migrates the schema (under a lock, so replicas starting together
    /// migrate it once).
    pub fn connect(options: &DbOptions) -> Result<Database, DbError> {
        let db = Database::connect_as_is(options)?;
        let version = db.block_on("apply the schema", |pool| async move {
            let mut client = pool.get().await.map_err(pool_error("connect"))?;
            schema::migrate(&mut client).await
        })?;
        tracing::debug!(url = %db.url, version, "database schema current");
        Ok(db)
    }

    /// Connects without touching the schema: for a look at what the database holds (the failover
    /// drill's check that it is empty). Nothing meshca stores may be read or written through it.
    pub fn connect_as_is(options: &DbOptions) -> Result<Database, DbError> {
        let mut config: tokio_postgres::Config = options
            .url
            .parse()
            .map_err(|e: tokio_postgres::Error| DbError::Url(e.to_string()))?;
        if config.get_hosts().is_empty() {
            return Err(DbError::Url("names no host".into()));
        }
        if config.get_password().is_some() {
            return Err(DbError::Url(
                "holds a password; put it in keystore.postgres.passwordFile or \
                 MESHCA_KEYSTORE_POSTGRES_PASSWORD instead"
                    .into(),
            ));
        }
        if let Some(password) = &options.password {
            config.password(password.as_bytes());
        }
        config.connect_timeout(options.timeout);
        config.application_name("meshca");
        config.options(format!(
            "-c statement_timeout={}",
            options.timeout.as_millis()
        ));
        let tls = MakeRustlsConnect::new(client_config(options.ca_file.as_deref())?);
        let manager = Manager::from_config(
            config,
            tls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("meshca-db")
            .enable_all()
            .build()
            .map_err(|e| DbError::Database {
                action: "start the database runtime".into(),
                detail: e.to_string(),
            })?;
        let pool = Pool::builder(manager)
            .max_size(options.max_connections.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(options.timeout))
            .create_timeout(Some(options.timeout))
            .recycle_timeout(Some(options.timeout))
            .build()
            .map_err(|e| DbError::Database {
                action: "create the connection pool".into(),
                detail: e.to_string(),
            })?;
        Ok(Database {
            runtime: Some(runtime),
            pool,
            timeout: options.timeout,
            url: options.url.clone(),
        })
    }

    /// The URL it connects to (without a password).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Runs `work` with the pool on the database's runtime, within the timeout, and waits for it
    /// from any thread but the database runtime's own (a task there waiting on itself would never
    /// finish; `work` itself is async and never needs to). A caller on an async runtime blocks its
    /// thread meanwhile: use [`Database::run`] there when it matters.
    pub fn block_on<T, F>(&self, action: &str, work: impl FnOnce(Pool) -> F) -> Result<T, DbError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, DbError>> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let work = self.timed(action, work(self.pool.clone()));
        self.handle()?.spawn(async move {
            // The caller waits on the other end; if it is gone, nobody needs the result.
            let _ = tx.send(work.await);
        });
        rx.recv().unwrap_or_else(|_| Err(stopped(action)))
    }

    /// [`Database::block_on`] for async callers: the work runs on the database's runtime.
    pub async fn run<T, F>(&self, action: &str, work: impl FnOnce(Pool) -> F) -> Result<T, DbError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, DbError>> + Send + 'static,
    {
        let work = self.timed(action, work(self.pool.clone()));
        self.handle()?
            .spawn(work)
            .await
            .unwrap_or_else(|_| Err(stopped(action)))
    }

    fn handle(&self) -> Result<&tokio::runtime::Handle, DbError> {
        self.runtime
            .as_ref()
            .map(tokio::runtime::Runtime::handle)
            .ok_or_else(|| stopped("reach the database"))
    }

    fn timed<T>(
        &self,
        action: &str,
        work: impl Future<Output = Result<T, DbError>>,
    ) -> impl Future<Output = Result<T, DbError>> {
        let timeout = self.timeout;
        let action = action.to_owned();
        async move {
            tokio::time::timeout(timeout, work)
                .await
                .unwrap_or_else(|_| {
                    Err(DbError::Timeout {
                        action,
                        seconds: timeout.as_secs(),
                    })
                })
        }
    }
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        // Dropping a runtime waits for its tasks, which an async caller's thread may not do.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn stopped(action: &str) -> DbError {
    DbError::Database {
        action: action.into(),
        detail: "the database runtime has stopped".into(),
    }
}

/// TLS towards the server: ring, and the CAs of `ca_file` or else the system's roots.
fn client_config(ca_file: Option<&Path>) -> Result<ClientConfig, DbError> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let file_error = |message: String| DbError::File {
                file: path.to_owned(),
                message,
            };
            let pem = meshca_files::read(
                path,
                meshca_files::PEM_FILE_BYTES,
                meshca_files::PEM_FILE_BOUND,
            )
            .map_err(|e| file_error(format!("cannot read (keystore.postgres.caFile): {e}")))?;
            let certs = CertificateDer::pem_slice_iter(&pem);
            for cert in certs {
                let cert = cert.map_err(|e| file_error(format!("not a PEM certificate: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| file_error(format!("not a usable CA certificate: {e}")))?;
            }
            if roots.is_empty() {
                return Err(file_error("holds no certificate".into()));
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            for cert in native.certs {
                // A system root rustls cannot use is no root for this connection either.
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| DbError::Database {
            action: "configure TLS".into(),
            detail: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// A transaction holding the advisory lock `lock` until it ends: writers under the same lock, in every
/// replica, run one at a time. `action` names the work in errors.
pub(crate) async fn locked_transaction<'c>(
    client: &'c mut deadpool_postgres::Client,
    lock: i64,
    action: &str,
) -> Result<deadpool_postgres::Transaction<'c>, DbError> {
    let tx = client
        .transaction()
        .await
        .map_err(DbError::database(action))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock])
        .await
        .map_err(DbError::database(action))?;
    Ok(tx)
}
