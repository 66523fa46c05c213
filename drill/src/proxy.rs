//! A simulated Envoy proxy: one SDS `StreamSecrets` stream for `default`, its trust (`system_trust_bundle`
//! for a sidecar, `ALL` for a zone egress) and the validation contexts with SAN matchers it checks servers
//! with (`meshservice:<name>`, `system_trust_bundle_egress`). Like Envoy it applies each response in order, only after a delay (the time
//! a real proxy takes to hand new secrets to its workers; here 0–500 ms from a seeded PRNG), and only
//! then ACKs. What it has applied is published as an immutable [`ProxyTls`] through a watch channel.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use meshca_control::SecretPem;
use meshca_sds::{
    decode_secrets, describe, tls_certificate_parts, SdsClient, SecretKindView, SECRET_TYPE_URL,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::watch;

use super::rng::SplitMix64;
use super::tls::{self, Bundle, Endpoint, ServiceContext, ANY_TRUST_DOMAIN};

/// The identity secret a proxy asks for.
pub const IDENTITY: &str = "default";
/// The validation context a sidecar validates its peers' chains with.
pub const TRUST: &str = "system_trust_bundle";
/// The validation context a zone egress validates the sidecars of every mesh with.
pub const ALL: &str = "ALL";
/// The longest simulated apply delay.
const MAX_APPLY_DELAY_MS: u64 = 500;

/// What a proxy has applied: its SVID and the CAs it trusts, with the TLS configs built from them.
#[derive(Debug)]
pub struct ProxyTls {
    /// The SPIFFE ID of its own certificate.
    pub spiffe_id: String,
    /// Its certificate chain, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// Trust domain → CA certificates (from the SPIFFE validator config).
    pub bundle: Bundle,
    /// The contexts with SAN matchers, by resource name.
    pub services: BTreeMap<String, ServiceContext>,
    /// The rustls configs; they hold the private key (as rustls' signing key) and nothing else does.
    pub endpoint: Endpoint,
}

impl ProxyTls {
    /// Every CA certificate in the bundle, whatever its trust domain.
    pub fn cas(&self) -> impl Iterator<Item = &CertificateDer<'static>> {
        self.bundle.values().flatten()
    }
}

/// Who a simulated proxy is and how it reaches the daemon.
#[derive(Clone, Debug)]
pub struct ProxySpec {
    /// The mesh.
    pub mesh: String,
    /// The proxy name (node id `<mesh>.<name>`).
    pub name: String,
    /// Its dataplane token.
    pub token: String,
    /// Where SDS listens (`unix:///…`): its replica first, then the others it fails over to, in
    /// order, as Envoy does through an SDS cluster with several endpoints.
    pub targets: Vec<String>,
    /// Seeds its apply delays.
    pub seed: u64,
    /// The validation context its chains are checked with ([`TRUST`] or [`ALL`]).
    pub trust: String,
    /// The validation contexts with SAN matchers it checks servers with.
    pub contexts: Vec<String>,
    /// A stuck proxy (the drill's `--stuck`): once this holds `true` it keeps reading responses from its
    /// stream but neither applies them nor answers them, so the daemon never gets its ACK.
    pub withhold: Option<watch::Receiver<bool>>,
}

impl ProxySpec {
    /// Every name its stream subscribes to.
    fn names(&self) -> Vec<String> {
        let mut names = vec![IDENTITY.to_owned(), self.trust.clone()];
        names.extend(self.contexts.iter().cloned());
        names
    }
}

/// Secrets received but not yet necessarily usable together (a response may hold only some).
struct Held {
    trust_name: String,
    context_names: Vec<String>,
    identity: Option<(String, SecretPem)>,
    bundle: Option<Bundle>,
    services: BTreeMap<String, ServiceContext>,
}

impl Held {
    fn new(spec: &ProxySpec) -> Held {
        Held {
            trust_name: spec.trust.clone(),
            context_names: spec.contexts.clone(),
            identity: None,
            bundle: None,
            services: BTreeMap::new(),
        }
    }

    /// Takes a response in; returns the new state to publish once every secret is known.
    /// On error nothing changes (the proxy NACKs and keeps what it had, as Envoy does).
    fn apply(&mut self, response: &DiscoveryResponse) -> anyhow::Result<Option<ProxyTls>> {
        let secrets = decode_secrets(response)?;
        let mut identity = self.identity.clone();
        let mut bundle = self.bundle.clone();
        let mut services = self.services.clone();
        for secret in &secrets {
            match secret.name.as_str() {
                IDENTITY => {
                    identity = Some(tls_certificate_parts(secret).ok_or_else(|| {
                        anyhow!(
                            "{IDENTITY:?} is not a TLS certificate with an inline chain and key"
                        )
                    })?);
                }
                name if name == self.trust_name => {
                    bundle = Some(parse_bundle(describe(secret).kind)?);
                }
                name if self.context_names.iter().any(|c| c == name) => {
                    let context = parse_service(describe(secret).kind)
                        .with_context(|| format!("{name:?}"))?;
                    services.insert(name.to_owned(), context);
                }
                name => return Err(anyhow!("unexpected secret {name:?} in the response")),
            }
        }
        let state = match (&identity, &bundle) {
            (Some((chain_pem, key)), Some(bundle))
                if services.len() == self.context_names.len() =>
            {
                Some(build(chain_pem, key, bundle.clone(), services.clone())?)
            }
            _ => None,
        };
        self.identity = identity;
        self.bundle = bundle;
        self.services = services;
        Ok(state)
    }
}

/// A context with SAN matchers: its IDs and CAs.
fn parse_service(kind: SecretKindView) -> anyhow::Result<ServiceContext> {
    let ids = match &kind {
        SecretKindView::ValidationContext {
            subject_alt_names, ..
        } => subject_alt_names.iter().cloned().collect(),
        _ => BTreeSet::new(),
    };
    Ok(ServiceContext {
        ids,
        bundle: parse_bundle(kind)?,
    })
}

fn parse_bundle(kind: SecretKindView) -> anyhow::Result<Bundle> {
    let parse = |pem: &str| -> anyhow::Result<Vec<CertificateDer<'static>>> {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow!("a trust bundle PEM does not decode: {e}"))
    };
    match kind {
        SecretKindView::ValidationContext {
            spiffe_trust_domains: Some(domains),
            ..
        } => domains
            .iter()
            .map(|(domain, pem)| Ok((domain.clone(), parse(pem)?)))
            .collect(),
        SecretKindView::ValidationContext {
            trusted_ca_pem: Some(pem),
            ..
        } => Ok(BTreeMap::from([(
            ANY_TRUST_DOMAIN.to_owned(),
            parse(&pem)?,
        )])),
        _ => Err(anyhow!("not a validation context with CAs")),
    }
}

fn build(
    chain_pem: &str,
    key: &SecretPem,
    bundle: Bundle,
    services: BTreeMap<String, ServiceContext>,
) -> anyhow::Result<ProxyTls> {
    let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("the certificate chain does not decode: {e}"))?;
    let leaf = chain
        .first()
        .ok_or_else(|| anyhow!("the certificate chain is empty"))?;
    let spiffe_id = tls::spiffe_id(leaf).map_err(|e| anyhow!("own certificate: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key.expose().as_bytes())
        .map_err(|e| anyhow!("the private key does not decode: {e}"))?;
    let endpoint = Endpoint::new(chain.clone(), key, &bundle, &services)?;
    Ok(ProxyTls {
        spiffe_id,
        chain,
        bundle,
        services,
        endpoint,
    })
}

/// How long a proxy whose stream failed waits before it connects to the next replica.
const RECONNECT_DELAY: Duration = Duration::from_millis(100);

/// What the proxies of a fleet count together.
#[derive(Debug, Default)]
pub struct Counters {
    /// States applied.
    pub applied: watch::Sender<u64>,
    /// Responses rejected (NACKed).
    pub nacks: std::sync::atomic::AtomicU64,
    /// Streams re-opened on another replica after one failed.
    pub moves: std::sync::atomic::AtomicU64,
}

/// Runs one proxy until the task is dropped: its stream to its first target, and, with several
/// targets, a new stream to the next one whenever a stream fails (keeping what it applied, as Envoy
/// does). With one target a failed stream ends it with an error: a drill never expects that. `state`
/// gets every applied state.
pub async fn run(
    spec: ProxySpec,
    state: watch::Sender<Option<Arc<ProxyTls>>>,
    counters: Arc<Counters>,
) -> anyhow::Result<()> {
    let mut proxy = Running {
        rng: SplitMix64::new(spec.seed),
        held: Held::new(&spec),
        applied_version: String::new(),
        withholding: false,
        spec,
        state,
        counters,
    };
    let targets = proxy.spec.targets.clone();
    let first = targets
        .first()
        .ok_or_else(|| anyhow!("{}: no SDS target", proxy.spec.name))?;
    if targets.len() == 1 {
        return proxy.stream(first).await;
    }
    for target in targets.iter().cycle() {
        let error = match proxy.stream(target).await {
            Ok(()) => anyhow!("the stream ended"),
            Err(error) => error,
        };
        tracing::info!(proxy = %proxy.spec.name, target = %target, "drill proxy moves to the next replica: {error:#}");
        proxy
            .counters
            .moves
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(RECONNECT_DELAY).await;
    }
    unreachable!("cycling over a non-empty list never ends")
}

/// A proxy's state across its streams.
struct Running {
    spec: ProxySpec,
    rng: SplitMix64,
    held: Held,
    applied_version: String,
    /// It has started withholding its ACKs (logged once).
    withholding: bool,
    state: watch::Sender<Option<Arc<ProxyTls>>>,
    counters: Arc<Counters>,
}

impl Running {
    /// One stream to `target`, until it fails.
    async fn stream(&mut self, target: &str) -> anyhow::Result<()> {
        let spec = &self.spec;
        let client = SdsClient::connect(target, None, spec.token.clone())
            .await
            .with_context(|| format!("{}: cannot connect to SDS", spec.name))?;
        let node_id = format!("{}.{}", spec.mesh, spec.name);
        let names = spec.names();
        let (requests, mut responses) = client
            .open_stream(&node_id, &names, None, 4)
            .await
            .with_context(|| format!("{}: StreamSecrets refused", spec.name))?;
        loop {
            let response = responses
                .message()
                .await
                .with_context(|| format!("{}: the SDS stream failed", spec.name))?
                .ok_or_else(|| anyhow!("{}: the daemon ended the SDS stream", spec.name))?;
            if spec.withhold.as_ref().is_some_and(|w| *w.borrow()) {
                if !self.withholding {
                    self.withholding = true;
                    tracing::info!(proxy = %spec.name, version = %response.version_info, "drill proxy is stuck on purpose (--stuck): it ignores this response and every later one, and ACKs none");
                }
                continue;
            }
            // The delay IS the behaviour under test: a proxy is never instant.
            let delay = self.rng.below(MAX_APPLY_DELAY_MS + 1);
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let error_detail = match self.held.apply(&response) {
                Ok(new_state) => {
                    self.applied_version = response.version_info.clone();
                    if let Some(new_state) = new_state {
                        self.state.send_replace(Some(Arc::new(new_state)));
                        self.counters.applied.send_modify(|n| *n += 1);
                    }
                    None
                }
                Err(error) => {
                    self.counters
                        .nacks
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(proxy = %spec.name, version = %response.version_info, "drill proxy rejects secrets (NACK): {error:#}");
                    Some(RpcStatus {
                        code: tonic::Code::InvalidArgument as i32,
                        message: format!("{error:#}"),
                        details: Vec::new(),
                    })
                }
            };
            let reply = DiscoveryRequest {
                version_info: self.applied_version.clone(),
                resource_names: names.clone(),
                type_url: SECRET_TYPE_URL.to_owned(),
                response_nonce: response.nonce.clone(),
                error_detail,
                ..Default::default()
            };
            requests
                .send(reply)
                .await
                .map_err(|_| anyhow!("{}: the SDS stream closed", spec.name))?;
        }
    }
}
