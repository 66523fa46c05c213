//! Issuance on every core. Each job is one certificate: a new key, a signature, the check before
//! publishing.
//!
//! - [`run_all`] (tests) spreads a batch over scoped threads and returns the results in job order.
//! - [`Background`] keeps a set of threads that run jobs while the owner's loop goes on serving: jobs
//!   for proxies that wait for their identity go first, and results come back in small chunks as they
//!   complete, in whatever order that is.

use std::collections::VecDeque;
use std::num::NonZeroUsize;
#[cfg(test)]
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use tokio::sync::mpsc;

/// How many threads `configured` (`issuance.workers`) means: itself, or one per core when 0.
pub fn worker_count(configured: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
}

#[cfg(test)]
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

/// How many jobs a background thread takes at once: small enough that results are published while a
/// large wave is still being issued, large enough that the queue's lock and the owner's wake-ups cost
/// little per certificate.
const CHUNK: usize = 16;

/// How many results may wait for the owner to take them before the threads pause: enough to go on
/// issuing through a long turn of the owner's loop (deciding 100,000 proxies takes about a second, and
/// the first jobs are submitted before it ends), few enough that a backlog never holds a whole wave's
/// certificates and keys in memory at once (about 3 KB each).
const IN_HAND: usize = 8192;

/// Whether a job is for a proxy that waits for its certificate (it has none, or a stream asks for it
/// now) or can wait itself (a renewal, a proxy that only watches trust bundles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// Run before any [`Priority::Later`] job.
    Urgent,
    /// Run when no urgent job is queued.
    Later,
}

/// Threads that run jobs in the background and send their results, in chunks, to a channel.
///
/// Dropping it stops the threads once their current chunk is done; queued jobs are dropped.
pub struct Background<J> {
    shared: Arc<Shared<J>>,
    threads: Vec<JoinHandle<()>>,
}

struct Shared<J> {
    queue: Mutex<Queue<J>>,
    ready: Condvar,
}

struct Queue<J> {
    urgent: VecDeque<J>,
    later: VecDeque<J>,
    /// Results sent and not yet taken ([`Background::taken`]).
    in_hand: usize,
    closed: bool,
}

impl<J> Queue<J> {
    fn take(&mut self, most: usize) -> Vec<J> {
        let mut taken = Vec::with_capacity(most.min(self.urgent.len() + self.later.len()));
        while taken.len() < most {
            match self.urgent.pop_front().or_else(|| self.later.pop_front()) {
                Some(job) => taken.push(job),
                None => break,
            }
        }
        taken
    }
}

impl<J: Send + 'static> Background<J> {
    /// Starts `workers` threads (at least one) that run `work` on every submitted job and send each
    /// chunk's results to `done`. A thread with no job to run calls `idle` (work that can wait, such as
    /// keys generated ahead) until it returns false, then sleeps until jobs come. A thread stops when
    /// `done` is closed.
    pub fn start<R, F, I>(
        workers: usize,
        work: F,
        idle: I,
        done: mpsc::UnboundedSender<Vec<R>>,
    ) -> Background<J>
    where
        R: Send + 'static,
        F: Fn(J) -> R + Send + Sync + 'static,
        I: Fn() -> bool + Send + Sync + 'static,
    {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                urgent: VecDeque::new(),
                later: VecDeque::new(),
                in_hand: 0,
                closed: false,
            }),
            ready: Condvar::new(),
        });
        let (work, idle) = (Arc::new(work), Arc::new(idle));
        let threads = (0..workers.max(1))
            .map(|i| {
                let (shared, work, idle, done) =
                    (shared.clone(), work.clone(), idle.clone(), done.clone());
                std::thread::Builder::new()
                    .name(format!("meshca-issue-{i}"))
                    .spawn(move || run_jobs(&shared, work.as_ref(), idle.as_ref(), &done))
                    .expect("the system can start an issuance thread")
            })
            .collect();
        Background { shared, threads }
    }

    /// Queues `jobs`, each at its priority, and wakes the threads.
    pub fn submit(&self, jobs: impl IntoIterator<Item = (J, Priority)>) {
        let mut queue = lock(&self.shared.queue);
        for (job, priority) in jobs {
            match priority {
                Priority::Urgent => queue.urgent.push_back(job),
                Priority::Later => queue.later.push_back(job),
            }
        }
        drop(queue);
        self.shared.ready.notify_all();
    }

    /// The owner took `count` results: the threads may go on if they paused for it.
    pub fn taken(&self, count: usize) {
        let mut queue = lock(&self.shared.queue);
        queue.in_hand = queue.in_hand.saturating_sub(count);
        drop(queue);
        self.shared.ready.notify_all();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A job that panics does so outside the lock; the queue is never left half-changed.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn run_jobs<J, R, F: Fn(J) -> R, I: Fn() -> bool>(
    shared: &Shared<J>,
    work: &F,
    idle: &I,
    done: &mpsc::UnboundedSender<Vec<R>>,
) {
    // Whether `idle` may have something to do: it said so last time, or the thread was woken since.
    let mut idle_work = true;
    loop {
        let jobs = {
            let mut queue = lock(&shared.queue);
            loop {
                if queue.closed {
                    return;
                }
                if queue.in_hand < IN_HAND {
                    let jobs = queue.take(CHUNK);
                    if !jobs.is_empty() {
                        queue.in_hand += jobs.len();
                        break jobs;
                    }
                }
                if idle_work {
                    break Vec::new();
                }
                queue = shared.ready.wait(queue).unwrap_or_else(|e| e.into_inner());
                idle_work = true;
            }
        };
        if jobs.is_empty() {
            // Outside the lock: jobs submitted meanwhile wait at most for one piece of idle work.
            idle_work = idle();
            continue;
        }
        idle_work = true;
        let mut results = Vec::with_capacity(jobs.len());
        for job in jobs {
            // Stopping does not wait for a chunk of slow jobs (RSA keys) to finish.
            if lock(&shared.queue).closed {
                return;
            }
            results.push(work(job));
        }
        if done.send(results).is_err() {
            return;
        }
    }
}

impl<J> Drop for Background<J> {
    fn drop(&mut self) {
        lock(&self.shared.queue).closed = true;
        self.shared.ready.notify_all();
        for thread in self.threads.drain(..) {
            // A thread that panicked has already reported it; the owner goes on without it.
            let _ = thread.join();
        }
    }
}

impl<J> std::fmt::Debug for Background<J> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let queue = lock(&self.shared.queue);
        f.debug_struct("Background")
            .field("threads", &self.threads.len())
            .field("urgent", &queue.urgent.len())
            .field("later", &queue.later.len())
            .finish()
    }
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
        let meeting = Meeting::default();
        let threads = run_all(&[0, 1], 2, |_| meeting.met_another_thread());
        assert_eq!(threads, [true, true], "the jobs never ran side by side");
    }

    /// Where jobs on different threads meet.
    #[derive(Default)]
    struct Meeting {
        seen: Mutex<HashSet<ThreadId>>,
        changed: Condvar,
    }

    impl Meeting {
        /// Records this thread and waits (at most 10 s) until a second thread has come too; whether
        /// one did.
        fn met_another_thread(&self) -> bool {
            let mut seen = self.seen.lock().expect("not poisoned");
            seen.insert(std::thread::current().id());
            self.changed.notify_all();
            let (seen, timeout) = self
                .changed
                .wait_timeout_while(seen, Duration::from_secs(10), |s| s.len() < 2)
                .expect("not poisoned");
            !timeout.timed_out() && seen.len() == 2
        }
    }

    /// Receives results until `count` have arrived, taking each chunk as the owner does.
    fn receive<J: Send + 'static, R>(
        pool: &Background<J>,
        results: &mut mpsc::UnboundedReceiver<Vec<R>>,
        count: usize,
    ) -> Vec<R> {
        let mut all = Vec::new();
        while all.len() < count {
            let chunk = results.blocking_recv().expect("the pool is running");
            pool.taken(chunk.len());
            all.extend(chunk);
        }
        all
    }

    /// The threads pause once IN_HAND results wait for the owner, and go on when it takes them.
    #[test]
    fn the_background_pool_pauses_while_results_wait_to_be_taken() {
        let allowed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = allowed.clone();
        let (done, mut results) = mpsc::unbounded_channel();
        let pool = Background::start(
            1,
            move |j: usize| j < IN_HAND || seen.load(Ordering::SeqCst),
            || false,
            done,
        );
        pool.submit((0..IN_HAND + 100).map(|j| (j, Priority::Later)));
        let mut first = 0;
        while first < IN_HAND {
            first += results.blocking_recv().expect("running").len();
        }
        assert_eq!(
            first, IN_HAND,
            "no result beyond the limit before any was taken"
        );
        allowed.store(true, Ordering::SeqCst);
        pool.taken(first);
        let rest = receive(&pool, &mut results, 100);
        assert!(rest.iter().all(|ran_after_taken| *ran_after_taken));
    }

    #[test]
    fn the_background_pool_returns_every_result_once() {
        let (done, mut results) = mpsc::unbounded_channel();
        let pool = Background::start(3, |j: u64| j * 2, || false, done);
        pool.submit((0..1000).map(|j| (j, Priority::Later)));
        pool.submit((1000..1100).map(|j| (j, Priority::Urgent)));
        let mut all = receive(&pool, &mut results, 1100);
        all.sort_unstable();
        assert_eq!(all, (0..1100).map(|j| j * 2).collect::<Vec<_>>());
        drop(pool);
        assert!(
            results.try_recv().is_err(),
            "nothing more after the last result"
        );
    }

    /// One thread, held busy by a first job while more are queued: the urgent ones, queued last, run
    /// first.
    #[test]
    fn urgent_jobs_run_before_those_that_can_wait() {
        let (started_tx, started) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = Mutex::new(released);
        let (done, mut results) = mpsc::unbounded_channel();
        let pool = Background::start(
            1,
            move |j: u32| {
                if j == 0 {
                    started_tx.send(()).expect("the test waits");
                    released
                        .lock()
                        .expect("not poisoned")
                        .recv()
                        .expect("released");
                }
                j
            },
            || false,
            done,
        );
        pool.submit([(0, Priority::Urgent)]);
        started.recv().expect("the first job started");
        pool.submit([(1, Priority::Later), (2, Priority::Later)]);
        pool.submit([(3, Priority::Urgent), (4, Priority::Urgent)]);
        release.send(()).expect("the job waits");
        assert_eq!(receive(&pool, &mut results, 5), [0, 3, 4, 1, 2]);
    }

    /// With two workers, two background jobs run on two threads at once: each waits (bounded) until
    /// the other has started, which one thread alone could never satisfy.
    #[test]
    fn two_background_workers_issue_on_two_threads_at_once() {
        let meeting = Meeting::default();
        let (started_tx, started) = std::sync::mpsc::channel();
        let (done, mut results) = mpsc::unbounded_channel();
        let pool = Background::start(
            2,
            move |_: u32| {
                started_tx.send(()).expect("the test waits");
                meeting.met_another_thread()
            },
            || false,
            done,
        );
        // One chunk each: a thread takes up to CHUNK jobs at once, so the second job must not be
        // queued before the first thread has taken the first.
        pool.submit([(0, Priority::Urgent)]);
        started.recv().expect("the first job started");
        pool.submit([(1, Priority::Urgent)]);
        assert_eq!(
            receive(&pool, &mut results, 2),
            [true, true],
            "the jobs never ran side by side"
        );
    }

    /// Idle threads do the idle work until it says it is done, and jobs still run.
    #[test]
    fn idle_threads_do_idle_work_until_it_is_done() {
        let count = Arc::new(AtomicUsize::new(0));
        let counted = count.clone();
        let (full_tx, full) = std::sync::mpsc::channel();
        let (done, mut results) = mpsc::unbounded_channel();
        let pool = Background::start(
            2,
            |j: u32| j + 1,
            move || {
                let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                if n == 5 {
                    full_tx.send(()).expect("the test waits");
                }
                n < 5
            },
            done,
        );
        full.recv().expect("the idle work ran to its end");
        pool.submit([(1, Priority::Later)]);
        assert_eq!(receive(&pool, &mut results, 1), [2]);
        drop(pool);
        assert!(count.load(Ordering::SeqCst) >= 5);
    }

    #[test]
    fn zero_means_one_worker_per_core() {
        assert!(worker_count(0) >= 1);
        assert_eq!(worker_count(3), 3);
    }
}
