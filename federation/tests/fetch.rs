//! Fetching from a bundle endpoint written here against the SPIFFE Federation standard alone (rustls,
//! rcgen, a hand-written HTTP/1.1 answer and a bundle built as JSON), never with meshca's code.

use std::time::Duration;

use meshca_federation::fetch::{fetch, EndpointAuth, FetchError};
use meshca_federation::{BundleError, BundleLimits, SpiffeBundle, X509Authority};
use meshca_identity::SpiffeId;
use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

mod peer;

use peer::{bundle_json, held, td, Ca, Endpoint, ENDPOINT_ID};

const TIMEOUT: Duration = Duration::from_secs(10);

fn spiffe_auth(ca: &Ca, id: &str) -> EndpointAuth {
    EndpointAuth::Spiffe {
        id: SpiffeId::parse(id).expect("a SPIFFE ID"),
        bundle: held(ca),
    }
}

/// A bundle endpoint that answers every connection's one request with `status` and `body`, over TLS
/// with `svid`; its address.
async fn endpoint(
    svid: (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>),
    status: &'static str,
    body: Vec<u8>,
) -> std::net::SocketAddr {
    Endpoint::start(svid, status, body).await.addr
}

async fn fetch_from(
    addr: std::net::SocketAddr,
    auth: &EndpointAuth,
    limits: BundleLimits,
) -> Result<SpiffeBundle, FetchError> {
    fetch(&format!("https://{addr}/"), &td(), auth, TIMEOUT, limits).await
}

/// Why a fetch from `addr`, the endpoint authenticated as ENDPOINT_ID by `ca`, was refused.
async fn refused(addr: std::net::SocketAddr, ca: &Ca, limits: BundleLimits) -> FetchError {
    fetch_from(addr, &spiffe_auth(ca, ENDPOINT_ID), limits)
        .await
        .expect_err("refused")
}

#[tokio::test]
async fn an_https_spiffe_endpoint_with_its_spiffe_id_gives_its_bundle_next_ca_included() {
    let (ca, next) = (Ca::new("peer.example"), Ca::new("peer.example"));
    let body = bundle_json(&[ca.jwk(), next.jwk()], 8);
    let addr = endpoint(ca.svid(ENDPOINT_ID), "200 OK", body).await;
    let bundle = fetch_from(
        addr,
        &spiffe_auth(&ca, ENDPOINT_ID),
        BundleLimits::default(),
    )
    .await
    .expect("the bundle");
    assert_eq!(bundle.sequence, Some(8));
    assert_eq!(bundle.refresh_hint, Some(Duration::from_secs(60)));
    let ders: Vec<&[u8]> = bundle
        .x509_authorities()
        .iter()
        .map(X509Authority::der)
        .collect();
    assert_eq!(ders, [ca.der().as_slice(), next.der().as_slice()]);
}

#[tokio::test]
async fn an_endpoint_with_another_spiffe_id_or_an_svid_of_another_ca_is_refused() {
    let ca = Ca::new("peer.example");
    let body = bundle_json(&[ca.jwk()], 1);
    let addr = endpoint(
        ca.svid("spiffe://peer.example/not-the-endpoint"),
        "200 OK",
        body.clone(),
    )
    .await;
    let error = refused(addr, &ca, BundleLimits::default()).await;
    assert!(
        matches!(&error, FetchError::Transport(m) if m.contains("not-the-endpoint")),
        "{error}"
    );

    let impostor = Ca::new("peer.example");
    let addr = endpoint(impostor.svid(ENDPOINT_ID), "200 OK", body).await;
    let error = refused(addr, &ca, BundleLimits::default()).await;
    assert!(matches!(error, FetchError::Transport(_)), "{error}");
}

#[tokio::test]
async fn an_error_status_an_oversize_or_a_foreign_bundle_is_refused() {
    let ca = Ca::new("peer.example");
    let addr = endpoint(ca.svid(ENDPOINT_ID), "404 Not Found", b"no".to_vec()).await;
    let error = refused(addr, &ca, BundleLimits::default()).await;
    assert!(matches!(error, FetchError::Status(404)), "{error}");

    let body = bundle_json(&[ca.jwk()], 1);
    let small = BundleLimits {
        max_bytes: body.len() - 1,
        max_keys: 16,
    };
    let addr = endpoint(ca.svid(ENDPOINT_ID), "200 OK", body).await;
    let error = refused(addr, &ca, small).await;
    assert!(
        matches!(error, FetchError::Bundle(BundleError::TooLarge { .. })),
        "{error}"
    );

    // A bundle whose authority names another trust domain is not this trust domain's.
    let foreign = Ca::new("evil.example");
    let addr = endpoint(
        ca.svid(ENDPOINT_ID),
        "200 OK",
        bundle_json(&[foreign.jwk()], 2),
    )
    .await;
    let error = refused(addr, &ca, BundleLimits::default()).await;
    assert!(
        matches!(&error, FetchError::Bundle(e) if e.to_string().contains("evil.example")),
        "{error}"
    );
}

#[tokio::test]
async fn an_https_web_endpoint_is_checked_by_its_roots_and_host() {
    // A Web PKI server certificate for 127.0.0.1, from a root the fetch is given.
    let root = Ca::new("peer.example");
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("params");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().expect("a key");
    let cert = params
        .signed_by(&key, &root.0)
        .expect("a server certificate");
    let server = (
        vec![cert.der().clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    );
    let ca = Ca::new("peer.example");
    let addr = endpoint(server, "200 OK", bundle_json(&[ca.jwk()], 3)).await;
    let web = EndpointAuth::Web {
        roots: vec![CertificateDer::from(root.der())],
    };
    let bundle = fetch_from(addr, &web, BundleLimits::default())
        .await
        .expect("the bundle");
    assert_eq!(bundle.sequence, Some(3));

    let other = EndpointAuth::Web {
        roots: vec![CertificateDer::from(Ca::new("x.example").der())],
    };
    let error = fetch_from(addr, &other, BundleLimits::default())
        .await
        .expect_err("refused");
    assert!(matches!(error, FetchError::Transport(_)), "{error}");
}
