//! What one peer stream was sent and what its acknowledgements mean for the rollout gate: the ACK
//! bookkeeping every protocol shares (pure: the stream reports what this returns through its
//! [`crate::HubStream`]s).
//!
//! A message (an SDS response, a Workload API message, an agent's state) is numbered with a version and
//! the snapshot generation it was built from, and stands for every newer generation whose content for
//! the peer is the same: an acknowledged message whose content a new snapshot leaves unchanged means the
//! peer holds the new generation too, and is acknowledged again for it. A message carries the hub
//! streams it speaks for (an agent's or a Workload API caller's stream speaks for several registrations'
//! Dataplanes; an SDS stream for its one proxy). Acknowledging a message supersedes those sent before it.
//!
//! When a message counts as acknowledged is each protocol's ACK policy: when the peer says so (SDS's
//! ACK of the response's nonce); once the workload had `workloadApi.ackAfter` to put it in use (the
//! Workload API, whose clients send nothing back); when every local stream on the agent's host was sent
//! it (the agent protocol's `Ack`).

use std::collections::VecDeque;

use meshca_control::StreamId;

use crate::hub::HubStream;

/// How many sent messages not yet acknowledged are kept: a peer far behind still acknowledges the older
/// ones without error, and the newest ones with their streams.
pub const KEPT: usize = 64;

/// ACKs to report: every one of `streams` (those the stream still speaks for) holds `generation`,
/// through message `version`.
#[derive(Debug, PartialEq, Eq)]
pub struct Acked {
    /// The hub streams the message spoke for, sorted.
    pub streams: Vec<StreamId>,
    /// The newest snapshot generation the message stands for.
    pub generation: u64,
    /// The message's version.
    pub version: u64,
}

impl Acked {
    /// Reports the acknowledgement for those of `open` (the peer stream's hub streams now) that the
    /// message spoke for: a stream opened since was not sent it, and one closed since is gone.
    pub async fn report(&self, open: &[&HubStream]) {
        for stream in open
            .iter()
            .filter(|s| self.streams.binary_search(&s.id()).is_ok())
        {
            stream
                .acknowledged(self.generation, self.version.to_string())
                .await;
        }
    }
}

/// An acknowledgement of a version the stream never sent.
#[derive(Debug, PartialEq, Eq)]
pub struct NeverSent(pub u64);

/// One message sent.
#[derive(Debug)]
struct Sent {
    version: u64,
    /// The newest snapshot generation whose content it equals.
    stands_for: u64,
    /// The registrations' streams it carried, sorted.
    streams: Vec<StreamId>,
    acked: bool,
}

/// The messages a stream sent that its peer has not superseded by acknowledging a newer one.
#[derive(Debug, Default)]
pub struct Ledger {
    sent: VecDeque<Sent>,
    /// The newest version sent that `sent` no longer holds.
    forgotten: Option<u64>,
}

impl Ledger {
    /// Records a message built from `generation` that carries `streams`, and returns its version: the
    /// generation, or one more than the last version when one generation is sent twice (a key offered,
    /// a JWT key added), so that versions grow.
    pub fn send(&mut self, generation: u64, mut streams: Vec<StreamId>) -> u64 {
        let version = match self.sent.back() {
            Some(last) if last.version >= generation => last.version + 1,
            _ => match self.forgotten {
                Some(forgotten) if forgotten >= generation => forgotten + 1,
                _ => generation,
            },
        };
        streams.sort_unstable();
        self.sent.push_back(Sent {
            version,
            stands_for: generation,
            streams,
            acked: false,
        });
        if self.sent.len() > KEPT {
            if let Some(oldest) = self.sent.pop_front() {
                self.forget(oldest.version);
            }
        }
        version
    }

    /// The content last sent equals generation `generation`'s: it stands for it too. ACKs to report
    /// when the peer had acknowledged it.
    pub fn unchanged(&mut self, generation: u64) -> Option<Acked> {
        let last = self.sent.back_mut()?;
        if last.stands_for >= generation {
            return None;
        }
        last.stands_for = generation;
        last.acked.then(|| Acked {
            streams: last.streams.clone(),
            generation,
            version: last.version,
        })
    }

    /// The peer acknowledged `version`: ACKs to report, none when a newer acknowledgement superseded
    /// it already (or it was acknowledged before).
    pub fn ack(&mut self, version: u64) -> Result<Option<Acked>, NeverSent> {
        let Some(at) = self.sent.iter().position(|s| s.version == version) else {
            return match self.forgotten {
                Some(forgotten) if version <= forgotten => Ok(None),
                _ => Err(NeverSent(version)),
            };
        };
        // The messages sent before it are superseded by it.
        let older: Vec<u64> = self.sent.drain(..at).map(|s| s.version).collect();
        for version in older {
            self.forget(version);
        }
        // An idle stream holds the one message its peer acknowledged: room for more would be kept for
        // as long as the stream stays idle, on every stream.
        if self.sent.len() == 1 {
            self.sent.shrink_to_fit();
        }
        let Some(sent) = self.sent.front_mut() else {
            return Ok(None);
        };
        if sent.acked {
            return Ok(None);
        }
        sent.acked = true;
        Ok(Some(Acked {
            streams: sent.streams.clone(),
            generation: sent.stands_for,
            version,
        }))
    }

    /// The peer refused `version`, and keeps what it held: it is not acknowledged (a message whose
    /// content a new snapshot leaves unchanged is not acknowledged again for it). The newest generation
    /// it stands for; `None` when it is no longer kept.
    pub fn reject(&mut self, version: u64) -> Option<u64> {
        let sent = self.sent.iter_mut().find(|s| s.version == version)?;
        sent.acked = false;
        Some(sent.stands_for)
    }

    /// How many sent messages are kept: at most [`KEPT`].
    pub fn kept(&self) -> usize {
        self.sent.len()
    }

    fn forget(&mut self, version: u64) {
        self.forgotten = Some(self.forgotten.map_or(version, |v| v.max(version)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(ids: &[u64]) -> Vec<StreamId> {
        ids.iter().copied().map(StreamId).collect()
    }

    #[test]
    fn an_idle_ledger_keeps_room_for_the_acknowledged_message_only() {
        let mut sent = Ledger::default();
        for generation in 1..=3 {
            sent.send(generation, ids(&[1]));
        }
        assert!(sent.sent.capacity() >= 3);
        sent.ack(3).expect("sent").expect("news");
        assert_eq!(sent.kept(), 1);
        assert_eq!(sent.sent.capacity(), 1);
        // It keeps working: the next message and its acknowledgement.
        assert_eq!(sent.send(4, ids(&[1])), 4);
        assert_eq!(sent.ack(4).expect("sent").map(|a| a.version), Some(4));
    }

    #[test]
    fn versions_are_generations_and_grow_when_one_is_sent_twice() {
        let mut sent = Ledger::default();
        assert_eq!(sent.send(3, ids(&[1])), 3);
        assert_eq!(sent.send(3, ids(&[1])), 4);
        assert_eq!(sent.send(4, ids(&[1])), 5);
        assert_eq!(sent.send(9, ids(&[1])), 9);
    }

    #[test]
    fn an_ack_reports_the_newest_generation_the_state_stands_for() {
        let mut sent = Ledger::default();
        let v = sent.send(1, ids(&[2, 1]));
        assert_eq!(sent.unchanged(2), None, "not acknowledged yet");
        assert_eq!(
            sent.ack(v),
            Ok(Some(Acked {
                streams: ids(&[1, 2]),
                generation: 2,
                version: 1
            }))
        );
        assert_eq!(sent.ack(v), Ok(None), "once is enough");
        assert_eq!(
            sent.unchanged(3),
            Some(Acked {
                streams: ids(&[1, 2]),
                generation: 3,
                version: 1
            }),
            "acknowledged: the new generation is held at once"
        );
        assert_eq!(sent.unchanged(3), None);
    }

    #[test]
    fn a_newer_ack_supersedes_older_states_and_unknown_versions_are_refused() {
        let mut sent = Ledger::default();
        let first = sent.send(1, ids(&[1]));
        let second = sent.send(2, ids(&[1, 3]));
        assert_eq!(
            sent.ack(second).map(|a| a.map(|a| a.generation)),
            Ok(Some(2))
        );
        assert_eq!(sent.ack(first), Ok(None), "superseded");
        assert_eq!(sent.ack(7), Err(NeverSent(7)));
    }

    #[test]
    fn only_so_many_unacknowledged_states_are_kept() {
        let mut sent = Ledger::default();
        for generation in 1..=(KEPT as u64 + 5) {
            sent.send(generation, ids(&[1]));
        }
        assert_eq!(sent.ack(1), Ok(None), "forgotten, but it was sent");
        let newest = KEPT as u64 + 5;
        assert_eq!(
            sent.ack(newest).map(|a| a.map(|a| a.version)),
            Ok(Some(newest))
        );
        assert_eq!(sent.ack(newest + 1), Err(NeverSent(newest + 1)));
        // After everything kept was superseded, versions still grow past what was forgotten.
        assert_eq!(sent.send(3, ids(&[1])), newest + 1);
    }

    mod model {
        use super::*;
        use proptest::prelude::*;

        /// What a stream does with its states.
        #[derive(Debug, Clone)]
        enum Op {
            /// A state built from the generation this many after the current one, carrying these
            /// streams.
            Send(u64, Vec<u64>),
            /// A snapshot this many generations newer leaves the content unchanged.
            Unchanged(u64),
            /// An Ack of the state sent this many states before the newest (wrapping), or of a
            /// version this far past the newest.
            AckSent(usize),
            AckPast(u64),
            /// An Ack of a version between two sent, or below every one.
            AckBetween(usize),
            /// This many states, each of the next generation, with no Ack between: past what is kept.
            Burst(u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => (0u64..3, proptest::collection::vec(0u64..4, 0..3))
                    .prop_map(|(ahead, streams)| Op::Send(ahead, streams)),
                1 => (0u64..3).prop_map(Op::Unchanged),
                3 => (0usize..80).prop_map(Op::AckSent),
                1 => (1u64..4).prop_map(Op::AckPast),
                1 => (0usize..80).prop_map(Op::AckBetween),
                1 => (1u64..=(KEPT as u64 + 8)).prop_map(Op::Burst),
            ]
        }

        /// One state sent, as the model sees it.
        struct Sent {
            version: u64,
            stands_for: u64,
            streams: Vec<StreamId>,
        }

        /// Every state ever sent, and indices into it: the first still kept, and the one acknowledged
        /// last. A state is kept if it is among the newest `KEPT` and not older than the one
        /// acknowledged last.
        #[derive(Default)]
        struct Model {
            history: Vec<Sent>,
            acked: Option<usize>,
        }

        impl Model {
            fn first_kept(&self) -> usize {
                self.history
                    .len()
                    .saturating_sub(KEPT)
                    .max(self.acked.unwrap_or(0))
            }

            /// The newest version no longer kept.
            fn forgotten(&self) -> Option<u64> {
                self.history[..self.first_kept()]
                    .iter()
                    .map(|s| s.version)
                    .max()
            }

            fn send(&mut self, generation: u64, mut streams: Vec<StreamId>) -> u64 {
                let version = match self.history.last() {
                    Some(last) => generation.max(last.version + 1),
                    None => generation,
                };
                streams.sort_unstable();
                self.history.push(Sent {
                    version,
                    stands_for: generation,
                    streams,
                });
                version
            }

            fn unchanged(&mut self, generation: u64) -> Option<Acked> {
                let at = self.history.len().checked_sub(1)?;
                let last = &mut self.history[at];
                if last.stands_for >= generation {
                    return None;
                }
                last.stands_for = generation;
                (self.acked == Some(at)).then(|| Acked {
                    streams: last.streams.clone(),
                    generation,
                    version: last.version,
                })
            }

            fn ack(&mut self, version: u64) -> Result<Option<Acked>, NeverSent> {
                let Some(at) = self.history.iter().position(|s| s.version == version) else {
                    return match self.forgotten() {
                        Some(forgotten) if version <= forgotten => Ok(None),
                        _ => Err(NeverSent(version)),
                    };
                };
                if at < self.first_kept() || self.acked == Some(at) {
                    return Ok(None);
                }
                self.acked = Some(at);
                let sent = &self.history[at];
                Ok(Some(Acked {
                    streams: sent.streams.clone(),
                    generation: sent.stands_for,
                    version,
                }))
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(128))]

            /// `Ledger` does what the model, which remembers every state, says; versions grow,
            /// what is reported acknowledged never goes back, a version never sent is refused
            /// unless older than one forgotten, and no more than `KEPT` states are kept.
            #[test]
            fn sent_states_follow_the_model(ops in proptest::collection::vec(op(), 1..300)) {
                let mut sent = Ledger::default();
                let mut model = Model::default();
                let mut generation = 1;
                let mut reported: Option<(u64, u64)> = None;
                for op in ops {
                    let acked = match op {
                        Op::Send(ahead, streams) => {
                            generation += ahead;
                            let streams: Vec<StreamId> = streams.into_iter().map(StreamId).collect();
                            let newest = model.history.last().map(|s| s.version);
                            let version = sent.send(generation, streams.clone());
                            prop_assert_eq!(version, model.send(generation, streams));
                            prop_assert!(version >= generation);
                            prop_assert!(newest.is_none_or(|newest| version > newest));
                            None
                        }
                        Op::Burst(states) => {
                            for _ in 0..states {
                                generation += 1;
                                let streams = vec![StreamId(1)];
                                let version = sent.send(generation, streams.clone());
                                prop_assert_eq!(version, model.send(generation, streams));
                                prop_assert!(sent.kept() <= KEPT);
                            }
                            None
                        }
                        Op::Unchanged(ahead) => {
                            generation += ahead;
                            let acked = sent.unchanged(generation);
                            prop_assert_eq!(&acked, &model.unchanged(generation));
                            acked
                        }
                        Op::AckSent(back) | Op::AckBetween(back) if model.history.is_empty() => {
                            let _ = back;
                            prop_assert_eq!(sent.ack(1), Err(NeverSent(1)));
                            None
                        }
                        Op::AckSent(back) => {
                            let version = model.history[model.history.len() - 1 - back % model.history.len()].version;
                            let acked = sent.ack(version);
                            prop_assert!(acked.is_ok(), "a version sent was refused");
                            prop_assert_eq!(&acked, &model.ack(version));
                            acked.ok().flatten()
                        }
                        Op::AckPast(past) => {
                            let version = model.history.last().map_or(0, |s| s.version) + past;
                            prop_assert_eq!(sent.ack(version), Err(NeverSent(version)));
                            None
                        }
                        Op::AckBetween(at) => {
                            let at = at % model.history.len();
                            let below = if at == 0 { 0 } else { model.history[at - 1].version };
                            let version = model.history[at].version - 1;
                            if version == below {
                                // No gap here.
                                continue;
                            }
                            let acked = sent.ack(version);
                            prop_assert!(!matches!(acked, Ok(Some(_))), "a version never sent was reported");
                            prop_assert_eq!(&acked, &model.ack(version));
                            acked.ok().flatten()
                        }
                    };
                    if let Some(acked) = acked {
                        if let Some((version, generation)) = reported {
                            prop_assert!(acked.version >= version && acked.generation >= generation);
                            prop_assert!((acked.version, acked.generation) != (version, generation));
                        }
                        reported = Some((acked.version, acked.generation));
                    }
                    prop_assert!(sent.kept() <= KEPT);
                    prop_assert_eq!(sent.kept(), model.history.len() - model.first_kept());
                }
            }
        }
    }
}
