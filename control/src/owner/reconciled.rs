//! What the last reconcile found, kept for the next one, the status and the peers.

use std::sync::Arc;
use std::time::SystemTime;

use super::Dataplanes;
use crate::peers::PresentedIds;
use crate::trust::{ServiceIds, TrustKeys};
use crate::world::World;

/// The fleet as of the last reconcile.
#[derive(Debug)]
pub(super) struct Reconciled {
    /// When it ran.
    pub at: SystemTime,
    /// Every dataplane.
    pub dataplanes: Dataplanes,
    /// The resources `dataplanes` was described from.
    pub described_from: Option<Arc<meshca_config::Resources>>,
    /// Every MeshService's SPIFFE IDs.
    pub service_ids: ServiceIds,
    /// The SPIFFE IDs this replica's proxies present, per computed service, as of the last full
    /// reconcile (for the peers).
    pub presented_ids: PresentedIds,
    /// The CAs the configuration publishes, as of the last full reconcile (not those kept only because a
    /// proxy still presents them).
    pub configured: TrustKeys,
}

impl Default for Reconciled {
    fn default() -> Reconciled {
        Reconciled {
            at: SystemTime::UNIX_EPOCH,
            dataplanes: Dataplanes::new(),
            described_from: None,
            service_ids: ServiceIds::new(),
            presented_ids: PresentedIds::new(),
            configured: TrustKeys::default(),
        }
    }
}

impl Reconciled {
    /// Whether the dataplanes were described from files that describe them as `world`'s do: the same
    /// Dataplane and ZoneEgress resources (an edit of a Mesh or a MeshIdentity changes no description).
    pub fn descriptions_current(&self, world: &World) -> bool {
        self.described_from.as_ref().is_some_and(|from| {
            let now = &world.resources;
            Arc::ptr_eq(from, now)
                || (from.dataplanes == now.dataplanes && from.zone_egresses == now.zone_egresses)
        })
    }
}
