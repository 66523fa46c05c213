//! The state every SDS stream of one server shares: the hub it stands on, the registry of open streams,
//! and the checks every stream and fetch makes.

use meshca_auth::{Claims, ProxyType};
use meshca_serve::{shown, HubOptions, StreamLimits, StreamMetrics};
use tonic::Status;

use meshca_serve::Hub;

use crate::registry::StreamRegistry;

/// State shared by every stream of one server.
pub(crate) struct Shared {
    pub(crate) hub: Hub,
    pub(crate) registry: StreamRegistry,
}

impl Shared {
    pub(crate) fn new(hub: Hub) -> Self {
        Shared {
            hub,
            registry: StreamRegistry::default(),
        }
    }

    pub(crate) fn options(&self) -> &HubOptions {
        self.hub.options()
    }

    pub(crate) fn limits(&self) -> &StreamLimits {
        self.hub.limits()
    }

    pub(crate) fn metrics(&self) -> &StreamMetrics {
        self.hub.metrics()
    }

    /// Counts and logs a request refused for who it is; the status to answer with.
    pub(crate) fn auth_failure(&self, status: Status) -> Status {
        self.hub.refused(status)
    }

    /// Refuses a request carrying a name longer than [`StreamLimits::name_bytes`] (`INVALID_ARGUMENT`)
    /// or more names than [`StreamLimits::names_per_stream`] (`RESOURCE_EXHAUSTED`).
    pub(crate) fn check_names<'r>(
        &self,
        names: impl Iterator<Item = &'r str>,
    ) -> Result<(), Status> {
        let most_bytes = self.limits().name_bytes;
        let mut count = 0;
        for name in names {
            count += 1;
            if name.len() > most_bytes {
                StreamMetrics::incr(&self.metrics().over_limit);
                return Err(Status::invalid_argument(format!(
                    "resource name {} is longer than {most_bytes} bytes (limits.nameBytes)",
                    shown(name),
                )));
            }
        }
        self.check_name_count(count)
    }

    /// Refuses a subscription of more than [`StreamLimits::names_per_stream`] names.
    pub(crate) fn check_name_count(&self, names: usize) -> Result<(), Status> {
        let most = self.limits().names_per_stream;
        if names > most {
            StreamMetrics::incr(&self.metrics().over_limit);
            return Err(Status::resource_exhausted(format!(
                "{names} resource names in one subscription; at most {most} are served \
                 (limits.namesPerStream)"
            )));
        }
        Ok(())
    }

    /// Checks the `authorization: Bearer <token>` header of an SDS request: a verified, unrevoked token
    /// of a proxy. A bad token is `UNAUTHENTICATED`; an agent's token is `PERMISSION_DENIED`.
    pub(crate) fn authenticate(&self, headers: &http::HeaderMap) -> Result<Claims, Status> {
        let claims = self.hub.verify_bearer(headers)?;
        if claims.proxy_type == ProxyType::Agent {
            return Err(self.auth_failure(Status::permission_denied(format!(
                "token {} is an agent's ({}): it is for `meshca agent`, and grants no proxy's secrets",
                claims.id,
                shown(&claims.name)
            ))));
        }
        Ok(claims)
    }
}
