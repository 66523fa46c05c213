use std::fmt;
use std::path::PathBuf;

use crate::names::cut;

/// Where a resource was defined, so that errors found later (a provided CA that fails its
/// checks) can name the file.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Source {
    /// The resource file.
    pub file: PathBuf,
    /// The 1-based index of the YAML document within the file.
    pub document: usize,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (document {})", self.file.display(), self.document)
    }
}

/// One problem in a resource file.
///
/// Displays as `<file>: <Type>/<name>: <field>: <message>` (for mesh-scoped resources
/// `<Type>/<mesh>/<name>`), or `<file>: document <n>: ...` while the resource has no name yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceError {
    /// The file (or directory, for a directory that cannot be read).
    pub file: PathBuf,
    /// The 1-based YAML document index; 0 when the error is about the whole file.
    pub document: usize,
    /// The resource, e.g. `Mesh/default` or `MeshIdentity/default/web`, once known.
    pub resource: Option<String>,
    /// The dotted field path, e.g. `mtls.backends[1].conf.caCert.RSAbits`; empty for the whole
    /// document or file.
    pub field: String,
    /// What is wrong and, where it helps, what is expected.
    pub message: String,
}

impl fmt::Display for ResourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.file.display())?;
        match (&self.resource, self.document) {
            (Some(resource), _) => write!(f, "{resource}: ")?,
            (None, 0) => {}
            (None, document) => write!(f, "document {document}: ")?,
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ResourceError {}

/// The longest message (and field path) an error keeps, in characters.
const MAX_MESSAGE_CHARS: usize = 1000;

/// Collects the errors of one document, all tagged with its file, index and resource.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) source: Source,
    pub(crate) resource: Option<String>,
    pub(crate) errors: Vec<ResourceError>,
}

impl Report {
    pub(crate) fn new(source: Source) -> Self {
        Report {
            source,
            resource: None,
            errors: Vec::new(),
        }
    }

    /// Records an error about `field` (a dotted path, empty for the whole document). A message
    /// longer than [`MAX_MESSAGE_CHARS`] (it may quote a value from the file) is cut.
    pub(crate) fn error(&mut self, field: impl Into<String>, message: impl Into<String>) {
        let message: String = message.into();
        self.errors.push(ResourceError {
            file: self.source.file.clone(),
            document: self.source.document,
            resource: self.resource.clone(),
            field: cut(&field.into(), MAX_MESSAGE_CHARS).into_owned(),
            message: cut(&message, MAX_MESSAGE_CHARS).into_owned(),
        });
    }

    /// Reads an enum-like field that was read as text, so that a wrong value is one violation among
    /// the others of the resource rather than the end of parsing: the value `allowed` pairs with
    /// `value`, or an error in Kuma's words (`"Test" must be one of ["Enabled", "Disabled"]`).
    pub(crate) fn one_of<T: Copy>(
        &mut self,
        field: impl Into<String>,
        value: &str,
        allowed: &[(&str, T)],
    ) -> Option<T> {
        if let Some((_, v)) = allowed.iter().find(|(name, _)| *name == value) {
            return Some(*v);
        }
        let names: Vec<String> = allowed
            .iter()
            .map(|(name, _)| format!("{name:?}"))
            .collect();
        self.error(
            field,
            format!("{value:?} must be one of [{}]", names.join(", ")),
        );
        None
    }

    /// Whether any error was recorded.
    pub(crate) fn has_errors(&self) -> bool {
        !self.errors.is_empty()
    }

    /// The directory relative file paths in this document are resolved against.
    pub(crate) fn base_dir(&self) -> &std::path::Path {
        self.source
            .file
            .parent()
            .unwrap_or_else(|| std::path::Path::new(""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_file_resource_and_field() {
        let mut e = ResourceError {
            file: "r/mesh.yaml".into(),
            document: 2,
            resource: Some("Mesh/default".into()),
            field: "mtls.enabledBackend".into(),
            message: "no backend named \"x\"".into(),
        };
        assert_eq!(
            e.to_string(),
            "r/mesh.yaml: Mesh/default: mtls.enabledBackend: no backend named \"x\""
        );
        e.resource = None;
        e.field.clear();
        assert_eq!(
            e.to_string(),
            "r/mesh.yaml: document 2: no backend named \"x\""
        );
        e.document = 0;
        assert_eq!(e.to_string(), "r/mesh.yaml: no backend named \"x\"");
    }
}
