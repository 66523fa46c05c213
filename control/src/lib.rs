//! meshca's reconciler: who gets which identity, and when.
//!
//! The resource model ([`World`]) is built whole from validated resources and the CAs they need. One
//! [`Owner`] turns it, the connected proxies (learned from [`StreamEvent`]s) and the clock into an
//! immutable [`Snapshot`] that SDS serves, ordering every change through the rollout gate so that no
//! proxy is handed a certificate a connected peer would reject (docs/rotation.md). [`OwnerLoop`] is the
//! task that drives it.
//!
//! Pure of the wire: nothing here speaks gRPC or HTTP or watches files, and every decision takes the
//! time as an argument. The vocabulary shared with the SDS server (the [`Snapshot`], [`ResourceName`],
//! [`StreamEvent`]) lives here, and `meshca-sds` depends on it.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod bundles;
mod egress;
mod error;
mod events;
mod federated;
mod gate;
mod keys_ahead;
mod lineage;
mod owner;
mod owner_loop;
mod peers;
mod plan;
mod pool;
mod proxy_key;
mod replica_views;
mod resource_name;
mod snapshot;
mod standalone;
mod streams;
#[cfg(test)]
mod test_certs;
mod timefmt;
mod trust;
mod workloads;
mod world;

pub use egress::{EgressIssuer, EgressPlan, MeshChoice, NoEgressIdentity};
pub use error::{CaLoadError, ClaimMismatch, IdentityLoadError, IssueFailure, UpdateError};
pub use events::{StreamEvent, StreamId};
pub use federated::Federated;
pub use gate::{GateEvent, RolloutStep, ServedSince, StepChange, StepPhase, Wait};
pub use lineage::{lineage, Lineage, Validity};
pub use owner::status::{
    BackendRole, BackendStatus, CaStatus, Condition, DataplaneStatus, Detail, EgressStatus,
    IdentityStatus, MeshStatus, MtlsStatus, ServiceStatus, ServiceTls, Status, StreamStatus,
    TrustOrigin, TrustStatus,
};
pub use owner::{
    run_job, Completed, IssuedIdentity, Job, NoTelemetry, Owner, OwnerConfig, RecordLink, Rejected,
    Scope, SignedUntil, Telemetry,
};
pub use owner_loop::{
    rotate_cas, FederationLink, LoopHealth, OwnerLoop, PeerLink, Reload, ReloadOutcome,
    StatusHandle, StatusReply, StatusUnavailable, Work,
};
pub use peers::{GateView, PeerView, PresentedCa, PresentedIds, TrustEntry};
pub use plan::{decide, renewal_time, DataplaneInfo, Decision, Desired, Issuer, Origin};
pub use replica_views::{keep_gone, peer_views, GoneViews, LiveViews};
pub use resource_name::{parse_names, Asker, NameKind, ResourceName, Target, TrustScope};
pub use snapshot::{
    trust_domain_of, Changed, ClaimRule, Derived, KeyHasher, LeafKey, MeshServiceTrust, MeshView,
    ProxyEntry, ProxyHashMap, ProxyHashSet, ProxyIdentity, ProxyKey, ProxyMap, SecretPem, Snapshot,
    TrustBundle, TrustView,
};
pub use standalone::{issue_standalone, Standalone, StandaloneError};
pub use timefmt::{rfc3339, seconds_until};
pub use trust::{BundleKey, CaId, CaTrust, MeshName, ServiceKey, EGRESS_SERVICE};
pub use workloads::{Registration, Registrations};
pub use world::{
    bundle_limits, check_world, load_world, record_path, BackendKind, BackendState, CaSource,
    CreatedTrust, FederatedDomain, IdentityProvider, InactiveIdentity, LoadMode, LoadedCa,
    MeshIdentityState, MeshState, MeshTrustState, World,
};
