//! What `meshca serve` runs: the daemon's wiring of the owner loop, the SDS server, the admin API, the
//! metrics, the resource watcher, reloads and signals, with the data directory, the key store and the
//! files it keeps. The decisions themselves live in `meshca-control`; drills and benches start a
//! [`Daemon`] in process through this crate.
#![forbid(unsafe_code)]

mod admin;
mod admin_hosts;
mod agent_api;
pub mod atomic_file;
pub mod bundle_endpoints;
pub mod children;
mod daemon;
pub mod daemon_keys;
mod data_dir;
mod error;
mod federation;
mod files;
mod limits;
mod metrics;
mod reload;
mod replica;
pub mod revocations;
pub(crate) mod rollouts;
mod run;
mod stalled_writes;
mod store;
mod token_health;
mod watcher;
mod workload_api;

pub use daemon::{Daemon, DaemonOptions};
pub use error::{Cause, Error, Result};
pub use files::{open_store, open_store_to_mint, open_store_without_ca_keys};
pub use run::{load_settings, process_env, run};
pub use store::{open_token, read_pkcs11_pin};
