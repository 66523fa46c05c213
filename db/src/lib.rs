//! meshca's PostgreSQL store, shared by the replicas of one CA.
//!
//! [`Database`] is a connection pool on a runtime of its own; it creates and migrates the schema when it
//! connects. [`PostgresKeystore`] keeps the keystore's entries in it: public data as written, secrets
//! sealed with the [`KeyEncryptionKey`] (AES-256-GCM, bound to the entry's name), so that a dump of the
//! database alone holds no private key; every row it reads as the truth is tagged with a key derived from
//! it, so that whoever can write the database cannot change what meshca trusts (a row that fails is
//! refused, [`DbError::Refused`], and counted in [`refused_rows`]). Creating a group of entries ([`meshca_keystore::Keystore::create_if_absent`])
//! is one transaction under a lock: however many replicas race, one creates a CA and the others adopt it.
//! [`TokenRevocations`] keeps the revoked proxy tokens every replica refuses, and [`Replicas`] the
//! replicas' heartbeats.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod database;
mod error;
mod integrity;
mod kek;
mod keystore;
mod proxies;
mod record_sync;
mod replicas;
mod revocations;
mod schema;
mod token_kek;

pub use database::{Database, DbOptions};
pub use error::DbError;
pub use integrity::refused_rows;
pub use kek::{read_bytes as read_key_encryption_key_file, KeyEncryptionKey};
pub use keystore::PostgresKeystore;
pub use proxies::{ProxyRecord, ProxyRecords};
pub use record_sync::RecordSync;
pub use replicas::{PeerGate, ReplicaRecord, Replicas, MAX_GATE_VIEW, MAX_REPLICAS};
pub use revocations::{TokenRevocations, MAX_REVOKED};
pub use schema::SCHEMA_VERSION;
