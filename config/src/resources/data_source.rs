//! Where certificate and key bytes come from: Kuma's `DataSource` (Mesh backends) and
//! `SecureDataSource` (MeshIdentity) map onto one type.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::de::IgnoredAny;
use serde::Deserialize;
use zeroize::Zeroize;

use super::error::Report;

/// The bytes of a certificate or private key, or where to read them.
///
/// Inline contents may be private keys: `Debug` and `Display` never show them, and they are
/// zeroized on drop.
#[derive(Clone, PartialEq, Eq)]
pub enum DataSource {
    /// A file; a relative path in a resource file was resolved against that file's directory.
    File(PathBuf),
    /// Bytes given inline (Kuma `inline`, base64 in the YAML, decoded here).
    Inline(Vec<u8>),
    /// Text given inline (Kuma `inlineString`, MeshIdentity `InsecureInline`).
    InlineString(String),
    /// An environment variable of the meshca process, read when [`DataSource::read`] is called.
    EnvVar(String),
}

impl DataSource {
    /// The bytes: reads the file or the environment variable, or copies the inline data, refusing
    /// more than `max_bytes` (`limits.dataSourceBytes`) and a file that is not a regular file (a
    /// FIFO would block, `/dev/zero` never end). Errors name the file or variable. The caller
    /// should zeroize the result once used if it holds a private key.
    pub fn read(&self, max_bytes: u64) -> Result<Vec<u8>, io::Error> {
        let bytes = match self {
            DataSource::File(path) => {
                return meshca_files::read(path, max_bytes, "limits.dataSourceBytes")
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())));
            }
            DataSource::Inline(bytes) => bytes.clone(),
            DataSource::InlineString(text) => text.as_bytes().to_vec(),
            DataSource::EnvVar(name) => {
                std::env::var(name).map(String::into_bytes).map_err(|e| {
                    let kind = match e {
                        std::env::VarError::NotPresent => io::ErrorKind::NotFound,
                        std::env::VarError::NotUnicode(_) => io::ErrorKind::InvalidData,
                    };
                    io::Error::new(kind, format!("environment variable {name}: {e}"))
                })?
            }
        };
        if bytes.len() as u64 > max_bytes {
            let mut bytes = bytes;
            bytes.zeroize();
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{self}: larger than {max_bytes} bytes (limits.dataSourceBytes); refused"),
            ));
        }
        Ok(bytes)
    }
}

impl fmt::Display for DataSource {
    /// Where the data comes from, never the data itself.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataSource::File(path) => write!(f, "file {}", path.display()),
            DataSource::Inline(_) => f.write_str("inline data"),
            DataSource::InlineString(_) => f.write_str("inline string"),
            DataSource::EnvVar(name) => write!(f, "environment variable {name}"),
        }
    }
}

impl fmt::Debug for DataSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataSource::File(path) => f.debug_tuple("File").field(path).finish(),
            DataSource::Inline(_) => f.write_str("Inline([redacted])"),
            DataSource::InlineString(_) => f.write_str("InlineString([redacted])"),
            DataSource::EnvVar(name) => f.debug_tuple("EnvVar").field(name).finish(),
        }
    }
}

impl Drop for DataSource {
    fn drop(&mut self) {
        match self {
            DataSource::Inline(bytes) => bytes.zeroize(),
            DataSource::InlineString(text) => text.zeroize(),
            DataSource::File(_) | DataSource::EnvVar(_) => {}
        }
    }
}

fn resolve(base_dir: &Path, path: PathBuf) -> PathBuf {
    if path.is_relative() {
        base_dir.join(path)
    } else {
        path
    }
}

/// Kuma's `DataSource` in a Mesh backend: exactly one of `file`, `inline`, `inlineString`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct MeshDataSource {
    file: Option<PathBuf>,
    inline: Option<String>,
    inline_string: Option<String>,
    secret: Option<IgnoredAny>,
}

impl MeshDataSource {
    /// Checks the choice and decodes `inline`; `field` is this data source's path.
    pub(super) fn into_typed(mut self, field: &str, report: &mut Report) -> Option<DataSource> {
        if self.secret.is_some() {
            report.error(
                format!("{field}.secret"),
                "secret data sources are Kubernetes-only; use file, inline or inlineString",
            );
            return None;
        }
        let set: Vec<&str> = [
            ("file", self.file.is_some()),
            ("inline", self.inline.is_some()),
            ("inlineString", self.inline_string.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        if set.len() != 1 {
            report.error(
                field,
                format!(
                    "set exactly one of file, inline or inlineString{}",
                    if set.is_empty() {
                        String::new()
                    } else {
                        format!("; found {}", set.join(" and "))
                    }
                ),
            );
            return None;
        }
        if let Some(path) = self.file.take() {
            if path.as_os_str().is_empty() {
                report.error(format!("{field}.file"), "must not be empty");
                return None;
            }
            return Some(DataSource::File(resolve(report.base_dir(), path)));
        }
        if let Some(mut encoded) = self.inline.take() {
            encoded.retain(|c| !c.is_ascii_whitespace());
            let decoded = base64::engine::general_purpose::STANDARD.decode(&encoded);
            encoded.zeroize();
            return match decoded {
                Ok(bytes) if bytes.is_empty() => {
                    report.error(format!("{field}.inline"), "must not be empty");
                    None
                }
                Ok(bytes) => Some(DataSource::Inline(bytes)),
                Err(e) => {
                    report.error(format!("{field}.inline"), format!("not valid base64: {e}"));
                    None
                }
            };
        }
        match self.inline_string.take() {
            Some(text) if text.trim().is_empty() => {
                report.error(format!("{field}.inlineString"), "must not be empty");
                None
            }
            other => other.map(DataSource::InlineString),
        }
    }
}

impl Drop for MeshDataSource {
    fn drop(&mut self) {
        self.inline.zeroize();
        self.inline_string.zeroize();
    }
}

/// The `type` of Kuma's `SecureDataSource`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SecureType {
    File,
    EnvVar,
    InsecureInline,
    Secret,
}

/// The `type` spellings of a `SecureDataSource`.
const SECURE_TYPES: [(&str, SecureType); 4] = [
    ("File", SecureType::File),
    ("EnvVar", SecureType::EnvVar),
    ("InsecureInline", SecureType::InsecureInline),
    ("Secret", SecureType::Secret),
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PathRef {
    path: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NameRef {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InlineValue {
    value: String,
}

impl Drop for InlineValue {
    fn drop(&mut self) {
        self.value.zeroize();
    }
}

/// Kuma's `SecureDataSource` in a MeshIdentity: `type` (read as text, checked with the rest) and the
/// matching field.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct SecureDataSource {
    #[serde(rename = "type")]
    kind: Option<String>,
    file: Option<PathRef>,
    env_var: Option<NameRef>,
    insecure_inline: Option<InlineValue>,
    secret_ref: Option<IgnoredAny>,
}

impl SecureDataSource {
    /// Checks that the field matching `type` is set and no other; `field` is this data
    /// source's path.
    pub(super) fn into_typed(self, field: &str, report: &mut Report) -> Option<DataSource> {
        let kind = match &self.kind {
            Some(kind) => report.one_of(format!("{field}.type"), kind, &SECURE_TYPES)?,
            None => {
                report.error(
                    format!("{field}.type"),
                    "required; one of File, EnvVar, InsecureInline",
                );
                return None;
            }
        };
        if kind == SecureType::Secret || self.secret_ref.is_some() {
            report.error(
                format!("{field}.type"),
                "secret data sources are Kubernetes-only; use File, EnvVar or InsecureInline",
            );
            return None;
        }
        let (expected, others) = match kind {
            SecureType::File => (
                "file",
                [
                    ("envVar", self.env_var.is_some()),
                    ("insecureInline", self.insecure_inline.is_some()),
                ],
            ),
            SecureType::EnvVar => (
                "envVar",
                [
                    ("file", self.file.is_some()),
                    ("insecureInline", self.insecure_inline.is_some()),
                ],
            ),
            SecureType::InsecureInline | SecureType::Secret => (
                "insecureInline",
                [
                    ("file", self.file.is_some()),
                    ("envVar", self.env_var.is_some()),
                ],
            ),
        };
        let mut ok = true;
        for (name, _) in others.iter().filter(|(_, set)| *set) {
            report.error(
                format!("{field}.{name}"),
                format!("not allowed when type is {kind:?}"),
            );
            ok = false;
        }
        let typed = match kind {
            SecureType::File => self.file.as_ref().map(|f| f.path.clone()).map(|path| {
                if path.as_os_str().is_empty() {
                    report.error(format!("{field}.file.path"), "must not be empty");
                    ok = false;
                }
                DataSource::File(resolve(report.base_dir(), path))
            }),
            SecureType::EnvVar => self.env_var.as_ref().map(|e| {
                if e.name.is_empty() {
                    report.error(format!("{field}.envVar.name"), "must not be empty");
                    ok = false;
                }
                DataSource::EnvVar(e.name.clone())
            }),
            SecureType::InsecureInline | SecureType::Secret => {
                self.insecure_inline.as_ref().map(|i| {
                    if i.value.trim().is_empty() {
                        report.error(format!("{field}.insecureInline.value"), "must not be empty");
                        ok = false;
                    }
                    DataSource::InlineString(i.value.clone())
                })
            }
        };
        if typed.is_none() {
            report.error(
                format!("{field}.{expected}"),
                format!("required when type is {kind:?}"),
            );
        }
        typed.filter(|_| ok)
    }
}
