//! Continuous real mTLS handshakes between random pairs of simulated proxies, each side using the
//! state it has applied at the moment the handshake starts, counted per phase of the drill.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::fleet::Member;
use super::rng::SplitMix64;
use super::tls::{self, HandshakeFailure, Side};

/// How many distinct failure messages a phase keeps for the report.
const KEPT_FAILURES: usize = 10;
/// A handshake over an in-memory pipe that takes this long is stuck: count it as failed.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What one phase of the drill saw.
#[derive(Clone, Debug)]
pub struct PhaseTally {
    /// The phase name (`steady`, `rotation`, `converged`).
    pub name: &'static str,
    /// Handshakes attempted (started in this phase and finished).
    pub handshakes: u64,
    /// How many of them failed.
    pub failed: u64,
    /// The first distinct failure messages, e.g. `p-3 → p-7: p-3 rejected p-7: …`.
    pub failures: Vec<String>,
    /// Failure count per reason (the message without the proxy names).
    pub reasons: BTreeMap<String, u64>,
    /// When the phase began.
    pub started: Instant,
    /// When it ended (`None` while running).
    pub ended: Option<Instant>,
}

impl PhaseTally {
    fn new(name: &'static str) -> Self {
        PhaseTally {
            name,
            handshakes: 0,
            failed: 0,
            failures: Vec::new(),
            reasons: BTreeMap::new(),
            started: Instant::now(),
            ended: None,
        }
    }

    fn record(&mut self, outcome: Result<(), (String, String)>) {
        self.handshakes += 1;
        if let Err((message, reason)) = outcome {
            self.failed += 1;
            *self.reasons.entry(reason).or_default() += 1;
            if self.failures.len() < KEPT_FAILURES && !self.failures.contains(&message) {
                self.failures.push(message);
            }
        }
    }

    /// How long the phase ran (so far).
    pub fn elapsed(&self) -> Duration {
        self.ended.unwrap_or_else(Instant::now) - self.started
    }
}

/// The tallies of a drill's phases, shared by the workers that count into the current one.
#[derive(Debug)]
pub struct Phases {
    tally: Arc<watch::Sender<Vec<PhaseTally>>>,
    view: watch::Receiver<Vec<PhaseTally>>,
}

/// What a worker counts into: the current phase of a [`Phases`].
pub type Recorder = Arc<watch::Sender<Vec<PhaseTally>>>;

impl Phases {
    /// Tallies starting with the phase `first`.
    pub fn new(first: &'static str) -> Phases {
        let (tally, view) = watch::channel(vec![PhaseTally::new(first)]);
        Phases {
            tally: Arc::new(tally),
            view,
        }
    }

    /// A handle for a worker (see [`current_phase`] and [`record`]).
    pub fn recorder(&self) -> Recorder {
        self.tally.clone()
    }

    /// Ends the current phase and counts from now on into `name`.
    pub fn begin_phase(&self, name: &'static str) {
        self.tally.send_modify(|phases| {
            let now = Instant::now();
            if let Some(current) = phases.last_mut() {
                current.ended = Some(now);
            }
            phases.push(PhaseTally::new(name));
        });
    }

    /// Waits until the current phase has counted at least `count` attempts.
    pub async fn wait_count(&mut self, count: u64) -> anyhow::Result<()> {
        self.view
            .wait_for(|phases| phases.last().is_some_and(|p| p.handshakes >= count))
            .await
            .map(|_| ())
            .map_err(|_| anyhow::anyhow!("the workers stopped"))
    }

    /// Every phase's tally, the last one ended now.
    pub fn finish(self) -> Vec<PhaseTally> {
        let mut phases = self.tally.borrow().clone();
        if let Some(last) = phases.last_mut() {
            last.ended.get_or_insert_with(Instant::now);
        }
        phases
    }
}

/// The phase a worker's next attempt counts into (read before the attempt starts).
pub fn current_phase(recorder: &Recorder) -> usize {
    recorder.borrow().len() - 1
}

/// Counts an attempt that started in `phase`.
pub fn record(recorder: &Recorder, phase: usize, outcome: Result<(), (String, String)>) {
    recorder.send_modify(|phases| {
        if let Some(p) = phases.get_mut(phase) {
            p.record(outcome);
        }
    });
}

/// Handshake workers and the tallies they keep.
#[derive(Debug)]
pub struct Traffic {
    phases: Phases,
    workers: JoinSet<()>,
}

impl Traffic {
    /// Starts `workers` concurrent handshake loops over `members` (at least two), counting into
    /// `first_phase`: between any two members, or with `hubs`, from any other member to one of the
    /// members at those indices. Worker `w` picks its pairs from `seed`, `w` and a constant.
    pub fn start(
        members: Vec<Member>,
        hubs: Vec<usize>,
        seed: u64,
        workers: usize,
        first_phase: &'static str,
    ) -> Traffic {
        let phases = Phases::new(first_phase);
        let members = Arc::new(members);
        let hubs = Arc::new(hubs);
        let mut set = JoinSet::new();
        for worker in 0..workers as u64 {
            let rng = SplitMix64::new(seed ^ 0x7a11_0000_0000_0000 ^ worker);
            set.spawn(work(members.clone(), hubs.clone(), phases.recorder(), rng));
        }
        Traffic {
            phases,
            workers: set,
        }
    }

    /// Ends the current phase and counts from now on into `name`.
    pub fn begin_phase(&self, name: &'static str) {
        self.phases.begin_phase(name);
    }

    /// Waits until the current phase has counted at least `handshakes`.
    pub async fn wait_handshakes(&mut self, handshakes: u64) -> anyhow::Result<()> {
        self.phases.wait_count(handshakes).await
    }

    /// Stops the workers (a handshake in flight is not counted) and returns every phase's tally.
    pub async fn stop(mut self) -> Vec<PhaseTally> {
        self.workers.shutdown().await;
        self.phases.finish()
    }
}

/// One worker: handshake after handshake between random distinct pairs (a client and one of `hubs`
/// when there are hubs), until aborted.
async fn work(
    members: Arc<Vec<Member>>,
    hubs: Arc<Vec<usize>>,
    tally: Recorder,
    mut rng: SplitMix64,
) {
    let n = members.len() as u64;
    let clients: Vec<usize> = (0..members.len()).filter(|i| !hubs.contains(i)).collect();
    if n < 2 || clients.is_empty() {
        return;
    }
    loop {
        let (c, s) = if hubs.is_empty() {
            let c = rng.below(n);
            (c as usize, ((c + 1 + rng.below(n - 1)) % n) as usize)
        } else {
            let s = hubs[rng.below(hubs.len() as u64) as usize];
            (clients[rng.below(clients.len() as u64) as usize], s)
        };
        let (client, server) = (&members[c], &members[s]);
        let phase = current_phase(&tally);
        let outcome = one(client, server).await;
        record(&tally, phase, outcome);
        // Keeps a worker from monopolising its thread when handshakes fail without awaiting.
        tokio::task::yield_now().await;
    }
}

/// One handshake `client → server` with the states they hold now; the error is the report message
/// and the bare reason.
async fn one(client: &Member, server: &Member) -> Result<(), (String, String)> {
    let pair = format!("{} → {}", client.name, server.name);
    let client_state = client.state.borrow().clone();
    let server_state = server.state.borrow().clone();
    let (Some(client_state), Some(server_state)) = (client_state, server_state) else {
        let reason = "a proxy has no identity and bundle applied".to_owned();
        return Err((format!("{pair}: {reason}"), reason));
    };
    let attempt = tls::handshake(
        &client_state.endpoint,
        &server_state.endpoint,
        &server.check,
        &client.ids,
    );
    let failure = match tokio::time::timeout(HANDSHAKE_TIMEOUT, attempt).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(failure)) => failure,
        Err(_) => HandshakeFailure {
            side: Side::Client,
            reason: format!("no handshake within {HANDSHAKE_TIMEOUT:?}"),
        },
    };
    let (who, whom) = match failure.side {
        Side::Client => (&client.name, &server.name),
        Side::Server => (&server.name, &client.name),
    };
    Err((
        format!("{pair}: {who} rejected {whom}: {}", failure.reason),
        failure.reason,
    ))
}
