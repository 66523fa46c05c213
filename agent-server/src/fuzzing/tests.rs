//! The fuzz entry point on inputs written by hand: what each invariant allows and refuses.

use super::*;
use crate::keys::tests::csr;
use crate::proto::{Ack, Hello, KeyRequest};
use rcgen::KeyPair;

const WEB: &str = "spiffe://default.zone/web-1";

fn encoded(message: agent_message::Message) -> Vec<u8> {
    AgentMessage {
        message: Some(message),
    }
    .encode_to_vec()
}

fn hello() -> Vec<u8> {
    encoded(agent_message::Message::Hello(Hello {
        protocol: PROTOCOL_VERSION,
        agent_version: "test".into(),
    }))
}

fn ack(version: u64) -> Vec<u8> {
    encoded(agent_message::Message::Ack(Ack {
        version,
        streams: Vec::new(),
    }))
}

fn key_request(registration: &str, csr: Vec<u8>) -> Vec<u8> {
    encoded(agent_message::Message::Keys(KeyRequests {
        requests: vec![KeyRequest {
            mesh: MESH.into(),
            registration: registration.into(),
            csr,
            replace_now: false,
        }],
    }))
}

#[test]
fn an_accepted_key_is_followed_by_a_state_and_a_refused_one_ends_the_stream() {
    let p256 = KeyAlgorithm::EcdsaP256;
    let key = KeyPair::generate().expect("a key");
    let mut stream = Stream::new(World::get());
    assert!(stream.receive(&hello(), usize::MAX, p256));
    assert!(stream.receive(&key_request("web", csr(&key, &[WEB])), usize::MAX, p256));
    assert_eq!(stream.versions.keys().copied().collect::<Vec<_>>(), [1, 2]);
    assert!(stream.receive(&ack(2), usize::MAX, p256));
    assert_eq!(stream.acked, Some((2, 1)));
    // A registration of another agent: ignored, no new state.
    assert!(stream.receive(&key_request("other", csr(&key, &[])), usize::MAX, p256));
    assert_eq!(stream.versions.len(), 2);
    let elsewhere = csr(&key, &["spiffe://default.zone/db-1"]);
    assert!(!stream.receive(&key_request("web", elsewhere), usize::MAX, p256));
    let p384 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).expect("a key");
    let mut stream = Stream::new(World::get());
    assert!(stream.receive(&hello(), usize::MAX, p256));
    assert!(!stream.receive(&key_request("web", csr(&p384, &[WEB])), usize::MAX, p256));
}

#[test]
fn the_stream_ends_on_an_unsent_version_a_message_over_the_limit_or_a_late_hello() {
    let p256 = KeyAlgorithm::EcdsaP256;
    let mut stream = Stream::new(World::get());
    assert!(
        !stream.receive(&ack(1), usize::MAX, p256),
        "Ack before Hello"
    );
    let mut stream = Stream::new(World::get());
    assert!(!stream.receive(&hello(), 3, p256), "over the limit");
    let mut stream = Stream::new(World::get());
    assert!(stream.receive(&hello(), usize::MAX, p256));
    assert!(!stream.receive(&ack(7), usize::MAX, p256));
    let mut stream = Stream::new(World::get());
    assert!(stream.receive(&hello(), usize::MAX, p256));
    assert!(!stream.receive(&hello(), usize::MAX, p256));
}

#[test]
fn the_input_layout_reaches_the_stream() {
    let data = input(
        options(KeyAlgorithm::EcdsaP384, 0),
        &[
            Record::Message(hello()),
            Record::Send(2),
            Record::Unchanged(1),
            Record::Message(ack(3)),
            Record::Reconnect,
        ],
    );
    assert_eq!(data[0], 1, "P-384, the default limit");
    assert_eq!(data[1], MESSAGE);
    assert_eq!(
        usize::from(u16::from_be_bytes([data[2], data[3]])),
        hello().len()
    );
    assert_eq!(
        &data[4 + hello().len()..][..2],
        [SEND | 2 << 2, UNCHANGED | 1 << 2]
    );
    assert_eq!(data.last(), Some(&3));
    agent_messages(&data);
}

#[test]
#[should_panic(expected = "names SPIFFE ID")]
fn the_independent_reading_catches_a_request_for_another_identity() {
    let key = KeyPair::generate().expect("a key");
    let der = csr(&key, &["spiffe://default.zone/db-1"]);
    let public = meshca_ca::csr_public_key(&der).expect("a request");
    certifiable(&der, &public, Some(WEB), KeyAlgorithm::EcdsaP256);
}

#[test]
#[should_panic(expected = "another algorithm")]
fn the_independent_reading_catches_a_key_of_another_algorithm() {
    let key = KeyPair::generate().expect("a key");
    let der = csr(&key, &[WEB]);
    let public = meshca_ca::csr_public_key(&der).expect("a request");
    certifiable(&der, &public, Some(WEB), KeyAlgorithm::EcdsaP384);
}

#[test]
#[should_panic(expected = "reported after")]
fn an_ack_going_back_is_caught() {
    let mut stream = Stream::new(World::get());
    stream.acked = Some((5, 5));
    stream.reported(&Acked {
        streams: Vec::new(),
        generation: 5,
        version: 4,
    });
}
