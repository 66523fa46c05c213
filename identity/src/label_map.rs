//! [`LabelMap`]: a proxy's labels or tags, held in as little memory as their strings need.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A proxy's labels or tags: string keys in order, each once, with their values.
///
/// Every connected proxy holds its token's labels and tags for as long as it is connected. A `BTreeMap`
/// allocates a node for eleven entries even to hold one (about 550 bytes, twice per proxy); this is a
/// sorted slice of exactly the entries it holds. Lookups are a binary search.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelMap(Box<[(String, String)]>);

impl LabelMap {
    /// A map with no entry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of `key`, if the map has it.
    pub fn get(&self, key: &str) -> Option<&String> {
        self.position(key).ok().map(|i| &self.0[i].1)
    }

    /// Whether the map has `key`.
    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_ok()
    }

    /// The entries, in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&String, &String)> + ExactSizeIterator {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the map has no entry.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The same entries in a `BTreeMap`, to change them.
    pub fn to_btree_map(&self) -> BTreeMap<String, String> {
        self.0.iter().cloned().collect()
    }

    fn position(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }
}

impl From<BTreeMap<String, String>> for LabelMap {
    fn from(map: BTreeMap<String, String>) -> Self {
        // A BTreeMap iterates in key order, each key once: the slice's invariant.
        Self(map.into_iter().collect())
    }
}

impl From<LabelMap> for BTreeMap<String, String> {
    fn from(map: LabelMap) -> Self {
        map.0.into_vec().into_iter().collect()
    }
}

impl FromIterator<(String, String)> for LabelMap {
    /// The last value given for a key wins, as in a `BTreeMap`.
    fn from_iter<I: IntoIterator<Item = (String, String)>>(entries: I) -> Self {
        entries.into_iter().collect::<BTreeMap<_, _>>().into()
    }
}

impl<const N: usize> From<[(String, String); N]> for LabelMap {
    fn from(entries: [(String, String); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl<'a> IntoIterator for &'a LabelMap {
    type Item = (&'a String, &'a String);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, String)>,
        fn(&'a (String, String)) -> (&'a String, &'a String),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl PartialEq<BTreeMap<String, String>> for LabelMap {
    fn eq(&self, other: &BTreeMap<String, String>) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl fmt::Debug for LabelMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for LabelMap {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for LabelMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        BTreeMap::<String, String>::deserialize(deserializer).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever entries it is built from, the map answers as a `BTreeMap` built from them would.
        #[test]
        fn answers_as_a_btree_map_would(
            entries in proptest::collection::vec(("[a-d]{0,2}", "[x-z]{0,2}"), 0..12),
            probes in proptest::collection::vec("[a-d]{0,2}", 0..8),
        ) {
            let map: LabelMap = entries.iter().cloned().collect();
            let reference: BTreeMap<String, String> = entries.into_iter().collect();
            prop_assert_eq!(map.len(), reference.len());
            prop_assert!(map.iter().eq(reference.iter()));
            prop_assert!(map == reference);
            for probe in probes {
                prop_assert_eq!(map.get(&probe), reference.get(&probe));
                prop_assert_eq!(map.contains_key(&probe), reference.contains_key(&probe));
            }
            prop_assert_eq!(BTreeMap::from(map.clone()), reference.clone());
            prop_assert_eq!(map.to_btree_map(), reference);
        }
    }

    #[test]
    fn reads_and_writes_json_as_a_map() {
        let map: LabelMap = serde_json::from_str(r#"{"b":"2","a":"1","b":"3"}"#).expect("a map");
        assert_eq!(format!("{map:?}"), r#"{"a": "1", "b": "3"}"#);
        assert_eq!(
            serde_json::to_string(&map).expect("json"),
            r#"{"a":"1","b":"3"}"#
        );
        assert!(serde_json::from_str::<LabelMap>(r#"{"a":1}"#).is_err());
    }
}
