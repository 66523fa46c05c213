//! One accepted connection, whatever the listener: the IO type given to tonic.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::server::TlsStream;
use tonic::transport::server::Connected;

use crate::h2_header_fixup::UnixPathHeaderFix;

/// An accepted connection.
pub(crate) enum Conn {
    /// Unix socket clients may be grpc-core ones: see [`crate::h2_header_fixup`].
    Unix(UnixPathHeaderFix<UnixStream>),
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// What a request can learn about its connection (a request extension).
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// The peer's address; `None` on a unix socket.
    pub remote_addr: Option<SocketAddr>,
    /// Whether the connection is TLS.
    pub tls: bool,
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        match self {
            Conn::Unix(_) => ConnInfo {
                remote_addr: None,
                tls: false,
            },
            Conn::Plain(stream) => ConnInfo {
                remote_addr: stream.peer_addr().ok(),
                tls: false,
            },
            Conn::Tls(stream) => ConnInfo {
                remote_addr: stream.get_ref().0.peer_addr().ok(),
                tls: true,
            },
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(stream) => Pin::new(stream).poll_read(cx, buf),
            Conn::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Conn::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Unix(stream) => Pin::new(stream).poll_write(cx, buf),
            Conn::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Conn::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Unix(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Conn::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Conn::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Unix(stream) => stream.is_write_vectored(),
            Conn::Plain(stream) => stream.is_write_vectored(),
            Conn::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(stream) => Pin::new(stream).poll_flush(cx),
            Conn::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Conn::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(stream) => Pin::new(stream).poll_shutdown(cx),
            Conn::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Conn::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}
