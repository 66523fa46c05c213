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
    /// The text of a new list file: a comment header explaining the format, and no id.
    pub const EMPTY_FILE: &'static str = "\
# meshca token revocation list: one revoked token id (32 hex digits, printed by `meshca token`) per line.
# `#` starts a comment; blank lines are ignored. A line that is not a token id makes the whole list invalid.
# Add ids with `meshca token --revoke ID`, which rewrites this file atomically; the daemon reloads it.
# Never delete this file: without it the daemon keeps its last list while running and refuses to start,
# since every token revoked here would be accepted again. To start over with nothing revoked, empty it.
";

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

    /// The list file `text` with `id` added on a line of its own (lowercased), after a comment line
    /// `# note` unless `note` is empty (control characters in it become spaces). `Ok(None)` when `id` is
    /// revoked already: there is nothing to write.
    ///
    /// `text` is parsed whole first: an invalid list is an error naming its line, never extended, and
    /// the result always parses, whether or not `text` ends with a newline. Comments are kept.
    pub fn add_to_file(text: &str, id: &str, note: &str) -> Result<Option<String>, AuthError> {
        let id = id.to_ascii_lowercase();
        if !is_token_id(&id) {
            return Err(AuthError::InvalidClaim {
                field: "jti",
                reason: format!("{} is not a token id (32 hex digits)", quote(&id)),
            });
        }
        if RevocationList::parse(text)?.contains(&id) {
            return Ok(None);
        }
        let mut out = String::with_capacity(text.len() + id.len() + note.len() + 8);
        out.push_str(text);
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        let note: String = note
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if !note.trim().is_empty() {
            out.push_str("# ");
            out.push_str(note.trim());
            out.push('\n');
        }
        out.push_str(&id);
        out.push('\n');
        Ok(Some(out))
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
    fn adding_to_a_file_without_a_final_newline_keeps_both_ids() {
        // `meshca token --revoke` used to append, gluing the new id to a last line without a newline: the
        // list became invalid, the daemon kept the old one, and the token stayed valid.
        for text in [A.to_owned(), format!("# header\n{A}  # lost laptop")] {
            let new = RevocationList::add_to_file(&text, B, "revoked at 12:00")
                .expect("a valid list")
                .expect("B is not revoked yet");
            let list = RevocationList::parse(&new).expect("the new list is valid");
            assert!(list.contains(A) && list.contains(B), "{new:?}");
            assert_eq!(list.len(), 2, "{new:?}");
            assert!(new.starts_with(&text), "the old text is kept: {new:?}");
            assert!(
                new.ends_with(&format!("\n# revoked at 12:00\n{B}\n")),
                "{new:?}"
            );
        }
    }

    #[test]
    fn adding_to_an_empty_file_or_header_and_adding_twice() {
        let new = RevocationList::add_to_file("", &B.to_uppercase(), "")
            .expect("valid")
            .expect("added");
        assert_eq!(new, format!("{B}\n"), "lowercased, no empty comment");
        let with_header = RevocationList::add_to_file(RevocationList::EMPTY_FILE, A, "a\nb")
            .expect("valid")
            .expect("added");
        assert!(
            with_header.ends_with(&format!("\n# a b\n{A}\n")),
            "{with_header:?}"
        );
        assert!(RevocationList::parse(RevocationList::EMPTY_FILE)
            .expect("the header alone is a valid, empty list")
            .is_empty());
        assert_eq!(
            RevocationList::add_to_file(&with_header, &A.to_uppercase(), "again").expect("valid"),
            None,
            "revoking a revoked id changes nothing"
        );
    }

    #[test]
    fn adding_refuses_an_invalid_list_or_id() {
        match RevocationList::add_to_file(&format!("{A}\n{}{B}\n", &A[..5]), B, "") {
            Err(AuthError::InvalidRevocationList { line: 2, .. }) => {}
            other => panic!("expected an error on line 2, got {other:?}"),
        }
        assert!(matches!(
            RevocationList::add_to_file("", "xyz", ""),
            Err(AuthError::InvalidClaim { field: "jti", .. })
        ));
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
