//! How a proxy is named everywhere: [`ProxyKey`] (its mesh and name), and the maps and sets keyed by it.

use std::fmt;
use std::sync::Arc;

/// Identifies one proxy: the mesh it belongs to and its name within the mesh.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct ProxyKey {
    /// The mesh, as named in the proxy's token.
    pub mesh: Arc<str>,
    /// The proxy (dataplane or zone egress) name, as named in the proxy's token.
    pub name: Arc<str>,
}

impl ProxyKey {
    /// Builds a key from its parts. Clones share them: a proxy's key is in a dozen maps.
    pub fn new(mesh: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        Self {
            mesh: mesh.into(),
            name: name.into(),
        }
    }

    /// The Envoy node id a proxy with this key must present: `<mesh>.<name>`.
    pub fn node_id(&self) -> String {
        format!("{}.{}", self.mesh, self.name)
    }
}

impl fmt::Display for ProxyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.mesh, self.name)
    }
}

/// How maps keyed by proxy hash their keys (and the owner's maps looked up once per proxy or certificate,
/// keyed by CA id, CA subject or mesh name): foldhash, seeded at random per process. A key is hashed on
/// every lookup, several per proxy and event, and SipHash (the standard library's) was a tenth of the
/// owner's time in a 100,000-proxy rotation. The keys come from the operator's files, the CAs and tokens
/// the daemon verified, so the hash needs no more resistance to chosen collisions than a random seed
/// gives.
pub type KeyHasher = foldhash::fast::RandomState;

/// A map keyed by proxy, with [`KeyHasher`].
pub type ProxyHashMap<V> = std::collections::HashMap<ProxyKey, V, KeyHasher>;

/// A set of proxies, with [`KeyHasher`].
pub type ProxyHashSet = std::collections::HashSet<ProxyKey, KeyHasher>;

/// A map keyed by proxy. Persistent: a snapshot that changes a few proxies shares every other entry with
/// the one before, so publishing costs the change, not the size of the fleet.
pub type ProxyMap<V> =
    imbl::GenericHashMap<ProxyKey, V, KeyHasher, imbl::shared_ptr::DefaultSharedPtr>;
