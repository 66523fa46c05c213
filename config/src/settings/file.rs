//! The settings file format: every field optional, unknown keys rejected.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::limits::{LimitsLayer, LIMIT_FIELDS};
use super::{KeystoreType, ListenAddr, ServerAddr};
use crate::Duration;
use meshca_identity::KeyAlgorithm;

/// One layer of settings (the file, then the environment on top). `None` means "not set here".
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Layer {
    pub(super) zone: Option<String>,
    pub(super) data_dir: Option<PathBuf>,
    pub(super) resources: Option<PathBuf>,
    pub(super) defaults: Option<DefaultsLayer>,
    pub(super) sds: Option<SdsLayer>,
    pub(super) workload_api: Option<WorkloadApiLayer>,
    pub(super) admin: Option<AdminLayer>,
    pub(super) issuance: Option<IssuanceLayer>,
    pub(super) rollout: Option<RolloutLayer>,
    pub(super) keystore: Option<KeystoreLayer>,
    pub(super) tokens: Option<TokensLayer>,
    pub(super) replica: Option<ReplicaLayer>,
    pub(super) limits: Option<LimitsLayer>,
    pub(super) agent: Option<AgentLayer>,
}

/// `agent:`. The listen address is read like `sds.listen`'s, so that a TCP one is refused with a
/// reason.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct AgentLayer {
    pub(super) servers: Option<Vec<ServerAddr>>,
    pub(super) token_file: Option<PathBuf>,
    pub(super) sds_ca: Option<PathBuf>,
    pub(super) listen: Option<ListenAddr>,
    pub(super) admin: Option<SocketAddr>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct DefaultsLayer {
    pub(super) mesh: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct SdsLayer {
    pub(super) listen: Option<Vec<ListenAddr>>,
    pub(super) tls: Option<TlsLayer>,
    pub(super) insecure: Option<bool>,
}

/// `workloadApi:`. Addresses are read like `sds.listen`'s, so that a TCP one is refused with a
/// reason rather than as a malformed address.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct WorkloadApiLayer {
    pub(super) listen: Option<Vec<ListenAddr>>,
    pub(super) ack_after: Option<Duration>,
    pub(super) jwt_key_lifetime: Option<Duration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct TlsLayer {
    pub(super) cert_file: Option<PathBuf>,
    pub(super) key_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct AdminLayer {
    pub(super) listen: Option<SocketAddr>,
    pub(super) allowed_hosts: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct IssuanceLayer {
    pub(super) key_algorithm: Option<KeyAlgorithm>,
    pub(super) renew_at: Option<f64>,
    pub(super) workers: Option<usize>,
    pub(super) keys_ahead: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RolloutLayer {
    pub(super) ack_timeout: Option<Duration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct KeystoreLayer {
    #[serde(rename = "type")]
    pub(super) kind: Option<KeystoreType>,
    pub(super) postgres: Option<PostgresLayer>,
    pub(super) pkcs11: Option<Pkcs11Layer>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Pkcs11Layer {
    pub(super) module: Option<PathBuf>,
    pub(super) token: Option<String>,
    pub(super) pin_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct PostgresLayer {
    pub(super) url: Option<String>,
    pub(super) password_file: Option<PathBuf>,
    pub(super) key_encryption_key_file: Option<PathBuf>,
    pub(super) ca_file: Option<PathBuf>,
    pub(super) timeout: Option<Duration>,
    pub(super) max_connections: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ReplicaLayer {
    pub(super) name: Option<String>,
    pub(super) lease_timeout: Option<Duration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct TokensLayer {
    pub(super) max_valid_for: Option<Duration>,
}

/// The settings fields outside `limits:`, as written in the file (dotted camelCase paths).
const BASE_FIELDS: [&str; 36] = [
    "zone",
    "dataDir",
    "resources",
    "defaults.mesh",
    "sds.listen",
    "sds.tls.certFile",
    "sds.tls.keyFile",
    "sds.insecure",
    "workloadApi.listen",
    "workloadApi.ackAfter",
    "workloadApi.jwtKeyLifetime",
    "admin.listen",
    "admin.allowedHosts",
    "issuance.keyAlgorithm",
    "issuance.renewAt",
    "issuance.workers",
    "issuance.keysAhead",
    "rollout.ackTimeout",
    "keystore.type",
    "keystore.postgres.url",
    "keystore.postgres.passwordFile",
    "keystore.postgres.keyEncryptionKeyFile",
    "keystore.postgres.caFile",
    "keystore.postgres.timeout",
    "keystore.postgres.maxConnections",
    "keystore.pkcs11.module",
    "keystore.pkcs11.token",
    "keystore.pkcs11.pinFile",
    "tokens.maxValidFor",
    "replica.name",
    "replica.leaseTimeout",
    "agent.servers",
    "agent.tokenFile",
    "agent.sdsCa",
    "agent.listen",
    "agent.admin",
];

/// Every settings field as written in the file (its dotted camelCase path). The environment
/// variable names are derived from these.
pub(super) fn fields() -> impl Iterator<Item = &'static str> {
    BASE_FIELDS.into_iter().chain(LIMIT_FIELDS.iter().copied())
}

impl Layer {
    /// Whether `field` (one of [`fields`]) is set in this layer.
    pub(super) fn is_set(&self, field: &str) -> bool {
        let sds = self.sds.as_ref();
        let tls = sds.and_then(|s| s.tls.as_ref());
        match field {
            "zone" => self.zone.is_some(),
            "dataDir" => self.data_dir.is_some(),
            "resources" => self.resources.is_some(),
            "defaults.mesh" => self.defaults.as_ref().is_some_and(|d| d.mesh.is_some()),
            "sds.listen" => sds.is_some_and(|s| s.listen.is_some()),
            "sds.tls.certFile" => tls.is_some_and(|t| t.cert_file.is_some()),
            "sds.tls.keyFile" => tls.is_some_and(|t| t.key_file.is_some()),
            "sds.insecure" => sds.is_some_and(|s| s.insecure.is_some()),
            "workloadApi.listen" => self
                .workload_api
                .as_ref()
                .is_some_and(|w| w.listen.is_some()),
            "workloadApi.ackAfter" => self
                .workload_api
                .as_ref()
                .is_some_and(|w| w.ack_after.is_some()),
            "workloadApi.jwtKeyLifetime" => self
                .workload_api
                .as_ref()
                .is_some_and(|w| w.jwt_key_lifetime.is_some()),
            "admin.listen" => self.admin.as_ref().is_some_and(|a| a.listen.is_some()),
            "admin.allowedHosts" => self
                .admin
                .as_ref()
                .is_some_and(|a| a.allowed_hosts.is_some()),
            "issuance.keyAlgorithm" => self
                .issuance
                .as_ref()
                .is_some_and(|i| i.key_algorithm.is_some()),
            "issuance.renewAt" => self.issuance.as_ref().is_some_and(|i| i.renew_at.is_some()),
            "issuance.workers" => self.issuance.as_ref().is_some_and(|i| i.workers.is_some()),
            "issuance.keysAhead" => self
                .issuance
                .as_ref()
                .is_some_and(|i| i.keys_ahead.is_some()),
            "rollout.ackTimeout" => self
                .rollout
                .as_ref()
                .is_some_and(|r| r.ack_timeout.is_some()),
            "keystore.type" => self.keystore.as_ref().is_some_and(|k| k.kind.is_some()),
            postgres if postgres.starts_with("keystore.postgres.") => self
                .keystore
                .as_ref()
                .and_then(|k| k.postgres.as_ref())
                .is_some_and(|p| p.is_set(postgres)),
            pkcs11 if pkcs11.starts_with("keystore.pkcs11.") => self
                .keystore
                .as_ref()
                .and_then(|k| k.pkcs11.as_ref())
                .is_some_and(|p| match pkcs11 {
                    "keystore.pkcs11.module" => p.module.is_some(),
                    "keystore.pkcs11.token" => p.token.is_some(),
                    "keystore.pkcs11.pinFile" => p.pin_file.is_some(),
                    _ => false,
                }),
            "replica.name" => self.replica.as_ref().is_some_and(|r| r.name.is_some()),
            "replica.leaseTimeout" => self
                .replica
                .as_ref()
                .is_some_and(|r| r.lease_timeout.is_some()),
            "tokens.maxValidFor" => self
                .tokens
                .as_ref()
                .is_some_and(|t| t.max_valid_for.is_some()),
            limit if limit.starts_with("limits.") => {
                self.limits.as_ref().is_some_and(|l| l.is_set(limit))
            }
            agent if agent.starts_with("agent.") => {
                self.agent.as_ref().is_some_and(|a| match agent {
                    "agent.servers" => a.servers.is_some(),
                    "agent.tokenFile" => a.token_file.is_some(),
                    "agent.sdsCa" => a.sds_ca.is_some(),
                    "agent.listen" => a.listen.is_some(),
                    "agent.admin" => a.admin.is_some(),
                    _ => false,
                })
            }
            _ => false,
        }
    }
}

impl PostgresLayer {
    /// Whether `field` (a `keystore.postgres.*` field) is set.
    fn is_set(&self, field: &str) -> bool {
        match field {
            "keystore.postgres.url" => self.url.is_some(),
            "keystore.postgres.passwordFile" => self.password_file.is_some(),
            "keystore.postgres.keyEncryptionKeyFile" => self.key_encryption_key_file.is_some(),
            "keystore.postgres.caFile" => self.ca_file.is_some(),
            "keystore.postgres.timeout" => self.timeout.is_some(),
            "keystore.postgres.maxConnections" => self.max_connections.is_some(),
            _ => false,
        }
    }
}
