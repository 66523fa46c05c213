//! The proxy table: which proxies are connected and on which streams, what registered each, and what
//! the owner remembers of them for operators.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use meshca_auth::{Claims, ProxyType};

use super::Dataplanes;
use crate::error::ClaimMismatch;
use crate::events::StreamId;
use crate::plan::DataplaneInfo;
use crate::snapshot::{ClaimRule, ProxyHashMap, ProxyKey};
use crate::streams::StreamTable;
use crate::world::World;

/// What the owner remembers of a proxy beyond its certificate, for operators.
#[derive(Debug, Default)]
pub(crate) struct ProxyRecord {
    /// Why the last token presented for this proxy was refused, if one was.
    pub refused_token: Option<String>,
    /// Responses it rejected.
    pub nacks: u64,
    /// Its last rejection message.
    pub last_nack: Option<String>,
}

/// The proxies the owner knows of.
#[derive(Debug, Default)]
pub(super) struct ProxyTable {
    /// The open streams, and whose they are.
    pub streams: StreamTable,
    /// The claims each token-registered proxy presented when it first connected.
    registrations: ProxyHashMap<Arc<Claims>>,
    /// The registered proxies whose token is a zone egress token: a handful, looked at by every
    /// reconcile without a pass over the fleet.
    egress_keys: BTreeSet<ProxyKey>,
    records: BTreeMap<ProxyKey, ProxyRecord>,
}

impl ProxyTable {
    /// Connects `stream` of `key`, registering the proxy with `claims` unless it is connected already;
    /// whether it is the proxy's first stream.
    pub fn connect(&mut self, stream: StreamId, key: ProxyKey, claims: Arc<Claims>) -> bool {
        let zone_egress = claims.proxy_type == ProxyType::ZoneEgress;
        if !self.streams.is_connected(&key) {
            if zone_egress {
                self.egress_keys.insert(key.clone());
            } else {
                self.egress_keys.remove(&key);
            }
            self.registrations.insert(key.clone(), claims);
        }
        self.streams.connect(stream, key, zone_egress)
    }

    /// Notes that `stream`'s proxy rejected a response.
    pub fn note_nack(&mut self, stream: StreamId, message: String) {
        if let Some(proxy) = self.streams.proxy_of(stream) {
            let record = self.records.entry(proxy.clone()).or_default();
            record.nacks += 1;
            record.last_nack = Some(message);
        }
    }

    /// Notes why the last token presented for `key` was refused.
    pub fn refuse_token(&mut self, key: ProxyKey, reason: ClaimMismatch) {
        self.records.entry(key).or_default().refused_token = Some(reason.to_string());
    }

    /// What the owner remembers of each proxy, for operators.
    pub fn records(&self) -> &BTreeMap<ProxyKey, ProxyRecord> {
        &self.records
    }

    /// Whether `key` is a zone egress (its token says so).
    pub fn is_zone_egress(&self, key: &ProxyKey) -> bool {
        self.egress_keys.contains(key)
    }

    /// The registered zone egresses.
    pub fn egresses(&self) -> impl Iterator<Item = &ProxyKey> {
        self.egress_keys.iter()
    }

    /// What a token for `key` must not contradict: the Dataplane file, else the registering token while
    /// its proxy is connected.
    pub fn claim_rule(&self, world: &World, key: &ProxyKey) -> Option<ClaimRule> {
        if let Some(dp) = world.resources.dataplane(&key.mesh, &key.name) {
            return Some(DataplaneInfo::from_file(dp).claim_rule());
        }
        if !self.streams.is_connected(key) {
            return None;
        }
        let claims = self.registrations.get(key)?;
        Some(DataplaneInfo::from_claims(claims).claim_rule())
    }

    /// The dataplanes meshca knows: from files, and from tokens of proxies that connected.
    pub fn known_dataplanes(&self, world: &World) -> Dataplanes {
        let filed = world
            .resources
            .dataplanes
            .iter()
            .map(|dp| ProxyKey::new(dp.mesh.clone(), dp.name.clone()));
        let keys: BTreeSet<ProxyKey> = filed.chain(self.registrations.keys().cloned()).collect();
        keys.into_iter()
            .filter_map(|key| Some((key.clone(), self.describe(world, &key)?)))
            .collect()
    }

    /// What meshca knows of one dataplane: its Dataplane file, else (for a zone egress) its ZoneEgress
    /// file, else the token that registered it. A token that contradicts a file makes it an error naming
    /// the contradiction. `None` for a proxy nobody described.
    pub fn describe(
        &self,
        world: &World,
        key: &ProxyKey,
    ) -> Option<Result<DataplaneInfo, ClaimMismatch>> {
        let resources = &world.resources;
        let filed = resources
            .dataplane(&key.mesh, &key.name)
            .map(DataplaneInfo::from_file);
        let Some(claims) = self.registrations.get(key) else {
            return filed.map(Ok);
        };
        let egress_file = (claims.proxy_type == ProxyType::ZoneEgress)
            .then(|| resources.zone_egress(&key.name))
            .flatten();
        let info = match (filed, egress_file) {
            (Some(info), _) => info,
            (None, Some(egress)) => DataplaneInfo::from_zone_egress(&key.mesh, egress),
            (None, None) => return Some(Ok(DataplaneInfo::from_claims(claims))),
        };
        Some(info.claim_rule().check(claims).map(|()| info))
    }
}
