//! The agent protocol (`proto/meshca/agent/v1/agent.proto`, the documentation and the contract): its
//! messages, generated from the proto by prost-build (`proto/meshca.agent.v1.rs`, checked in and kept
//! current by `scripts/protos`; `.ci/run` fails when it is not what the proto makes), its method paths,
//! and its limits.

/// The messages, as prost-build writes them (documented in the proto).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
mod generated {
    include!("proto/meshca.agent.v1.rs");
}

pub use generated::*;

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

/// Which key a certificate certifies, as [`Identity::key_id`] names it: SHA-256 of the key's
/// subjectPublicKey bits (what [`meshca_ca::PublicKey::raw`] holds).
pub fn key_id(subject_public_key: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, subject_public_key)
        .as_ref()
        .to_vec()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

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
                    federated: HashMap::new(),
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
        let federated = MeshTrust {
            by_trust_domain: HashMap::new(),
            federated: HashMap::from([("u".to_owned(), vec![b'{'])]),
        };
        assert_eq!(
            federated.encode_to_vec(),
            [0x12, 6, 0x0a, 1, b'u', 0x12, 1, b'{'] // federated, field 2
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
            let mesh_trust = (
                hash_map(text(), bundle(), 0..3),
                hash_map(text(), prop::collection::vec(any::<u8>(), 0..16), 0..2),
            )
                .prop_map(|(by_trust_domain, federated)| MeshTrust {
                    by_trust_domain,
                    federated,
                });
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
