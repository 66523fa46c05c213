//! Revoked token ids.

use std::collections::BTreeSet;

use crate::claims::is_token_id;
use crate::error::{quote, AuthError};

/// A set of revoked token ids (`jti`).
///
/// File format: one token id (32 hex digits, as printed by `meshca token`) per line; `#` starts a comment
/// (whole line or after the id); blank lines are ignored. Ids are matched case-insensitively.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RevocationList {
    ids: BTreeSet<String>,
}

impl RevocationList {
    /// An empty list: nothing is revoked.
    pub fn new() -> RevocationList {
        RevocationList::default()
    }

    /// Parses the file format. Any line that is not a token id is an error naming the line, so a truncated
    /// or mistyped id cannot silently leave a token valid.
    pub fn parse(text: &str) -> Result<RevocationList, AuthError> {
        let mut ids = BTreeSet::new();
        for (index, line) in text.lines().enumerate() {
            let entry = line
                .split_once('#')
                .map_or(line, |(before, _)| before)
                .trim();
            if entry.is_empty() {
                continue;
            }
            let id = entry.to_ascii_lowercase();
            if !is_token_id(&id) {
                return Err(AuthError::InvalidRevocationList {
                    line: index + 1,
                    reason: format!(
                        "{} is not a token id (32 hex digits, one per line)",
                        quote(entry)
                    ),
                });
            }
            ids.insert(id);
        }
        Ok(RevocationList { ids })
    }

    /// Whether the token id is revoked.
    pub fn contains(&self, id: &str) -> bool {
        self.ids.contains(&id.to_ascii_lowercase())
    }

    /// How many ids are revoked.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether nothing is revoked.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The revoked ids, sorted, lowercase.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.ids.iter().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0123456789abcdef0123456789abcdef";
    const B: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn parses_ids_comments_and_blank_lines() {
        let text = format!(
            "# revoked after the incident\n\n{A}\n  {} # laptop lost\n",
            B.to_uppercase()
        );
        let list = RevocationList::parse(&text).expect("valid list");
        assert_eq!(list.len(), 2);
        assert!(list.contains(A));
        assert!(list.contains(B));
        assert!(!list.contains("00000000000000000000000000000000"));
        assert_eq!(list.iter().collect::<Vec<_>>(), vec![A, B]);
    }

    #[test]
    fn empty_text_is_an_empty_list() {
        let list = RevocationList::parse("\n# nothing yet\n").expect("valid list");
        assert!(list.is_empty());
        assert_eq!(list, RevocationList::new());
    }

    #[test]
    fn refuses_lines_that_are_not_ids() {
        for (text, line) in [
            (format!("{A}\n{}\n", &B[..31]), 2),
            (format!("{A} {B}\n"), 1),
            ("# ok\n\nnot-an-id\n".to_owned(), 3),
        ] {
            match RevocationList::parse(&text) {
                Err(AuthError::InvalidRevocationList { line: got, .. }) => {
                    assert_eq!(got, line, "{text}")
                }
                other => panic!("expected an error on line {line}, got {other:?}"),
            }
        }
    }
}
