//! `StreamSecrets`, the state-of-the-world protocol: every response holds all asked resources that are
//! available, under one version that is a hash of their content. A request carrying the last nonce is
//! an ACK (same version) or a NACK, one carrying an older nonce is ignored, and a request that changes
//! the names is a new subscription.

use std::collections::BTreeSet;
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use envoy_types::pb::google::protobuf::Any;
use meshca_control::{parse_names, ResourceName};
use prost::Message;

use crate::names;
use crate::registry::StreamKind;
use crate::secret::{SharedResponse, SECRET_TYPE_URL};
use crate::stream::{Build, Current, Header, Protocol};
use crate::transport::grpc::Encode;
use crate::transport::wire::{DiscoveryRequest, Node};

/// A state-of-the-world stream's subscription.
#[derive(Debug, Default)]
pub(crate) struct Sotw {
    names: Vec<ResourceName>,
}

/// A `StreamSecrets` response: built for one stream, or shared by every stream that asks for the same
/// trust by the same name (encoded once; each stream adds its nonce).
#[derive(Debug)]
pub(crate) enum SotwResponse {
    Built(DiscoveryResponse),
    Shared {
        response: Arc<SharedResponse>,
        nonce: String,
    },
}

/// `DiscoveryResponse.nonce`'s field number.
const NONCE_FIELD: u32 = 5;

impl SotwResponse {
    /// The length of the nonce field alone, encoded (as a message would: an empty one is left out).
    fn nonce_len(nonce: &String) -> usize {
        if nonce.is_empty() {
            0
        } else {
            prost::encoding::string::encoded_len(NONCE_FIELD, nonce)
        }
    }
}

impl Encode for SotwResponse {
    fn message_len(&self) -> usize {
        match self {
            SotwResponse::Built(response) => Message::encoded_len(response),
            SotwResponse::Shared { response, nonce } => {
                response.encoded.len() + Self::nonce_len(nonce)
            }
        }
    }

    fn write_message(&self, buf: &mut Vec<u8>) {
        match self {
            SotwResponse::Built(response) => response.encode_raw(buf),
            // Protobuf merges the nonce field into the message that precedes it.
            SotwResponse::Shared { response, nonce } => {
                buf.extend_from_slice(&response.encoded);
                if !nonce.is_empty() {
                    prost::encoding::string::encode(NONCE_FIELD, nonce, buf);
                }
            }
        }
    }
}

impl Protocol for Sotw {
    type Request = DiscoveryRequest;
    type Response = SotwResponse;
    const KIND: StreamKind = StreamKind::Sotw;
    /// A request with a stale nonce crossed a push: its names are as stale as its reply.
    const STALE_IGNORES_SUBSCRIPTION: bool = true;

    fn take_node(r: &mut DiscoveryRequest) -> Option<Node> {
        r.node.take()
    }

    fn header(r: &DiscoveryRequest) -> Header<'_> {
        let (node, error) = (r.node.as_ref(), r.error_detail.as_ref());
        Header::new(
            node,
            &r.type_url,
            &r.response_nonce,
            error,
            Some(&r.version_info),
        )
    }

    fn requested_names(request: &DiscoveryRequest) -> impl Iterator<Item = &str> {
        request.resource_names.iter().map(String::as_str)
    }

    fn subscribe(&mut self, request: DiscoveryRequest, _first: bool) -> Option<Vec<ResourceName>> {
        // An ACK repeats the names of its request, in the same order: nothing to parse then.
        let repeated = request.resource_names.len() == self.names.len()
            && request
                .resource_names
                .iter()
                .zip(&self.names)
                .all(|(asked, held)| asked == held.as_str());
        if repeated {
            return None;
        }
        let names = parse_names(request.resource_names);
        if as_set(&names) == as_set(&self.names) {
            return None;
        }
        self.names = names;
        Some(self.names.clone())
    }

    fn responds(_first: bool, fresh: bool, changed: bool) -> Option<bool> {
        (fresh || changed).then_some(fresh)
    }

    fn build(&mut self, current: &mut Current<'_>) -> Build<SotwResponse> {
        let items: Vec<(&ResourceName, names::Resolved, String)> = self
            .names
            .iter()
            .filter_map(|name| {
                let resolved = current.resolve(name)?;
                let version = resolved.version();
                Some((name, resolved, version))
            })
            .collect();
        let shared = match items.as_slice() {
            [] => return Build::Withheld,
            // Trust alone: the response every stream asking by this name gets.
            [(name, names::Resolved::Validation(encoded), _)] => {
                encoded.alone(name.as_str(), || {
                    let response = whole_response(&items, vec![encoded.to_any(name.as_str())]);
                    SharedResponse {
                        encoded: response.encode_to_vec(),
                        version: response.version_info,
                    }
                })
            }
            _ => None,
        };
        let (response, version) = match shared {
            Some(shared) => {
                let version = shared.version.clone();
                let response = SotwResponse::Shared {
                    response: shared,
                    nonce: String::new(),
                };
                (response, version)
            }
            None => {
                let resources: Result<Vec<Any>, _> = items
                    .iter()
                    .map(|(name, resolved, _)| resolved.to_any(name.as_str()))
                    .collect();
                let response = match resources {
                    Ok(resources) => whole_response(&items, resources),
                    Err(keyless) => return Build::Refused(keyless),
                };
                let version = response.version_info.clone();
                (SotwResponse::Built(response), version)
            }
        };
        if !current.force && current.last_version == Some(version.as_str()) {
            return Build::Unchanged;
        }
        Build::Send {
            response,
            version,
            resources: items.iter().map(|(name, ..)| name.to_string()).collect(),
        }
    }

    fn set_nonce(response: &mut SotwResponse, nonce: String) {
        match response {
            SotwResponse::Built(response) => response.nonce = nonce,
            SotwResponse::Shared { nonce: n, .. } => *n = nonce,
        }
    }
}

/// The response that carries `items` (each asked name, what it resolved to, and its version) as
/// `resources` (their secrets, in the same order), without a nonce; its version changes iff a name or
/// a content does.
fn whole_response(
    items: &[(&ResourceName, names::Resolved, String)],
    resources: Vec<Any>,
) -> DiscoveryResponse {
    let version = names::response_version(
        items
            .iter()
            .map(|(name, _, version)| (name.as_str(), version.as_str())),
    );
    DiscoveryResponse {
        version_info: version,
        resources,
        type_url: SECRET_TYPE_URL.to_owned(),
        ..Default::default()
    }
}

fn as_set(names: &[ResourceName]) -> BTreeSet<&str> {
    names.iter().map(ResourceName::as_str).collect()
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::google::protobuf::Any;

    use super::*;

    /// A shared response with its nonce is the very response built for one stream: its length is
    /// announced right and it decodes to the same message.
    #[test]
    fn a_shared_response_decodes_as_the_built_one() {
        let built = DiscoveryResponse {
            version_info: "v1".into(),
            resources: vec![Any {
                type_url: SECRET_TYPE_URL.into(),
                value: b"secret bytes".to_vec(),
            }],
            type_url: SECRET_TYPE_URL.into(),
            nonce: "7-3".into(),
            ..Default::default()
        };
        let without_nonce = DiscoveryResponse {
            nonce: String::new(),
            ..built.clone()
        };
        let shared = SotwResponse::Shared {
            response: Arc::new(SharedResponse {
                version: "v1".into(),
                encoded: without_nonce.encode_to_vec(),
            }),
            nonce: "7-3".into(),
        };
        let mut buf = Vec::new();
        shared.write_message(&mut buf);
        assert_eq!(buf.len(), shared.message_len());
        assert_eq!(
            DiscoveryResponse::decode(buf.as_slice()).expect("decodes"),
            built
        );
        let mut own = Vec::new();
        SotwResponse::Built(built.clone()).write_message(&mut own);
        assert_eq!(own.len(), SotwResponse::Built(built).message_len());
    }

    /// A request changes the subscription only when its set of names differs from the last one's: an
    /// ACK repeating the names (in any order, with repeats) changes nothing.
    #[test]
    fn only_another_set_of_names_changes_the_subscription() {
        let mut sotw = Sotw::default();
        let asking = |names: &[&str]| DiscoveryRequest {
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        };
        let held = |names: Option<Vec<ResourceName>>| {
            names.map(|names| {
                names
                    .iter()
                    .map(|n| n.as_str().to_owned())
                    .collect::<Vec<_>>()
            })
        };
        let first = sotw.subscribe(asking(&["default", "ROOTCA"]), true);
        assert_eq!(held(first), Some(vec!["default".into(), "ROOTCA".into()]));
        assert_eq!(
            held(sotw.subscribe(asking(&["default", "ROOTCA"]), false)),
            None
        );
        assert_eq!(
            held(sotw.subscribe(asking(&["ROOTCA", "default"]), false)),
            None
        );
        assert_eq!(
            held(sotw.subscribe(asking(&["ROOTCA", "default", "ROOTCA"]), false)),
            None
        );
        assert_eq!(
            held(sotw.subscribe(asking(&["ROOTCA"]), false)),
            Some(vec!["ROOTCA".into()])
        );
        assert_eq!(
            held(sotw.subscribe(asking(&["ROOTCA", "ROOTCA"]), false)),
            None
        );
        assert_eq!(
            held(sotw.subscribe(asking(&["default"]), false)),
            Some(vec!["default".into()])
        );
        // As many names, as long, but other ones.
        assert_eq!(
            held(sotw.subscribe(asking(&["ROOTCA"]), false)),
            Some(vec!["ROOTCA".into()])
        );
        assert_eq!(
            held(sotw.subscribe(asking(&["rootca"]), false)),
            Some(vec!["rootca".into()])
        );
        assert_eq!(held(sotw.subscribe(asking(&[]), false)), Some(vec![]));
        assert_eq!(held(sotw.subscribe(asking(&[]), false)), None);
    }
}
