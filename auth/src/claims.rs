//! What a proxy token says about the proxy that holds it.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

use crate::error::{quote, AuthError, Refusal};
use crate::label;
use meshca_identity::LabelMap;

/// The `iss` claim of every meshca token.
pub const ISSUER: &str = "meshca";

/// The label every dataplane token carries; it defaults to the proxy name (`{{ .Workload }}` in templates).
const WORKLOAD_LABEL: &str = "kuma.io/workload";

/// The kind of proxy a token is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProxyType {
    /// A sidecar next to a workload (`dataplane`).
    Dataplane,
    /// A zone egress proxy serving every mesh (`zone-egress`).
    ZoneEgress,
    /// A `meshca agent` serving the Workload API on another host (`agent`). Its token names no mesh and
    /// grants no proxy's secrets: only the WorkloadRegistrations that name the agent.
    Agent,
}

impl ProxyType {
    /// The wire and command line spelling: `dataplane` or `zone-egress`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyType::Dataplane => "dataplane",
            ProxyType::ZoneEgress => "zone-egress",
            ProxyType::Agent => "agent",
        }
    }
}

impl fmt::Display for ProxyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ProxyType {
    type Err = AuthError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "dataplane" => Ok(ProxyType::Dataplane),
            "zone-egress" => Ok(ProxyType::ZoneEgress),
            other => Err(AuthError::UnknownProxyType {
                value: quote(other),
            }),
        }
    }
}

/// A proxy's labels or tags, shared: its token's claims, meshca's description of the proxy and the rule
/// its later tokens are held to all point at one map.
pub type Labels = Arc<LabelMap>;

/// The verified content of a proxy token.
///
/// Built with [`Claims::new`] / [`Claims::new_dataplane`] (which check every field), signed with
/// [`crate::SigningKey::mint`], and returned by [`crate::Verifier::verify`] only after the signature, issuer,
/// validity window and every field have been checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// The mesh the proxy belongs to (`mesh`); a DNS label such as `default`.
    pub mesh: String,
    /// The proxy name (`name`), unique within the mesh.
    pub name: String,
    /// The kind of proxy (`type`).
    pub proxy_type: ProxyType,
    /// The proxy's labels (`labels`), fixed when the token is minted; they select its MeshIdentity.
    pub labels: Labels,
    /// The proxy's inbound tags (`tags`), e.g. `kuma.io/service`.
    pub tags: Labels,
    /// When the token was minted (`iat`), unix seconds.
    pub issued_at: u64,
    /// When the token starts being accepted (`nbf`), unix seconds, if it says; `None` means from `iat`
    /// (tokens meshca mints carry no `nbf`).
    pub not_before: Option<u64>,
    /// When the token stops being accepted (`exp`), unix seconds.
    pub expires_at: u64,
    /// The token id (`jti`): 128 random bits as 32 lowercase hex digits; revocation lists name it.
    pub id: String,
}

impl Claims {
    /// Claims for a new token, valid from `now_unix` for `valid_for` (whole seconds), with a fresh random id.
    ///
    /// For a [`ProxyType::Dataplane`], `labels["kuma.io/workload"]` is set to `name` unless given. Fails when a
    /// field is invalid (see [`crate::parse_label`] for labels and tags), `valid_for` is under one second, or
    /// the system random source fails.
    pub fn new(
        proxy_type: ProxyType,
        mesh: impl Into<String>,
        name: impl Into<String>,
        mut labels: BTreeMap<String, String>,
        tags: BTreeMap<String, String>,
        valid_for: Duration,
        now_unix: u64,
    ) -> Result<Claims, AuthError> {
        let name = name.into();
        if proxy_type == ProxyType::Dataplane {
            labels
                .entry(WORKLOAD_LABEL.to_owned())
                .or_insert_with(|| name.clone());
        }
        let invalid_validity = |reason: &str| AuthError::InvalidClaim {
            field: "exp",
            reason: reason.to_owned(),
        };
        if valid_for.as_secs() == 0 {
            return Err(invalid_validity("the validity must be at least one second"));
        }
        let expires_at = now_unix
            .checked_add(valid_for.as_secs())
            .ok_or_else(|| invalid_validity("the validity is too long"))?;
        let claims = Claims {
            mesh: mesh.into(),
            name,
            proxy_type,
            labels: Arc::new(labels.into()),
            tags: Arc::new(tags.into()),
            issued_at: now_unix,
            not_before: None,
            expires_at,
            id: random_token_id()?,
        };
        claims.validate()?;
        Ok(claims)
    }

    /// Claims for a dataplane (sidecar) token; see [`Claims::new`].
    pub fn new_dataplane(
        mesh: impl Into<String>,
        name: impl Into<String>,
        labels: BTreeMap<String, String>,
        tags: BTreeMap<String, String>,
        valid_for: Duration,
        now_unix: u64,
    ) -> Result<Claims, AuthError> {
        Claims::new(
            ProxyType::Dataplane,
            mesh,
            name,
            labels,
            tags,
            valid_for,
            now_unix,
        )
    }

    /// Claims for an agent's token: no mesh, no labels or tags; see [`Claims::new`].
    pub fn new_agent(
        name: impl Into<String>,
        valid_for: Duration,
        now_unix: u64,
    ) -> Result<Claims, AuthError> {
        Claims::new(
            ProxyType::Agent,
            "",
            name,
            BTreeMap::new(),
            BTreeMap::new(),
            valid_for,
            now_unix,
        )
    }

    /// The Envoy node id this token authenticates: `<mesh>.<name>`. An agent's token authenticates no
    /// node: see [`Claims::subject`].
    pub fn node_id(&self) -> String {
        format!("{}.{}", self.mesh, self.name)
    }

    /// Whom the token is for (its `sub`): the node id `<mesh>.<name>` of a proxy, `agent:<name>` of an
    /// agent (no mesh name holds a `:`, so the two never meet).
    pub fn subject(&self) -> String {
        match self.proxy_type {
            ProxyType::Agent => format!("agent:{}", self.name),
            ProxyType::Dataplane | ProxyType::ZoneEgress => self.node_id(),
        }
    }

    /// Checks every field (not the time window, which depends on the verifier's clock).
    pub(crate) fn validate(&self) -> Result<(), AuthError> {
        let invalid =
            |field: &'static str, reason: String| AuthError::InvalidClaim { field, reason };
        if self.proxy_type == ProxyType::Agent {
            if !self.mesh.is_empty() {
                return Err(invalid("mesh", "an agent's token names no mesh".to_owned()));
            }
            if !self.labels.is_empty() || !self.tags.is_empty() {
                return Err(invalid(
                    "labels",
                    "an agent's token carries no labels or tags".to_owned(),
                ));
            }
        } else {
            validate_mesh(&self.mesh).map_err(|r| invalid("mesh", r.0))?;
        }
        validate_proxy_name(&self.name).map_err(|r| invalid("name", r.0))?;
        for (field, map) in [("labels", &self.labels), ("tags", &self.tags)] {
            for (key, value) in map.iter() {
                label::validate_key(key).map_err(|r| invalid(field, r.0))?;
                label::validate_value(value).map_err(|r| invalid(field, r.0))?;
            }
        }
        if self.expires_at <= self.issued_at {
            return Err(invalid("exp", "must be later than `iat`".to_owned()));
        }
        if self.not_before.is_some_and(|nbf| nbf >= self.expires_at) {
            return Err(invalid("nbf", "must be earlier than `exp`".to_owned()));
        }
        if !is_token_id(&self.id) {
            return Err(invalid("jti", "must be 32 lowercase hex digits".to_owned()));
        }
        Ok(())
    }
}

/// A mesh name: a DNS label (1-63 characters of `[a-z0-9-]`, alphanumeric at both ends). It holds no `.`, so
/// the node id `<mesh>.<name>` splits unambiguously at its first dot.
fn validate_mesh(mesh: &str) -> Result<(), Refusal> {
    let b = mesh.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first() != Some(&b'-')
        && b.last() != Some(&b'-');
    if ok {
        Ok(())
    } else {
        Err(Refusal(format!(
            "{} must be 1-63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit",
            quote(mesh)
        )))
    }
}

/// A proxy name: 1-253 characters of `[A-Za-z0-9._-]`, not `.` or `..`.
fn validate_proxy_name(name: &str) -> Result<(), Refusal> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Refusal(format!(
            "{} must be 1-253 characters of A-Z, a-z, 0-9, '.', '_' and '-'",
            quote(name)
        )))
    }
}

/// Whether `id` has the shape of a token id: 32 lowercase hex digits.
pub(crate) fn is_token_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// 128 bits from the system random source, as 32 lowercase hex digits.
fn random_token_id() -> Result<String, AuthError> {
    let mut bytes = [0u8; 16];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| AuthError::Key {
            reason: "the system random source failed while creating a token id".to_owned(),
        })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn dataplane_claims_default_the_workload_label() {
        let claims = Claims::new_dataplane(
            "default",
            "web-1",
            labels(&[("app", "web")]),
            labels(&[("kuma.io/service", "web")]),
            DAY,
            1_000,
        )
        .expect("valid claims");
        assert_eq!(
            claims.labels.get("kuma.io/workload").map(String::as_str),
            Some("web-1")
        );
        assert_eq!(claims.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(claims.issued_at, 1_000);
        assert_eq!(claims.expires_at, 1_000 + 86_400);
        assert_eq!(claims.node_id(), "default.web-1");
        assert!(is_token_id(&claims.id), "{}", claims.id);
    }

    #[test]
    fn given_workload_label_is_kept() {
        let claims = Claims::new_dataplane(
            "default",
            "web-1",
            labels(&[("kuma.io/workload", "web")]),
            BTreeMap::new(),
            DAY,
            0,
        )
        .expect("valid claims");
        assert_eq!(
            claims.labels.get("kuma.io/workload").map(String::as_str),
            Some("web")
        );
    }

    #[test]
    fn egress_claims_get_no_workload_label() {
        let claims = Claims::new(
            ProxyType::ZoneEgress,
            "default",
            "egress",
            BTreeMap::new(),
            BTreeMap::new(),
            DAY,
            0,
        )
        .expect("valid claims");
        assert!(claims.labels.is_empty());
        assert_eq!(claims.node_id(), "default.egress");
    }

    #[test]
    fn ids_are_random() {
        let a = Claims::new_dataplane("m", "n", BTreeMap::new(), BTreeMap::new(), DAY, 0);
        let b = Claims::new_dataplane("m", "n", BTreeMap::new(), BTreeMap::new(), DAY, 0);
        assert_ne!(a.expect("valid").id, b.expect("valid").id);
    }

    #[test]
    fn refuses_invalid_fields() {
        let make = |mesh: &str, name: &str, l: &[(&str, &str)], valid_for: Duration, now: u64| {
            Claims::new_dataplane(mesh, name, labels(l), BTreeMap::new(), valid_for, now)
        };
        let cases = [
            ("mesh", make("", "web", &[], DAY, 0)),
            ("mesh", make("Default", "web", &[], DAY, 0)),
            ("mesh", make("my.mesh", "web", &[], DAY, 0)),
            ("name", make("default", "", &[], DAY, 0)),
            ("name", make("default", "..", &[], DAY, 0)),
            ("name", make("default", "web/1", &[], DAY, 0)),
            // A name that is not a valid label value cannot become the default workload label either.
            ("labels", make("default", "web_", &[], DAY, 0)),
            (
                "labels",
                make("default", "web", &[("bad key", "v")], DAY, 0),
            ),
            (
                "exp",
                make("default", "web", &[], Duration::from_millis(999), 0),
            ),
            ("exp", make("default", "web", &[], DAY, u64::MAX)),
        ];
        for (field, result) in cases {
            match result {
                Err(AuthError::InvalidClaim { field: got, .. }) => assert_eq!(got, field),
                other => panic!("expected invalid {field}, got {other:?}"),
            }
        }
    }

    #[test]
    fn proxy_type_spellings() {
        for (text, ty) in [
            ("dataplane", ProxyType::Dataplane),
            ("zone-egress", ProxyType::ZoneEgress),
        ] {
            assert_eq!(text.parse::<ProxyType>().expect("known type"), ty);
            assert_eq!(ty.to_string(), text);
            assert_eq!(
                serde_json::to_string(&ty).expect("serializes"),
                format!("\"{text}\"")
            );
            let back: ProxyType =
                serde_json::from_str(&format!("\"{text}\"")).expect("deserializes");
            assert_eq!(back, ty);
        }
        assert!(matches!(
            "ZoneEgress".parse::<ProxyType>(),
            Err(AuthError::UnknownProxyType { .. })
        ));
    }
}
