//! A simulated workload: an application that does its own mTLS with the identity the SPIFFE Workload
//! API gives it. It holds one `FetchX509SVID` stream open and applies each message in order, after a
//! delay of 0–300 ms from a seeded PRNG: the time an application takes to put a new SVID and bundle in
//! use (a SPIFFE library hands them over at once; an application reloading files written by
//! spiffe-helper takes a while). It sends nothing back, as no Workload API client does: the daemon
//! counts a message as applied `workloadApi.ackAfter` (1 s) after writing it. What it applied is
//! published as a [`ProxyTls`], like a simulated proxy's, so the drill's traffic and checks treat
//! workloads and proxies alike.
//!
//! Every simulated workload of a drill runs in the drill's own process, so the kernel tells them apart
//! from nothing: one registration per workload selects this process, and each workload takes the SVID
//! whose hint is its name. (Real workloads are told apart by uid, binary or unit.)

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use futures::FutureExt;
use meshca_workload::proto::{paths, X509Svid, X509SvidRequest, X509SvidResponse};
use meshca_workload::SECURITY_HEADER;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::sync::watch;
use tonic_prost::ProstCodec;

use super::proxy::{Counters, ProxyTls};
use super::rng::SplitMix64;
use super::tls::{self, Bundle, Endpoint};

/// The longest simulated apply delay: well under the daemon's default `workloadApi.ackAfter`.
const MAX_APPLY_DELAY_MS: u64 = 300;

/// Runs one workload until the task is dropped: its stream on `socket`, taking the SVID hinted `name`,
/// with apply delays drawn from `seed`.
/// A stream that ends is an error: a drill never expects that.
pub async fn run(
    socket: PathBuf,
    name: String,
    seed: u64,
    state: watch::Sender<Option<Arc<ProxyTls>>>,
    counters: Arc<Counters>,
) -> anyhow::Result<()> {
    let mut rng = SplitMix64::new(seed);
    let target = format!("unix://{}", socket.display());
    let channel = meshca_sds::connect_channel(&target, None)
        .await
        .with_context(|| format!("{name}: cannot connect to the Workload API"))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| anyhow!("{name}: the Workload API is not ready: {e}"))?;
    let mut request = tonic::Request::new(X509SvidRequest {});
    request.metadata_mut().insert(
        SECURITY_HEADER,
        tonic::metadata::MetadataValue::from_static("true"),
    );
    let path = paths::FETCH_X509_SVID
        .parse()
        .map_err(|e| anyhow!("the method path: {e}"))?;
    let mut messages = grpc
        .server_streaming::<_, X509SvidResponse, _>(request, path, ProstCodec::default())
        .await
        .with_context(|| format!("{name}: FetchX509SVID refused"))?
        .into_inner();
    loop {
        let mut message = next_message(&mut messages, &name).await?;
        // The delay IS the behaviour under test: an application is never instant.
        let delay = rng.below(MAX_APPLY_DELAY_MS + 1);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        // Every message holds the whole state: one that arrived meanwhile replaces the one in hand,
        // as an application that reloads on change only ever loads the newest.
        while let Some(newer) = messages.message().now_or_never() {
            message = newer
                .with_context(|| format!("{name}: the Workload API stream failed"))?
                .ok_or_else(|| anyhow!("{name}: the daemon ended the Workload API stream"))?;
        }
        match applied(&message, &name) {
            Ok(applied) => {
                state.send_replace(Some(Arc::new(applied)));
                counters.applied.send_modify(|n| *n += 1);
            }
            // A message the workload cannot use leaves it with what it had, as go-spiffe does.
            Err(error) => {
                counters
                    .nacks
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(workload = %name, "drill workload cannot use a Workload API message: {error:#}");
            }
        }
    }
}

async fn next_message(
    messages: &mut tonic::Streaming<X509SvidResponse>,
    name: &str,
) -> anyhow::Result<X509SvidResponse> {
    messages
        .message()
        .await
        .with_context(|| format!("{name}: the Workload API stream failed"))?
        .ok_or_else(|| anyhow!("{name}: the daemon ended the Workload API stream"))
}

/// The workload's TLS state from one message: its SVID (by hint), and every bundle it carries.
fn applied(message: &X509SvidResponse, name: &str) -> anyhow::Result<ProxyTls> {
    let svid: &X509Svid = message
        .svids
        .iter()
        .find(|s| s.hint == name)
        .ok_or_else(|| anyhow!("no SVID hinted {name:?} among {}", message.svids.len()))?;
    let chain = split_der(&svid.x509_svid).context("the SVID chain")?;
    let leaf = chain
        .first()
        .ok_or_else(|| anyhow!("the SVID chain is empty"))?;
    let spiffe_id = tls::spiffe_id(leaf).map_err(|e| anyhow!("own certificate: {e}"))?;
    if spiffe_id != svid.spiffe_id {
        return Err(anyhow!(
            "the SVID says {} but its certificate {spiffe_id}",
            svid.spiffe_id
        ));
    }
    let own_domain = trust_domain(&spiffe_id);
    let mut bundle: Bundle = BTreeMap::new();
    bundle.insert(
        own_domain.to_owned(),
        split_der(&svid.bundle).context("the SVID's bundle")?,
    );
    for (id, der) in &message.federated_bundles {
        let domain = id.strip_prefix("spiffe://").unwrap_or(id);
        bundle.insert(
            domain.to_owned(),
            split_der(der).with_context(|| format!("the bundle of {domain}"))?,
        );
    }
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(svid.x509_svid_key.clone()));
    let endpoint = Endpoint::new(chain.clone(), key, &bundle, &BTreeMap::new())?;
    Ok(ProxyTls {
        spiffe_id,
        chain,
        bundle,
        services: BTreeMap::new(),
        endpoint,
    })
}

/// The trust domain of a SPIFFE ID.
fn trust_domain(spiffe_id: &str) -> &str {
    let rest = spiffe_id.strip_prefix("spiffe://").unwrap_or(spiffe_id);
    rest.split('/').next().unwrap_or(rest)
}

/// Concatenated DER certificates, one by one.
fn split_der(mut der: &[u8]) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let mut certs = Vec::new();
    while !der.is_empty() {
        let (rest, _) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| anyhow!("a certificate does not parse: {e}"))?;
        let used = der.len() - rest.len();
        certs.push(CertificateDer::from(der[..used].to_vec()));
        der = rest;
    }
    if certs.is_empty() {
        return Err(anyhow!("no certificate"));
    }
    Ok(certs)
}
