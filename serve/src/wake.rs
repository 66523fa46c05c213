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

use std::collections::HashMap;
use std::future::poll_fn;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;

use futures::task::AtomicWaker;
use meshca_auth::RevocationList;
use meshca_control::{KeyHasher, ProxyHashMap, ProxyKey, Snapshot};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::lock_unpoisoned as lock;

/// How many locks the per-proxy table is split over, so that streams opening together rarely wait.
const SHARDS: usize = 16;

/// Where streams wait for the snapshots that concern them.
///
/// Each waiting stream has a bell of its own: a flag and the waker of its task. Ringing it sets the
/// flag and wakes the task; the task looks at the flag when it polls. (Streams used to wait on watch
/// channels, one per proxy and one for everyone: each wait registered with the channel's waiter list
/// under its lock and left it again whenever a request woke the stream first, about a tenth of a
/// stream's time while 100,000 streams ACKed a rotation, and every proxy's channel cost some 400
/// bytes.)
#[derive(Debug, Default)]
pub(crate) struct Wakes {
    /// Set once no snapshot will come any more.
    closed: AtomicBool,
    /// The bells of each proxy's waiting streams.
    proxies: [Mutex<ProxyHashMap<Vec<Arc<Bell>>>>; SHARDS],
    /// The bells of the streams that match callers against the registration table (the Workload
    /// API's), by address: rung when it changes as well.
    registrations: Mutex<HashMap<usize, Arc<Bell>>>,
    /// Picks a proxy's shard.
    shard_by: KeyHasher,
}

/// One stream's wake-up: rung by the dispatcher, heard by the stream's task.
#[derive(Debug, Default)]
struct Bell {
    rung: AtomicBool,
    /// Where it is in its proxy's list, so that a stream leaves the list at once however many
    /// streams the proxy has (100,000 streams of one Workload API registration closing used to
    /// search the list each, seconds of CPU under the shard's lock). Changed only under that lock.
    slot: AtomicU32,
    waker: AtomicWaker,
}

impl Bell {
    fn ring(&self) {
        self.rung.store(true, Ordering::Release);
        self.waker.wake();
    }
}

impl Wakes {
    fn shard(&self, key: &ProxyKey) -> &Mutex<ProxyHashMap<Vec<Arc<Bell>>>> {
        &self.proxies[self.shard_by.hash_one(key) as usize % SHARDS]
    }

    /// A waiter for a stream of `key`: woken by changes to its entry and by changes for everyone, and
    /// with `registrations` by changes of the registration table. Subscribe before reading the
    /// snapshot, so that no publish falls between the two.
    pub(crate) fn subscribe(self: &Arc<Self>, key: &ProxyKey, registrations: bool) -> Waiter {
        let bell = Arc::new(Bell::default());
        {
            let mut shard = lock(self.shard(key));
            let bells = shard.entry(key.clone()).or_default();
            bell.slot.store(slot(bells.len()), Ordering::Relaxed);
            bells.push(bell.clone());
        }
        if registrations {
            lock(&self.registrations).insert(address(&bell), bell.clone());
        }
        Waiter {
            wakes: self.clone(),
            key: key.clone(),
            bell,
            registrations,
        }
    }

    /// Wakes the streams `snapshot` concerns; `last` is the generation the dispatcher saw before it.
    fn wake(&self, snapshot: &Snapshot, last: u64) {
        match snapshot.changed.since(last) {
            Some((keys, registrations)) => {
                for key in keys {
                    if let Some(bells) = lock(self.shard(key)).get(key) {
                        bells.iter().for_each(|bell| bell.ring());
                    }
                }
                if registrations {
                    lock(&self.registrations)
                        .values()
                        .for_each(|bell| bell.ring());
                }
            }
            // Anything may have changed, or too much went by unseen: everyone looks.
            None => {
                tracing::debug!(
                    generation = snapshot.generation,
                    last_seen = last,
                    "waking every stream"
                );
                self.ring_everyone();
            }
        }
    }

    fn ring_everyone(&self) {
        for shard in &self.proxies {
            for bells in lock(shard).values() {
                bells.iter().for_each(|bell| bell.ring());
            }
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.ring_everyone();
    }
}

/// A position in a proxy's list of bells, as a bell keeps it (`u32::MAX` past that).
fn slot(at: usize) -> u32 {
    u32::try_from(at).unwrap_or(u32::MAX)
}

/// Where a bell is: its key in [`Wakes::registrations`].
fn address(bell: &Arc<Bell>) -> usize {
    Arc::as_ptr(bell) as usize
}

/// One stream's wait for a snapshot that concerns it.
#[derive(Debug)]
pub(crate) struct Waiter {
    wakes: Arc<Wakes>,
    key: ProxyKey,
    bell: Arc<Bell>,
    /// Whether it hears changes of the registration table.
    registrations: bool,
}

impl Waiter {
    /// Resolves when a snapshot may concern this stream (its bell rang since the last time this
    /// resolved); false once no snapshot will come any more. Cancel-safe: a ring is taken only by the
    /// poll that resolves.
    pub(crate) async fn changed(&mut self) -> bool {
        let (bell, closed) = (&self.bell, &self.wakes.closed);
        poll_fn(|cx| {
            if !bell.rung.swap(false, Ordering::AcqRel) {
                bell.waker.register(cx.waker());
                // A ring between the look above and the registration would otherwise go unheard.
                if !bell.rung.swap(false, Ordering::AcqRel) && !closed.load(Ordering::Acquire) {
                    return Poll::Pending;
                }
            }
            Poll::Ready(!closed.load(Ordering::Acquire))
        })
        .await
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.registrations {
            lock(&self.wakes.registrations).remove(&address(&self.bell));
        }
        let mut shard = lock(self.wakes.shard(&self.key));
        // The last waiter of the proxy, whichever it is, takes the entry along.
        if let Some(bells) = shard.get_mut(&self.key) {
            let at = self.bell.slot.load(Ordering::Relaxed) as usize;
            if bells
                .get(at)
                .is_some_and(|bell| Arc::ptr_eq(bell, &self.bell))
            {
                bells.swap_remove(at);
                if let Some(moved) = bells.get(at) {
                    moved.slot.store(slot(at), Ordering::Relaxed);
                }
            } else {
                // Past u32::MAX streams of one proxy, slots are not kept: search.
                bells.retain(|bell| !Arc::ptr_eq(bell, &self.bell));
            }
            if bells.is_empty() {
                shard.remove(&self.key);
            }
        }
    }
}

/// Follows `snapshots` from generation `last` on, waking the streams each new one concerns, and wakes
/// every stream when the revocation list changes (each then reads it), until the publisher is gone or
/// `shutdown` fires; then closes every wait.
pub(crate) async fn dispatch(
    wakes: Arc<Wakes>,
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    mut last: u64,
    revocations: watch::Receiver<Arc<RevocationList>>,
    shutdown: CancellationToken,
) {
    // `None` once the revocation publisher is gone: its last list stays in force.
    let mut revocations = Some(revocations);
    loop {
        let revoked = async {
            match revocations.as_mut() {
                Some(rx) => rx.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
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
            alive = revoked => {
                if alive {
                    wakes.ring_everyone();
                } else {
                    revocations = None;
                }
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
        let (mut wa, mut wb) = (wakes.subscribe(&a, false), wakes.subscribe(&b, false));
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
    async fn a_changed_registration_table_wakes_only_the_streams_that_match_callers_against_it() {
        let wakes = Arc::new(Wakes::default());
        let (a, b) = (ProxyKey::new("m", "a"), ProxyKey::new("m", "b"));
        let mut sds = wakes.subscribe(&b, false);
        let mut workload = wakes.subscribe(&b, true);
        let mut agent_served = wakes.subscribe(&a, false);
        let first = next(&Snapshot::empty(), None);
        let mut second = (*next(&first, None)).clone();
        second.changed = Changed::with_registrations(&first, Arc::from(vec![a]));
        wakes.wake(&second, first.generation);
        assert!(woken(&mut workload).await);
        assert!(woken(&mut agent_served).await);
        assert!(!woken(&mut sds).await);
        // Dropped, it is rung no more.
        drop(workload);
        assert!(wakes.registrations.lock().expect("lock").is_empty());
    }

    #[tokio::test]
    async fn the_last_waiter_of_a_proxy_removes_its_entry() {
        let wakes = Arc::new(Wakes::default());
        let a = ProxyKey::new("m", "a");
        let first = wakes.subscribe(&a, false);
        let second = wakes.subscribe(&a, false);
        drop(first);
        assert!(wakes.shard(&a).lock().expect("lock").contains_key(&a));
        drop(second);
        assert!(!wakes.shard(&a).lock().expect("lock").contains_key(&a));
    }

    #[tokio::test]
    async fn waiters_of_one_proxy_leave_in_any_order_and_the_others_still_hear() {
        let wakes = Arc::new(Wakes::default());
        let a = ProxyKey::new("m", "a");
        let mut waiters: Vec<Option<Waiter>> =
            (0..6).map(|_| Some(wakes.subscribe(&a, false))).collect();
        let mut snapshot = next(&Snapshot::empty(), None);
        // Leave from the middle, the front and the back; each time, the rest hear a change of a.
        for leaving in [2, 0, 5, 3] {
            drop(waiters[leaving].take());
            let after = next(&snapshot, Some(vec![a.clone()]));
            wakes.wake(&after, snapshot.generation);
            snapshot = after;
            let left = waiters.iter().flatten().count();
            {
                let shard = wakes.shard(&a).lock().expect("lock");
                assert_eq!(shard[&a].len(), left);
                for (at, bell) in shard[&a].iter().enumerate() {
                    assert_eq!(bell.slot.load(Ordering::Relaxed) as usize, at, "slots kept");
                }
            }
            for waiter in waiters.iter_mut().flatten() {
                assert!(woken(waiter).await, "a waiter still subscribed hears a");
            }
        }
        waiters.clear();
        assert!(!wakes.shard(&a).lock().expect("lock").contains_key(&a));
    }

    fn no_revocations() -> watch::Receiver<Arc<RevocationList>> {
        watch::channel(Arc::new(RevocationList::new())).1
    }

    #[tokio::test]
    async fn waiters_hear_when_the_publisher_is_gone() {
        let wakes = Arc::new(Wakes::default());
        let (tx, rx) = watch::channel(next(&Snapshot::empty(), None));
        let mut waiter = wakes.subscribe(&ProxyKey::new("m", "a"), false);
        let revocations = no_revocations();
        let dispatcher = tokio::spawn(dispatch(
            wakes.clone(),
            rx,
            1,
            revocations,
            CancellationToken::new(),
        ));
        drop(tx);
        dispatcher.await.expect("the dispatcher ends");
        assert!(!waiter.changed().await);
    }

    #[tokio::test]
    async fn waiters_hear_when_the_server_shuts_down() {
        let wakes = Arc::new(Wakes::default());
        let (_tx, rx) = watch::channel(next(&Snapshot::empty(), None));
        let mut waiter = wakes.subscribe(&ProxyKey::new("m", "a"), false);
        let shutdown = CancellationToken::new();
        let dispatcher = tokio::spawn(dispatch(
            wakes.clone(),
            rx,
            1,
            no_revocations(),
            shutdown.clone(),
        ));
        shutdown.cancel();
        assert!(!waiter.changed().await);
        dispatcher.await.expect("the dispatcher ends");
    }

    /// A new revocation list wakes every stream (each reads it); its publisher leaving wakes nobody.
    #[tokio::test]
    async fn a_new_revocation_list_wakes_every_stream() {
        let wakes = Arc::new(Wakes::default());
        let first = next(&Snapshot::empty(), None);
        let (tx, rx) = watch::channel(first.clone());
        let (mut a, mut b) = (
            wakes.subscribe(&ProxyKey::new("m", "a"), false),
            wakes.subscribe(&ProxyKey::new("n", "b"), false),
        );
        let (revoke, revocations) = watch::channel(Arc::new(RevocationList::new()));
        tokio::spawn(dispatch(
            wakes.clone(),
            rx,
            first.generation,
            revocations,
            CancellationToken::new(),
        ));
        revoke.send_replace(Arc::new(RevocationList::new()));
        assert!(a.changed().await);
        assert!(b.changed().await);
        drop(revoke);
        // The dispatcher goes on without revocations: a snapshot for a still wakes it alone.
        tx.send_replace(next(&first, Some(vec![ProxyKey::new("m", "a")])));
        assert!(a.changed().await);
        assert!(!woken(&mut b).await);
    }

    /// A ring heard by no wait is kept for the next one, even when a wait was dropped unfinished in
    /// between; rings before a wait count once.
    #[tokio::test]
    async fn a_ring_is_kept_until_a_wait_hears_it() {
        let wakes = Arc::new(Wakes::default());
        let a = ProxyKey::new("m", "a");
        let mut waiter = wakes.subscribe(&a, false);
        assert!(!woken(&mut waiter).await);
        let first = next(&Snapshot::empty(), None);
        let second = next(&first, Some(vec![a.clone()]));
        let third = next(&second, Some(vec![a.clone()]));
        wakes.wake(&second, first.generation);
        wakes.wake(&third, second.generation);
        assert!(woken(&mut waiter).await);
        assert!(!woken(&mut waiter).await);
        // A wait that registered, then was dropped (a request came first), loses nothing.
        drop(tokio::time::timeout(std::time::Duration::ZERO, waiter.changed()).await);
        let fourth = next(&third, Some(vec![a]));
        wakes.wake(&fourth, third.generation);
        assert!(woken(&mut waiter).await);
    }

    /// A task waiting on its bell is woken by a ring from another task.
    #[tokio::test]
    async fn a_waiting_task_is_woken_by_its_ring() {
        let wakes = Arc::new(Wakes::default());
        let (a, b) = (ProxyKey::new("m", "a"), ProxyKey::new("m", "b"));
        let mut waiter = wakes.subscribe(&a, false);
        let _other = wakes.subscribe(&b, false);
        let waiting = tokio::spawn(async move { waiter.changed().await });
        tokio::task::yield_now().await;
        let first = next(&Snapshot::empty(), None);
        let second = next(&first, Some(vec![a]));
        wakes.wake(&second, first.generation);
        let heard = tokio::time::timeout(std::time::Duration::from_secs(30), waiting)
            .await
            .expect("the ring wakes the waiting task");
        assert!(heard.expect("the waiting task ends"));
    }

    /// Once closed, every wait ends with false, also one that starts later.
    #[tokio::test]
    async fn closing_ends_every_wait() {
        let wakes = Arc::new(Wakes::default());
        let mut before = wakes.subscribe(&ProxyKey::new("m", "a"), false);
        wakes.close();
        assert!(!before.changed().await);
        let mut after = wakes.subscribe(&ProxyKey::new("m", "b"), false);
        assert!(!after.changed().await);
    }
}
