//! The one table of SDS resource names (docs/architecture.md, "Resource names").
//!
//! A name is parsed once, when a request brings it, into a [`ResourceName`]; its meaning for one proxy is
//! [`ResourceName::target`]. The SDS streams, the fetch path and the rollout gate all read names through
//! this table, so they cannot disagree about what a name carries.

use std::fmt;

use crate::snapshot::{ProxyIdentity, ProxyKey};
use crate::trust::BundleKey;

const DEFAULT: &str = "default";
const SYSTEM_TRUST_BUNDLE: &str = "system_trust_bundle";
const ROOTCA: &str = "ROOTCA";
const SYSTEM_TRUST_BUNDLE_PREFIX: &str = "system_trust_bundle_";
const EGRESS_BUNDLE_NAME: &str = "system_trust_bundle_egress";
const ALL: &str = "ALL";
const MESH_CA_ALL: &str = "mesh_ca:secret:all";
const MESH_CA_PREFIX: &str = "mesh_ca:secret:";
const IDENTITY_CERT_PREFIX: &str = "identity_cert:secret:";
const MESH_SERVICE_PREFIX: &str = "meshservice:";

/// The form of a resource name, without its argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NameKind {
    /// `default`: the proxy's own identity.
    Identity,
    /// `identity_cert:secret:<mesh>`: the proxy's own identity under Kuma's legacy name.
    LegacyIdentity,
    /// Any other name: the proxy's SPIFFE ID or its MeshIdentity's name mean its identity; anything
    /// else is unknown.
    IdentityAlias,
    /// `system_trust_bundle` or `ROOTCA`: every CA trusted in the proxy's mesh.
    OwnMeshTrust,
    /// `system_trust_bundle_<mesh>`: the trust of one mesh.
    MeshTrust,
    /// `mesh_ca:secret:<mesh>`: the trust of one mesh as plain `trusted_ca` (Kuma's legacy name).
    LegacyMeshTrust,
    /// `ALL`: the trust of every mesh and trust domain.
    AllTrust,
    /// `mesh_ca:secret:all`: `ALL` as plain `trusted_ca` (Kuma's legacy name).
    LegacyAllTrust,
    /// `system_trust_bundle_egress`: the CAs that validate the zone egress identity.
    EgressTrust,
    /// `meshservice:<name>`: the mesh trust plus the SPIFFE IDs one MeshService presents.
    MeshService,
}

/// A resource name as a proxy asked for it, with its parsed form. Responses carry [`Self::as_str`]
/// exactly: Envoy rejects a resource named otherwise than it asked.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ResourceName {
    text: Box<str>,
    kind: NameKind,
}

/// Whose trust a validation context carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrustScope<'a> {
    /// One mesh's trust.
    Mesh(&'a str),
    /// The trust of every mesh.
    All,
    /// The CAs of the zone egress identity.
    Egress,
}

impl TrustScope<'_> {
    /// Whether a context of this scope must carry a CA that `bundle` publishes.
    pub fn carries_mesh(&self, bundle: &BundleKey) -> bool {
        match (self, bundle) {
            (TrustScope::Mesh(m), BundleKey::Mesh(mesh)) => *m == mesh.as_str(),
            (TrustScope::All, BundleKey::Mesh(_)) => true,
            // The egress bundle carries the egress identity's CAs only, never a mesh's whole trust.
            (TrustScope::Egress, BundleKey::Egress) => true,
            _ => false,
        }
    }
}

/// What a name means for one proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target<'a> {
    /// The proxy's own identity (certificate chain and key).
    Identity,
    /// A validation context holding the trust of `scope`; `plain` forces `trusted_ca` whatever the
    /// proxy prefers.
    Trust {
        /// Whose trust.
        scope: TrustScope<'a>,
        /// Kuma's legacy names always use plain `trusted_ca`.
        plain: bool,
    },
    /// The `meshservice:` context of service `service` in mesh `mesh` (always the proxy's own).
    MeshService {
        /// The proxy's mesh.
        mesh: &'a str,
        /// The MeshService name.
        service: &'a str,
    },
    /// Not a name this proxy may ask for.
    Unknown,
}

/// Who asks for a name: the proxy and whether it is a zone egress (which may ask for any mesh's trust).
#[derive(Clone, Copy, Debug)]
pub struct Asker<'a> {
    /// The proxy.
    pub key: &'a ProxyKey,
    /// Zone egress proxies serve every mesh.
    pub zone_egress: bool,
}

impl ResourceName {
    /// Parses a name. Every string is a name; [`Self::target`] tells whether it means anything to a proxy.
    pub fn parse(text: impl Into<String>) -> ResourceName {
        let text: String = text.into();
        let kind = match text.as_str() {
            DEFAULT => NameKind::Identity,
            SYSTEM_TRUST_BUNDLE | ROOTCA => NameKind::OwnMeshTrust,
            EGRESS_BUNDLE_NAME => NameKind::EgressTrust,
            ALL => NameKind::AllTrust,
            MESH_CA_ALL => NameKind::LegacyAllTrust,
            t if t.starts_with(IDENTITY_CERT_PREFIX) => NameKind::LegacyIdentity,
            t if t.starts_with(SYSTEM_TRUST_BUNDLE_PREFIX) => NameKind::MeshTrust,
            t if t.starts_with(MESH_CA_PREFIX) => NameKind::LegacyMeshTrust,
            t if t.starts_with(MESH_SERVICE_PREFIX) => NameKind::MeshService,
            _ => NameKind::IdentityAlias,
        };
        ResourceName {
            text: text.into_boxed_str(),
            kind,
        }
    }

    /// The name exactly as asked.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Its form.
    pub fn kind(&self) -> NameKind {
        self.kind
    }

    /// What follows the prefix of a name with an argument (a mesh or a MeshService name).
    fn argument(&self) -> &str {
        let prefix = match self.kind {
            NameKind::LegacyIdentity => IDENTITY_CERT_PREFIX,
            NameKind::MeshTrust => SYSTEM_TRUST_BUNDLE_PREFIX,
            NameKind::LegacyMeshTrust => MESH_CA_PREFIX,
            NameKind::MeshService => MESH_SERVICE_PREFIX,
            _ => "",
        };
        &self.text[prefix.len()..]
    }

    /// What this name means for `asker`, whose current identity is `identity` (if it has one).
    ///
    /// An alias means the identity when it is the proxy's SPIFFE ID or MeshIdentity name. Before the
    /// proxy has an identity, a `spiffe://` alias is taken as its identity (not available yet) and any
    /// other alias is unknown.
    pub fn target<'a>(&'a self, asker: Asker<'a>, identity: Option<&ProxyIdentity>) -> Target<'a> {
        let own_mesh = &*asker.key.mesh;
        let trust = |scope, plain| Target::Trust { scope, plain };
        match self.kind {
            NameKind::Identity => Target::Identity,
            NameKind::LegacyIdentity if self.argument() == own_mesh => Target::Identity,
            NameKind::LegacyIdentity => Target::Unknown,
            NameKind::IdentityAlias => match identity {
                Some(id)
                    if id.spiffe_id == *self.text
                        || id.identity_name.as_deref() == Some(&*self.text) =>
                {
                    Target::Identity
                }
                Some(_) => Target::Unknown,
                None if self.text.starts_with("spiffe://") => Target::Identity,
                None => Target::Unknown,
            },
            NameKind::OwnMeshTrust => trust(TrustScope::Mesh(own_mesh), false),
            NameKind::MeshTrust | NameKind::LegacyMeshTrust => {
                let mesh = self.argument();
                if mesh == own_mesh || asker.zone_egress {
                    trust(
                        TrustScope::Mesh(mesh),
                        self.kind == NameKind::LegacyMeshTrust,
                    )
                } else {
                    Target::Unknown
                }
            }
            NameKind::AllTrust => trust(TrustScope::All, false),
            NameKind::LegacyAllTrust => trust(TrustScope::All, true),
            NameKind::EgressTrust => trust(TrustScope::Egress, false),
            NameKind::MeshService => Target::MeshService {
                mesh: own_mesh,
                service: self.argument(),
            },
        }
    }

    /// Whether this name may mean `asker`'s identity, whichever identity it holds: [`Self::target`]
    /// without looking at the identity, for which an alias (a SPIFFE ID or MeshIdentity name) counts.
    pub fn may_name_identity(&self, asker: Asker<'_>) -> bool {
        match self.kind {
            NameKind::Identity | NameKind::IdentityAlias => true,
            NameKind::LegacyIdentity => self.argument() == &*asker.key.mesh,
            _ => false,
        }
    }

    /// Whether a stream subscribed to this name must carry a CA of `mesh` (the gate's "trust before
    /// identity" waits for such streams).
    pub fn carries_mesh_trust(&self, asker: Asker<'_>, mesh: &BundleKey) -> bool {
        match self.target(asker, None) {
            Target::Trust { scope, .. } => scope.carries_mesh(mesh),
            Target::MeshService { mesh: own, .. } => mesh.is_mesh(own),
            Target::Identity | Target::Unknown => false,
        }
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.text, f)
    }
}

/// The names of a request, parsed, in order, without repeats.
pub fn parse_names(names: Vec<String>) -> Vec<ResourceName> {
    let mut seen = std::collections::HashSet::with_capacity(names.len());
    names
        .into_iter()
        .filter(|name| seen.insert(name.clone()))
        .map(ResourceName::parse)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::SecretPem;

    fn key(mesh: &str) -> ProxyKey {
        ProxyKey::new(mesh, "p")
    }

    fn sidecar(key: &ProxyKey) -> Asker<'_> {
        Asker {
            key,
            zone_egress: false,
        }
    }

    /// A name that lives as long as the test (a target borrows from its name).
    fn leak(name: &str) -> &'static ResourceName {
        Box::leak(Box::new(ResourceName::parse(name)))
    }

    fn identity() -> ProxyIdentity {
        ProxyIdentity {
            spiffe_id: "spiffe://a/web".into(),
            identity_name: Some("workloads".into()),
            chain_pem: String::new(),
            key: crate::LeafKey::Held(SecretPem::new(String::new())),
        }
    }

    #[test]
    fn every_name_of_the_table_has_its_meaning() {
        let k = key("a");
        let id = identity();
        let target = |n: &str| leak(n).target(sidecar(&k), Some(&id));
        let mesh = |m| Target::Trust {
            scope: TrustScope::Mesh(m),
            plain: false,
        };
        assert_eq!(target("default"), Target::Identity);
        assert_eq!(target("spiffe://a/web"), Target::Identity);
        assert_eq!(target("workloads"), Target::Identity);
        assert_eq!(target("identity_cert:secret:a"), Target::Identity);
        assert_eq!(target("identity_cert:secret:b"), Target::Unknown);
        assert_eq!(target("system_trust_bundle"), mesh("a"));
        assert_eq!(target("ROOTCA"), mesh("a"));
        assert_eq!(target("system_trust_bundle_a"), mesh("a"));
        assert_eq!(target("system_trust_bundle_b"), Target::Unknown);
        assert_eq!(
            target("mesh_ca:secret:a"),
            Target::Trust {
                scope: TrustScope::Mesh("a"),
                plain: true
            }
        );
        assert_eq!(
            target("ALL"),
            Target::Trust {
                scope: TrustScope::All,
                plain: false
            }
        );
        assert_eq!(
            target("mesh_ca:secret:all"),
            Target::Trust {
                scope: TrustScope::All,
                plain: true
            }
        );
        assert_eq!(
            target("system_trust_bundle_egress"),
            Target::Trust {
                scope: TrustScope::Egress,
                plain: false
            }
        );
        assert_eq!(
            target("meshservice:web"),
            Target::MeshService {
                mesh: "a",
                service: "web"
            }
        );
        assert_eq!(target("spiffe://a/other"), Target::Unknown);
        assert_eq!(target("nonsense"), Target::Unknown);
        assert_eq!(target(""), Target::Unknown);
    }

    #[test]
    fn an_egress_may_ask_for_any_mesh_and_a_sidecar_only_for_its_own() {
        let k = key("a");
        let egress = Asker {
            key: &k,
            zone_egress: true,
        };
        let name = ResourceName::parse("system_trust_bundle_b");
        assert_eq!(
            name.target(egress, None),
            Target::Trust {
                scope: TrustScope::Mesh("b"),
                plain: false
            }
        );
        assert_eq!(name.target(sidecar(&k), None), Target::Unknown);
    }

    #[test]
    fn before_an_identity_exists_only_spiffe_aliases_mean_the_identity() {
        let k = key("a");
        let target = |n: &str| leak(n).target(sidecar(&k), None);
        assert_eq!(target("spiffe://a/web"), Target::Identity);
        assert_eq!(target("workloads"), Target::Unknown);
    }

    #[test]
    fn the_egress_bundle_is_not_the_trust_of_a_mesh_named_egress() {
        let k = key("default");
        let name = ResourceName::parse("system_trust_bundle_egress");
        assert_eq!(name.kind(), NameKind::EgressTrust);
        assert!(!name.carries_mesh_trust(sidecar(&k), &BundleKey::mesh("egress")));
        assert!(!name.carries_mesh_trust(sidecar(&k), &BundleKey::mesh("default")));
        let egress_mesh = key("egress");
        assert!(
            !name.carries_mesh_trust(sidecar(&egress_mesh), &BundleKey::mesh("egress")),
            "even for a proxy of a mesh named egress"
        );
        assert!(name.carries_mesh_trust(sidecar(&k), &BundleKey::Egress));
    }

    #[test]
    fn unknown_names_carry_no_trust_and_are_no_identity() {
        let k = key("a");
        for n in [
            "nonsense",
            "system_trust_bundle_b",
            "identity_cert:secret:b",
        ] {
            let name = ResourceName::parse(n);
            assert!(
                !name.carries_mesh_trust(sidecar(&k), &BundleKey::mesh("a")),
                "{n}"
            );
            assert!(
                !name.carries_mesh_trust(sidecar(&k), &BundleKey::mesh("b")),
                "{n}"
            );
            assert_eq!(name.target(sidecar(&k), Some(&identity())), Target::Unknown);
        }
    }

    #[test]
    fn trust_names_carry_exactly_their_meshes() {
        let k = key("a");
        let carries = |n: &str, m: &str| {
            ResourceName::parse(n).carries_mesh_trust(sidecar(&k), &BundleKey::mesh(m))
        };
        assert!(carries("system_trust_bundle", "a"));
        assert!(!carries("system_trust_bundle", "b"));
        assert!(carries("ALL", "b"));
        assert!(carries("mesh_ca:secret:all", "b"));
        assert!(carries("meshservice:web", "a"));
        assert!(!carries("meshservice:web", "b"));
        assert!(!carries("default", "a"));
    }

    #[test]
    fn repeats_are_dropped_and_order_kept() {
        let names = parse_names(vec!["b".into(), "a".into(), "b".into()]);
        let texts: Vec<&str> = names.iter().map(ResourceName::as_str).collect();
        assert_eq!(texts, ["b", "a"]);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Names as a hostile proxy might send them: known prefixes with arbitrary tails, or anything.
        fn any_name() -> impl Strategy<Value = String> {
            let prefix = prop_oneof![
                Just(""),
                Just("default"),
                Just("identity_cert:secret:"),
                Just("system_trust_bundle"),
                Just("system_trust_bundle_"),
                Just("mesh_ca:secret:"),
                Just("meshservice:"),
                Just("spiffe://a/"),
                Just("ALL"),
            ];
            (prefix, any::<String>()).prop_map(|(p, tail)| format!("{p}{tail}"))
        }

        proptest! {
            #[test]
            fn a_name_is_served_back_exactly_and_never_reaches_another_proxy_or_mesh(
                text in any_name(),
            ) {
                let name = ResourceName::parse(text.clone());
                prop_assert_eq!(name.as_str(), text.as_str());
                prop_assert_eq!(ResourceName::parse(name.to_string()).kind(), name.kind());
                let k = key("a");
                let id = identity();
                match name.target(sidecar(&k), Some(&id)) {
                    Target::Identity => prop_assert!(
                        ["default", "spiffe://a/web", "workloads", "identity_cert:secret:a"]
                            .contains(&text.as_str()),
                        "{text:?} means this proxy's identity"
                    ),
                    Target::Trust { scope: TrustScope::Mesh(mesh), .. } => {
                        prop_assert_eq!(mesh, "a", "{:?} carries another mesh's trust", text);
                    }
                    _ => {}
                }
            }
        }
    }
}
