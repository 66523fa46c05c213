//! A response stream written as one async function.
//!
//! The function hands each response to an [`Outbox`], which parks it in a one-item slot and waits until
//! the stream has given it to the HTTP/2 encoder. The encoder polls the stream, and through it the
//! function, itself: an SDS stream needs no task of its own and no channel of responses, so an idle
//! stream costs the function's state and nothing else. When the proxy goes away, the encoder drops the
//! stream, and with it the function, at once.
//!
//! Back-pressure is the encoder's: while the proxy does not read, the stream is not polled, and the
//! function does not run.
//!
//! It is all shell: it moves values between a future and a `Stream`, and handles no bytes, so there
//! is no sans-IO core to take out of it.
//!
//! What would let it go: async generators in the language (an `async gen` block is a `Stream` whose
//! state is the function's), or a tonic server API that takes a response writer instead of a
//! `Stream`; no upstream issue is tracked for it here.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use futures::Stream;

/// The item in a box: the slot lives as long as the stream, and a response (about 200 bytes inline)
/// would otherwise keep its room there while the stream is idle.
type Slot<T> = Arc<Mutex<Option<Box<T>>>>;

/// Where the function puts what the stream yields next.
pub(crate) struct Outbox<T> {
    slot: Slot<T>,
}

impl<T> Outbox<T> {
    /// Yields `item` from the stream; resolves once the stream has handed it on. (If the stream is
    /// dropped first, so is the function waiting here.)
    pub(crate) async fn send(&self, item: T) {
        *lock(&self.slot) = Some(Box::new(item));
        // No waker to register: the stream yields the item from the same poll, and its consumer polls
        // again when it wants the next one, which finds the slot empty.
        poll_fn(|_| {
            if lock(&self.slot).is_some() {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
    }
}

/// The stream of what `run` sends to its [`Outbox`], ending when `run` returns.
pub(crate) struct OutboxStream<T> {
    slot: Slot<T>,
    /// `None` once `run` has returned.
    run: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl<T> OutboxStream<T> {
    pub(crate) fn new<F>(run: impl FnOnce(Outbox<T>) -> F) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let slot: Slot<T> = Arc::new(Mutex::new(None));
        let outbox = Outbox { slot: slot.clone() };
        Self {
            slot,
            run: Some(Box::pin(run(outbox))),
        }
    }
}

impl<T> Stream for OutboxStream<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let this = self.get_mut();
        let Some(run) = this.run.as_mut() else {
            return Poll::Ready(None);
        };
        let finished = run.as_mut().poll(cx).is_ready();
        if finished {
            this.run = None;
        }
        match lock(&this.slot).take() {
            Some(item) => Poll::Ready(Some(*item)),
            None if finished => Poll::Ready(None),
            None => Poll::Pending,
        }
    }
}

/// The slot holds no invariant a panic could break: a poisoned lock is used as it is.
fn lock<T>(slot: &Mutex<Option<Box<T>>>) -> MutexGuard<'_, Option<Box<T>>> {
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use futures::StreamExt;
    use tokio::sync::oneshot;

    use super::*;

    #[tokio::test]
    async fn yields_what_the_function_sends_in_order_and_ends_when_it_returns() {
        let stream = OutboxStream::new(|outbox| async move {
            for n in 0..3 {
                outbox.send(n).await;
            }
        });
        assert_eq!(stream.collect::<Vec<_>>().await, vec![0, 1, 2]);
    }

    #[tokio::test]
    async fn the_function_runs_on_only_as_far_as_the_consumer_reads() {
        let reached_second = Arc::new(AtomicBool::new(false));
        let reached = reached_second.clone();
        let mut stream = OutboxStream::new(move |outbox| async move {
            outbox.send("first").await;
            reached.store(true, Ordering::SeqCst);
            outbox.send("second").await;
        });
        assert_eq!(stream.next().await, Some("first"));
        // Nobody asked for more yet: the function still waits inside its first send.
        assert!(!reached_second.load(Ordering::SeqCst));
        assert_eq!(stream.next().await, Some("second"));
        assert!(reached_second.load(Ordering::SeqCst));
        assert_eq!(stream.next().await, None);
        assert_eq!(
            stream.next().await,
            None,
            "a finished stream stays finished"
        );
    }

    #[tokio::test]
    async fn the_function_waits_for_its_own_events_between_items() {
        let (tx, rx) = oneshot::channel::<u32>();
        let mut stream = OutboxStream::new(|outbox| async move {
            outbox.send(1).await;
            let later = rx.await.expect("the test sends");
            outbox.send(later).await;
        });
        assert_eq!(stream.next().await, Some(1));
        let waiting = tokio::spawn(async move { stream.next().await });
        tx.send(7).expect("the stream waits");
        assert_eq!(waiting.await.expect("no panic"), Some(7));
    }

    #[tokio::test]
    async fn dropping_the_stream_drops_the_function() {
        let (dropped_tx, dropped_rx) = oneshot::channel::<()>();
        struct Guard(Option<oneshot::Sender<()>>);
        impl Drop for Guard {
            fn drop(&mut self) {
                let _ = self.0.take().map(|tx| tx.send(()));
            }
        }
        let mut stream = OutboxStream::new(move |outbox| async move {
            let _guard = Guard(Some(dropped_tx));
            outbox.send(()).await;
            std::future::pending::<()>().await;
        });
        assert_eq!(stream.next().await, Some(()));
        drop(stream);
        dropped_rx
            .await
            .expect("the function's state is dropped with the stream");
    }
}
