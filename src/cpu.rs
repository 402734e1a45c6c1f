//! The CPU pool: where waitd does the work whose cost a stranger's input decides,
//! away from the async runtime's threads.
//!
//! That work is parsing a request's expressions and paths when a wait is created,
//! and reading a target's answer (its JSON, the state path, the conditions) at a
//! poll. Each piece is bounded on its own (lengths, nesting, the evaluation
//! budgets of docs/engine.md §3.3 and §3.13); the pool bounds what they cost
//! together:
//!
//! - **Bounded.** A fixed number of threads in each lane (below), so that such work
//!   takes at most those cores, and the runtime's threads, which answer `/healthz`,
//!   renew leases and serve every other request, are never the ones doing it.
//! - **Fair.** Jobs queue per tenant, and the threads take the tenants in turn, one
//!   job each: a tenant with a thousand jobs queued delays another tenant's next
//!   job by at most one job per thread.
//! - **Two lanes.** Parsing a request (bounded by its length: milliseconds) is a
//!   [`Lane::Quick`] job; reading an answer (bounded by its budget, which can be a
//!   tenth of a second) a [`Lane::Long`] one. Each lane has threads of its own
//!   (`--cpu-threads` quick ones; one fewer long ones, at least one), so a create,
//!   or a stored expression decoded at a claim, never waits behind evaluations.
//!   The long lane's threads run last in line for a core (`SCHED_IDLE`, or nice
//!   19 where that is refused): when the cores are busy, the runtime's threads,
//!   the quick lane and the database go first, and evaluations take what is left.
//! - **Never starved.** What is left may be nothing for as long as other work
//!   keeps every core busy, and a thread under `SCHED_IDLE` can never be raised
//!   again. So the long lane has one more thread, its backstop, at nice 19 (it
//!   gives way to waitd's other threads, and keeps a share against the rest): every
//!   [`BACKSTOP_LOOK`] it reads how long the lane's threads waited for a core, and
//!   while they waited more than four fifths of it, it runs the jobs that have
//!   waited [`BACKSTOP_AFTER`] in the queue.
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
use std::time::{Duration, Instant};

/// The stack of each pool thread.
pub const STACK: usize = 64 * 1024 * 1024;

/// How often the long lane's backstop looks at the lane's threads.
pub const BACKSTOP_LOOK: Duration = Duration::from_millis(100);

/// How long a long job waits in its queue, while the lane's threads are starved of
/// a core, before the backstop runs it.
pub const BACKSTOP_AFTER: Duration = Duration::from_millis(500);

/// The key under which work that belongs to no tenant (a stored spec decoded at a
/// claim, a preset file) is queued.
pub const SYSTEM: &str = "";

/// A job was lost: it panicked, or the pool could not take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the work could not be done (it failed inside waitd's CPU pool)")]
pub struct Lost;

type Job = Box<dyn FnOnce() + Send>;

/// The two lanes' queues and threads.
pub struct Pool {
    quick: Arc<Queue>,
    long: Arc<Queue>,
    /// Jobs queued or running, for the metric.
    pending: Arc<AtomicUsize>,
    threads: usize,
}

/// What kind of work a job is, which decides where it queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Bounded by the length of a request: parsing at creation, decoding at a claim.
    Quick,
    /// Bounded by an evaluation budget: reading a target's answer.
    Long,
}

/// One lane's jobs, and the bell its threads wait on.
#[derive(Default)]
struct Queue {
    turns: Mutex<Turns>,
    ready: Condvar,
}

/// Jobs by tenant, and the tenants in the order of their next turn.
#[derive(Default)]
struct Turns {
    /// Each job with when it was queued.
    by_tenant: HashMap<Arc<str>, VecDeque<(Instant, Job)>>,
    turns: VecDeque<Arc<str>>,
}

impl Turns {
    fn push(&mut self, tenant: &str, job: Job) {
        match self.by_tenant.get_mut(tenant) {
            Some(jobs) => jobs.push_back((Instant::now(), job)),
            None => {
                let key: Arc<str> = Arc::from(tenant);
                self.by_tenant
                    .insert(key.clone(), VecDeque::from([(Instant::now(), job)]));
                self.turns.push_back(key);
            }
        }
    }

    /// The first job of the tenant whose turn it is; that tenant goes to the back
    /// of the line if it has more.
    fn pop(&mut self) -> Option<Job> {
        let tenant = self.turns.pop_front()?;
        let jobs = self
            .by_tenant
            .get_mut(&tenant)
            .expect("a tenant in line has a queue");
        let (_, job) = jobs.pop_front().expect("a tenant in line has a job");
        if jobs.is_empty() {
            self.by_tenant.remove(&tenant);
        } else {
            self.turns.push_back(tenant);
        }
        Some(job)
    }

    /// When the job queued longest was queued.
    fn oldest(&self) -> Option<Instant> {
        self.by_tenant
            .values()
            .filter_map(|jobs| jobs.front().map(|(at, _)| *at))
            .min()
    }
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Turns> {
        self.turns.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, tenant: &str, job: Job) {
        self.lock().push(tenant, job);
        self.ready.notify_one();
    }

    /// The next job, the tenants in turn; waits for one.
    fn next(&self) -> Job {
        let mut q = self.lock();
        loop {
            if let Some(job) = q.pop() {
                return job;
            }
            q = self.ready.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The next job, if one has been queued for `after` or longer.
    fn late(&self, after: Duration) -> Option<Job> {
        let mut q = self.lock();
        q.oldest().filter(|at| at.elapsed() >= after)?;
        q.pop()
    }
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
        let pool = Pool {
            quick: Arc::default(),
            long: Arc::default(),
            pending: Arc::default(),
            threads,
        };
        for i in 0..threads {
            pool.spawn(format!("waitd-cpu-{i}"), pool.quick.clone(), None);
        }
        let idle: Arc<Mutex<Vec<String>>> = Arc::default();
        for i in 0..threads.saturating_sub(1).max(1) {
            pool.spawn(
                format!("waitd-eval-{i}"),
                pool.long.clone(),
                Some(idle.clone()),
            );
        }
        let (long, pending) = (pool.long.clone(), pool.pending.clone());
        std::thread::Builder::new()
            .name("waitd-eval-backstop".into())
            .stack_size(STACK)
            .spawn(move || backstop(&long, &pending, &idle))
            .expect("the CPU pool's threads start");
        pool
    }

    /// Starts a thread taking `queue`'s jobs; with `idle`, one last in line for a
    /// core, which notes there where the kernel counts its waits for one.
    fn spawn(&self, name: String, queue: Arc<Queue>, idle: Option<Arc<Mutex<Vec<String>>>>) {
        let pending = self.pending.clone();
        std::thread::Builder::new()
            .name(name)
            .stack_size(STACK)
            .spawn(move || {
                ON_POOL.with(|p| p.set(true));
                if let Some(idle) = idle {
                    lower_priority();
                    if let Ok(task) = std::fs::read_link("/proc/thread-self") {
                        let stat = format!("/proc/{}/schedstat", task.display());
                        idle.lock().unwrap_or_else(|p| p.into_inner()).push(stat);
                    }
                }
                loop {
                    let job = queue.next();
                    job();
                    pending.fetch_sub(1, Relaxed);
                }
            })
            .expect("the CPU pool's threads start");
    }

    /// The number of threads of the quick lane (`--cpu-threads`); the long lane has
    /// one fewer (one, with one).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Jobs queued or running now.
    pub fn pending(&self) -> usize {
        self.pending.load(Relaxed)
    }

    /// Runs `f` on the pool in `tenant`'s turn of `lane` and returns what it
    /// returned. If the returned future is dropped before the job starts, the job
    /// never runs.
    pub async fn run<T, F>(&self, lane: Lane, tenant: &str, f: F) -> Result<T, Lost>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.push(
            lane,
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
            Lane::Quick,
            SYSTEM,
            Box::new(move || {
                let _ = tx.send(catch_unwind(AssertUnwindSafe(f)).map_err(|_| Lost));
            }),
        );
        rx.recv().unwrap_or(Err(Lost))
    }

    fn push(&self, lane: Lane, tenant: &str, job: Job) {
        self.pending.fetch_add(1, Relaxed);
        match lane {
            Lane::Quick => self.quick.push(tenant, job),
            Lane::Long => self.long.push(tenant, job),
        }
    }
}

/// The long lane's backstop: every [`BACKSTOP_LOOK`], if the lane's threads waited
/// for a core more than four fifths of it, runs the lane's jobs queued for
/// [`BACKSTOP_AFTER`] or longer. At nice 19, on the pool's deep stack.
fn backstop(long: &Queue, pending: &AtomicUsize, idle: &Mutex<Vec<String>>) {
    ON_POOL.with(|p| p.set(true));
    if let Err(e) =
        thread_priority::set_current_thread_priority(thread_priority::ThreadPriority::Min)
    {
        tracing::warn!(error = ?e, "the CPU pool's backstop runs at the normal priority");
    }
    let mut waited = run_delay(idle);
    loop {
        std::thread::sleep(BACKSTOP_LOOK);
        let now = run_delay(idle);
        let was_starved = starved(waited, now);
        waited = now;
        if !was_starved {
            continue;
        }
        while let Some(job) = long.late(BACKSTOP_AFTER) {
            job();
            pending.fetch_sub(1, Relaxed);
        }
    }
}

/// Whether the lane's threads waited for a core more than four fifths of the last
/// look, on average, from their run delays in all at its start and its end (and how
/// many threads they are). Where the kernel does not say, a job late in the queue is
/// reason enough.
fn starved(before: Option<(Duration, u32)>, now: Option<(Duration, u32)>) -> bool {
    match (before, now) {
        (Some((before, _)), Some((now, threads))) => {
            now.saturating_sub(before) > BACKSTOP_LOOK * 4 / 5 * threads
        }
        // The lane's threads had not started at the last look.
        (None, Some(_)) => false,
        (_, None) => true,
    }
}

/// How long the threads of `schedstat` (their `/proc/…/schedstat` files) have
/// waited on a run queue in all, the second of the file's three numbers, and how
/// many they are; `None` where one cannot be read.
fn run_delay(schedstat: &Mutex<Vec<String>>) -> Option<(Duration, u32)> {
    let files = schedstat.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if files.is_empty() {
        return None;
    }
    let mut ns: u64 = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).ok()?;
        ns = ns.saturating_add(text.split_whitespace().nth(1)?.parse().ok()?);
    }
    Some((Duration::from_nanos(ns), files.len() as u32))
}

/// Puts the calling thread last in line for a core: `SCHED_IDLE`, which any thread
/// may take, or, where the system refuses it, nice 19; where it refuses both, the
/// thread goes on at its priority.
///
/// Nice orders threads only within their scheduling group, and the database's
/// processes are in groups of their own (a session's autogroup, a container's
/// cgroup), against which a thread at nice 19 still weighs a whole group's share.
/// A `SCHED_IDLE` thread gives way to any other thread, of any group, as soon as
/// that one wakes.
fn lower_priority() {
    use thread_priority::{
        NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
        set_current_thread_priority, set_thread_priority_and_policy, thread_native_id,
    };
    let idle = set_thread_priority_and_policy(
        thread_native_id(),
        ThreadPriority::Min,
        ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle),
    );
    if let Err(e) = idle.or_else(|_| set_current_thread_priority(ThreadPriority::Min)) {
        tracing::warn!(error = ?e, "the CPU pool's evaluations run at the normal priority");
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
            Lane::Long,
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
            pool.push(
                Lane::Long,
                "a",
                Box::new(move || tx.send(format!("a{i}")).unwrap()),
            );
        }
        for i in 0..2 {
            let tx = order_tx.clone();
            pool.push(
                Lane::Long,
                "b",
                Box::new(move || tx.send(format!("b{i}")).unwrap()),
            );
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
        let lost: Result<(), Lost> = rt.block_on(pool.run(Lane::Long, "a", || panic!("boom")));
        assert_eq!(lost, Err(Lost));
        assert_eq!(rt.block_on(pool.run(Lane::Long, "a", || 7)), Ok(7));
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
                pool.run(Lane::Long, "a", move || r.fetch_add(1, Relaxed)),
            )
            .await
        });
        assert!(cut.is_err());
        hold_tx.send(()).unwrap();
        // A job of the same tenant and lane queued after it runs only once the
        // dropped one has been passed over.
        assert_eq!(rt.block_on(pool.run(Lane::Long, "a", || 1)), Ok(1));
        assert_eq!(ran.load(Relaxed), 0);
    }

    #[test]
    fn quick_jobs_never_wait_behind_long_ones() {
        // Two threads: long jobs may take one of them.
        let pool = Pool::start(2);
        let hold_tx = hold(&pool);
        let (long_tx, long_rx) = mpsc::channel();
        pool.push(Lane::Long, "b", Box::new(move || long_tx.send(()).unwrap()));
        // The long lane is full: the second long job waits, a quick one does not.
        assert_eq!(pool.run_blocking(|| 2), Ok(2));
        assert!(long_rx.try_recv().is_err(), "a second long job ran");
        hold_tx.send(()).unwrap();
        long_rx.recv().unwrap();
    }

    /// The nice value of the calling thread, from `/proc/thread-self/stat`.
    #[cfg(target_os = "linux")]
    /// The calling thread's scheduling policy (`SCHED_OTHER` 0, `SCHED_IDLE` 5).
    fn policy() -> i64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        // After the command's closing parenthesis: state is field 3, policy field 41.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        rest.split(' ').nth(38).unwrap().parse().unwrap()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn long_jobs_run_last_in_line_for_a_core_and_quick_ones_at_the_normal_priority() {
        const SCHED_IDLE: i64 = 5;
        let pool = Pool::start(2);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let here = policy();
        assert_ne!(here, SCHED_IDLE);
        assert_eq!(
            rt.block_on(pool.run(Lane::Long, "a", policy)),
            Ok(SCHED_IDLE)
        );
        assert_eq!(rt.block_on(pool.run(Lane::Quick, "a", policy)), Ok(here));
        assert_eq!(pool.run_blocking(policy), Ok(here));
    }

    /// With every core kept busy at the normal priority and the long lane's
    /// thread busy too, waiting for one, a long job queued behind it still runs:
    /// on the backstop.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_long_job_runs_while_other_work_keeps_every_core_busy() {
        use std::sync::atomic::AtomicBool;
        let pool = Pool::start(2);
        let stop = Arc::new(AtomicBool::new(false));
        let spin = |stop: Arc<AtomicBool>| {
            move || {
                while !stop.load(Relaxed) {
                    std::hint::spin_loop();
                }
            }
        };
        // The lane's thread takes a job that runs until the end, before the
        // cores are busy.
        let (started_tx, started) = mpsc::channel();
        let first = spin(stop.clone());
        pool.push(
            Lane::Long,
            "a",
            Box::new(move || {
                let _ = started_tx.send(std::thread::current().name().map(String::from));
                first();
            }),
        );
        assert_eq!(started.recv().unwrap().as_deref(), Some("waitd-eval-0"));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let busy: Vec<_> = (0..cores)
            .map(|_| std::thread::spawn(spin(stop.clone())))
            .collect();
        let (tx, rx) = mpsc::channel();
        pool.push(
            Lane::Long,
            "b",
            Box::new(move || {
                let _ = tx.send(std::thread::current().name().map(String::from));
            }),
        );
        // Not a bound on the time: without the backstop the job waits for as
        // long as the busy threads run.
        let ran_on = rx.recv_timeout(std::time::Duration::from_secs(60));
        stop.store(true, Relaxed);
        for b in busy {
            b.join().unwrap();
        }
        assert_eq!(ran_on.unwrap().as_deref(), Some("waitd-eval-backstop"));
    }

    #[test]
    fn starved_means_each_thread_waited_most_of_the_look_on_average() {
        let ms = Duration::from_millis;
        // Three threads that each waited 30 ms of 100 got most of their time.
        assert!(!starved(Some((ms(1000), 3)), Some((ms(1090), 3))));
        // One that waited 90 ms did not.
        assert!(starved(Some((ms(1000), 1)), Some((ms(1090), 1))));
        assert!(starved(Some((ms(1000), 3)), Some((ms(1270), 3))));
        assert!(!starved(None, Some((ms(1000), 1))));
        assert!(starved(Some((ms(1000), 1)), None));
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
