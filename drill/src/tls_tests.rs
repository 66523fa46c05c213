//! Real handshakes between configs built from rcgen certificates: the cases a CA rotation produces.

use std::collections::{BTreeMap, BTreeSet};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::*;

struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    fn new(name: &str, trust_domain: &str) -> Ca {
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.subject_alt_names = vec![SanType::URI(
            format!("spiffe://{trust_domain}")
                .try_into()
                .expect("a valid URI"),
        )];
        let key = KeyPair::generate().expect("ring generates P-256 keys");
        Ca(CertifiedIssuer::self_signed(params, key).expect("a valid CA"))
    }

    fn der(&self) -> CertificateDer<'static> {
        self.0.der().clone()
    }

    /// A leaf SVID for `id`: chain (leaf only) and key.
    fn leaf(&self, id: &str) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.subject_alt_names = vec![SanType::URI(id.try_into().expect("a valid URI"))];
        let key = KeyPair::generate().expect("ring generates P-256 keys");
        let cert = params.signed_by(&key, &self.0).expect("a valid leaf");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (vec![cert.der().clone()], key)
    }
}

fn bundle(cas: &[&Ca]) -> BTreeMap<String, Vec<CertificateDer<'static>>> {
    BTreeMap::from([(
        "default".to_owned(),
        cas.iter().map(|ca| ca.der()).collect(),
    )])
}

fn endpoint(ca: &Ca, id: &str, trusted: &[&Ca]) -> Endpoint {
    let (chain, key) = ca.leaf(id);
    Endpoint::new(chain, key, &bundle(trusted), &BTreeMap::new()).expect("a usable identity")
}

/// A handshake in which each side expects exactly one SPIFFE ID of the other.
async fn handshake(
    client: &Endpoint,
    server: &Endpoint,
    server_id: &str,
    client_id: &str,
) -> Result<(), HandshakeFailure> {
    super::handshake(
        client,
        server,
        &PeerCheck::Exact(server_id.to_owned()),
        &ClientIds(BTreeSet::from([client_id.to_owned()])),
    )
    .await
}

const WEB: &str = "spiffe://default/web";
const API: &str = "spiffe://default/api";

#[tokio::test]
async fn same_ca_handshakes() {
    let ca = Ca::new("ca-1", "default");
    let web = endpoint(&ca, WEB, &[&ca]);
    let api = endpoint(&ca, API, &[&ca]);
    assert_eq!(handshake(&web, &api, API, WEB).await, Ok(()));
    assert_eq!(handshake(&api, &web, WEB, API).await, Ok(()));
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_new_ca_rejects_the_server() {
    let (old, new) = (Ca::new("ca-1", "default"), Ca::new("ca-2", "default"));
    let client = endpoint(&old, WEB, &[&old]);
    let server = endpoint(&new, API, &[&old, &new]);
    let failure = handshake(&client, &server, API, WEB)
        .await
        .expect_err("the client trusts only ca-1");
    assert_eq!(failure.side, Side::Client);
    assert_eq!(failure.reason, "invalid peer certificate: UnknownIssuer");
}

#[tokio::test]
async fn a_server_that_does_not_trust_the_new_ca_rejects_the_client() {
    let (old, new) = (Ca::new("ca-1", "default"), Ca::new("ca-2", "default"));
    let client = endpoint(&new, WEB, &[&old, &new]);
    let server = endpoint(&old, API, &[&old]);
    let failure = handshake(&client, &server, API, WEB)
        .await
        .expect_err("the server trusts only ca-1");
    assert_eq!(failure.side, Side::Server);
    assert!(
        failure.reason.contains("UnknownIssuer"),
        "{}",
        failure.reason
    );
}

#[tokio::test]
async fn both_cas_in_the_bundle_bridge_a_rotation() {
    let (old, new) = (Ca::new("ca-1", "default"), Ca::new("ca-2", "default"));
    let rotated = endpoint(&new, WEB, &[&old, &new]);
    let pending = endpoint(&old, API, &[&old, &new]);
    assert_eq!(handshake(&rotated, &pending, API, WEB).await, Ok(()));
    assert_eq!(handshake(&pending, &rotated, WEB, API).await, Ok(()));
}

#[tokio::test]
async fn the_client_checks_the_servers_spiffe_id() {
    let ca = Ca::new("ca-1", "default");
    let client = endpoint(&ca, WEB, &[&ca]);
    let server = endpoint(&ca, API, &[&ca]);
    let failure = handshake(&client, &server, "spiffe://default/db", WEB)
        .await
        .expect_err("the server is api, not db");
    assert_eq!(failure.side, Side::Client);
    assert_eq!(
        failure.reason,
        "other error: the peer presents spiffe://default/api, expected spiffe://default/db"
    );
}

#[tokio::test]
async fn the_server_checks_the_clients_spiffe_id() {
    let ca = Ca::new("ca-1", "default");
    let client = endpoint(&ca, WEB, &[&ca]);
    let server = endpoint(&ca, API, &[&ca]);
    let failure = handshake(&client, &server, API, "spiffe://default/db")
        .await
        .expect_err("the client is web, not db");
    assert_eq!(failure.side, Side::Server);
    assert_eq!(
        failure.reason,
        "the peer presents spiffe://default/web, expected spiffe://default/db"
    );
}

#[tokio::test]
async fn anchors_of_another_trust_domain_do_not_count() {
    let ca = Ca::new("ca-1", "default");
    let other = Ca::new("other", "other");
    let (chain, key) = ca.leaf(WEB);
    let mut trust = bundle(&[&ca]);
    trust.insert("other".into(), vec![other.der()]);
    let client = Endpoint::new(chain, key, &trust, &BTreeMap::new()).expect("a usable identity");
    let (chain, key) = ca.leaf("spiffe://other/api");
    let server = Endpoint::new(chain, key, &trust, &BTreeMap::new()).expect("a usable identity");
    // The server's leaf is signed by ca-1, which is not an anchor of trust domain `other`.
    let failure = handshake(&client, &server, "spiffe://other/api", WEB)
        .await
        .expect_err("ca-1 does not vouch for trust domain other");
    assert_eq!(failure.reason, "invalid peer certificate: UnknownIssuer");
}

/// An endpoint for `id` signed by `ca`, trusting `trusted`, with a `meshservice:api` context that accepts
/// `api_ids` under `api_trust`.
fn with_api_context(
    ca: &Ca,
    id: &str,
    trusted: &[&Ca],
    api_ids: &[&str],
    api_trust: BTreeMap<String, Vec<CertificateDer<'static>>>,
) -> Endpoint {
    let (chain, key) = ca.leaf(id);
    let context = ServiceContext {
        ids: api_ids.iter().map(|id| (*id).to_owned()).collect(),
        bundle: api_trust,
    };
    let services = BTreeMap::from([("meshservice:api".to_owned(), context)]);
    Endpoint::new(chain, key, &bundle(trusted), &services).expect("a usable identity")
}

const API_NEW: &str = "spiffe://new.example/workload/api";

#[tokio::test]
async fn a_meshservice_context_accepts_exactly_its_ids_under_their_trust_domains_anchors() {
    let legacy = Ca::new("ca-1", "default");
    let new = Ca::new("identity", "new.example");
    let server = endpoint(&new, API_NEW, &[&legacy]);
    let clients = ClientIds(BTreeSet::from([WEB.to_owned()]));
    let api = PeerCheck::Context("meshservice:api".to_owned());
    let both_domains = BTreeMap::from([
        ("default".to_owned(), vec![legacy.der()]),
        ("new.example".to_owned(), vec![new.der()]),
    ]);

    // Before the new ID reached the client's context, the server's new certificate is refused.
    let before = with_api_context(&legacy, WEB, &[&legacy, &new], &[API], both_domains.clone());
    let failure = super::handshake(&before, &server, &api, &clients)
        .await
        .expect_err("the context does not hold the new ID yet");
    assert_eq!(failure.side, Side::Client);
    assert_eq!(
        failure.reason,
        format!("other error: the peer presents {API_NEW}, expected meshservice:api")
    );

    // With the ID but without the new trust domain's CA, the chain does not verify.
    let only_legacy = BTreeMap::from([("default".to_owned(), vec![legacy.der()])]);
    let untrusted = with_api_context(&legacy, WEB, &[&legacy, &new], &[API, API_NEW], only_legacy);
    let failure = super::handshake(&untrusted, &server, &api, &clients)
        .await
        .expect_err("no anchor for new.example");
    assert_eq!(failure.reason, "invalid peer certificate: UnknownIssuer");

    // The new CA filed under another trust domain does not vouch for new.example either.
    let misfiled = BTreeMap::from([("default".to_owned(), vec![legacy.der(), new.der()])]);
    let misfiled = with_api_context(&legacy, WEB, &[&legacy, &new], &[API, API_NEW], misfiled);
    assert!(super::handshake(&misfiled, &server, &api, &clients)
        .await
        .is_err());

    let after = with_api_context(
        &legacy,
        WEB,
        &[&legacy, &new],
        &[API, API_NEW],
        both_domains,
    );
    assert_eq!(
        super::handshake(&after, &server, &api, &clients).await,
        Ok(())
    );

    // A client without the context cannot check the server at all.
    let bare = endpoint(&legacy, WEB, &[&legacy, &new]);
    let failure = super::handshake(&bare, &server, &api, &clients)
        .await
        .expect_err("no context");
    assert_eq!(failure.reason, "no meshservice:api context applied");
}

#[tokio::test]
async fn a_server_accepts_any_of_the_ids_a_client_may_present() {
    let ca = Ca::new("ca-1", "default");
    let client = endpoint(&ca, WEB, &[&ca]);
    let server = endpoint(&ca, API, &[&ca]);
    let either = ClientIds(BTreeSet::from([
        WEB.to_owned(),
        "spiffe://default/workload/web".to_owned(),
    ]));
    let check = PeerCheck::Exact(API.to_owned());
    assert_eq!(
        super::handshake(&client, &server, &check, &either).await,
        Ok(())
    );
    let other = ClientIds(BTreeSet::from([
        "spiffe://default/db".to_owned(),
        "spiffe://default/workload/db".to_owned(),
    ]));
    let failure = super::handshake(&client, &server, &check, &other)
        .await
        .expect_err("web is neither");
    assert_eq!(
        failure.reason,
        "the peer presents spiffe://default/web, expected one of spiffe://default/db, spiffe://default/workload/db"
    );
}

#[test]
fn an_empty_bundle_or_a_foreign_key_is_refused() {
    let ca = Ca::new("ca-1", "default");
    let (chain, key) = ca.leaf(WEB);
    assert!(matches!(
        Endpoint::new(chain, key, &BTreeMap::new(), &BTreeMap::new()),
        Err(TlsSetupError::EmptyBundle)
    ));
    let (chain, _) = ca.leaf(WEB);
    let (_, other_key) = ca.leaf(API);
    assert!(matches!(
        Endpoint::new(chain, other_key, &bundle(&[&ca]), &BTreeMap::new()),
        Err(TlsSetupError::BadIdentity { .. })
    ));
}

#[test]
fn spiffe_id_reads_the_one_uri_san() {
    let ca = Ca::new("ca-1", "default");
    let (chain, _) = ca.leaf(WEB);
    assert_eq!(spiffe_id(&chain[0]).ok(), Some(WEB.to_owned()));
    assert_eq!(trust_domain(WEB), Some("default"));
    assert_eq!(trust_domain("https://x"), None);
}
