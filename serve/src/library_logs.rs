//! Log lines the HTTP libraries write on their own (h2, hyper, tonic's transport, rustls): a peer
//! that resets streams faster than the server accepts them makes h2 write a warning per connection
//! before it sends GOAWAY, with no token or registration needed. Every such line goes through one
//! budget of `limits.warningsPerMinute`; the rest are counted
//! (`meshca_library_log_lines_suppressed`), never written.
//!
//! The process's log subscriber asks [`admit`] for each event (see `meshca`'s `main`); the daemon
//! sets the budget from its settings with [`set_warnings_per_minute`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, PoisonError, RwLock};

use tracing::{Level, Metadata};

use crate::log_budget::LogBudget;

/// The budget before the settings are read: `limits.warningsPerMinute`'s default.
const DEFAULT_PER_MINUTE: u32 = 10;

/// The crates whose own log lines a peer can cause.
const LIBRARIES: &[&str] = &[
    "h2",
    "hyper",
    "hyper_util",
    "tonic",
    "tower",
    "axum",
    "rustls",
    "tokio_rustls",
];

static BUDGET: LazyLock<RwLock<LogBudget>> =
    LazyLock::new(|| RwLock::new(LogBudget::new(DEFAULT_PER_MINUTE)));
static SUPPRESSED: AtomicU64 = AtomicU64::new(0);

/// Lets `per_minute` of the libraries' warnings through each minute from now on.
pub fn set_warnings_per_minute(per_minute: u32) {
    *BUDGET.write().unwrap_or_else(PoisonError::into_inner) = LogBudget::new(per_minute);
}

/// How many of the libraries' warnings were left out since the process started.
pub fn suppressed() -> u64 {
    SUPPRESSED.load(Ordering::Relaxed)
}

/// Whether events of this callsite go through the budget: the HTTP libraries' warnings and errors.
/// A log subscriber must ask [`admit`] for each of them, never cache the answer.
pub fn budgeted(metadata: &Metadata<'_>) -> bool {
    metadata.is_event() && *metadata.level() <= Level::WARN && is_library(metadata.target())
}

/// Whether the event `metadata` describes may be written: any event not [`budgeted`], and those
/// while the budget lasts (the rest are counted). Spans always pass.
pub fn admit(metadata: &Metadata<'_>) -> bool {
    if !budgeted(metadata) {
        return true;
    }
    let admitted = BUDGET
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .admit()
        .is_some();
    if !admitted {
        SUPPRESSED.fetch_add(1, Ordering::Relaxed);
    }
    admitted
}

fn is_library(target: &str) -> bool {
    LIBRARIES.iter().any(|library| {
        target
            .strip_prefix(library)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_targets_are_told_apart_from_others() {
        for target in [
            "h2",
            "h2::proto::streams::recv",
            "hyper::proto::h2::server",
            "rustls::conn",
        ] {
            assert!(is_library(target), "{target}");
        }
        for target in ["meshca_sds::listen", "h2o", "hyperion", "meshca_daemon", ""] {
            assert!(!is_library(target), "{target}");
        }
    }
}
