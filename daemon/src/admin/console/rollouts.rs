//! `/rollouts`: the timeline of the last rollouts, newest first: when each began, its steps, whom they
//! waited for, timeouts, and when it ended.

use axum::extract::State;
use axum::response::Response;
use maud::{html, Markup};
use meshca_control::rfc3339;

use super::super::AdminState;
use crate::rollouts::{Rollout, Timeline, What, MAX_ROLLOUTS};

/// The whole page.
pub(super) async fn page(State(s): State<AdminState>) -> Response {
    let body = render(&s.metrics.timeline());
    super::page("rollouts", body)
}

fn render(timeline: &Timeline) -> Markup {
    html! {
        h2 { "The last rollouts" }
        p { "Kept in memory since the daemon started (the last " (MAX_ROLLOUTS) "), newest first." }
        @for rollout in timeline.newest_first() {
            (rollout_section(rollout))
        }
        @if timeline.newest_first().next().is_none() {
            p.idle { "No rollout has waited since the daemon started." }
        }
    }
}

fn rollout_section(rollout: &Rollout) -> Markup {
    html! {
        section.timeline data-mesh=(rollout.mesh) {
            h3 {
                "Mesh " (rollout.mesh) ": " (rfc3339(rollout.started)) " to "
                @match rollout.ended { Some(ended) => (rfc3339(ended)), None => "(in progress)" }
            }
            @if rollout.dropped > 0 {
                p { (rollout.dropped) " earlier entries dropped." }
            }
            ol.entries {
                @for entry in &rollout.entries {
                    li {
                        time { (rfc3339(entry.at)) } " "
                        @match &entry.what {
                            What::Began { step, ca, waiting } => {
                                b { (step.as_str()) } " began for " (ca) ", waiting for " (waiting) " proxies"
                            }
                            What::Ended { step, ca } => { b { (step.as_str()) } " ended for " (ca) }
                            What::TimedOut(step) => {
                                b { (step.as_str()) } " went ahead after rollout.ackTimeout without some proxies"
                            }
                            What::RemovedWhilePresented => {
                                "a removed CA is kept: connected proxies still present it"
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use meshca_control::{RolloutStep, StepChange, StepPhase};

    use super::*;

    #[test]
    fn a_rollout_renders_its_steps_as_text() {
        let mut timeline = Timeline::default();
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        timeline.step(
            &StepChange {
                mesh: "<b>m</b>".into(),
                step: RolloutStep::TrustBeforeIdentity,
                ca: "CN=<script>".into(),
                phase: StepPhase::Began { waiting: 7 },
            },
            at,
        );
        let html = render(&timeline).into_string();
        assert!(html.contains("trust-before-identity"), "{html}");
        assert!(html.contains("waiting for 7 proxies"), "{html}");
        assert!(html.contains("(in progress)"), "{html}");
        assert!(
            !html.contains("<script>") && !html.contains("<b>m"),
            "{html}"
        );
    }
}
