//! Where the daemon's control loop spent its time, as the daemon itself accounts for it:
//! `meshca_reconcile_seconds{scope}` read from the admin listener's `/metrics`, as Prometheus would.
//! A bench reads it before and after an event to say which kinds of reconcile the event cost.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use anyhow::{anyhow, Context};
use http_body_util::BodyExt;

use super::console;

const METRICS: &str = "/metrics";
const SUM: &str = "meshca_reconcile_seconds_sum{scope=\"";
const COUNT: &str = "meshca_reconcile_seconds_count{scope=\"";

/// Per scope (`full`, `proxies`, `acks`, `deferred`, `trust`): seconds spent, and how many reconciles.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reconciles(BTreeMap<String, (f64, u64)>);

impl Reconciles {
    /// Reads them from the daemon's admin listener at `addr`.
    pub async fn read(addr: SocketAddr) -> anyhow::Result<Reconciles> {
        let mut sender = console::connect(0, addr, METRICS).await?;
        let response = console::get(0, addr, METRICS, &mut sender).await?;
        let body = response
            .into_body()
            .collect()
            .await
            .with_context(|| format!("reading {METRICS} of {addr}"))?
            .to_bytes();
        Reconciles::parse(&String::from_utf8_lossy(&body))
    }

    /// Reads them from a Prometheus text exposition.
    pub fn parse(text: &str) -> anyhow::Result<Reconciles> {
        let mut scopes: BTreeMap<String, (f64, u64)> = BTreeMap::new();
        for line in text.lines() {
            let (prefix, sum) = match (line.strip_prefix(SUM), line.strip_prefix(COUNT)) {
                (Some(rest), _) => (rest, true),
                (_, Some(rest)) => (rest, false),
                _ => continue,
            };
            let (scope, value) = prefix
                .split_once("\"} ")
                .ok_or_else(|| anyhow!("{METRICS}: cannot read {line:?}"))?;
            let entry = scopes.entry(scope.to_owned()).or_default();
            if sum {
                entry.0 = value
                    .parse()
                    .with_context(|| format!("{METRICS}: the sum in {line:?}"))?;
            } else {
                entry.1 = value
                    .parse()
                    .with_context(|| format!("{METRICS}: the count in {line:?}"))?;
            }
        }
        Ok(Reconciles(scopes))
    }

    /// What was added since `before`.
    pub fn since(&self, before: &Reconciles) -> Reconciles {
        let scopes = self
            .0
            .iter()
            .map(|(scope, (seconds, count))| {
                let (s0, c0) = before.0.get(scope).copied().unwrap_or_default();
                (scope.clone(), (seconds - s0, count.saturating_sub(c0)))
            })
            .collect();
        Reconciles(scopes)
    }

    /// Seconds spent in `scope`.
    pub fn seconds(&self, scope: &str) -> f64 {
        self.0.get(scope).map_or(0.0, |(seconds, _)| *seconds)
    }

    /// How many reconciles of `scope`.
    pub fn count(&self, scope: &str) -> u64 {
        self.0.get(scope).map_or(0, |(_, count)| *count)
    }

    /// `{scope: {"seconds": s, "count": n}}` for every scope that ran.
    pub fn to_json(&self) -> serde_json::Value {
        self.0
            .iter()
            .filter(|(_, (_, count))| *count > 0)
            .map(|(scope, (seconds, count))| {
                let seconds = (seconds * 1e6).round() / 1e6;
                (
                    scope.clone(),
                    serde_json::json!({"seconds": seconds, "count": count}),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_sum_and_count_of_each_scope_and_subtracts_an_earlier_reading() {
        let before = Reconciles::parse(
            "# HELP meshca_reconcile_seconds ...\nmeshca_reconcile_seconds_sum{scope=\"full\"} 0.5\nmeshca_reconcile_seconds_count{scope=\"full\"} 2\nmeshca_reconcile_seconds_bucket{scope=\"full\",le=\"0.1\"} 1\n",
        )
        .expect("valid");
        let after = Reconciles::parse(
            "meshca_reconcile_seconds_sum{scope=\"full\"} 0.75\nmeshca_reconcile_seconds_count{scope=\"full\"} 3\nmeshca_reconcile_seconds_sum{scope=\"trust\"} 0.001\nmeshca_reconcile_seconds_count{scope=\"trust\"} 1\n",
        )
        .expect("valid");
        let delta = after.since(&before);
        assert_eq!(delta.count("full"), 1);
        assert!((delta.seconds("full") - 0.25).abs() < 1e-9);
        assert_eq!(delta.count("trust"), 1);
        assert!((delta.seconds("trust") - 0.001).abs() < 1e-9);
        assert_eq!(delta.count("acks"), 0);
        assert!(Reconciles::parse("meshca_reconcile_seconds_sum{scope=\"full\"} x\n").is_err());
    }
}
