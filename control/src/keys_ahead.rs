//! RSA leaf keys generated ahead of the certificates that use them.
//!
//! An ECDSA key costs microseconds; an RSA-2048 key tens of milliseconds, far more than signing and
//! checking its certificate. With an `rsa-*` key algorithm the issuance threads use their idle time to
//! keep up to `issuance.keysAhead` keys ready, so that a wave starts with them and generates only the
//! rest. Each key is taken out of the set for one certificate and never handed out again; keys are
//! only ever in memory, and zeroized when dropped.

use std::sync::Mutex;

use meshca_ca::GeneratedKey;
use meshca_identity::KeyAlgorithm;

/// A bounded set of keys of one algorithm, generated ahead.
#[derive(Debug)]
pub struct KeysAhead {
    algorithm: KeyAlgorithm,
    bound: usize,
    keys: Mutex<Vec<GeneratedKey>>,
}

impl KeysAhead {
    /// A set of up to `bound` keys of `algorithm`; none for an ECDSA algorithm (generating its key as
    /// needed costs less than keeping one) or a bound of 0.
    pub fn new(algorithm: KeyAlgorithm, bound: usize) -> Option<KeysAhead> {
        (algorithm.rsa_bits().is_some() && bound > 0).then(|| KeysAhead {
            algorithm,
            bound,
            keys: Mutex::new(Vec::with_capacity(bound)),
        })
    }

    /// A ready key of `algorithm`, taken out of the set, if there is one.
    pub fn take(&self, algorithm: KeyAlgorithm) -> Option<GeneratedKey> {
        if algorithm != self.algorithm {
            return None;
        }
        self.lock().pop()
    }

    /// Generates one key if the set is not full; whether it did (false also when generating failed:
    /// the next wave generates its keys as it goes, and reports any failure then).
    pub fn fill_one(&self) -> bool {
        if self.len() >= self.bound {
            return false;
        }
        let Ok(key) = GeneratedKey::new(self.algorithm) else {
            return false;
        };
        let mut keys = self.lock();
        // Another thread may have filled the last place meanwhile; the extra key is dropped.
        if keys.len() < self.bound {
            keys.push(key);
        }
        true
    }

    /// The public halves of the keys ready now.
    #[cfg(test)]
    pub fn publics(&self) -> Vec<meshca_ca::PublicKey> {
        self.lock().iter().map(|k| k.public().clone()).collect()
    }

    /// How many keys are ready.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<GeneratedKey>> {
        // Nothing panics while holding the lock; a poisoned set is still a set of whole keys.
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ecdsa_keeps_no_keys_ahead_and_zero_keeps_none() {
        assert!(KeysAhead::new(KeyAlgorithm::EcdsaP256, 8).is_none());
        assert!(KeysAhead::new(KeyAlgorithm::Rsa2048, 0).is_none());
    }

    #[test]
    fn keys_fill_up_to_the_bound_and_each_is_taken_once() {
        let ahead = KeysAhead::new(KeyAlgorithm::Rsa2048, 3).expect("RSA keeps keys");
        while ahead.fill_one() {}
        assert_eq!(ahead.len(), 3);
        assert!(
            ahead.take(KeyAlgorithm::Rsa3072).is_none(),
            "another algorithm"
        );
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = ahead.take(KeyAlgorithm::Rsa2048) {
            assert_eq!(key.algorithm(), KeyAlgorithm::Rsa2048);
            assert!(
                seen.insert(format!("{:?}", key.public())),
                "a key handed out twice"
            );
        }
        assert_eq!(seen.len(), 3);
        assert_eq!(ahead.len(), 0);
        assert!(ahead.fill_one(), "room again");
    }
}
