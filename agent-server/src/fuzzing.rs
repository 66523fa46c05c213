//! The entry point of the coverage-guided fuzz target in `agent/fuzz/` (docs/fuzzing.md): what a
//! `Sync` stream does with the messages a peer holding an agent token sends. It takes an arbitrary
//! byte string, drives the pieces the stream is made of (the message size limit, decoding, the Hello
//! check, the bound on key requests per message, the key request check, the sent states and their
//! acknowledgements) against a fixed small mesh, and panics when an invariant fails. `cargo test`
//! replays the committed corpus through it (`agent/tests/fuzz_corpus.rs`). Hidden from the
//! documentation: this is not an API.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use meshca_ca::PublicKey;
use meshca_control::{
    LeafKey, ProxyEntry, ProxyIdentity, ProxyKey, Registration, Registrations, SecretPem, Snapshot,
    StreamId,
};
use meshca_identity::KeyAlgorithm;
use prost::Message;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey as ParsedKey;

use crate::keys;
use crate::proto::{agent_message, AgentMessage, KeyRequests, PROTOCOL_VERSION};
use crate::{AgentOptions, KEY_REQUESTS_PER_MESSAGE};
use meshca_serve::ledger::{Acked, Ledger, NeverSent, KEPT};

/// The agent whose stream the input speaks on.
pub const AGENT: &str = "host-a";

/// The mesh every registration of the fixed world is in.
pub const MESH: &str = "default";

/// The registrations of the fixed world: (name, Dataplane, agent, the Dataplane's SPIFFE ID). `web`
/// and `db` name [`AGENT`] (`db`'s Dataplane has no identity), `other` names another agent, `local`
/// none; a key request for either of the last two is ignored.
pub const REGISTRATIONS: [(&str, &str, Option<&str>, Option<&str>); 4] = [
    (
        "web",
        "web-1",
        Some(AGENT),
        Some("spiffe://default.zone/web-1"),
    ),
    ("db", "db-1", Some(AGENT), None),
    (
        "other",
        "other-1",
        Some("host-b"),
        Some("spiffe://default.zone/other-1"),
    ),
    ("local", "web-1", None, Some("spiffe://default.zone/web-1")),
];

/// Record kinds: the low two bits of a record's first byte.
const MESSAGE: u8 = 0;
const SEND: u8 = 1;
const UNCHANGED: u8 = 2;

/// One record of an input (see [`agent_messages`]), for writing seeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// The agent sends these bytes as one message (at most 65535 of them).
    Message(Vec<u8>),
    /// The server sends a state built from the generation this many (0 to 63) after the current one.
    Send(u8),
    /// A snapshot this many generations (0 to 63) newer leaves the stream's content unchanged.
    Unchanged(u8),
    /// The stream ends and the agent opens a new one.
    Reconnect,
}

/// The input [`agent_messages`] reads: `options` (see there), then each record.
pub fn input(options: u8, records: &[Record]) -> Vec<u8> {
    let mut data = vec![options];
    for record in records {
        match record {
            Record::Message(bytes) => {
                data.push(MESSAGE);
                let len = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
                data.extend_from_slice(&len.to_be_bytes());
                data.extend_from_slice(&bytes[..usize::from(len)]);
            }
            Record::Send(ahead) => data.push(SEND | ((*ahead).min(63) << 2)),
            Record::Unchanged(ahead) => data.push(UNCHANGED | ((*ahead).min(63) << 2)),
            Record::Reconnect => data.push(3),
        }
    }
    data
}

/// The options byte of an input: the server's key algorithm (an index into [`KeyAlgorithm::ALL`])
/// and its message limit in 64-byte units (0: the default limit).
pub fn options(algorithm: KeyAlgorithm, limit_units: u8) -> u8 {
    let index = KeyAlgorithm::ALL
        .iter()
        .position(|a| *a == algorithm)
        .unwrap_or(0);
    // At most five algorithms: the index fits in three bits.
    (index as u8) | (limit_units.min(31) << 3)
}

/// The `Sync` stream's handling of an agent's messages. Input: an options byte (bits 0-2: the
/// server's key algorithm, an index into [`KeyAlgorithm::ALL`] modulo its length; bits 3-7: the
/// message limit in 64-byte units, 0 for the default 1 MiB), then records, each a byte whose low two
/// bits say what it is: 0, a message of the agent (a two-byte big-endian length, then that many bytes,
/// or as many as are left); 1, the server sends a state built from the generation `byte >> 2` after
/// the current one (0: the same generation again, as when a key was offered); 2, a snapshot
/// `byte >> 2` generations newer leaves the content unchanged; 3, the stream ends and the agent opens
/// a new one. A message the stream would end on (too large, undecodable, not a Hello first, a Hello
/// of another protocol or not first, empty, too many key requests, a refused key request, an Ack of
/// a version never sent) ends it too: the next record speaks on a new stream.
///
/// Checks: nothing panics; a decoded message re-encodes to bytes that decode to the same message and
/// encode the same again; a key request is accepted only if its CSR, read independently here, has a
/// verified signature, a key of the server's algorithm (the key returned is the CSR's), and names no
/// SPIFFE ID but its registration's (none when the registration has no identity); no request of a
/// message over the bound is checked; versions sent grow; an Ack of a version sent is never refused,
/// an Ack of a version newer than every one sent always is, and one of a version never sent reports
/// nothing; the states acknowledged never go back (version nor generation), and each ACK names the
/// streams its state carried; no more than [`KEPT`] states are kept.
pub fn agent_messages(data: &[u8]) {
    let Some((&options, mut rest)) = data.split_first() else {
        return;
    };
    let world = World::get();
    let algorithm = KeyAlgorithm::ALL[usize::from(options & 0x07) % KeyAlgorithm::ALL.len()];
    let limit = match options >> 3 {
        0 => AgentOptions::default().message_bytes,
        units => usize::from(units) * 64,
    };
    let mut stream = Stream::new(world);
    while let Some((&tag, after)) = rest.split_first() {
        rest = after;
        let ahead = u64::from(tag >> 2);
        let open = match tag & 0x03 {
            MESSAGE => {
                let len = match rest.split_first_chunk::<2>() {
                    Some((len, after)) => {
                        rest = after;
                        usize::from(u16::from_be_bytes(*len))
                    }
                    None => std::mem::take(&mut rest).len(),
                };
                let (message, after) = rest.split_at(len.min(rest.len()));
                rest = after;
                stream.receive(message, limit, algorithm)
            }
            SEND => {
                stream.generation += ahead;
                stream.send();
                true
            }
            UNCHANGED => {
                stream.generation += ahead;
                stream.unchanged();
                true
            }
            _ => false,
        };
        if !open {
            // The agent reconnects; snapshots went on meanwhile.
            stream = Stream {
                generation: stream.generation,
                ..Stream::new(world)
            };
        }
    }
}

/// The mesh every input speaks to.
struct World {
    snapshot: Snapshot,
    /// The registrations naming [`AGENT`], with the owner's stream of each.
    links: Vec<(Arc<Registration>, StreamId)>,
}

impl World {
    fn get() -> &'static World {
        static WORLD: OnceLock<World> = OnceLock::new();
        WORLD.get_or_init(World::new)
    }

    fn new() -> World {
        let mut snapshot = Snapshot::empty();
        snapshot.generation = 1;
        let mut registrations = Vec::new();
        for (name, dataplane, agent, spiffe_id) in REGISTRATIONS {
            let proxy = ProxyKey::new(MESH, dataplane);
            let entry = match spiffe_id {
                Some(spiffe_id) => ProxyEntry::Ready(Arc::new(ProxyIdentity {
                    spiffe_id: spiffe_id.to_owned(),
                    identity_name: None,
                    chain_pem: String::new(),
                    key: LeafKey::Held(SecretPem::new(String::new())),
                })),
                None => ProxyEntry::NoIdentity {
                    reason: "no MeshIdentity selects it".to_owned(),
                },
            };
            snapshot.proxies.insert(proxy.clone(), entry);
            registrations.push(Registration {
                name: name.to_owned(),
                proxy,
                selectors: Vec::new(),
                agent: agent.map(str::to_owned),
                hint: None,
                jwt_svid_expiry: Duration::from_secs(300),
                labels: Default::default(),
            });
        }
        snapshot.registrations = Arc::new(Registrations::new(registrations));
        let links = snapshot
            .registrations
            .iter()
            .filter(|r| r.agent.as_deref() == Some(AGENT))
            .zip(1..)
            .map(|(r, id)| (r.clone(), StreamId(id)))
            .collect();
        World { snapshot, links }
    }

    /// The SPIFFE ID of `registration`'s Dataplane, if it has an identity.
    fn spiffe_id(&self, registration: &Registration) -> Option<&str> {
        match self.snapshot.proxies.get(&registration.proxy) {
            Some(ProxyEntry::Ready(identity)) => Some(&identity.spiffe_id),
            _ => None,
        }
    }
}

/// One `Sync` stream, and what the checks remember of it.
struct Stream {
    world: &'static World,
    greeted: bool,
    sent: Ledger,
    /// The snapshot generation the next state is built from.
    generation: u64,
    /// Every version sent on the stream, with the generation it was built from and its streams.
    versions: BTreeMap<u64, (u64, Vec<StreamId>)>,
    /// The newest state reported acknowledged: its version and generation.
    acked: Option<(u64, u64)>,
    /// The key last offered for each registration (by name): one offered again changes nothing.
    offered: BTreeMap<String, Vec<u8>>,
}

impl Stream {
    fn new(world: &'static World) -> Stream {
        Stream {
            world,
            greeted: false,
            sent: Ledger::default(),
            generation: world.snapshot.generation,
            versions: BTreeMap::new(),
            acked: None,
            offered: BTreeMap::new(),
        }
    }

    /// One message of the agent; whether the stream stays open.
    fn receive(&mut self, bytes: &[u8], limit: usize, algorithm: KeyAlgorithm) -> bool {
        if bytes.len() > limit {
            // The codec refuses it before decoding (RESOURCE_EXHAUSTED).
            return false;
        }
        let Ok(message) = AgentMessage::decode(bytes) else {
            return false;
        };
        round_trip(&message);
        if !self.greeted {
            return match message.message {
                Some(agent_message::Message::Hello(hello))
                    if hello.protocol == PROTOCOL_VERSION =>
                {
                    self.greeted = true;
                    // The first state follows the Hello.
                    self.send();
                    true
                }
                _ => false,
            };
        }
        match message.message {
            Some(agent_message::Message::Ack(ack)) => self.ack(ack.version),
            Some(agent_message::Message::Keys(keys)) => self.keys(keys, algorithm),
            Some(agent_message::Message::Hello(_)) | None => false,
        }
    }

    /// The server sends a state built from the current generation.
    fn send(&mut self) {
        let streams: Vec<StreamId> = self.world.links.iter().rev().map(|(_, id)| *id).collect();
        let version = self.sent.send(self.generation, streams.clone());
        if let Some((&newest, _)) = self.versions.last_key_value() {
            assert!(
                version > newest,
                "version {version} sent after version {newest}"
            );
        }
        assert!(
            version >= self.generation,
            "version {version} of a state built from generation {}",
            self.generation
        );
        let mut sorted = streams;
        sorted.sort_unstable();
        self.versions.insert(version, (self.generation, sorted));
        self.check_kept();
    }

    /// A newer snapshot leaves the content unchanged.
    fn unchanged(&mut self) {
        if let Some(acked) = self.sent.unchanged(self.generation) {
            assert_eq!(
                acked.generation, self.generation,
                "an unchanged state reported for another generation"
            );
            assert_eq!(
                self.acked.map(|(version, _)| version),
                Some(acked.version),
                "an unchanged state reported, but it was not the state last acknowledged"
            );
            assert_eq!(
                self.versions.last_key_value().map(|(v, _)| *v),
                Some(acked.version),
                "an unchanged state reported that is not the last sent"
            );
            self.reported(&acked);
        }
        self.check_kept();
    }

    fn ack(&mut self, version: u64) -> bool {
        let sent = self.versions.contains_key(&version);
        let newest = self.versions.last_key_value().map(|(v, _)| *v);
        let open = match self.sent.ack(version) {
            Ok(Some(acked)) => {
                assert!(
                    sent,
                    "an Ack of version {version}, never sent, was reported"
                );
                assert_eq!(acked.version, version, "an Ack reported another version");
                let (built_from, streams) = &self.versions[&version];
                assert_eq!(
                    &acked.streams, streams,
                    "an Ack of version {version} reported other streams than its state carried"
                );
                assert!(
                    acked.generation >= *built_from && acked.generation <= self.generation,
                    "an Ack of version {version} (built from generation {built_from}, newest \
                     {}) reported generation {}",
                    self.generation,
                    acked.generation
                );
                self.reported(&acked);
                true
            }
            Ok(None) => {
                assert!(
                    sent || newest.is_some_and(|n| version < n),
                    "an Ack of version {version}, newer than every version sent, was taken"
                );
                true
            }
            Err(NeverSent(refused)) => {
                assert_eq!(refused, version);
                assert!(
                    !sent,
                    "an Ack of version {version}, which was sent, was refused"
                );
                false
            }
        };
        self.check_kept();
        open
    }

    /// An ACK reported to the owner: never older than the last one.
    fn reported(&mut self, acked: &Acked) {
        if let Some((version, generation)) = self.acked {
            assert!(
                acked.version >= version && acked.generation > generation
                    || acked.version > version && acked.generation >= generation,
                "ACK of version {} generation {} reported after version {version} generation \
                 {generation}",
                acked.version,
                acked.generation
            );
        }
        self.acked = Some((acked.version, acked.generation));
    }

    fn check_kept(&self) {
        assert!(
            self.sent.kept() <= KEPT,
            "{} sent states kept, more than {KEPT}",
            self.sent.kept()
        );
    }

    /// A `KeyRequests` message; whether the stream stays open.
    fn keys(&mut self, keys: KeyRequests, algorithm: KeyAlgorithm) -> bool {
        if keys.requests.len() > KEY_REQUESTS_PER_MESSAGE {
            return false;
        }
        let mut offered = false;
        for request in &keys.requests {
            let Some((registration, _)) =
                self.world.links.iter().find(|(r, _)| {
                    *r.proxy.mesh == *request.mesh && r.name == request.registration
                })
            else {
                // A registration that does not name the agent: ignored.
                continue;
            };
            match keys::check(&request.csr, registration, &self.world.snapshot, algorithm) {
                Ok(key) => {
                    certifiable(
                        &request.csr,
                        &key,
                        self.world.spiffe_id(registration),
                        algorithm,
                    );
                    let last = self
                        .offered
                        .insert(registration.name.clone(), key.raw().to_vec());
                    offered |= last.as_deref() != Some(key.raw());
                }
                Err(_) => return false,
            }
        }
        if offered {
            // A newly offered key changes the content: a new state of the same generation.
            self.send();
        }
        true
    }
}

/// A decoded message encodes to bytes that decode to it and encode the same again.
fn round_trip(message: &AgentMessage) {
    let encoded = message.encode_to_vec();
    assert_eq!(encoded.len(), message.encoded_len());
    match AgentMessage::decode(encoded.as_slice()) {
        Ok(again) => {
            assert_eq!(&again, message, "a re-encoded message decodes differently");
            assert_eq!(again.encode_to_vec(), encoded, "the encoding is not stable");
        }
        Err(error) => panic!("a re-encoded message does not decode: {error}"),
    }
}

/// Reads an accepted request again, with x509-parser directly: it must be a request whose signature
/// verifies, over `key`, of `algorithm`, naming no SPIFFE ID but `spiffe_id`.
pub(crate) fn certifiable(
    csr: &[u8],
    key: &PublicKey,
    spiffe_id: Option<&str>,
    algorithm: KeyAlgorithm,
) {
    let request = match X509CertificationRequest::from_der(csr) {
        Ok((rest, request)) => {
            assert!(rest.is_empty(), "an accepted request has bytes after it");
            request
        }
        Err(error) => panic!("an accepted request does not parse: {error}"),
    };
    assert!(
        request.verify_signature().is_ok(),
        "an accepted request's signature does not verify"
    );
    let spki = &request.certification_request_info.subject_pki;
    assert_eq!(
        key.raw(),
        spki.subject_public_key.data.as_ref(),
        "the key accepted is not the request's"
    );
    assert_eq!(key.algorithm(), algorithm, "a key of another algorithm");
    let oid = &spki.algorithm.algorithm;
    let of_algorithm = match algorithm.rsa_bits() {
        None => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok());
            let want = match algorithm {
                KeyAlgorithm::EcdsaP384 => OID_NIST_EC_P384,
                _ => OID_EC_P256,
            };
            *oid == OID_KEY_TYPE_EC_PUBLIC_KEY && curve == Some(want)
        }
        Some(bits) => {
            *oid == OID_PKCS1_RSAENCRYPTION
                && matches!(spki.parsed(), Ok(ParsedKey::RSA(rsa)) if significant_bits(rsa.modulus) == bits)
        }
    };
    assert!(
        of_algorithm,
        "an accepted request's key is not {}",
        algorithm.as_str()
    );
    for extension in request.requested_extensions().into_iter().flatten() {
        let ParsedExtension::SubjectAlternativeName(san) = extension else {
            continue;
        };
        for name in &san.general_names {
            let GeneralName::URI(uri) = name else {
                continue;
            };
            let spiffe = uri
                .as_bytes()
                .get(..9)
                .is_some_and(|scheme| scheme.eq_ignore_ascii_case(b"spiffe://"));
            assert!(
                !spiffe || Some(*uri) == spiffe_id,
                "an accepted request names SPIFFE ID {uri:?}; the registration's is {spiffe_id:?}"
            );
        }
    }
}

/// The bits of a big-endian integer, from its highest set bit.
fn significant_bits(bytes: &[u8]) -> usize {
    let mut bits = bytes.len() * 8;
    for byte in bytes {
        if *byte == 0 {
            bits -= 8;
        } else {
            return bits - byte.leading_zeros() as usize;
        }
    }
    bits
}

#[cfg(test)]
mod tests;
