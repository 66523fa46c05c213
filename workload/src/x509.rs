//! What a Workload API caller is sent: its X.509-SVIDs and the bundles it trusts, built from one
//! snapshot for the registrations it matches.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use meshca_control::{KeyHasher, ProxyEntry, ProxyIdentity, Registration, Snapshot, TrustBundle};
use prost::Message;
use zeroize::{Zeroize, Zeroizing};

use crate::proto::{X509BundlesResponse, X509Svid, X509SvidResponse};

/// The largest message a Workload API client accepts: grpc-core's default receive limit (4 MiB),
/// which py-spiffe cannot raise. A response that would not fit is refused, never sent cut.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// What one snapshot gives a caller.
#[derive(Debug)]
pub(crate) enum Built<R> {
    /// Send this.
    Ready(R),
    /// A registration's identity is still being prepared: send nothing yet.
    Waiting,
    /// No identity to send for this snapshot: why (for the caller and the log).
    Nothing(String),
    /// The response would be over [`MAX_RESPONSE_BYTES`]: why.
    TooLarge(String),
}

/// What a response was built from, compared by pointer: equal fingerprints mean equal content. It holds
/// what it names, so that an address it compares cannot be freed and reused by other content (which
/// would make a changed message look unchanged).
#[derive(Debug, Clone, Default)]
pub(crate) struct Fingerprint(Vec<Part>);

/// One thing a response was built from.
#[derive(Debug, Clone)]
enum Part {
    Svid(Arc<ProxyIdentity>),
    Trust(Arc<TrustBundle>),
}

impl PartialEq for Fingerprint {
    fn eq(&self, other: &Fingerprint) -> bool {
        self.0.len() == other.0.len()
            && self.0.iter().zip(&other.0).all(|pair| match pair {
                (Part::Svid(a), Part::Svid(b)) => Arc::ptr_eq(a, b),
                (Part::Trust(a), Part::Trust(b)) => Arc::ptr_eq(a, b),
                _ => false,
            })
    }
}

impl Fingerprint {
    /// The fingerprint of a message of `identities` alone, for tests.
    #[cfg(test)]
    pub(crate) fn of_identities(identities: &[Arc<ProxyIdentity>]) -> Fingerprint {
        let mut fingerprint = Fingerprint::default();
        identities.iter().for_each(|i| fingerprint.of_svid(i));
        fingerprint
    }

    fn of_svid(&mut self, identity: &Arc<ProxyIdentity>) {
        self.0.push(Part::Svid(identity.clone()));
    }

    fn of_trust(&mut self, bundle: &Arc<TrustBundle>) {
        self.0.push(Part::Trust(bundle.clone()));
    }
}

/// The trust bundles a message for `registrations` carries, in order: each registration's mesh's, then
/// `ALL`'s.
fn trust_bundles<'s>(
    snapshot: &'s Snapshot,
    registrations: &'s [Arc<Registration>],
) -> impl Iterator<Item = &'s Arc<TrustBundle>> {
    registrations
        .iter()
        .filter_map(|registration| snapshot.meshes.get(&*registration.proxy.mesh))
        .map(|mesh| &mesh.trust)
        .chain(std::iter::once(&snapshot.all))
}

/// The trust of the registrations' meshes and of every mesh and trust domain (`ALL`), by trust domain,
/// borrowed from the snapshot (every message of every stream builds it).
fn trust_by_domain<'s>(
    snapshot: &'s Snapshot,
    registrations: &'s [Arc<Registration>],
    fingerprint: &mut Fingerprint,
) -> BTreeMap<&'s str, Vec<&'s str>> {
    let mut bundles: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for bundle in trust_bundles(snapshot, registrations) {
        fingerprint.of_trust(bundle);
        for (td, pems) in bundle.by_trust_domain() {
            let held = bundles.entry(td.as_str()).or_default();
            for pem in pems {
                if !held.contains(&pem.as_str()) {
                    held.push(pem);
                }
            }
        }
    }
    bundles
}

/// What [`svids`] would build its message from, without building it; `None` while a registration's
/// identity is still being prepared (it would send nothing). A stream that was sent a message with
/// this fingerprint holds what [`svids`] would build: it needs no new one.
pub(crate) fn svids_fingerprint(
    snapshot: &Snapshot,
    registrations: &[Arc<Registration>],
) -> Option<Fingerprint> {
    let mut fingerprint = Fingerprint::default();
    trust_bundles(snapshot, registrations).for_each(|bundle| fingerprint.of_trust(bundle));
    for registration in registrations {
        match snapshot.proxies.get(&registration.proxy) {
            Some(ProxyEntry::Ready(identity)) => fingerprint.of_svid(identity),
            None | Some(ProxyEntry::Pending) => return None,
            Some(ProxyEntry::NoIdentity { .. } | ProxyEntry::Refused { .. }) => {}
        }
    }
    Some(fingerprint)
}

/// What [`bundles`] would build its message from, without building it.
pub(crate) fn bundles_fingerprint(
    snapshot: &Snapshot,
    registrations: &[Arc<Registration>],
) -> Fingerprint {
    let mut fingerprint = Fingerprint::default();
    trust_bundles(snapshot, registrations).for_each(|bundle| fingerprint.of_trust(bundle));
    fingerprint
}

/// Zeroizes the private keys `response` carries.
pub(crate) fn forget_keys(response: &mut X509SvidResponse) {
    for svid in &mut response.svids {
        svid.x509_svid_key.zeroize();
    }
}

/// Concatenated DER of PEM certificates (one certificate per string, as trust bundles hold them).
fn der_of(pems: &[&str]) -> Result<Vec<u8>, String> {
    let mut der = Vec::new();
    for text in pems {
        der.extend_from_slice(&certificates_der(text)?);
    }
    Ok(der)
}

/// The DER of the PKCS#8 private key in PEM `text`. Each message a stream is sent decodes it again (a
/// private key is never cached), so the usual form, one `PRIVATE KEY` block, is decoded straight
/// into zeroized buffers, without the `pem` crate's intermediate text (which is not zeroized, and
/// took about an eighth of the daemon's CPU while 100,000 streams of one registration were sent their
/// new SVID); anything else goes through the `pem` crate.
fn private_key_der(text: &str) -> Result<Zeroizing<Vec<u8>>, String> {
    const BEGIN: &str = "-----BEGIN PRIVATE KEY-----";
    const END: &str = "-----END PRIVATE KEY-----";
    let body = text
        .trim_start()
        .strip_prefix(BEGIN)
        .and_then(|rest| rest.split_once(END))
        .map(|(body, _)| body);
    if let Some(body) = body {
        let mut encoded = Zeroizing::new(Vec::with_capacity(body.len()));
        encoded.extend(body.bytes().filter(|b| !b.is_ascii_whitespace()));
        let mut der = Zeroizing::new(vec![0; base64::decoded_len_estimate(encoded.len())]);
        if let Ok(len) = BASE64.decode_slice(encoded.as_slice(), der.as_mut_slice()) {
            der.truncate(len);
            return Ok(der);
        }
    }
    let block =
        ::pem::parse(text).map_err(|_| "the private key does not parse as PEM".to_owned())?;
    if block.tag() != "PRIVATE KEY" {
        return Err(format!(
            "the private key is a {} block, not PKCS#8",
            block.tag()
        ));
    }
    Ok(Zeroizing::new(block.into_contents()))
}

/// The concatenated DER of the certificates in PEM `text`, decoded once per distinct text: every
/// stream of a registration, and every registration of a mesh, sends the same certificates, and
/// decoding their PEM for each message was most of the daemon's CPU while a rotation reached 10,000
/// streams (`bench workload`: 1.4–1.6 s, 0.5–0.6 s without). Certificates only: a private key never
/// enters the cache.
fn certificates_der(text: &str) -> Result<Arc<[u8]>, String> {
    if let Some(der) = DER_CACHE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(text)
    {
        return Ok(der);
    }
    let mut der = Vec::new();
    for block in ::pem::parse_many(text).map_err(|e| e.to_string())? {
        if block.tag() != "CERTIFICATE" {
            return Err(format!("a {} block where certificates belong", block.tag()));
        }
        der.extend_from_slice(block.contents());
    }
    let der: Arc<[u8]> = der.into();
    DER_CACHE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(text, der.clone());
    Ok(der)
}

/// The certificates decoded lately, shared by every Workload API server of the process (their
/// streams reach [`svids`] and [`bundles`] with the snapshot alone).
static DER_CACHE: Mutex<DerCache> = Mutex::new(DerCache::new());

/// PEM text → DER, in two generations: a lookup finds the current one or the previous (and moves
/// the entry up); when the current one is full it becomes the previous and the older one is dropped.
/// So the texts in use stay, old CAs and renewed SVIDs leave within two generations, and the memory
/// is bounded by [`DerCache::GENERATION`] entries twice.
struct DerCache {
    current: Option<HashMap<Box<str>, Arc<[u8]>, KeyHasher>>,
    previous: Option<HashMap<Box<str>, Arc<[u8]>, KeyHasher>>,
}

impl DerCache {
    /// Entries per generation: many more than the CAs and identities one rotation moves.
    const GENERATION: usize = 1024;

    const fn new() -> DerCache {
        DerCache {
            current: None,
            previous: None,
        }
    }

    fn get(&mut self, text: &str) -> Option<Arc<[u8]>> {
        if let Some(der) = self.current.as_ref().and_then(|c| c.get(text)) {
            return Some(der.clone());
        }
        let der = self.previous.as_mut()?.remove(text)?;
        self.insert(text, der.clone());
        Some(der)
    }

    fn insert(&mut self, text: &str, der: Arc<[u8]>) {
        let current = self.current.get_or_insert_with(HashMap::default);
        if current.len() >= Self::GENERATION {
            self.previous = self.current.take();
        }
        self.current
            .get_or_insert_with(HashMap::default)
            .insert(text.into(), der);
    }
}

/// One SVID as the Workload API carries it.
fn svid(
    identity: &ProxyIdentity,
    bundles: &BTreeMap<&str, Vec<&str>>,
    hint: String,
) -> Result<X509Svid, String> {
    let chain = certificates_der(&identity.chain_pem)
        .map_err(|e| format!("the certificate chain does not parse: {e}"))?;
    let held = identity.key.held().ok_or_else(|| {
        "its key is held by a meshca agent: the agent's Workload API socket serves it".to_owned()
    })?;
    let key = private_key_der(held.expose())?;
    let td = identity.trust_domain();
    let bundle = der_of(bundles.get(td).map(Vec::as_slice).unwrap_or_default())?;
    if bundle.is_empty() {
        return Err(format!("no CA of trust domain {td} is trusted"));
    }
    Ok(X509Svid {
        spiffe_id: identity.spiffe_id.clone(),
        x509_svid: chain.to_vec(),
        x509_svid_key: key.to_vec(),
        bundle,
        hint,
    })
}

/// The `FetchX509SVID` message for `registrations` (in order: the first is the default identity), with
/// what it was built from.
pub(crate) fn svids(
    snapshot: &Snapshot,
    registrations: &[Arc<Registration>],
) -> (Built<X509SvidResponse>, Fingerprint) {
    let mut fingerprint = Fingerprint::default();
    let bundles = trust_by_domain(snapshot, registrations, &mut fingerprint);
    let mut response = X509SvidResponse::default();
    let mut skipped = Vec::new();
    let mut hints: Vec<&str> = Vec::new();
    for registration in registrations {
        let identity = match snapshot.proxies.get(&registration.proxy) {
            Some(ProxyEntry::Ready(identity)) => identity,
            None | Some(ProxyEntry::Pending) => return (Built::Waiting, fingerprint),
            Some(ProxyEntry::NoIdentity { reason } | ProxyEntry::Refused { reason }) => {
                skipped.push(format!("registration {}: {reason}", registration.name));
                continue;
            }
        };
        fingerprint.of_svid(identity);
        // A hint is unique within one response: the first registration (in order) keeps it.
        let hint = match registration.hint.as_deref() {
            Some(hint) if !hints.contains(&hint) => {
                hints.push(hint);
                hint.to_owned()
            }
            _ => String::new(),
        };
        match svid(identity, &bundles, hint) {
            Ok(svid) => response.svids.push(svid),
            Err(reason) => skipped.push(format!("registration {}: {reason}", registration.name)),
        }
    }
    if response.svids.is_empty() {
        return (Built::Nothing(skipped.join("; ")), fingerprint);
    }
    let own: Vec<String> = response
        .svids
        .iter()
        .map(|s| meshca_control::trust_domain_of(&s.spiffe_id).to_owned())
        .collect();
    response.federated_bundles = match federated(&bundles, |td| own.iter().any(|o| o == td)) {
        Ok(map) => map,
        Err(reason) => {
            forget_keys(&mut response);
            return (Built::Nothing(reason), fingerprint);
        }
    };
    (within_limit(response, forget_keys), fingerprint)
}

/// The `FetchX509Bundles` message: every trust domain the registrations' meshes trust, and `ALL`'s.
pub(crate) fn bundles(
    snapshot: &Snapshot,
    registrations: &[Arc<Registration>],
) -> (Built<X509BundlesResponse>, Fingerprint) {
    let mut fingerprint = Fingerprint::default();
    let bundles = trust_by_domain(snapshot, registrations, &mut fingerprint);
    match federated(&bundles, |_| false) {
        Ok(map) if map.is_empty() => (
            Built::Nothing("no CA is trusted yet".to_owned()),
            fingerprint,
        ),
        Ok(map) => (
            within_limit(
                X509BundlesResponse {
                    crl: vec![],
                    bundles: map,
                },
                |_| {},
            ),
            fingerprint,
        ),
        Err(reason) => (Built::Nothing(reason), fingerprint),
    }
}

/// The bundles keyed `spiffe://<trust domain>`, leaving out the trust domains `skip` names.
fn federated(
    bundles: &BTreeMap<&str, Vec<&str>>,
    skip: impl Fn(&str) -> bool,
) -> Result<HashMap<String, Vec<u8>>, String> {
    let mut out = HashMap::new();
    for (td, pems) in bundles {
        if skip(td) || pems.is_empty() {
            continue;
        }
        let der = der_of(pems).map_err(|e| format!("a CA of {td} does not parse: {e}"))?;
        out.insert(format!("spiffe://{td}"), der);
    }
    Ok(out)
}

/// The response, or why it is not sent: clients refuse messages of 4 MiB and more. A response refused
/// has `forget` applied to it first.
fn within_limit<R: Message>(mut response: R, forget: impl FnOnce(&mut R)) -> Built<R> {
    let size = response.encoded_len();
    if size >= MAX_RESPONSE_BYTES {
        forget(&mut response);
        return Built::TooLarge(format!(
            "the response would be {size} bytes, over the {MAX_RESPONSE_BYTES} bytes Workload API \
             clients accept (too many or too large bundles?)"
        ));
    }
    Built::Ready(response)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn identity(spiffe_id: &str) -> Arc<ProxyIdentity> {
        Arc::new(ProxyIdentity {
            spiffe_id: spiffe_id.to_owned(),
            identity_name: None,
            chain_pem: String::new(),
            key: meshca_control::LeafKey::Held(meshca_control::SecretPem::new(String::new())),
        })
    }

    #[test]
    fn a_fingerprint_tells_content_apart_by_identity_and_keeps_what_it_names() {
        let first = identity("spiffe://example.org/a");
        let mut sent = Fingerprint::default();
        sent.of_svid(&first);
        let mut again = Fingerprint::default();
        again.of_svid(&first);
        assert_eq!(sent, again, "the same content");
        // Equal text in another identity is other content (a renewal can repeat every field shown here).
        let mut renewed = Fingerprint::default();
        renewed.of_svid(&identity("spiffe://example.org/a"));
        assert_ne!(sent, renewed);
        // What was sent stays alive while its fingerprint does, so its address is never reused.
        let weak = Arc::downgrade(&first);
        drop((first, again));
        assert!(weak.upgrade().is_some());
        drop(sent);
        assert!(weak.upgrade().is_none());
    }

    /// A CERTIFICATE block (its content is not looked at: any bytes do) and its content.
    fn certificate(name: &str) -> (String, Vec<u8>) {
        let der = format!("certificate of {name}").into_bytes();
        (
            ::pem::encode(&::pem::Pem::new("CERTIFICATE", der.clone())),
            der,
        )
    }

    #[test]
    fn certificates_decode_the_same_from_the_cache_and_other_blocks_are_refused() {
        let (a_pem, a_der) = certificate("a.example");
        let (b_pem, b_der) = certificate("b.example");
        let both = format!("{a_pem}{b_pem}");
        for _ in 0..2 {
            assert_eq!(&*certificates_der(&a_pem).expect("decodes"), &a_der[..]);
            assert_eq!(
                &*certificates_der(&both).expect("decodes"),
                &[a_der.clone(), b_der.clone()].concat()[..]
            );
        }
        assert_eq!(
            der_of(&[b_pem.as_str(), a_pem.as_str()]).expect("decodes"),
            [b_der, a_der].concat()
        );
        let key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        let e = certificates_der(key).expect_err("a key is no certificate");
        assert!(e.contains("PRIVATE KEY"), "{e}");
        let bad = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
        assert!(certificates_der(bad).is_err(), "not base64");
    }

    #[test]
    fn the_cache_keeps_two_generations_and_what_is_used_moves_up() {
        let mut cache = DerCache::new();
        let der = |i: usize| -> Arc<[u8]> { i.to_be_bytes().to_vec().into() };
        cache.insert("kept", der(0));
        for i in 1..DerCache::GENERATION {
            cache.insert(&format!("t{i}"), der(i));
        }
        // The generation is full: the next entry starts a new one, the old one is still found.
        cache.insert("new", der(1));
        assert_eq!(
            cache.get("kept"),
            Some(der(0)),
            "moved to the new generation"
        );
        for i in 1..DerCache::GENERATION {
            cache.insert(&format!("u{i}"), der(i));
        }
        assert_eq!(cache.get("t1"), None, "two generations old");
        assert_eq!(cache.get("kept"), Some(der(0)), "it was used: it stays");
        assert_eq!(cache.get("new"), Some(der(1)));
    }
    proptest::proptest! {
        /// Any key bytes, in a PEM block written with `\n` or `\r\n` lines, with or without
        /// leading whitespace, decode to themselves, as the `pem` crate decodes them.
        #[test]
        fn a_private_key_decodes_as_the_pem_crate_decodes_it(
            der in proptest::collection::vec(proptest::num::u8::ANY, 0..400),
            crlf: bool,
            leading in "[ \n]{0,3}",
        ) {
            let config = ::pem::EncodeConfig::new().set_line_ending(if crlf {
                ::pem::LineEnding::CRLF
            } else {
                ::pem::LineEnding::LF
            });
            let text = leading + &::pem::encode_config(&::pem::Pem::new("PRIVATE KEY", der.clone()), config);
            let decoded = private_key_der(&text).expect("decodes");
            proptest::prop_assert_eq!(decoded.as_slice(), der.as_slice());
            let parsed = ::pem::parse(&text).expect("pem");
            proptest::prop_assert_eq!(parsed.contents(), der.as_slice());
        }
    }

    #[test]
    fn a_private_key_that_is_not_one_pkcs8_block_is_refused_naming_what_it_is() {
        let ec = ::pem::encode(&::pem::Pem::new("EC PRIVATE KEY", vec![1, 2, 3]));
        let e = private_key_der(&ec).expect_err("not PKCS#8");
        assert!(e.contains("EC PRIVATE KEY block, not PKCS#8"), "{e}");
        let e = private_key_der("no PEM at all").expect_err("not PEM");
        assert!(e.contains("does not parse as PEM"), "{e}");
        // A body that is no base64 is refused, not decoded to something.
        let bad = "-----BEGIN PRIVATE KEY-----\n!!!!\n-----END PRIVATE KEY-----\n";
        assert!(private_key_der(bad).is_err());
    }
    /// A snapshot with mesh `default` trusting one CA of example.org, and `entries` for its proxies.
    pub(crate) fn snapshot_with(entries: Vec<(&str, ProxyEntry)>) -> Snapshot {
        let (ca_pem, _) = certificate("ca.example.org");
        let trust = Arc::new(TrustBundle::new(BTreeMap::from([(
            "example.org".to_owned(),
            vec![ca_pem],
        )])));
        let mut snapshot = Snapshot::empty();
        snapshot.meshes = Arc::new(HashMap::from([(
            "default".to_owned(),
            meshca_control::MeshView {
                trust,
                mesh_services: HashMap::new(),
                federated: Arc::new([]),
            },
        )]));
        for (name, entry) in entries {
            snapshot
                .proxies
                .insert(meshca_control::ProxyKey::new("default", name), entry);
        }
        snapshot
    }

    pub(crate) fn registration(name: &str) -> Arc<Registration> {
        Arc::new(Registration {
            name: name.into(),
            proxy: meshca_control::ProxyKey::new("default", name),
            selectors: vec![],
            agent: None,
            hint: None,
            jwt_svid_expiry: std::time::Duration::from_secs(300),
            labels: Default::default(),
        })
    }

    pub(crate) fn ready(name: &str) -> ProxyEntry {
        let (chain_pem, _) = certificate(name);
        let key = ::pem::encode(&::pem::Pem::new("PRIVATE KEY", b"key".to_vec()));
        ProxyEntry::Ready(Arc::new(ProxyIdentity {
            spiffe_id: format!("spiffe://example.org/{name}"),
            identity_name: None,
            chain_pem,
            key: meshca_control::LeafKey::Held(meshca_control::SecretPem::new(key)),
        }))
    }

    #[test]
    fn the_fingerprint_alone_is_the_one_a_built_message_carries() {
        let registrations = [registration("a"), registration("b")];
        let refused = ProxyEntry::Refused {
            reason: "not allowed".into(),
        };
        // Both ready; one refused (left out of the message, and of the fingerprint).
        for entries in [
            vec![("a", ready("a")), ("b", ready("b"))],
            vec![("a", ready("a")), ("b", refused)],
        ] {
            let snapshot = snapshot_with(entries);
            let (built, fingerprint) = svids(&snapshot, &registrations);
            assert!(matches!(built, Built::Ready(_)), "{built:?}");
            assert_eq!(
                svids_fingerprint(&snapshot, &registrations),
                Some(fingerprint)
            );
            let (built, fingerprint) = bundles(&snapshot, &registrations);
            assert!(matches!(built, Built::Ready(_)), "{built:?}");
            assert_eq!(bundles_fingerprint(&snapshot, &registrations), fingerprint);
        }
        // One still being prepared: no message, so no fingerprint to compare.
        let snapshot = snapshot_with(vec![("a", ready("a")), ("b", ProxyEntry::Pending)]);
        assert!(matches!(svids(&snapshot, &registrations).0, Built::Waiting));
        assert_eq!(svids_fingerprint(&snapshot, &registrations), None);
        // Another identity for a: another fingerprint, though every field shown is the same.
        let first = snapshot_with(vec![("a", ready("a")), ("b", ready("b"))]);
        let mut renewed = first.clone();
        renewed
            .proxies
            .insert(meshca_control::ProxyKey::new("default", "a"), ready("a"));
        assert_ne!(
            svids_fingerprint(&first, &registrations),
            svids_fingerprint(&renewed, &registrations)
        );
    }
}
