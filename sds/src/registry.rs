//! The list of open streams, for the admin API, and how many each proxy has open.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use tokio::time::Instant;

use meshca_control::{ProxyHashMap, ProxyKey, StreamId};

use meshca_serve::LogBudget;

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

/// A stream about to be registered.
#[derive(Debug)]
pub(crate) struct NewStream {
    pub id: StreamId,
    pub proxy: ProxyKey,
    pub kind: StreamKind,
    pub connected_at: SystemTime,
}

/// What a stream's responses and its proxy's replies leave behind. Each stream updates its own under a
/// lock of its own: a push to every stream updates them all at once, and a lock over the whole
/// registry would make the streams wait for each other.
#[derive(Clone, Debug, Default)]
pub(crate) struct Progress {
    pub last_sent_version: String,
    pub last_acked_version: Option<String>,
    pub acked_generation: Option<u64>,
    pub nacks: u64,
    pub last_nack: Option<String>,
}

/// A stream's progress, shared by the stream and the registry.
pub(crate) type SharedProgress = Arc<Mutex<Progress>>;

/// Open streams, shared between the server and the admin API. Cheap to clone; the lock
/// is held only to copy or update one entry, never across an await.
#[derive(Clone, Debug, Default)]
pub struct StreamRegistry {
    inner: Arc<Mutex<StreamSlots>>,
}

/// One open stream in the registry.
#[derive(Debug)]
struct Entry {
    opened: NewStream,
    resources: Vec<String>,
    progress: SharedProgress,
}

impl Entry {
    fn info(&self) -> StreamInfo {
        let NewStream {
            id,
            proxy,
            kind,
            connected_at,
        } = &self.opened;
        let progress = lock(&self.progress).clone();
        StreamInfo {
            id: *id,
            proxy: proxy.clone(),
            kind: *kind,
            connected_at: *connected_at,
            resources: self.resources.clone(),
            last_sent_version: progress.last_sent_version,
            last_acked_version: progress.last_acked_version,
            acked_generation: progress.acked_generation,
            nacks: progress.nacks,
            last_nack: progress.last_nack,
        }
    }
}

/// Locks `mutex`. A panic while holding one of the registry's locks (or the wake table's) cannot
/// leave an entry half-updated in a way that matters to readers: keep serving the data.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Every open stream, by id and by proxy: the slots the per-proxy limits count.
#[derive(Debug, Default)]
struct StreamSlots {
    /// Boxed: a slot holds a pointer, not the 96-byte entry (a table keeps a third of its slots free).
    by_id: HashMap<StreamId, Box<Entry>>,
    by_proxy: ProxyHashMap<ProxyStreams>,
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
        let mut all: Vec<StreamInfo> = self.lock().by_id.values().map(|e| e.info()).collect();
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
    /// warning budget (`warnings_per_minute`), shared by all its streams, and the stream's progress,
    /// which the stream updates.
    pub(crate) fn insert(
        &self,
        opened: NewStream,
        max_per_proxy: usize,
        warnings_per_minute: u32,
    ) -> Result<(Arc<LogBudget>, SharedProgress), TooManyStreams> {
        let mut streams = self.lock();
        streams.forget_lingering();
        let proxy = streams
            .by_proxy
            .entry(opened.proxy.clone())
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
        let progress = SharedProgress::default();
        let entry = Entry {
            opened,
            resources: Vec::new(),
            progress: progress.clone(),
        };
        streams.by_id.insert(entry.opened.id, Box::new(entry));
        Ok((warnings, progress))
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
        let StreamSlots {
            by_id, by_proxy, ..
        } = &mut *streams;
        let Some(info) = by_id.get_mut(&id) else {
            return Ok(());
        };
        let Some(proxy) = by_proxy.get_mut(&info.opened.proxy) else {
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

    pub(crate) fn remove(&self, id: StreamId) {
        let mut streams = self.lock();
        streams.forget_lingering();
        let Some(info) = streams.by_id.remove(&id) else {
            return;
        };
        let key = info.opened.proxy;
        if let Some(proxy) = streams.by_proxy.get_mut(&key) {
            proxy.open -= 1;
            proxy.names -= info.resources.len();
            if proxy.open == 0 {
                match proxy.warnings.window_end() {
                    Some(end) => streams.lingering.push_back((end, key)),
                    None => {
                        streams.by_proxy.remove(&key);
                    }
                }
            }
        }
    }

    #[cfg(test)]
    fn proxies(&self) -> usize {
        self.lock().by_proxy.len()
    }

    fn lock(&self) -> MutexGuard<'_, StreamSlots> {
        lock(&self.inner)
    }
}

impl StreamSlots {
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

    fn info(id: u64, proxy: &ProxyKey) -> NewStream {
        NewStream {
            id: StreamId(id),
            proxy: proxy.clone(),
            kind: StreamKind::Sotw,
            connected_at: SystemTime::UNIX_EPOCH,
        }
    }

    /// The registry lists what each stream recorded of its progress, under its own lock.
    #[test]
    fn the_list_shows_what_each_stream_recorded() {
        let registry = StreamRegistry::default();
        let web = ProxyKey::new("m", "web");
        let (_, progress) = registry.insert(info(1, &web), 2, 5).expect("room");
        registry.insert(info(2, &web), 2, 5).expect("room");
        registry
            .subscribe(StreamId(1), vec!["default".into()], 8)
            .expect("room");
        {
            let mut progress = lock(&progress);
            progress.last_sent_version = "v2".into();
            progress.last_acked_version = Some("v1".into());
            progress.acked_generation = Some(7);
        }
        let listed = registry.list();
        assert_eq!(listed.len(), 2);
        let first = &listed[0];
        assert_eq!(first.id, StreamId(1));
        assert_eq!(first.resources, ["default"]);
        assert_eq!(first.last_sent_version, "v2");
        assert_eq!(first.last_acked_version.as_deref(), Some("v1"));
        assert_eq!(first.acked_generation, Some(7));
        assert_eq!(
            listed[1].last_sent_version, "",
            "the other stream sent nothing"
        );
    }

    #[test]
    fn streams_per_proxy_are_capped_and_freed_on_close() {
        let registry = StreamRegistry::default();
        let (web, db) = (ProxyKey::new("m", "web"), ProxyKey::new("m", "db"));
        let (first, _) = registry.insert(info(1, &web), 2, 5).expect("room");
        let (second, _) = registry.insert(info(2, &web), 2, 5).expect("room");
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
        let (budget, _) = registry.insert(info(1, &web), 8, 1).expect("room");
        assert_eq!(budget.admit(), Some(0));
        registry.remove(StreamId(1));
        let (again, _) = registry.insert(info(2, &web), 8, 1).expect("room");
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
