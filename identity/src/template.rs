//! The small Go-template subset used by MeshIdentity `spiffeID` templates.
//!
//! Supported: literal text, `{{ .Mesh }}`, `{{ .Zone }}`, `{{ .Namespace }}`, `{{ .ServiceAccount }}`,
//! `{{ .Workload }}` and `{{ label "key" }}` (a double-quoted string with `\"` and `\\` escapes, or a
//! back-quoted raw string). Whitespace inside `{{ }}` is optional.

use crate::LabelMap;

/// The label `{{ .Namespace }}` reads.
pub const NAMESPACE_LABEL: &str = "k8s.kuma.io/namespace";
/// The label `{{ .ServiceAccount }}` reads.
pub const SERVICE_ACCOUNT_LABEL: &str = "k8s.kuma.io/service-account";
/// The label `{{ .Workload }}` reads.
pub const WORKLOAD_LABEL: &str = "kuma.io/workload";

/// Why a template does not parse or render.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// `{{ .X }}` with an X the template language does not know.
    #[error("unknown variable .{name} at byte {offset}; known: .Mesh, .Zone, .Namespace, .ServiceAccount, .Workload")]
    UnknownVariable {
        /// The variable name, without the dot.
        name: String,
        /// Byte offset of the variable in the template.
        offset: usize,
    },
    /// `{{ f ... }}` with a function other than `label`.
    #[error("unknown function {name:?} at byte {offset}; the only function is label \"key\"")]
    UnknownFunction {
        /// The function name.
        name: String,
        /// Byte offset of the name in the template.
        offset: usize,
    },
    /// A `{{` without its `}}`.
    #[error("unclosed action: \"{{{{\" at byte {offset} has no \"}}}}\"")]
    Unclosed {
        /// Byte offset of the `{{`.
        offset: usize,
    },
    /// A malformed string argument to `label`.
    #[error("bad quoting at byte {offset}: {reason}")]
    BadQuoting {
        /// Byte offset of the problem.
        offset: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// `{{ }}` with nothing inside.
    #[error("empty action at byte {offset}")]
    EmptyAction {
        /// Byte offset of the `{{`.
        offset: usize,
    },
    /// Extra text after a complete action, e.g. `{{ .Mesh .Zone }}`.
    #[error(
        "unexpected text at byte {offset}; an action holds one variable or one label \"key\" call"
    )]
    UnexpectedText {
        /// Byte offset of the extra text.
        offset: usize,
    },
    /// The dataplane lacks a label the template reads.
    #[error("the dataplane has no label {label:?}, which the template needs")]
    MissingLabel {
        /// The missing label key.
        label: String,
    },
}

/// What a template action inserts.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Text(String),
    Mesh,
    Zone,
    Label(String),
}

/// A parsed template, ready to render many times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    source: String,
    pieces: Vec<Piece>,
}

/// The values a template may read.
#[derive(Clone, Copy, Debug)]
pub struct TemplateVars<'a> {
    /// `{{ .Mesh }}`.
    pub mesh: &'a str,
    /// `{{ .Zone }}`.
    pub zone: &'a str,
    /// The dataplane's labels, read by `.Namespace`, `.ServiceAccount`, `.Workload` and `label`.
    pub labels: &'a LabelMap,
}

impl Template {
    /// Parses a template; errors carry the byte offset of the problem.
    pub fn parse(source: &str) -> Result<Template, TemplateError> {
        let mut pieces = Vec::new();
        let mut rest = 0;
        while let Some(found) = source[rest..].find("{{") {
            let open = rest + found;
            if open > rest {
                pieces.push(Piece::Text(source[rest..open].to_owned()));
            }
            let body_start = open + 2;
            let close = source[body_start..]
                .find("}}")
                .map(|i| body_start + i)
                .ok_or(TemplateError::Unclosed { offset: open })?;
            pieces.push(parse_action(source, open, body_start, close)?);
            rest = close + 2;
        }
        if rest < source.len() {
            pieces.push(Piece::Text(source[rest..].to_owned()));
        }
        Ok(Template {
            source: source.to_owned(),
            pieces,
        })
    }

    /// Renders the template; a label it reads that the dataplane lacks is an error naming the label.
    pub fn render(&self, vars: &TemplateVars<'_>) -> Result<String, TemplateError> {
        let mut out = String::with_capacity(self.source.len() + 32);
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Mesh => out.push_str(vars.mesh),
                Piece::Zone => out.push_str(vars.zone),
                Piece::Label(key) => {
                    let value = vars
                        .labels
                        .get(key)
                        .ok_or_else(|| TemplateError::MissingLabel { label: key.clone() })?;
                    out.push_str(value);
                }
            }
        }
        Ok(out)
    }

    /// Whether any action reads the dataplane's labels (trust-domain templates may not).
    pub fn uses_labels(&self) -> bool {
        self.pieces.iter().any(|p| matches!(p, Piece::Label(_)))
    }

    /// Whether rendering reads label `key` (`{{ .Workload }}` reads [`WORKLOAD_LABEL`]).
    pub fn reads_label(&self, key: &str) -> bool {
        self.pieces
            .iter()
            .any(|p| matches!(p, Piece::Label(l) if l == key))
    }

    /// The template text as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

/// Parses the inside of `{{ ... }}` found at `open`, whose body spans `start..end`.
fn parse_action(
    source: &str,
    open: usize,
    start: usize,
    end: usize,
) -> Result<Piece, TemplateError> {
    let body = &source[start..end];
    let lead = body.len() - body.trim_start().len();
    let trimmed = body.trim();
    if trimmed.is_empty() {
        return Err(TemplateError::EmptyAction { offset: open });
    }
    let word_start = start + lead;
    let word_len = trimmed
        .find(|c: char| c.is_whitespace() || c == '"' || c == '`')
        .unwrap_or(trimmed.len());
    let word = &trimmed[..word_len];
    let after = word_start + word_len;
    if let Some(name) = word.strip_prefix('.') {
        let piece = match name {
            "Mesh" => Piece::Mesh,
            "Zone" => Piece::Zone,
            "Namespace" => Piece::Label(NAMESPACE_LABEL.to_owned()),
            "ServiceAccount" => Piece::Label(SERVICE_ACCOUNT_LABEL.to_owned()),
            "Workload" => Piece::Label(WORKLOAD_LABEL.to_owned()),
            _ => {
                return Err(TemplateError::UnknownVariable {
                    name: name.to_owned(),
                    offset: word_start,
                })
            }
        };
        expect_end(source, after, end)?;
        return Ok(piece);
    }
    if word != "label" {
        return Err(TemplateError::UnknownFunction {
            name: word.to_owned(),
            offset: word_start,
        });
    }
    let arg_start = after + (source[after..end].len() - source[after..end].trim_start().len());
    if arg_start == end {
        return Err(TemplateError::BadQuoting {
            offset: arg_start,
            reason: "label needs a quoted key, e.g. label \"app\"",
        });
    }
    let (key, arg_end) = parse_string(source, arg_start, end)?;
    expect_end(source, arg_end, end)?;
    Ok(Piece::Label(key))
}

/// Errors unless only whitespace is left in `from..end`.
fn expect_end(source: &str, from: usize, end: usize) -> Result<(), TemplateError> {
    let rest = &source[from..end];
    let lead = rest.len() - rest.trim_start().len();
    if lead == rest.len() {
        Ok(())
    } else {
        Err(TemplateError::UnexpectedText {
            offset: from + lead,
        })
    }
}

/// Parses a Go string literal starting at `start`, ending before `end`. Returns it and the byte after it.
fn parse_string(source: &str, start: usize, end: usize) -> Result<(String, usize), TemplateError> {
    let text = &source[start..end];
    let mut chars = text.char_indices();
    let quote = match chars.next() {
        Some((_, q @ ('"' | '`'))) => q,
        _ => {
            return Err(TemplateError::BadQuoting {
                offset: start,
                reason: "the label key must be a quoted string",
            })
        }
    };
    let mut value = String::new();
    while let Some((i, c)) = chars.next() {
        match c {
            c if c == quote => return Ok((value, start + i + 1)),
            '\\' if quote == '"' => match chars.next() {
                Some((_, e @ ('"' | '\\'))) => value.push(e),
                _ => {
                    return Err(TemplateError::BadQuoting {
                        offset: start + i,
                        reason: "only \\\" and \\\\ escapes are supported",
                    })
                }
            },
            '\n' if quote == '"' => break,
            c => value.push(c),
        }
    }
    Err(TemplateError::BadQuoting {
        offset: start,
        reason: "the string is not terminated",
    })
}

#[cfg(test)]
#[path = "template_tests.rs"]
mod tests;
