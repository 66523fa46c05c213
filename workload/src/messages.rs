//! Messages encoded once for every stream whose caller matches the same registrations.
//!
//! Two streams whose callers match the same registrations, in the same order, are sent the same message
//! for the same [`Fingerprint`]: a service's many processes share their registration. Building it (the
//! SVIDs' keys decoded, the bundles gathered) and encoding it was most of the daemon's CPU while a
//! rotation reached 100,000 such streams; the first stream to need a message now builds it, and the
//! others send its bytes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use meshca_control::{KeyHasher, Registration, Registrations};
use meshca_serve::frames::Encoded;

use crate::x509::Fingerprint;

/// The messages built lately, by the registrations they were built for.
///
/// Bounded: an entry is replaced when its registrations' content changes (a new fingerprint), every
/// entry goes when the registration table changes (no message of a removed registration stays), and
/// the entries are kept in two generations of [`MessageCache::GENERATION_BYTES`] each: when the current
/// one is full it becomes the previous and the older one is dropped; a hit moves its entry up. A
/// message's bytes are zeroized when the last stream sending it lets it go ([`Encoded`]).
pub(crate) struct MessageCache<M> {
    inner: Mutex<Generations<M>>,
}

struct Generations<M> {
    /// The registration table the entries were built under.
    table: Option<Arc<Registrations>>,
    current: Generation<M>,
    previous: Generation<M>,
}

struct Generation<M> {
    /// By the addresses of the registrations, in order (the entry holds them: an address cannot be
    /// reused while it is a key).
    entries: HashMap<Box<[usize]>, Entry<M>, KeyHasher>,
    bytes: usize,
}

struct Entry<M> {
    _registrations: Vec<Arc<Registration>>,
    fingerprint: Fingerprint,
    message: Encoded<M>,
}

impl<M> Default for Generation<M> {
    fn default() -> Self {
        Generation {
            entries: HashMap::default(),
            bytes: 0,
        }
    }
}

impl<M> Generation<M> {
    fn insert(&mut self, key: Box<[usize]>, entry: Entry<M>) {
        self.bytes += entry.message.len();
        if let Some(replaced) = self.entries.insert(key, entry) {
            self.bytes -= replaced.message.len();
        }
    }

    fn remove(&mut self, key: &[usize]) -> Option<Entry<M>> {
        let entry = self.entries.remove(key)?;
        self.bytes -= entry.message.len();
        Some(entry)
    }
}

/// The key of `registrations`: their addresses, in order.
fn key_of(registrations: &[Arc<Registration>]) -> Box<[usize]> {
    registrations
        .iter()
        .map(|r| Arc::as_ptr(r) as usize)
        .collect()
}

impl<M> Default for MessageCache<M> {
    fn default() -> Self {
        MessageCache {
            inner: Mutex::new(Generations {
                table: None,
                current: Generation::default(),
                previous: Generation::default(),
            }),
        }
    }
}

impl<M> MessageCache<M> {
    /// Encoded messages per generation: room for thousands of registrations' messages, and a bound on
    /// what the cache holds (twice this, and one message more).
    const GENERATION_BYTES: usize = 4 * 1024 * 1024;

    /// The message built for `registrations` (of `table`) from content of `fingerprint`, if one was.
    pub(crate) fn get(
        &self,
        table: &Arc<Registrations>,
        registrations: &[Arc<Registration>],
        fingerprint: &Fingerprint,
    ) -> Option<Encoded<M>> {
        let key = key_of(registrations);
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.under(table);
        if let Some(entry) = inner.current.entries.get(&key) {
            return (entry.fingerprint == *fingerprint).then(|| entry.message.clone());
        }
        let entry = inner.previous.entries.get(&key)?;
        if entry.fingerprint != *fingerprint {
            return None;
        }
        let message = entry.message.clone();
        let entry = inner.previous.remove(&key)?;
        inner.insert(key, entry);
        Some(message)
    }

    /// Keeps `message`, built for `registrations` (of `table`) from content of `fingerprint`, in place
    /// of what was built for them before.
    pub(crate) fn insert(
        &self,
        table: &Arc<Registrations>,
        registrations: &[Arc<Registration>],
        fingerprint: Fingerprint,
        message: Encoded<M>,
    ) {
        let key = key_of(registrations);
        let entry = Entry {
            _registrations: registrations.to_vec(),
            fingerprint,
            message,
        };
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.under(table);
        inner.insert(key, entry);
    }

    /// The entries held and their bytes, for tests.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        (
            inner.current.entries.len() + inner.previous.entries.len(),
            inner.current.bytes + inner.previous.bytes,
        )
    }
}

impl<M> Generations<M> {
    /// Drops every entry when the registration table is not the one they were built under.
    fn under(&mut self, table: &Arc<Registrations>) {
        if self.table.as_ref().is_some_and(|t| Arc::ptr_eq(t, table)) {
            return;
        }
        self.table = Some(table.clone());
        self.current = Generation::default();
        self.previous = Generation::default();
    }

    /// Keeps `entry` in the current generation, in place of any other under `key`.
    fn insert(&mut self, key: Box<[usize]>, entry: Entry<M>) {
        self.current.remove(&key);
        self.previous.remove(&key);
        if self.current.bytes >= MessageCache::<M>::GENERATION_BYTES {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(key, entry);
    }
}

#[cfg(test)]
mod tests {
    use meshca_control::{LeafKey, ProxyIdentity, ProxyKey, SecretPem};

    use super::*;
    use crate::proto::{X509Svid, X509SvidResponse};

    fn registration(name: &str) -> Arc<Registration> {
        Arc::new(Registration {
            name: name.into(),
            proxy: ProxyKey::new("default", name),
            selectors: vec![],
            agent: None,
            hint: None,
            jwt_svid_expiry: std::time::Duration::from_secs(300),
            labels: Default::default(),
        })
    }

    fn identity(name: &str) -> Arc<ProxyIdentity> {
        Arc::new(ProxyIdentity {
            spiffe_id: format!("spiffe://example.org/{name}"),
            identity_name: None,
            chain_pem: String::new(),
            key: LeafKey::Held(SecretPem::new(String::new())),
        })
    }

    /// A message of `len` bytes and more, telling `name` apart.
    fn message(name: &str, len: usize) -> Encoded<X509SvidResponse> {
        Encoded::new(&X509SvidResponse {
            svids: vec![X509Svid {
                spiffe_id: name.to_owned(),
                x509_svid: vec![7; len],
                ..Default::default()
            }],
            ..Default::default()
        })
        .expect("frames")
    }

    fn new_table() -> Arc<Registrations> {
        Arc::new(Registrations::new(vec![]))
    }

    #[test]
    fn a_message_is_found_for_the_same_registrations_and_content_only() {
        let cache = MessageCache::default();
        let table = new_table();
        let (a, b) = (registration("a"), registration("b"));
        let (id_a, id_b) = (identity("a"), identity("b"));
        let content = Fingerprint::of_identities(&[id_a.clone(), id_b.clone()]);
        let both = [a.clone(), b.clone()];
        let sent = message("a and b", 10);
        cache.insert(&table, &both, content.clone(), sent.clone());

        let found = cache.get(&table, &both, &content).expect("the same");
        assert_eq!(
            found.frame().as_ptr(),
            sent.frame().as_ptr(),
            "the same frame"
        );
        // Other content of the same registrations (a renewal), another order, another registration
        // of equal content, a subset: none is this message.
        let renewed = Fingerprint::of_identities(&[id_a.clone(), identity("b")]);
        assert!(cache.get(&table, &both, &renewed).is_none());
        assert!(cache
            .get(&table, &[b.clone(), a.clone()], &content)
            .is_none());
        assert!(cache
            .get(&table, &[a.clone(), registration("b")], &content)
            .is_none());
        assert!(cache
            .get(&table, std::slice::from_ref(&a), &content)
            .is_none());

        // The renewal's message takes the place of the first.
        cache.insert(&table, &both, renewed.clone(), message("renewed", 10));
        assert!(cache.get(&table, &both, &content).is_none());
        assert!(cache.get(&table, &both, &renewed).is_some());
        assert_eq!(cache.held().0, 1);

        // Another registration table: nothing built under the old one is sent.
        assert!(cache.get(&new_table(), &both, &renewed).is_none());
        assert_eq!(cache.held(), (0, 0));
    }

    #[test]
    fn the_cache_keeps_two_generations_of_bytes_and_what_is_used_moves_up() {
        let cache = MessageCache::default();
        let table = new_table();
        let len = 64 * 1024;
        let per_generation = MessageCache::<X509SvidResponse>::GENERATION_BYTES / len;
        let registrations: Vec<_> = (0..3 * per_generation + 3)
            .map(|i| registration(&i.to_string()))
            .collect();
        let content = Fingerprint::of_identities(&[identity("a")]);
        let first = &registrations[..1];
        for (i, r) in registrations.iter().enumerate() {
            cache.insert(
                &table,
                std::slice::from_ref(r),
                content.clone(),
                message("m", len),
            );
            // The first stays in use all along: each generation keeps it.
            assert!(cache.get(&table, first, &content).is_some(), "after {i}");
            let (_, bytes) = cache.held();
            assert!(
                bytes <= 2 * (MessageCache::<X509SvidResponse>::GENERATION_BYTES + len + 64),
                "{bytes} bytes held after {i}"
            );
        }
        // Those not used for two generations are gone.
        let second = std::slice::from_ref(&registrations[1]);
        assert!(cache.get(&table, second, &content).is_none());
        let last = std::slice::from_ref(registrations.last().expect("some"));
        assert!(cache.get(&table, last, &content).is_some());
    }
}
