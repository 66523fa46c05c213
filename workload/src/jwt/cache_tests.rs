use proptest::prelude::*;

use super::*;

fn id(path: &str) -> SpiffeId {
    SpiffeId::parse(&format!("spiffe://example.org/{path}")).expect("valid id")
}

fn auds(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn shape(path: &str, kid: &str, audiences: &[&str]) -> TokenShape {
    TokenShape::new(&id(path), kid, &auds(audiences), 300)
}

fn entries(entries: usize) -> CacheLimits {
    CacheLimits {
        entries,
        ..CacheLimits::default()
    }
}

#[test]
fn audiences_match_in_any_order_and_without_duplicates() {
    let mut cache = JwtSvidCache::new(entries(4));
    cache.insert(shape("web", "k1", &["b", "a"]), "t".into(), 100, 200);
    assert_eq!(
        cache.get(&shape("web", "k1", &["a", "b", "a"]), 100),
        Some("t".to_owned())
    );
    assert_eq!(cache.get(&shape("web", "k1", &["a"]), 100), None);
    assert_eq!(cache.get(&shape("web", "k2", &["a", "b"]), 100), None);
    assert_eq!(cache.get(&shape("db", "k1", &["a", "b"]), 100), None);
}

/// Two registrations of one Dataplane share a SPIFFE ID but may ask for different lifetimes: the
/// token kept for one never answers the other.
#[test]
fn a_token_of_another_lifetime_does_not_answer() {
    let mut cache = JwtSvidCache::new(entries(4));
    let long = TokenShape::new(&id("web"), "k", &auds(&["a"]), 300);
    let short = TokenShape::new(&id("web"), "k", &auds(&["a"]), 2);
    cache.insert(long.clone(), "300s".into(), 100, 400);
    assert_eq!(cache.get(&short, 100), None);
    cache.insert(short.clone(), "2s".into(), 100, 102);
    assert_eq!(cache.get(&short, 100), Some("2s".to_owned()));
    assert_eq!(cache.get(&long, 100), Some("300s".to_owned()));
}

#[test]
fn a_token_is_reused_only_while_more_than_half_its_lifetime_remains() {
    let mut cache = JwtSvidCache::new(entries(4));
    let a = shape("web", "k", &["a"]);
    cache.insert(a.clone(), "t".into(), 100, 200);
    assert!(cache.get(&a, 149).is_some(), "51 of 100 s left");
    assert!(cache.get(&a, 150).is_none(), "exactly half left");
    assert!(cache.is_empty(), "a stale token is dropped");
    assert_eq!(cache.bytes(), 0);
    cache.insert(a.clone(), "t".into(), 100, 200);
    assert!(cache.get(&a, 500).is_none(), "expired");
}

#[test]
fn the_least_recently_used_token_is_evicted() {
    let mut cache = JwtSvidCache::new(entries(2));
    cache.insert(shape("one", "k", &["a"]), "1".into(), 0, 100);
    cache.insert(shape("two", "k", &["a"]), "2".into(), 0, 100);
    assert!(
        cache.get(&shape("one", "k", &["a"]), 0).is_some(),
        "one is now the most recent"
    );
    cache.insert(shape("three", "k", &["a"]), "3".into(), 0, 100);
    assert_eq!(cache.len(), 2);
    assert!(
        cache.get(&shape("two", "k", &["a"]), 0).is_none(),
        "two was evicted"
    );
    assert!(cache.get(&shape("one", "k", &["a"]), 0).is_some());
    assert!(cache.get(&shape("three", "k", &["a"]), 0).is_some());
}

#[test]
fn replacing_a_token_does_not_evict_another() {
    let mut cache = JwtSvidCache::new(entries(2));
    cache.insert(shape("one", "k", &["a"]), "1".into(), 0, 100);
    cache.insert(shape("two", "k", &["a"]), "2".into(), 0, 100);
    cache.insert(shape("one", "k", &["a"]), "1b".into(), 0, 100);
    assert_eq!(cache.len(), 2);
    assert_eq!(
        cache.get(&shape("one", "k", &["a"]), 0),
        Some("1b".to_owned())
    );
    assert_eq!(
        cache.get(&shape("two", "k", &["a"]), 0),
        Some("2".to_owned())
    );
    assert_eq!(cache.recency.len(), cache.entries.len());
}

#[test]
fn capacity_zero_keeps_nothing() {
    let mut cache = JwtSvidCache::new(entries(0));
    cache.insert(shape("one", "k", &["a"]), "1".into(), 0, 100);
    assert!(cache.is_empty());
    assert_eq!(cache.limits().entries, 0);
}

/// One workload asking for long distinct audiences (32 of 1 KiB each: the request limits' most) fills
/// its own share and evicts its own tokens, never those of others, and the cache never holds more
/// bytes than its limit (4096 such tokens would take some 200 MB).
#[test]
fn long_distinct_audiences_evict_their_own_identitys_tokens_within_bytes() {
    let limits = CacheLimits {
        entries: 4096,
        bytes: 4 * 1024 * 1024,
        bytes_per_identity: 512 * 1024,
    };
    let mut cache = JwtSvidCache::new(limits);
    let other = shape("other", "k", &["a"]);
    cache.insert(other.clone(), "o".repeat(600), 0, 1000);
    let long = |n: usize| -> Vec<String> {
        (0..32)
            .map(|i| format!("{n:08}-{i:02}-{}", "x".repeat(1000)))
            .collect()
    };
    for n in 0..4096 {
        let audiences = long(n);
        // The token carries every audience once more.
        let token = "t".repeat(audiences.iter().map(String::len).sum::<usize>() + 600);
        let shape = TokenShape::new(&id("greedy"), "k", &audiences, 300);
        cache.insert(shape, token, 0, 1000);
        assert!(cache.bytes() <= limits.bytes, "{} bytes", cache.bytes());
    }
    let greedy: usize = cache
        .identities
        .get(&id("greedy"))
        .map_or(0, |used| used.bytes);
    assert!(greedy <= limits.bytes_per_identity, "{greedy} bytes");
    assert!(greedy > limits.bytes_per_identity / 2, "{greedy} bytes");
    assert_eq!(cache.get(&other, 0), Some("o".repeat(600)), "kept");
}

#[test]
fn a_token_larger_than_a_share_is_not_kept() {
    let limits = CacheLimits {
        entries: 16,
        bytes: 1024 * 1024,
        bytes_per_identity: 1024,
    };
    let mut cache = JwtSvidCache::new(limits);
    cache.insert(shape("web", "k", &["a"]), "t".repeat(2000), 0, 100);
    assert!(cache.is_empty());
    assert_eq!(cache.bytes(), 0);
}

#[derive(Debug, Clone)]
enum Op {
    Insert {
        identity: u8,
        audience: u8,
        lifetime: u8,
        token_len: u16,
    },
    Get {
        identity: u8,
        audience: u8,
        lifetime: u8,
        now: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..6, 0u8..12, 1u8..4, 0u16..3000).prop_map(
            |(identity, audience, lifetime, token_len)| Op::Insert {
                identity,
                audience,
                lifetime,
                token_len
            }
        ),
        (0u8..6, 0u8..12, 1u8..4, 0u8..200).prop_map(|(identity, audience, lifetime, now)| {
            Op::Get {
                identity,
                audience,
                lifetime,
                now,
            }
        }),
    ]
}

fn op_shape(identity: u8, audience: u8, lifetime: u8) -> TokenShape {
    TokenShape::new(
        &id(&format!("w{identity}")),
        "k",
        &[format!("aud-{audience}").repeat(usize::from(audience) * 20 + 1)],
        u64::from(lifetime),
    )
}

proptest! {
    /// Whatever is asked, the cache stays within every limit and its books balance.
    #[test]
    fn every_limit_holds_after_any_requests(
        ops in proptest::collection::vec(op(), 0..200),
        entries in 0usize..20,
        bytes in 0usize..40_000,
        bytes_per_identity in 0usize..20_000,
    ) {
        let limits = CacheLimits { entries, bytes, bytes_per_identity };
        let mut cache = JwtSvidCache::new(limits);
        for op in ops {
            match op {
                Op::Insert { identity, audience, lifetime, token_len } => {
                    let shape = op_shape(identity, audience, lifetime);
                    cache.insert(shape, "t".repeat(usize::from(token_len)), 0, 100 * u64::from(lifetime));
                }
                Op::Get { identity, audience, lifetime, now } => {
                    let shape = op_shape(identity, audience, lifetime);
                    if let Some(token) = cache.get(&shape, u64::from(now)) {
                        prop_assert!(token.starts_with('t') || token.is_empty());
                    }
                }
            }
            prop_assert!(cache.len() <= limits.entries);
            prop_assert!(cache.bytes() <= limits.bytes);
            prop_assert_eq!(cache.recency.len(), cache.entries.len());
            let total: usize = cache.entries.values().map(|e| e.cost).sum();
            prop_assert_eq!(total, cache.bytes());
            let mut per_identity: HashMap<&SpiffeId, usize> = HashMap::new();
            for (shape, entry) in &cache.entries {
                *per_identity.entry(&shape.spiffe_id).or_default() += entry.cost;
            }
            prop_assert_eq!(per_identity.len(), cache.identities.len());
            for (identity, used) in &cache.identities {
                prop_assert!(used.bytes <= limits.bytes_per_identity);
                prop_assert_eq!(Some(&used.bytes), per_identity.get(identity));
            }
        }
    }
}
