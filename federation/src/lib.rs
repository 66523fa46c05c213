//! SPIFFE federation: trust across trust domains, to the SPIFFE Trust Domain and Bundle and SPIFFE
//! Federation standards.
//!
//! This crate holds the SPIFFE bundle format ([`bundle`]): a trust domain's X.509 and JWT authorities
//! as a JWK Set with a sequence number and a refresh hint, read from a peer (bounded, and refused
//! whole when malformed) and written for peers. The bundle endpoint and the fetching of peers' bundles
//! build on it.

pub mod bundle;
pub mod export;
pub mod fetch;
pub mod fuzzing;
pub mod import;
pub mod peer;

pub use bundle::{
    BundleError, BundleLimits, EcCurve, JwkKey, JwtAuthority, SpiffeBundle, X509Authority,
};
pub use import::{HeldBundles, HeldFrom, ImportOptions, Importer, PeerStatus, PeerStatuses};
pub use peer::{pem_roots, Peer, PeerProfile};
