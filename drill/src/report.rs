//! What a drill prints: per phase the handshakes made and failed, the time to converge, a verdict.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::traffic::PhaseTally;

/// The outcome of one drill (`--output json` prints it as is).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The scenario, e.g. `ca-rotation`.
    pub scenario: &'static str,
    /// Whether the daemon's ordering gate was on.
    pub gate: bool,
    /// How many proxies took part.
    pub proxies: usize,
    /// Whether they were real Envoy sidecars (each request a new mTLS handshake) rather than simulated.
    pub envoy: bool,
    /// How many `meshca agent`s served the workloads (0: none, or not a workload drill).
    pub agents: usize,
    /// The seed of apply delays and handshake pairs.
    pub seed: u64,
    /// How many proxies were told to withhold their ACKs from the first edit on (`--stuck`): their
    /// failed handshakes, and a drill that does not converge, are what was asked for.
    pub stuck: usize,
    /// Each phase, in order.
    pub phases: Vec<PhaseReport>,
    /// Seconds from the first edit until every proxy had applied the final state; `None` if it never did.
    pub converge_seconds: Option<f64>,
    /// Responses the simulated proxies could not use (NACKed).
    pub nacks: u64,
    /// Why the drill could not complete, if it could not.
    pub error: Option<String>,
    /// The replicas of `failover`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverReport>,
    /// Where the CA keys were, with `--pkcs11`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pkcs11: Option<TokenReport>,
    /// No handshake failed, nothing was NACKed, and the scenario completed.
    pub ok: bool,
}

/// The replicas of a `failover` drill.
#[derive(Clone, Debug, Serialize)]
pub struct FailoverReport {
    /// How many replicas served the fleet.
    pub replicas: usize,
    /// The replica killed in the middle of the rotation.
    pub killed: String,
    /// Streams re-opened on another replica after one failed (simulated proxies; Envoy does not say).
    /// Behind agents: the agents' own streams, one per agent.
    pub moved_streams: Option<u64>,
}

/// The CA keys of a drill with `--pkcs11`.
#[derive(Clone, Debug, Serialize)]
pub struct TokenReport {
    /// The token's label.
    pub token: String,
    /// CAs the drill's daemon made whose key was in the token.
    pub ca_keys_in_token: usize,
    /// CAs whose key was in a file instead (0, or the drill failed).
    pub ca_keys_in_files: usize,
}

impl Report {
    /// Adds where the CA keys were; a CA key in a file fails the drill.
    pub fn with_token(mut self, token: TokenReport) -> Report {
        if token.ca_keys_in_files > 0 || token.ca_keys_in_token == 0 {
            self.ok = false;
        }
        self.pkcs11 = Some(token);
        self
    }
}

/// One phase of a drill.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseReport {
    /// `steady`; `rotation` or `migration` (the edits, convergence, and on to its minimum count); then
    /// `converged`.
    pub name: &'static str,
    /// Handshakes made.
    pub handshakes: u64,
    /// Handshakes that failed.
    pub failed: u64,
    /// The first distinct failures, naming both proxies and who refused whom.
    pub failures: Vec<String>,
    /// Failure count per reason.
    pub reasons: BTreeMap<String, u64>,
    /// How long the phase ran.
    pub seconds: f64,
    /// Handshakes per second in this phase.
    pub handshakes_per_second: f64,
}

impl From<PhaseTally> for PhaseReport {
    fn from(tally: PhaseTally) -> Self {
        let seconds = tally.elapsed().as_secs_f64();
        PhaseReport {
            name: tally.name,
            handshakes: tally.handshakes,
            failed: tally.failed,
            failures: tally.failures,
            reasons: tally.reasons,
            seconds: round2(seconds),
            handshakes_per_second: if seconds > 0.0 {
                round2(tally.handshakes as f64 / seconds)
            } else {
                0.0
            },
        }
    }
}

/// Two decimals are what a reader (or a JSON diff) wants from timings.
pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// What a drill was asked to do.
#[derive(Clone, Copy, Debug)]
pub struct Header {
    /// The scenario name.
    pub scenario: &'static str,
    /// Whether the ordering gate was on.
    pub gate: bool,
    /// How many proxies.
    pub proxies: usize,
    /// Real Envoy sidecars rather than simulated proxies.
    pub envoy: bool,
    /// How many `meshca agent`s served the workloads.
    pub agents: usize,
    /// The seed.
    pub seed: u64,
    /// How many proxies withhold their ACKs on purpose.
    pub stuck: usize,
}

/// How the scenario went, apart from the handshakes.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Seconds from the first edit to convergence, if reached.
    pub converge_seconds: Option<f64>,
    /// Responses the proxies NACKed.
    pub nacks: u64,
    /// Why the scenario could not complete.
    pub error: Option<String>,
}

impl Report {
    /// Assembles a report and decides `ok`.
    pub fn new(header: Header, phases: Vec<PhaseTally>, outcome: Outcome) -> Report {
        let phases: Vec<PhaseReport> = phases.into_iter().map(PhaseReport::from).collect();
        let failed: u64 = phases.iter().map(|p| p.failed).sum();
        let ok = failed == 0 && outcome.nacks == 0 && outcome.error.is_none();
        Report {
            scenario: header.scenario,
            gate: header.gate,
            proxies: header.proxies,
            envoy: header.envoy,
            agents: header.agents,
            seed: header.seed,
            stuck: header.stuck,
            phases,
            converge_seconds: outcome.converge_seconds.map(round2),
            nacks: outcome.nacks,
            error: outcome.error,
            failover: None,
            pkcs11: None,
            ok,
        }
    }

    /// Handshakes over all phases.
    pub fn handshakes(&self) -> u64 {
        self.phases.iter().map(|p| p.handshakes).sum()
    }

    /// Failed handshakes over all phases.
    pub fn failed(&self) -> u64 {
        self.phases.iter().map(|p| p.failed).sum()
    }

    /// The report for people: one line per phase, the failures, a verdict.
    pub fn human(&self) -> String {
        let mut out = String::new();
        let gate = if self.gate { "on" } else { "off" };
        let kind = if self.envoy {
            "Envoy sidecars (each request a new mTLS handshake)".to_owned()
        } else if self.agents > 0 {
            format!("workloads behind {} meshca agents", self.agents)
        } else {
            "proxies".to_owned()
        };
        let _ = writeln!(
            out,
            "drill {}: {} {kind}, gate {gate}, seed {}",
            self.scenario, self.proxies, self.seed
        );
        if self.stuck > 0 {
            let _ = writeln!(
                out,
                "{} of the proxies were told to withhold their ACKs from the first edit on (--stuck): \
                 the daemon waits for them until rollout.ackTimeout, so their failed handshakes and a \
                 drill that does not converge are expected, not a meshca bug",
                self.stuck
            );
        }
        if let Some(failover) = &self.failover {
            let _ = write!(
                out,
                "{} replicas on one database; {} killed during the rotation",
                failover.replicas, failover.killed
            );
            match failover.moved_streams {
                Some(moved) if self.agents > 0 => {
                    let agents = self.agents;
                    let _ = writeln!(out, "; {moved} of {agents} agents moved to another replica");
                }
                Some(moved) => {
                    let _ = writeln!(out, "; {moved} streams moved to another replica");
                }
                None => out.push('\n'),
            }
        }
        if let Some(token) = &self.pkcs11 {
            let _ = writeln!(
                out,
                "CA keys in the PKCS#11 token {:?}: {} ({} in files)",
                token.token, token.ca_keys_in_token, token.ca_keys_in_files
            );
        }
        for (i, phase) in self.phases.iter().enumerate() {
            let _ = write!(
                out,
                "{}: {} handshakes, {} failed",
                phase.name, phase.handshakes, phase.failed
            );
            // The second phase is the change (`rotation` or `migration`).
            if i == 1 {
                match self.converge_seconds {
                    Some(s) => {
                        let _ = write!(out, ", converged in {s:.2} s");
                    }
                    None => out.push_str(", did not converge"),
                }
            }
            let _ = writeln!(
                out,
                " ({:.1} s, {:.0} handshakes/s)",
                phase.seconds, phase.handshakes_per_second
            );
            for (reason, count) in &phase.reasons {
                let _ = writeln!(out, "  {count} × {reason}");
            }
            for failure in &phase.failures {
                let _ = writeln!(out, "    e.g. {failure}");
            }
        }
        if self.nacks > 0 {
            let _ = writeln!(out, "proxies NACKed {} responses (see the log)", self.nacks);
        }
        if let Some(error) = &self.error {
            let _ = writeln!(out, "error: {error}");
        }
        let (failed, total) = (self.failed(), self.handshakes());
        if self.ok {
            let _ = writeln!(out, "ok: no failed handshake out of {total}");
        } else {
            let _ = writeln!(out, "FAILED: {failed} of {total} handshakes failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(stuck: usize) -> Header {
        Header {
            scenario: "ca-rotation",
            gate: true,
            proxies: 5,
            envoy: false,
            agents: 0,
            seed: 1,
            stuck,
        }
    }

    #[test]
    fn stuck_proxies_are_named_in_the_text_and_the_json() {
        let report = Report::new(header(2), Vec::new(), Outcome::default());
        let text = report.human();
        assert!(
            text.contains("2 of the proxies were told to withhold their ACKs")
                && text.contains("not a meshca bug"),
            "{text}"
        );
        let json = serde_json::to_value(&report).expect("a report serializes");
        assert_eq!(json["stuck"], 2);

        let plain = Report::new(header(0), Vec::new(), Outcome::default());
        assert!(!plain.human().contains("withhold"));
        assert_eq!(
            serde_json::to_value(&plain).expect("a report serializes")["stuck"],
            0
        );
    }
}
