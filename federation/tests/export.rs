//! How an endpoint's bundle is numbered: the sequence never goes backwards (restarts and replicas read
//! the same record), and a removed CA stays served until the last certificate it signed expires.

mod peer;

use std::time::{Duration, SystemTime};

use meshca_federation::export::{number, Retiring};
use meshca_federation::{SpiffeBundle, X509Authority};
use meshca_keystore::{Keystore, MemoryKeystore};
use peer::{td, Ca};

const HINT: Duration = Duration::from_secs(300);
const HOUR: Duration = Duration::from_secs(3600);

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

fn authority(ca: &Ca) -> X509Authority {
    X509Authority::from_der(ca.der(), &td()).expect("a CA of peer.example")
}

fn bundle(cas: &[&Ca]) -> SpiffeBundle {
    SpiffeBundle::new(
        td(),
        cas.iter().map(|ca| authority(ca)).collect(),
        Vec::new(),
    )
}

fn served_ders(served: &SpiffeBundle) -> Vec<Vec<u8>> {
    let mut ders: Vec<Vec<u8>> = served
        .x509_authorities()
        .iter()
        .map(|a| a.der().to_vec())
        .collect();
    ders.sort();
    ders
}

fn ders(cas: &[&Ca]) -> Vec<Vec<u8>> {
    let mut ders: Vec<Vec<u8>> = cas.iter().map(|ca| ca.der()).collect();
    ders.sort();
    ders
}

#[test]
fn the_sequence_rises_with_the_content_and_a_restart_serves_the_same_number() {
    let keystore = MemoryKeystore::new();
    let (one, two) = (Ca::new("peer.example"), Ca::new("peer.example"));
    let first = number(&keystore, &bundle(&[&one]), &[], HINT, at(0)).expect("numbered");
    assert_eq!(first.bundle.sequence, Some(1));
    assert_eq!(first.bundle.refresh_hint, Some(HINT));
    // The first bundle ever served waits for nothing.
    assert!(first
        .served_since
        .values()
        .all(|since| *since == SystemTime::UNIX_EPOCH));
    let again = number(&keystore, &bundle(&[&one]), &[], HINT, at(10)).expect("numbered");
    assert_eq!(again, first, "the same content, the same number");
    let second = number(&keystore, &bundle(&[&two, &one]), &[], HINT, at(20)).expect("numbered");
    assert_eq!(second.bundle.sequence, Some(2));
    let two_id = meshca_federation::export::authority_id(&two.der());
    assert_eq!(second.served_since[&two_id], at(20));
    assert!(second.retired.is_empty());
}

#[test]
fn a_removed_ca_is_served_until_its_last_certificate_expires_across_restarts() {
    let keystore = MemoryKeystore::new();
    let (one, two) = (Ca::new("peer.example"), Ca::new("peer.example"));
    number(&keystore, &bundle(&[&two, &one]), &[], HINT, at(0)).expect("numbered");
    // ca-1 leaves what proxies trust while a certificate it signed lives another hour.
    let retiring = [Retiring {
        authority: authority(&one),
        until: at(100) + HOUR,
    }];
    let kept = number(&keystore, &bundle(&[&two]), &retiring, HINT, at(100)).expect("numbered");
    assert_eq!(served_ders(&kept.bundle), ders(&[&one, &two]));
    let one_id = meshca_federation::export::authority_id(&one.der());
    assert_eq!(kept.retired.get(&one_id), Some(&(at(100) + HOUR)));
    // A restart (nothing retiring any more in memory) serves it still, from the record, under the
    // same number.
    let restarted = number(&keystore, &bundle(&[&two]), &[], HINT, at(200)).expect("numbered");
    assert_eq!(restarted, kept);
    // Another replica that knew of a later certificate keeps it longer, without a new number.
    let later = [Retiring {
        authority: authority(&one),
        until: at(300) + HOUR,
    }];
    let longer = number(&keystore, &bundle(&[&two]), &later, HINT, at(300)).expect("numbered");
    assert_eq!(longer.bundle.sequence, kept.bundle.sequence);
    assert_eq!(longer.retired.get(&one_id), Some(&(at(300) + HOUR)));
    let earlier = [Retiring {
        authority: authority(&one),
        until: at(400),
    }];
    let still = number(&keystore, &bundle(&[&two]), &earlier, HINT, at(350)).expect("numbered");
    assert_eq!(
        still.retired.get(&one_id),
        Some(&(at(300) + HOUR)),
        "the later time wins"
    );
    // Once that certificate has expired, the CA leaves, under a new number.
    let gone = number(&keystore, &bundle(&[&two]), &[], HINT, at(300) + HOUR).expect("numbered");
    assert_eq!(served_ders(&gone.bundle), ders(&[&two]));
    assert!(gone.retired.is_empty());
    assert!(gone.bundle.sequence > kept.bundle.sequence);
}

#[test]
fn a_retired_ca_configured_again_is_served_as_any_other_and_nothing_past_is_retired() {
    let keystore = MemoryKeystore::new();
    let (one, two) = (Ca::new("peer.example"), Ca::new("peer.example"));
    number(&keystore, &bundle(&[&two, &one]), &[], HINT, at(0)).expect("numbered");
    let retiring = [Retiring {
        authority: authority(&one),
        until: at(0) + HOUR,
    }];
    number(&keystore, &bundle(&[&two]), &retiring, HINT, at(10)).expect("numbered");
    let back = number(&keystore, &bundle(&[&two, &one]), &[], HINT, at(20)).expect("numbered");
    assert!(back.retired.is_empty(), "{:?}", back.retired);
    assert_eq!(served_ders(&back.bundle), ders(&[&one, &two]));
    // Removed again, with its certificates already expired: it leaves at once.
    let expired = [Retiring {
        authority: authority(&one),
        until: at(30),
    }];
    let gone = number(&keystore, &bundle(&[&two]), &expired, HINT, at(30)).expect("numbered");
    assert_eq!(served_ders(&gone.bundle), ders(&[&two]));
}

#[test]
fn a_record_that_does_not_read_is_replaced_by_a_number_from_the_clock() {
    let keystore = MemoryKeystore::new();
    let one = Ca::new("peer.example");
    number(&keystore, &bundle(&[&one]), &[], HINT, at(0)).expect("numbered");
    keystore
        .put_public(
            &meshca_federation::export::sequence_path(&td()),
            b"not json",
        )
        .expect("written");
    let renumbered = number(&keystore, &bundle(&[&one]), &[], HINT, at(5)).expect("numbered");
    assert_eq!(renumbered.bundle.sequence, Some(1_800_000_005));
}
