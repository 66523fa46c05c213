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
use meshca_workload::client::{Certificates, WorkloadClient, X509Context};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::sync::watch;

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
    let client = WorkloadClient::connect(&socket)
        .await
        .with_context(|| format!("{name}: cannot connect to the Workload API"))?;
    let mut watch = client
        .watch_x509()
        .await
        .with_context(|| format!("{name}: FetchX509SVID refused"))?;
    loop {
        let mut context = watch
            .next()
            .await
            .with_context(|| format!("{name}: the Workload API stream"))?;
        // The delay IS the behaviour under test: an application is never instant.
        let delay = rng.below(MAX_APPLY_DELAY_MS + 1);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        // Every message holds the whole state: one that arrived meanwhile replaces the one in hand,
        // as an application that reloads on change only ever loads the newest.
        if let Some(newer) = watch.newest_ready() {
            context = newer.with_context(|| format!("{name}: the Workload API stream"))?;
        }
        match applied(&context, &name) {
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

/// The workload's TLS state from one message: its SVID (by hint), and every bundle it carries.
fn applied(context: &X509Context, name: &str) -> anyhow::Result<ProxyTls> {
    let svid = context
        .svids
        .iter()
        .find(|s| s.hint == name)
        .ok_or_else(|| anyhow!("no SVID hinted {name:?} among {}", context.svids.len()))?;
    let chain = certificates(&svid.chain);
    let leaf = chain
        .first()
        .ok_or_else(|| anyhow!("the SVID chain is empty"))?;
    let spiffe_id = tls::spiffe_id(leaf).map_err(|e| anyhow!("own certificate: {e}"))?;
    if spiffe_id != svid.spiffe_id.as_str() {
        return Err(anyhow!(
            "the SVID says {} but its certificate {spiffe_id}",
            svid.spiffe_id
        ));
    }
    let mut bundle: Bundle = BTreeMap::new();
    bundle.insert(
        svid.spiffe_id.trust_domain().as_str().to_owned(),
        certificates(&svid.bundle),
    );
    for (domain, cas) in &context.federated {
        bundle.insert(domain.as_str().to_owned(), certificates(cas));
    }
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(svid.key.der().to_vec()));
    let endpoint = Endpoint::new(chain.clone(), key, &bundle, &BTreeMap::new())?;
    Ok(ProxyTls {
        spiffe_id,
        chain,
        bundle,
        services: BTreeMap::new(),
        endpoint,
    })
}

fn certificates(certs: &Certificates) -> Vec<CertificateDer<'static>> {
    certs
        .0
        .iter()
        .map(|der| CertificateDer::from(der.clone()))
        .collect()
}
