//! Following federation peers: each peer's bundle fetched at its refresh hint (bounded, jittered), with
//! backoff on failure; a bundle refused whole when its sequence goes backwards, its trust domain
//! differs, or it is oversize or malformed; the last good bundle persisted in the keystore (shared by
//! replicas on a database) and held through the peer's outage.
//!
//! The [`Importer`] publishes two things on watch channels: the bundle held for each peer (what the
//! mesh trusts; it changes only when a bundle does) and each peer's status (every attempt).

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meshca_identity::TrustDomain;
use meshca_keystore::Keystore;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::bundle::{BundleLimits, SpiffeBundle};
use crate::fetch::fetch;
use crate::peer::Peer;

/// The bundle held for each peer, by trust domain. A peer with nothing held yet (an `https_web` peer
/// before its first fetch) is absent.
pub type HeldBundles = BTreeMap<TrustDomain, Arc<SpiffeBundle>>;

/// Every peer's status, by trust domain.
pub type PeerStatuses = BTreeMap<TrustDomain, PeerStatus>;

/// The refresh hint assumed for a bundle that gives none: five minutes, SPIRE's default.
pub const DEFAULT_REFRESH_HINT: Duration = Duration::from_secs(300);

/// The refresh intervals a peer's hint is bounded to: a peer cannot make meshca poll more often than
/// every 30 seconds, nor tell it to wait longer than an hour.
pub const REFRESH_BOUNDS: RangeInclusive<Duration> =
    Duration::from_secs(30)..=Duration::from_secs(3600);

/// The first retry after a failed fetch; each further failure doubles it, up to the refresh interval.
pub const FIRST_RETRY: Duration = Duration::from_secs(5);

/// How peers are fetched.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// How much of a bundle is read (`limits.federationBundleBytes`, `limits.federationBundleKeys`).
    pub limits: BundleLimits,
    /// One fetch, connecting included (`limits.federationFetchTimeout`).
    pub timeout: Duration,
    /// The refresh intervals a peer's hint is bounded to ([`REFRESH_BOUNDS`]).
    pub refresh: RangeInclusive<Duration>,
    /// The first retry after a failure ([`FIRST_RETRY`]).
    pub retry: Duration,
    /// A bundle not confirmed by a fetch for this long is stale (`federation.staleAfter`): logged as an
    /// error when it becomes so, and again when a fetch confirms one.
    pub stale_after: Duration,
}

impl Default for ImportOptions {
    fn default() -> ImportOptions {
        ImportOptions {
            limits: BundleLimits::default(),
            timeout: Duration::from_secs(10),
            refresh: REFRESH_BOUNDS,
            retry: FIRST_RETRY,
            stale_after: Duration::from_secs(24 * 3600),
        }
    }
}

/// Where the bundle held for a peer came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum HeldFrom {
    /// Nothing is held yet.
    Nothing,
    /// The relationship's `initialBundle`.
    InitialBundle,
    /// The keystore: the last good bundle, fetched by this replica before or by another.
    Stored,
    /// This process's fetch.
    Fetched,
}

/// Fetches and their outcomes since the peer was first followed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FetchCounts {
    /// Fetches whose bundle was accepted (changed or not).
    pub ok: u64,
    /// Fetches that got no bundle (connection, TLS, HTTP status, timeout).
    pub failed: u64,
    /// Fetches whose answer was refused (malformed, oversize, another trust domain, the sequence
    /// going backwards).
    pub refused: u64,
}

/// What meshca knows of one peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerStatus {
    /// The bundle endpoint's URL.
    pub url: String,
    /// `https_spiffe` or `https_web`.
    pub profile: &'static str,
    /// Where the held bundle came from.
    pub held_from: HeldFrom,
    /// The held bundle's `spiffe_sequence`.
    pub sequence: Option<u64>,
    /// The held bundle's `spiffe_refresh_hint`.
    pub refresh_hint: Option<Duration>,
    /// X.509 authorities in the held bundle.
    pub x509_authorities: usize,
    /// JWT authorities in the held bundle.
    pub jwt_authorities: usize,
    /// When a fetch last confirmed the held bundle (this process's, or the one stored); `None` for
    /// an initial bundle never confirmed.
    pub fetched_at: Option<SystemTime>,
    /// When this process began holding a bundle for the peer (an initial bundle's age counts from it).
    pub held_since: Option<SystemTime>,
    /// When the last fetch ended.
    pub last_attempt: Option<SystemTime>,
    /// Why the last fetch got no bundle or was refused; `None` after a good one.
    pub last_error: Option<String>,
    /// When the next fetch is due.
    pub next_fetch: Option<SystemTime>,
    /// Fetches so far.
    pub fetches: FetchCounts,
}

impl PeerStatus {
    /// The status of a peer at `url` with `profile`, before anything is held or fetched.
    pub fn new(url: String, profile: &'static str) -> PeerStatus {
        PeerStatus {
            url,
            profile,
            held_from: HeldFrom::Nothing,
            sequence: None,
            refresh_hint: None,
            x509_authorities: 0,
            jwt_authorities: 0,
            fetched_at: None,
            held_since: None,
            last_attempt: None,
            last_error: None,
            next_fetch: None,
            fetches: FetchCounts::default(),
        }
    }

    /// How old the held bundle is at `now`: since a fetch last confirmed it, or since it was first
    /// held; `None` when nothing is held.
    pub fn age(&self, now: SystemTime) -> Option<Duration> {
        let since = self.fetched_at.or(self.held_since)?;
        Some(now.duration_since(since).unwrap_or_default())
    }

    /// Whether the held bundle is older than `stale_after` at `now`, or nothing is held at all.
    pub fn is_stale(&self, now: SystemTime, stale_after: Duration) -> bool {
        self.age(now).is_none_or(|age| age > stale_after)
    }
}

/// Follows the peers it is given: see the module documentation.
#[derive(Clone, Debug)]
pub struct Importer {
    held: watch::Receiver<Arc<HeldBundles>>,
    status: watch::Receiver<Arc<PeerStatuses>>,
    wake: Arc<Mutex<BTreeMap<TrustDomain, Arc<Notify>>>>,
}

impl Importer {
    /// Starts following the peers `peers` names (and, as it changes, the ones it names then), storing
    /// their bundles in `keystore`, until `shutdown`.
    pub fn spawn(
        peers: watch::Receiver<Arc<Vec<Peer>>>,
        keystore: Arc<dyn Keystore>,
        options: ImportOptions,
        shutdown: CancellationToken,
    ) -> Importer {
        let (held_tx, held) = watch::channel(Arc::new(HeldBundles::new()));
        let (status_tx, status) = watch::channel(Arc::new(PeerStatuses::new()));
        let wake = Arc::new(Mutex::new(BTreeMap::new()));
        let shared = Arc::new(Shared {
            keystore,
            options,
            held: held_tx,
            status: status_tx,
        });
        tokio::spawn(supervise(peers, shared, wake.clone(), shutdown));
        Importer { held, status, wake }
    }

    /// The bundles held, as they change.
    pub fn held(&self) -> watch::Receiver<Arc<HeldBundles>> {
        self.held.clone()
    }

    /// Every peer's status, as it changes.
    pub fn status(&self) -> watch::Receiver<Arc<PeerStatuses>> {
        self.status.clone()
    }

    /// Fetches every peer's bundle now rather than when due (SIGHUP).
    pub fn refresh_all(&self) {
        let wake = self.wake.lock().unwrap_or_else(|e| e.into_inner());
        for notify in wake.values() {
            notify.notify_one();
        }
    }

    /// Fetches `trust_domain`'s bundle now rather than when due; whether it is a peer followed.
    pub fn refresh(&self, trust_domain: &TrustDomain) -> bool {
        let wake = self.wake.lock().unwrap_or_else(|e| e.into_inner());
        match wake.get(trust_domain) {
            Some(notify) => {
                notify.notify_one();
                true
            }
            None => false,
        }
    }
}

/// What every peer's task shares.
struct Shared {
    keystore: Arc<dyn Keystore>,
    options: ImportOptions,
    held: watch::Sender<Arc<HeldBundles>>,
    status: watch::Sender<Arc<PeerStatuses>>,
}

impl Shared {
    fn set_held(&self, trust_domain: &TrustDomain, bundle: Option<Arc<SpiffeBundle>>) {
        self.held.send_if_modified(|held| {
            if held.get(trust_domain) == bundle.as_ref() {
                return false;
            }
            let mut next = (**held).clone();
            match bundle {
                Some(b) => next.insert(trust_domain.clone(), b),
                None => next.remove(trust_domain),
            };
            *held = Arc::new(next);
            true
        });
    }

    fn set_status(&self, trust_domain: &TrustDomain, status: Option<PeerStatus>) {
        self.status.send_modify(|all| {
            let mut next = (**all).clone();
            match status {
                Some(s) => next.insert(trust_domain.clone(), s),
                None => next.remove(trust_domain),
            };
            *all = Arc::new(next);
        });
    }
}

/// One peer's task.
struct Following {
    peer: Peer,
    task: JoinHandle<()>,
}

/// Starts, restarts and stops the peers' tasks as the list changes.
async fn supervise(
    mut peers: watch::Receiver<Arc<Vec<Peer>>>,
    shared: Arc<Shared>,
    wake: Arc<Mutex<BTreeMap<TrustDomain, Arc<Notify>>>>,
    shutdown: CancellationToken,
) {
    let mut following: BTreeMap<TrustDomain, Following> = BTreeMap::new();
    loop {
        let wanted: BTreeMap<TrustDomain, Peer> = peers
            .borrow_and_update()
            .iter()
            .map(|p| (p.trust_domain.clone(), p.clone()))
            .collect();
        let gone: Vec<TrustDomain> = following
            .iter()
            .filter(|(td, f)| wanted.get(*td) != Some(&f.peer))
            .map(|(td, _)| td.clone())
            .collect();
        for td in gone {
            if let Some(f) = following.remove(&td) {
                f.task.abort();
                // The task is gone before the next one for the trust domain begins.
                let _ = f.task.await;
            }
            wake.lock().unwrap_or_else(|e| e.into_inner()).remove(&td);
            if !wanted.contains_key(&td) {
                shared.set_held(&td, None);
                shared.set_status(&td, None);
                tracing::info!(trust_domain = %td, "no longer federated");
            }
        }
        for (td, peer) in wanted {
            if following.contains_key(&td) {
                continue;
            }
            let notify = Arc::new(Notify::new());
            wake.lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(td.clone(), notify.clone());
            let task = tokio::spawn(follow(peer.clone(), shared.clone(), notify));
            following.insert(td, Following { peer, task });
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            changed = peers.changed() => if changed.is_err() { break },
        }
    }
    for (_, f) in following {
        f.task.abort();
    }
}

/// The keystore entry of a trust domain's last good bundle.
pub fn stored_path(trust_domain: &TrustDomain) -> String {
    format!("federation/{trust_domain}.json")
}

/// A bundle as stored: the SPIFFE bundle and when it was fetched.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredRecord {
    /// Seconds since the Unix epoch.
    fetched_at: u64,
    bundle: serde_json::Value,
}

/// A stored bundle, read.
struct Stored {
    bundle: SpiffeBundle,
    fetched_at: SystemTime,
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Reads the stored bundle of `trust_domain`: `Ok(None)` when there is none.
fn read_stored(
    keystore: &dyn Keystore,
    trust_domain: &TrustDomain,
    limits: BundleLimits,
) -> Result<Option<Stored>, String> {
    let path = stored_path(trust_domain);
    let Some(bytes) = keystore
        .get_public(&path)
        .map_err(|e| format!("keystore entry {path}: {e}"))?
    else {
        return Ok(None);
    };
    let corrupt = |why: String| format!("keystore entry {path} is not a stored bundle: {why}");
    let record: StoredRecord =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
    let document = serde_json::to_vec(&record.bundle).map_err(|e| corrupt(e.to_string()))?;
    let bundle =
        SpiffeBundle::parse(trust_domain, &document, limits).map_err(|e| corrupt(e.to_string()))?;
    Ok(Some(Stored {
        bundle,
        fetched_at: UNIX_EPOCH + Duration::from_secs(record.fetched_at),
    }))
}

fn write_stored(
    keystore: &dyn Keystore,
    bundle: &SpiffeBundle,
    fetched_at: SystemTime,
) -> Result<(), String> {
    let path = stored_path(bundle.trust_domain());
    let document: serde_json::Value =
        serde_json::from_slice(&bundle.to_json()).map_err(|e| e.to_string())?;
    let record = StoredRecord {
        fetched_at: unix(fetched_at),
        bundle: document,
    };
    let bytes = serde_json::to_vec(&record).map_err(|e| e.to_string())?;
    keystore
        .put_public(&path, &bytes)
        .map_err(|e| format!("keystore entry {path}: {e}"))
}

/// Whether `newer` may replace `held`: refused when its sequence goes backwards.
pub fn check_sequence(held: Option<&SpiffeBundle>, newer: &SpiffeBundle) -> Result<(), String> {
    match (held.and_then(|h| h.sequence), newer.sequence) {
        (Some(before), Some(now)) if now < before => Err(format!(
            "the bundle's spiffe_sequence went backwards, from {before} to {now}: refused, the bundle held keeps serving"
        )),
        _ => Ok(()),
    }
}

/// The wait before the next fetch: the refresh hint (the fetched bundle's, else the held one's, else
/// [`DEFAULT_REFRESH_HINT`]) bounded to `options.refresh`, or after `failures` failures in a row the
/// backoff (`options.retry` doubled for each further failure) up to that interval; each shortened by
/// up to a tenth at random (`jitter` in [0, 1)), so peers of one replica, and replicas, spread out and
/// none polls later than told.
pub fn next_wait(
    hint: Option<Duration>,
    failures: u32,
    options: &ImportOptions,
    jitter: f64,
) -> Duration {
    let interval = hint
        .unwrap_or(DEFAULT_REFRESH_HINT)
        .clamp(*options.refresh.start(), *options.refresh.end());
    let wait = match failures {
        0 => interval,
        n => options
            .retry
            .saturating_mul(1 << (n - 1).min(20))
            .min(interval),
    };
    wait.mul_f64(1.0 - jitter.clamp(0.0, 1.0) / 10.0)
}

fn jitter() -> f64 {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 4];
    match ring::rand::SystemRandom::new().fill(&mut bytes) {
        Ok(()) => f64::from(u32::from_le_bytes(bytes)) / (f64::from(u32::MAX) + 1.0),
        Err(_) => 0.5,
    }
}

/// What one peer's task holds.
struct Holding {
    bundle: Option<Arc<SpiffeBundle>>,
    status: PeerStatus,
    failures: u32,
}

impl Holding {
    fn hold(&mut self, bundle: SpiffeBundle, from: HeldFrom, fetched_at: Option<SystemTime>) {
        self.status.held_from = from;
        self.status.sequence = bundle.sequence;
        self.status.refresh_hint = bundle.refresh_hint;
        self.status.x509_authorities = bundle.x509_authorities().len();
        self.status.jwt_authorities = bundle.jwt_authorities().len();
        self.status.fetched_at = fetched_at;
        self.status.held_since.get_or_insert_with(SystemTime::now);
        self.bundle = Some(Arc::new(bundle));
    }
}

/// Follows one peer until aborted.
async fn follow(peer: Peer, shared: Arc<Shared>, wake: Arc<Notify>) {
    let td = peer.trust_domain.clone();
    let mut holding = Holding {
        bundle: None,
        status: PeerStatus::new(peer.url.clone(), peer.profile.as_str()),
        failures: 0,
    };
    match stored(&shared, &td).await {
        Ok(Some(stored)) => holding.hold(stored.bundle, HeldFrom::Stored, Some(stored.fetched_at)),
        Ok(None) => {}
        Err(e) => {
            tracing::error!(trust_domain = %td, error = %e, "the stored bundle cannot be read; the initial bundle serves until a fetch succeeds");
            holding.status.last_error = Some(e);
        }
    }
    if holding.bundle.is_none() {
        if let Some(initial) = &peer.initial {
            holding.hold((**initial).clone(), HeldFrom::InitialBundle, None);
        }
    }
    shared.set_held(&td, holding.bundle.clone());
    shared.set_status(&td, Some(holding.status.clone()));
    let mut stale = false;
    loop {
        // Fetch at once on start: what is stored may be old.
        fetch_once(&peer, &shared, &mut holding).await;
        let now_stale = holding
            .status
            .is_stale(SystemTime::now(), shared.options.stale_after);
        match (stale, now_stale) {
            (false, true) => {
                tracing::error!(trust_domain = %td, age = ?holding.status.age(SystemTime::now()), stale_after = ?shared.options.stale_after, last_error = ?holding.status.last_error, "the federated bundle is stale: no fetch has confirmed it for longer than federation.staleAfter; it keeps serving")
            }
            (true, false) => {
                tracing::info!(trust_domain = %td, "the federated bundle is fresh again")
            }
            _ => {}
        }
        stale = now_stale;
        let hint = holding.bundle.as_ref().and_then(|b| b.refresh_hint);
        let wait = next_wait(hint, holding.failures, &shared.options, jitter());
        holding.status.next_fetch = Some(SystemTime::now() + wait);
        shared.set_status(&td, Some(holding.status.clone()));
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = wake.notified() => {}
        }
    }
}

async fn stored(shared: &Arc<Shared>, td: &TrustDomain) -> Result<Option<Stored>, String> {
    let keystore = shared.keystore.clone();
    let td = td.clone();
    let limits = shared.options.limits;
    tokio::task::spawn_blocking(move || read_stored(keystore.as_ref(), &td, limits))
        .await
        .map_err(|e| format!("reading the stored bundle: {e}"))?
}

/// One fetch, and what follows from it: the bundle held, stored and published, or the error recorded.
async fn fetch_once(peer: &Peer, shared: &Arc<Shared>, holding: &mut Holding) {
    let td = &peer.trust_domain;
    let outcome = match peer.auth(holding.bundle.as_deref()) {
        Ok(auth) => fetch(
            &peer.url,
            td,
            &auth,
            shared.options.timeout,
            shared.options.limits,
        )
        .await
        .map_err(|e| {
            let refused = matches!(e, crate::fetch::FetchError::Bundle(_));
            (e.to_string(), refused)
        }),
        Err(e) => Err((e.to_string(), false)),
    };
    let now = SystemTime::now();
    holding.status.last_attempt = Some(now);
    let outcome = outcome.and_then(|bundle| {
        check_sequence(holding.bundle.as_deref(), &bundle)
            .map(|()| bundle)
            .map_err(|e| (e, true))
    });
    match outcome {
        Ok(bundle) => {
            holding.failures = 0;
            holding.status.fetches.ok += 1;
            holding.status.last_error = None;
            // The same bundle again is only confirmed; one equal to the initial bundle is stored, so
            // that the next start holds what a fetch gave.
            if holding.bundle.as_deref() == Some(&bundle)
                && holding.status.held_from != HeldFrom::InitialBundle
            {
                holding.status.fetched_at = Some(now);
                return;
            }
            let accepted = store(shared, bundle, now).await;
            match accepted {
                Ok((bundle, from, fetched_at)) => {
                    tracing::info!(trust_domain = %td, sequence = ?bundle.sequence, x509_authorities = bundle.x509_authorities().len(), jwt_authorities = bundle.jwt_authorities().len(), "federated bundle updated");
                    holding.hold(bundle, from, Some(fetched_at));
                    shared.set_held(td, holding.bundle.clone());
                }
                Err(e) => {
                    // Not stored, not served: every replica serves what the database holds.
                    tracing::error!(trust_domain = %td, error = %e, "a fetched bundle could not be stored; the bundle held keeps serving");
                    holding.failures += 1;
                    holding.status.last_error = Some(e);
                }
            }
        }
        Err((error, refused)) => {
            holding.failures += 1;
            if refused {
                holding.status.fetches.refused += 1;
            } else {
                holding.status.fetches.failed += 1;
            }
            tracing::warn!(trust_domain = %td, url = %meshca_files::shown(&peer.url), error = %error, failures = holding.failures, "federation fetch {}", if refused { "refused" } else { "failed" });
            holding.status.last_error = Some(error);
        }
    }
}

/// Stores `fetched`, unless the keystore already holds a later bundle of the trust domain (another
/// replica fetched it): returns the bundle to hold, where it came from and when it was fetched.
async fn store(
    shared: &Arc<Shared>,
    fetched: SpiffeBundle,
    now: SystemTime,
) -> Result<(SpiffeBundle, HeldFrom, SystemTime), String> {
    let keystore = shared.keystore.clone();
    let limits = shared.options.limits;
    tokio::task::spawn_blocking(move || {
        let td = fetched.trust_domain().clone();
        // A stored record that does not read is replaced by the good bundle.
        if let Ok(Some(stored)) = read_stored(keystore.as_ref(), &td, limits) {
            if check_sequence(Some(&stored.bundle), &fetched).is_err() {
                return Ok((stored.bundle, HeldFrom::Stored, stored.fetched_at));
            }
        }
        write_stored(keystore.as_ref(), &fetched, now)?;
        Ok((fetched, HeldFrom::Fetched, now))
    })
    .await
    .map_err(|e| format!("storing the bundle: {e}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(30);
    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_peers_hint_is_bounded_and_never_waited_past() {
        let options = ImportOptions::default();
        let at = |hint: Option<u64>, failures, jitter| {
            next_wait(hint.map(Duration::from_secs), failures, &options, jitter)
        };
        assert_eq!(at(Some(120), 0, 0.0), Duration::from_secs(120));
        assert_eq!(at(None, 0, 0.0), DEFAULT_REFRESH_HINT);
        assert_eq!(at(Some(1), 0, 0.0), MIN, "no faster than every 30 s");
        assert_eq!(at(Some(86_400), 0, 0.0), HOUR, "no slower than hourly");
        // Jitter only shortens, by at most a tenth.
        let jittered = at(Some(120), 0, 0.999);
        assert!(jittered < Duration::from_secs(120) && jittered >= Duration::from_secs(108));
    }

    #[test]
    fn failures_back_off_from_five_seconds_up_to_the_refresh_interval() {
        let options = ImportOptions::default();
        let waits: Vec<u64> = (1..=8)
            .map(|n| next_wait(Some(Duration::from_secs(300)), n, &options, 0.0).as_secs())
            .collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300]);
        // A huge count does not overflow.
        assert_eq!(
            next_wait(Some(Duration::from_secs(300)), u32::MAX, &options, 0.0).as_secs(),
            300
        );
    }

    fn bundle(sequence: Option<u64>) -> SpiffeBundle {
        let td: TrustDomain = "peer.example".parse().expect("a trust domain");
        let mut b = SpiffeBundle::new(td, Vec::new(), Vec::new());
        b.sequence = sequence;
        b
    }

    #[test]
    fn only_a_sequence_going_backwards_is_refused() {
        assert!(check_sequence(Some(&bundle(Some(5))), &bundle(Some(5))).is_ok());
        assert!(check_sequence(Some(&bundle(Some(5))), &bundle(Some(6))).is_ok());
        assert!(check_sequence(None, &bundle(Some(1))).is_ok());
        // A PEM initial bundle has no sequence; nor does a peer that sets none.
        assert!(check_sequence(Some(&bundle(None)), &bundle(Some(1))).is_ok());
        assert!(check_sequence(Some(&bundle(Some(5))), &bundle(None)).is_ok());
        let error = check_sequence(Some(&bundle(Some(5))), &bundle(Some(4))).unwrap_err();
        assert!(error.contains("from 5 to 4"), "{error}");
    }

    #[test]
    fn a_bundles_age_counts_from_its_fetch_else_from_when_it_was_first_held() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut status = PeerStatus::new(String::new(), "https_web");
        let day = Duration::from_secs(86_400);
        assert_eq!(status.age(t0), None);
        assert!(status.is_stale(t0, day), "nothing held is stale");
        status.held_since = Some(t0);
        assert_eq!(status.age(t0 + MIN), Some(MIN));
        status.fetched_at = Some(t0 + HOUR);
        assert_eq!(status.age(t0 + HOUR + MIN), Some(MIN));
        assert!(!status.is_stale(t0 + HOUR + day, day));
        assert!(status.is_stale(t0 + HOUR + day + MIN, day));
    }
}
