//! The agent protocol's messages (`proto/meshca/agent/v1/agent.proto`), transcribed into prost types.
//!
//! They are written by hand, with the derives prost-build would write, so that building meshca needs
//! no protobuf compiler; the proto file is the documentation and the contract, and the tests below
//! pin the field numbers to it.

use std::collections::HashMap;

/// The most key requests one `KeyRequests` message may carry: the agent sends no more, the server takes
/// no more.
pub const KEY_REQUESTS_PER_MESSAGE: usize = 64;

/// The protocol version this build speaks ([`Hello::protocol`]).
pub const PROTOCOL_VERSION: u32 = 1;

/// The method paths of `meshca.agent.v1.Agent`.
pub mod paths {
    /// The service's name, as gRPC routes by it.
    pub const SERVICE: &str = "meshca.agent.v1.Agent";
    /// Bidirectional streaming: `AgentMessage` → `AgentState`.
    pub const SYNC: &str = "/meshca.agent.v1.Agent/Sync";
    /// Unary: `JwtSvidRequest` → `JwtSvidResponse`.
    pub const MINT_JWT_SVID: &str = "/meshca.agent.v1.Agent/MintJwtSvid";
}

/// What the agent sends on `Sync`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct AgentMessage {
    /// The message.
    #[prost(oneof = "agent_message::Message", tags = "1, 2, 3")]
    pub message: Option<agent_message::Message>,
}

/// The kinds of [`AgentMessage`].
pub mod agent_message {
    /// One message of the agent.
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Message {
        /// The first message of a stream.
        #[prost(message, tag = "1")]
        Hello(super::Hello),
        /// Keys for the certificates to come.
        #[prost(message, tag = "2")]
        Keys(super::KeyRequests),
        /// A state every Workload API stream on the agent's host was sent.
        #[prost(message, tag = "3")]
        Ack(super::Ack),
    }
}

/// The first message of a `Sync` stream.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Hello {
    /// The protocol version the agent speaks ([`PROTOCOL_VERSION`]).
    #[prost(uint32, tag = "1")]
    pub protocol: u32,
    /// The agent's meshca version, for the server's logs and status.
    #[prost(string, tag = "2")]
    pub agent_version: String,
}

/// Keys the agent made, for the certificates to come.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct KeyRequests {
    /// One request per registration at most.
    #[prost(message, repeated, tag = "1")]
    pub requests: Vec<KeyRequest>,
}

/// A key for one registration's next certificate.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct KeyRequest {
    /// The registration's mesh.
    #[prost(string, tag = "1")]
    pub mesh: String,
    /// The registration's name.
    #[prost(string, tag = "2")]
    pub registration: String,
    /// A PKCS#10 request (DER) signed with the new key.
    #[prost(bytes = "vec", tag = "3")]
    pub csr: Vec<u8>,
    /// The agent holds no key for the registration's current certificate: certify this one now.
    #[prost(bool, tag = "4")]
    pub replace_now: bool,
}

/// The agent sent state `version` to every Workload API stream open on its host.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Ack {
    /// The [`AgentState::version`] acknowledged.
    #[prost(uint64, tag = "1")]
    pub version: u64,
    /// The open Workload API streams per registration, for the server's status.
    #[prost(message, repeated, tag = "2")]
    pub streams: Vec<OpenStreams>,
}

/// How many Workload API streams of one registration are open on the agent's host.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct OpenStreams {
    /// The registration's mesh.
    #[prost(string, tag = "1")]
    pub mesh: String,
    /// The registration's name.
    #[prost(string, tag = "2")]
    pub registration: String,
    /// The open streams.
    #[prost(uint32, tag = "3")]
    pub streams: u32,
}

/// Everything the agent serves, whole.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct AgentState {
    /// Grows with every state one stream sends.
    #[prost(uint64, tag = "1")]
    pub version: u64,
    /// The registrations that name this agent, by name, then mesh.
    #[prost(message, repeated, tag = "2")]
    pub registrations: Vec<Registration>,
    /// The trust of every mesh and trust domain, by trust domain.
    #[prost(map = "string, message", tag = "3")]
    pub all: HashMap<String, X509Bundle>,
    /// Each registration's mesh's own trust, by mesh.
    #[prost(map = "string, message", tag = "4")]
    pub meshes: HashMap<String, MeshTrust>,
    /// JWK Set documents (JSON) by trust domain.
    #[prost(map = "string, bytes", tag = "5")]
    pub jwt_bundles: HashMap<String, Vec<u8>>,
}

/// One registration that names the agent.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Registration {
    /// Its mesh.
    #[prost(string, tag = "1")]
    pub mesh: String,
    /// Its name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// The Dataplane whose identity its callers get.
    #[prost(string, tag = "3")]
    pub dataplane: String,
    /// The selectors a caller must all have, as the resource spells them.
    #[prost(string, repeated, tag = "4")]
    pub selectors: Vec<String>,
    /// The hint sent with its SVIDs; empty for none.
    #[prost(string, tag = "5")]
    pub hint: String,
    /// How long its JWT-SVIDs live, in seconds.
    #[prost(uint64, tag = "6")]
    pub jwt_svid_seconds: u64,
    /// The algorithm of the keys to request (`ecdsa-p256`, ...).
    #[prost(string, tag = "7")]
    pub key_algorithm: String,
    /// The identity to serve; absent while there is none.
    #[prost(message, optional, tag = "8")]
    pub identity: Option<Identity>,
    /// Why there is no identity, when there will be none until something changes.
    #[prost(string, tag = "9")]
    pub no_identity: String,
    /// The server holds no key of the agent for the next certificate.
    #[prost(bool, tag = "10")]
    pub wants_key: bool,
}

/// A certificate to serve, and which key it certifies.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct Identity {
    /// The SPIFFE ID in the certificate.
    #[prost(string, tag = "1")]
    pub spiffe_id: String,
    /// Leaf first, then intermediates (DER).
    #[prost(bytes = "vec", repeated, tag = "2")]
    pub certificate_chain: Vec<Vec<u8>>,
    /// SHA-256 of the certified key's subjectPublicKey bits ([`key_id`]).
    #[prost(bytes = "vec", tag = "3")]
    pub key_id: Vec<u8>,
}

/// One mesh's trust, by trust domain.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct MeshTrust {
    /// Trust domain → its CAs.
    #[prost(map = "string, message", tag = "1")]
    pub by_trust_domain: HashMap<String, X509Bundle>,
}

/// The CAs of one trust domain.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct X509Bundle {
    /// CA certificates (DER).
    #[prost(bytes = "vec", repeated, tag = "1")]
    pub authorities: Vec<Vec<u8>>,
}

/// A JWT-SVID for one of the agent's registrations.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct JwtSvidRequest {
    /// The registration's mesh.
    #[prost(string, tag = "1")]
    pub mesh: String,
    /// The registration's name.
    #[prost(string, tag = "2")]
    pub registration: String,
    /// The audiences the workload asked for.
    #[prost(string, repeated, tag = "3")]
    pub audience: Vec<String>,
}

/// The JWT-SVID.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct JwtSvidResponse {
    /// The compact JWS.
    #[prost(string, tag = "1")]
    pub token: String,
}

/// Which key a certificate certifies, as [`Identity::key_id`] names it: SHA-256 of the key's
/// subjectPublicKey bits (what [`meshca_ca::PublicKey::raw`] holds).
pub fn key_id(subject_public_key: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, subject_public_key)
        .as_ref()
        .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Field numbers and wire types, pinned against the proto: a transcription slip would make an
    /// agent and a server of different builds misread each other.
    #[test]
    fn messages_encode_with_the_protos_field_numbers() {
        let hello = AgentMessage {
            message: Some(agent_message::Message::Hello(Hello {
                protocol: 1,
                agent_version: "v".into(),
            })),
        };
        // field 1 (hello), length 5: field 1 varint 1, field 2 string "v".
        assert_eq!(hello.encode_to_vec(), [0x0a, 5, 0x08, 1, 0x12, 1, b'v']);

        let keys = AgentMessage {
            message: Some(agent_message::Message::Keys(KeyRequests {
                requests: vec![KeyRequest {
                    mesh: "m".into(),
                    registration: "r".into(),
                    csr: vec![7],
                    replace_now: true,
                }],
            })),
        };
        assert_eq!(
            keys.encode_to_vec(),
            [0x12, 13, 0x0a, 11, 0x0a, 1, b'm', 0x12, 1, b'r', 0x1a, 1, 7, 0x20, 1]
        );

        let ack = AgentMessage {
            message: Some(agent_message::Message::Ack(Ack {
                version: 3,
                streams: vec![OpenStreams {
                    mesh: "m".into(),
                    registration: "r".into(),
                    streams: 2,
                }],
            })),
        };
        assert_eq!(
            ack.encode_to_vec(),
            [0x1a, 12, 0x08, 3, 0x12, 8, 0x0a, 1, b'm', 0x12, 1, b'r', 0x18, 2]
        );

        let registration = Registration {
            mesh: "m".into(),
            name: "n".into(),
            dataplane: "d".into(),
            selectors: vec!["s".into()],
            hint: "h".into(),
            jwt_svid_seconds: 5,
            key_algorithm: "k".into(),
            identity: Some(Identity {
                spiffe_id: "i".into(),
                certificate_chain: vec![vec![1]],
                key_id: vec![2],
            }),
            no_identity: "x".into(),
            wants_key: true,
        };
        assert_eq!(
            registration.encode_to_vec(),
            [
                0x0a, 1, b'm', 0x12, 1, b'n', 0x1a, 1, b'd', 0x22, 1, b's', 0x2a, 1, b'h', 0x30, 5,
                0x3a, 1, b'k', 0x42, 9, 0x0a, 1, b'i', 0x12, 1, 1, 0x1a, 1, 2, 0x4a, 1, b'x', 0x50,
                1
            ]
        );

        let state = AgentState {
            version: 9,
            registrations: vec![],
            all: HashMap::from([(
                "t".to_owned(),
                X509Bundle {
                    authorities: vec![vec![4]],
                },
            )]),
            meshes: HashMap::from([(
                "m".to_owned(),
                MeshTrust {
                    by_trust_domain: HashMap::new(),
                },
            )]),
            jwt_bundles: HashMap::from([("t".to_owned(), vec![b'{'])]),
        };
        assert_eq!(
            state.encode_to_vec(),
            [
                0x08, 9, // version
                0x1a, 8, 0x0a, 1, b't', 0x12, 3, 0x0a, 1, 4, // all
                0x22, 3, 0x0a, 1, b'm', // meshes (an empty value is left out)
                0x2a, 6, 0x0a, 1, b't', 0x12, 1, b'{', // jwt_bundles
            ]
        );

        let mint = JwtSvidRequest {
            mesh: "m".into(),
            registration: "r".into(),
            audience: vec!["a".into()],
        };
        assert_eq!(
            mint.encode_to_vec(),
            [0x0a, 1, b'm', 0x12, 1, b'r', 0x1a, 1, b'a']
        );
        assert_eq!(
            JwtSvidResponse { token: "t".into() }.encode_to_vec(),
            [0x0a, 1, b't']
        );
    }

    #[test]
    fn a_key_id_is_the_sha256_of_the_key_bits() {
        let id = key_id(b"abc");
        assert_eq!(
            id[..4],
            [0xba, 0x78, 0x16, 0xbf],
            "SHA-256(\"abc\") begins ba7816bf"
        );
    }

    mod properties {
        use super::*;
        use proptest::collection::{hash_map, vec};
        use proptest::prelude::*;

        fn text() -> impl Strategy<Value = String> {
            "\\PC{0,12}"
        }

        fn bytes() -> impl Strategy<Value = Vec<u8>> {
            vec(any::<u8>(), 0..24)
        }

        fn agent_message() -> impl Strategy<Value = AgentMessage> {
            let hello = (any::<u32>(), text()).prop_map(|(protocol, agent_version)| {
                agent_message::Message::Hello(Hello {
                    protocol,
                    agent_version,
                })
            });
            let request = (text(), text(), bytes(), any::<bool>()).prop_map(
                |(mesh, registration, csr, replace_now)| KeyRequest {
                    mesh,
                    registration,
                    csr,
                    replace_now,
                },
            );
            let keys = vec(request, 0..4)
                .prop_map(|requests| agent_message::Message::Keys(KeyRequests { requests }));
            let open = (text(), text(), any::<u32>()).prop_map(|(mesh, registration, streams)| {
                OpenStreams {
                    mesh,
                    registration,
                    streams,
                }
            });
            let ack = (any::<u64>(), vec(open, 0..4)).prop_map(|(version, streams)| {
                agent_message::Message::Ack(Ack { version, streams })
            });
            proptest::option::of(prop_oneof![hello, keys, ack])
                .prop_map(|message| AgentMessage { message })
        }

        fn bundle() -> impl Strategy<Value = X509Bundle> {
            vec(bytes(), 0..3).prop_map(|authorities| X509Bundle { authorities })
        }

        fn registration() -> impl Strategy<Value = Registration> {
            let identity = (text(), vec(bytes(), 0..3), bytes()).prop_map(
                |(spiffe_id, certificate_chain, key_id)| Identity {
                    spiffe_id,
                    certificate_chain,
                    key_id,
                },
            );
            (
                (text(), text(), text(), vec(text(), 0..3), text()),
                (
                    any::<u64>(),
                    text(),
                    proptest::option::of(identity),
                    text(),
                    any::<bool>(),
                ),
            )
                .prop_map(
                    |(
                        (mesh, name, dataplane, selectors, hint),
                        (jwt_svid_seconds, key_algorithm, identity, no_identity, wants_key),
                    )| Registration {
                        mesh,
                        name,
                        dataplane,
                        selectors,
                        hint,
                        jwt_svid_seconds,
                        key_algorithm,
                        identity,
                        no_identity,
                        wants_key,
                    },
                )
        }

        fn agent_state() -> impl Strategy<Value = AgentState> {
            let mesh_trust = hash_map(text(), bundle(), 0..3)
                .prop_map(|by_trust_domain| MeshTrust { by_trust_domain });
            (
                any::<u64>(),
                vec(registration(), 0..3),
                hash_map(text(), bundle(), 0..3),
                hash_map(text(), mesh_trust, 0..3),
                hash_map(text(), bytes(), 0..3),
            )
                .prop_map(|(version, registrations, all, meshes, jwt_bundles)| {
                    AgentState {
                        version,
                        registrations,
                        all,
                        meshes,
                        jwt_bundles,
                    }
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// What an agent sends decodes to what it encoded, whatever the values.
            #[test]
            fn an_agent_message_decodes_to_what_was_encoded(message in agent_message()) {
                let encoded = message.encode_to_vec();
                prop_assert_eq!(encoded.len(), message.encoded_len());
                let decoded = AgentMessage::decode(encoded.as_slice());
                prop_assert_eq!(decoded.as_ref(), Ok(&message));
            }

            /// What a server sends decodes to what it encoded, whatever the values.
            #[test]
            fn an_agent_state_decodes_to_what_was_encoded(state in agent_state()) {
                let encoded = state.encode_to_vec();
                prop_assert_eq!(encoded.len(), state.encoded_len());
                let decoded = AgentState::decode(encoded.as_slice());
                prop_assert_eq!(decoded.as_ref(), Ok(&state));
            }

            /// Bytes that decode as a message re-encode to bytes that decode to the same message.
            #[test]
            fn any_bytes_that_decode_re_encode_to_the_same_message(
                bytes in vec(any::<u8>(), 0..256)
            ) {
                if let Ok(message) = AgentMessage::decode(bytes.as_slice()) {
                    let again = AgentMessage::decode(message.encode_to_vec().as_slice());
                    prop_assert_eq!(again.as_ref(), Ok(&message));
                }
                if let Ok(state) = AgentState::decode(bytes.as_slice()) {
                    let again = AgentState::decode(state.encode_to_vec().as_slice());
                    prop_assert_eq!(again.as_ref(), Ok(&state));
                }
            }
        }
    }
}
