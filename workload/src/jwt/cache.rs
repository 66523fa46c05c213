//! Signed JWT-SVIDs kept for reuse, so that a workload asking again for the same token does not make
//! the host sign again, in a bounded amount of memory.
//!
//! A workload chooses its audiences, so it chooses how large each kept token is: up to
//! `limits.jwtAudiencesPerRequest` audiences of `limits.jwtAudienceBytes` each, written once in the
//! token and once in its key. The cache is therefore bounded in bytes as well as in tokens, in all and
//! per identity, so that one workload asking for many long distinct audiences evicts its own tokens
//! first and can never grow the daemon past [`CacheLimits::bytes`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use meshca_identity::SpiffeId;

/// How much the cache may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    /// Tokens kept at most (`limits.jwtSvidCacheEntries`); 0 keeps nothing.
    pub entries: usize,
    /// Bytes kept at most, as [`TokenShape::cost`] counts them (`limits.jwtSvidCacheBytes`).
    pub bytes: usize,
    /// Bytes the tokens of one SPIFFE ID may take (`limits.jwtSvidCacheBytesPerIdentity`).
    pub bytes_per_identity: usize,
}

impl Default for CacheLimits {
    fn default() -> Self {
        CacheLimits {
            entries: 4096,
            bytes: 16 * 1024 * 1024,
            bytes_per_identity: 1024 * 1024,
        }
    }
}

/// Everything that shapes a token, so that two requests answered by one kept token would have been
/// signed identically (but for the time): the identity, the signing key, the audiences (sorted and
/// deduplicated, so that the order a request lists them in does not matter) and the lifetime the
/// registration asks for (`jwtSvid.expiry`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenShape {
    spiffe_id: SpiffeId,
    kid: String,
    audiences: Vec<String>,
    lifetime_secs: u64,
}

/// What one kept token costs besides its text and its key's text: the entry, its place in both
/// indexes and the allocations' headers, rounded up.
const ENTRY_OVERHEAD: usize = 256;

impl TokenShape {
    /// The shape of a token for `spiffe_id`, signed by `kid`, for `audiences` (in any order,
    /// duplicates ignored), living `lifetime_secs`.
    pub fn new(spiffe_id: &SpiffeId, kid: &str, audiences: &[String], lifetime_secs: u64) -> Self {
        let mut audiences = audiences.to_vec();
        audiences.sort_unstable();
        audiences.dedup();
        TokenShape {
            spiffe_id: spiffe_id.clone(),
            kid: kid.to_owned(),
            audiences,
            lifetime_secs,
        }
    }

    /// The bytes a token of `token_len` bytes of this shape takes in the cache.
    fn cost(&self, token_len: usize) -> usize {
        let audiences: usize = self
            .audiences
            .iter()
            .map(|a| a.len() + std::mem::size_of::<String>())
            .sum();
        token_len + self.spiffe_id.as_str().len() + self.kid.len() + audiences + ENTRY_OVERHEAD
    }
}

#[derive(Debug)]
struct Entry {
    token: String,
    issued_at: u64,
    expires_at: u64,
    /// What [`TokenShape::cost`] counted for it.
    cost: usize,
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

/// What one SPIFFE ID's tokens take.
#[derive(Debug, Default)]
struct IdentityUse {
    bytes: usize,
    /// Its entries' places in [`JwtSvidCache::recency`], oldest first.
    recency: BTreeSet<u64>,
}

/// A least-recently-used cache of signed JWT-SVIDs, within [`CacheLimits`]. A token is handed out
/// again only while more than half of its lifetime remains, so a workload always gets a token with
/// room to use it. A token larger than an identity's share is not kept at all.
#[derive(Debug)]
pub struct JwtSvidCache {
    limits: CacheLimits,
    entries: HashMap<Arc<TokenShape>, Entry>,
    /// Use counter → key, oldest first: the front is the next to evict.
    recency: BTreeMap<u64, Arc<TokenShape>>,
    identities: HashMap<SpiffeId, IdentityUse>,
    bytes: usize,
    clock: u64,
}

impl JwtSvidCache {
    /// An empty cache within `limits`.
    pub fn new(limits: CacheLimits) -> JwtSvidCache {
        JwtSvidCache {
            limits,
            entries: HashMap::new(),
            recency: BTreeMap::new(),
            identities: HashMap::new(),
            bytes: 0,
            clock: 0,
        }
    }

    /// The token of `shape`, if one is kept and more than half its lifetime remains at `now`. A token
    /// past that is dropped.
    pub fn get(&mut self, shape: &TokenShape, now: u64) -> Option<String> {
        let entry = self.entries.get(shape)?;
        if !entry.is_fresh(now) {
            let last_used = entry.last_used;
            self.remove(last_used);
            return None;
        }
        let token = entry.token.clone();
        self.touch(shape);
        Some(token)
    }

    /// Keeps `token` (issued at `issued_at`, expiring at `expires_at`) for `shape`, replacing an
    /// earlier one of the same shape; then drops the least recently used tokens of the same identity
    /// while it takes more than its share, and the least recently used of all while the cache holds
    /// more than its limits.
    pub fn insert(&mut self, shape: TokenShape, token: String, issued_at: u64, expires_at: u64) {
        if self.limits.entries == 0 {
            return;
        }
        let cost = shape.cost(token.len());
        if let Some(old) = self.entries.get(&shape) {
            let last_used = old.last_used;
            self.remove(last_used);
        }
        if cost > self.limits.bytes_per_identity.min(self.limits.bytes) {
            return;
        }
        let identity = shape.spiffe_id.clone();
        self.clock += 1;
        let shape = Arc::new(shape);
        self.recency.insert(self.clock, shape.clone());
        let used = self.identities.entry(identity.clone()).or_default();
        used.bytes += cost;
        used.recency.insert(self.clock);
        self.bytes += cost;
        self.entries.insert(
            shape,
            Entry {
                token,
                issued_at,
                expires_at,
                cost,
                last_used: self.clock,
            },
        );
        while let Some(used) = self.identities.get(&identity) {
            if used.bytes <= self.limits.bytes_per_identity {
                break;
            }
            match used.recency.first() {
                Some(&oldest) => self.remove(oldest),
                None => break,
            }
        }
        while self.entries.len() > self.limits.entries || self.bytes > self.limits.bytes {
            match self.recency.first_key_value() {
                Some((&oldest, _)) => self.remove(oldest),
                None => break,
            }
        }
    }

    /// Marks the entry of `shape` as just used.
    fn touch(&mut self, shape: &TokenShape) {
        let Some(entry) = self.entries.get_mut(shape) else {
            return;
        };
        self.clock += 1;
        let (before, now) = (entry.last_used, self.clock);
        entry.last_used = now;
        if let Some(key) = self.recency.remove(&before) {
            self.recency.insert(now, key);
        }
        if let Some(used) = self.identities.get_mut(&shape.spiffe_id) {
            used.recency.remove(&before);
            used.recency.insert(now);
        }
    }

    /// Drops the entry last used at `last_used`.
    fn remove(&mut self, last_used: u64) {
        let Some(shape) = self.recency.remove(&last_used) else {
            return;
        };
        let Some(entry) = self.entries.remove(&shape) else {
            return;
        };
        self.bytes -= entry.cost;
        if let Some(used) = self.identities.get_mut(&shape.spiffe_id) {
            used.bytes -= entry.cost;
            used.recency.remove(&last_used);
            if used.recency.is_empty() {
                self.identities.remove(&shape.spiffe_id);
            }
        }
    }

    /// How many tokens are cached.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The bytes the cached tokens take, as the limits count them.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The cache's limits.
    pub fn limits(&self) -> CacheLimits {
        self.limits
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
