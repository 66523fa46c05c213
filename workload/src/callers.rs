//! Who holds Workload API streams now, for operators: each open stream's caller (as the kernel named
//! it), its method and the registrations it is served for. The admin API lists them beside the
//! registrations.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use meshca_control::Registration;
use serde::Serialize;

/// The open Workload API streams. Cheap to clone; every clone sees the same streams.
#[derive(Clone, Debug, Default)]
pub struct Callers {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: AtomicU64,
    open: Mutex<BTreeMap<u64, CallerStream>>,
}

/// One open stream, as the admin API shows it.
#[derive(Clone, Debug, Serialize)]
pub struct CallerStream {
    /// The caller's process id.
    pub pid: u32,
    /// Its effective user id.
    pub uid: u32,
    /// Its effective group id.
    pub gid: u32,
    /// The method (`FetchX509SVID`, ...).
    pub method: &'static str,
    /// When it opened, as unix seconds.
    pub opened_at: u64,
    /// The registrations it is served for, as `<mesh>/<name>`, default first.
    pub registrations: Vec<String>,
}

/// A stream's place in [`Callers`]; it leaves when this is dropped.
#[derive(Debug)]
pub(crate) struct Listed {
    callers: Callers,
    key: u64,
}

impl Callers {
    /// Every open stream, oldest first.
    pub fn list(&self) -> Vec<CallerStream> {
        self.lock().values().cloned().collect()
    }

    /// Lists a stream of `caller` until the returned handle is dropped.
    pub(crate) fn open(&self, (pid, uid, gid): (u32, u32, u32), method: &'static str) -> Listed {
        let key = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let opened_at = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.lock().insert(
            key,
            CallerStream {
                pid,
                uid,
                gid,
                method,
                opened_at,
                registrations: Vec::new(),
            },
        );
        Listed {
            callers: self.clone(),
            key,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, CallerStream>> {
        // Plain values, valid after any panic.
        self.inner
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Listed {
    /// Records the registrations the stream is now served for.
    pub(crate) fn serves(&self, registrations: &[Arc<Registration>]) {
        if let Some(stream) = self.callers.lock().get_mut(&self.key) {
            stream.registrations = registrations
                .iter()
                .map(|r| format!("{}/{}", r.proxy.mesh, r.name))
                .collect();
        }
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.callers.lock().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_listed_while_its_handle_lives() {
        let callers = Callers::default();
        let first = callers.open((10, 1000, 1000), "FetchX509SVID");
        let second = callers.open((11, 1001, 1001), "FetchX509Bundles");
        let registration = Arc::new(Registration {
            name: "batch".into(),
            proxy: meshca_control::ProxyKey::new("default", "batch-1"),
            selectors: vec![],
            agent: None,
            hint: None,
            jwt_svid_expiry: std::time::Duration::from_secs(300),
            labels: Default::default(),
        });
        first.serves(&[registration]);
        let listed = callers.list();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].registrations, ["default/batch"]);
        assert_eq!(listed[1].method, "FetchX509Bundles");
        drop(first);
        assert_eq!(callers.list().len(), 1);
        drop(second);
        assert!(callers.list().is_empty());
    }
}
