//! The replicas of one database: each writes a heartbeat with how many proxies and streams it serves;
//! every replica reads them all. Times are the database server's, so replicas' clocks need not agree.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::database::Database;
use crate::error::pool_error;
use crate::error::DbError;

/// The most replicas listed.
pub const MAX_REPLICAS: i64 = 1000;

/// The largest rollout state a replica writes or reads (bytes of JSON): a larger one is refused on
/// write and counted as unreadable on read.
pub const MAX_GATE_VIEW: usize = 32 << 20;

/// Another live replica's rollout state, as [`Replicas::peer_gates`] read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerGate {
    /// Its `replica.name`.
    pub name: String,
    /// Bumped by each write of its state.
    pub version: i64,
    /// The state, JSON: `None` when it has written none yet, `Some(None)` when it is the version the
    /// caller already knows.
    pub state: Option<Option<String>>,
}

/// One replica as the database last heard of it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplicaRecord {
    /// `replica.name`.
    pub name: String,
    /// Seconds since its last heartbeat, by the database's clock.
    pub heartbeat_age_seconds: f64,
    /// When it started, RFC 3339.
    pub started_at: String,
    /// Proxies it served at its last heartbeat.
    pub proxies: u32,
    /// SDS streams it held at its last heartbeat.
    pub streams: u32,
    /// Whether its last heartbeat is within the lease: a replica past it counts as gone.
    pub live: bool,
}

/// The replicas' heartbeats in a database.
#[derive(Debug, Clone)]
pub struct Replicas {
    db: Arc<Database>,
}

impl Replicas {
    /// The replicas of `db`.
    pub fn new(db: Arc<Database>) -> Replicas {
        Replicas { db }
    }

    /// Records that replica `name`, started at `started_at` (unix seconds), is alive now and serves
    /// `proxies` proxies over `streams` streams.
    pub async fn heartbeat(
        &self,
        name: &str,
        started_at: f64,
        proxies: u32,
        streams: u32,
    ) -> Result<(), DbError> {
        let name = name.to_owned();
        let (proxies, streams) = (clamp(proxies), clamp(streams));
        self.db
            .run("write this replica's heartbeat", move |pool| async move {
                let client = pool.get().await.map_err(pool_error("connect"))?;
                client
                    .execute(
                        "INSERT INTO meshca_replicas (name, started_at, heartbeat_at, proxies, streams)
                         VALUES ($1, to_timestamp($2), now(), $3, $4)
                         ON CONFLICT (name) DO UPDATE SET started_at = EXCLUDED.started_at,
                             heartbeat_at = now(), proxies = EXCLUDED.proxies, streams = EXCLUDED.streams",
                        &[&name, &started_at, &proxies, &streams],
                    )
                    .await
                    .map_err(DbError::database("write this replica's heartbeat"))?;
                Ok(())
            })
            .await
    }

    /// Every replica that ever heartbeated, by name; `live` says whether it did within `lease`.
    pub async fn list(&self, lease: Duration) -> Result<Vec<ReplicaRecord>, DbError> {
        let lease = lease.as_secs_f64();
        self.db
            .run("read the replicas", move |pool| async move {
                let client = pool.get().await.map_err(pool_error("connect"))?;
                let rows = client
                    .query(
                        "SELECT name,
                                extract(epoch FROM now() - heartbeat_at)::float8,
                                to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
                                proxies, streams
                         FROM meshca_replicas ORDER BY name COLLATE \"C\" LIMIT $1",
                        &[&MAX_REPLICAS],
                    )
                    .await
                    .map_err(DbError::database("read the replicas"))?;
                Ok(rows
                    .iter()
                    .map(|row| {
                        let age: f64 = row.get(1);
                        ReplicaRecord {
                            name: row.get(0),
                            heartbeat_age_seconds: age,
                            started_at: row.get(2),
                            proxies: unclamp(row.get(3)),
                            streams: unclamp(row.get(4)),
                            live: age <= lease,
                        }
                    })
                    .collect())
            })
            .await
    }
}

impl Replicas {
    /// Writes replica `name`'s rollout state (JSON), bumping its version.
    pub async fn publish_gate(&self, name: &str, state: String) -> Result<(), DbError> {
        if state.len() > MAX_GATE_VIEW {
            return Err(DbError::Invalid(format!(
                "this replica's rollout state is {} bytes, more than the {MAX_GATE_VIEW} a replica may write",
                state.len()
            )));
        }
        let name = name.to_owned();
        self.db
            .run(
                "write this replica's rollout state",
                move |pool| async move {
                    let client = pool.get().await.map_err(pool_error("connect"))?;
                    client
                        .execute(
                            "INSERT INTO meshca_replicas
                             (name, started_at, heartbeat_at, proxies, streams, gate, gate_version)
                         VALUES ($1, now(), now(), 0, 0, $2::text::jsonb, 1)
                         ON CONFLICT (name) DO UPDATE SET gate = EXCLUDED.gate,
                             gate_version = meshca_replicas.gate_version + 1",
                            &[&name, &state],
                        )
                        .await
                        .map_err(DbError::database("write this replica's rollout state"))?;
                    Ok(())
                },
            )
            .await
    }

    /// The rollout state of every replica but `me` that heartbeated within `lease`, by name. `known`
    /// holds the versions the caller has: those come back without their state.
    pub async fn peer_gates(
        &self,
        me: &str,
        lease: Duration,
        known: &[(String, i64)],
    ) -> Result<Vec<PeerGate>, DbError> {
        let me = me.to_owned();
        let lease = lease.as_secs_f64();
        let (names, versions): (Vec<String>, Vec<i64>) = known.iter().cloned().unzip();
        self.db
            .run(
                "read the other replicas' rollout state",
                move |pool| async move {
                    let client = pool.get().await.map_err(pool_error("connect"))?;
                    let rows = client
                        .query(
                            "SELECT r.name, r.gate_version, r.gate IS NULL,
                                CASE WHEN k.version = r.gate_version THEN NULL ELSE r.gate::text END
                         FROM meshca_replicas r
                         LEFT JOIN unnest($2::text[], $3::int8[]) AS k(name, version)
                             ON k.name = r.name
                         WHERE r.name <> $1
                           AND r.heartbeat_at >= now() - make_interval(secs => $4)
                         ORDER BY r.name COLLATE \"C\" LIMIT $5",
                            &[&me, &names, &versions, &lease, &MAX_REPLICAS],
                        )
                        .await
                        .map_err(DbError::database("read the other replicas' rollout state"))?;
                    Ok(rows
                        .iter()
                        .map(|row| {
                            let missing: bool = row.get(2);
                            PeerGate {
                                name: row.get(0),
                                version: row.get(1),
                                state: (!missing).then(|| row.get(3)),
                            }
                        })
                        .collect())
                },
            )
            .await
    }
}

fn clamp(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn unclamp(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}
