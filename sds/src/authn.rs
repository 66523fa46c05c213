//! Authenticating proxies: the bearer token, the node id, the node's preferences; or a caller another
//! service authenticated (the Workload API socket, by the caller's process).

use meshca_serve::shown;

use envoy_types::pb::google::protobuf::value::Kind;
use meshca_auth::{Claims, ProxyType};
use meshca_serve::AttestedCheck;
use tonic::Status;

use meshca_control::ProxyKey;

use crate::names::ProxyContext;
use crate::secret::Form;
use crate::transport::wire::Node;

/// The node metadata key that asks for plain `trusted_ca` validation contexts.
pub const DISABLE_SPIFFE_VALIDATION_KEY: &str = "disable_spiffe_cert_validation";

/// Who a stream or fetch speaks for, and how that was established.
pub(crate) struct Principal {
    /// The proxy: from its verified token, or made for an attested caller.
    pub claims: Claims,
    /// Set for a caller authenticated without a token: it names no node id of its own (its requests'
    /// node ids are not checked), and this check runs on each snapshot it is served from.
    pub attested: Option<AttestedCheck>,
}

impl Principal {
    /// A proxy that presented a verified token.
    pub(crate) fn token(claims: Claims) -> Principal {
        Principal {
            claims,
            attested: None,
        }
    }
}

/// The proxy a set of verified claims speaks for.
pub(crate) fn proxy_key(claims: &Claims) -> ProxyKey {
    ProxyKey::new(claims.mesh.clone(), claims.name.clone())
}

/// Checks the node id of the first request of a stream (or of a fetch): it is required and
/// must be the token's `<mesh>.<name>`.
pub(crate) fn check_first_node(node: Option<&Node>, key: &ProxyKey) -> Result<(), Status> {
    match node {
        Some(node) if !node.id.is_empty() => check_node_id(&node.id, key),
        _ => Err(Status::invalid_argument(format!(
            "the first request must carry node.id (expected {:?})",
            key.node_id()
        ))),
    }
}

/// Checks a later request of a stream: it may omit the node, but a node id it carries must
/// not differ from the stream's.
pub(crate) fn check_later_node(node: Option<&Node>, key: &ProxyKey) -> Result<(), Status> {
    match node {
        Some(node) if !node.id.is_empty() => check_node_id(&node.id, key).map_err(|_| {
            Status::permission_denied(format!(
                "node id changed on the stream from {:?} to {}",
                key.node_id(),
                shown(&node.id)
            ))
        }),
        _ => Ok(()),
    }
}

fn check_node_id(node_id: &str, key: &ProxyKey) -> Result<(), Status> {
    let expected = key.node_id();
    if node_id == expected {
        Ok(())
    } else {
        Err(Status::permission_denied(format!(
            "node id {} does not match the token, which is for {expected:?}",
            shown(node_id)
        )))
    }
}

/// What the server needs to know about the asking proxy to resolve resource names.
pub(crate) fn proxy_context(claims: &Claims, node: Option<&Node>) -> ProxyContext {
    ProxyContext {
        key: proxy_key(claims),
        zone_egress: claims.proxy_type == ProxyType::ZoneEgress,
        form: if spiffe_validation_disabled(node) {
            Form::Plain
        } else {
            Form::Spiffe
        },
    }
}

/// True when the node metadata sets `disable_spiffe_cert_validation` to `true` (a bool, or
/// the string "true").
pub(crate) fn spiffe_validation_disabled(node: Option<&Node>) -> bool {
    let value = node
        .and_then(|node| node.metadata.as_ref())
        .and_then(|metadata| metadata.fields.get(DISABLE_SPIFFE_VALIDATION_KEY))
        .and_then(|value| value.kind.as_ref());
    match value {
        Some(Kind::BoolValue(flag)) => *flag,
        Some(Kind::StringValue(text)) => text.trim().eq_ignore_ascii_case("true"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::{Struct, Value};

    fn node_with(value: Kind) -> Node {
        let mut metadata = Struct::default();
        metadata.fields.insert(
            DISABLE_SPIFFE_VALIDATION_KEY.into(),
            Value { kind: Some(value) },
        );
        Node {
            id: "m.p".into(),
            metadata: Some(metadata),
        }
    }

    #[test]
    fn spiffe_validation_flag_accepts_bool_and_string() {
        assert!(spiffe_validation_disabled(Some(&node_with(
            Kind::BoolValue(true)
        ))));
        assert!(spiffe_validation_disabled(Some(&node_with(
            Kind::StringValue("true".into())
        ))));
        assert!(!spiffe_validation_disabled(Some(&node_with(
            Kind::BoolValue(false)
        ))));
        assert!(!spiffe_validation_disabled(Some(&node_with(
            Kind::StringValue("no".into())
        ))));
        assert!(!spiffe_validation_disabled(None));
    }

    #[test]
    fn node_id_rules() {
        let key = ProxyKey::new("m", "p");
        let node = |id: &str| Node {
            id: id.into(),
            ..Default::default()
        };
        assert!(check_first_node(Some(&node("m.p")), &key).is_ok());
        assert_eq!(
            check_first_node(None, &key).map_err(|s| s.code()),
            Err(tonic::Code::InvalidArgument)
        );
        assert_eq!(
            check_first_node(Some(&node("m.q")), &key).map_err(|s| s.code()),
            Err(tonic::Code::PermissionDenied)
        );
        assert!(check_later_node(None, &key).is_ok());
        assert_eq!(
            check_later_node(Some(&node("other.p")), &key).map_err(|s| s.code()),
            Err(tonic::Code::PermissionDenied)
        );
    }
}
