//! Turning YAML deserialization errors into a field path and a message.

use serde::de::DeserializeOwned;

/// A deserialization failure: the dotted field path (`""` for the document itself) and a message
/// that carries the line and column where the YAML parser knows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    pub(crate) field: String,
    pub(crate) message: String,
}

/// Deserializes one YAML document into `T`, reporting the exact field that failed.
pub(crate) fn deserialize<T: DeserializeOwned>(
    document: yaml_serde::Deserializer<'_>,
) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(document).map_err(|err| {
        let field = match err.path().to_string() {
            root if root == "." => String::new(),
            path => path,
        };
        let message = strip_path_prefix(&field, &err.inner().to_string());
        FieldError { field, message }
    })
}

/// yaml_serde prefixes its messages with the path it knew when the error happened, which is the
/// failing field or one of its ancestors. The field is reported separately, so drop that prefix.
fn strip_path_prefix(field: &str, message: &str) -> String {
    let ancestors = field
        .char_indices()
        .filter(|&(_, c)| c == '.' || c == '[')
        .map(|(i, _)| &field[..i])
        .chain(std::iter::once(field))
        .filter(|p| !p.is_empty());
    let mut best: Option<&str> = None;
    for prefix in ancestors {
        if let Some(rest) = message
            .strip_prefix(prefix)
            .and_then(|r| r.strip_prefix(": "))
        {
            if best.is_none_or(|b| rest.len() < b.len()) {
                best = Some(rest);
            }
        }
    }
    best.unwrap_or(message).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_the_longest_ancestor() {
        assert_eq!(
            strip_path_prefix(
                "mtls.backends[1].x",
                "mtls.backends[1].x: bad at line 1 column 2"
            ),
            "bad at line 1 column 2"
        );
        assert_eq!(
            strip_path_prefix("mtls.backends[0].exp", "mtls.backends[0]: bad duration"),
            "bad duration"
        );
        assert_eq!(
            strip_path_prefix("mtls.x", "mtls: unknown field"),
            "unknown field"
        );
        assert_eq!(
            strip_path_prefix("", "missing field `name`"),
            "missing field `name`"
        );
        assert_eq!(strip_path_prefix("a", "other: text"), "other: text");
    }
}
