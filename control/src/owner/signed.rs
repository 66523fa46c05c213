//! When the last certificate each CA signed expires: the bundle endpoints keep serving a CA removed
//! from the configuration until then, so that peers accept every certificate it signed for as long as
//! that certificate is valid.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

/// Per CA id (the lowercase hex SHA-256 of its certificate), when the last certificate it signed that
/// this daemon issued or served expires. Only times still ahead are kept.
pub type SignedUntil = BTreeMap<String, SystemTime>;

/// [`SignedUntil`] as certificates are issued, and whether it changed since it was last taken.
#[derive(Debug, Default)]
pub(crate) struct Signed {
    until: SignedUntil,
    changed: bool,
}

impl Signed {
    /// Counts a certificate from `ca_id` valid until `not_after`.
    pub(crate) fn signed(&mut self, ca_id: &str, not_after: SystemTime) {
        match self.until.get_mut(ca_id) {
            Some(until) if *until >= not_after => {}
            Some(until) => {
                *until = not_after;
                self.changed = true;
            }
            None => {
                self.until.insert(ca_id.to_owned(), not_after);
                self.changed = true;
            }
        }
    }

    /// The times still ahead of `now`, when they changed since the last call.
    pub(crate) fn take(&mut self, now: SystemTime) -> Option<Arc<SignedUntil>> {
        if !std::mem::take(&mut self.changed) {
            return None;
        }
        self.until.retain(|_, until| *until > now);
        Some(Arc::new(self.until.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_latest_expiry_per_ca_is_kept_and_sent_once_per_change() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = Duration::from_secs(3600);
        let mut signed = Signed::default();
        assert_eq!(signed.take(t0), None);
        signed.signed("ca-1", t0 + hour);
        signed.signed("ca-1", t0 + hour / 2);
        signed.signed("ca-2", t0 + 2 * hour);
        let taken = signed.take(t0).expect("changed");
        assert_eq!(
            *taken,
            BTreeMap::from([("ca-1".into(), t0 + hour), ("ca-2".into(), t0 + 2 * hour)])
        );
        assert_eq!(signed.take(t0), None, "nothing changed since");
        // An earlier expiry changes nothing; a later one does.
        signed.signed("ca-2", t0 + hour);
        assert_eq!(signed.take(t0), None);
        signed.signed("ca-2", t0 + 3 * hour);
        // Once past, a CA's time is forgotten.
        let taken = signed
            .take(t0 + 90 * 60 * Duration::from_secs(1))
            .expect("changed");
        assert_eq!(*taken, BTreeMap::from([("ca-2".into(), t0 + 3 * hour)]));
    }
}
