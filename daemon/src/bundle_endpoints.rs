//! The SPIFFE bundle endpoints meshca serves (`federation.endpoints`): what each serves, computed from
//! the published snapshot (every X.509 authority proxies of the trust domain are told to trust, in the
//! same step they are told) and the trust domain's JWT-SVID keys; numbered so that the sequence never
//! goes backwards; and, for `https_spiffe`, the endpoint's own X.509-SVID.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshca_ca::{CertificateAuthority, SvidRequest};
use meshca_config::{EndpointServing, FederationEndpoint, Settings};
use meshca_control::{IdentityProvider, ServedSince, SignedUntil, Snapshot, World};
use meshca_federation::export::{
    authority_id, number, serve, server_config, EndpointLimits, FetchLog, Retiring, ServedBundle,
    SvidCertificate, WebCertificate,
};
use meshca_federation::{EcCurve, JwkKey, JwtAuthority, SpiffeBundle, X509Authority};
use meshca_identity::{SpiffeId, TrustDomain};
use meshca_keystore::Keystore;
use meshca_workload::jwt_keys::{JwtKeys, KeySet};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The path of an `https_spiffe` endpoint's SPIFFE ID.
pub const ENDPOINT_PATH: &str = "/meshca/bundle-endpoint";

/// How often an endpoint reads its record again (one keystore read; a write only when another replica
/// recorded a retired CA): the replicas of one database serve the same content within it.
const RECHECK: Duration = Duration::from_secs(30);

/// How long an endpoint's X.509-SVID lives; it is renewed at half of it.
const SVID_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// Why an endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The address could not be bound.
    #[error("federation.endpoints: {trust_domain}: cannot listen on {listen}: {source}")]
    Bind {
        /// The endpoint's trust domain.
        trust_domain: TrustDomain,
        /// Its address.
        listen: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The `https_web` certificate does not load.
    #[error("federation.endpoints: {trust_domain}: tls: {source}")]
    Certificate {
        /// The endpoint's trust domain.
        trust_domain: TrustDomain,
        /// Why.
        source: std::io::Error,
    },
    /// TLS cannot be set up.
    #[error("federation.endpoints: {trust_domain}: {reason}")]
    Tls {
        /// The endpoint's trust domain.
        trust_domain: TrustDomain,
        /// Why.
        reason: String,
    },
}

/// One endpoint, bound, with what it serves.
#[derive(Debug)]
pub struct BoundEndpoint {
    /// The trust domain.
    pub trust_domain: TrustDomain,
    /// Where it listens (the real port when 0 was asked).
    pub addr: SocketAddr,
    /// What it serves now.
    pub served: watch::Receiver<Option<ServedBundle>>,
    /// `https_spiffe`: the X.509-SVID it presents, once issued.
    pub svid: Option<watch::Receiver<Option<Arc<CertifiedKey>>>>,
    /// Who fetched it.
    pub fetches: FetchLog,
}

impl BoundEndpoint {
    /// Resolves once the endpoint has a bundle to serve and (`https_spiffe`) its SVID.
    pub async fn ready(&self) {
        let mut served = self.served.clone();
        // The channels close only with the daemon.
        let _ = served.wait_for(Option::is_some).await;
        if let Some(svid) = &self.svid {
            let mut svid = svid.clone();
            let _ = svid.wait_for(Option::is_some).await;
        }
    }
}

/// What the endpoints follow.
pub(crate) struct Sources {
    pub(crate) snapshots: watch::Receiver<Arc<Snapshot>>,
    pub(crate) jwt_keys: JwtKeys,
    pub(crate) world: watch::Receiver<Arc<World>>,
    pub(crate) keystore: Arc<dyn Keystore>,
    /// Where each endpoint tells the owner since when it serves each authority (the federation step
    /// of the rollout gate).
    pub(crate) served_since: watch::Sender<Arc<ServedSince>>,
    /// When the last certificate each CA signed expires.
    pub(crate) signed: watch::Receiver<Arc<SignedUntil>>,
}

/// Binds every endpoint of `settings` and starts serving them until `shutdown`.
pub(crate) async fn start(
    settings: &Settings,
    sources: Sources,
    shutdown: &CancellationToken,
) -> Result<Vec<BoundEndpoint>, EndpointError> {
    let mut bound = Vec::new();
    for endpoint in &settings.federation.endpoints {
        let td = endpoint.trust_domain.clone();
        let listener =
            TcpListener::bind(endpoint.listen)
                .await
                .map_err(|source| EndpointError::Bind {
                    trust_domain: td.clone(),
                    listen: endpoint.listen,
                    source,
                })?;
        let addr = listener
            .local_addr()
            .map_err(|source| EndpointError::Bind {
                trust_domain: td.clone(),
                listen: endpoint.listen,
                source,
            })?;
        let (served_tx, served) = watch::channel(None);
        // What the endpoint's SVID chains to (nothing for https_web), kept in the served bundle.
        let (svid_roots_tx, svid_roots) = watch::channel(Vec::new());
        let mut svid = None;
        let certificate: Arc<dyn rustls::server::ResolvesServerCert> = match &endpoint.profile {
            EndpointServing::HttpsWeb { tls } => Arc::new(
                WebCertificate::load(tls.cert_file.clone(), tls.key_file.clone()).map_err(
                    |source| EndpointError::Certificate {
                        trust_domain: td.clone(),
                        source,
                    },
                )?,
            ),
            EndpointServing::HttpsSpiffe => {
                let (svid_tx, svid_rx) = watch::channel(None);
                tokio::spawn(follow_svid(
                    SvidFollow {
                        trust_domain: td.clone(),
                        wait: settings.federation.refresh_hint.as_std()
                            + settings.federation.fetch_margin.as_std(),
                        algorithm: settings.issuance.key_algorithm,
                        svid: svid_tx,
                        roots: svid_roots_tx.clone(),
                    },
                    served.clone(),
                    sources.world.clone(),
                    shutdown.clone(),
                ));
                svid = Some(svid_rx.clone());
                Arc::new(SvidCertificate(svid_rx))
            }
        };
        let tls = server_config(certificate).map_err(|reason| EndpointError::Tls {
            trust_domain: td.clone(),
            reason,
        })?;
        tokio::spawn(follow_content(
            Numbering {
                trust_domain: td.clone(),
                refresh_hint: settings.federation.refresh_hint.as_std(),
                keystore: sources.keystore.clone(),
                served: served_tx,
                served_since: sources.served_since.clone(),
                signed: sources.signed.clone(),
            },
            sources.snapshots.clone(),
            sources.jwt_keys.subscribe(),
            svid_roots,
            shutdown.clone(),
        ));
        let fetches = FetchLog::default();
        tokio::spawn(serve(
            listener,
            Arc::new(tls),
            served.clone(),
            EndpointLimits {
                connections: usize::try_from(settings.limits.federation_endpoint_connections)
                    .unwrap_or(usize::MAX),
                handshake: settings.limits.connect_timeout(),
            },
            fetches.clone(),
            shutdown.clone(),
        ));
        tracing::info!(trust_domain = %td, %addr, profile = endpoint_profile(endpoint), "serving the SPIFFE bundle endpoint");
        bound.push(BoundEndpoint {
            trust_domain: td,
            addr,
            served,
            svid,
            fetches,
        });
    }
    Ok(bound)
}

fn endpoint_profile(endpoint: &FederationEndpoint) -> &'static str {
    match endpoint.profile {
        EndpointServing::HttpsSpiffe => "https_spiffe",
        EndpointServing::HttpsWeb { .. } => "https_web",
    }
}

/// The authorities of `trust_domain` that `snapshot` tells proxies to trust, then `retained` (the roots
/// the endpoint's own SVID chains to, which peers need to check it even after their CA left the local
/// bundles), and its JWT-SVID keys.
pub fn content(
    trust_domain: &TrustDomain,
    snapshot: &Snapshot,
    keys: &KeySet,
    retained: &[Vec<u8>],
) -> SpiffeBundle {
    let mut x509: Vec<X509Authority> = snapshot
        .all
        .by_trust_domain()
        .get(trust_domain.as_str())
        .into_iter()
        .flatten()
        .filter_map(|pem| ::pem::parse(pem).ok())
        .filter_map(|block| {
            match X509Authority::from_der(block.into_contents(), trust_domain) {
                Ok(authority) => Some(authority),
                Err(e) => {
                    tracing::warn!(trust_domain = %trust_domain, error = %e, "a CA is left out of the served bundle");
                    None
                }
            }
        })
        .collect();
    for root in retained {
        if !x509.iter().any(|a| a.der() == root.as_slice()) {
            if let Ok(authority) = X509Authority::from_der(root.clone(), trust_domain) {
                x509.push(authority);
            }
        }
    }
    let jwt = keys
        .by_trust_domain()
        .get(trust_domain.as_str())
        .map(|jwks| {
            jwks.keys()
                .iter()
                .map(|k| JwtAuthority {
                    kid: k.kid().to_owned(),
                    key: JwkKey::Ec {
                        curve: EcCurve::P256,
                        x: k.x().to_vec(),
                        y: k.y().to_vec(),
                    },
                })
                .collect()
        })
        .unwrap_or_default();
    SpiffeBundle::new(trust_domain.clone(), x509, jwt)
}

/// What an endpoint's content is computed from: the trust of every mesh, the JWT-SVID keys, and the roots
/// its SVID chains to.
type ContentInputs = (Arc<meshca_control::TrustBundle>, Arc<KeySet>, Vec<Vec<u8>>);

/// Where one endpoint's content is numbered and published.
struct Numbering {
    trust_domain: TrustDomain,
    refresh_hint: Duration,
    keystore: Arc<dyn Keystore>,
    /// What the endpoint serves.
    served: watch::Sender<Option<ServedBundle>>,
    /// Since when each endpoint serves each authority, for the owner.
    served_since: watch::Sender<Arc<ServedSince>>,
    /// When the last certificate each CA signed expires: a removed CA is served until then.
    signed: watch::Receiver<Arc<SignedUntil>>,
}

/// The authorities of `last` that `now` no longer has, each with when the last certificate it signed
/// expires, if that is after `at`.
fn retiring(
    last: &SpiffeBundle,
    now: &SpiffeBundle,
    signed: &SignedUntil,
    at: SystemTime,
) -> Vec<Retiring> {
    last.x509_authorities()
        .iter()
        .filter(|a| !now.x509_authorities().contains(a))
        .filter_map(|authority| {
            let until = *signed.get(&authority_id(authority.der()))?;
            (until > at).then(|| Retiring {
                authority: authority.clone(),
                until,
            })
        })
        .collect()
}

/// Keeps the endpoint serving the numbered content of its trust domain as snapshots and keys change,
/// and a removed CA until the last certificate it signed expires.
async fn follow_content(
    numbering: Numbering,
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    mut keys: watch::Receiver<Arc<KeySet>>,
    mut svid_roots: watch::Receiver<Vec<Vec<u8>>>,
    shutdown: CancellationToken,
) {
    let Numbering {
        trust_domain: td,
        refresh_hint,
        keystore,
        served,
        served_since,
        signed,
    } = numbering;
    let mut last: Option<SpiffeBundle> = None;
    let mut warned_empty = false;
    let mut roots_open = true;
    // What the last content was computed from: a snapshot that changed proxies only shares the `Arc`
    // of its trust, and costs nothing here.
    let mut inputs: Option<ContentInputs> = None;
    // When the first retired authority is due to leave the served bundle.
    let mut next_retirement: Option<SystemTime> = None;
    // Whether to read the record again: another replica may have retired a CA this one knows no
    // certificate of, and both serve the same content once this one takes it from the record.
    let mut recheck = false;
    loop {
        let snapshot = snapshots.borrow_and_update().clone();
        let key_set = keys.borrow_and_update().clone();
        let retained = svid_roots.borrow_and_update().clone();
        let unchanged = inputs.as_ref().is_some_and(|(all, k, r)| {
            Arc::ptr_eq(all, &snapshot.all) && Arc::ptr_eq(k, &key_set) && *r == retained
        });
        let retire_due = next_retirement.is_some_and(|at| at <= SystemTime::now());
        let force = retire_due || std::mem::take(&mut recheck);
        if !unchanged || force {
            inputs = Some((snapshot.all.clone(), key_set.clone(), retained.clone()));
            let now = content(&td, &snapshot, &key_set, &retained);
            let empty = now.x509_authorities().is_empty() && now.jwt_authorities().is_empty();
            if empty && snapshot.generation > 0 && !warned_empty {
                tracing::warn!(trust_domain = %td, "the bundle endpoint has nothing to serve: no mesh issues for this trust domain");
                warned_empty = true;
            }
            if !empty && (last.as_ref() != Some(&now) || force) {
                let at = SystemTime::now();
                let retiring = last
                    .as_ref()
                    .map(|last| retiring(last, &now, &signed.borrow(), at))
                    .unwrap_or_default();
                for r in &retiring {
                    tracing::info!(trust_domain = %td, authority = %authority_id(r.authority.der()), until = %meshca_control::rfc3339(r.until), "a removed CA stays in the served bundle until the last certificate it signed expires");
                }
                let keystore = keystore.clone();
                let content = now.clone();
                let numbered = tokio::task::spawn_blocking(move || {
                    number(keystore.as_ref(), &content, &retiring, refresh_hint, at)
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r);
                match numbered {
                    Ok(bundle) => {
                        tracing::info!(trust_domain = %td, sequence = ?bundle.bundle.sequence, x509_authorities = bundle.bundle.x509_authorities().len(), retired = bundle.retired.len(), jwt_authorities = bundle.bundle.jwt_authorities().len(), "served bundle updated");
                        served_since.send_if_modified(|all| {
                            if all.get(&td) == Some(&bundle.served_since) {
                                return false;
                            }
                            let mut next = (**all).clone();
                            next.insert(td.clone(), bundle.served_since.clone());
                            *all = Arc::new(next);
                            true
                        });
                        next_retirement = bundle.retired.values().min().copied();
                        served.send_if_modified(|current| {
                            if current.as_ref() == Some(&bundle) {
                                return false;
                            }
                            *current = Some(bundle);
                            true
                        });
                        last = Some(now);
                    }
                    // The last bundle keeps serving; the next change, or the retry below, numbers again.
                    Err(e) => {
                        tracing::error!(trust_domain = %td, error = %e, "the served bundle could not be numbered; the last one keeps serving");
                        inputs = None;
                    }
                }
            }
        }
        let retry = inputs.is_none();
        let retire_in =
            next_retirement.map(|at| at.duration_since(SystemTime::now()).unwrap_or_default());
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = snapshots.changed() => if changed.is_err() { return },
            changed = keys.changed() => if changed.is_err() { return },
            // An https_web endpoint has no SVID: its channel is closed from the start.
            changed = svid_roots.changed(), if roots_open => roots_open = changed.is_ok(),
            () = tokio::time::sleep(Duration::from_secs(5)), if retry => {}
            () = tokio::time::sleep(retire_in.unwrap_or_default()), if retire_in.is_some() => {}
            () = tokio::time::sleep(RECHECK) => recheck = true,
        }
    }
}

/// Which CA an `https_spiffe` endpoint's SVID comes from, and when that choice may change.
struct IssuerChoice {
    /// The CA, or `None` to keep the SVID it has (no CA meshca holds is held by peers yet).
    ca: Option<Arc<CertificateAuthority>>,
    /// When a CA not yet held by peers will be.
    next_change: Option<SystemTime>,
}

/// The CA an `https_spiffe` endpoint's SVID comes from. A peer checks the SVID by the bundle it holds,
/// so the SVID comes from a CA peers polling as told hold: one meshca holds the key of, whose roots the
/// endpoint has served for `wait` (one refresh hint plus the fetch margin; the first bundle ever served
/// counts as held), the newest such (so the SVID moves off an old CA as early as peers allow). When none
/// is held yet, the SVID it has is kept (`None`); with none at all (a start), the CA served the longest.
fn endpoint_issuer(
    trust_domain: &TrustDomain,
    world: &World,
    served: &ServedBundle,
    wait: Duration,
    has_svid: bool,
    now: SystemTime,
) -> IssuerChoice {
    let mut candidates: Vec<Arc<CertificateAuthority>> = Vec::new();
    for mesh in world.meshes.values() {
        for identity in &mesh.identities {
            if let IdentityProvider::Bundled { ca, .. } = &identity.provider {
                if &identity.trust_domain == trust_domain {
                    candidates.push(ca.ca.clone());
                }
            }
        }
        if mesh.name == trust_domain.as_str() {
            candidates.extend(
                mesh.backends()
                    .flat_map(|b| &b.trusted)
                    .map(|g| g.ca.clone()),
            );
        }
    }
    // Since when every root of `ca` has been served; `None` when one is not.
    let served_since = |ca: &CertificateAuthority| -> Option<SystemTime> {
        ca.bundle_der()
            .iter()
            .map(|root| served.served_since.get(&authority_id(root)).copied())
            .try_fold(SystemTime::UNIX_EPOCH, |latest, since| {
                Some(latest.max(since?))
            })
    };
    let mut served_cas: Vec<(SystemTime, Arc<CertificateAuthority>)> = candidates
        .into_iter()
        .filter(|ca| ca.not_before() <= now && now < ca.not_after())
        .filter_map(|ca| served_since(&ca).map(|since| (since, ca)))
        .collect();
    served_cas.sort_by(|(a, ca_a), (b, ca_b)| {
        a.cmp(b)
            .then(ca_a.not_before().cmp(&ca_b.not_before()))
            .then(ca_a.id().cmp(ca_b.id()))
    });
    let held_at = |since: SystemTime| {
        if since == SystemTime::UNIX_EPOCH {
            since
        } else {
            since + wait
        }
    };
    let next_change = served_cas
        .iter()
        .map(|(since, _)| held_at(*since))
        .filter(|at| *at > now)
        .min();
    let newest_held = served_cas
        .iter()
        .rev()
        .find(|(since, _)| held_at(*since) <= now)
        .map(|(_, ca)| ca.clone());
    let ca = match newest_held {
        Some(ca) => Some(ca),
        None if has_svid => None,
        None => served_cas.first().map(|(_, ca)| ca.clone()),
    };
    IssuerChoice { ca, next_change }
}

/// Issues the endpoint's SVID: `spiffe://<trust domain>/meshca/bundle-endpoint`.
fn issue_svid(
    trust_domain: &TrustDomain,
    ca: &CertificateAuthority,
    algorithm: meshca_identity::KeyAlgorithm,
    now: SystemTime,
) -> Result<(CertifiedKey, SystemTime), String> {
    let spiffe_id = SpiffeId::new(trust_domain, ENDPOINT_PATH).map_err(|e| e.to_string())?;
    let svid = ca
        .issue(
            &SvidRequest {
                spiffe_id,
                key_algorithm: algorithm,
                lifetime: SVID_LIFETIME,
            },
            now,
        )
        .map_err(|e| e.to_string())?;
    let chain = svid
        .chain_der
        .iter()
        .map(|d| rustls::pki_types::CertificateDer::from(d.clone()))
        .collect();
    let der = rustls::pki_types::PrivateKeyDer::Pkcs8(svid.key.pkcs8_der().to_vec().into());
    let signing = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| e.to_string())?;
    let renew_at = svid.not_before
        + (svid
            .not_after
            .duration_since(svid.not_before)
            .unwrap_or_default()
            / 2);
    Ok((CertifiedKey::new(chain, signing), renew_at))
}

/// Keeps an `https_spiffe` endpoint's SVID issued from [`endpoint_issuer`], renewed at half its life and
/// re-issued when the issuer changes, and tells the content what the SVID chains to (kept in the served
/// bundle while the SVID needs it, even after its CA left the local bundles).
struct SvidFollow {
    trust_domain: TrustDomain,
    /// One refresh hint plus the fetch margin.
    wait: Duration,
    algorithm: meshca_identity::KeyAlgorithm,
    svid: watch::Sender<Option<Arc<CertifiedKey>>>,
    /// The roots (DER) the current SVID chains to.
    roots: watch::Sender<Vec<Vec<u8>>>,
}

async fn follow_svid(
    follow: SvidFollow,
    mut served: watch::Receiver<Option<ServedBundle>>,
    mut world: watch::Receiver<Arc<World>>,
    shutdown: CancellationToken,
) {
    let SvidFollow {
        trust_domain,
        wait,
        algorithm,
        svid,
        roots,
    } = follow;
    let mut current: Option<(String, SystemTime)> = None;
    loop {
        let now = SystemTime::now();
        let bundle = served.borrow_and_update().clone();
        let world_now = world.borrow_and_update().clone();
        let choice = bundle
            .as_ref()
            .map(|b| endpoint_issuer(&trust_domain, &world_now, b, wait, current.is_some(), now));
        let issuer = choice.as_ref().and_then(|c| c.ca.clone());
        match (&issuer, &current) {
            (Some(ca), Some((id, renew_at))) if ca.id() == id && now < *renew_at => {}
            (Some(ca), _) => {
                let ca = ca.clone();
                let td = trust_domain.clone();
                let issued = tokio::task::spawn_blocking(move || {
                    issue_svid(&td, &ca, algorithm, now)
                        .map(|k| (k, ca.id().to_owned(), ca.bundle_der()))
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r);
                match issued {
                    Ok(((key, renew_at), id, chain_roots)) => {
                        tracing::info!(trust_domain = %trust_domain, issuer = %id, "bundle endpoint SVID issued");
                        roots.send_replace(chain_roots);
                        svid.send_replace(Some(Arc::new(key)));
                        current = Some((id, renew_at));
                    }
                    Err(e) => {
                        tracing::error!(trust_domain = %trust_domain, error = %e, "the bundle endpoint's SVID could not be issued")
                    }
                }
            }
            (None, _) => {}
        }
        let renew = current.as_ref().map(|(_, at)| *at);
        let next = [renew, choice.and_then(|c| c.next_change)]
            .into_iter()
            .flatten()
            .min();
        let sleep = next
            .map_or(Duration::from_secs(60), |at| {
                at.duration_since(SystemTime::now()).unwrap_or_default()
            })
            .max(Duration::from_millis(100));
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = served.changed() => if changed.is_err() { return },
            changed = world.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(sleep) => {}
        }
    }
}

/// Every endpoint's served bundle and who fetched it, by trust domain, for `meshca bundle show` and
/// `/api/status` (the admin API).
pub type ServedBundles = BTreeMap<TrustDomain, (watch::Receiver<Option<ServedBundle>>, FetchLog)>;

/// One endpoint in `/api/status` (`federation_endpoints`): what it serves, since when each authority,
/// and who fetched it.
pub(crate) fn endpoint_status(
    trust_domain: &TrustDomain,
    served: &watch::Receiver<Option<ServedBundle>>,
    fetches: &FetchLog,
) -> serde_json::Value {
    let served = served.borrow().clone();
    let authorities: Vec<serde_json::Value> = served
        .as_ref()
        .map(|b| {
            b.served_since
                .iter()
                .map(|(id, since)| {
                    serde_json::json!({
                        "id": id,
                        "served_since": (*since > SystemTime::UNIX_EPOCH).then(|| meshca_control::rfc3339(*since)),
                        // A removed CA, served until the last certificate it signed expires.
                        "retired_until": b.retired.get(id).map(|until| meshca_control::rfc3339(*until)),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let fetched_by: Vec<serde_json::Value> = fetches
        .peers()
        .into_iter()
        .map(|(ip, f)| {
            serde_json::json!({
                "peer": ip.to_string(),
                "fetches": f.count,
                "last": meshca_control::rfc3339(f.last),
                "sequence": f.sequence,
            })
        })
        .collect();
    serde_json::json!({
        "trust_domain": trust_domain.to_string(),
        "sequence": served.as_ref().and_then(|b| b.bundle.sequence),
        "x509_authorities": authorities,
        "jwt_authorities": served.as_ref().map_or(0, |b| b.bundle.jwt_authorities().len()),
        "fetched_by": fetched_by,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authority(td: &TrustDomain) -> X509Authority {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.subject_alt_names = vec![SanType::URI(
            format!("spiffe://{td}").try_into().expect("a URI"),
        )];
        let key = KeyPair::generate().expect("a key");
        let cert = params.self_signed(&key).expect("a CA");
        X509Authority::from_der(cert.der().to_vec(), td).expect("an authority")
    }

    #[test]
    fn an_authority_that_left_is_retiring_while_a_certificate_it_signed_lives() {
        let td = TrustDomain::parse("alpha").expect("a trust domain");
        let (one, two, three) = (authority(&td), authority(&td), authority(&td));
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let hour = Duration::from_secs(3600);
        let last = SpiffeBundle::new(
            td.clone(),
            vec![one.clone(), two.clone(), three.clone()],
            Vec::new(),
        );
        let next = SpiffeBundle::new(td.clone(), vec![three.clone()], Vec::new());
        // one signed a certificate that lives another hour; two's last one has expired.
        let signed = SignedUntil::from([
            (authority_id(one.der()), now + hour),
            (authority_id(two.der()), now),
            (authority_id(three.der()), now + hour),
        ]);
        assert_eq!(
            retiring(&last, &next, &signed, now),
            vec![Retiring {
                authority: one.clone(),
                until: now + hour
            }]
        );
        // Nothing left: nothing retires; an authority of which no certificate is known leaves.
        assert!(retiring(&next, &next, &signed, now).is_empty());
        assert!(retiring(&last, &next, &SignedUntil::new(), now).is_empty());
    }
}
