//! One accepted connection, whatever the listener: the IO type given to tonic.
//!
//! Every connection holds a slot of its listener's connection limit until it closes, and has a
//! deadline whenever no authenticated stream is open on it: a new connection must open its first
//! stream within the connect timeout, and a connection whose streams have all ended is closed after
//! the idle timeout. Without this, sockets that never send anything (or never send more than the
//! HTTP/2 preface) would be held open forever, and enough of them exhaust the daemon's file
//! descriptors.
//!
//! It is all shell: it counts streams and keeps a deadline around the socket, and handles no bytes
//! (the unix socket's bytes go through [`super::h2_header_fixup`], which has its own core), so there
//! is no sans-IO core to take out of it.
//!
//! What would let it go: an HTTP/2 server idle timeout in hyper (close a connection that has had no
//! open stream for a while, and one that opens none in time): hyperium/hyper#1628, still open.

use std::any::Any;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};
use tokio_rustls::server::TlsStream;
use tonic::transport::server::Connected;

use crate::h2_header_fixup::UnixPathHeaderFix;
use crate::log_budget::LogBudget;
use crate::metrics::StreamMetrics;
use crate::options::Keepalive;

/// The transport under a connection.
pub(crate) enum Io {
    /// Unix socket clients may be grpc-core ones: see [`crate::h2_header_fixup`].
    Unix(UnixPathHeaderFix<UnixStream>),
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// An accepted connection, with its slot in the listener's limit and its idle deadline.
pub(crate) struct Conn {
    io: Io,
    tracker: Arc<ConnTracker>,
    /// Who is at the other end, as the listener's peer probe learned it when it accepted.
    peer: Option<Arc<dyn Any + Send + Sync>>,
    deadline: Pin<Box<Sleep>>,
    /// Released when tonic drops the connection.
    _slot: OwnedSemaphorePermit,
    /// Any other share of a limit the connection holds until it closes (its uid's, on a unix socket
    /// that limits connections per uid).
    _held: Option<Box<dyn Any + Send + Sync>>,
    /// Where the close of a connection that never opened a stream, or whose peer stopped answering,
    /// is said; `None`: not said.
    closes: Option<Arc<CloseLog>>,
    /// When the peer last sent anything (the connection's accept, before it sent any).
    last_read: Instant,
    /// Whether the connection's deadline closed it, or its shutdown was looked at already.
    close_said: bool,
}

/// Where a listener's connections say that the daemon closed one that did not finish its TLS
/// handshake or open a stream in time, or whose peer stopped answering the HTTP/2 keepalive ping (the
/// listener's, shared by its connections). Such a close is a client that connects and sends nothing
/// usable, one too slow to send its first request, or one that hung or lost its network: either way
/// the operator needs to know, since the client only sees its connection end.
pub(crate) struct CloseLog {
    /// The service, for log lines ("SDS", "Workload API").
    pub(crate) what: &'static str,
    /// The listener's address, for log lines.
    pub(crate) listener: String,
    /// The listener's connect timeout, for log lines.
    pub(crate) connect_timeout: Duration,
    /// The HTTP/2 server's keepalive on the listener's connections.
    pub(crate) keepalive: Keepalive,
    pub(crate) budget: LogBudget,
    pub(crate) metrics: Arc<StreamMetrics>,
}

impl CloseLog {
    /// Says that the connection from `peer` was closed for not finishing its TLS handshake in time, at
    /// most as often as the budget allows.
    pub(crate) fn handshake_not_in_time(&self, peer: SocketAddr) {
        if let Some(suppressed) = self.admit() {
            tracing::warn!(
                listener = %self.listener,
                %peer,
                suppressed,
                "{} listener closed a connection whose TLS handshake did not finish within {:?} of \
                 being accepted (limits.connectTimeout)",
                self.what,
                self.connect_timeout,
            );
        }
    }

    /// Says that a connection which carried `carried` bytes was closed for opening no stream, at most
    /// as often as the budget allows.
    fn no_stream_in_time(&self, carried: u64) {
        if let Some(suppressed) = self.admit() {
            tracing::warn!(
                listener = %self.listener,
                carried_bytes = carried,
                suppressed,
                "{} listener closed a connection that opened no stream within {:?} of being \
                 accepted (limits.connectTimeout): its client sent nothing usable, or was too slow to",
                self.what,
                self.connect_timeout,
            );
        }
    }

    /// Counts, and says at most as often as the budget allows, that the HTTP/2 server closed a
    /// connection whose peer had sent nothing for `silent` (longer than a live peer can: it did not
    /// answer the keepalive ping), with `streams` streams still open on it.
    fn keepalive_unanswered(&self, peer: Option<SocketAddr>, silent: Duration, streams: usize) {
        StreamMetrics::incr(&self.metrics.connections_keepalive_closed);
        if let Some(suppressed) = self.admit() {
            tracing::warn!(
                listener = %self.listener,
                peer = %peer.map_or_else(|| "a unix socket client".to_owned(), |p| p.to_string()),
                silent_seconds = silent.as_secs(),
                open_streams = streams,
                suppressed,
                "{} listener closed a connection whose client sent nothing for {}s and did not answer \
                 the HTTP/2 keepalive ping within {:?}: the client hung, is starved of CPU, or lost \
                 the network; its open streams ended with it, and it must reconnect",
                self.what,
                silent.as_secs(),
                self.keepalive.timeout,
            );
        }
    }

    /// A line may be written (with how many were left out before it), or it is counted as left out.
    fn admit(&self) -> Option<u64> {
        let admitted = self.budget.admit();
        if admitted.is_none() {
            StreamMetrics::incr(&self.metrics.log_lines_suppressed);
        }
        admitted
    }
}

impl Conn {
    /// A connection accepted at `accepted`: it must open a stream before `accepted + connect_timeout`,
    /// and is closed `idle_timeout` after its last stream ends.
    pub(crate) fn new(
        io: Io,
        slot: OwnedSemaphorePermit,
        accepted: Instant,
        connect_timeout: Duration,
        idle_timeout: Duration,
    ) -> Self {
        let first_deadline = accepted + connect_timeout;
        Conn {
            io,
            tracker: Arc::new(ConnTracker {
                state: Mutex::new(TrackerState {
                    streams: 0,
                    opened: false,
                    deadline: Some(first_deadline),
                    refused: false,
                }),
                carried: AtomicU64::new(0),
                idle_timeout,
                waker: AtomicWaker::new(),
            }),
            deadline: Box::pin(tokio::time::sleep_until(first_deadline)),
            peer: None,
            _slot: slot,
            _held: None,
            closes: None,
            last_read: accepted,
            close_said: false,
        }
    }

    /// The connection, saying in `log` when it is closed for opening no stream in time.
    pub(crate) fn logging_closes(mut self, log: Arc<CloseLog>) -> Self {
        self.closes = Some(log);
        self
    }

    /// The connection, holding `held` until it closes.
    pub(crate) fn holding(mut self, held: Box<dyn Any + Send + Sync>) -> Self {
        self._held = Some(held);
        self
    }

    /// The connection with what the listener learned about its peer.
    pub(crate) fn with_peer(mut self, peer: Option<Arc<dyn Any + Send + Sync>>) -> Self {
        self.peer = peer;
        self
    }

    fn io(self: Pin<&mut Self>) -> Pin<&mut Io> {
        Pin::new(&mut self.get_mut().io)
    }

    /// The HTTP/2 server is closing the connection itself: if its peer was silent for longer than
    /// a live one can be, the keepalive closed it, which is said once.
    fn on_shutdown(&mut self) {
        if std::mem::replace(&mut self.close_said, true) {
            return;
        }
        let Some(log) = &self.closes else { return };
        let silent = self.last_read.elapsed();
        if silent >= log.keepalive.longest_silence() {
            log.keepalive_unanswered(self.io.peer_addr(), silent, self.tracker.lock().streams);
        }
    }
}

/// Counts the authenticated streams of one connection; shared with every request on it through
/// [`ConnInfo`].
pub(crate) struct ConnTracker {
    state: Mutex<TrackerState>,
    /// Bytes read from and written to the connection (in the clear), for [`ConnProgress`].
    carried: AtomicU64,
    idle_timeout: Duration,
    /// The connection's reader, woken when its deadline changes.
    waker: AtomicWaker,
}

struct TrackerState {
    streams: usize,
    /// Whether a stream was ever open on it: its deadline is then the idle one.
    opened: bool,
    /// When the connection closes unless a stream opens; `None` while a stream is open.
    deadline: Option<Instant>,
    /// Whether a request on it was refused for who the caller is: it closes as soon as its streams
    /// have ended (after [`REFUSED_GRACE`], for the refusal to reach the caller).
    refused: bool,
}

/// Why a connection's deadline closed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closing {
    /// It opened no stream within the connect timeout.
    NoStream,
    /// Its streams ended and none opened for the idle timeout.
    Idle,
    /// Its caller was refused, and its streams ended.
    Refused,
}

impl Closing {
    /// The error the HTTP/2 server is handed (it is not shown to the client, whose connection ends).
    fn message(self) -> &'static str {
        match self {
            Closing::NoStream => "no stream opened in time: connection closed",
            Closing::Idle => "no stream open for the idle timeout: connection closed",
            Closing::Refused => "the caller was refused: connection closed",
        }
    }
}

/// How long a connection whose caller was refused stays open once its last stream ended: enough for
/// the refusal to be written.
const REFUSED_GRACE: Duration = Duration::from_secs(1);

impl ConnTracker {
    /// Counts a stream as open until the returned guard is dropped.
    pub(crate) fn stream_opened(self: &Arc<Self>) -> StreamGuard {
        let mut state = self.lock();
        state.streams += 1;
        state.opened = true;
        state.deadline = None;
        StreamGuard {
            tracker: self.clone(),
        }
    }

    fn deadline(&self) -> Option<Instant> {
        self.lock().deadline
    }

    /// Why the deadline that passed closes the connection.
    fn closing(&self) -> Closing {
        let state = self.lock();
        if state.refused {
            Closing::Refused
        } else if state.opened {
            Closing::Idle
        } else {
            Closing::NoStream
        }
    }

    /// Closes the connection once no stream is open on it (see [`ConnInfo::close_when_idle`]).
    fn refuse(&self) {
        let mut state = self.lock();
        state.refused = true;
        if state.streams == 0 {
            state.deadline = Some(Instant::now() + REFUSED_GRACE.min(self.idle_timeout));
            drop(state);
            self.waker.wake();
        }
    }

    fn carried(&self, bytes: usize) {
        if bytes > 0 {
            self.carried.fetch_add(bytes as u64, Ordering::Relaxed);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TrackerState> {
        // The state is two plain values, valid after any panic.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// An open stream of a connection (see [`ConnTracker::stream_opened`]).
pub(crate) struct StreamGuard {
    tracker: Arc<ConnTracker>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut state = self.tracker.lock();
        state.streams = state.streams.saturating_sub(1);
        if state.streams == 0 {
            let wait = if state.refused {
                REFUSED_GRACE.min(self.tracker.idle_timeout)
            } else {
                self.tracker.idle_timeout
            };
            state.deadline = Some(Instant::now() + wait);
            drop(state);
            self.tracker.waker.wake();
        }
    }
}

/// What a request can learn about its connection (a request extension).
#[derive(Clone)]
pub struct ConnInfo {
    /// The peer's address; `None` on a unix socket.
    pub remote_addr: Option<SocketAddr>,
    /// Whether the connection is TLS.
    pub tls: bool,
    pub(crate) tracker: Arc<ConnTracker>,
    peer: Option<Arc<dyn Any + Send + Sync>>,
}

impl ConnInfo {
    /// What the listener's peer probe learned about the process at the other end of a unix socket,
    /// if it learned a `T` (see [`crate::ConnPolicy::with_peer_probe`]).
    pub fn peer<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.peer.clone()?.downcast::<T>().ok()
    }

    /// Closes this connection as soon as none of its streams is open (a moment after, so that the
    /// answer in flight is written), rather than after the idle timeout: for a caller refused for
    /// who it is, which would only hold a connection slot by staying.
    pub fn close_when_idle(&self) {
        self.tracker.refuse();
    }

    /// Counts a stream of this connection as open until the guard is dropped: the connection has no
    /// idle deadline meanwhile.
    pub fn stream_opened(&self) -> OpenStream {
        OpenStream {
            _guard: self.tracker.stream_opened(),
        }
    }
}

/// An open stream of a connection (see [`ConnInfo::stream_opened`]).
pub struct OpenStream {
    _guard: StreamGuard,
}

impl OpenStream {
    /// What the stream's connection has carried so far.
    pub fn progress(&self) -> ConnProgress {
        ConnProgress {
            tracker: self._guard.tracker.clone(),
        }
    }
}

/// How many bytes a connection has carried, both ways: whether it is still busy (a client's requests
/// can wait behind each other in HTTP/2 flow control while the server reads and answers the others) or
/// has gone quiet.
#[derive(Clone)]
pub struct ConnProgress {
    tracker: Arc<ConnTracker>,
}

impl ConnProgress {
    /// Bytes read from and written to the connection so far (in the clear, inside TLS).
    pub fn carried(&self) -> u64 {
        self.tracker.carried.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for ConnProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnProgress")
            .field("carried", &self.carried())
            .finish()
    }
}

impl std::fmt::Debug for OpenStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpenStream")
    }
}

impl std::fmt::Debug for ConnInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnInfo")
            .field("remote_addr", &self.remote_addr)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        ConnInfo {
            remote_addr: self.io.peer_addr(),
            tls: matches!(self.io, Io::Tls(_)),
            tracker: self.tracker.clone(),
            peer: self.peer.clone(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // The HTTP/2 server always has a read pending, so this is where the deadline is kept.
        let this = self.get_mut();
        this.tracker.waker.register(cx.waker());
        if let Some(deadline) = this.tracker.deadline() {
            if this.deadline.deadline() != deadline {
                this.deadline.as_mut().reset(deadline);
            }
            if this.deadline.as_mut().poll(cx).is_ready() {
                this.close_said = true;
                let why = this.tracker.closing();
                if let (Closing::NoStream, Some(log)) = (why, &this.closes) {
                    log.no_stream_in_time(this.tracker.carried.load(Ordering::Relaxed));
                }
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why.message())));
            }
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut *this).io().poll_read(cx, buf);
        let got = buf.filled().len().saturating_sub(before);
        if got > 0 {
            this.last_read = Instant::now();
        }
        this.tracker.carried(got);
        read
    }
}

impl Io {
    /// The peer's address; `None` on a unix socket.
    fn peer_addr(&self) -> Option<SocketAddr> {
        match self {
            Io::Unix(_) => None,
            Io::Plain(stream) => stream.peer_addr().ok(),
            Io::Tls(stream) => stream.get_ref().0.peer_addr().ok(),
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Unix(stream) => Pin::new(stream).poll_read(cx, buf),
            Io::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            this.tracker.carried(n);
        }
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = written {
            this.tracker.carried(n);
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.on_shutdown();
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Unix(stream) => Pin::new(stream).poll_write(cx, buf),
            Io::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Unix(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Io::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Unix(stream) => stream.is_write_vectored(),
            Io::Plain(stream) => stream.is_write_vectored(),
            Io::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Unix(stream) => Pin::new(stream).poll_flush(cx),
            Io::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Unix(stream) => Pin::new(stream).poll_shutdown(cx),
            Io::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Io::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::Semaphore;

    const CONNECT: Duration = Duration::from_secs(10);
    const IDLE: Duration = Duration::from_secs(60);

    fn connection() -> (Conn, UnixStream) {
        let (server, client) = UnixStream::pair().expect("a socket pair");
        let slot = Arc::new(Semaphore::new(1))
            .try_acquire_owned()
            .expect("one slot");
        let io = Io::Unix(UnixPathHeaderFix::new(server, 16 * 1024));
        (Conn::new(io, slot, Instant::now(), CONNECT, IDLE), client)
    }

    /// Reads from the server side: the error that closed it, or `None` if it still waited after
    /// `within`.
    async fn closed_within(conn: &mut Conn, within: Duration) -> Option<io::ErrorKind> {
        let mut buf = [0u8; 16];
        match tokio::time::timeout(within, conn.read(&mut buf)).await {
            Ok(Err(error)) => Some(error.kind()),
            Ok(Ok(n)) => panic!("read {n} bytes from a silent peer"),
            Err(_) => None,
        }
    }

    /// What a listener's connections say their closes with, counting into `metrics`.
    fn close_log(metrics: &Arc<StreamMetrics>) -> Arc<CloseLog> {
        Arc::new(CloseLog {
            what: "SDS",
            listener: "unix:///test.sock".to_owned(),
            connect_timeout: CONNECT,
            keepalive: KEEPALIVE,
            budget: LogBudget::new(10),
            metrics: metrics.clone(),
        })
    }

    const KEEPALIVE: Keepalive = Keepalive {
        interval: Duration::from_secs(30),
        timeout: Duration::from_secs(10),
    };

    fn keepalive_closes(metrics: &StreamMetrics) -> u64 {
        StreamMetrics::get(&metrics.connections_keepalive_closed)
    }

    /// A connection saying its closes into `metrics`, with a stream open (so that no deadline of its
    /// own closes it), its client, and the stream.
    fn streaming_connection(metrics: &Arc<StreamMetrics>) -> (Conn, UnixStream, StreamGuard) {
        let (conn, client) = connection();
        let conn = conn.logging_closes(close_log(metrics));
        let stream = conn.connect_info().tracker.stream_opened();
        (conn, client, stream)
    }

    #[tokio::test(start_paused = true)]
    async fn a_close_after_longer_silence_than_a_live_peer_keeps_is_the_keepalives() {
        let metrics = Arc::new(StreamMetrics::default());
        let (mut conn, mut client, _stream) = streaming_connection(&metrics);
        client.write_all(b"hello").await.expect("written");
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf).await.expect("read");
        tokio::time::advance(KEEPALIVE.interval + KEEPALIVE.timeout + Duration::from_secs(1)).await;
        conn.shutdown().await.expect("shut down");
        assert_eq!(keepalive_closes(&metrics), 1);
        conn.shutdown().await.expect("shut down again");
        assert_eq!(keepalive_closes(&metrics), 1, "said once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_close_of_a_peer_that_spoke_lately_is_not_the_keepalives() {
        let metrics = Arc::new(StreamMetrics::default());
        let (mut conn, mut client, _stream) = streaming_connection(&metrics);
        // Silent as long as a live peer may be (pinged after the interval, answering just in
        // time), then it speaks.
        tokio::time::advance(KEEPALIVE.interval + KEEPALIVE.timeout).await;
        client.write_all(b"pong").await.expect("written");
        let mut buf = [0u8; 4];
        conn.read_exact(&mut buf).await.expect("read");
        tokio::time::advance(KEEPALIVE.interval).await;
        conn.shutdown().await.expect("shut down");
        assert_eq!(keepalive_closes(&metrics), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_its_deadline_closed_is_not_the_keepalives() {
        let metrics = Arc::new(StreamMetrics::default());
        let (conn, _client) = connection();
        let mut conn = conn.logging_closes(close_log(&metrics));
        // Silent past the connect deadline, and past the keepalive by the time the server shuts the
        // connection down: the deadline said why.
        assert_eq!(
            closed_within(&mut conn, CONNECT * 2).await,
            Some(io::ErrorKind::TimedOut)
        );
        tokio::time::advance(KEEPALIVE.interval + KEEPALIVE.timeout).await;
        conn.shutdown().await.expect("shut down");
        assert_eq!(keepalive_closes(&metrics), 0);
    }

    #[tokio::test]
    async fn a_connection_closed_by_its_deadline_says_why() {
        let (conn, _client) = connection();
        let tracker = &conn.tracker;
        assert_eq!(tracker.closing(), Closing::NoStream);
        drop(tracker.stream_opened());
        assert_eq!(tracker.closing(), Closing::Idle, "a stream was open once");
        tracker.refuse();
        assert_eq!(tracker.closing(), Closing::Refused);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_a_stream_closes_at_the_connect_deadline() {
        let (mut conn, _client) = connection();
        assert_eq!(closed_within(&mut conn, CONNECT / 2).await, None);
        assert_eq!(
            closed_within(&mut conn, CONNECT).await,
            Some(io::ErrorKind::TimedOut)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_stream_keeps_the_connection_and_its_end_starts_the_idle_timeout() {
        let (mut conn, _client) = connection();
        let stream = conn.connect_info().tracker.stream_opened();
        assert_eq!(
            closed_within(&mut conn, CONNECT + IDLE * 3).await,
            None,
            "no deadline while a stream is open"
        );
        let second = conn.connect_info().tracker.stream_opened();
        drop(stream);
        assert_eq!(
            closed_within(&mut conn, IDLE * 2).await,
            None,
            "one stream is still open"
        );
        drop(second);
        assert_eq!(closed_within(&mut conn, IDLE / 2).await, None);
        assert_eq!(
            closed_within(&mut conn, IDLE).await,
            Some(io::ErrorKind::TimedOut),
            "closed once idle for the idle timeout"
        );
    }
}
