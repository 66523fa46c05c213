//! Two daemons of two trust domains, federated: `alpha` serves its bundle endpoint (`https_spiffe`),
//! `beta` follows it through a FederationRelationship. What alpha serves is what its proxies are told
//! to trust, numbered so the sequence never goes backwards (a restart serves the same number); beta's
//! proxies trust alpha's CAs, through alpha's rotation.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use common::{settings, start, TIMEOUT};
use meshca_config::{EndpointServing, FederationEndpoint};
use meshca_daemon::Daemon;
use meshca_federation::fetch::{fetch, EndpointAuth};
use meshca_federation::{BundleLimits, HeldFrom, SpiffeBundle};
use meshca_identity::{SpiffeId, TrustDomain};

fn alpha() -> TrustDomain {
    "alpha".parse().expect("a trust domain")
}

/// Mesh `name` on builtin backend `enabled`, trusting `also` too.
fn mesh(name: &str, enabled: &str, also: &[&str]) -> String {
    let backends: String = std::iter::once(enabled)
        .chain(also.iter().copied())
        .map(|b| {
            format!(
                "    - {{name: {b}, type: builtin, dpCert: {{rotation: {{expiration: 1h}}}}}}\n"
            )
        })
        .collect();
    let secondary = if also.is_empty() {
        String::new()
    } else {
        format!("  secondaryBackends: [{}]\n", also.join(", "))
    };
    format!("type: Mesh\nname: {name}\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: {enabled}\n{secondary}  backends:\n{backends}")
}

async fn start_alpha(root: &Path) -> Daemon {
    let resources = root.join("resources");
    std::fs::create_dir_all(&resources).expect("resources");
    if !resources.join("mesh.yaml").exists() {
        std::fs::write(resources.join("mesh.yaml"), mesh("alpha", "ca-1", &[])).expect("mesh");
    }
    let mut s = settings(root);
    s.federation.endpoints = vec![FederationEndpoint {
        trust_domain: alpha(),
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        profile: EndpointServing::HttpsSpiffe,
    }];
    start(s, false).await
}

/// What `daemon`'s endpoint serves, once it serves something with its SVID.
async fn served(daemon: &Daemon) -> (SocketAddr, SpiffeBundle) {
    let endpoint = &daemon.bundle_endpoints[0];
    tokio::time::timeout(TIMEOUT, endpoint.ready())
        .await
        .expect("the endpoint is ready in time");
    let bundle = endpoint.served.borrow().clone().expect("a bundle").bundle;
    (endpoint.addr, bundle)
}

/// `daemon`'s status of trust domain alpha once it fetched alpha's bundle.
async fn first_fetch(daemon: &Daemon) -> meshca_federation::PeerStatus {
    common::peer_status(daemon, &alpha(), |s| s.fetches.ok >= 1).await
}

/// Waits until `daemon` tells its proxies to trust `count` CAs of trust domain alpha.
async fn wait_trusts(daemon: &Daemon, count: usize) {
    let mut snapshots = daemon.snapshots();
    let trusted = snapshots.wait_for(|s| {
        s.all
            .by_trust_domain()
            .get("alpha")
            .is_some_and(|p| p.len() == count)
    });
    if tokio::time::timeout(TIMEOUT, trusted).await.is_err() {
        panic!(
            "{count} CAs of alpha were not trusted in time; the importer: {:?}",
            daemon.federation.status().borrow().get(&alpha())
        );
    }
}

fn ders(bundle: &SpiffeBundle) -> Vec<Vec<u8>> {
    let mut ders: Vec<Vec<u8>> = bundle
        .x509_authorities()
        .iter()
        .map(|a| a.der().to_vec())
        .collect();
    ders.sort();
    ders
}

/// The PEMs `daemon` tells every proxy to trust for `td` (`ALL`).
fn trusted(daemon: &Daemon, td: &str) -> Vec<Vec<u8>> {
    let mut ders: Vec<Vec<u8>> = daemon
        .snapshots()
        .borrow()
        .all
        .by_trust_domain()
        .get(td)
        .into_iter()
        .flatten()
        .map(|pem| ::pem::parse(pem).expect("PEM").into_contents())
        .collect();
    ders.sort();
    ders
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_follows_alphas_endpoint_through_a_rotation_and_a_restart_keeps_the_sequence() {
    let alpha_root = tempfile::tempdir().expect("a directory");
    let beta_root = tempfile::tempdir().expect("a directory");
    let alpha_daemon = start_alpha(alpha_root.path()).await;
    let (addr, first) = served(&alpha_daemon).await;
    assert_eq!(first.sequence, Some(1));
    assert_eq!(
        first.refresh_hint,
        Some(std::time::Duration::from_secs(300))
    );
    assert_eq!(
        ders(&first),
        trusted(&alpha_daemon, "alpha"),
        "what proxies trust"
    );

    // A client written from the standard's side: the endpoint proves itself with an SVID of the
    // endpoint's SPIFFE ID chained to the bundle it serves.
    let endpoint_id = SpiffeId::parse("spiffe://alpha/meshca/bundle-endpoint").expect("an ID");
    let auth = EndpointAuth::Spiffe {
        id: endpoint_id.clone(),
        bundle: first.clone(),
    };
    let url = format!("https://{addr}/");
    let fetched = fetch(&url, &alpha(), &auth, TIMEOUT, BundleLimits::default())
        .await
        .expect("fetched");
    assert_eq!(fetched, first);

    // beta federates with alpha, its initial bundle being what alpha serves.
    let resources = beta_root.path().join("resources");
    std::fs::create_dir_all(&resources).expect("resources");
    std::fs::write(resources.join("mesh.yaml"), mesh("beta", "ca-1", &[])).expect("mesh");
    let initial = beta_root.path().join("alpha.json");
    std::fs::write(&initial, first.to_json()).expect("initial bundle");
    std::fs::write(
        resources.join("alpha.yaml"),
        format!(
            "type: FederationRelationship\nname: alpha\nmesh: beta\nspec:\n  trustDomain: alpha\n  bundleEndpoint: {{url: \"{url}\", profile: https_spiffe, spiffeID: \"{endpoint_id}\"}}\n  initialBundle: {{file: {}}}\n",
            initial.display()
        ),
    )
    .expect("relationship");
    let beta = start(settings(beta_root.path()), false).await;
    let peer = first_fetch(&beta).await;
    assert_eq!(peer.held_from, HeldFrom::Fetched, "{peer:?}");
    assert_eq!(peer.sequence, Some(1));
    wait_trusts(&beta, first.x509_authorities().len()).await;
    assert_eq!(trusted(&beta, "alpha"), ders(&first));
    // Each console shows it: beta the trust domain it follows, alpha the bundle it serves and who
    // fetched it.
    let followed = common::admin_text(beta.admin_addr, "/console/overview").await;
    assert!(
        followed.contains("<h2>Federation</h2>") && followed.contains("from fetched, sequence 1"),
        "{followed}"
    );
    let serving = common::admin_text(alpha_daemon.admin_addr, "/console/overview").await;
    assert!(
        serving.contains("Bundle endpoint of <b>alpha</b> serves sequence 1")
            && serving.contains("fetched by <code>127.0.0.1</code>"),
        "{serving}"
    );
    // alpha saw who fetched: this test's client and beta, both from the loopback address.
    let fetched_by = alpha_daemon.bundle_endpoints[0].fetches.peers();
    assert_eq!(fetched_by.len(), 1, "{fetched_by:?}");
    assert_eq!(fetched_by[0].0, std::net::IpAddr::from(Ipv4Addr::LOCALHOST));
    assert!(fetched_by[0].1.count >= 2, "{fetched_by:?}");
    assert_eq!(fetched_by[0].1.sequence, Some(1));

    // alpha rotates: its next CA is served in the same step its proxies are told to trust it.
    std::fs::write(
        alpha_root.path().join("resources/mesh.yaml"),
        mesh("alpha", "ca-2", &["ca-1"]),
    )
    .expect("rotation");
    alpha_daemon
        .reload_resources()
        .await
        .expect("reloads")
        .expect("accepted");
    let mut alpha_served = alpha_daemon.bundle_endpoints[0].served.clone();
    let second = tokio::time::timeout(
        TIMEOUT,
        alpha_served.wait_for(|b| {
            b.as_ref()
                .is_some_and(|b| b.bundle.x509_authorities().len() == 2)
        }),
    )
    .await
    .expect("served in time")
    .expect("serving")
    .clone()
    .expect("a bundle")
    .bundle;
    assert_eq!(second.sequence, Some(2));
    assert_eq!(ders(&second), trusted(&alpha_daemon, "alpha"));
    // Nothing is issued from it before alpha's peers polling as told hold it: the federation step
    // waits one refresh hint plus the fetch margin.
    let status = alpha_daemon.status.status().await.expect("a status");
    let waits: Vec<_> = status
        .rollout
        .iter()
        .filter(|w| {
            w.step == meshca_control::RolloutStep::Federation
                && w.mesh == meshca_control::BundleKey::mesh("alpha")
        })
        .collect();
    assert_eq!(waits.len(), 1, "{:?}", status.rollout);
    assert!(waits[0].ca.contains("ca-2"), "{waits:?}");
    assert!(
        waits[0].timeout_in_seconds > 300 && waits[0].timeout_in_seconds <= 330,
        "{waits:?}"
    );
    assert!(
        waits[0].waiting_for[0].contains("trust domain alpha"),
        "{waits:?}"
    );

    // beta fetches (now rather than at the hint) and its proxies trust both.
    assert!(beta.federation.refresh(&alpha()));
    wait_trusts(&beta, 2).await;
    assert_eq!(trusted(&beta, "alpha"), ders(&second));

    // A restart of alpha serves the same content under the same number.
    alpha_daemon.stop().await;
    let alpha_daemon = start_alpha(alpha_root.path()).await;
    let (_, again) = served(&alpha_daemon).await;
    assert_eq!(again.sequence, Some(2));
    assert_eq!(ders(&again), ders(&second));
    beta.stop().await;
    alpha_daemon.stop().await;
}

/// A Web PKI CA and a server certificate for 127.0.0.1 from it, written as PEM files in `dir`: the
/// CA's certificate (DER) and the paths of the chain and the key.
fn web_certificate(dir: &Path) -> (Vec<u8>, std::path::PathBuf, std::path::PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().expect("a key");
    let ca = ca_params.self_signed(&ca_key).expect("a CA");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.subject_alt_names = vec![SanType::IpAddress(std::net::IpAddr::from(
        Ipv4Addr::LOCALHOST,
    ))];
    let key = KeyPair::generate().expect("a key");
    let cert = params.signed_by(&key, &issuer).expect("a certificate");
    let (cert_file, key_file) = (dir.join("web.pem"), dir.join("web-key.pem"));
    std::fs::write(&cert_file, cert.pem()).expect("written");
    std::fs::write(&key_file, key.serialize_pem()).expect("written");
    (ca.der().to_vec(), cert_file, key_file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_web_endpoint_presents_the_operators_certificate() {
    let root = tempfile::tempdir().expect("a directory");
    let resources = root.path().join("resources");
    std::fs::create_dir_all(&resources).expect("resources");
    std::fs::write(resources.join("mesh.yaml"), mesh("alpha", "ca-1", &[])).expect("mesh");
    let (web_ca, cert_file, key_file) = web_certificate(root.path());
    let mut s = settings(root.path());
    s.federation.endpoints = vec![FederationEndpoint {
        trust_domain: alpha(),
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        profile: EndpointServing::HttpsWeb {
            tls: meshca_config::TlsFiles {
                cert_file,
                key_file,
            },
        },
    }];
    let daemon = start(s, false).await;
    let (addr, served) = served(&daemon).await;
    let url = format!("https://{addr}/");
    let web_ca_der = web_ca.clone();
    let web = EndpointAuth::Web {
        roots: vec![web_ca.into()],
    };
    let fetched = fetch(&url, &alpha(), &web, TIMEOUT, BundleLimits::default())
        .await
        .expect("fetched by Web PKI");
    assert_eq!(fetched, served);
    // Checked as https_spiffe it is refused: it presents no SVID of the trust domain.
    let spiffe = EndpointAuth::Spiffe {
        id: SpiffeId::parse("spiffe://alpha/meshca/bundle-endpoint").expect("an ID"),
        bundle: served.clone(),
    };
    assert!(
        fetch(&url, &alpha(), &spiffe, TIMEOUT, BundleLimits::default())
            .await
            .is_err()
    );

    // A peer follows it as https_web, checking it by the operator's CA (caFile), with no initial bundle.
    let beta_root = tempfile::tempdir().expect("a directory");
    let beta_resources = beta_root.path().join("resources");
    std::fs::create_dir_all(&beta_resources).expect("resources");
    std::fs::write(beta_resources.join("mesh.yaml"), mesh("beta", "ca-1", &[])).expect("mesh");
    let ca_file = beta_root.path().join("web-ca.pem");
    std::fs::write(
        &ca_file,
        ::pem::encode(&::pem::Pem::new("CERTIFICATE", web_ca_der.clone())),
    )
    .expect("caFile");
    std::fs::write(
        beta_resources.join("alpha.yaml"),
        format!(
            "type: FederationRelationship\nname: alpha\nmesh: \"*\"\nspec:\n  trustDomain: alpha\n  bundleEndpoint: {{url: \"{url}\", profile: https_web, caFile: {}}}\n",
            ca_file.display()
        ),
    )
    .expect("relationship");
    let beta = start(settings(beta_root.path()), false).await;
    let peer = first_fetch(&beta).await;
    assert_eq!(peer.held_from, HeldFrom::Fetched, "{peer:?}");
    assert_eq!(peer.profile, "https_web");
    wait_trusts(&beta, served.x509_authorities().len()).await;
    assert_eq!(trusted(&beta, "alpha"), ders(&served));
    beta.stop().await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_web_endpoint_whose_certificate_does_not_load_stops_the_start_naming_it() {
    let root = tempfile::tempdir().expect("a directory");
    let resources = root.path().join("resources");
    std::fs::create_dir_all(&resources).expect("resources");
    std::fs::write(resources.join("mesh.yaml"), mesh("alpha", "ca-1", &[])).expect("mesh");
    let mut s = settings(root.path());
    let missing = root.path().join("missing.pem");
    s.federation.endpoints = vec![FederationEndpoint {
        trust_domain: alpha(),
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        profile: EndpointServing::HttpsWeb {
            tls: meshca_config::TlsFiles {
                cert_file: missing.clone(),
                key_file: missing.clone(),
            },
        },
    }];
    let error = meshca_daemon::Daemon::start(
        s,
        meshca_daemon::DaemonOptions {
            gate: true,
            watch_files: false,
        },
    )
    .await
    .expect_err("refused");
    let text = format!("{error:#}");
    assert!(
        text.contains("federation.endpoints") && text.contains("missing.pem"),
        "{text}"
    );
}
