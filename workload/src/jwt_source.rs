//! Where a Workload API socket's JWT-SVIDs come from: signed here with the trust domains' keys
//! ([`JwtKeys`], `meshca serve`), or by a remote meshca server that holds them (`meshca agent`,
//! which publishes the server's JWK Sets and asks it for each token).

use std::sync::Arc;

use futures::future::BoxFuture;
use meshca_control::Registration;
use tokio::sync::watch;
use tonic::Status;

use crate::jwt_keys::{JwtKeys, KeySet};

/// Mints JWT-SVIDs elsewhere: the server that holds the signing keys.
pub trait JwtMinter: Send + Sync + 'static {
    /// A JWT-SVID of `registration`'s identity for `audience` (compact JWS). The error is what the
    /// caller gets (`UNAVAILABLE` while no server answers).
    fn mint(
        &self,
        registration: &Registration,
        audience: &[String],
    ) -> BoxFuture<'static, Result<String, Status>>;
}

/// JWT-SVIDs signed by a remote server.
#[derive(Clone)]
pub struct RemoteJwt {
    /// The JWK Sets the server publishes, by bare trust domain name (what `FetchJWTBundles` sends
    /// and `ValidateJWTSVID` checks against).
    pub keys: watch::Receiver<Arc<KeySet>>,
    /// Who signs.
    pub minter: Arc<dyn JwtMinter>,
}

impl std::fmt::Debug for RemoteJwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteJwt").finish_non_exhaustive()
    }
}

/// Where JWT-SVIDs come from.
#[derive(Clone, Debug)]
pub enum JwtSource {
    /// Signed here.
    Local(JwtKeys),
    /// Signed by a remote server.
    Remote(RemoteJwt),
}

impl JwtSource {
    /// The keys published now.
    pub(crate) fn current(&self) -> Arc<KeySet> {
        match self {
            JwtSource::Local(keys) => keys.current(),
            JwtSource::Remote(remote) => remote.keys.borrow().clone(),
        }
    }

    /// Every change of the keys published.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Arc<KeySet>> {
        match self {
            JwtSource::Local(keys) => keys.subscribe(),
            JwtSource::Remote(remote) => remote.keys.clone(),
        }
    }

    /// The local keys, when they are local.
    pub(crate) fn local(&self) -> Option<&JwtKeys> {
        match self {
            JwtSource::Local(keys) => Some(keys),
            JwtSource::Remote(_) => None,
        }
    }
}
