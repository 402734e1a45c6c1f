//! The CPU pool: where waitd does the work whose cost a stranger's input decides,
//! away from the async runtime's threads.
//!
//! That work is parsing a request's expressions and paths when a wait is created,
//! and reading a target's answer (its JSON, the state path, the conditions) at a
//! poll. Each piece is bounded on its own (lengths, nesting, the evaluation
//! budgets of docs/design.md §3.3 and §3.13); the pool bounds what they cost
//! together:
//!
//! - **Bounded.** A fixed number of threads (`--cpu-threads`), so that such work
//!   takes at most those cores, and the runtime's threads, which answer `/healthz`,
//!   renew leases and serve every other request, are never the ones doing it.
//! - **Fair.** Jobs queue per tenant, and the threads take the tenants in turn, one
//!   job each: a tenant with a thousand jobs queued delays another tenant's next
//!   job by at most one job per thread.
//! - **Deep.** Its threads have [`STACK`] bytes of stack, sized for the recursion
//!   of the CEL parser on the longest expression waitd accepts (measured in
//!   `tests/conditions_props.rs`); everything after the parse is bounded by the
//!   nesting limit the parse checks. A stack is reserved address space: only the
//!   pages a job touches are ever committed.
//! - **Never stuck.** A job whose caller has gone (a probe cut at its wait's
//!   deadline, a client that hung up) is dropped without running; a job that panics
//!   is reported to its caller as [`Lost`], and the thread goes on.
//!
//! The pool is one per process, started on first use with the size given to
//! [`configure`] (or the number of cores).

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// The stack of each pool thread.
pub const STACK: usize = 64 * 1024 * 1024;

/// The key under which work that belongs to no tenant (a stored spec decoded at a
/// claim, a preset file) is queued.
pub const SYSTEM: &str = "";

/// A job was lost: it panicked, or the pool could not take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the work could not be done (it failed inside waitd's CPU pool)")]
pub struct Lost;

type Job = Box<dyn FnOnce() + Send>;

/// The fixed set of threads and their per-tenant queues.
pub struct Pool {
    shared: Arc<Shared>,
    threads: usize,
}

struct Shared {
    queues: Mutex<Queues>,
    ready: Condvar,
    /// Jobs queued or running, for the metric.
    pending: AtomicUsize,
}

#[derive(Default)]
struct Queues {
    by_tenant: HashMap<Arc<str>, VecDeque<Job>>,
    /// Tenants with jobs queued, in the order they get their next turn.
    turns: VecDeque<Arc<str>>,
}

thread_local! {
    static ON_POOL: Cell<bool> = const { Cell::new(false) };
}

static SIZE: OnceLock<usize> = OnceLock::new();
static POOL: OnceLock<Pool> = OnceLock::new();

/// Sets the number of threads the pool starts with; only the first call before the
/// pool's first use counts.
pub fn configure(threads: usize) {
    let _ = SIZE.set(threads.max(1));
}

/// The process's pool, started on first use.
pub fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        let threads = *SIZE.get_or_init(|| {
            std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get)
        });
        Pool::start(threads)
    })
}

/// Whether the calling thread is one of the pool's.
pub fn on_pool_thread() -> bool {
    ON_POOL.with(Cell::get)
}

impl Pool {
    fn start(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            queues: Mutex::default(),
            ready: Condvar::new(),
            pending: AtomicUsize::new(0),
        });
        for i in 0..threads {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("waitd-cpu-{i}"))
                .stack_size(STACK)
                .spawn(move || {
                    ON_POOL.with(|p| p.set(true));
                    loop {
                        let job = shared.next();
                        job();
                        shared.pending.fetch_sub(1, Relaxed);
                    }
                })
                .expect("the CPU pool's threads start");
        }
        Pool { shared, threads }
    }

    /// The number of threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Jobs queued or running now.
    pub fn pending(&self) -> usize {
        self.shared.pending.load(Relaxed)
    }

    /// Runs `f` on the pool in `tenant`'s turn and returns what it returned. If the
    /// returned future is dropped before the job starts, the job never runs.
    pub async fn run<T, F>(&self, tenant: &str, f: F) -> Result<T, Lost>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.push(
            tenant,
            Box::new(move || {
                if tx.is_closed() {
                    return;
                }
                let _ = tx.send(catch_unwind(AssertUnwindSafe(f)).map_err(|_| Lost));
            }),
        );
        rx.await.unwrap_or(Err(Lost))
    }

    /// Runs `f` on the pool and blocks the calling thread until it is done; on a
    /// pool thread, runs it at once. For synchronous callers whose work is small
    /// but needs the pool's stack (a stored expression decoded at a claim).
    pub fn run_blocking<T, F>(&self, f: F) -> Result<T, Lost>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        if on_pool_thread() {
            return catch_unwind(AssertUnwindSafe(f)).map_err(|_| Lost);
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.push(
            SYSTEM,
            Box::new(move || {
                let _ = tx.send(catch_unwind(AssertUnwindSafe(f)).map_err(|_| Lost));
            }),
        );
        rx.recv().unwrap_or(Err(Lost))
    }

    fn push(&self, tenant: &str, job: Job) {
        self.shared.pending.fetch_add(1, Relaxed);
        let mut q = self.shared.lock();
        match q.by_tenant.get_mut(tenant) {
            Some(jobs) => jobs.push_back(job),
            None => {
                let key: Arc<str> = Arc::from(tenant);
                q.by_tenant.insert(key.clone(), VecDeque::from([job]));
                q.turns.push_back(key);
            }
        }
        drop(q);
        self.shared.ready.notify_one();
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next job: the first job of the tenant whose turn it is; that tenant goes
    /// to the back of the line if it has more.
    fn next(&self) -> Job {
        let mut q = self.lock();
        loop {
            if let Some(tenant) = q.turns.pop_front() {
                let jobs = q
                    .by_tenant
                    .get_mut(&tenant)
                    .expect("a tenant in line has a queue");
                let job = jobs.pop_front().expect("a tenant in line has a job");
                if jobs.is_empty() {
                    q.by_tenant.remove(&tenant);
                } else {
                    q.turns.push_back(tenant);
                }
                return job;
            }
            q = self.ready.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Holds the pool's one thread with a job of tenant "a" until the sender is
    /// used, so that a queue builds up behind it.
    fn hold(pool: &Pool) -> mpsc::Sender<()> {
        let (tx, rx) = mpsc::channel::<()>();
        pool.push(
            "a",
            Box::new(move || {
                let _ = rx.recv();
            }),
        );
        tx
    }

    #[test]
    fn tenants_take_turns_whatever_one_of_them_queued() {
        let pool = Pool::start(1);
        let hold_tx = hold(&pool);
        let (order_tx, order_rx) = mpsc::channel();
        for i in 0..50 {
            let tx = order_tx.clone();
            pool.push("a", Box::new(move || tx.send(format!("a{i}")).unwrap()));
        }
        for i in 0..2 {
            let tx = order_tx.clone();
            pool.push("b", Box::new(move || tx.send(format!("b{i}")).unwrap()));
        }
        hold_tx.send(()).unwrap();
        let order: Vec<String> = (0..52).map(|_| order_rx.recv().unwrap()).collect();
        let b0 = order.iter().position(|s| s == "b0").unwrap();
        let b1 = order.iter().position(|s| s == "b1").unwrap();
        assert!(b0 <= 1 && b1 <= 3, "b waited behind a's queue: {order:?}");
    }

    #[test]
    fn a_job_that_panics_is_lost_and_the_thread_goes_on() {
        let pool = Pool::start(1);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let lost: Result<(), Lost> = rt.block_on(pool.run("a", || panic!("boom")));
        assert_eq!(lost, Err(Lost));
        assert_eq!(rt.block_on(pool.run("a", || 7)), Ok(7));
        assert_eq!(pool.run_blocking(|| 8), Ok(8));
    }

    #[test]
    fn a_job_whose_caller_left_never_runs() {
        let pool = Pool::start(1);
        let hold_tx = hold(&pool);
        let ran = Arc::new(AtomicUsize::new(0));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let r = ran.clone();
        let cut = rt.block_on(async {
            tokio::time::timeout(
                std::time::Duration::from_millis(10),
                pool.run("a", move || r.fetch_add(1, Relaxed)),
            )
            .await
        });
        assert!(cut.is_err());
        hold_tx.send(()).unwrap();
        // A job queued after it runs only once the dropped one has been passed over.
        assert_eq!(pool.run_blocking(|| 1), Ok(1));
        assert_eq!(ran.load(Relaxed), 0);
    }

    #[test]
    fn the_pool_threads_have_the_deep_stack() {
        let pool = Pool::start(1);
        // A recursion that would overflow a 2 MiB thread.
        fn down(n: u32) -> u32 {
            let pad = [n as u8; 1024];
            if n == 0 {
                return u32::from(pad[0]);
            }
            std::hint::black_box(&pad);
            down(n - 1) + 1
        }
        assert_eq!(pool.run_blocking(|| down(8_000)), Ok(8_000));
    }
}
