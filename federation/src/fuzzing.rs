//! Entry points for the fuzz targets (`federation/fuzz/`): each asserts what must hold for any input.

use meshca_identity::TrustDomain;

use crate::bundle::{BundleLimits, SpiffeBundle};

/// The SPIFFE bundle reader on `data`: it never panics, and a bundle it reads renders to bytes that
/// read back to the same bundle and render the same bytes again (one canonical form).
pub fn spiffe_bundle(data: &[u8]) {
    let trust_domain = TrustDomain::parse("example.org").expect("a valid trust domain");
    let Ok(bundle) = SpiffeBundle::parse(&trust_domain, data, BundleLimits::default()) else {
        return;
    };
    let rendered = bundle.to_json();
    let again = SpiffeBundle::parse(&trust_domain, &rendered, BundleLimits::default())
        .expect("a rendered bundle reads");
    assert_eq!(again, bundle, "the rendered bundle reads as another");
    assert_eq!(again.to_json(), rendered, "rendering is not canonical");
}
