//! Where certificate and key bytes come from: Kuma's `DataSource` (Mesh backends) and
//! `SecureDataSource` (MeshIdentity) map onto one type. A CA's private key may instead be named by
//! an RFC 7512 `pkcs11:` URI: it stays in the PKCS#11 token set by `keystore.pkcs11`.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use meshca_hsm::{ObjectType, Pkcs11Uri};
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
    /// A Mesh backend's `secret: NAME`: the universal Secret of that name in the Mesh's mesh. Replaced
    /// by its bytes when the resources are assembled; reading one that was not is an error.
    Secret(String),
    /// A private key in the PKCS#11 token of `keystore.pkcs11`, named by its URI (`pkcs11: "..."`).
    /// Only a CA's key is accepted so; its `type`, when given, is `private`, and it has an `object`
    /// or an `id`. It has no bytes: the key never leaves the token.
    Pkcs11(Pkcs11Uri),
}

/// What a data source holds: a private key may be in a PKCS#11 token, a certificate may not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Holds {
    Certificate,
    Key,
}

/// Why a certificate's data source is refused when it names a token.
const CERTIFICATE_IN_TOKEN: &str =
    "a certificate cannot live in a PKCS#11 token; only the key may be a pkcs11: URI";

impl DataSource {
    /// The bytes: reads the file or the environment variable, or copies the inline data, refusing
    /// more than `max_bytes` (`limits.dataSourceBytes`) and a file that is not a regular file (a
    /// FIFO would block, `/dev/zero` never end). Errors name the file or variable. The caller
    /// should zeroize the result once used if it holds a private key.
    ///
    /// A key in a PKCS#11 token has no bytes: [`DataSource::Pkcs11`] is an `InvalidInput` error (the
    /// loader uses the token for it).
    pub fn read(&self, max_bytes: u64) -> Result<Vec<u8>, io::Error> {
        let bytes = match self {
            DataSource::Pkcs11(uri) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{uri}: the key is in a PKCS#11 token and has no bytes to read; it is used in the token"),
                ));
            }
            DataSource::File(path) => {
                return meshca_files::read(path, max_bytes, "limits.dataSourceBytes")
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())));
            }
            DataSource::Secret(name) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no Secret {name:?} in the Mesh's mesh"),
                ))
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
            DataSource::Secret(name) => write!(f, "Secret {name}"),
            DataSource::Inline(_) => f.write_str("inline data"),
            DataSource::InlineString(_) => f.write_str("inline string"),
            DataSource::EnvVar(name) => write!(f, "environment variable {name}"),
            DataSource::Pkcs11(uri) => write!(f, "{uri}"),
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
            DataSource::Secret(name) => f.debug_tuple("Secret").field(name).finish(),
            DataSource::Pkcs11(uri) => f
                .debug_tuple("Pkcs11")
                .field(&format_args!("{uri}"))
                .finish(),
        }
    }
}

impl Drop for DataSource {
    fn drop(&mut self) {
        match self {
            DataSource::Inline(bytes) => bytes.zeroize(),
            DataSource::InlineString(text) => text.zeroize(),
            DataSource::File(_)
            | DataSource::EnvVar(_)
            | DataSource::Secret(_)
            | DataSource::Pkcs11(_) => {}
        }
    }
}

/// The key a `pkcs11` data source names, or `None` with the reason reported under `field`: a URI
/// that does not parse, a `type` other than `private`, or neither `object` nor `id`.
fn pkcs11_key(text: &str, field: &str, report: &mut Report) -> Option<DataSource> {
    let uri = match Pkcs11Uri::parse(text) {
        Ok(uri) => uri,
        Err(e) => {
            report.error(field, format!("not a pkcs11: URI meshca accepts: {e}"));
            return None;
        }
    };
    if let Some(kind) = uri.object_type().filter(|t| *t != ObjectType::Private) {
        report.error(
            field,
            format!("type={kind}: a CA key is a private key (type=private, or leave type out)"),
        );
        return None;
    }
    if uri.object().is_none() && uri.id().is_none() {
        report.error(
            field,
            "names no key: give object= (the key's label in the token) or id=, or both",
        );
        return None;
    }
    Some(DataSource::Pkcs11(uri))
}

fn resolve(base_dir: &Path, path: PathBuf) -> PathBuf {
    if path.is_relative() {
        base_dir.join(path)
    } else {
        path
    }
}

/// Kuma's `DataSource` in a Mesh backend: exactly one of `file`, `inline`, `inlineString`, or
/// (meshca's, for a key) `pkcs11`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct MeshDataSource {
    file: Option<PathBuf>,
    inline: Option<String>,
    inline_string: Option<String>,
    pkcs11: Option<String>,
    secret: Option<String>,
}

impl MeshDataSource {
    /// Checks the choice and decodes `inline`; `field` is this data source's path, `holds` what it
    /// holds.
    pub(super) fn into_typed(
        mut self,
        field: &str,
        holds: Holds,
        report: &mut Report,
    ) -> Option<DataSource> {
        if self.pkcs11.is_some() && holds == Holds::Certificate {
            report.error(format!("{field}.pkcs11"), CERTIFICATE_IN_TOKEN);
            return None;
        }
        let set: Vec<&str> = [
            ("file", self.file.is_some()),
            ("inline", self.inline.is_some()),
            ("inlineString", self.inline_string.is_some()),
            ("pkcs11", self.pkcs11.is_some()),
            ("secret", self.secret.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        if set.len() != 1 {
            let choices = match holds {
                Holds::Certificate => "file, inline, inlineString or secret",
                Holds::Key => "file, inline, inlineString, secret or pkcs11",
            };
            report.error(
                field,
                format!(
                    "set exactly one of {choices}{}",
                    if set.is_empty() {
                        String::new()
                    } else {
                        format!("; found {}", set.join(" and "))
                    }
                ),
            );
            return None;
        }
        if let Some(name) = self.secret.take() {
            // A universal Secret of the Mesh's mesh, resolved once every resource is read.
            if let Err(m) = crate::names::check_name(&name) {
                report.error(format!("{field}.secret"), m.to_string());
                return None;
            }
            return Some(DataSource::Secret(name));
        }
        if let Some(path) = self.file.take() {
            if path.as_os_str().is_empty() {
                report.error(format!("{field}.file"), "must not be empty");
                return None;
            }
            return Some(DataSource::File(resolve(report.base_dir(), path)));
        }
        if let Some(uri) = &self.pkcs11 {
            return pkcs11_key(uri, &format!("{field}.pkcs11"), report);
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

/// The `type` of Kuma's `SecureDataSource`, and meshca's `Pkcs11`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SecureType {
    File,
    EnvVar,
    InsecureInline,
    Pkcs11,
    Secret,
}

/// The `type` spellings of a `SecureDataSource`.
const SECURE_TYPES: [(&str, SecureType); 5] = [
    ("File", SecureType::File),
    ("EnvVar", SecureType::EnvVar),
    ("InsecureInline", SecureType::InsecureInline),
    ("Pkcs11", SecureType::Pkcs11),
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
/// matching field. meshca adds `pkcs11` (a URI) for a key, with `type: Pkcs11` or no `type`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct SecureDataSource {
    #[serde(rename = "type")]
    kind: Option<String>,
    file: Option<PathRef>,
    env_var: Option<NameRef>,
    insecure_inline: Option<InlineValue>,
    pkcs11: Option<String>,
    secret_ref: Option<IgnoredAny>,
}

impl SecureDataSource {
    /// Checks that the field matching `type` is set and no other; `field` is this data
    /// source's path, `holds` what it holds.
    pub(super) fn into_typed(
        self,
        field: &str,
        holds: Holds,
        report: &mut Report,
    ) -> Option<DataSource> {
        let kind = match (&self.kind, &self.pkcs11) {
            (Some(kind), _) => report.one_of(format!("{field}.type"), kind, &SECURE_TYPES)?,
            (None, Some(_)) => SecureType::Pkcs11,
            (None, None) => {
                let choices = match holds {
                    Holds::Certificate => "File, EnvVar, InsecureInline",
                    Holds::Key => "File, EnvVar, InsecureInline, Pkcs11",
                };
                report.error(
                    format!("{field}.type"),
                    format!("required; one of {choices}"),
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
        if holds == Holds::Certificate && (kind == SecureType::Pkcs11 || self.pkcs11.is_some()) {
            let at = if self.pkcs11.is_some() {
                "pkcs11"
            } else {
                "type"
            };
            report.error(format!("{field}.{at}"), CERTIFICATE_IN_TOKEN);
            return None;
        }
        let fields = [
            ("file", SecureType::File, self.file.is_some()),
            ("envVar", SecureType::EnvVar, self.env_var.is_some()),
            (
                "insecureInline",
                SecureType::InsecureInline,
                self.insecure_inline.is_some(),
            ),
            ("pkcs11", SecureType::Pkcs11, self.pkcs11.is_some()),
        ];
        let mut ok = true;
        for (name, _, _) in fields.iter().filter(|(_, of, set)| *set && *of != kind) {
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
            SecureType::Pkcs11 => match &self.pkcs11 {
                Some(uri) => {
                    // A URI that does not name a usable key is reported here; not again as missing.
                    let key = pkcs11_key(uri, &format!("{field}.pkcs11"), report);
                    ok &= key.is_some();
                    return key.filter(|_| ok);
                }
                None => None,
            },
        };
        if typed.is_none() {
            let expected = fields
                .iter()
                .find(|(_, of, _)| *of == kind)
                .map_or("insecureInline", |(name, _, _)| name);
            report.error(
                format!("{field}.{expected}"),
                format!("required when type is {kind:?}"),
            );
        }
        typed.filter(|_| ok)
    }
}
