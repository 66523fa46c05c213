//! One stream of `bench workload`: a Workload API `FetchX509SVID` stream, read the way a SPIFFE library
//! reads it (every message decoded whole), over a connection of the fleet (see [`super`]). A
//! Workload API client sends nothing after its request: the stream only listens.
//!
//! A stream is reached by a rotation when a message's bundles (the default SVID's trust domain's, and
//! the federated ones) hold a CA outside the steady state's, and its SVID is renewed when the leaf's
//! issuer is such a CA.

use anyhow::{anyhow, Context};
use bytes::Bytes;
use meshca_workload::proto::{X509SvidRequest, X509SvidResponse};
use rustls_pki_types::CertificateDer;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::{grpc_frame, issuer_of, note, GrpcCall, Progress, Seen};

/// The URI of `FetchX509SVID`.
const FETCH_X509_SVID: &str = "http://localhost/SpiffeWorkloadAPI/FetchX509SVID";

/// Opens stream `index` on `connection` and reads it until it fails; reports into `progress`.
pub(super) async fn run(
    index: usize,
    connection: h2::client::SendRequest<Bytes>,
    progress: &Progress,
) -> anyhow::Result<()> {
    let call = GrpcCall {
        method: "FetchX509SVID",
        uri: FETCH_X509_SVID,
        header: (meshca_workload::SECURITY_HEADER, "true"),
        first: grpc_frame(&X509SvidRequest {})?,
        end_stream: true,
    };
    // The request side is ended already: it is held only as long as the stream.
    let (_requests, mut responses) = call.open(connection).await?;
    let mut ready = false;
    loop {
        let response: X509SvidResponse = responses.message(progress).await?;
        // A message a client could not use fails the stream: the Workload API has no NACK.
        let seen = inspect(&response, progress)?;
        note(index, &seen, progress);
        if !ready {
            ready = true;
            progress.stream_ready();
        }
    }
}

/// The default SVID's bundle and leaf issuer; an error for a message a client could not use.
fn inspect(response: &X509SvidResponse, progress: &Progress) -> anyhow::Result<Seen> {
    let svid = response
        .svids
        .first()
        .ok_or_else(|| anyhow!("a message without an SVID"))?;
    if svid.x509_svid_key.is_empty() {
        return Err(anyhow!("the SVID of {} has no key", svid.spiffe_id));
    }
    // Its own trust domain's bundle, then the federated ones (by trust domain): what a SPIFFE library
    // holds as the bundle set.
    let mut federated: Vec<(&String, &Vec<u8>)> = response.federated_bundles.iter().collect();
    federated.sort();
    let bytes = std::iter::once(&svid.bundle)
        .chain(federated.into_iter().map(|(_, der)| der))
        .flatten()
        .copied()
        .collect();
    let bundle = progress
        .bundles()
        .cached(bytes, split_der)
        .with_context(|| format!("the bundles of {}", svid.spiffe_id))?;
    let issuer =
        issuer_of(&svid.x509_svid).with_context(|| format!("the SVID of {}", svid.spiffe_id))?;
    Ok(Seen {
        bundle: Some(bundle),
        leaf_issuer: Some(issuer),
    })
}

/// The certificates of concatenated DER, each parsed to find where it ends.
fn split_der(mut der: &[u8]) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let mut certs = Vec::new();
    while !der.is_empty() {
        let (rest, _) = X509Certificate::from_der(der)
            .map_err(|e| anyhow!("certificate {} does not parse: {e}", certs.len() + 1))?;
        let (cert, _) = der.split_at(der.len() - rest.len());
        certs.push(CertificateDer::from(cert.to_vec()));
        der = rest;
    }
    if certs.is_empty() {
        return Err(anyhow!("the bundle is empty"));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concatenated_der_splits_into_its_certificates() {
        let der = |name: &str| {
            rcgen::generate_simple_self_signed(vec![name.to_owned()])
                .expect("a self-signed certificate")
                .cert
                .der()
                .to_vec()
        };
        let (a, b) = (der("a.example"), der("b.example"));
        let certs = split_der(&[a.clone(), b.clone()].concat()).expect("splits");
        assert_eq!(
            certs,
            [CertificateDer::from(a.clone()), CertificateDer::from(b)]
        );
        assert!(split_der(&[]).is_err(), "empty");
        assert!(split_der(&a[..a.len() - 1]).is_err(), "truncated");
    }
}
