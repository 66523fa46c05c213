//! Envoy's Secret Discovery Service on the Workload API socket, as a SPIRE agent serves it: an Envoy set
//! up for a SPIRE agent's socket gets its identity and trust from meshca unchanged.
//!
//! The caller is authenticated as every Workload API caller is, by its process: no token, and the node
//! id Envoy sends names nothing. It is served as the Dataplane of its default registration (the first
//! it matches), by the SDS server the socket's owner mounts beside the Workload API
//! ([`meshca_serve::AttestedRoutes`]; this module only attests): so `default` and that identity's SPIFFE ID are its
//! certificate, `ROOTCA` the trust of its mesh and `ALL` every trust domain meshca knows, and its ACKs
//! count for the rollout gate as any proxy's do. Its streams end with `PERMISSION_DENIED` once no
//! registration of the caller names that Dataplane any more, and with `UNAVAILABLE` (to be attested
//! again) once a registration names a binary digest the caller, attested without one, may match. SDS requests carry no
//! `workload.spiffe.io` header (Envoy sends none), so none is asked for.

use std::sync::Arc;

use futures::future::BoxFuture;
use meshca_control::Snapshot;
use meshca_serve::{Attest, Attested, AttestedCheck, ConnInfo};
use tonic::Status;

use crate::follow::claims_for;
use crate::shared::Shared;

/// The method the admin API lists SDS streams of Workload API callers under.
const METHOD: &str = "SDS";

/// The Workload API's attestation, for the SDS server on its socket.
pub(crate) struct SdsCallers(pub(crate) Arc<Shared>);

impl Attest for SdsCallers {
    fn attest(&self, conn: Option<ConnInfo>) -> BoxFuture<'static, Result<Attested, Status>> {
        let shared = self.0.clone();
        Box::pin(async move { attest(&shared, conn.as_ref()).await })
    }
}

/// Attests the caller and picks the Dataplane it is served as.
async fn attest(shared: &Arc<Shared>, conn: Option<&ConnInfo>) -> Result<Attested, Status> {
    let admitted = shared.admit(conn).await?;
    let snapshot = shared.published().await?;
    let selectors = admitted.selectors.clone();
    let agent = shared.options.agent.clone();
    let matched = snapshot
        .registrations
        .matching(agent.as_deref(), |s| selectors.contains(s));
    let Some(default) = matched.first() else {
        return Err(shared.no_registration(&admitted));
    };
    let claims = claims_for(default)?;
    let listed = shared.callers.open(admitted.ids, METHOD);
    listed.serves(&matched[..1]);
    let proxy = default.proxy.clone();
    let caller = admitted.caller.clone();
    let digest_skipped = admitted.digest_skipped;
    let check: AttestedCheck = Arc::new(move |snapshot: &Snapshot| {
        if digest_skipped
            && snapshot.registrations.could_be_decided_by(
                agent.as_deref(),
                meshca_config::SelectorKind::Sha256,
                |s| selectors.contains(s),
            )
        {
            // Its digest was not computed, no registration wanting it when it was attested: a
            // registration that names one now may choose another Dataplane for it.
            tracing::info!(%caller, "SDS stream on the Workload API socket ended: a registration now names binary digests the caller may match");
            return Err(Status::unavailable(
                "a registration now names the caller's binary digest: open the stream again to be \
                 attested for it",
            ));
        }
        let still_named = snapshot
            .registrations
            .matching(agent.as_deref(), |s| selectors.contains(s))
            .iter()
            .any(|registration| registration.proxy == proxy);
        if still_named {
            Ok(())
        } else {
            tracing::info!(%caller, dataplane = %proxy, "SDS stream on the Workload API socket ended: no registration of the caller names its Dataplane any more");
            Err(Status::permission_denied(format!(
                "no identity issued: the caller matches no WorkloadRegistration of Dataplane {proxy} \
                 any more"
            )))
        }
    });
    Ok(Attested {
        claims,
        check,
        // The caller's place in its stream limit, and its line in the admin API, last as long as the
        // request. (The SDS server counts the request on its connection itself.)
        hold: Box::new((admitted.slot, listed)),
    })
}
