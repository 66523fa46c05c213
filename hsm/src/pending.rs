//! Keys made in the token and not yet recorded anywhere, and the ones a kill left behind.
//!
//! A key pair is made in the token before the keystore records its `pkcs11:` URI, so a kill in between
//! leaves a pair no record names, which nothing will ever use. Such a pair must not linger (a token holds
//! a bounded number of objects, and an operator cannot tell it from a key in use), yet another process
//! sharing the token (a replica, `meshca issue --mesh`) may be between the same two steps right now.
//!
//! So a new pair is labelled as *pending* with who made it and when:
//! `meshca-pending <unix seconds> <boot id> <pid namespace> <pid>`. Once its record is written it is
//! labelled for good (a CA's key with the CA's id). At start, [`Token::settle_pending_keys`] looks at every
//! pending pair: one a record names is finished (labelled as the record says); one no record names is
//! destroyed when its maker is gone, that is, made in this boot and pid namespace by a process that no
//! longer runs, or made more than [`ABANDONED_AFTER`] ago (a maker elsewhere, or before a reboot). A maker
//! still at work is never touched.

use std::collections::HashMap;
use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cryptoki::object::{Attribute, AttributeType, ObjectClass};

use crate::error::HsmError;
use crate::token::Token;

/// How a pending label starts.
const PREFIX: &str = "meshca-pending ";

/// After how long a pending pair whose maker cannot be asked is taken as abandoned: making a key and
/// recording it takes seconds.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(3600);

/// Who made a pending pair, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Maker {
    made: u64,
    boot_id: String,
    pid_namespace: u64,
    pid: u32,
}

impl Maker {
    /// This process, now.
    pub(crate) fn this_process() -> Maker {
        Maker {
            made: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            boot_id: boot_id(),
            pid_namespace: pid_namespace(),
            pid: std::process::id(),
        }
    }

    /// The label of a pair this maker is making.
    pub(crate) fn label(&self) -> String {
        format!(
            "{PREFIX}{} {} {} {}",
            self.made, self.boot_id, self.pid_namespace, self.pid
        )
    }

    /// The maker a pending label names; `None` for any other label.
    pub(crate) fn parse(label: &str) -> Option<Maker> {
        let mut fields = label.strip_prefix(PREFIX)?.split(' ');
        let maker = Maker {
            made: fields.next()?.parse().ok()?,
            boot_id: fields.next().filter(|b| !b.is_empty())?.to_owned(),
            pid_namespace: fields.next()?.parse().ok()?,
            pid: fields.next()?.parse().ok()?,
        };
        fields.next().is_none().then_some(maker)
    }

    /// Whether the maker is gone, as seen by `here` at `now`.
    fn is_gone(&self, here: &Maker, process_runs: impl Fn(u32) -> bool) -> bool {
        let age = here.made.saturating_sub(self.made);
        if age > ABANDONED_AFTER.as_secs() {
            return true;
        }
        let same_view = self.boot_id == here.boot_id
            && self.pid_namespace == here.pid_namespace
            && here.pid_namespace != 0;
        same_view && self.pid != here.pid && !process_runs(self.pid)
    }
}

impl fmt::Display for Maker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} at {} (unix time)", self.pid, self.made)
    }
}

/// What [`Token::settle_pending_keys`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Pairs a record names, now labelled as it says.
    pub finished: usize,
    /// Pairs no record names whose maker is gone, destroyed.
    pub destroyed: usize,
    /// Pairs no record names whose maker may still be at work, left alone.
    pub in_progress: usize,
}

impl Token {
    /// Finishes or destroys the pending pairs of the token (see the module doc). `recorded` maps the
    /// `CKA_ID` of every key a record names to the label the record gives it.
    pub fn settle_pending_keys(
        &self,
        recorded: &HashMap<Vec<u8>, String>,
    ) -> Result<Settled, HsmError> {
        let here = Maker::this_process();
        let pending = self.run("listing pending keys", |_, session| {
            let mut found: HashMap<Vec<u8>, String> = HashMap::new();
            for class in [ObjectClass::PRIVATE_KEY, ObjectClass::PUBLIC_KEY] {
                for object in session.find_objects(&[Attribute::Class(class)])? {
                    let attributes = session
                        .get_attributes(object, &[AttributeType::Label, AttributeType::Id])?;
                    let (mut label, mut id) = (None, None);
                    for attribute in attributes {
                        match attribute {
                            Attribute::Label(l) => label = Some(l),
                            Attribute::Id(i) => id = Some(i),
                            _ => {}
                        }
                    }
                    let label = label.map(|l| String::from_utf8_lossy(&l).into_owned());
                    if let (Some(label), Some(id)) = (label, id) {
                        if label.starts_with(PREFIX) {
                            found.insert(id, label);
                        }
                    }
                }
            }
            Ok(found)
        })?;
        let mut settled = Settled::default();
        for (id, label) in pending {
            if let Some(final_label) = recorded.get(&id) {
                self.label_objects(&id, final_label)?;
                tracing::info!(token = %self.label(), id = %hex::encode(&id), label = %final_label,
                    "a key made in the PKCS#11 token was recorded but not yet labelled when its maker stopped: labelled now");
                settled.finished += 1;
                continue;
            }
            let Some(maker) = Maker::parse(&label) else {
                continue;
            };
            if maker.is_gone(&here, process_runs) {
                self.destroy_keys(&id)?;
                tracing::warn!(token = %self.label(), id = %hex::encode(&id), made_by = %maker,
                    "destroyed a key pair in the PKCS#11 token that its maker left unrecorded (killed between making it and recording it); it was never used");
                settled.destroyed += 1;
            } else {
                settled.in_progress += 1;
            }
        }
        Ok(settled)
    }

    /// Labels the key pair with the id `id` as pending by this process again, before its record is
    /// deleted and it is destroyed: a kill in between leaves a pair that a start finishes (the record
    /// still names it) or destroys (it does not).
    pub fn mark_pending(&self, id: &[u8]) -> Result<(), HsmError> {
        self.label_objects(id, &Maker::this_process().label())
    }

    /// Labels every object whose `CKA_ID` is `id` with `label`.
    pub(crate) fn label_objects(&self, id: &[u8], label: &str) -> Result<(), HsmError> {
        let template = [Attribute::Label(label.as_bytes().to_vec())];
        self.run("labelling a key", |_, session| {
            for object in session.find_objects(&[Attribute::Id(id.to_vec())])? {
                session.update_attributes(object, &template)?;
            }
            Ok(())
        })
    }
}

/// Whether a process `pid` runs in this pid namespace.
fn process_runs(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`), or `-` where the kernel gives none.
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty() && !id.contains(' '))
        .unwrap_or_else(|| "-".to_owned())
}

/// This process's pid namespace (the inode of `/proc/self/ns/pid`), or 0 where it cannot be read: then
/// no maker is judged by its pid.
fn pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn maker(made: u64, pid: u32) -> Maker {
        Maker {
            made,
            boot_id: "b00t".into(),
            pid_namespace: 7,
            pid,
        }
    }

    #[test]
    fn a_label_names_its_maker() {
        let me = Maker::this_process();
        assert_eq!(Maker::parse(&me.label()), Some(me.clone()));
        assert!(me.label().starts_with("meshca-pending "));
        for other in [
            "meshca-pending",
            "meshca-pending 1 b 2",
            "meshca-pending 1 b 2 3 4",
            "meshca-pending x b 2 3",
            "meshca-pending 1  2 3",
            "0123abcd",
            "ca-1",
        ] {
            assert_eq!(Maker::parse(other), None, "{other}");
        }
    }

    #[test]
    fn a_maker_is_gone_when_its_process_ended_here_or_it_is_old() {
        let here = maker(10_000, 100);
        let runs = |pid| pid == 200;
        assert!(maker(9_990, 300).is_gone(&here, runs), "ended here");
        assert!(!maker(9_990, 200).is_gone(&here, runs), "still runs here");
        assert!(!maker(9_990, 100).is_gone(&here, runs), "this very process");
        let elsewhere = Maker {
            boot_id: "other".into(),
            ..maker(9_990, 300)
        };
        assert!(!elsewhere.is_gone(&here, runs), "another host, recent");
        let other_namespace = Maker {
            pid_namespace: 8,
            ..maker(9_990, 300)
        };
        assert!(!other_namespace.is_gone(&here, runs), "another container");
        let old = Maker {
            boot_id: "other".into(),
            ..maker(10_000 - ABANDONED_AFTER.as_secs() - 1, 200)
        };
        assert!(old.is_gone(&here, runs), "abandoned long ago");
    }

    proptest! {
        #[test]
        fn any_label_parses_or_is_left_alone(label in ".{0,80}") {
            if let Some(maker) = Maker::parse(&label) {
                prop_assert_eq!(Maker::parse(&maker.label()), Some(maker));
            }
        }
    }
}
