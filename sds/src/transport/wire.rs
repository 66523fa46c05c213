//! The requests meshca decodes, as it reads them: Envoy's `DiscoveryRequest` and `DeltaDiscoveryRequest`
//! (same field numbers, same wire format) without the fields meshca never looks at. Protobuf decoding
//! skips an unknown field without keeping it, so those are never allocated: above all the node's
//! extension list, every extension Envoy was built with, about 60 KB in each stream's first request.
//!
//! The field numbers are those of `envoy.service.discovery.v3` and `envoy.config.core.v3.Node`; the
//! tests below decode what Envoy's own message types encode.
//!
//! All of it is sans-IO core: [`Trimmer`] is a state machine fed byte slices, with no shell of its
//! own; the gRPC framer ([`super::grpc`]) feeds it each request message as it arrives.
//!
//! What would let it go: no upstream issue asks for it (none found in tonic's or prost's trackers).
//! The message types would stay (prost skips the fields they leave out), but the trimmer is only
//! needed because tonic hands prost a message whole: a decoder that read a message as its frames
//! arrive, skipping unknown fields without buffering them, would let it go.

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

/// A request message meshca reads: where its node is.
pub(crate) trait Request: prost::Message + Default {
    /// The field number of its `node`.
    const NODE_FIELD: u32;
    /// Its last field in Envoy's definition. Every field from 1 to this one is a string, a message or a
    /// map: length-delimited.
    const LAST_FIELD: u32;
}

impl Request for DiscoveryRequest {
    const NODE_FIELD: u32 = 2;
    const LAST_FIELD: u32 = 7;
}

impl Request for DeltaDiscoveryRequest {
    const NODE_FIELD: u32 = 1;
    const LAST_FIELD: u32 = 9;
}

/// The node's fields that are kept ([`Node`]): `id` and `metadata`.
fn node_keeps(field: u32) -> bool {
    matches!(field, 1 | 3)
}

/// Whether Envoy defines field `field` of a request (whose last field is `last`), or of its node when
/// `in_node`, as length-delimited: every field it defines in either is. (Field 5 of the node is
/// reserved.) The trimmer refuses such a field with another wire type: prost decodes a map field
/// whatever its wire type says, so reading it otherwise would cut the message elsewhere than the
/// decoder does.
fn length_delimited(field: u32, in_node: bool, last: u32) -> bool {
    if in_node {
        matches!(field, 1..=4 | 6..=12)
    } else {
        (1..=last).contains(&field)
    }
}

/// Why a request's bytes are not a message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Malformed(pub &'static str);

/// Reads one request message as its bytes arrive and keeps all of it except the node's fields that
/// [`Node`] leaves out: what it holds is the message meshca decodes, never Envoy's extension list.
/// Field keys and lengths are read a byte at a time, field contents in bulk.
pub(crate) struct Trimmer {
    node_field: u32,
    /// The request's last field ([`Request::LAST_FIELD`]).
    last_field: u32,
    /// The message's length, in bytes.
    len: usize,
    /// Bytes of the message still to come.
    left: usize,
    /// The message as kept so far.
    out: Vec<u8>,
    /// Inside a node: its kept fields so far, and how many of its bytes are still to come.
    node: Option<(Vec<u8>, usize)>,
    step: Step,
}

/// Where a [`Trimmer`] is within a field.
enum Step {
    /// Reading a field's key.
    Key(Varint),
    /// Reading the length of a length-delimited field; `key` holds the key's bytes.
    Length {
        field: u32,
        key: Varint,
        length: Varint,
    },
    /// A varint value, kept or not; `read` bytes of it so far.
    Value { keep: bool, read: u8 },
    /// `left` bytes of a fixed-size value or a length-delimited content, kept or not.
    Content { left: usize, keep: bool },
}

/// A varint as far as it arrived, bytes and all.
#[derive(Default)]
struct Varint {
    bytes: [u8; 10],
    len: u8,
}

impl Varint {
    /// Adds a byte; the value once it is complete.
    fn push(&mut self, byte: u8) -> Result<Option<u64>, Malformed> {
        let Some(slot) = self.bytes.get_mut(usize::from(self.len)) else {
            return Err(Malformed("a varint is longer than ten bytes"));
        };
        *slot = byte;
        self.len += 1;
        if byte & 0x80 != 0 {
            return Ok(None);
        }
        let mut value = 0u64;
        for (i, b) in self.as_slice().iter().enumerate() {
            value |= u64::from(b & 0x7f) << (7 * i);
        }
        Ok(Some(value))
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

impl Trimmer {
    /// A trimmer for a request `T` of `len` bytes.
    pub(crate) fn new<T: Request>(len: usize) -> Self {
        Trimmer {
            node_field: T::NODE_FIELD,
            last_field: T::LAST_FIELD,
            len,
            left: len,
            out: Vec::new(),
            node: None,
            step: Step::Key(Varint::default()),
        }
    }

    /// Bytes of the message still to come.
    pub(crate) fn left(&self) -> usize {
        self.left
    }

    /// The bytes it holds: never more than it was fed, so never more than the message's length
    /// (which the gRPC framer bounds by `limits.requestBytes` before a trimmer starts).
    pub(crate) fn held(&self) -> usize {
        self.out.len() + self.node.as_ref().map_or(0, |(node, _)| node.len())
    }

    /// Reads the next bytes of the message: at most [`Self::left`] of them.
    pub(crate) fn feed(&mut self, mut data: &[u8]) -> Result<(), Malformed> {
        if data.len() > self.left {
            return Err(Malformed("more bytes than the message holds"));
        }
        while !data.is_empty() {
            let in_node = self.node.is_some();
            let used = match &mut self.step {
                Step::Content { left, keep } => {
                    let n = (*left).min(data.len());
                    let keep = *keep;
                    *left -= n;
                    if *left == 0 {
                        self.step = Step::Key(Varint::default());
                    }
                    if keep {
                        self.sink().extend_from_slice(&data[..n]);
                    }
                    n
                }
                _ => {
                    self.byte(data[0])?;
                    1
                }
            };
            data = &data[used..];
            self.left -= used;
            if in_node {
                if let Some((_, node_left)) = &mut self.node {
                    *node_left -= used;
                }
            }
            self.close_node()?;
        }
        debug_assert!(self.held() <= self.len - self.left);
        Ok(())
    }

    /// The message as kept, once every byte was read.
    pub(crate) fn finish(self) -> Result<Vec<u8>, Malformed> {
        let at_boundary = matches!(&self.step, Step::Key(key) if key.is_empty());
        if self.left != 0 || self.node.is_some() || !at_boundary {
            return Err(Malformed("the message ends inside a field"));
        }
        Ok(self.out)
    }

    /// Where kept bytes go: the node's fields, or the message.
    fn sink(&mut self) -> &mut Vec<u8> {
        match &mut self.node {
            Some((node, _)) => node,
            None => &mut self.out,
        }
    }

    /// How many bytes the current level (the node, or the message) holds after the one being read.
    fn room(&self) -> usize {
        let level = self.node.as_ref().map_or(self.left, |(_, left)| *left);
        level.saturating_sub(1)
    }

    fn byte(&mut self, byte: u8) -> Result<(), Malformed> {
        let room = self.room();
        let in_node = self.node.is_some();
        match std::mem::replace(&mut self.step, Step::Key(Varint::default())) {
            Step::Key(mut key) => {
                let Some(value) = key.push(byte)? else {
                    self.step = Step::Key(key);
                    return Ok(());
                };
                let field = u32::try_from(value >> 3)
                    .ok()
                    .filter(|f| *f != 0)
                    .ok_or(Malformed("a field number is zero or too large"))?;
                let keep = !in_node || node_keeps(field);
                if value & 7 != 2 && length_delimited(field, in_node, self.last_field) {
                    return Err(Malformed(
                        "a field that is length-delimited comes with another wire type",
                    ));
                }
                let size = match value & 7 {
                    0 => None,
                    1 => Some(8),
                    5 => Some(4),
                    2 => {
                        self.step = Step::Length {
                            field,
                            key,
                            length: Varint::default(),
                        };
                        return Ok(());
                    }
                    _ => return Err(Malformed("a field has a group or unknown wire type")),
                };
                if keep {
                    self.sink().extend_from_slice(key.as_slice());
                }
                self.step = match size {
                    None => Step::Value { keep, read: 0 },
                    Some(size) if size <= room => Step::Content { left: size, keep },
                    Some(_) => return Err(Malformed("a fixed-size field overruns its message")),
                };
            }
            Step::Length {
                field,
                key,
                mut length,
            } => {
                let Some(len) = length.push(byte)? else {
                    self.step = Step::Length { field, key, length };
                    return Ok(());
                };
                let len = usize::try_from(len)
                    .ok()
                    .filter(|len| *len <= room)
                    .ok_or(Malformed("a field overruns its message"))?;
                if !in_node && field == self.node_field {
                    // The node's own key and length are written once its kept fields are known.
                    // (This byte counts against the message, not the node.)
                    self.node = Some((Vec::new(), len));
                    return Ok(());
                }
                let keep = !in_node || node_keeps(field);
                if keep {
                    let sink = self.sink();
                    sink.extend_from_slice(key.as_slice());
                    sink.extend_from_slice(length.as_slice());
                }
                if len > 0 {
                    self.step = Step::Content { left: len, keep };
                }
            }
            Step::Value { keep, read } => {
                if read >= 10 {
                    return Err(Malformed("a varint is longer than ten bytes"));
                }
                if keep {
                    self.sink().push(byte);
                }
                if byte & 0x80 != 0 {
                    self.step = Step::Value {
                        keep,
                        read: read + 1,
                    };
                }
            }
            Step::Content { .. } => unreachable!("contents are read in bulk"),
        }
        Ok(())
    }

    /// Writes the node out once all its bytes were read.
    fn close_node(&mut self) -> Result<(), Malformed> {
        if !matches!(&self.node, Some((_, 0))) {
            return Ok(());
        }
        if !matches!(&self.step, Step::Key(key) if key.is_empty()) {
            return Err(Malformed("the node ends inside a field"));
        }
        let (node, _) = self.node.take().expect("checked above");
        put_varint(&mut self.out, u64::from(self.node_field) << 3 | 2);
        put_varint(&mut self.out, node.len() as u64);
        self.out.extend_from_slice(&node);
        Ok(())
    }
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

    /// Trims `bytes` fed in pieces cut at `cuts`.
    fn trim<T: Request>(bytes: &[u8], cuts: &[usize]) -> Result<Vec<u8>, Malformed> {
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        at.extend([0, bytes.len()]);
        at.sort_unstable();
        at.dedup();
        let mut trimmer = Trimmer::new::<T>(bytes.len());
        for piece in at.windows(2) {
            trimmer.feed(&bytes[piece[0]..piece[1]])?;
        }
        trimmer.finish()
    }

    proptest! {
        /// Trimmed in any pieces, a request decodes to what the whole one decodes to, and the node
        /// keeps nothing but its id and metadata.
        #[test]
        fn a_trimmed_request_reads_as_the_whole_one(
            version_info in text(), node in envoy_node(), resource_names in names(),
            response_nonce in text(), error_detail in error(),
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
        ) {
            let sent = envoy::DiscoveryRequest {
                version_info, node, resource_names, response_nonce, error_detail,
                type_url: "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret".to_owned(),
                ..Default::default()
            };
            let bytes = sent.encode_to_vec();
            let kept = trim::<DiscoveryRequest>(&bytes, &cuts).expect("well formed");
            prop_assert_eq!(
                DiscoveryRequest::decode(kept.as_slice()).expect("decodes"),
                DiscoveryRequest::decode(bytes.as_slice()).expect("decodes")
            );
            let as_envoy = envoy::DiscoveryRequest::decode(kept.as_slice()).expect("decodes");
            if let Some(node) = as_envoy.node {
                prop_assert!(node.extensions.is_empty() && node.cluster.is_empty());
                prop_assert!(node.user_agent_name.is_empty() && node.client_features.is_empty());
            }
        }

        #[test]
        fn a_trimmed_delta_request_reads_as_the_whole_one(
            node in envoy_node(), subscribe in names(),
            versions in proptest::collection::hash_map(text(), text(), 0..4),
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
        ) {
            let sent = envoy::DeltaDiscoveryRequest {
                node,
                resource_names_subscribe: subscribe,
                initial_resource_versions: versions,
                ..Default::default()
            };
            let bytes = sent.encode_to_vec();
            let kept = trim::<DeltaDiscoveryRequest>(&bytes, &cuts).expect("well formed");
            prop_assert_eq!(
                DeltaDiscoveryRequest::decode(kept.as_slice()).expect("decodes"),
                DeltaDiscoveryRequest::decode(bytes.as_slice()).expect("decodes")
            );
        }

        /// Arbitrary bytes are trimmed or refused, never more than they were; when both the trimmer
        /// and the decoder accept them, the trimmed message reads as the whole one.
        #[test]
        fn arbitrary_bytes_trim_or_are_refused(
            bytes in proptest::collection::vec(any::<u8>(), 0..300),
            cuts in proptest::collection::vec(any::<usize>(), 0..6),
        ) {
            if let Ok(kept) = trim::<DiscoveryRequest>(&bytes, &cuts) {
                prop_assert!(kept.len() <= bytes.len() + 10);
                if let (Ok(whole), Ok(trimmed)) = (
                    DiscoveryRequest::decode(bytes.as_slice()),
                    DiscoveryRequest::decode(kept.as_slice()),
                ) {
                    prop_assert_eq!(whole, trimmed);
                }
            }
        }
    }

    #[test]
    fn malformed_requests_are_refused_with_a_reason() {
        let field_overruns = [0x1a, 0x05, b'a']; // field 3, 5 bytes announced, 1 sent
        assert_eq!(
            trim::<DiscoveryRequest>(&field_overruns, &[]),
            Err(Malformed("a field overruns its message"))
        );
        let group = [0x43]; // field 8 (not one of the request's), wire type 3
        assert_eq!(
            trim::<DiscoveryRequest>(&group, &[]),
            Err(Malformed("a field has a group or unknown wire type"))
        );
        let varint_version = [0x08, 0x01]; // version_info (a string) as a varint
        assert_eq!(
            trim::<DiscoveryRequest>(&varint_version, &[]),
            Err(Malformed(
                "a field that is length-delimited comes with another wire type"
            ))
        );
        let field_zero = [0x02, 0x00];
        assert_eq!(
            trim::<DiscoveryRequest>(&field_zero, &[]),
            Err(Malformed("a field number is zero or too large"))
        );
        let node_overrun = [0x12, 0x02, 0x0a, 0x05, b'a', b'b']; // node of 2 bytes holding an id of 5
        assert_eq!(
            trim::<DiscoveryRequest>(&node_overrun, &[]),
            Err(Malformed("a field overruns its message"))
        );
        let cut_key = [0x80];
        assert_eq!(
            trim::<DiscoveryRequest>(&cut_key, &[]),
            Err(Malformed("the message ends inside a field"))
        );
    }

    #[test]
    fn an_envoy_sized_node_is_trimmed_to_its_id_and_metadata() {
        let node = core::Node {
            id: "default.web-1".to_owned(),
            extensions: (0..420)
                .map(|i| core::Extension {
                    name: format!("envoy.filters.http.extension_{i:04}"),
                    category: "envoy.filters.http".to_owned(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let sent = envoy::DiscoveryRequest {
            node: Some(node),
            resource_names: vec!["default".to_owned()],
            ..Default::default()
        };
        let bytes = sent.encode_to_vec();
        let kept = trim::<DiscoveryRequest>(&bytes, &[]).expect("well formed");
        assert!(
            bytes.len() > 20_000 && kept.len() < 40,
            "{} -> {}",
            bytes.len(),
            kept.len()
        );
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
