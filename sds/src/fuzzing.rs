//! Entry points for the coverage-guided fuzz targets in `sds/fuzz/` (docs/fuzzing.md), one per parser
//! that reads a peer's bytes before its token is checked. Each takes an arbitrary byte string (the
//! first bytes choose a limit and where reads are cut), drives the parser's sans-IO core, and panics
//! when an invariant fails. `cargo test` replays the committed corpus through them
//! (`sds/tests/fuzz_corpus.rs`). Hidden from the documentation: this is not an API.

use std::fmt::Debug;

use envoy_types::pb::envoy::service::discovery::v3 as envoy;
use prost::Message;

use crate::transport::grpc::framing::{RequestFramer, HEADER};
use crate::transport::wire::{
    self, DeltaDiscoveryRequest, DiscoveryRequest, Malformed, Node, Trimmer,
};
use meshca_serve::fuzzing::chunks;

/// The gRPC framer of streaming requests. Input: a limit byte (`limits.requestBytes` = 16 times
/// it), a byte choosing SotW or delta requests, three data-frame-size bytes, then the body.
///
/// Checks (besides the framer's own assertion that it never holds more than a header and the limit):
/// it never holds more than that after a read, every message it yields fits the limit, and nothing of
/// a message is held once it is yielded.
pub fn grpc_requests(data: &[u8]) {
    let Some((&[limit, kind, sizes @ ..], body)) = data.split_first_chunk::<5>() else {
        return;
    };
    let max_bytes = usize::from(limit) * 16;
    if kind & 1 == 0 {
        read_requests::<DiscoveryRequest>(body, &sizes, max_bytes);
    } else {
        read_requests::<DeltaDiscoveryRequest>(body, &sizes, max_bytes);
    }
}

/// Feeds `body` to a framer in data frames of `sizes` (cycled), until the end or its first refusal.
fn read_requests<T: wire::Request>(body: &[u8], sizes: &[u8], max_bytes: usize) {
    let mut framer = RequestFramer::<T>::new(max_bytes);
    for mut frame in chunks(body, sizes) {
        loop {
            let Ok((read, message)) = framer.read(frame) else {
                return;
            };
            frame = &frame[read..];
            assert!(
                framer.held() <= HEADER + max_bytes,
                "{} bytes held, over a header and the limit of {max_bytes}",
                framer.held()
            );
            let Some(message) = message else {
                assert!(frame.is_empty(), "a read stopped short of a message's end");
                break;
            };
            assert!(
                message.encoded_len() <= max_bytes,
                "a message over the limit was decoded"
            );
            assert!(
                framer.between_messages() && framer.held() == 0,
                "bytes held between messages"
            );
        }
    }
}

/// The request trimmer, checked against envoy-types. Input: a byte choosing `DiscoveryRequest` or
/// `DeltaDiscoveryRequest`, three read-size bytes, then one message.
///
/// Checks: the trimmer never holds more than it was fed, and keeps no more than the message; when
/// envoy-types decodes the message, what the trimmer keeps decodes to the same fields, unless the
/// trimmer refuses it for a group or for a wire type that is not the field's (prost skips groups,
/// and reads a map field whatever its wire type says), and envoy-types' own encoding of what it
/// decoded is always accepted and read the same; when only meshca's types decode the message, the
/// trimmed and the whole message read the same.
pub fn request_trimmer(data: &[u8]) {
    let Some((&[kind, sizes @ ..], message)) = data.split_first_chunk::<4>() else {
        return;
    };
    if kind & 1 == 0 {
        compare(message, &sizes, |e: envoy::DiscoveryRequest| {
            DiscoveryRequest {
                version_info: e.version_info,
                node: e.node.map(node),
                resource_names: e.resource_names,
                type_url: e.type_url,
                response_nonce: e.response_nonce,
                error_detail: e.error_detail,
            }
        });
    } else {
        compare(message, &sizes, |e: envoy::DeltaDiscoveryRequest| {
            DeltaDiscoveryRequest {
                node: e.node.map(node),
                type_url: e.type_url,
                resource_names_subscribe: e.resource_names_subscribe,
                resource_names_unsubscribe: e.resource_names_unsubscribe,
                initial_resource_versions: e.initial_resource_versions,
                response_nonce: e.response_nonce,
                error_detail: e.error_detail,
            }
        });
    }
}

fn node(node: envoy_types::pb::envoy::config::core::v3::Node) -> Node {
    Node {
        id: node.id,
        metadata: node.metadata,
    }
}

/// Trims `message` as a `T` and checks it against its decoding as Envoy's type `E`; `read` is what
/// meshca reads of an `E`.
fn compare<T, E>(message: &[u8], sizes: &[u8], read: impl Fn(E) -> T)
where
    T: wire::Request + PartialEq + Debug,
    E: Message + Default,
{
    let kept = trim::<T>(message, sizes);
    if let Ok(kept) = &kept {
        assert!(
            kept.len() <= message.len(),
            "the trimmer kept more than it read"
        );
    }
    match (E::decode(message), kept) {
        (Ok(envoy), kept) => {
            let canonical = envoy.encode_to_vec();
            let expected = read(envoy);
            match kept {
                Ok(kept) => assert_eq!(
                    T::decode(kept.as_slice())
                        .expect("envoy-types decodes it, trimmed it does not"),
                    expected,
                    "trimmed, the request reads otherwise"
                ),
                Err(Malformed(why)) => assert!(
                    matches!(
                        why,
                        "a field has a group or unknown wire type"
                            | "a field that is length-delimited comes with another wire type"
                    ),
                    "envoy-types decodes a request the trimmer refuses: {why}"
                ),
            }
            let kept = trim::<T>(&canonical, sizes).expect("envoy-types' encoding is trimmed");
            assert_eq!(
                T::decode(kept.as_slice()).expect("envoy-types' encoding, trimmed, decodes"),
                expected,
                "envoy-types' encoding, trimmed, reads otherwise"
            );
        }
        (Err(_), Ok(kept)) => {
            if let (Ok(read), Ok(whole)) = (T::decode(kept.as_slice()), T::decode(message)) {
                assert_eq!(read, whole, "trimmed, the request reads otherwise");
            }
        }
        (Err(_), Err(_)) => {}
    }
}

fn trim<T: wire::Request>(message: &[u8], sizes: &[u8]) -> Result<Vec<u8>, Malformed> {
    let mut trimmer = Trimmer::new::<T>(message.len());
    let mut fed = 0;
    for chunk in chunks(message, sizes) {
        trimmer.feed(chunk)?;
        fed += chunk.len();
        assert!(trimmer.held() <= fed, "the trimmer holds more than it read");
    }
    trimmer.finish()
}
