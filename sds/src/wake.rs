//! Waking only the streams a new snapshot concerns.
//!
//! Every stream used to wait on the snapshot channel itself, so each publish woke every stream of the
//! fleet, and the owner paid for the wake-ups inside its publish: milliseconds at 10,000 streams for one
//! proxy's new certificate. Now one dispatcher task waits on the snapshot channel and reads what the
//! owner says changed ([`meshca_control::Changed`]): when only some proxies' entries changed, it wakes
//! only their streams; when anything else may have changed (a bundle, a context), it wakes everyone.
//! The channel keeps only the newest snapshot, and the dispatcher, a task like any other, can fall a
//! few publishes behind while a wave keeps the runtime busy: the newest snapshot remembers what the
//! ones before it changed, so the dispatcher still wakes only their proxies' streams. (It used to wake
//! everyone after any missed generation; at 100,000 streams each such wake cost about a CPU-second in
//! the middle of an identity wave.) Streams still read the snapshot itself from the channel.

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use meshca_control::{KeyHasher, ProxyHashMap, ProxyKey, Snapshot};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How many locks the per-proxy table is split over, so that streams opening together rarely wait.
const SHARDS: usize = 16;

/// The value of the everyone channel once the snapshot publisher is gone.
const CLOSED: u64 = u64::MAX;

/// Where streams wait for the snapshots that concern them.
#[derive(Debug)]
pub(crate) struct Wakes {
    /// Bumped when a change may concern every stream.
    everyone: watch::Sender<u64>,
    /// Per proxy with a waiting stream: bumped when its entry or claim rule changed.
    proxies: [Mutex<ProxyHashMap<watch::Sender<u64>>>; SHARDS],
    /// Picks a proxy's shard.
    shard_by: KeyHasher,
}

impl Default for Wakes {
    fn default() -> Self {
        Wakes {
            everyone: watch::Sender::new(0),
            proxies: std::array::from_fn(|_| Mutex::new(ProxyHashMap::default())),
            shard_by: KeyHasher::default(),
        }
    }
}

impl Wakes {
    fn shard(&self, key: &ProxyKey) -> &Mutex<ProxyHashMap<watch::Sender<u64>>> {
        &self.proxies[self.shard_by.hash_one(key) as usize % SHARDS]
    }

    /// A waiter for the streams of `key`: woken by changes to its entry and by changes for everyone.
    /// Subscribe before reading the snapshot, so that no publish falls between the two.
    pub(crate) fn subscribe(self: &Arc<Self>, key: &ProxyKey) -> Waiter {
        let mut everyone = self.everyone.subscribe();
        everyone.mark_unchanged();
        let mine = {
            let mut shard = self.shard(key).lock().unwrap_or_else(|e| e.into_inner());
            shard
                .entry(key.clone())
                .or_insert_with(|| watch::Sender::new(0))
                .subscribe()
        };
        Waiter {
            wakes: self.clone(),
            key: key.clone(),
            everyone,
            mine: Some(mine),
        }
    }

    /// Wakes the streams `snapshot` concerns; `last` is the generation the dispatcher saw before it.
    fn wake(&self, snapshot: &Snapshot, last: u64) {
        match snapshot.changed.proxies_since(last) {
            Some(keys) => {
                for key in keys {
                    let shard = self.shard(key).lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(tx) = shard.get(key) {
                        tx.send_replace(snapshot.generation);
                    }
                }
            }
            // Anything may have changed, or too much went by unseen: everyone looks.
            None => {
                tracing::debug!(
                    generation = snapshot.generation,
                    last_seen = last,
                    "waking every stream"
                );
                self.everyone.send_replace(snapshot.generation);
            }
        }
    }

    fn close(&self) {
        self.everyone.send_replace(CLOSED);
    }
}

/// One stream's wait for a snapshot that concerns it.
#[derive(Debug)]
pub(crate) struct Waiter {
    wakes: Arc<Wakes>,
    key: ProxyKey,
    everyone: watch::Receiver<u64>,
    /// `None` only while it drops.
    mine: Option<watch::Receiver<u64>>,
}

impl Waiter {
    /// Resolves when a snapshot may concern this stream; false once no snapshot will come any more.
    /// Cancel-safe.
    pub(crate) async fn changed(&mut self) -> bool {
        tokio::select! {
            changed = self.everyone.changed() => {
                changed.is_ok() && *self.everyone.borrow_and_update() != CLOSED
            }
            changed = changed_or_pending(self.mine.as_mut()) => changed,
        }
    }
}

/// Whether `rx`'s sender is still there once it changed; never resolves without a receiver.
async fn changed_or_pending(rx: Option<&mut watch::Receiver<u64>>) -> bool {
    match rx {
        Some(rx) => {
            let changed = rx.changed().await.is_ok();
            rx.borrow_and_update();
            changed
        }
        None => std::future::pending().await,
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut shard = self
            .wakes
            .shard(&self.key)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // This waiter's receiver goes first, under the lock: the last waiter of the proxy, whichever it
        // is, then sees no receiver left and takes the entry along.
        drop(self.mine.take());
        if shard
            .get(&self.key)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            shard.remove(&self.key);
        }
    }
}

/// Follows `snapshots` from generation `last` on, waking the streams each new one concerns, until the
/// publisher is gone or `shutdown` fires.
pub(crate) async fn dispatch(
    wakes: Arc<Wakes>,
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    mut last: u64,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            changed = snapshots.changed() => {
                if changed.is_err() {
                    break;
                }
                let snapshot = snapshots.borrow_and_update().clone();
                wakes.wake(&snapshot, last);
                last = snapshot.generation;
            }
        }
    }
    wakes.close();
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshca_control::Changed;

    /// The snapshot published after `previous`, changing only `proxies` (`None`: anything).
    fn next(previous: &Snapshot, proxies: Option<Vec<ProxyKey>>) -> Arc<Snapshot> {
        let mut s = previous.clone();
        s.changed = Changed::after(previous, proxies.map(Into::into));
        s.generation = previous.generation + 1;
        Arc::new(s)
    }

    /// Whether `waiter` has been woken (without waiting for it).
    async fn woken(waiter: &mut Waiter) -> bool {
        tokio::time::timeout(std::time::Duration::ZERO, waiter.changed())
            .await
            .unwrap_or(false)
    }

    #[tokio::test]
    async fn a_change_to_some_proxies_wakes_only_their_streams() {
        let wakes = Arc::new(Wakes::default());
        let (a, b) = (ProxyKey::new("m", "a"), ProxyKey::new("m", "b"));
        let (mut wa, mut wb) = (wakes.subscribe(&a), wakes.subscribe(&b));
        let first = next(&Snapshot::empty(), None);
        let second = next(&first, Some(vec![a.clone()]));
        wakes.wake(&second, first.generation);
        assert!(woken(&mut wa).await);
        assert!(!woken(&mut wb).await);
        // Anything else wakes everyone.
        let third = next(&second, None);
        wakes.wake(&third, second.generation);
        assert!(woken(&mut wa).await && woken(&mut wb).await);
        // Snapshots the dispatcher did not see are told by the newest one: a's streams wake, b's do not.
        let fourth = next(&third, Some(vec![a.clone()]));
        let fifth = next(&fourth, Some(vec![a.clone()]));
        wakes.wake(&fifth, third.generation);
        assert!(woken(&mut wa).await);
        assert!(!woken(&mut wb).await);
        // Unless one of them may have changed anything.
        let sixth = next(&fifth, None);
        let seventh = next(&sixth, Some(vec![a]));
        wakes.wake(&seventh, fifth.generation);
        assert!(woken(&mut wa).await && woken(&mut wb).await);
    }

    #[tokio::test]
    async fn the_last_waiter_of_a_proxy_removes_its_entry() {
        let wakes = Arc::new(Wakes::default());
        let a = ProxyKey::new("m", "a");
        let first = wakes.subscribe(&a);
        let second = wakes.subscribe(&a);
        drop(first);
        assert!(wakes.shard(&a).lock().expect("lock").contains_key(&a));
        drop(second);
        assert!(!wakes.shard(&a).lock().expect("lock").contains_key(&a));
    }

    #[tokio::test]
    async fn waiters_hear_when_the_publisher_is_gone() {
        let wakes = Arc::new(Wakes::default());
        let (tx, rx) = watch::channel(next(&Snapshot::empty(), None));
        let mut waiter = wakes.subscribe(&ProxyKey::new("m", "a"));
        let dispatcher = tokio::spawn(dispatch(wakes.clone(), rx, 1, CancellationToken::new()));
        drop(tx);
        dispatcher.await.expect("the dispatcher ends");
        assert!(!waiter.changed().await);
    }
}
