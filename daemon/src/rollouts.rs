//! The timeline of the last rollouts, kept in memory for the console: per mesh, when a rollout began,
//! each step that waited (trust before identity, SANs before identity, identity ACKs, break last),
//! whom it waited for, timeouts, and when it ended.
//!
//! A rollout of a mesh is the time some step of it waits. Steps follow each other with short gaps (a
//! trust wait ends, then the new certificates are issued and their ACK wait begins), so a step that
//! begins within [`MERGE`] of the end of the mesh's last rollout continues it. The timeline is bounded:
//! [`MAX_ROLLOUTS`] rollouts of at most [`MAX_ENTRIES`] entries each; it grows with rollouts, never with
//! proxies, and a restart forgets it.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, SystemTime};

use meshca_control::{GateEvent, RolloutStep, StepChange, StepPhase};

/// How many rollouts are kept (the oldest goes first).
pub(crate) const MAX_ROLLOUTS: usize = 32;
/// How many entries a rollout keeps (the oldest go first, counted in [`Rollout::dropped`]).
pub(crate) const MAX_ENTRIES: usize = 64;
/// A step that begins this soon after a mesh's last rollout ended continues it.
pub(crate) const MERGE: Duration = Duration::from_secs(30);

/// The last rollouts, oldest first.
#[derive(Debug, Default)]
pub struct Timeline {
    rollouts: VecDeque<Rollout>,
}

/// One rollout of one mesh.
#[derive(Clone, Debug)]
pub struct Rollout {
    /// The mesh, or `(zone egress)`.
    pub mesh: String,
    /// When its first step began.
    pub started: SystemTime,
    /// When its last step ended; `None` while a step waits.
    pub ended: Option<SystemTime>,
    /// What happened, in order.
    pub entries: Vec<Entry>,
    /// Entries dropped (the oldest) to keep the bound.
    pub dropped: usize,
    /// The steps waiting now, by step and CA.
    waiting: BTreeSet<(RolloutStep, String)>,
}

/// One thing that happened in a rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// When.
    pub at: SystemTime,
    /// What.
    pub what: What,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum What {
    /// A step began waiting for `waiting` proxies.
    Began {
        /// The step.
        step: RolloutStep,
        /// The CA (its subject), or the SPIFFE ID and context of a SAN step.
        ca: String,
        /// How many proxies it waited for.
        waiting: usize,
    },
    /// A step stopped waiting.
    Ended {
        /// The step.
        step: RolloutStep,
        /// As in [`What::Began`].
        ca: String,
    },
    /// `rollout.ackTimeout` passed and the step went ahead without some proxies.
    TimedOut(RolloutStep),
    /// The configuration removed a CA that connected proxies still presented (kept until they stop).
    RemovedWhilePresented,
}

impl Rollout {
    /// Whether `step` ended in this rollout.
    pub fn ended_step(&self, step: RolloutStep) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(&e.what, What::Ended { step: s, .. } if *s == step))
    }

    fn push(&mut self, entry: Entry) {
        if self.entries.len() == MAX_ENTRIES {
            self.entries.remove(0);
            self.dropped += 1;
        }
        self.entries.push(entry);
    }

    /// Whether a step of the mesh at `at` belongs to this rollout.
    fn continues(&self, at: SystemTime) -> bool {
        self.ended
            .is_none_or(|ended| at.duration_since(ended).unwrap_or_default() <= MERGE)
    }
}

impl Timeline {
    /// Takes in a step that began or ended at `at`.
    pub fn step(&mut self, change: &StepChange, at: SystemTime) {
        let key = (change.step, change.ca.clone());
        match change.phase {
            StepPhase::Began { waiting } => {
                let rollout = self.continued_or_new(&change.mesh, at);
                rollout.ended = None;
                rollout.waiting.insert(key);
                rollout.push(Entry {
                    at,
                    what: What::Began {
                        step: change.step,
                        ca: change.ca.clone(),
                        waiting,
                    },
                });
            }
            StepPhase::Ended => {
                // A step that began before the timeline did (it has no rollout) is left out.
                let Some(rollout) = self
                    .rollouts
                    .iter_mut()
                    .rev()
                    .find(|r| r.mesh == change.mesh && r.waiting.contains(&key))
                else {
                    return;
                };
                rollout.waiting.remove(&key);
                rollout.push(Entry {
                    at,
                    what: What::Ended {
                        step: change.step,
                        ca: change.ca.clone(),
                    },
                });
                if rollout.waiting.is_empty() {
                    rollout.ended = Some(at);
                }
            }
        }
    }

    /// Takes in a gate event of `mesh` at `at` (a timeout, a CA removed while presented); a wait that
    /// started is already a [`Timeline::step`].
    pub fn gate_event(&mut self, mesh: &str, event: GateEvent, at: SystemTime) {
        let what = match event {
            GateEvent::WaitStarted(_) => return,
            GateEvent::TimedOut(step) => What::TimedOut(step),
            GateEvent::RemovedWhilePresented => What::RemovedWhilePresented,
        };
        let rollout = self.continued_or_new(mesh, at);
        rollout.push(Entry { at, what });
        if rollout.waiting.is_empty() && rollout.ended.is_none() {
            // Nothing waits (yet): the rollout is over unless a step begins within MERGE.
            rollout.ended = Some(at);
        }
    }

    /// Whether a step of some rollout waits now.
    pub fn in_progress(&self) -> bool {
        self.rollouts.iter().any(|r| r.ended.is_none())
    }

    /// The rollouts, newest first.
    pub fn newest_first(&self) -> impl Iterator<Item = &Rollout> {
        self.rollouts.iter().rev()
    }

    /// The newest rollout of `mesh`.
    pub fn latest(&self, mesh: &str) -> Option<&Rollout> {
        self.newest_first().find(|r| r.mesh == mesh)
    }

    /// The mesh's rollout that an event at `at` belongs to: its newest, if open or just ended, else a
    /// new one.
    fn continued_or_new(&mut self, mesh: &str, at: SystemTime) -> &mut Rollout {
        let index = self
            .rollouts
            .iter()
            .rposition(|r| r.mesh == mesh)
            .filter(|&i| self.rollouts[i].continues(at));
        let index = match index {
            Some(index) => index,
            None => {
                if self.rollouts.len() == MAX_ROLLOUTS {
                    self.rollouts.pop_front();
                }
                self.rollouts.push_back(Rollout {
                    mesh: mesh.to_owned(),
                    started: at,
                    ended: None,
                    entries: Vec::new(),
                    dropped: 0,
                    waiting: BTreeSet::new(),
                });
                self.rollouts.len() - 1
            }
        };
        &mut self.rollouts[index]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(mesh: &str, step: RolloutStep, phase: StepPhase) -> StepChange {
        StepChange {
            mesh: mesh.into(),
            step,
            ca: "CN=ca-2".into(),
            phase,
        }
    }

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
    }

    const BEGAN: StepPhase = StepPhase::Began { waiting: 3 };

    #[test]
    fn steps_with_short_gaps_are_one_rollout_and_a_later_one_is_another() {
        let mut t = Timeline::default();
        t.step(&change("m", RolloutStep::TrustBeforeIdentity, BEGAN), at(0));
        assert_eq!(t.latest("m").map(|r| r.ended), Some(None), "in progress");
        assert!(t.in_progress());
        t.step(
            &change("m", RolloutStep::TrustBeforeIdentity, StepPhase::Ended),
            at(2),
        );
        assert_eq!(t.latest("m").and_then(|r| r.ended), Some(at(2)));
        assert!(!t.in_progress());
        t.step(&change("m", RolloutStep::IdentityAck, BEGAN), at(3));
        t.step(
            &change("m", RolloutStep::IdentityAck, StepPhase::Ended),
            at(5),
        );
        let rollout = t.latest("m").expect("one rollout");
        assert_eq!(rollout.started, at(0));
        assert_eq!(rollout.ended, Some(at(5)));
        assert_eq!(rollout.entries.len(), 4);
        assert!(rollout.ended_step(RolloutStep::TrustBeforeIdentity));
        assert!(!rollout.ended_step(RolloutStep::BreakLast));
        assert_eq!(t.newest_first().count(), 1);

        t.step(&change("m", RolloutStep::BreakLast, BEGAN), at(5 + 31));
        assert_eq!(t.newest_first().count(), 2, "past MERGE: a new rollout");
        t.step(&change("other", RolloutStep::BreakLast, BEGAN), at(40));
        assert_eq!(t.newest_first().count(), 3, "another mesh: its own rollout");
        assert_eq!(t.latest("m").map(|r| r.started), Some(at(36)));
    }

    #[test]
    fn an_end_without_a_beginning_and_a_timeout_are_kept_in_their_place() {
        let mut t = Timeline::default();
        t.step(
            &change("m", RolloutStep::BreakLast, StepPhase::Ended),
            at(0),
        );
        assert_eq!(t.newest_first().count(), 0, "began before the timeline");
        t.step(&change("m", RolloutStep::IdentityAck, BEGAN), at(1));
        t.gate_event("m", GateEvent::TimedOut(RolloutStep::IdentityAck), at(31));
        t.gate_event(
            "m",
            GateEvent::WaitStarted(RolloutStep::IdentityAck),
            at(31),
        );
        let rollout = t.latest("m").expect("a rollout");
        assert_eq!(rollout.ended, None, "the step still waits");
        assert_eq!(
            rollout.entries.last().map(|e| &e.what),
            Some(&What::TimedOut(RolloutStep::IdentityAck))
        );
        assert_eq!(rollout.entries.len(), 2, "WaitStarted is the step's Began");
    }

    #[test]
    fn the_timeline_is_bounded_in_rollouts_and_entries() {
        let mut t = Timeline::default();
        for i in 0..(MAX_ROLLOUTS as u64 + 5) {
            t.step(
                &change(&format!("m{i}"), RolloutStep::BreakLast, BEGAN),
                at(i),
            );
        }
        assert_eq!(t.newest_first().count(), MAX_ROLLOUTS);
        assert!(t.latest("m0").is_none(), "the oldest went first");
        for i in 0..(MAX_ENTRIES as u64 * 2) {
            t.gate_event("m5", GateEvent::RemovedWhilePresented, at(100 + i));
        }
        let rollout = t.latest("m5").expect("kept");
        assert_eq!(rollout.entries.len(), MAX_ENTRIES);
        assert_eq!(rollout.dropped, MAX_ENTRIES + 1);
    }
}
