//! `DeltaSecrets`, the incremental protocol: the proxy subscribes and unsubscribes per resource and
//! says which versions it already holds; each response carries only resources whose version differs
//! from what the proxy holds, plus `removed_resources` for subscribed ones that stopped existing.
//! ACK/NACK by nonce; subscription changes apply whatever the nonce.

use std::collections::{BTreeMap, HashMap};

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, Resource};
use meshca_control::ResourceName;

use crate::names;
use crate::registry::StreamKind;
use crate::secret::{self, SECRET_TYPE_URL};
use crate::stream::{Build, Current, Header, Protocol};
use crate::transport::wire::{DeltaDiscoveryRequest, Node};

/// A delta stream's subscription and what the proxy holds.
#[derive(Debug, Default)]
pub(crate) struct Delta {
    subscribed: BTreeMap<String, ResourceName>,
    /// What the proxy holds, as far as we know: name → version.
    held: HashMap<String, String>,
}

impl Protocol for Delta {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;

    fn take_node(r: &mut DeltaDiscoveryRequest) -> Option<Node> {
        r.node.take()
    }

    fn header(r: &DeltaDiscoveryRequest) -> Header<'_> {
        // Delta ACKs by nonce alone, whatever version the proxy reports.
        let (node, error) = (r.node.as_ref(), r.error_detail.as_ref());
        Header::new(node, &r.type_url, &r.response_nonce, error, None)
    }

    const KIND: StreamKind = StreamKind::Delta;
    /// Subscriptions are changes (subscribe, unsubscribe), applied whatever the nonce.
    const STALE_IGNORES_SUBSCRIPTION: bool = false;

    fn requested_names(request: &DeltaDiscoveryRequest) -> impl Iterator<Item = &str> {
        let subscribe = request.resource_names_subscribe.iter();
        let unsubscribe = request.resource_names_unsubscribe.iter();
        let held = request.initial_resource_versions.keys();
        subscribe.chain(unsubscribe).chain(held).map(String::as_str)
    }

    fn subscribe(
        &mut self,
        request: DeltaDiscoveryRequest,
        first: bool,
    ) -> Option<Vec<ResourceName>> {
        if first {
            // Every version meshca gives is VERSION_LEN bytes; a longer one is none of ours, so the
            // proxy holds something other than what is current, which an empty version says as well
            // without keeping what the proxy sent (up to a whole request's worth per name).
            self.held
                .extend(
                    request
                        .initial_resource_versions
                        .into_iter()
                        .map(
                            |(name, version)| match version.len() <= secret::VERSION_LEN {
                                true => (name, version),
                                false => (name, String::new()),
                            },
                        ),
                );
        }
        let mut changed = false;
        for name in request.resource_names_subscribe {
            if name == "*" {
                tracing::debug!("wildcard subscription ignored: SDS serves named secrets only");
                continue;
            }
            if !self.subscribed.contains_key(&name) {
                self.subscribed
                    .insert(name.clone(), ResourceName::parse(name));
                changed = true;
            }
        }
        for name in request.resource_names_unsubscribe {
            changed |= self.subscribed.remove(&name).is_some();
            self.held.remove(&name);
        }
        changed.then(|| self.subscribed.values().cloned().collect())
    }

    fn responds(first: bool, _fresh: bool, changed: bool) -> Option<bool> {
        (first || changed).then_some(false)
    }

    /// Only what differs from what the proxy holds; a forced response does not exist in this protocol.
    fn build(&mut self, current: &mut Current<'_>) -> Build<DeltaDiscoveryResponse> {
        let mut updates = Vec::new();
        let mut removed = Vec::new();
        for (text, name) in &self.subscribed {
            match current.resolve(name) {
                Some(resolved) => {
                    let version = resolved.version();
                    if self.held.get(text) != Some(&version) {
                        updates.push((text, resolved, version));
                    }
                }
                None if self.held.contains_key(text) => removed.push(text.clone()),
                None => {}
            }
        }
        if updates.is_empty() && removed.is_empty() {
            return Build::Unchanged;
        }
        let version = names::response_version(
            updates
                .iter()
                .map(|(name, _, version)| (name.as_str(), version.as_str()))
                .chain(removed.iter().map(|name| (name.as_str(), "removed"))),
        );
        let mut resources = Vec::with_capacity(updates.len());
        for (name, resolved, version) in &updates {
            let any = match resolved.to_any(name) {
                Ok(any) => any,
                Err(keyless) => return Build::Refused(keyless),
            };
            resources.push(Resource {
                name: (*name).clone(),
                version: version.clone(),
                resource: Some(any),
                ..Default::default()
            });
        }
        let mut names = Vec::with_capacity(updates.len() + removed.len());
        for (name, _, version) in updates {
            self.held.insert(name.clone(), version);
            names.push(name.clone());
        }
        for name in &removed {
            self.held.remove(name);
            names.push(name.clone());
        }
        Build::Send {
            response: DeltaDiscoveryResponse {
                system_version_info: version.clone(),
                resources,
                type_url: SECRET_TYPE_URL.to_owned(),
                removed_resources: removed,
                ..Default::default()
            },
            version,
            resources: names,
        }
    }

    fn set_nonce(response: &mut DeltaDiscoveryResponse, nonce: String) {
        response.nonce = nonce;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_proxy_says_it_holds_is_kept_only_as_long_as_a_version_of_ours() {
        let ours = "0123456789abcdef0123456789abcdef".to_owned();
        let request = DeltaDiscoveryRequest {
            resource_names_subscribe: vec!["default".into(), "system_trust_bundle".into()],
            initial_resource_versions: HashMap::from([
                ("default".to_owned(), ours.clone()),
                ("system_trust_bundle".to_owned(), "v".repeat(1 << 20)),
            ]),
            ..Default::default()
        };
        let mut delta = Delta::default();
        delta.subscribe(request, true);
        assert_eq!(delta.held.get("default"), Some(&ours));
        let other = delta.held.get("system_trust_bundle").expect("still held");
        assert!(
            other.is_empty() && other.capacity() == 0,
            "a version no response of ours carries is kept as unknown, not as sent ({} bytes)",
            other.capacity()
        );
    }
}
