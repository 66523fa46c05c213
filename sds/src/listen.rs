//! Where the SDS server listens: a unix socket, TLS over TCP, or plaintext on loopback.
//!
//! Everything is bound first, so a bad address fails before anything serves; then one
//! tonic server serves all listeners through a merged stream of accepted connections.
//! TLS handshakes run in a task per connection, so a slow client cannot block accepts.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::error::{ListenError, ServeError};
use crate::log_budget::LogBudget;
use crate::metrics::SdsMetrics;
use crate::options::SdsLimits;
use crate::service::SdsServer;
use crate::transport::conn::{Conn, Io};
use crate::transport::h2_header_fixup::{UnixPathHeaderFix, MAX_FRAME_SIZE};

/// HTTP/2 PING interval, so that dead peers are noticed and their streams closed.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a PING may stay unanswered before the connection is closed.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);
/// Accepted connections waiting for the server to pick them up.
const ACCEPT_QUEUE: usize = 128;
/// The largest header list (HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE`, HTTP/2's default for hyper): a
/// request's headers, token included. The unix socket's header rewriter holds no more than this.
const MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;

/// One place to serve SDS.
#[derive(Clone)]
pub enum Listener {
    /// A unix socket at this path (mode 0660; a stale socket file is replaced).
    Unix(PathBuf),
    /// TLS over TCP. ALPN `h2` is offered whatever the config says.
    Tls {
        /// Address to bind; port 0 picks a free port.
        addr: SocketAddr,
        /// The server's TLS configuration (built with the ring provider).
        config: Arc<rustls::ServerConfig>,
    },
    /// Plaintext TCP, refused unless the address is loopback.
    InsecureLoopback(SocketAddr),
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listener::Unix(path) => write!(f, "Unix({})", path.display()),
            Listener::Tls { addr, .. } => write!(f, "Tls({addr})"),
            Listener::InsecureLoopback(addr) => write!(f, "InsecureLoopback({addr})"),
        }
    }
}

/// Where a bound listener actually listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BoundAddr {
    /// A unix socket.
    Unix(PathBuf),
    /// TLS over TCP, with the port actually bound.
    Tls(SocketAddr),
    /// Plaintext loopback TCP, with the port actually bound.
    InsecureLoopback(SocketAddr),
}

impl fmt::Display for BoundAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BoundAddr::Unix(path) => write!(f, "unix://{}", path.display()),
            BoundAddr::Tls(addr) => write!(f, "{addr} (TLS)"),
            BoundAddr::InsecureLoopback(addr) => write!(f, "{addr} (plaintext, loopback only)"),
        }
    }
}

enum Bound {
    Unix {
        path: PathBuf,
        listener: UnixListener,
    },
    Tls {
        addr: SocketAddr,
        listener: TcpListener,
        acceptor: TlsAcceptor,
    },
    Plain {
        addr: SocketAddr,
        listener: TcpListener,
    },
}

/// Listeners that are bound and ready to serve.
pub struct BoundListeners {
    bound: Vec<Bound>,
}

impl fmt::Debug for BoundListeners {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.local_addrs()).finish()
    }
}

/// Binds every listener, or none: the first failure is returned and nothing serves.
pub async fn bind(listeners: Vec<Listener>) -> Result<BoundListeners, ListenError> {
    let mut bound = Vec::with_capacity(listeners.len());
    for listener in listeners {
        bound.push(match listener {
            Listener::Unix(path) => bind_unix(path).await?,
            Listener::Tls { addr, config } => {
                let listener = bind_tcp(addr).await?;
                let addr = listener.local_addr().unwrap_or(addr);
                Bound::Tls {
                    addr,
                    listener,
                    acceptor: TlsAcceptor::from(with_h2(&config)),
                }
            }
            Listener::InsecureLoopback(addr) => {
                if !addr.ip().is_loopback() {
                    return Err(ListenError::NotLoopback { address: addr });
                }
                let listener = bind_tcp(addr).await?;
                let addr = listener.local_addr().unwrap_or(addr);
                Bound::Plain { addr, listener }
            }
        });
    }
    Ok(BoundListeners { bound })
}

async fn bind_tcp(addr: SocketAddr) -> Result<TcpListener, ListenError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ListenError::Bind {
            address: addr.to_string(),
            source,
        })
}

async fn bind_unix(path: PathBuf) -> Result<Bound, ListenError> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !parent.is_dir() {
        return Err(ListenError::MissingParent { path, parent });
    }
    remove_stale_socket(&path).await?;
    let listener = UnixListener::bind(&path).map_err(|source| ListenError::Bind {
        address: format!("unix://{}", path.display()),
        source,
    })?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660)).map_err(|source| {
        ListenError::Permissions {
            path: path.clone(),
            source,
        }
    })?;
    Ok(Bound::Unix { path, listener })
}

/// Removes a socket file left by a previous run; refuses to touch anything else, or a
/// socket someone still serves on.
async fn remove_stale_socket(path: &Path) -> Result<(), ListenError> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ListenError::Bind {
                address: format!("unix://{}", path.display()),
                source,
            })
        }
    };
    if !metadata.file_type().is_socket() {
        return Err(ListenError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    if UnixStream::connect(path).await.is_ok() {
        return Err(ListenError::SocketInUse {
            path: path.to_path_buf(),
        });
    }
    std::fs::remove_file(path).map_err(|source| ListenError::Bind {
        address: format!("unix://{}", path.display()),
        source,
    })
}

fn with_h2(config: &Arc<rustls::ServerConfig>) -> Arc<rustls::ServerConfig> {
    if config.alpn_protocols.iter().any(|proto| proto == b"h2") {
        return config.clone();
    }
    let mut config = (**config).clone();
    config.alpn_protocols.insert(0, b"h2".to_vec());
    Arc::new(config)
}

impl BoundListeners {
    /// Where each listener listens, in the order given to [`bind`] (actual ports when
    /// port 0 was asked).
    pub fn local_addrs(&self) -> Vec<BoundAddr> {
        self.bound.iter().map(Bound::addr).collect()
    }

    /// Serves `server` on every listener until `shutdown` fires; then closes open streams
    /// with `UNAVAILABLE`, waits for connections to finish, and removes the unix socket
    /// files. HTTP/2 keepalive pings close connections to dead peers; the server's
    /// [`SdsLimits`] bound connections per listener, streams per connection, and how long a
    /// connection may stay open without a stream.
    pub async fn serve(
        self,
        server: SdsServer,
        shutdown: CancellationToken,
    ) -> Result<(), ServeError> {
        let (tx, rx) = mpsc::channel::<io::Result<Conn>>(ACCEPT_QUEUE);
        let limits = server.limits().clone();
        let mut sockets = Vec::new();
        for bound in self.bound {
            if let Bound::Unix { path, .. } = &bound {
                sockets.push(path.clone());
            }
            let accepting = Accepting {
                slots: Arc::new(Semaphore::new(limits.connections_per_listener)),
                shed_logged: LogBudget::new(limits.warnings_per_minute),
                limits: limits.clone(),
                metrics: server.metrics(),
            };
            tokio::spawn(accept_loop(bound, accepting, tx.clone(), shutdown.clone()));
        }
        drop(tx);
        let closer = server.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            stop.cancelled().await;
            closer.close_streams();
        });
        let result = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
            .http2_max_header_list_size(Some(MAX_HEADER_LIST_SIZE))
            .max_frame_size(Some(MAX_FRAME_SIZE as u32))
            .max_concurrent_streams(Some(limits.streams_per_connection))
            .add_service(server.into_service())
            .serve_with_incoming_shutdown(ReceiverStream::new(rx), shutdown.cancelled_owned())
            .await;
        for path in sockets {
            if let Err(error) = std::fs::remove_file(&path) {
                tracing::debug!(path = %path.display(), %error, "could not remove the SDS socket file");
            }
        }
        result.map_err(|error| ServeError::Transport {
            message: error.to_string(),
        })
    }
}

/// What one listener's accept loop needs besides the socket.
struct Accepting {
    /// One permit per open connection: [`SdsLimits::connections_per_listener`].
    slots: Arc<Semaphore>,
    shed_logged: LogBudget,
    limits: SdsLimits,
    metrics: Arc<SdsMetrics>,
}

impl Accepting {
    fn connection(&self, io: Io, slot: tokio::sync::OwnedSemaphorePermit, at: Instant) -> Conn {
        Conn::new(
            io,
            slot,
            at,
            self.limits.connect_timeout,
            self.limits.idle_timeout,
        )
    }

    /// Closes a connection the listener has no room for, saying so at most a few times a minute.
    fn shed(&self, bound: &Bound, accepted: Accepted) {
        drop(accepted);
        SdsMetrics::incr(&self.metrics.connections_shed);
        match self.shed_logged.admit() {
            Some(suppressed) => tracing::warn!(
                listener = %bound.addr(),
                limit = self.limits.connections_per_listener,
                suppressed,
                "SDS listener is at its connection limit (limits.sdsConnections): new connections are closed at once until some close"
            ),
            None => SdsMetrics::incr(&self.metrics.log_lines_suppressed),
        }
    }
}

async fn accept_loop(
    bound: Bound,
    accepting: Accepting,
    tx: mpsc::Sender<io::Result<Conn>>,
    shutdown: CancellationToken,
) {
    let accepting = Arc::new(accepting);
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            () = tx.closed() => return,
            accepted = accept(&bound) => accepted,
        };
        let at = Instant::now();
        let accepted = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, listener = %bound.addr(), "SDS listener failed to accept a connection");
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => {}
                }
                continue;
            }
        };
        let Ok(slot) = accepting.slots.clone().try_acquire_owned() else {
            accepting.shed(&bound, accepted);
            continue;
        };
        match accepted {
            Accepted::Ready(io) => {
                if tx
                    .send(Ok(accepting.connection(io, slot, at)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Accepted::Handshake(acceptor, stream, peer) => {
                let (tx, accepting) = (tx.clone(), accepting.clone());
                let deadline = at + accepting.limits.connect_timeout;
                tokio::spawn(async move {
                    match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let conn = accepting.connection(Io::Tls(Box::new(tls)), slot, at);
                            // The server may have stopped meanwhile; the connection is dropped.
                            let _ = tx.send(Ok(conn)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%peer, %error, "SDS TLS handshake failed");
                        }
                        Err(_) => tracing::debug!(%peer, "SDS TLS handshake timed out"),
                    }
                });
            }
        }
    }
}

enum Accepted {
    Ready(Io),
    Handshake(TlsAcceptor, tokio::net::TcpStream, SocketAddr),
}

impl Bound {
    fn addr(&self) -> BoundAddr {
        match self {
            Bound::Unix { path, .. } => BoundAddr::Unix(path.clone()),
            Bound::Tls { addr, .. } => BoundAddr::Tls(*addr),
            Bound::Plain { addr, .. } => BoundAddr::InsecureLoopback(*addr),
        }
    }
}

async fn accept(bound: &Bound) -> io::Result<Accepted> {
    match bound {
        Bound::Unix { listener, .. } => {
            let (stream, _) = listener.accept().await?;
            let fixed = UnixPathHeaderFix::new(stream, MAX_HEADER_LIST_SIZE as usize);
            Ok(Accepted::Ready(Io::Unix(fixed)))
        }
        Bound::Plain { listener, .. } => {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            Ok(Accepted::Ready(Io::Plain(stream)))
        }
        Bound::Tls {
            listener, acceptor, ..
        } => {
            let (stream, peer) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            Ok(Accepted::Handshake(acceptor.clone(), stream, peer))
        }
    }
}
