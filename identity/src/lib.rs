//! meshca's pure identity types, parsed once at the boundary and trusted everywhere after: a
//! [`SpiffeId`], its [`TrustDomain`], the [`KeyAlgorithm`] of the keys meshca generates, the
//! MeshIdentity `spiffeID` templates ([`IdentityTemplate`]) that render SPIFFE IDs, so that resource
//! files can be checked against them where they are read, and a proxy's labels ([`LabelMap`]) they
//! read.
//!
//! No I/O, no async, no crypto: every other crate (settings, resources, the CA, the reconciler)
//! shares these types, so a value that parsed once never needs checking again.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod identity_template;
mod key_algorithm;
mod label_map;
mod spiffe_id;
mod template;

pub use identity_template::{IdentityError, IdentityTemplate, DEFAULT_PATH, DEFAULT_TRUST_DOMAIN};
pub use key_algorithm::{KeyAlgorithm, UnknownKeyAlgorithm};
pub use label_map::LabelMap;
pub use spiffe_id::{SpiffeId, SpiffeIdError, TrustDomain, MAX_ID_LEN, MAX_TRUST_DOMAIN_LEN};
pub use template::{
    Template, TemplateError, TemplateVars, NAMESPACE_LABEL, SERVICE_ACCOUNT_LABEL, WORKLOAD_LABEL,
};
