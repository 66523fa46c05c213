//! Where the SDS server listens: a unix socket, TLS over TCP, or plaintext on loopback.
//!
//! Everything is bound first, so a bad address fails before anything serves; then one
//! tonic server serves all listeners through a merged stream of accepted connections.
//! TLS handshakes run in a task per connection, so a slow client cannot block accepts.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::conn::{CloseLog, Conn, Io};
use crate::error::{ListenError, ServeError};
use crate::h2_header_fixup::{UnixPathHeaderFix, MAX_FRAME_SIZE};
use crate::hub::Hub;
use crate::log_budget::LogBudget;
use crate::metrics::StreamMetrics;
use crate::options::{Keepalive, StreamLimits};

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
    /// A unix socket any local user may connect to (mode 0666), for a service that tells its callers
    /// apart by what the kernel says of their process rather than by who may open the socket.
    UnixForAnyUser(PathBuf),
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
            Listener::Unix(path) | Listener::UnixForAnyUser(path) => {
                write!(f, "Unix({})", path.display())
            }
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
            Listener::Unix(path) => bind_unix(path, 0o660).await?,
            Listener::UnixForAnyUser(path) => bind_unix(path, 0o666).await?,
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

async fn bind_unix(path: PathBuf, mode: u32) -> Result<Bound, ListenError> {
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
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(|source| {
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

    /// Serves the gRPC services `routes` (SDS, and the agent protocol beside it), whose streams are
    /// `hub`'s, on every listener until `shutdown` fires; then closes the hub's open streams with
    /// `UNAVAILABLE`, waits for connections to finish, and removes the unix socket files. HTTP/2
    /// keepalive pings close connections to dead peers; the hub's [`StreamLimits`] bound connections
    /// per listener, streams per connection, and how long a connection may stay open without a stream,
    /// and its counters count what the listeners shed.
    pub async fn serve_hub(
        self,
        hub: &Hub,
        routes: tonic::service::Routes,
        shutdown: CancellationToken,
    ) -> Result<(), ServeError> {
        let policy = ConnPolicy::new("SDS", "limits.sdsConnections", hub.limits().clone())
            .with_metrics(hub.metrics().clone());
        let closer = hub.clone();
        self.serve_service(routes, policy, move || closer.close_streams(), shutdown)
            .await
    }

    /// Serves any gRPC services (`routes`) on every listener, with the connection handling SDS has (limits,
    /// idle deadlines, keepalive, the unix socket's `:authority` fix-up), until `shutdown` fires;
    /// then calls `close_streams` (which must end the service's open streams so that a graceful
    /// HTTP/2 shutdown can complete), waits for connections to finish, and removes the unix socket
    /// files.
    pub async fn serve_service(
        self,
        routes: tonic::service::Routes,
        policy: ConnPolicy,
        close_streams: impl FnOnce() + Send + 'static,
        shutdown: CancellationToken,
    ) -> Result<(), ServeError> {
        let (tx, rx) = mpsc::channel::<io::Result<Conn>>(ACCEPT_QUEUE);
        let limits = policy.limits.clone();
        let mut sockets = Vec::new();
        for bound in self.bound {
            if let Bound::Unix { path, .. } = &bound {
                sockets.push(path.clone());
            }
            let accepting = Accepting {
                slots: Arc::new(Semaphore::new(limits.connections_per_listener)),
                per_uid: Arc::default(),
                shed_logged: LogBudget::new(limits.warnings_per_minute),
                closes: Arc::new(CloseLog {
                    what: policy.what,
                    listener: bound.addr().to_string(),
                    connect_timeout: limits.connect_timeout,
                    keepalive: policy.keepalive,
                    budget: LogBudget::new(limits.warnings_per_minute),
                    metrics: policy.metrics.clone(),
                }),
                policy: policy.clone(),
            };
            tokio::spawn(accept_loop(bound, accepting, tx.clone(), shutdown.clone()));
        }
        drop(tx);
        let stop = shutdown.clone();
        tokio::spawn(async move {
            stop.cancelled().await;
            close_streams();
        });
        let result = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(policy.keepalive.interval))
            .http2_keepalive_timeout(Some(policy.keepalive.timeout))
            .http2_max_header_list_size(Some(MAX_HEADER_LIST_SIZE))
            .max_frame_size(Some(MAX_FRAME_SIZE as u32))
            .max_concurrent_streams(Some(limits.streams_per_connection))
            .add_routes(routes)
            .serve_with_incoming_shutdown(ReceiverStream::new(rx), shutdown.cancelled_owned())
            .await;
        for path in sockets {
            if let Err(error) = std::fs::remove_file(&path) {
                tracing::debug!(path = %path.display(), %error, "could not remove the {} socket file", policy.what);
            }
        }
        result.map_err(|error| ServeError::Transport {
            message: error.to_string(),
        })
    }
}

/// Learns who is at the other end of a unix socket connection, once, when it is accepted; what it
/// returns reaches every request on that connection through [`ConnInfo::peer`].
pub type PeerProbe =
    Arc<dyn Fn(BorrowedFd<'_>) -> Option<Arc<dyn Any + Send + Sync>> + Send + Sync>;

/// How a set of listeners treats its connections: the limits, where to count what happens, how to
/// learn a unix peer, and what to call the service and its connection limit in log lines.
#[derive(Clone)]
pub struct ConnPolicy {
    what: &'static str,
    connections_setting: &'static str,
    limits: StreamLimits,
    metrics: Arc<StreamMetrics>,
    peer_probe: Option<PeerProbe>,
    /// Connections one uid may hold on a unix socket, and the setting that says so.
    per_uid: Option<(usize, &'static str)>,
    keepalive: Keepalive,
}

impl fmt::Debug for ConnPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnPolicy")
            .field("what", &self.what)
            .field("limits", &self.limits)
            .field("peer_probe", &self.peer_probe.is_some())
            .field("per_uid", &self.per_uid)
            .field("keepalive", &self.keepalive)
            .finish_non_exhaustive()
    }
}

impl ConnPolicy {
    /// A policy for the service called `what` in logs, whose connection limit is the setting
    /// `connections_setting`, with `limits` and counters of its own.
    pub fn new(
        what: &'static str,
        connections_setting: &'static str,
        limits: StreamLimits,
    ) -> Self {
        ConnPolicy {
            what,
            connections_setting,
            limits,
            metrics: Arc::new(StreamMetrics::default()),
            peer_probe: None,
            per_uid: None,
            keepalive: Keepalive::default(),
        }
    }

    /// The policy letting one uid (the peer's, on a unix socket) hold at most `limit` connections
    /// of a listener, so that no user can take every slot from the others; `setting` names the
    /// limit in log lines.
    pub fn with_connections_per_uid(mut self, limit: usize, setting: &'static str) -> Self {
        self.per_uid = Some((limit, setting));
        self
    }

    /// The policy counting into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<StreamMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The policy asking `probe` who connected on each unix socket connection.
    pub fn with_peer_probe(mut self, probe: PeerProbe) -> Self {
        self.peer_probe = Some(probe);
        self
    }

    /// The policy pinging silent peers as `keepalive` says (the default: after 30 s, answered
    /// within 10 s).
    pub fn with_keepalive(mut self, keepalive: Keepalive) -> Self {
        self.keepalive = keepalive;
        self
    }
}

/// What one listener's accept loop needs besides the socket.
struct Accepting {
    /// One permit per open connection: [`StreamLimits::connections_per_listener`].
    slots: Arc<Semaphore>,
    /// Open connections per peer uid, where the policy limits them.
    per_uid: Arc<Mutex<HashMap<u32, usize>>>,
    shed_logged: LogBudget,
    /// Where it and its connections say that one was closed for not finishing its TLS handshake or
    /// opening a stream in time, or for not answering the keepalive ping.
    closes: Arc<CloseLog>,
    policy: ConnPolicy,
}

/// One connection's place in its uid's share; given back when the connection closes.
struct UidSlot {
    uid: u32,
    open: Arc<Mutex<HashMap<u32, usize>>>,
}

impl Drop for UidSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.uid) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.uid);
            }
        }
    }
}

impl Accepting {
    /// A place in the share of the uid at the other end of a unix socket, where the policy limits
    /// connections per uid: `Err` when that uid holds its share already (or cannot be told).
    fn uid_slot(&self, io: &Io) -> Result<Option<UidSlot>, Option<u32>> {
        let (Some((limit, _)), Io::Unix(stream)) = (self.policy.per_uid, io) else {
            return Ok(None);
        };
        let uid = stream.get_ref().peer_cred().map_err(|_| None)?.uid();
        let mut open = self.per_uid.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(uid).or_default();
        if *count >= limit {
            return Err(Some(uid));
        }
        *count += 1;
        Ok(Some(UidSlot {
            uid,
            open: self.per_uid.clone(),
        }))
    }

    /// Closes a connection whose uid holds its share already, saying so at most a few times a minute.
    fn shed_uid(&self, bound: &Bound, uid: Option<u32>) {
        let policy = &self.policy;
        StreamMetrics::incr(&policy.metrics.connections_shed);
        let (limit, setting) = policy.per_uid.unwrap_or((0, ""));
        match self.shed_logged.admit() {
            Some(suppressed) => tracing::warn!(
                listener = %bound.addr(),
                ?uid,
                limit,
                suppressed,
                "a user holds as many {} connections as one user may ({setting}): its new \
                 connections are closed at once until some close",
                policy.what,
            ),
            None => StreamMetrics::incr(&policy.metrics.log_lines_suppressed),
        }
    }

    fn connection(&self, io: Io, slot: tokio::sync::OwnedSemaphorePermit, at: Instant) -> Conn {
        let peer = match (&io, &self.policy.peer_probe) {
            (Io::Unix(stream), Some(probe)) => probe(stream.get_ref().as_fd()),
            _ => None,
        };
        let limits = &self.policy.limits;
        Conn::new(io, slot, at, limits.connect_timeout, limits.idle_timeout)
            .with_peer(peer)
            .logging_closes(self.closes.clone())
    }

    /// Closes a connection the listener has no room for, saying so at most a few times a minute.
    fn shed(&self, bound: &Bound, accepted: Accepted) {
        drop(accepted);
        let policy = &self.policy;
        StreamMetrics::incr(&policy.metrics.connections_shed);
        match self.shed_logged.admit() {
            Some(suppressed) => tracing::warn!(
                listener = %bound.addr(),
                limit = policy.limits.connections_per_listener,
                suppressed,
                "{} listener is at its connection limit ({}): new connections are closed at once until some close",
                policy.what,
                policy.connections_setting,
            ),
            None => StreamMetrics::incr(&policy.metrics.log_lines_suppressed),
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
                tracing::warn!(%error, listener = %bound.addr(), "{} listener failed to accept a connection", accepting.policy.what);
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => {}
                }
                continue;
            }
        };
        let uid_slot = match &accepted {
            Accepted::Ready(io) => accepting.uid_slot(io),
            Accepted::Handshake(..) => Ok(None),
        };
        let uid_slot = match uid_slot {
            Ok(uid_slot) => uid_slot,
            Err(uid) => {
                drop(accepted);
                accepting.shed_uid(&bound, uid);
                continue;
            }
        };
        let Ok(slot) = accepting.slots.clone().try_acquire_owned() else {
            accepting.shed(&bound, accepted);
            continue;
        };
        match accepted {
            Accepted::Ready(io) => {
                let mut conn = accepting.connection(io, slot, at);
                if let Some(uid_slot) = uid_slot {
                    conn = conn.holding(Box::new(uid_slot));
                }
                if tx.send(Ok(conn)).await.is_err() {
                    return;
                }
            }
            Accepted::Handshake(acceptor, stream, peer) => {
                let (tx, accepting) = (tx.clone(), accepting.clone());
                let deadline = at + accepting.policy.limits.connect_timeout;
                tokio::spawn(async move {
                    // Held here, so that a connection closed for its handshake is closed after the
                    // warning, not before it.
                    let handshake = acceptor.accept(stream);
                    tokio::pin!(handshake);
                    match tokio::time::timeout_at(deadline, &mut handshake).await {
                        Ok(Ok(tls)) => {
                            let conn = accepting.connection(Io::Tls(Box::new(tls)), slot, at);
                            // The server may have stopped meanwhile; the connection is dropped.
                            let _ = tx.send(Ok(conn)).await;
                        }
                        Ok(Err(error)) => {
                            let what = accepting.policy.what;
                            tracing::debug!(%peer, %error, "{what} TLS handshake failed");
                        }
                        Err(_) => accepting.closes.handshake_not_in_time(peer),
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
