//! The requests meshca decodes, as it reads them: Envoy's `DiscoveryRequest` and `DeltaDiscoveryRequest`
//! (same field numbers, same wire format) without the fields meshca never looks at. Protobuf decoding
//! skips an unknown field without keeping it, so those are never allocated: above all the node's
//! extension list, every extension Envoy was built with, about 60 KB in each stream's first request.
//!
//! The field numbers are those of `envoy.service.discovery.v3` and `envoy.config.core.v3.Node`; the
//! tests below decode what Envoy's own message types encode.

use std::collections::HashMap;

use envoy_types::pb::google::protobuf::Struct;
use envoy_types::pb::google::rpc::Status as RpcStatus;

/// The parts of `envoy.config.core.v3.Node` meshca reads.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Node {
    /// The node id, `<mesh>.<name>`.
    #[prost(string, tag = "1")]
    pub id: String,
    /// The node metadata (`disable_spiffe_cert_validation`).
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<Struct>,
}

/// `envoy.service.discovery.v3.DiscoveryRequest`, less `resource_locators`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DiscoveryRequest {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, optional, tag = "2")]
    pub node: Option<Node>,
    #[prost(string, repeated, tag = "3")]
    pub resource_names: Vec<String>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub response_nonce: String,
    #[prost(message, optional, tag = "6")]
    pub error_detail: Option<RpcStatus>,
}

/// `envoy.service.discovery.v3.DeltaDiscoveryRequest`, less the resource locators.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DeltaDiscoveryRequest {
    #[prost(message, optional, tag = "1")]
    pub node: Option<Node>,
    #[prost(string, tag = "2")]
    pub type_url: String,
    #[prost(string, repeated, tag = "3")]
    pub resource_names_subscribe: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    pub resource_names_unsubscribe: Vec<String>,
    #[prost(map = "string, string", tag = "5")]
    pub initial_resource_versions: HashMap<String, String>,
    #[prost(string, tag = "6")]
    pub response_nonce: String,
    #[prost(message, optional, tag = "7")]
    pub error_detail: Option<RpcStatus>,
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3 as core;
    use envoy_types::pb::envoy::service::discovery::v3 as envoy;
    use envoy_types::pb::google::protobuf::{value::Kind, Value};
    use proptest::prelude::*;
    use prost::Message;

    use super::*;

    fn text() -> impl Strategy<Value = String> {
        "[a-z0-9._:/-]{0,24}"
    }

    fn names() -> impl Strategy<Value = Vec<String>> {
        proptest::collection::vec(text(), 0..5)
    }

    /// A node as Envoy sends it: id, metadata, and the fields meshca skips.
    fn envoy_node() -> impl Strategy<Value = Option<core::Node>> {
        let node = (
            text(),
            text(),
            any::<bool>(),
            proptest::collection::vec(text(), 0..20),
        )
            .prop_map(|(id, cluster, flag, extensions)| core::Node {
                id,
                cluster,
                user_agent_name: "envoy".to_owned(),
                metadata: Some(Struct {
                    fields: [(
                        "disable_spiffe_cert_validation".to_owned(),
                        Value {
                            kind: Some(Kind::BoolValue(flag)),
                        },
                    )]
                    .into(),
                }),
                extensions: extensions
                    .into_iter()
                    .map(|name| core::Extension {
                        name,
                        category: "envoy.filters.http".to_owned(),
                        ..Default::default()
                    })
                    .collect(),
                client_features: vec!["envoy.lb.does_not_support_overprovisioning".to_owned()],
                ..Default::default()
            });
        proptest::option::of(node)
    }

    fn error() -> impl Strategy<Value = Option<RpcStatus>> {
        proptest::option::of(
            (any::<i32>(), text()).prop_map(|(code, message)| RpcStatus {
                code,
                message,
                details: Vec::new(),
            }),
        )
    }

    fn read_node(node: Option<core::Node>) -> Option<Node> {
        node.map(|n| Node {
            id: n.id,
            metadata: n.metadata,
        })
    }

    proptest! {
        #[test]
        fn a_discovery_request_reads_as_envoy_wrote_it(
            version_info in text(), node in envoy_node(), resource_names in names(),
            type_url in text(), response_nonce in text(), error_detail in error(),
        ) {
            let sent = envoy::DiscoveryRequest {
                version_info, node, resource_names, type_url, response_nonce, error_detail,
                resource_locators: vec![envoy::ResourceLocator { name: "skipped".to_owned(), ..Default::default() }],
            };
            let read = DiscoveryRequest::decode(sent.encode_to_vec().as_slice()).expect("decodes");
            prop_assert_eq!(read, DiscoveryRequest {
                version_info: sent.version_info,
                node: read_node(sent.node),
                resource_names: sent.resource_names,
                type_url: sent.type_url,
                response_nonce: sent.response_nonce,
                error_detail: sent.error_detail,
            });
        }

        #[test]
        fn a_delta_request_reads_as_envoy_wrote_it(
            node in envoy_node(), type_url in text(), subscribe in names(), unsubscribe in names(),
            versions in proptest::collection::hash_map(text(), text(), 0..4),
            response_nonce in text(), error_detail in error(),
        ) {
            let sent = envoy::DeltaDiscoveryRequest {
                node, type_url,
                resource_names_subscribe: subscribe,
                resource_names_unsubscribe: unsubscribe,
                initial_resource_versions: versions,
                response_nonce, error_detail,
                ..Default::default()
            };
            let read = DeltaDiscoveryRequest::decode(sent.encode_to_vec().as_slice()).expect("decodes");
            prop_assert_eq!(read, DeltaDiscoveryRequest {
                node: read_node(sent.node),
                type_url: sent.type_url,
                resource_names_subscribe: sent.resource_names_subscribe,
                resource_names_unsubscribe: sent.resource_names_unsubscribe,
                initial_resource_versions: sent.initial_resource_versions,
                response_nonce: sent.response_nonce,
                error_detail: sent.error_detail,
            });
        }
    }
}
