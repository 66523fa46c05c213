//! The Workload API's registrations, as a snapshot carries them.
//!
//! A `WorkloadRegistration` resource says which local processes (by the selectors the kernel gives
//! their socket) act as which Dataplane. The Workload API server reads this table from each snapshot:
//! a caller gets the identity of every registration whose selectors it has, and its streams speak for
//! those Dataplanes to the owner, so the rollout gate counts them as it counts SDS streams.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use meshca_config::{Resources, Selector, SelectorKind};

use crate::proxy_key::{ProxyHashMap, ProxyKey};

/// One registration, resolved against its Dataplane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The registration's name (unique within its mesh).
    pub name: String,
    /// The Dataplane whose identity it serves; its mesh is the registration's mesh.
    pub proxy: ProxyKey,
    /// The selectors a caller must all have (`unix:uid:1001`, ...).
    pub selectors: Vec<Selector>,
    /// The agent whose host serves it; `None` for the server's own Workload API socket.
    pub agent: Option<String>,
    /// The hint sent with its SVIDs, if any.
    pub hint: Option<String>,
    /// How long its JWT-SVIDs are valid.
    pub jwt_svid_expiry: Duration,
    /// The Dataplane's labels, which its streams claim (they select the MeshIdentity).
    pub labels: meshca_auth::Labels,
}

/// How long the claims a registration's streams present for its Dataplane last: the life of the stream
/// that presents them is what bounds them (they are never a token anyone holds).
const STREAM_CLAIMS_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

impl Registration {
    /// What a stream serving this registration (a Workload API caller's, or an agent's) is, to the owner:
    /// its Dataplane, with the Dataplane's labels (which select its MeshIdentity). The claims are no token
    /// anyone holds; only the life of the stream that presents them bounds them.
    pub fn dataplane_claims(
        &self,
        now_unix: u64,
    ) -> Result<meshca_auth::Claims, meshca_auth::AuthError> {
        meshca_auth::Claims::new(
            meshca_auth::ProxyType::Dataplane,
            &*self.proxy.mesh,
            &*self.proxy.name,
            self.labels.to_btree_map(),
            Default::default(),
            STREAM_CLAIMS_VALIDITY,
            now_unix,
        )
    }

    /// Whether a caller with these selectors matches: it has every one of the registration's.
    pub fn matches(&self, has: impl Fn(&Selector) -> bool) -> bool {
        self.selectors.iter().all(has)
    }
}

/// Every registration of the accepted resources, in the order callers see them: by name, then mesh.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Registrations {
    list: Vec<Arc<Registration>>,
    /// The agent of every agent-served Dataplane.
    agents: ProxyHashMap<Arc<str>>,
}

impl Registrations {
    /// The registrations of `resources`, each with its Dataplane's labels (the resources were checked:
    /// every registration names a Dataplane of its mesh).
    pub fn from_resources(resources: &Resources) -> Registrations {
        let labels: BTreeMap<(&str, &str), meshca_auth::Labels> = resources
            .dataplanes
            .iter()
            .map(|d| {
                (
                    (d.mesh.as_str(), d.name.as_str()),
                    Arc::new(d.labels.clone().into()),
                )
            })
            .collect();
        let list: Vec<Arc<Registration>> = resources
            .workload_registrations
            .iter()
            .map(|r| {
                Arc::new(Registration {
                    name: r.name.clone(),
                    proxy: ProxyKey::new(r.mesh.as_str(), r.dataplane.as_str()),
                    selectors: r.selectors.clone(),
                    agent: r.agent.clone(),
                    hint: r.hint.clone(),
                    jwt_svid_expiry: r.jwt_svid_expiry,
                    labels: labels
                        .get(&(r.mesh.as_str(), r.dataplane.as_str()))
                        .cloned()
                        .unwrap_or_default(),
                })
            })
            .collect();
        Registrations::sorted(list)
    }

    /// The table of `list`: sorted, with the agent of each Dataplane indexed.
    fn sorted(mut list: Vec<Arc<Registration>>) -> Registrations {
        list.sort_by(|a, b| (&a.name, &a.proxy.mesh).cmp(&(&b.name, &b.proxy.mesh)));
        let agents = list
            .iter()
            .filter_map(|r| Some((r.proxy.clone(), Arc::from(r.agent.as_deref()?))))
            .collect();
        Registrations { list, agents }
    }

    /// A table of exactly these registrations, sorted as [`Registrations::from_resources`] sorts them.
    pub fn new(list: Vec<Registration>) -> Registrations {
        Registrations::sorted(list.into_iter().map(Arc::new).collect())
    }

    /// Every registration.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Registration>> {
        self.list.iter()
    }

    /// The Dataplanes of the registrations that `newer` has and this table has not, or has otherwise
    /// (an agent, selectors, labels changed), and of those it dropped.
    pub fn changed_proxies(&self, newer: &Registrations) -> BTreeSet<ProxyKey> {
        let key = |r: &Arc<Registration>| (r.name.clone(), r.proxy.mesh.clone());
        let old: BTreeMap<_, &Arc<Registration>> = self.list.iter().map(|r| (key(r), r)).collect();
        let mut kept = BTreeSet::new();
        let mut changed = BTreeSet::new();
        for r in &newer.list {
            let name = key(r);
            match old.get(&name) {
                Some(before) if **before == *r => {}
                Some(before) => {
                    changed.insert(before.proxy.clone());
                    changed.insert(r.proxy.clone());
                }
                None => {
                    changed.insert(r.proxy.clone());
                }
            }
            kept.insert(name);
        }
        let dropped = old.iter().filter(|(name, _)| !kept.contains(*name));
        changed.extend(dropped.map(|(_, r)| r.proxy.clone()));
        changed
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The agent that serves `proxy`'s registrations, when one does: that Dataplane's keys are made
    /// and held on the agent's host (the resources were checked: all the registrations of one
    /// Dataplane name the same agent, or none).
    pub fn agent_of(&self, proxy: &ProxyKey) -> Option<&str> {
        self.agents.get(proxy).map(|agent| &**agent)
    }

    /// The registrations served by `agent` (`None`: the server's own socket) that a caller with the
    /// selectors `has` says it has matches, in order: the first is the caller's default identity.
    pub fn matching(
        &self,
        agent: Option<&str>,
        has: impl Fn(&Selector) -> bool,
    ) -> Vec<Arc<Registration>> {
        self.list
            .iter()
            .filter(|r| r.agent.as_deref() == agent && r.matches(&has))
            .cloned()
            .collect()
    }

    /// Whether a caller's selector of `kind` could decide whether a registration served by `agent`
    /// matches it: some registration names a `kind` selector, and the caller has (by `has`) every
    /// other selector it names. When none could, that selector need not be computed (a binary's
    /// digest costs a read of the whole binary).
    pub fn could_be_decided_by(
        &self,
        agent: Option<&str>,
        kind: SelectorKind,
        has: impl Fn(&Selector) -> bool,
    ) -> bool {
        self.list.iter().any(|r| {
            r.agent.as_deref() == agent
                && r.selectors.iter().any(|s| s.kind() == kind)
                && r.selectors.iter().filter(|s| s.kind() != kind).all(&has)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(name: &str, dataplane: &str, agent: Option<&str>) -> Registration {
        Registration {
            name: name.to_owned(),
            proxy: ProxyKey::new("default", dataplane),
            selectors: vec!["unix:uid:1".parse().expect("a selector")],
            agent: agent.map(str::to_owned),
            hint: None,
            jwt_svid_expiry: Duration::from_secs(300),
            labels: meshca_auth::Labels::default(),
        }
    }

    #[test]
    fn changed_proxies_name_the_dataplanes_of_added_changed_moved_and_dropped_registrations() {
        let names = |set: BTreeSet<ProxyKey>| {
            set.into_iter()
                .map(|k| k.name.to_string())
                .collect::<Vec<_>>()
        };
        let old = Registrations::new(vec![
            registration("kept", "web-1", None),
            registration("agent", "web-2", None),
            registration("moved", "web-3", None),
            registration("dropped", "web-4", None),
        ]);
        let new = Registrations::new(vec![
            registration("kept", "web-1", None),
            registration("agent", "web-2", Some("host-1")),
            registration("moved", "web-5", None),
            registration("added", "web-6", None),
        ]);
        assert_eq!(
            names(old.changed_proxies(&new)),
            ["web-2", "web-3", "web-4", "web-5", "web-6"]
        );
        assert!(old.changed_proxies(&old).is_empty());
    }

    #[test]
    fn a_dataplane_is_agent_served_when_its_registrations_name_an_agent() {
        let registrations = Registrations::new(vec![
            registration("b", "web-1", Some("host-1")),
            registration("a", "web-1", Some("host-1")),
            registration("c", "web-2", None),
        ]);
        assert_eq!(
            registrations.agent_of(&ProxyKey::new("default", "web-1")),
            Some("host-1")
        );
        assert_eq!(
            registrations.agent_of(&ProxyKey::new("default", "web-2")),
            None
        );
        assert_eq!(
            registrations.agent_of(&ProxyKey::new("other", "web-1")),
            None
        );
        let names: Vec<&str> = registrations.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    #[test]
    fn a_digest_is_wanted_only_where_it_could_decide_a_match() {
        let with = |name: &str, selectors: &[&str], agent: Option<&str>| Registration {
            selectors: selectors
                .iter()
                .map(|s| s.parse().expect("a selector"))
                .collect(),
            ..registration(name, "dp", agent)
        };
        let digest = "unix:sha256:".to_owned() + &"ab".repeat(32);
        let registrations = Registrations::new(vec![
            with("a", &["unix:uid:1"], None),
            with("b", &["unix:uid:2", &digest], None),
            with("c", &["unix:uid:3", &digest], Some("host-1")),
        ]);
        let caller = |uid: &'static str| move |s: &Selector| s.to_string() == uid;
        let sha = SelectorKind::Sha256;
        assert!(registrations.could_be_decided_by(None, sha, caller("unix:uid:2")));
        assert!(!registrations.could_be_decided_by(None, sha, caller("unix:uid:1")));
        assert!(
            !registrations.could_be_decided_by(None, sha, caller("unix:uid:3")),
            "another agent's"
        );
        assert!(registrations.could_be_decided_by(Some("host-1"), sha, caller("unix:uid:3")));
        assert!(!registrations.could_be_decided_by(None, SelectorKind::Path, caller("unix:uid:2")));
    }
}
