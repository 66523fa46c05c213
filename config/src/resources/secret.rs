//! Kuma's universal `Secret` (`kumactl export --include-admin` writes them): bytes, base64 in `data`, that a
//! Mesh backend's `secret:` data source names within its mesh. Key material: never shown by `Debug`,
//! zeroized when dropped, and a value that does not decode is never quoted back.

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::de::IgnoredAny;
use serde::Deserialize;
use zeroize::{Zeroize, Zeroizing};

use super::error::{Report, Source};
use super::Labels;

/// The most bytes one Secret holds once decoded: a CA's certificate chain or key is a few KiB.
pub const MAX_SECRET_BYTES: usize = 256 * 1024;

/// A universal Secret of a mesh.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    /// The Secret's name (e.g. `default.ca-builtin-cert-ca-1`).
    pub name: String,
    /// The mesh it belongs to.
    pub mesh: String,
    /// Its bytes, decoded.
    pub data: Zeroizing<Vec<u8>>,
    /// Where it was defined.
    pub source: Source,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("mesh", &self.mesh)
            .field("data", &format_args!("<{} bytes>", self.data.len()))
            .field("source", &self.source)
            .finish()
    }
}

/// The document form of a Secret.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct SecretDoc {
    #[serde(rename = "type")]
    _kind: IgnoredAny,
    #[serde(rename = "name")]
    _name: Option<IgnoredAny>,
    #[serde(rename = "mesh")]
    _mesh: Option<IgnoredAny>,
    #[serde(rename = "labels")]
    _labels: Option<Labels>,
    #[serde(rename = "creationTime")]
    _creation_time: Option<IgnoredAny>,
    #[serde(rename = "modificationTime")]
    _modification_time: Option<IgnoredAny>,
    #[serde(rename = "kri")]
    _kri: Option<IgnoredAny>,
    data: Option<String>,
}

impl SecretDoc {
    /// Decodes `data`; errors go to `report` and never quote it.
    pub(super) fn into_typed(
        mut self,
        name: String,
        mesh: String,
        report: &mut Report,
    ) -> Option<Secret> {
        let Some(mut text) = self.data.take() else {
            report.error("data", "required: the Secret's bytes, base64");
            return None;
        };
        let decoded = STANDARD.decode(text.trim().as_bytes());
        text.zeroize();
        let data = match decoded {
            Ok(bytes) => Zeroizing::new(bytes),
            Err(_) => {
                report.error(
                    "data",
                    "not base64 (the value is not shown: it may be a key)",
                );
                return None;
            }
        };
        if data.is_empty() {
            report.error("data", "empty");
            return None;
        }
        if data.len() > MAX_SECRET_BYTES {
            report.error(
                "data",
                format!(
                    "{} bytes decoded; a Secret holds at most {MAX_SECRET_BYTES}",
                    data.len()
                ),
            );
            return None;
        }
        Some(Secret {
            name,
            mesh,
            data,
            source: report.source.clone(),
        })
    }
}
