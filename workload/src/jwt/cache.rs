//! Signed JWT-SVIDs kept for reuse, so that a workload asking again for the same token does not make
//! the host sign again, in a bounded amount of memory.

use std::collections::{BTreeMap, HashMap};

use meshca_identity::SpiffeId;

/// What a cached token answers: one workload's token for a set of audiences, signed by one key.
/// Audiences are sorted and deduplicated, so that the order a request lists them in does not matter.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct CacheKey {
    spiffe_id: SpiffeId,
    kid: String,
    audiences: Vec<String>,
}

impl CacheKey {
    fn new(spiffe_id: &SpiffeId, kid: &str, audiences: &[String]) -> CacheKey {
        let mut audiences = audiences.to_vec();
        audiences.sort_unstable();
        audiences.dedup();
        CacheKey {
            spiffe_id: spiffe_id.clone(),
            kid: kid.to_owned(),
            audiences,
        }
    }
}

#[derive(Debug)]
struct Entry {
    token: String,
    issued_at: u64,
    expires_at: u64,
    /// The entry's place in [`JwtSvidCache::recency`].
    last_used: u64,
}

impl Entry {
    /// Whether more than half of the token's lifetime remains at `now`.
    fn is_fresh(&self, now: u64) -> bool {
        let lifetime = u128::from(self.expires_at.saturating_sub(self.issued_at));
        let remaining = u128::from(self.expires_at.saturating_sub(now));
        2 * remaining > lifetime
    }
}

/// A least-recently-used cache of signed JWT-SVIDs holding at most `capacity` tokens
/// (`limits.jwtSvidCacheEntries`). A token is handed out again only while more than half of its
/// lifetime remains, so a workload always gets a token with room to use it.
#[derive(Debug)]
pub struct JwtSvidCache {
    capacity: usize,
    entries: HashMap<CacheKey, Entry>,
    /// Use counter → key, oldest first: the front is the next to evict.
    recency: BTreeMap<u64, CacheKey>,
    clock: u64,
}

impl JwtSvidCache {
    /// An empty cache of at most `capacity` tokens; with 0 it keeps nothing.
    pub fn new(capacity: usize) -> JwtSvidCache {
        JwtSvidCache {
            capacity,
            entries: HashMap::new(),
            recency: BTreeMap::new(),
            clock: 0,
        }
    }

    /// The token for `spiffe_id` signed by `kid` for `audiences` (in any order, duplicates ignored), if
    /// one is cached and more than half its lifetime remains at `now`. A token past that is dropped.
    pub fn get(
        &mut self,
        spiffe_id: &SpiffeId,
        kid: &str,
        audiences: &[String],
        now: u64,
    ) -> Option<String> {
        let key = CacheKey::new(spiffe_id, kid, audiences);
        let entry = self.entries.get_mut(&key)?;
        if !entry.is_fresh(now) {
            let last_used = entry.last_used;
            self.entries.remove(&key);
            self.recency.remove(&last_used);
            return None;
        }
        self.clock += 1;
        self.recency.remove(&entry.last_used);
        entry.last_used = self.clock;
        let token = entry.token.clone();
        self.recency.insert(self.clock, key);
        Some(token)
    }

    /// Keeps `token` (issued at `issued_at`, expiring at `expires_at`) for `spiffe_id`, `kid` and
    /// `audiences`, replacing an earlier one for the same; when the cache is full, the least recently
    /// used token is dropped.
    pub fn insert(
        &mut self,
        spiffe_id: &SpiffeId,
        kid: &str,
        audiences: &[String],
        token: String,
        issued_at: u64,
        expires_at: u64,
    ) {
        if self.capacity == 0 {
            return;
        }
        let key = CacheKey::new(spiffe_id, kid, audiences);
        if let Some(old) = self.entries.remove(&key) {
            self.recency.remove(&old.last_used);
        } else if self.entries.len() >= self.capacity {
            if let Some((_, oldest)) = self.recency.pop_first() {
                self.entries.remove(&oldest);
            }
        }
        self.clock += 1;
        self.recency.insert(self.clock, key.clone());
        self.entries.insert(
            key,
            Entry {
                token,
                issued_at,
                expires_at,
                last_used: self.clock,
            },
        );
    }

    /// How many tokens are cached.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The most tokens the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(path: &str) -> SpiffeId {
        SpiffeId::parse(&format!("spiffe://example.org/{path}")).expect("valid id")
    }

    fn auds(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn audiences_match_in_any_order_and_without_duplicates() {
        let mut cache = JwtSvidCache::new(4);
        cache.insert(&id("web"), "k1", &auds(&["b", "a"]), "t".into(), 100, 200);
        assert_eq!(
            cache.get(&id("web"), "k1", &auds(&["a", "b", "a"]), 100),
            Some("t".to_owned())
        );
        assert_eq!(cache.get(&id("web"), "k1", &auds(&["a"]), 100), None);
        assert_eq!(cache.get(&id("web"), "k2", &auds(&["a", "b"]), 100), None);
        assert_eq!(cache.get(&id("db"), "k1", &auds(&["a", "b"]), 100), None);
    }

    #[test]
    fn a_token_is_reused_only_while_more_than_half_its_lifetime_remains() {
        let mut cache = JwtSvidCache::new(4);
        let a = auds(&["a"]);
        cache.insert(&id("web"), "k", &a, "t".into(), 100, 200);
        assert!(
            cache.get(&id("web"), "k", &a, 149).is_some(),
            "51 of 100 s left"
        );
        assert!(
            cache.get(&id("web"), "k", &a, 150).is_none(),
            "exactly half left"
        );
        assert!(cache.is_empty(), "a stale token is dropped");
        cache.insert(&id("web"), "k", &a, "t".into(), 100, 200);
        assert!(cache.get(&id("web"), "k", &a, 500).is_none(), "expired");
    }

    #[test]
    fn the_least_recently_used_token_is_evicted() {
        let mut cache = JwtSvidCache::new(2);
        let a = auds(&["a"]);
        cache.insert(&id("one"), "k", &a, "1".into(), 0, 100);
        cache.insert(&id("two"), "k", &a, "2".into(), 0, 100);
        assert!(
            cache.get(&id("one"), "k", &a, 0).is_some(),
            "one is now the most recent"
        );
        cache.insert(&id("three"), "k", &a, "3".into(), 0, 100);
        assert_eq!(cache.len(), 2);
        assert!(
            cache.get(&id("two"), "k", &a, 0).is_none(),
            "two was evicted"
        );
        assert!(cache.get(&id("one"), "k", &a, 0).is_some());
        assert!(cache.get(&id("three"), "k", &a, 0).is_some());
    }

    #[test]
    fn replacing_a_token_does_not_evict_another() {
        let mut cache = JwtSvidCache::new(2);
        let a = auds(&["a"]);
        cache.insert(&id("one"), "k", &a, "1".into(), 0, 100);
        cache.insert(&id("two"), "k", &a, "2".into(), 0, 100);
        cache.insert(&id("one"), "k", &a, "1b".into(), 0, 100);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(&id("one"), "k", &a, 0), Some("1b".to_owned()));
        assert_eq!(cache.get(&id("two"), "k", &a, 0), Some("2".to_owned()));
        assert_eq!(cache.recency.len(), cache.entries.len());
    }

    #[test]
    fn capacity_zero_keeps_nothing() {
        let mut cache = JwtSvidCache::new(0);
        cache.insert(&id("one"), "k", &auds(&["a"]), "1".into(), 0, 100);
        assert!(cache.is_empty());
        assert_eq!(cache.capacity(), 0);
    }
}
