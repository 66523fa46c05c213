//! Rate limits for log lines a peer can cause: a proxy that repeats a mistake, or anyone who can
//! reach a listener, must not be able to flood the log.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The window a budget is counted over.
const WINDOW: Duration = Duration::from_secs(60);

/// Lets at most `per_minute` lines a minute through and counts the rest, so the next line that
/// gets through can say how many were left out.
#[derive(Debug)]
pub struct LogBudget {
    per_minute: u32,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    window_start: Instant,
    used: u32,
    suppressed: u64,
}

impl LogBudget {
    /// A budget of `per_minute` lines a minute.
    pub fn new(per_minute: u32) -> Self {
        LogBudget {
            per_minute,
            state: Mutex::new(State {
                window_start: Instant::now(),
                used: 0,
                suppressed: 0,
            }),
        }
    }

    /// When the current window ends, if anything was logged or suppressed in it; `None` for a
    /// budget that is untouched (or whose window is over).
    pub fn window_end(&self) -> Option<Instant> {
        let state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let end = state.window_start + WINDOW;
        (state.used > 0 && end > Instant::now()).then_some(end)
    }

    /// `Some(n)` when a line may be logged now, `n` being how many were suppressed since the last
    /// one that was; `None` when this one is suppressed (and counted).
    pub fn admit(&self) -> Option<u64> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        if now.duration_since(state.window_start) >= WINDOW {
            state.window_start = now;
            state.used = 0;
        }
        if state.used < self.per_minute {
            state.used += 1;
            Some(std::mem::take(&mut state.suppressed))
        } else {
            state.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn admits_the_budget_then_counts_until_the_next_window() {
        let budget = LogBudget::new(2);
        assert_eq!(budget.admit(), Some(0));
        assert_eq!(budget.admit(), Some(0));
        assert_eq!(budget.admit(), None);
        assert_eq!(budget.admit(), None);
        tokio::time::advance(WINDOW).await;
        assert_eq!(
            budget.admit(),
            Some(2),
            "the next line says what was left out"
        );
        assert_eq!(budget.admit(), Some(0));
        assert_eq!(budget.admit(), None);
    }
}
