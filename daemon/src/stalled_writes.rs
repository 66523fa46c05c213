//! A connection whose peer stops reading is closed.
//!
//! An HTTP/1 server writes a response until the socket takes no more; a client that sends requests
//! (pipelined, or for a large response) and never reads what comes back leaves the server waiting
//! in that write for ever, holding one of the listener's few connection slots. hyper has no write
//! timeout, so this wrapper gives one: a write that has not made progress for the limit fails the
//! connection with `TimedOut`. A peer that reads slowly but reads is never cut off, since every
//! accepted byte restarts the clock.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `inner`, whose writes fail once they have waited `limit` without the peer taking a byte.
#[derive(Debug)]
pub struct StalledWrites<S> {
    inner: S,
    limit: Duration,
    /// Armed while a write or flush waits for the peer.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> StalledWrites<S> {
    pub fn new(inner: S, limit: Duration) -> Self {
        StalledWrites {
            inner,
            limit,
            stalled: None,
        }
    }

    /// What a write that returned `poll` means: progress disarms the clock, waiting arms it (once),
    /// and waiting past the limit is an error.
    fn check<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.stalled = None;
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the peer took no byte of the response for {limit:?}"),
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for StalledWrites<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StalledWrites<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.check(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.check(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_flush(cx);
        this.check(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.check(cx, poll)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::time::Instant;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_stops_reading_fails_the_write_after_the_limit() {
        let (server, mut client) = tokio::io::duplex(1024);
        let mut server = StalledWrites::new(server, Duration::from_secs(10));
        server.write_all(&[1; 1024]).await.expect("fits the pipe");
        let started = Instant::now();
        let error = server
            .write_all(&[2; 1024])
            .await
            .expect_err("nobody reads");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        let mut got = vec![0; 1024];
        client
            .read_exact(&mut got)
            .await
            .expect("what fit is there");
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_reads_slowly_is_served_whole() {
        let (server, mut client) = tokio::io::duplex(64);
        let mut server = StalledWrites::new(server, Duration::from_secs(10));
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut chunk = [0u8; 64];
            loop {
                // Each read comes 9 seconds after the last: within the limit, every time.
                tokio::time::sleep(Duration::from_secs(9)).await;
                match client.read(&mut chunk).await.expect("reads") {
                    0 => return got,
                    n => got.extend_from_slice(&chunk[..n]),
                }
            }
        });
        server
            .write_all(&[7; 640])
            .await
            .expect("the peer reads it all");
        server.shutdown().await.expect("shut down");
        drop(server);
        assert_eq!(reader.await.expect("the reader ends"), vec![7; 640]);
    }
}
