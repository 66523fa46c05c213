//! Issuance on every core: a batch of independent jobs (one certificate each: a new key, a signature, the
//! check before publishing) spread over scoped threads, results returned in job order so that what is
//! done with them stays deterministic.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many threads `configured` (`issuance.workers`) means: itself, or one per core when 0.
pub fn worker_count(configured: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
}

/// Runs `f` on every job on up to `workers` threads (the calling thread is one of them; no thread is
/// started for a single job) and returns the results in job order. A panic in `f` propagates.
pub fn run_all<J, R, F>(jobs: &[J], workers: usize, f: F) -> Vec<R>
where
    J: Sync,
    R: Send,
    F: Fn(&J) -> R + Sync,
{
    let workers = workers.clamp(1, jobs.len().max(1));
    if workers == 1 {
        return jobs.iter().map(&f).collect();
    }
    let next = AtomicUsize::new(0);
    let take = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(job) = jobs.get(i) else {
                return done;
            };
            done.push((i, f(job)));
        }
    };
    let mut results: Vec<Option<R>> = std::iter::repeat_with(|| None).take(jobs.len()).collect();
    std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..workers).map(|_| scope.spawn(take)).collect();
        let mut done = take();
        for helper in helpers {
            match helper.join() {
                Ok(more) => done.extend(more),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        for (i, result) in done {
            results[i] = Some(result);
        }
    });
    results
        .into_iter()
        .map(|r| r.expect("every job index is taken exactly once"))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::{Condvar, Mutex};
    use std::thread::ThreadId;
    use std::time::Duration;

    use super::*;

    #[test]
    fn results_come_back_in_job_order() {
        let jobs: Vec<u64> = (0..1000).collect();
        for workers in [1, 2, 7] {
            assert_eq!(
                run_all(&jobs, workers, |j| j * 2),
                jobs.iter().map(|j| j * 2).collect::<Vec<_>>()
            );
        }
        assert!(run_all(&[] as &[u64], 4, |j| *j).is_empty());
    }

    /// With two workers, two jobs run on two threads at once: each waits (bounded) until the other has
    /// started, which one thread alone could never satisfy.
    #[test]
    fn two_workers_run_jobs_on_two_threads_at_once() {
        let started: Mutex<HashSet<ThreadId>> = Mutex::new(HashSet::new());
        let both = Condvar::new();
        let threads = run_all(&[0, 1], 2, |_| {
            let mut seen = started.lock().expect("not poisoned");
            seen.insert(std::thread::current().id());
            both.notify_all();
            let (seen, timeout) = both
                .wait_timeout_while(seen, Duration::from_secs(10), |s| s.len() < 2)
                .expect("not poisoned");
            assert!(!timeout.timed_out(), "the other job never ran alongside");
            seen.len()
        });
        assert_eq!(threads, [2, 2]);
    }

    #[test]
    fn zero_means_one_worker_per_core() {
        assert!(worker_count(0) >= 1);
        assert_eq!(worker_count(3), 3);
    }
}
