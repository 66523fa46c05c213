//! The JWT signing keys of every trust domain meshca issues JWT-SVIDs in, kept like CA keys.
//!
//! **Storage.** Each trust domain has one key, an ECDSA P-256 private key (PKCS#8) stored as the
//! secret `jwt-svid/<trust domain>/1` in the daemon's keystore (sealed when the keystore is the
//! database). At start every stored key is loaded. A trust domain's key is created when it is first
//! needed: when a caller of a Workload API method matches a registration whose identity (the SPIFFE
//! ID of its X.509-SVID) is in that trust domain. The creation goes through
//! [`Keystore::create_if_absent`], so replicas sharing one database agree on one key: the one that
//! loses the race adopts the winner's. Keystore I/O runs on the blocking pool.
//!
//! **Ordering.** A key is published to every `FetchJWTBundles` stream at once (the streams follow
//! [`JwtKeys::subscribe`]), and it signs only once [`WorkloadOptions::ack_after`] has passed since this
//! process first published it: the time a Workload API message needs to count as applied for the
//! rollout gate. So no verifier that follows its bundles is handed a token whose key it could not
//! have. A `FetchJWTSVID` that needs a brand-new key waits that long (bounded by the identity wait).
//!
//! **No rotation yet.** One key per trust domain, kept for as long as the keystore keeps it: there is
//! no key rotation, so the rule that an old key stays in the bundle until the last token it signed
//! expires holds trivially.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use meshca_keystore::{Creation, Keystore, KeystoreError, NewEntry};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::jwt::{JwksDocument, JwtError, JwtPublicKey, JwtSigningKey};
#[cfg(doc)]
use crate::options::WorkloadOptions;

/// Where the keys live in the keystore: `jwt-svid/<trust domain>/<number>`.
const PREFIX: &str = "jwt-svid/";
/// The number of the one key a trust domain has (there is no rotation yet).
const KEY_NUMBER: &str = "1";

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
    /// The JWK Set of each trust domain that has keys, by bare trust domain name.
    pub fn by_trust_domain(&self) -> &BTreeMap<String, JwksDocument> {
        &self.by_trust_domain
    }

    /// The key `kid` of `trust_domain`, if it is published.
    pub fn get(&self, trust_domain: &str, kid: &str) -> Option<JwtPublicKey> {
        self.by_trust_domain.get(trust_domain)?.get(kid).cloned()
    }
}

/// A key this process holds, and when it may first sign.
struct Held {
    key: Arc<JwtSigningKey>,
    usable_at: Instant,
}

struct Inner {
    keystore: Arc<dyn Keystore>,
    ack_after: Duration,
    held: Mutex<HashMap<String, Held>>,
    published: watch::Sender<Arc<KeySet>>,
    /// Serializes creations in this process, so two requests do not both generate a key.
    creating: tokio::sync::Mutex<()>,
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

fn entry_name(trust_domain: &str) -> Result<String, JwtKeysError> {
    let name = format!("{PREFIX}{trust_domain}/{KEY_NUMBER}");
    meshca_keystore::validate_name(&name).map_err(|_| JwtKeysError::InvalidTrustDomain {
        trust_domain: trust_domain.to_owned(),
    })?;
    Ok(name)
}

fn parse(name: &str, pkcs8: &[u8]) -> Result<JwtSigningKey, JwtKeysError> {
    JwtSigningKey::from_pkcs8(pkcs8).map_err(|source| JwtKeysError::Key {
        name: name.to_owned(),
        source,
    })
}

impl JwtKeys {
    /// Loads every key stored in `keystore`. Each one is published now and signs from `ack_after`
    /// on (see the module docs).
    pub async fn load(
        keystore: Arc<dyn Keystore>,
        ack_after: Duration,
    ) -> Result<JwtKeys, JwtKeysError> {
        let loaded = {
            let keystore = keystore.clone();
            tokio::task::spawn_blocking(move || load_all(keystore.as_ref()))
                .await
                .map_err(|_| JwtKeysError::TaskFailed {
                    name: PREFIX.to_owned(),
                })??
        };
        let usable_at = Instant::now() + ack_after;
        let held: HashMap<String, Held> = loaded
            .into_iter()
            .map(|(td, key)| {
                (
                    td,
                    Held {
                        key: Arc::new(key),
                        usable_at,
                    },
                )
            })
            .collect();
        let (published, _) = watch::channel(Arc::new(key_set(&held)));
        Ok(JwtKeys {
            inner: Arc::new(Inner {
                keystore,
                ack_after,
                held: Mutex::new(held),
                published,
                creating: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// The published keys, changed whenever a key is added.
    pub fn subscribe(&self) -> watch::Receiver<Arc<KeySet>> {
        self.inner.published.subscribe()
    }

    /// The keys published now.
    pub fn current(&self) -> Arc<KeySet> {
        self.inner.published.borrow().clone()
    }

    /// Makes sure `trust_domain` has a key: loads the stored one, or creates and stores one (adopting
    /// another replica's if it was first), and publishes it.
    pub async fn ensure(&self, trust_domain: &str) -> Result<(), JwtKeysError> {
        if self.held(trust_domain).is_some() {
            return Ok(());
        }
        let _creating = self.inner.creating.lock().await;
        if self.held(trust_domain).is_some() {
            return Ok(());
        }
        let name = entry_name(trust_domain)?;
        let keystore = self.inner.keystore.clone();
        let key = {
            let name = name.clone();
            tokio::task::spawn_blocking(move || create_or_adopt(keystore.as_ref(), &name))
        }
        .await
        .map_err(|_| JwtKeysError::TaskFailed { name: name.clone() })??;
        tracing::info!(trust_domain, kid = key.kid(), entry = %name, "JWT signing key published");
        let mut held = self
            .inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        held.insert(
            trust_domain.to_owned(),
            Held {
                key: Arc::new(key),
                usable_at: Instant::now() + self.inner.ack_after,
            },
        );
        self.inner.published.send_replace(Arc::new(key_set(&held)));
        Ok(())
    }

    /// The key that signs for `trust_domain`, created if needed; waits until it may sign, but not
    /// past `deadline`.
    pub async fn signer(
        &self,
        trust_domain: &str,
        deadline: Instant,
    ) -> Result<Arc<JwtSigningKey>, JwtKeysError> {
        self.ensure(trust_domain).await?;
        let (key, usable_at) =
            self.held(trust_domain)
                .ok_or_else(|| JwtKeysError::NotYetUsable {
                    trust_domain: trust_domain.to_owned(),
                })?;
        if usable_at > deadline {
            return Err(JwtKeysError::NotYetUsable {
                trust_domain: trust_domain.to_owned(),
            });
        }
        tokio::time::sleep_until(usable_at).await;
        Ok(key)
    }

    fn held(&self, trust_domain: &str) -> Option<(Arc<JwtSigningKey>, Instant)> {
        let held = self
            .inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        held.get(trust_domain).map(|h| (h.key.clone(), h.usable_at))
    }
}

fn key_set(held: &HashMap<String, Held>) -> KeySet {
    KeySet {
        by_trust_domain: held
            .iter()
            .map(|(td, h)| (td.clone(), JwksDocument::new([h.key.public()])))
            .collect(),
    }
}

/// Every stored key, by trust domain.
fn load_all(keystore: &dyn Keystore) -> Result<Vec<(String, JwtSigningKey)>, JwtKeysError> {
    let names = keystore
        .list(PREFIX)
        .map_err(|source| JwtKeysError::Keystore {
            name: PREFIX.to_owned(),
            source,
        })?;
    let mut keys = Vec::new();
    for name in names {
        let Some((td, number)) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split_once('/'))
        else {
            continue;
        };
        if number != KEY_NUMBER {
            tracing::warn!(entry = %name, "ignoring a JWT signing key entry this version does not use");
            continue;
        }
        let secret = keystore
            .get_secret(&name)
            .map_err(|source| JwtKeysError::Keystore {
                name: name.clone(),
                source,
            })?
            .ok_or_else(|| JwtKeysError::Vanished { name: name.clone() })?;
        keys.push((td.to_owned(), parse(&name, secret.expose())?));
    }
    Ok(keys)
}

/// The stored key `name`, or a new one stored under it; the keystore decides between racing writers.
fn create_or_adopt(keystore: &dyn Keystore, name: &str) -> Result<JwtSigningKey, JwtKeysError> {
    let keystore_error = |source| JwtKeysError::Keystore {
        name: name.to_owned(),
        source,
    };
    if let Some(secret) = keystore.get_secret(name).map_err(keystore_error)? {
        return parse(name, secret.expose());
    }
    let key = JwtSigningKey::generate().map_err(|source| JwtKeysError::Key {
        name: name.to_owned(),
        source,
    })?;
    match keystore
        .create_if_absent(&[NewEntry::secret(name, key.pkcs8())])
        .map_err(keystore_error)?
    {
        Creation::Created => Ok(key),
        Creation::Existing => {
            let secret = keystore
                .get_secret(name)
                .map_err(keystore_error)?
                .ok_or_else(|| JwtKeysError::Vanished {
                    name: name.to_owned(),
                })?;
            parse(name, secret.expose())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshca_keystore::MemoryKeystore;

    #[tokio::test]
    async fn a_key_is_created_once_stored_and_loaded_again() {
        let keystore: Arc<dyn Keystore> = Arc::new(MemoryKeystore::new());
        let keys = JwtKeys::load(keystore.clone(), Duration::ZERO)
            .await
            .expect("loads");
        assert!(keys.current().by_trust_domain().is_empty());
        let mut updates = keys.subscribe();
        keys.ensure("example.org").await.expect("creates");
        assert!(updates.has_changed().expect("open"));
        let kid = keys.current().by_trust_domain()["example.org"].keys()[0]
            .kid()
            .to_owned();
        updates.borrow_and_update();
        keys.ensure("example.org").await.expect("kept");
        assert!(
            !updates.has_changed().expect("open"),
            "no change, no update"
        );
        assert!(keystore
            .get_secret("jwt-svid/example.org/1")
            .expect("reads")
            .is_some());

        let again = JwtKeys::load(keystore.clone(), Duration::ZERO)
            .await
            .expect("loads");
        assert!(again.current().get("example.org", &kid).is_some());
        let signer = again
            .signer("example.org", Instant::now())
            .await
            .expect("signs");
        assert_eq!(signer.kid(), kid);
    }

    #[tokio::test]
    async fn another_writers_key_is_adopted() {
        let keystore: Arc<dyn Keystore> = Arc::new(MemoryKeystore::new());
        let first = JwtKeys::load(keystore.clone(), Duration::ZERO)
            .await
            .expect("loads");
        let second = JwtKeys::load(keystore.clone(), Duration::ZERO)
            .await
            .expect("loads");
        first.ensure("example.org").await.expect("creates");
        second.ensure("example.org").await.expect("adopts");
        assert_eq!(first.current(), second.current());
    }

    #[tokio::test]
    async fn a_new_key_signs_only_after_ack_after() {
        let keystore: Arc<dyn Keystore> = Arc::new(MemoryKeystore::new());
        let keys = JwtKeys::load(keystore, Duration::from_millis(300))
            .await
            .expect("loads");
        let start = Instant::now();
        let err = keys
            .signer("example.org", start + Duration::from_millis(10))
            .await
            .expect_err("too soon");
        assert!(matches!(err, JwtKeysError::NotYetUsable { .. }), "{err}");
        assert!(
            !keys.current().by_trust_domain().is_empty(),
            "published at once"
        );
        keys.signer("example.org", start + Duration::from_secs(10))
            .await
            .expect("signs");
        assert!(Instant::now() >= start + Duration::from_millis(300));
    }

    #[tokio::test]
    async fn a_trust_domain_that_cannot_name_an_entry_is_refused() {
        let keys = JwtKeys::load(Arc::new(MemoryKeystore::new()), Duration::ZERO)
            .await
            .expect("loads");
        let err = keys.ensure("a/../b").await.expect_err("refused");
        assert!(
            matches!(err, JwtKeysError::InvalidTrustDomain { .. }),
            "{err}"
        );
    }
}
