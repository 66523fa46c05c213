//! Automatic rotation of builtin CAs (docs/rotation.md). A builtin backend's CAs form a lineage: the
//! first CA and each successor. A successor is generated and trusted at half its predecessor's life,
//! and issues from a sixth of that life before the predecessor's expiry, so its trust has long reached
//! every proxy when it starts issuing. Which CA of the lineage issues and which are trusted is a pure
//! function of time, so a restart picks up exactly where the previous run was.

use std::time::SystemTime;

/// The validity of one CA of a lineage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    /// NotBefore.
    pub not_before: SystemTime,
    /// NotAfter.
    pub not_after: SystemTime,
}

impl Validity {
    fn lifetime(&self) -> std::time::Duration {
        self.not_after
            .duration_since(self.not_before)
            .unwrap_or_default()
    }

    /// When the successor is generated and published in bundles.
    pub fn prepare_at(&self) -> SystemTime {
        self.not_before + self.lifetime() / 2
    }

    /// When the successor starts issuing.
    pub fn hand_over_at(&self) -> SystemTime {
        self.not_after - self.lifetime() / 6
    }
}

/// What the CAs of one lineage do at some moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lineage {
    /// Index of the CA that issues.
    pub active: usize,
    /// Indices of the CAs bundles carry (every unexpired one), in creation order.
    pub trusted: Vec<usize>,
    /// Whether a successor must be generated now.
    pub needs_successor: bool,
    /// The next moment something changes (a preparation, a hand-over or an expiry).
    pub next_event: Option<SystemTime>,
}

/// Decides, at `now`, for the CAs of a lineage in creation order. `None` when every one expired.
pub fn lineage(cas: &[Validity], now: SystemTime) -> Option<Lineage> {
    let trusted: Vec<usize> = (0..cas.len()).filter(|&i| cas[i].not_after > now).collect();
    let first = *trusted.first()?;
    let mut active = first;
    while let Some(&next) = trusted.iter().find(|&&i| i > active) {
        if now >= cas[active].hand_over_at() {
            active = next;
        } else {
            break;
        }
    }
    let last = *trusted.last()?;
    let needs_successor = active == last && now >= cas[active].prepare_at();
    let next_event = trusted
        .iter()
        .flat_map(|&i| {
            let v = cas[i];
            [v.prepare_at(), v.hand_over_at(), v.not_after]
        })
        .filter(|t| *t > now)
        .min();
    Some(Lineage {
        active,
        trusted,
        needs_successor,
        next_event,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn day(n: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(n * 86_400)
    }

    fn gen(from: u64, to: u64) -> Validity {
        Validity {
            not_before: day(from),
            not_after: day(to),
        }
    }

    #[test]
    fn a_young_ca_issues_alone() {
        let l = lineage(&[gen(0, 60)], day(10)).expect("valid");
        assert_eq!(
            (l.active, l.trusted.clone(), l.needs_successor),
            (0, vec![0], false)
        );
        assert_eq!(l.next_event, Some(day(30)), "half of the lifetime");
    }

    #[test]
    fn at_half_life_a_successor_is_needed_and_trusted_but_does_not_issue() {
        let l = lineage(&[gen(0, 60)], day(30)).expect("valid");
        assert!(l.needs_successor);
        let l = lineage(&[gen(0, 60), gen(30, 90)], day(31)).expect("valid");
        assert_eq!(
            (l.active, l.trusted.clone(), l.needs_successor),
            (0, vec![0, 1], false)
        );
        assert_eq!(
            l.next_event,
            Some(day(50)),
            "hand-over a sixth before expiry"
        );
    }

    #[test]
    fn a_sixth_before_expiry_the_successor_issues_and_the_old_one_stays_trusted_until_it_expires() {
        let gens = [gen(0, 60), gen(30, 90)];
        let l = lineage(&gens, day(50)).expect("valid");
        assert_eq!((l.active, l.trusted.clone()), (1, vec![0, 1]));
        let l = lineage(&gens, day(60)).expect("valid");
        assert_eq!((l.active, l.trusted.clone()), (1, vec![1]));
        // The successor reaches its own half-life: its successor is due.
        let l = lineage(&gens, day(60)).expect("valid");
        assert!(l.needs_successor);
    }

    #[test]
    fn everything_expired_is_none() {
        assert_eq!(lineage(&[gen(0, 60)], day(61)), None);
    }
}
