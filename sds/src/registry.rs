//! The list of open streams, for the admin API, and how many each proxy has open.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use tokio::time::Instant;

use meshca_control::{ProxyKey, StreamId};

use crate::log_budget::LogBudget;

/// Which SDS protocol a stream speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    /// `StreamSecrets`, state of the world.
    Sotw,
    /// `DeltaSecrets`, incremental.
    Delta,
}

/// One open stream, as the admin API shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StreamInfo {
    /// The stream.
    pub id: StreamId,
    /// The proxy at the other end.
    pub proxy: ProxyKey,
    /// The protocol.
    pub kind: StreamKind,
    /// When the proxy connected.
    pub connected_at: SystemTime,
    /// The resource names it subscribes to.
    pub resources: Vec<String>,
    /// The version of the last response sent (empty before the first).
    pub last_sent_version: String,
    /// The version of the last response it ACKed.
    pub last_acked_version: Option<String>,
    /// The snapshot generation of the last ACKed content.
    pub acked_generation: Option<u64>,
    /// How many responses it rejected.
    pub nacks: u64,
    /// Its last rejection message.
    pub last_nack: Option<String>,
}

/// Open streams, shared between the server and the admin API. Cheap to clone; the lock
/// is held only to copy or update one entry, never across an await.
#[derive(Clone, Debug, Default)]
pub struct StreamRegistry {
    inner: Arc<Mutex<Streams>>,
}

#[derive(Debug, Default)]
struct Streams {
    by_id: HashMap<StreamId, StreamInfo>,
    by_proxy: HashMap<ProxyKey, ProxyStreams>,
    /// Proxies whose last stream closed while their warning budget was in use, with when the
    /// budget's window ends: they keep their entry (and budget) until then, so reconnecting does
    /// not buy a proxy a fresh budget.
    lingering: VecDeque<(Instant, ProxyKey)>,
}

/// The open streams of one proxy; gone when its last stream closes.
#[derive(Debug)]
struct ProxyStreams {
    open: usize,
    /// Resource names subscribed to, over all its streams.
    names: usize,
    warnings: Arc<LogBudget>,
}

/// Why a stream was not registered: its proxy has this many open already.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TooManyStreams(pub(crate) usize);

impl StreamRegistry {
    /// Every open stream, ordered by id.
    pub fn list(&self) -> Vec<StreamInfo> {
        let mut all: Vec<StreamInfo> = self.lock().by_id.values().cloned().collect();
        all.sort_by_key(|info| info.id);
        all
    }

    /// The number of open streams.
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    /// The number of proxies with a stream open.
    pub fn connected_proxies(&self) -> usize {
        self.lock().by_proxy.values().filter(|p| p.open > 0).count()
    }

    /// True when no stream is open.
    pub fn is_empty(&self) -> bool {
        self.lock().by_id.is_empty()
    }

    /// Registers a stream unless its proxy has `max_per_proxy` open already. Returns the proxy's
    /// warning budget (`warnings_per_minute`), shared by all its streams.
    pub(crate) fn insert(
        &self,
        info: StreamInfo,
        max_per_proxy: usize,
        warnings_per_minute: u32,
    ) -> Result<Arc<LogBudget>, TooManyStreams> {
        let mut streams = self.lock();
        streams.forget_lingering();
        let proxy = streams
            .by_proxy
            .entry(info.proxy.clone())
            .or_insert_with(|| ProxyStreams {
                open: 0,
                names: 0,
                warnings: Arc::new(LogBudget::new(warnings_per_minute)),
            });
        if proxy.open >= max_per_proxy {
            return Err(TooManyStreams(proxy.open));
        }
        proxy.open += 1;
        let warnings = proxy.warnings.clone();
        streams.by_id.insert(info.id, info);
        Ok(warnings)
    }

    /// Records a stream's new subscription, unless its proxy would then subscribe to more than
    /// `max_per_proxy` names over all its streams; then the error says how many it would have.
    pub(crate) fn subscribe(
        &self,
        id: StreamId,
        resources: Vec<String>,
        max_per_proxy: usize,
    ) -> Result<(), usize> {
        let mut streams = self.lock();
        let Streams {
            by_id, by_proxy, ..
        } = &mut *streams;
        let Some(info) = by_id.get_mut(&id) else {
            return Ok(());
        };
        let Some(proxy) = by_proxy.get_mut(&info.proxy) else {
            return Ok(());
        };
        let total = proxy.names - info.resources.len() + resources.len();
        if total > max_per_proxy {
            return Err(total);
        }
        proxy.names = total;
        info.resources = resources;
        Ok(())
    }

    pub(crate) fn update(&self, id: StreamId, change: impl FnOnce(&mut StreamInfo)) {
        if let Some(info) = self.lock().by_id.get_mut(&id) {
            change(info);
        }
    }

    pub(crate) fn remove(&self, id: StreamId) {
        let mut streams = self.lock();
        streams.forget_lingering();
        let Some(info) = streams.by_id.remove(&id) else {
            return;
        };
        if let Some(proxy) = streams.by_proxy.get_mut(&info.proxy) {
            proxy.open -= 1;
            proxy.names -= info.resources.len();
            if proxy.open == 0 {
                match proxy.warnings.window_end() {
                    Some(end) => streams.lingering.push_back((end, info.proxy)),
                    None => {
                        streams.by_proxy.remove(&info.proxy);
                    }
                }
            }
        }
    }

    #[cfg(test)]
    fn proxies(&self) -> usize {
        self.lock().by_proxy.len()
    }

    fn lock(&self) -> MutexGuard<'_, Streams> {
        // A panic while holding this lock cannot leave an entry half-updated in a way
        // that matters to readers: keep serving the data.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Streams {
    /// Drops the entries of proxies without streams whose warning window has ended.
    fn forget_lingering(&mut self) {
        let now = Instant::now();
        while let Some((end, _)) = self.lingering.front() {
            if *end > now {
                break;
            }
            let Some((_, proxy)) = self.lingering.pop_front() else {
                break;
            };
            if self.by_proxy.get(&proxy).is_some_and(|p| p.open == 0) {
                self.by_proxy.remove(&proxy);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: u64, proxy: &ProxyKey) -> StreamInfo {
        StreamInfo {
            id: StreamId(id),
            proxy: proxy.clone(),
            kind: StreamKind::Sotw,
            connected_at: SystemTime::UNIX_EPOCH,
            resources: Vec::new(),
            last_sent_version: String::new(),
            last_acked_version: None,
            acked_generation: None,
            nacks: 0,
            last_nack: None,
        }
    }

    #[test]
    fn streams_per_proxy_are_capped_and_freed_on_close() {
        let registry = StreamRegistry::default();
        let (web, db) = (ProxyKey::new("m", "web"), ProxyKey::new("m", "db"));
        let first = registry.insert(info(1, &web), 2, 5).expect("room");
        let second = registry.insert(info(2, &web), 2, 5).expect("room");
        assert!(Arc::ptr_eq(&first, &second), "one budget per proxy");
        assert_eq!(
            registry.insert(info(3, &web), 2, 5).err(),
            Some(TooManyStreams(2))
        );
        registry
            .insert(info(4, &db), 2, 5)
            .expect("another proxy has its own count");
        registry.remove(StreamId(1));
        registry
            .insert(info(5, &web), 2, 5)
            .expect("a closed stream frees its slot");
        for id in [2, 4, 5] {
            registry.remove(StreamId(id));
        }
        let streams = registry.lock();
        assert!(
            streams.by_id.is_empty() && streams.by_proxy.is_empty(),
            "nothing kept"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_proxy_that_warned_keeps_its_budget_across_reconnects_for_the_window() {
        let registry = StreamRegistry::default();
        let web = ProxyKey::new("m", "web");
        let budget = registry.insert(info(1, &web), 8, 1).expect("room");
        assert_eq!(budget.admit(), Some(0));
        registry.remove(StreamId(1));
        let again = registry.insert(info(2, &web), 8, 1).expect("room");
        assert!(Arc::ptr_eq(&budget, &again), "the spent budget is kept");
        assert_eq!(again.admit(), None);
        registry.remove(StreamId(2));
        tokio::time::advance(std::time::Duration::from_secs(61)).await;
        registry
            .insert(info(3, &ProxyKey::new("m", "db")), 8, 1)
            .expect("room");
        assert_eq!(registry.proxies(), 1, "forgotten once its window ended");
    }

    #[test]
    fn names_per_proxy_add_up_over_its_streams() {
        let registry = StreamRegistry::default();
        let web = ProxyKey::new("m", "web");
        registry.insert(info(1, &web), 8, 5).expect("room");
        registry.insert(info(2, &web), 8, 5).expect("room");
        let names = |n: usize| (0..n).map(|i| format!("n{i}")).collect::<Vec<_>>();
        registry
            .subscribe(StreamId(1), names(3), 5)
            .expect("3 of 5");
        assert_eq!(registry.subscribe(StreamId(2), names(3), 5), Err(6));
        registry
            .subscribe(StreamId(2), names(2), 5)
            .expect("5 of 5");
        registry
            .subscribe(StreamId(1), names(1), 5)
            .expect("a smaller subscription");
        registry
            .subscribe(StreamId(2), names(4), 5)
            .expect("room freed by stream 1");
        registry.remove(StreamId(2));
        registry
            .subscribe(StreamId(1), names(5), 5)
            .expect("room freed by a closed stream");
    }
}
