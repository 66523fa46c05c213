//! The JWT signing keys of every trust domain meshca issues JWT-SVIDs in, kept like CA keys, and
//! their rotation.
//!
//! **Storage.** A trust domain's keys are numbered: key `n` is an ECDSA P-256 private key (PKCS#8)
//! stored as the secret `jwt-svid/<trust domain>/<n>` in the daemon's keystore (sealed when the
//! keystore is the database), beside the public entry `jwt-svid/<trust domain>/<n>.json`, a record
//! `{"created_unix_ms": …}` of when it was created. Both are written in one
//! [`Keystore::create_if_absent`] group, so replicas sharing one database agree on each key and on its
//! creation time: the one that loses the race adopts the winner's. A key without a record (key 1 of a
//! data directory from before rotation) gets one the first time it is loaded, written the same way,
//! so every replica reads the same time. A trust domain's first key is created when it is first
//! needed: when a caller of a Workload API method matches a registration whose identity is in that
//! trust domain. Keystore I/O runs on the blocking pool.
//!
//! **Ordering.** A key is published to every `FetchJWTBundles` stream at once (the streams follow
//! [`JwtKeys::subscribe`]), and it signs only once [`WorkloadOptions::ack_after`] has passed since this
//! process published it: the time a Workload API message needs to count as applied. Until then the
//! key before it keeps signing. So no verifier that follows its bundles is handed a token whose key it
//! could not have. A `FetchJWTSVID` that needs a brand-new key waits that long (bounded by the
//! identity wait). Every stored key is published when the process starts.
//!
//! **Rotation.** Key `n` signs for at most [`WorkloadOptions::jwt_key_lifetime`] after it was
//! created. Key `n + 1` is created `ack_after` plus [`TAKEOVER_MARGIN`] before that, so it takes over
//! about a margin early; should the takeover be later than the lifetime's end here (a keystore slower
//! than the margin, a process that starts right then), a request waits for key `n + 1` rather than
//! have key `n` sign on. So no key signs after `created + lifetime`, on any replica, and each replica
//! can tell when from the stored creation time alone.
//!
//! **Retirement.** A key stays in the bundles (and so in `ValidateJWTSVID`'s lookup) until every token
//! it may have signed has expired: the latest moment it signs, plus the longest lifetime a JWT-SVID can
//! be given ([`MAX_JWT_SVID_EXPIRY`], the largest `jwtSvid.expiry` a registration may set: unlike the
//! largest one the registrations have now, that stays right when a registration is changed or removed
//! after its tokens were signed), plus [`CLOCK_SKEW_SECS`] for hosts whose clocks differ. Then it leaves
//! the bundles and is deleted from the keystore (secret first, then its record; deleting what is gone
//! succeeds, so replicas retiring the same key at once do not conflict). A trust domain's newest key is
//! never retired.
//!
//! **What drives it.** [`JwtKeys::spawn_rotation`] wakes at the next due moment (a key to create, a
//! key to put into service, a key to retire); a request that finds its trust domain's key due for a
//! successor creates it itself. A process killed at any moment leaves a state the next start handles:
//! a created key is published when loaded, a half-deleted one is finished.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use meshca_config::MAX_JWT_SVID_EXPIRY;
use meshca_hsm::{KeySelector, Pkcs11Uri};
use meshca_identity::KeyAlgorithm;
use meshca_keystore::{record_token_key, Creation, Keystore, KeystoreError, NewEntry};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::jwt::{JwksDocument, JwtError, JwtPublicKey, JwtSigningKey, CLOCK_SKEW_SECS};
use crate::options::WorkloadOptions;

/// Where the keys live in the keystore: `jwt-svid/<trust domain>/<number>`.
const PREFIX: &str = "jwt-svid/";
/// The suffix of a key's record: `jwt-svid/<trust domain>/<number>.json`.
const RECORD_SUFFIX: &str = ".json";
/// With `keystore.pkcs11`, a key is made in the token, and the keystore keeps its `pkcs11:` URI,
/// `jwt-svid/<trust domain>/<number>.pkcs11`...
const TOKEN_SUFFIX: &str = ".pkcs11";
/// ...and its public key, `jwt-svid/<trust domain>/<number>.pub.pem`, which the key found in the token
/// is proven against.
const PUBLIC_SUFFIX: &str = ".pub.pem";

/// How long before a key's lifetime ends, on top of `ackAfter`, its successor is created. The
/// successor signs `ackAfter` after it was published, so without a margin it would take over exactly
/// at the end, and any delay (a keystore write that takes up to its timeout, a busy blocking pool, a
/// rotation task woken late) would leave requests waiting for it. A minute covers those delays; the
/// old key then signs a minute less than its lifetime, which is at least ten minutes.
pub const TAKEOVER_MARGIN: Duration = Duration::from_secs(60);

/// The longest the rotation task sleeps before it looks again (the wall clock may be set meanwhile).
const MAX_NAP: Duration = Duration::from_secs(300);
/// How soon the rotation task tries again after the keystore failed.
const RETRY_AFTER: Duration = Duration::from_secs(30);
/// The latest creation time a record may hold (the end of year 9999), in unix milliseconds.
const MAX_UNIX_MS: u64 = 253_402_300_799_000;

/// Why a JWT signing key could not be loaded or created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JwtKeysError {
    /// The keystore failed.
    #[error("JWT signing key {name}: {source}")]
    Keystore {
        /// The keystore entry.
        name: String,
        /// What failed.
        source: KeystoreError,
    },
    /// A stored key does not parse, or a new one could not be made.
    #[error("JWT signing key {name}: {source}")]
    Key {
        /// The keystore entry.
        name: String,
        /// What is wrong.
        source: JwtError,
    },
    /// A key's record (its creation time) does not parse.
    #[error("JWT signing key record {name}: {reason}")]
    Record {
        /// The keystore entry.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// `create_if_absent` reported another writer's key, which then was not there.
    #[error("JWT signing key {name}: another writer created it, but it cannot be read")]
    Vanished {
        /// The keystore entry.
        name: String,
    },
    /// The trust domain cannot be part of a keystore entry name.
    #[error("trust domain {trust_domain:?} cannot name a JWT signing key")]
    InvalidTrustDomain {
        /// The trust domain.
        trust_domain: String,
    },
    /// The blocking task doing keystore I/O did not finish.
    #[error("JWT signing key {name}: the keystore task failed")]
    TaskFailed {
        /// The keystore entry.
        name: String,
    },
    /// A new key would sign only after the deadline.
    #[error(
        "the JWT signing key of trust domain {trust_domain} is new and signs only once every \
         verifier could have it, which is later than this request may wait"
    )]
    NotYetUsable {
        /// The trust domain.
        trust_domain: String,
    },
}

/// The published keys: a JWK Set per trust domain (by bare trust domain name).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KeySet {
    by_trust_domain: BTreeMap<String, JwksDocument>,
}

impl KeySet {
    /// A key set of these documents, by bare trust domain name (keys another server publishes).
    pub fn from_documents(by_trust_domain: BTreeMap<String, JwksDocument>) -> KeySet {
        KeySet { by_trust_domain }
    }

    /// The JWK Set of each trust domain that has keys, by bare trust domain name.
    pub fn by_trust_domain(&self) -> &BTreeMap<String, JwksDocument> {
        &self.by_trust_domain
    }

    /// The key `kid` of `trust_domain`, if it is published.
    pub fn get(&self, trust_domain: &str, kid: &str) -> Option<JwtPublicKey> {
        self.by_trust_domain.get(trust_domain)?.get(kid).cloned()
    }
}

/// One JWT signing key as operators see it (`/api/status`): never key material. Times are RFC 3339.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JwtKeyStatus {
    /// The trust domain it signs for.
    pub trust_domain: String,
    /// Its `kid`.
    pub kid: String,
    /// Its number in the keystore (`jwt-svid/<trust domain>/<number>`).
    pub number: u64,
    /// When it was created (the same on every replica).
    pub created: String,
    /// When it may first sign in this process: `ackAfter` after this process published it.
    pub signs_from: String,
    /// The latest it signs, on any replica.
    pub signs_until: String,
    /// When it leaves the bundles, once a newer key exists: every token it signed has expired then.
    pub retires_at: String,
    /// Whether it is the key that signs in this process now.
    pub signing: bool,
}

/// Unix milliseconds now; tests put their own clock in.
#[doc(hidden)]
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

fn system_clock() -> Clock {
    Arc::new(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, millis)
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// When each step of a key's life is due, in unix milliseconds, from its creation time.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    ack_after: Duration,
    lifetime: Duration,
}

impl Schedule {
    /// When its successor is created: `ack_after` and the margin before its lifetime ends.
    fn successor_due(&self, created: u64) -> u64 {
        self.signs_until(created)
            .saturating_sub(millis(self.ack_after))
            .saturating_sub(millis(TAKEOVER_MARGIN))
    }

    /// The latest it signs: the end of its lifetime.
    fn signs_until(&self, created: u64) -> u64 {
        created.saturating_add(millis(self.lifetime))
    }

    /// When every token it signed has expired.
    fn retires_at(&self, created: u64) -> u64 {
        self.signs_until(created)
            .saturating_add(millis(MAX_JWT_SVID_EXPIRY))
            .saturating_add(CLOCK_SKEW_SECS.saturating_mul(1000))
    }
}

/// A key this process holds, and when it may first sign.
struct Held {
    key: Arc<JwtSigningKey>,
    /// Unix milliseconds, from its record.
    created: u64,
    usable_at: Instant,
    /// Whether its being put into service was logged.
    in_service: bool,
}

/// A trust domain's keys, by number.
type Domain = BTreeMap<u64, Held>;

/// What signs for a trust domain now.
enum Pick {
    Sign(u64, Arc<JwtSigningKey>),
    WaitUntil(Instant),
    Nothing,
}

/// The newest key that may sign now; else the soonest one that will.
fn pick(domain: &Domain, schedule: Schedule, now: u64, now_instant: Instant) -> Pick {
    let mut wait: Option<Instant> = None;
    for (number, held) in domain.iter().rev() {
        if now >= schedule.signs_until(held.created) {
            continue;
        }
        if held.usable_at <= now_instant {
            return Pick::Sign(*number, held.key.clone());
        }
        wait = Some(wait.map_or(held.usable_at, |w| w.min(held.usable_at)));
    }
    wait.map_or(Pick::Nothing, Pick::WaitUntil)
}

struct Inner {
    keystore: Arc<dyn Keystore>,
    schedule: Schedule,
    clock: Clock,
    held: Mutex<BTreeMap<String, Domain>>,
    published: watch::Sender<Arc<KeySet>>,
    /// Serializes creations and retirements in this process, so two requests do not both generate
    /// a key.
    writing: tokio::sync::Mutex<()>,
}

/// The JWT signing keys of every trust domain, shared by the Workload API's requests. Cheap to clone.
#[derive(Clone)]
pub struct JwtKeys {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtKeys")
            .field("keys", &self.inner.published.borrow())
            .finish_non_exhaustive()
    }
}

fn key_name(trust_domain: &str, number: u64) -> Result<String, JwtKeysError> {
    let name = format!("{PREFIX}{trust_domain}/{number}");
    meshca_keystore::validate_name(&name).map_err(|_| JwtKeysError::InvalidTrustDomain {
        trust_domain: trust_domain.to_owned(),
    })?;
    Ok(name)
}

fn record_name(key_name: &str) -> String {
    format!("{key_name}{RECORD_SUFFIX}")
}

/// The label of key `name` in the PKCS#11 token.
fn token_label(name: &str) -> String {
    format!("meshca {name}")
}

fn key_error(name: &str, reason: String) -> JwtKeysError {
    JwtKeysError::Key {
        name: name.to_owned(),
        source: JwtError::Key { reason },
    }
}

/// Key `name` in the keystore's token, if the keystore records one (`<name>.pkcs11` and
/// `<name>.pub.pem`; a record still being written by another process counts as none yet).
fn read_token_key(
    keystore: &dyn Keystore,
    name: &str,
) -> Result<Option<JwtSigningKey>, JwtKeysError> {
    let uri_entry = format!("{name}{TOKEN_SUFFIX}");
    let Some(uri) = keystore
        .get_public(&uri_entry)
        .map_err(keystore_error(&uri_entry))?
    else {
        return Ok(None);
    };
    let public_entry = format!("{name}{PUBLIC_SUFFIX}");
    let Some(public) = keystore
        .get_public(&public_entry)
        .map_err(keystore_error(&public_entry))?
    else {
        return Ok(None);
    };
    let public = meshca_hsm::p256_public_key_from_pem(&public)
        .ok_or_else(|| key_error(&public_entry, "not a P-256 public key".into()))?;
    let (token, uri) = meshca_keystore::recorded_key(keystore, &uri_entry, &uri)
        .map_err(|e| key_error(&uri_entry, e.to_string()))?;
    let key = token
        .find_key(
            KeySelector {
                label: uri.object(),
                id: uri.id(),
            },
            KeyAlgorithm::EcdsaP256,
            &public,
        )
        .map_err(|e| key_error(&uri_entry, e.to_string()))?;
    JwtSigningKey::from_token_key(key)
        .map(Some)
        .map_err(|source| JwtKeysError::Key {
            name: uri_entry,
            source,
        })
}

fn parse(name: &str, pkcs8: &[u8]) -> Result<JwtSigningKey, JwtKeysError> {
    JwtSigningKey::from_pkcs8(pkcs8).map_err(|source| JwtKeysError::Key {
        name: name.to_owned(),
        source,
    })
}

/// A key's record: when it was created.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    created_unix_ms: u64,
}

fn record_bytes(created: u64) -> Vec<u8> {
    // A struct of one number always serializes.
    serde_json::to_vec(&Record {
        created_unix_ms: created,
    })
    .unwrap_or_default()
}

fn parse_record(name: &str, bytes: &[u8]) -> Result<u64, JwtKeysError> {
    let record: Record = serde_json::from_slice(bytes).map_err(|e| JwtKeysError::Record {
        name: name.to_owned(),
        reason: format!("not a record {{\"created_unix_ms\": <number>}}: {e}"),
    })?;
    if record.created_unix_ms > MAX_UNIX_MS {
        return Err(JwtKeysError::Record {
            name: name.to_owned(),
            reason: format!(
                "created_unix_ms {} is after the year 9999",
                record.created_unix_ms
            ),
        });
    }
    Ok(record.created_unix_ms)
}

fn rfc3339(unix_ms: u64) -> String {
    let at = SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_millis(unix_ms.min(MAX_UNIX_MS)))
        .unwrap_or(SystemTime::UNIX_EPOCH);
    meshca_control::rfc3339(at)
}

/// The instant `at` (unix milliseconds) falls on, given that `now` is `now_instant`.
fn instant_of(at: u64, now: u64, now_instant: Instant) -> Instant {
    now_instant + Duration::from_millis(at.saturating_sub(now))
}

/// The unix milliseconds `at` falls on, given that `now` is `now_instant`.
fn unix_ms_of(at: Instant, now: u64, now_instant: Instant) -> u64 {
    now.saturating_add(millis(at.saturating_duration_since(now_instant)))
}

/// A key read from the keystore.
struct Stored {
    key: JwtSigningKey,
    created: u64,
}

fn keystore_error(name: &str) -> impl FnOnce(KeystoreError) -> JwtKeysError + '_ {
    move |source| JwtKeysError::Keystore {
        name: name.to_owned(),
        source,
    }
}

/// The key `name`, if stored, with its creation time; a key without a record gets one saying `now`
/// (the first replica to write it decides).
fn read_key(keystore: &dyn Keystore, name: &str, now: u64) -> Result<Option<Stored>, JwtKeysError> {
    let key = match keystore.get_secret(name).map_err(keystore_error(name))? {
        Some(secret) => parse(name, secret.expose())?,
        None => match read_token_key(keystore, name)? {
            Some(key) => key,
            None => return Ok(None),
        },
    };
    let record = record_name(name);
    let created = match keystore
        .get_public(&record)
        .map_err(keystore_error(&record))?
    {
        Some(bytes) => parse_record(&record, &bytes)?,
        None => {
            let bytes = record_bytes(now);
            match keystore
                .create_if_absent(&[NewEntry::public(&record, &bytes)])
                .map_err(keystore_error(&record))?
            {
                Creation::Created => {
                    tracing::info!(entry = %name, "JWT signing key without a creation time: counted as created now");
                    now
                }
                Creation::Existing => {
                    let bytes = keystore
                        .get_public(&record)
                        .map_err(keystore_error(&record))?
                        .ok_or_else(|| JwtKeysError::Vanished {
                            name: record.clone(),
                        })?;
                    parse_record(&record, &bytes)?
                }
            }
        }
    };
    Ok(Some(Stored { key, created }))
}

/// Every stored key under `prefix` (`jwt-svid/` or one trust domain's `jwt-svid/<td>/`), by trust
/// domain and number. Records left by a retirement that was cut short are deleted.
fn read_stored(
    keystore: &dyn Keystore,
    prefix: &str,
    now: u64,
) -> Result<BTreeMap<String, BTreeMap<u64, Stored>>, JwtKeysError> {
    let names = keystore.list(prefix).map_err(keystore_error(prefix))?;
    let mut keys: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let mut records: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let mut publics: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for name in &names {
        let Some((td, last)) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split_once('/'))
        else {
            continue;
        };
        if let Some(number) = last
            .strip_suffix(RECORD_SUFFIX)
            .and_then(|n| n.parse::<u64>().ok())
        {
            records.entry(td.to_owned()).or_default().insert(number);
        } else if let Some(number) = last
            .strip_suffix(TOKEN_SUFFIX)
            .and_then(|n| n.parse::<u64>().ok())
        {
            keys.entry(td.to_owned()).or_default().insert(number);
        } else if let Some(number) = last
            .strip_suffix(PUBLIC_SUFFIX)
            .and_then(|n| n.parse::<u64>().ok())
        {
            // Read with its key; left alone, like a record, unless a retirement was cut short.
            publics.entry(td.to_owned()).or_default().insert(number);
        } else if let Ok(number) = last.parse::<u64>() {
            keys.entry(td.to_owned()).or_default().insert(number);
        } else {
            tracing::warn!(entry = %name, "ignoring a JWT signing key entry this version does not use");
        }
    }
    let mut stored: BTreeMap<String, BTreeMap<u64, Stored>> = BTreeMap::new();
    for (td, numbers) in &keys {
        let domain = stored.entry(td.clone()).or_default();
        for &number in numbers {
            let name = key_name(td, number)?;
            if let Some(key) = read_key(keystore, &name, now)? {
                domain.insert(number, key);
            }
        }
    }
    for (td, numbers) in records {
        // A record below the newest key whose key is gone is what a cut-short retirement leaves (a
        // record above it may be a creation in progress, seen half-way by a file keystore reader).
        let newest = keys.get(&td).and_then(|k| k.last().copied()).unwrap_or(0);
        for number in numbers {
            let has_key = keys.get(&td).is_some_and(|k| k.contains(&number));
            if !has_key && number < newest {
                let record = record_name(&key_name(&td, number)?);
                keystore.delete(&record).map_err(keystore_error(&record))?;
                tracing::info!(entry = %record, "deleted the record of a retired JWT signing key");
            }
        }
    }
    for (td, numbers) in publics {
        let newest = keys.get(&td).and_then(|k| k.last().copied()).unwrap_or(0);
        for number in numbers {
            let has_key = keys.get(&td).is_some_and(|k| k.contains(&number));
            if !has_key && number < newest {
                let public = format!("{}{PUBLIC_SUFFIX}", key_name(&td, number)?);
                keystore.delete(&public).map_err(keystore_error(&public))?;
                tracing::info!(entry = %public, "deleted the public key of a retired JWT signing key");
            }
        }
    }
    stored.retain(|_, domain| !domain.is_empty());
    Ok(stored)
}

/// Key `name`: the stored one, or a new one stored under it; the keystore decides between racing
/// writers. `true` when this call created it.
fn create_or_adopt(
    keystore: &dyn Keystore,
    name: &str,
    now: u64,
) -> Result<(Stored, bool), JwtKeysError> {
    if let Some(stored) = read_key(keystore, name, now)? {
        return Ok((stored, false));
    }
    if let Some(token) = keystore.token() {
        let made = token
            .generate_pending_key(KeyAlgorithm::EcdsaP256)
            .map_err(|e| key_error(name, format!("making it in the PKCS#11 token: {e}")))?;
        let label = token_label(name);
        let uri = Pkcs11Uri::key(token.label(), &label, made.id()).to_string();
        let public = made
            .public_key_pem()
            .ok_or_else(|| key_error(name, "the PKCS#11 token made no usable P-256 key".into()))?;
        let (uri_entry, public_entry) = (
            format!("{name}{TOKEN_SUFFIX}"),
            format!("{name}{PUBLIC_SUFFIX}"),
        );
        let record = record_name(name);
        let bytes = record_bytes(now);
        let recorded = record_token_key(
            keystore,
            &made,
            &label,
            &[
                NewEntry::public(&uri_entry, uri.as_bytes()),
                NewEntry::public(&public_entry, public.as_bytes()),
                NewEntry::public(&record, &bytes),
            ],
        )
        .map_err(keystore_error(name))?;
        if recorded {
            let key = JwtSigningKey::from_token_key(made).map_err(|source| JwtKeysError::Key {
                name: name.to_owned(),
                source,
            })?;
            return Ok((Stored { key, created: now }, true));
        }
        return read_key(keystore, name, now)?
            .map(|stored| (stored, false))
            .ok_or_else(|| JwtKeysError::Vanished {
                name: name.to_owned(),
            });
    }
    let key = JwtSigningKey::generate().map_err(|source| JwtKeysError::Key {
        name: name.to_owned(),
        source,
    })?;
    let pkcs8 = key
        .pkcs8()
        .ok_or_else(|| key_error(name, "a new software key without its PKCS#8".into()))?;
    let record = record_name(name);
    let bytes = record_bytes(now);
    match keystore
        .create_if_absent(&[
            NewEntry::secret(name, pkcs8),
            NewEntry::public(&record, &bytes),
        ])
        .map_err(keystore_error(name))?
    {
        Creation::Created => Ok((Stored { key, created: now }, true)),
        Creation::Existing => read_key(keystore, name, now)?
            .map(|stored| (stored, false))
            .ok_or_else(|| JwtKeysError::Vanished {
                name: name.to_owned(),
            }),
    }
}

/// Deletes key `name` and then its record; what is already gone is fine. A key in the token is labelled
/// pending again first and destroyed once no entry names it, so a kill at any step leaves what a start
/// settles (see `meshca_hsm`'s pending keys).
fn delete_key(keystore: &dyn Keystore, name: &str) -> Result<(), JwtKeysError> {
    let uri_entry = format!("{name}{TOKEN_SUFFIX}");
    let in_token = match keystore
        .get_public(&uri_entry)
        .map_err(keystore_error(&uri_entry))?
    {
        Some(uri) => Pkcs11Uri::parse(String::from_utf8_lossy(&uri).trim())
            .ok()
            .and_then(|uri| uri.id().map(<[u8]>::to_vec))
            .zip(keystore.token()),
        None => None,
    };
    if let Some((id, token)) = &in_token {
        token
            .mark_pending(id)
            .map_err(|e| key_error(name, format!("retiring it in the PKCS#11 token: {e}")))?;
    }
    keystore.delete(name).map_err(keystore_error(name))?;
    for entry in [uri_entry, format!("{name}{PUBLIC_SUFFIX}")] {
        keystore.delete(&entry).map_err(keystore_error(&entry))?;
    }
    if let Some((id, token)) = &in_token {
        if let Err(error) = token.destroy_keys(id) {
            tracing::warn!(key = %name, "a retired JWT signing key could not be destroyed in the PKCS#11 token; the next start does: {error}");
        }
    }
    let record = record_name(name);
    keystore.delete(&record).map_err(keystore_error(&record))
}

fn key_set(held: &BTreeMap<String, Domain>) -> KeySet {
    KeySet {
        by_trust_domain: held
            .iter()
            .filter(|(_, domain)| !domain.is_empty())
            .map(|(td, domain)| {
                (
                    td.clone(),
                    JwksDocument::new(domain.values().map(|h| h.key.public())),
                )
            })
            .collect(),
    }
}

impl JwtKeys {
    /// Loads every key stored in `keystore`, publishes them (each signs from `options.ack_after` on,
    /// see the module docs), retires those whose tokens have all expired and creates the successors
    /// that are due.
    pub async fn load(
        keystore: Arc<dyn Keystore>,
        options: &WorkloadOptions,
    ) -> Result<JwtKeys, JwtKeysError> {
        JwtKeys::load_with_clock(keystore, options, system_clock()).await
    }

    /// [`JwtKeys::load`] with the time taken from `clock`: for tests that move time on (with tokio's
    /// paused clock) through a rotation.
    #[doc(hidden)]
    pub async fn load_with_clock(
        keystore: Arc<dyn Keystore>,
        options: &WorkloadOptions,
        clock: Clock,
    ) -> Result<JwtKeys, JwtKeysError> {
        let now = clock();
        let stored = {
            let keystore = keystore.clone();
            tokio::task::spawn_blocking(move || read_stored(keystore.as_ref(), PREFIX, now))
                .await
                .map_err(|_| JwtKeysError::TaskFailed {
                    name: PREFIX.to_owned(),
                })??
        };
        let usable_at = Instant::now() + options.ack_after;
        let held: BTreeMap<String, Domain> = stored
            .into_iter()
            .map(|(td, keys)| {
                let domain = keys
                    .into_iter()
                    .map(|(number, stored)| {
                        (
                            number,
                            Held {
                                key: Arc::new(stored.key),
                                created: stored.created,
                                usable_at,
                                in_service: false,
                            },
                        )
                    })
                    .collect();
                (td, domain)
            })
            .collect();
        for (td, domain) in &held {
            for (number, h) in domain {
                tracing::info!(trust_domain = %td, kid = h.key.kid(), number, created = %rfc3339(h.created), "JWT signing key published");
            }
        }
        let (published, _) = watch::channel(Arc::new(key_set(&held)));
        let keys = JwtKeys {
            inner: Arc::new(Inner {
                keystore,
                schedule: Schedule {
                    ack_after: options.ack_after,
                    lifetime: options.jwt_key_lifetime,
                },
                clock,
                held: Mutex::new(held),
                published,
                writing: tokio::sync::Mutex::new(()),
            }),
        };
        keys.tick().await?;
        // Nothing was served yet: the keys the round made are published with the stored ones, and
        // all sign from `ack_after` after now (the newest, that is).
        let usable_at = Instant::now() + options.ack_after;
        for domain in keys.lock_held().values_mut() {
            for held in domain.values_mut() {
                held.usable_at = usable_at;
            }
        }
        Ok(keys)
    }

    /// The published keys, changed whenever a key is added or retired.
    pub fn subscribe(&self) -> watch::Receiver<Arc<KeySet>> {
        self.inner.published.subscribe()
    }

    /// The keys published now.
    pub fn current(&self) -> Arc<KeySet> {
        self.inner.published.borrow().clone()
    }

    /// Every key held, by trust domain and number, for operators.
    pub fn status(&self) -> Vec<JwtKeyStatus> {
        let now = (self.inner.clock)();
        let now_instant = Instant::now();
        let schedule = self.inner.schedule;
        let held = self.lock_held();
        let mut out = Vec::new();
        for (td, domain) in held.iter() {
            let signing = match pick(domain, schedule, now, now_instant) {
                Pick::Sign(number, _) => Some(number),
                Pick::WaitUntil(_) | Pick::Nothing => None,
            };
            for (number, h) in domain {
                out.push(JwtKeyStatus {
                    trust_domain: td.clone(),
                    kid: h.key.kid().to_owned(),
                    number: *number,
                    created: rfc3339(h.created),
                    signs_from: rfc3339(unix_ms_of(h.usable_at, now, now_instant)),
                    signs_until: rfc3339(schedule.signs_until(h.created)),
                    retires_at: rfc3339(schedule.retires_at(h.created)),
                    signing: signing == Some(*number),
                });
            }
        }
        out
    }

    /// Makes sure `trust_domain` has a key, and a successor when its newest is due for one: loads the
    /// stored ones, or creates and stores one (adopting another replica's if it was first), and
    /// publishes it.
    pub async fn ensure(&self, trust_domain: &str) -> Result<(), JwtKeysError> {
        if !self.needs_writing(trust_domain) {
            return Ok(());
        }
        let _writing = self.inner.writing.lock().await;
        self.ensure_locked(trust_domain).await
    }

    /// The key that signs for `trust_domain`, created if needed; waits until it may sign, but not
    /// past `deadline`.
    pub async fn signer(
        &self,
        trust_domain: &str,
        deadline: Instant,
    ) -> Result<Arc<JwtSigningKey>, JwtKeysError> {
        loop {
            self.ensure(trust_domain).await?;
            let picked = {
                let held = self.lock_held();
                match held.get(trust_domain) {
                    Some(domain) => pick(
                        domain,
                        self.inner.schedule,
                        (self.inner.clock)(),
                        Instant::now(),
                    ),
                    None => Pick::Nothing,
                }
            };
            match picked {
                Pick::Sign(_, key) => return Ok(key),
                Pick::WaitUntil(at) if at <= deadline => tokio::time::sleep_until(at).await,
                Pick::WaitUntil(_) | Pick::Nothing => {
                    return Err(JwtKeysError::NotYetUsable {
                        trust_domain: trust_domain.to_owned(),
                    })
                }
            }
        }
    }

    /// Runs the rotation in the background until every clone of these keys is dropped: creates each
    /// successor when due, logs each key put into service, retires each key whose tokens have all
    /// expired. It sleeps until the next of those moments, or until the keys change.
    pub fn spawn_rotation(&self) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(&self.inner);
        let mut changes = self.inner.published.subscribe();
        tokio::spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let keys = JwtKeys { inner };
                // Changes from here on wake the next round (the round's own included, harmlessly).
                changes.borrow_and_update();
                let next = match keys.tick().await {
                    Ok(next) => next,
                    Err(error) => {
                        tracing::warn!(%error, "JWT signing key rotation failed; trying again in {RETRY_AFTER:?}");
                        Instant::now() + RETRY_AFTER
                    }
                };
                drop(keys);
                tokio::select! {
                    () = tokio::time::sleep_until(next) => {}
                    changed = changes.changed() => if changed.is_err() {
                        return;
                    },
                }
            }
        })
    }

    /// One round of the rotation: successors created, keys put into service logged, keys retired.
    /// Returns when the next round is due. A failure of one trust domain does not stop the others';
    /// the first is returned.
    #[doc(hidden)]
    pub async fn tick(&self) -> Result<Instant, JwtKeysError> {
        let _writing = self.inner.writing.lock().await;
        let trust_domains: Vec<String> = self.lock_held().keys().cloned().collect();
        let mut first_error = None;
        for td in trust_domains {
            if let Err(error) = self.ensure_locked(&td).await {
                first_error.get_or_insert(error);
            }
        }
        if let Err(error) = self.retire_due().await {
            first_error.get_or_insert(error);
        }
        self.announce();
        match first_error {
            Some(error) => Err(error),
            None => Ok(self.next_due()),
        }
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Domain>> {
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `trust_domain` has no key here, or its newest is due for a successor.
    fn needs_writing(&self, trust_domain: &str) -> bool {
        let now = (self.inner.clock)();
        let held = self.lock_held();
        match held.get(trust_domain).and_then(|d| d.values().next_back()) {
            Some(newest) => now >= self.inner.schedule.successor_due(newest.created),
            None => true,
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        name: &str,
        work: impl FnOnce(&dyn Keystore) -> Result<T, JwtKeysError> + Send + 'static,
    ) -> Result<T, JwtKeysError> {
        let keystore = self.inner.keystore.clone();
        tokio::task::spawn_blocking(move || work(keystore.as_ref()))
            .await
            .map_err(|_| JwtKeysError::TaskFailed {
                name: name.to_owned(),
            })?
    }

    /// [`JwtKeys::ensure`], holding the writing lock.
    async fn ensure_locked(&self, trust_domain: &str) -> Result<(), JwtKeysError> {
        loop {
            let now = (self.inner.clock)();
            let newest = {
                let held = self.lock_held();
                held.get(trust_domain)
                    .and_then(|d| d.iter().next_back())
                    .map(|(number, h)| (*number, h.created))
            };
            let number = match newest {
                Some((number, created)) => {
                    if now < self.inner.schedule.successor_due(created) {
                        return Ok(());
                    }
                    number.saturating_add(1)
                }
                None => {
                    // Not held here: another replica may have made its keys already.
                    let first = key_name(trust_domain, 1)?;
                    let prefix = format!("{PREFIX}{trust_domain}/");
                    let mut stored = self
                        .blocking(&first, move |keystore| read_stored(keystore, &prefix, now))
                        .await?;
                    let found = stored.remove(trust_domain).unwrap_or_default();
                    if !found.is_empty() {
                        for (number, stored) in found {
                            self.insert(trust_domain, number, stored, false);
                        }
                        continue;
                    }
                    1
                }
            };
            let name = key_name(trust_domain, number)?;
            let (stored, created) = {
                let name = name.clone();
                self.blocking(&name.clone(), move |keystore| {
                    create_or_adopt(keystore, &name, now)
                })
                .await?
            };
            self.insert(trust_domain, number, stored, created);
        }
    }

    /// Holds and publishes key `number` of `trust_domain`.
    fn insert(&self, trust_domain: &str, number: u64, stored: Stored, created: bool) {
        let verb = if created { "created" } else { "adopted" };
        tracing::info!(
            trust_domain,
            kid = stored.key.kid(),
            number,
            created = %rfc3339(stored.created),
            "JWT signing key {verb} and published"
        );
        let mut held = self.lock_held();
        held.entry(trust_domain.to_owned()).or_default().insert(
            number,
            Held {
                key: Arc::new(stored.key),
                created: stored.created,
                usable_at: Instant::now() + self.inner.schedule.ack_after,
                in_service: false,
            },
        );
        self.inner.published.send_replace(Arc::new(key_set(&held)));
    }

    /// Takes every key whose tokens have all expired out of the bundles, then deletes it.
    async fn retire_due(&self) -> Result<(), JwtKeysError> {
        let now = (self.inner.clock)();
        let schedule = self.inner.schedule;
        let mut retired = Vec::new();
        {
            let mut held = self.lock_held();
            for (td, domain) in held.iter_mut() {
                let Some(newest) = domain.keys().next_back().copied() else {
                    continue;
                };
                let due: Vec<u64> = domain
                    .iter()
                    .filter(|(number, h)| {
                        **number != newest && now >= schedule.retires_at(h.created)
                    })
                    .map(|(number, _)| *number)
                    .collect();
                for number in due {
                    if let Some(h) = domain.remove(&number) {
                        retired.push((td.clone(), number, h.key.kid().to_owned()));
                    }
                }
            }
            if retired.is_empty() {
                return Ok(());
            }
            self.inner.published.send_replace(Arc::new(key_set(&held)));
        }
        let mut first_error = None;
        for (td, number, kid) in retired {
            tracing::info!(trust_domain = %td, kid, number, "JWT signing key retired: every token it signed has expired");
            let name = key_name(&td, number)?;
            let result = {
                let name = name.clone();
                self.blocking(&name.clone(), move |keystore| delete_key(keystore, &name))
                    .await
            };
            if let Err(error) = result {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Logs each key that signs now for the first time.
    fn announce(&self) {
        let now = (self.inner.clock)();
        let now_instant = Instant::now();
        let schedule = self.inner.schedule;
        let mut held = self.lock_held();
        for (td, domain) in held.iter_mut() {
            if let Pick::Sign(number, _) = pick(domain, schedule, now, now_instant) {
                if let Some(h) = domain.get_mut(&number) {
                    if !std::mem::replace(&mut h.in_service, true) {
                        tracing::info!(trust_domain = %td, kid = h.key.kid(), number, "JWT signing key put into service: it signs from now on");
                    }
                }
            }
        }
    }

    /// The next moment something is due: a successor to create, a key to put into service, a key
    /// to retire.
    fn next_due(&self) -> Instant {
        let now = (self.inner.clock)();
        let now_instant = Instant::now();
        let schedule = self.inner.schedule;
        let held = self.lock_held();
        let mut due = now_instant + MAX_NAP;
        for domain in held.values() {
            let newest = domain.keys().next_back().copied();
            for (number, h) in domain {
                let at = if Some(*number) == newest {
                    schedule.successor_due(h.created)
                } else {
                    schedule.retires_at(h.created)
                };
                due = due.min(instant_of(at, now, now_instant));
                if !h.in_service && h.usable_at > now_instant {
                    due = due.min(h.usable_at);
                }
            }
        }
        due.max(now_instant + Duration::from_millis(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jwt::{mint, validate};
    use meshca_keystore::MemoryKeystore;

    const TD: &str = "example.org";
    /// 2027-01-15T08:00:00Z, where the test clocks start.
    const EPOCH_MS: u64 = 1_800_000_000_000;
    const HOUR: Duration = Duration::from_secs(3600);
    const DAY: Duration = Duration::from_secs(24 * 3600);

    /// A wall clock that moves with tokio's (paused) time.
    fn paused_clock() -> Clock {
        let start = Instant::now();
        Arc::new(move || EPOCH_MS + millis(Instant::now() - start))
    }

    fn options(ack_after: Duration, lifetime: Duration) -> WorkloadOptions {
        WorkloadOptions {
            ack_after,
            jwt_key_lifetime: lifetime,
            ..WorkloadOptions::default()
        }
    }

    fn memory() -> Arc<dyn Keystore> {
        Arc::new(MemoryKeystore::new())
    }

    async fn load(
        keystore: &Arc<dyn Keystore>,
        options: &WorkloadOptions,
        clock: &Clock,
    ) -> JwtKeys {
        JwtKeys::load_with_clock(keystore.clone(), options, clock.clone())
            .await
            .expect("loads")
    }

    /// The kids of the trust domain's bundle.
    fn bundle(keys: &JwtKeys) -> Vec<String> {
        keys.current()
            .by_trust_domain()
            .get(TD)
            .map(|jwks| jwks.keys().iter().map(|k| k.kid().to_owned()).collect())
            .unwrap_or_default()
    }

    /// The kid that signs now, without waiting.
    async fn signing_now(keys: &JwtKeys) -> Option<String> {
        keys.signer(TD, Instant::now())
            .await
            .ok()
            .map(|k| k.kid().to_owned())
    }

    async fn advance_to(clock: &Clock, unix_ms: u64) {
        let now = clock();
        assert!(unix_ms >= now, "the test moves forward only");
        tokio::time::advance(Duration::from_millis(unix_ms - now)).await;
    }

    fn created(keys: &JwtKeys, number: u64) -> u64 {
        keys.lock_held()[TD][&number].created
    }

    fn kid(keys: &JwtKeys, number: u64) -> String {
        keys.lock_held()[TD][&number].key.kid().to_owned()
    }

    #[tokio::test]
    async fn a_key_is_created_once_stored_and_loaded_again() {
        let keystore = memory();
        let options = options(Duration::ZERO, DAY);
        let keys = JwtKeys::load(keystore.clone(), &options)
            .await
            .expect("loads");
        assert!(keys.current().by_trust_domain().is_empty());
        let mut updates = keys.subscribe();
        keys.ensure(TD).await.expect("creates");
        assert!(updates.has_changed().expect("open"));
        let kid = keys.current().by_trust_domain()[TD].keys()[0]
            .kid()
            .to_owned();
        updates.borrow_and_update();
        keys.ensure(TD).await.expect("kept");
        assert!(
            !updates.has_changed().expect("open"),
            "no change, no update"
        );
        assert!(keystore
            .get_secret("jwt-svid/example.org/1")
            .expect("reads")
            .is_some());
        let record = keystore
            .get_public("jwt-svid/example.org/1.json")
            .expect("reads")
            .expect("a record beside the key");
        parse_record("record", &record).expect("a creation time");

        let again = JwtKeys::load(keystore.clone(), &options)
            .await
            .expect("loads");
        assert!(again.current().get(TD, &kid).is_some());
        let signer = again.signer(TD, Instant::now()).await.expect("signs");
        assert_eq!(signer.kid(), kid);
    }

    #[tokio::test]
    async fn another_writers_key_is_adopted() {
        let keystore = memory();
        let options = options(Duration::ZERO, DAY);
        let first = JwtKeys::load(keystore.clone(), &options)
            .await
            .expect("loads");
        let second = JwtKeys::load(keystore.clone(), &options)
            .await
            .expect("loads");
        first.ensure(TD).await.expect("creates");
        second.ensure(TD).await.expect("adopts");
        assert_eq!(first.current(), second.current());
        assert_eq!(first.status()[0].created, second.status()[0].created);
    }

    #[tokio::test]
    async fn a_new_key_signs_only_after_ack_after() {
        let keys = JwtKeys::load(memory(), &options(Duration::from_millis(300), DAY))
            .await
            .expect("loads");
        let start = Instant::now();
        let err = keys
            .signer(TD, start + Duration::from_millis(10))
            .await
            .expect_err("too soon");
        assert!(matches!(err, JwtKeysError::NotYetUsable { .. }), "{err}");
        assert!(
            !keys.current().by_trust_domain().is_empty(),
            "published at once"
        );
        keys.signer(TD, start + Duration::from_secs(10))
            .await
            .expect("signs");
        assert!(Instant::now() >= start + Duration::from_millis(300));
    }

    #[tokio::test]
    async fn a_trust_domain_that_cannot_name_an_entry_is_refused() {
        let keys = JwtKeys::load(memory(), &options(Duration::ZERO, DAY))
            .await
            .expect("loads");
        let err = keys.ensure("a/../b").await.expect_err("refused");
        assert!(
            matches!(err, JwtKeysError::InvalidTrustDomain { .. }),
            "{err}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_key_is_published_before_it_signs_and_the_old_one_leaves_after_its_tokens() {
        let ack_after = Duration::from_secs(1);
        let options = options(ack_after, 10 * DAY);
        let schedule = Schedule {
            ack_after,
            lifetime: 10 * DAY,
        };
        let clock = paused_clock();
        let keystore = memory();
        let keys = load(&keystore, &options, &clock).await;
        let _rotation = keys.spawn_rotation();
        keys.ensure(TD).await.expect("creates");
        let first = kid(&keys, 1);
        tokio::time::sleep(ack_after).await;
        assert_eq!(signing_now(&keys).await.as_deref(), Some(first.as_str()));

        // Just before the successor is due: one key.
        let due = schedule.successor_due(created(&keys, 1));
        advance_to(&clock, due - 1).await;
        assert_eq!(bundle(&keys), [first.as_str()]);

        // The rotation task creates it at once, and it is published before it signs.
        let mut updates = keys.subscribe();
        updates.borrow_and_update();
        advance_to(&clock, due).await;
        updates.changed().await.expect("the successor is published");
        let second = kid(&keys, 2);
        let mut both = vec![first.clone(), second.clone()];
        both.sort();
        assert_eq!(bundle(&keys), both);
        assert_eq!(
            signing_now(&keys).await.as_deref(),
            Some(first.as_str()),
            "the old key signs until the new one is ackAfter old"
        );
        // A token the old key signs now, for the longest lifetime a registration may have.
        let key1 = keys.signer(TD, Instant::now()).await.expect("signs");
        let iat = clock() / 1000;
        let exp = iat + MAX_JWT_SVID_EXPIRY.as_secs();
        let token =
            mint(&key1, "spiffe://example.org/w", &["a".to_owned()], iat, exp).expect("mints");
        let validates = |keys: &JwtKeys, now_ms: u64| {
            let set = keys.current();
            validate(
                &token,
                "a",
                &|td: &str, kid: &str| set.get(td, kid),
                now_ms / 1000,
            )
            .is_ok()
        };

        tokio::time::sleep(ack_after).await;
        assert_eq!(signing_now(&keys).await.as_deref(), Some(second.as_str()));
        assert!(validates(&keys, clock()), "after the rotation");

        // The old key stays until every token it may have signed has expired.
        let retires = schedule.retires_at(created(&keys, 1));
        assert!(retires >= exp * 1000, "after the last token it signed");
        advance_to(&clock, retires - 1).await;
        keys.tick().await.expect("a round");
        assert_eq!(bundle(&keys), both);
        assert!(keystore
            .get_secret("jwt-svid/example.org/1")
            .expect("reads")
            .is_some());

        // Then it leaves the bundles and the keystore.
        let mut updates = keys.subscribe();
        updates.borrow_and_update();
        advance_to(&clock, retires).await;
        updates
            .changed()
            .await
            .expect("the retirement is published");
        assert_eq!(bundle(&keys), [second.as_str()]);
        assert!(
            !validates(&keys, clock()),
            "a retired key validates nothing"
        );
        // The task deletes it after publishing, in the same round: the next round waits for it.
        keys.tick().await.expect("a round");
        assert_eq!(
            keystore.list("jwt-svid/").expect("lists"),
            ["jwt-svid/example.org/2", "jwt-svid/example.org/2.json"]
        );
        let status = keys.status();
        assert_eq!(status.len(), 1);
        assert_eq!(status[0].kid, second);
        assert!(status[0].signing);
    }

    #[tokio::test(start_paused = true)]
    async fn no_key_signs_past_its_lifetime() {
        let ack_after = Duration::from_secs(1);
        let options = options(ack_after, HOUR);
        let schedule = Schedule {
            ack_after,
            lifetime: HOUR,
        };
        let clock = paused_clock();
        let keystore = memory();
        let keys = load(&keystore, &options, &clock).await;
        keys.ensure(TD).await.expect("creates");
        tokio::time::sleep(ack_after).await;
        // No rotation task and no request for a long time: the key is past its signing.
        advance_to(&clock, schedule.signs_until(created(&keys, 1))).await;
        let start = Instant::now();
        let signer = keys
            .signer(TD, start + Duration::from_secs(10))
            .await
            .expect("signs once the successor may");
        assert_eq!(signer.kid(), kid(&keys, 2));
        assert_eq!(
            Instant::now(),
            start + ack_after,
            "waited for the successor"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn two_replicas_on_one_keystore_agree_on_the_signer_and_the_bundle() {
        let ack_after = Duration::from_secs(1);
        let options = options(ack_after, 10 * DAY);
        let schedule = Schedule {
            ack_after,
            lifetime: 10 * DAY,
        };
        let clock = paused_clock();
        let keystore = memory();
        let a = load(&keystore, &options, &clock).await;
        let b = load(&keystore, &options, &clock).await;
        a.ensure(TD).await.expect("creates");
        b.ensure(TD).await.expect("adopts");
        assert_eq!(a.current(), b.current());
        tokio::time::sleep(ack_after).await;
        assert_eq!(signing_now(&a).await, signing_now(&b).await);

        advance_to(&clock, schedule.successor_due(created(&a, 1))).await;
        // Both race for the successor: one creates it, the other adopts it.
        let (ra, rb) = tokio::join!(a.tick(), b.tick());
        ra.expect("a round");
        rb.expect("a round");
        assert_eq!(a.current(), b.current());
        assert_eq!(bundle(&a).len(), 2);
        assert_eq!(created(&a, 2), created(&b, 2));
        assert_eq!(signing_now(&a).await, Some(kid(&a, 1)));
        assert_eq!(signing_now(&b).await, Some(kid(&a, 1)));
        tokio::time::sleep(ack_after).await;
        assert_eq!(signing_now(&a).await, Some(kid(&a, 2)));
        assert_eq!(signing_now(&b).await, Some(kid(&a, 2)));

        advance_to(&clock, schedule.retires_at(created(&a, 1))).await;
        let (ra, rb) = tokio::join!(a.tick(), b.tick());
        ra.expect("a round");
        rb.expect("retiring what the other deleted is fine");
        assert_eq!(a.current(), b.current());
        assert_eq!(bundle(&a), [kid(&a, 2)]);
        assert_eq!(
            keystore.list("jwt-svid/").expect("lists"),
            ["jwt-svid/example.org/2", "jwt-svid/example.org/2.json"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_that_first_needs_a_trust_domain_adopts_its_current_keys() {
        let ack_after = Duration::from_secs(1);
        let options = options(ack_after, 10 * DAY);
        let schedule = Schedule {
            ack_after,
            lifetime: 10 * DAY,
        };
        let clock = paused_clock();
        let keystore = memory();
        let a = load(&keystore, &options, &clock).await;
        let b = load(&keystore, &options, &clock).await;
        a.ensure(TD).await.expect("creates");
        advance_to(&clock, schedule.successor_due(created(&a, 1))).await;
        a.tick().await.expect("a round");
        advance_to(&clock, schedule.retires_at(created(&a, 1))).await;
        a.tick().await.expect("a round");
        assert_eq!(bundle(&a), [kid(&a, 2)]);
        // Key 1 is gone: b must not create a new key 1, but take key 2.
        b.ensure(TD).await.expect("adopts");
        assert_eq!(a.current(), b.current());
    }

    /// Restarts (a new `load` on the same keystore) in every phase of a rotation continue it.
    #[tokio::test(start_paused = true)]
    async fn a_restart_in_every_phase_continues_the_rotation() {
        let ack_after = Duration::from_secs(1);
        let options = options(ack_after, 10 * DAY);
        let schedule = Schedule {
            ack_after,
            lifetime: 10 * DAY,
        };
        let clock = paused_clock();
        let keystore = memory();
        let keys = load(&keystore, &options, &clock).await;

        // Key 1 created, not signing yet: after a restart it is published and signs ackAfter later.
        keys.ensure(TD).await.expect("creates");
        let first = kid(&keys, 1);
        let created1 = created(&keys, 1);
        drop(keys);
        let keys = load(&keystore, &options, &clock).await;
        assert_eq!(bundle(&keys), [first.as_str()]);
        assert_eq!(created(&keys, 1), created1, "the stored creation time");
        assert_eq!(signing_now(&keys).await, None);
        tokio::time::sleep(ack_after).await;
        assert_eq!(signing_now(&keys).await, Some(first.clone()));

        // Key 2 created and published, not signing yet (as if killed right after creating it):
        // the restart publishes both, and key 2 signs ackAfter later.
        advance_to(&clock, schedule.successor_due(created1)).await;
        keys.ensure(TD).await.expect("creates the successor");
        let second = kid(&keys, 2);
        drop(keys);
        let keys = load(&keystore, &options, &clock).await;
        assert_eq!(bundle(&keys).len(), 2);
        tokio::time::sleep(ack_after).await;
        assert_eq!(signing_now(&keys).await, Some(second.clone()));

        // Key 2 signing, key 1 waiting for retirement: both stay over a restart.
        advance_to(&clock, schedule.retires_at(created1) - 1).await;
        drop(keys);
        let keys = load(&keystore, &options, &clock).await;
        assert_eq!(bundle(&keys).len(), 2);

        // Past retirement while down: the start retires key 1.
        advance_to(&clock, schedule.retires_at(created1)).await;
        drop(keys);
        let keys = load(&keystore, &options, &clock).await;
        assert_eq!(bundle(&keys), [second.as_str()]);
        assert_eq!(keystore.list("jwt-svid/").expect("lists").len(), 2);

        // Down past key 2's whole lifetime: the start creates key 3, which signs ackAfter later;
        // key 2 does not sign past its lifetime.
        let created2 = created(&keys, 2);
        advance_to(&clock, schedule.signs_until(created2)).await;
        drop(keys);
        let keys = load(&keystore, &options, &clock).await;
        assert_eq!(bundle(&keys).len(), 2, "key 3 is published at the start");
        assert_eq!(signing_now(&keys).await, None);
        tokio::time::sleep(ack_after).await;
        assert_eq!(signing_now(&keys).await, Some(kid(&keys, 3)));
    }

    #[tokio::test(start_paused = true)]
    async fn what_a_kill_leaves_is_finished_at_the_start() {
        let options = options(Duration::ZERO, 10 * DAY);
        let clock = paused_clock();
        let keystore = memory();

        // A key from before rotation: no record. It gets one saying "now", once.
        let legacy = JwtSigningKey::generate().expect("a key");
        keystore
            .put_secret("jwt-svid/example.org/1", legacy.pkcs8().expect("software"))
            .expect("writes");
        let keys = load(&keystore, &options, &clock).await;
        assert_eq!(bundle(&keys), [legacy.kid().to_owned()]);
        assert_eq!(created(&keys, 1), clock());
        tokio::time::advance(HOUR).await;
        let again = load(&keystore, &options, &clock).await;
        assert_eq!(created(&again, 1), created(&keys, 1), "written once");

        // A retirement cut short after the key was deleted: its record goes at the next start.
        let newer = JwtSigningKey::generate().expect("a key");
        keystore
            .create_if_absent(&[
                NewEntry::secret("jwt-svid/example.org/2", newer.pkcs8().expect("software")),
                NewEntry::public("jwt-svid/example.org/2.json", &record_bytes(clock())),
            ])
            .expect("writes");
        keystore.delete("jwt-svid/example.org/1").expect("deletes");
        let keys = load(&keystore, &options, &clock).await;
        assert_eq!(bundle(&keys), [newer.kid().to_owned()]);
        assert_eq!(
            keystore.list("jwt-svid/").expect("lists"),
            ["jwt-svid/example.org/2", "jwt-svid/example.org/2.json"]
        );
    }

    #[tokio::test]
    async fn a_damaged_record_is_an_error_naming_it() {
        let keystore = memory();
        let key = JwtSigningKey::generate().expect("a key");
        keystore
            .put_secret("jwt-svid/example.org/1", key.pkcs8().expect("software"))
            .expect("writes");
        keystore
            .put_public("jwt-svid/example.org/1.json", b"{\"created\": 1}")
            .expect("writes");
        let err = JwtKeys::load(keystore, &options(Duration::ZERO, DAY))
            .await
            .expect_err("refused");
        assert!(
            err.to_string().contains("jwt-svid/example.org/1.json"),
            "{err}"
        );
    }
}
