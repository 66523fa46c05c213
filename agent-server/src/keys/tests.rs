//! The key request check, against requests made here and by rcgen.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use meshca_control::{LeafKey, ProxyIdentity, ProxyKey, Registrations, SecretPem};
use proptest::prelude::*;
use rcgen::{CertificateParams, KeyPair, SanType};

use super::*;
use crate::fuzzing::certifiable;

const WEB: &str = "spiffe://default.zone/web-1";
const P256: KeyAlgorithm = KeyAlgorithm::EcdsaP256;

fn registration(name: &str, dataplane: &str) -> Registration {
    Registration {
        name: name.into(),
        proxy: ProxyKey::new("default", dataplane),
        selectors: Vec::new(),
        agent: Some("host-a".into()),
        hint: None,
        jwt_svid_expiry: Duration::from_secs(300),
        labels: Default::default(),
    }
}

/// Registration `web` (Dataplane web-1, identity [`WEB`]) and `db` (db-1, no identity yet).
static WORLD: LazyLock<(Registration, Registration, Snapshot)> = LazyLock::new(|| {
    let web = registration("web", "web-1");
    let db = registration("db", "db-1");
    let mut snapshot = Snapshot::empty();
    snapshot.proxies.insert(
        web.proxy.clone(),
        ProxyEntry::Ready(Arc::new(ProxyIdentity {
            spiffe_id: WEB.into(),
            identity_name: None,
            chain_pem: String::new(),
            key: LeafKey::Held(SecretPem::new(String::new())),
        })),
    );
    snapshot
        .proxies
        .insert(db.proxy.clone(), ProxyEntry::Pending);
    snapshot.registrations = Arc::new(Registrations::new(vec![web.clone(), db.clone()]));
    (web, db, snapshot)
});

/// A certificate request over `key` naming the URI SANs `uris`.
pub(crate) fn csr(key: &KeyPair, uris: &[&str]) -> Vec<u8> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.subject_alt_names = uris
        .iter()
        .map(|u| SanType::URI((*u).try_into().expect("a URI")))
        .collect();
    params
        .serialize_request(key)
        .expect("a request")
        .der()
        .to_vec()
}

/// One key, and a valid request of it for `web` (a key per case would dominate).
static KEY: LazyLock<(KeyPair, Vec<u8>)> = LazyLock::new(|| {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("a key");
    let der = csr(&key, &[WEB]);
    (key, der)
});

#[test]
fn a_request_is_taken_only_for_the_registrations_identity_and_algorithm() {
    let (web, db, snapshot) = &*WORLD;
    let (key, der) = &*KEY;
    let public = check(der, web, snapshot, P256).expect("a valid request");
    assert_eq!(public.raw(), key.public_key_raw());
    assert!(check(&csr(key, &[]), db, snapshot, P256).is_ok());
    assert!(matches!(
        check(der, db, snapshot, P256),
        Err(Refusal::SpiffeId { has: None, .. })
    ));
    assert!(matches!(
        check(
            &csr(key, &["spiffe://default.zone/db-1"]),
            web,
            snapshot,
            P256
        ),
        Err(Refusal::SpiffeId { has: Some(_), .. })
    ));
    assert!(matches!(
        check(der, web, snapshot, KeyAlgorithm::EcdsaP384),
        Err(Refusal::Algorithm { .. })
    ));
}

/// URIs a request may name: the registration's SPIFFE ID, other ones, other spellings of it, and
/// URIs of other schemes.
fn uri() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(WEB.to_owned()),
        Just("SPIFFE://default.zone/web-1".to_owned()),
        Just("spiffe://default.zone/web-1/".to_owned()),
        "spiffe://[a-z.]{1,12}/[a-z0-9/-]{0,12}",
        "[sS][pP][iI][fF][fF][eE]://default\\.zone/web-[0-9]",
        "https://[a-z.]{1,12}/[a-z]{0,6}",
        "urn:[a-z]{1,6}:[a-z0-9]{0,6}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A request changed anywhere is refused or, if a change the signature does not cover left
    /// it valid, still holds the same key and names no other SPIFFE ID.
    #[test]
    fn a_changed_request_is_refused_or_still_for_the_registration(
        flips in proptest::collection::vec((any::<usize>(), 1u8..=255), 1..4),
    ) {
        let (web, _, snapshot) = &*WORLD;
        let (key, der) = &*KEY;
        let mut changed = der.clone();
        for (index, flip) in flips {
            let at = index % changed.len();
            changed[at] ^= flip;
        }
        if let Ok(public) = check(&changed, web, snapshot, P256) {
            prop_assert_eq!(public.raw(), key.public_key_raw());
            certifiable(&changed, &public, Some(WEB), P256);
        }
    }

    /// A request cut short or with bytes after it is refused.
    #[test]
    fn a_truncated_or_extended_request_is_refused(
        len in any::<usize>(),
        tail in proptest::collection::vec(any::<u8>(), 1..8),
    ) {
        let (web, _, snapshot) = &*WORLD;
        let (_, der) = &*KEY;
        prop_assert!(check(&der[..len % der.len()], web, snapshot, P256).is_err());
        let extended = [der.as_slice(), &tail].concat();
        prop_assert!(check(&extended, web, snapshot, P256).is_err());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A validly signed request is taken exactly when every SPIFFE URI it names, in any case of
    /// the scheme, is the registration's SPIFFE ID; for a registration without an identity, when
    /// it names none.
    #[test]
    fn a_signed_request_is_taken_only_when_it_names_no_other_spiffe_id(
        uris in proptest::collection::vec(uri(), 0..3),
    ) {
        let (web, db, snapshot) = &*WORLD;
        let (key, _) = &*KEY;
        let names: Vec<&str> = uris.iter().map(String::as_str).collect();
        let der = csr(key, &names);
        let spiffe: Vec<&str> = names
            .iter()
            .copied()
            .filter(|u| u.get(..9).is_some_and(|s| s.eq_ignore_ascii_case("spiffe://")))
            .collect();
        let for_web = check(&der, web, snapshot, P256);
        prop_assert_eq!(for_web.is_ok(), spiffe.iter().all(|u| *u == WEB), "{:?}", names);
        if let Ok(public) = for_web {
            certifiable(&der, &public, Some(WEB), P256);
        }
        let for_db = check(&der, db, snapshot, P256);
        prop_assert_eq!(for_db.is_ok(), spiffe.is_empty(), "{:?}", names);
    }
}
