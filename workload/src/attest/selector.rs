//! A caller's selectors: what attestation says about it, as [`Selector`]s, the one type that
//! registrations are written in too (`meshca_config`), so matching compares like with like.
//!
//! The constructors here turn what `/proc` and the user database say into selectors, and give none
//! for a value a registration could not name (a user name with a space, a deleted binary's path).

use std::collections::BTreeSet;

pub use meshca_config::{Selector, SelectorError, SelectorKind};

/// Parses a selector written by an operator (`unix:uid:1001`); only the canonical form is accepted.
pub fn parse_selector(text: &str) -> Result<Selector, SelectorError> {
    text.parse()
}

pub(crate) fn uid(id: u32) -> Option<Selector> {
    Selector::id(SelectorKind::Uid, id)
}

pub(crate) fn gid(id: u32) -> Option<Selector> {
    Selector::id(SelectorKind::Gid, id)
}

pub(crate) fn supplementary_gid(id: u32) -> Option<Selector> {
    Selector::id(SelectorKind::SupplementaryGid, id)
}

pub(crate) fn user(name: &str) -> Option<Selector> {
    Selector::new(SelectorKind::User, name).ok()
}

pub(crate) fn group(name: &str) -> Option<Selector> {
    Selector::new(SelectorKind::Group, name).ok()
}

pub(crate) fn supplementary_group(name: &str) -> Option<Selector> {
    Selector::new(SelectorKind::SupplementaryGroup, name).ok()
}

pub(crate) fn path(path: &str) -> Option<Selector> {
    Selector::new(SelectorKind::Path, path).ok()
}

pub(crate) fn sha256(digest: [u8; 32]) -> Option<Selector> {
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Selector::new(SelectorKind::Sha256, &hex).ok()
}

pub(crate) fn systemd_unit(unit: &str) -> Option<Selector> {
    Selector::new(SelectorKind::SystemdUnit, unit).ok()
}

/// A caller's selectors, as a sorted set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selectors(BTreeSet<Selector>);

impl Selectors {
    /// Whether every selector of `wanted` is in the set: a registration matches a caller when
    /// all of its selectors are the caller's. An empty `wanted` matches every caller, so a
    /// registration without selectors is refused where it is read.
    pub fn contains_all(&self, wanted: &[Selector]) -> bool {
        wanted.iter().all(|selector| self.0.contains(selector))
    }

    /// Whether the set holds `selector`.
    pub fn contains(&self, selector: &Selector) -> bool {
        self.0.contains(selector)
    }

    /// The selectors, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Selector> {
        self.0.iter()
    }

    /// How many selectors the set holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn insert(&mut self, selector: Option<Selector>) {
        if let Some(selector) = selector {
            self.0.insert(selector);
        }
    }
}

impl FromIterator<Selector> for Selectors {
    fn from_iter<I: IntoIterator<Item = Selector>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl<'a> IntoIterator for &'a Selectors {
    type Item = &'a Selector;
    type IntoIter = std::collections::btree_set::Iter<'a, Selector>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
#[path = "selector_tests.rs"]
mod tests;
