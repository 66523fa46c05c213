//! The connected agents, for operators (`/api/agents`), and the per-agent stream limit.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;

/// What the admin API shows of one agent's `Sync` stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct AgentStatus {
    /// The agent's name (its token's).
    pub name: String,
    /// Its token's id (what `meshca token --revoke` takes).
    pub token_id: String,
    /// Where it connected from (absent on a unix socket).
    pub peer: Option<String>,
    /// When the stream opened (RFC 3339).
    pub connected_since: String,
    /// The protocol version its Hello named (0 before its Hello).
    pub protocol: u32,
    /// The meshca version its Hello named.
    pub agent_version: String,
    /// The last state version sent to it.
    pub last_sent: Option<u64>,
    /// The last state version it acknowledged.
    pub last_acked: Option<u64>,
    /// The registrations it serves, with the Workload API streams its last acknowledgement counted.
    pub registrations: Vec<RegistrationStatus>,
}

/// One registration an agent serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RegistrationStatus {
    /// Its mesh.
    pub mesh: String,
    /// Its name.
    pub name: String,
    /// Workload API streams open for it on the agent's host, as of the agent's last acknowledgement.
    pub workload_streams: u32,
}

/// The agents' open `Sync` streams. Cheap to clone; every clone is the same table.
#[derive(Debug, Clone, Default)]
pub struct Agents {
    inner: Arc<Mutex<Table>>,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    open: BTreeMap<u64, Arc<Mutex<AgentStatus>>>,
    per_name: HashMap<String, usize>,
}

impl Agents {
    /// Every open stream, oldest first.
    pub fn list(&self) -> Vec<AgentStatus> {
        let table = self.lock();
        table
            .open
            .values()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).clone())
            .collect()
    }

    /// How many streams are open.
    pub fn len(&self) -> usize {
        self.lock().open.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lists a new stream of agent `status.name`, unless the agent holds `most` already (then how many
    /// it holds).
    pub(crate) fn open(&self, status: AgentStatus, most: usize) -> Result<Listed, usize> {
        let mut table = self.lock();
        let held = table.per_name.get(&status.name).copied().unwrap_or(0);
        if held >= most {
            return Err(held);
        }
        *table.per_name.entry(status.name.clone()).or_default() += 1;
        let id = table.next;
        table.next += 1;
        let name = status.name.clone();
        let status = Arc::new(Mutex::new(status));
        table.open.insert(id, status.clone());
        Ok(Listed {
            agents: self.clone(),
            id,
            name,
            status,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One stream's line in the table; removed when dropped.
#[derive(Debug)]
pub(crate) struct Listed {
    agents: Agents,
    id: u64,
    name: String,
    status: Arc<Mutex<AgentStatus>>,
}

impl Listed {
    /// Changes what the line shows.
    pub(crate) fn update(&self, change: impl FnOnce(&mut AgentStatus)) {
        change(&mut self.status.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        let mut table = self.agents.lock();
        table.open.remove(&self.id);
        if let Some(held) = table.per_name.get_mut(&self.name) {
            *held -= 1;
            if *held == 0 {
                table.per_name.remove(&self.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(name: &str) -> AgentStatus {
        AgentStatus {
            name: name.into(),
            token_id: "t".into(),
            peer: None,
            connected_since: String::new(),
            protocol: 0,
            agent_version: String::new(),
            last_sent: None,
            last_acked: None,
            registrations: Vec::new(),
        }
    }

    #[test]
    fn an_agent_holds_at_most_its_limit_and_a_closed_stream_frees_its_place() {
        let agents = Agents::default();
        let first = agents.open(status("a"), 2).expect("first");
        let _second = agents.open(status("a"), 2).expect("second");
        assert_eq!(agents.open(status("a"), 2).map(|_| ()), Err(2));
        let _other = agents
            .open(status("b"), 2)
            .expect("another agent has its own");
        drop(first);
        let _third = agents.open(status("a"), 2).expect("a place was freed");
        assert_eq!(agents.len(), 3);
        first_updates_show(&agents);
    }

    fn first_updates_show(agents: &Agents) {
        let listed = agents.open(status("c"), 1).expect("opened");
        listed.update(|s| s.last_sent = Some(7));
        assert!(agents
            .list()
            .iter()
            .any(|s| s.name == "c" && s.last_sent == Some(7)));
    }
}
