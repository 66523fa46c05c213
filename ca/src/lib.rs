//! meshca's certificate work: SPIFFE IDs and identity templates, identity selection, keys, builtin and
//! provided certificate authorities, X.509-SVID issuance, verification and inspection.
//!
//! Pure code: no I/O, no async, time is always passed in.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod anchor;
mod authority;
mod bench;
mod certs;
mod csr;
mod der;
mod inspect;
mod issue;
mod key;
mod material;
mod pem_out;
mod provided;
mod sds_tls;
mod select;
mod spki;
#[cfg(test)]
mod test_fixtures;
mod verify;

pub use anchor::{AnchorError, TrustAnchor};
pub use authority::{CaError, CaParams, CertificateAuthority, KeyToStore, FULL_CHECK_EVERY};
pub use bench::{floor_once, FloorError};
pub use csr::{csr_public_key, read_csr, CsrError, SignedRequest, MAX_CSR_BYTES};
pub use inspect::{inspect_pem, CertInfo, InspectError};
pub use issue::{IssueError, SignedLeaf, Svid, SvidRequest};
pub use key::{GeneratedKey, KeyError, PrivateKey, PublicKey};
pub use material::ProvidedCaError;
pub use meshca_identity::KeyAlgorithm;
pub use provided::ProvidedOptions;
pub use sds_tls::{SdsCa, SdsServerCert, SdsTlsError};
pub use select::select;
pub use spki::{certificate_public_key, CertificateKeyError};
// The templates live with the identity types (resource files are checked against them where they are
// read); they stay part of this crate's API.
pub use meshca_identity::{
    IdentityError, IdentityTemplate, LabelMap, Template, TemplateError, TemplateVars, DEFAULT_PATH,
    DEFAULT_TRUST_DOMAIN, NAMESPACE_LABEL, SERVICE_ACCOUNT_LABEL, WORKLOAD_LABEL,
};
pub use verify::{
    check_svid_rules, key_matches, verify_structure, verify_svid, verify_with, Anchors,
    IssuerFacts, VerifyError,
};
