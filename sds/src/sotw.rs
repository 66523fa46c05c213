//! `StreamSecrets`, the state-of-the-world protocol: every response holds all asked resources that are
//! available, under one version that is a hash of their content. A request carrying the last nonce is
//! an ACK (same version) or a NACK, one carrying an older nonce is ignored, and a request that changes
//! the names is a new subscription.

use std::collections::BTreeSet;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use meshca_control::{parse_names, ResourceName};

use crate::names;
use crate::registry::StreamKind;
use crate::secret::SECRET_TYPE_URL;
use crate::stream::{Build, Current, Header, Protocol};
use crate::wire::{DiscoveryRequest, Node};

/// A state-of-the-world stream's subscription.
#[derive(Debug, Default)]
pub(crate) struct Sotw {
    names: Vec<ResourceName>,
}

impl Protocol for Sotw {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;
    const KIND: StreamKind = StreamKind::Sotw;
    /// A request with a stale nonce crossed a push: its names are as stale as its reply.
    const STALE_IGNORES_SUBSCRIPTION: bool = true;

    fn take_node(r: &mut DiscoveryRequest) -> Option<Node> {
        r.node.take()
    }

    fn header(r: &DiscoveryRequest) -> Header<'_> {
        let (node, error) = (r.node.as_ref(), r.error_detail.as_ref());
        Header::new(
            node,
            &r.type_url,
            &r.response_nonce,
            error,
            Some(&r.version_info),
        )
    }

    fn requested_names(request: &DiscoveryRequest) -> impl Iterator<Item = &str> {
        request.resource_names.iter().map(String::as_str)
    }

    fn subscribe(&mut self, request: DiscoveryRequest, _first: bool) -> Option<Vec<ResourceName>> {
        let names = parse_names(request.resource_names);
        if as_set(&names) == as_set(&self.names) {
            return None;
        }
        self.names = names;
        Some(self.names.clone())
    }

    fn responds(_first: bool, fresh: bool, changed: bool) -> Option<bool> {
        (fresh || changed).then_some(fresh)
    }

    fn build(&mut self, current: &mut Current<'_>) -> Build<DiscoveryResponse> {
        let items: Vec<(&ResourceName, names::Resolved, String)> = self
            .names
            .iter()
            .filter_map(|name| {
                let resolved = current.resolve(name)?;
                let version = resolved.version();
                Some((name, resolved, version))
            })
            .collect();
        if items.is_empty() {
            return Build::Withheld;
        }
        let version = names::response_version(
            items
                .iter()
                .map(|(name, _, version)| (name.as_str(), version.as_str())),
        );
        if !current.force && current.last_version == Some(version.as_str()) {
            return Build::Unchanged;
        }
        let resources = items
            .iter()
            .map(|(name, resolved, _)| resolved.to_any(name.as_str()))
            .collect();
        Build::Send {
            response: DiscoveryResponse {
                version_info: version.clone(),
                resources,
                type_url: SECRET_TYPE_URL.to_owned(),
                ..Default::default()
            },
            version,
            resources: items.iter().map(|(name, ..)| name.to_string()).collect(),
        }
    }

    fn set_nonce(response: &mut DiscoveryResponse, nonce: String) {
        response.nonce = nonce;
    }
}

fn as_set(names: &[ResourceName]) -> BTreeSet<&str> {
    names.iter().map(ResourceName::as_str).collect()
}
