//! The CPU backend's fork-join pool: one job at a time, split into numbered tasks that the
//! calling thread and `threads - 1` workers claim from one shared counter.
//!
//! Why not rayon's pool: a decode step is a few hundred parallel ops of 0.05–0.3 ms with
//! serial stretches of tens of µs between them. An idle rayon-core 1.10 worker yields 32
//! times and then sleeps on a futex, so most ops of a step began with a wake (`perf sched`
//! on the 2-core machine: 0.16 ms average delay). Here an idle worker keeps polling for
//! [`SPIN`] after its last task (yielding its core to anything else runnable) and only then
//! sleeps; the thread that submits a job works on it too instead of waiting for a worker.
//!
//! Kernels reach the pool through the free functions ([`for_each`], [`chunks_mut`], ...),
//! which use the pool the calling thread runs in ([`Pool::install`]); outside any pool, and
//! inside a task (nested parallelism), they run the tasks in order on the calling thread.

use std::any::Any;
use std::cell::Cell;
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker polls for the next job before it sleeps.
pub const SPIN: Duration = Duration::from_millis(2);
/// Polls with a pause instruction before an idle worker starts yielding its core.
const PAUSES: u32 = 256;

/// Bits of the task index and the task count in [`Shared::state`]; the rest is the job's
/// generation.
const IDX_BITS: u32 = 20;
const IDX_MASK: u64 = (1 << IDX_BITS) - 1;
/// Most tasks in one job.
pub const MAX_TASKS: usize = IDX_MASK as usize;

/// What a participating thread runs: it pulls task indices from its [`Claims`] until none
/// are left.
type Body<'a> = dyn Fn(&Claims<'_>) + Sync + 'a;

/// Where one thread's tasks come from.
pub struct Claims<'a> {
    first: Cell<Option<usize>>,
    source: Source<'a>,
}

enum Source<'a> {
    /// Running alone: tasks `next..tasks` in order.
    Serial { next: Cell<usize>, tasks: usize },
    /// Claimed from the pool's counter for job `gen`.
    Pool { shared: &'a Shared, gen: u64 },
}

impl Claims<'_> {
    /// The next task index for this thread, or `None` when every task is taken.
    pub fn next(&self) -> Option<usize> {
        if let Some(i) = self.first.take() {
            return Some(i);
        }
        match &self.source {
            Source::Serial { next, tasks } => {
                let i = next.get();
                (i < *tasks).then(|| {
                    next.set(i + 1);
                    i
                })
            }
            Source::Pool { shared, gen } => shared.claim(*gen),
        }
    }
}

/// A job as workers find it: the body, behind a thin pointer.
struct JobRef<'a> {
    body: &'a Body<'a>,
}

/// State shared by the submitting thread and the workers.
struct Shared {
    threads: usize,
    /// `gen << 2·IDX_BITS | tasks << IDX_BITS | next`: the current job, how many tasks it
    /// has and the next unclaimed one. A new job stores a new generation.
    state: AtomicU64,
    /// The current job's [`JobRef`]; valid while any of its tasks is unfinished.
    job: AtomicPtr<JobRef<'static>>,
    /// Workers between noticing a job and leaving it; the submitter waits for 0.
    active: AtomicUsize,
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    /// One submitter at a time.
    submit: Mutex<()>,
    sleep: Mutex<()>,
    wake: Condvar,
    /// The first panic of a worker's task in the current job.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

fn gen_of(state: u64) -> u64 {
    state >> (2 * IDX_BITS)
}

impl Shared {
    /// Claims the next task of job `gen`, if that job is current and has one left.
    fn claim(&self, gen: u64) -> Option<usize> {
        let mut s = self.state.load(Ordering::SeqCst);
        loop {
            let (tasks, next) = ((s >> IDX_BITS) & IDX_MASK, s & IDX_MASK);
            if gen_of(s) != gen || next >= tasks {
                return None;
            }
            match self.state.compare_exchange_weak(s, s + 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Some(next as usize),
                Err(now) => s = now,
            }
        }
    }

    /// Waits until a job newer than `gen` is published (`Some(its state)`) or the pool shuts
    /// down (`None`): polls for [`SPIN`], then sleeps.
    fn wait_newer(&self, gen: u64) -> Option<u64> {
        let start = Instant::now();
        let mut polls = 0u32;
        loop {
            let s = self.state.load(Ordering::Acquire);
            if gen_of(s) != gen {
                return Some(s);
            }
            if self.shutdown.load(Ordering::Acquire) {
                return None;
            }
            polls = polls.wrapping_add(1);
            if polls < PAUSES {
                std::hint::spin_loop();
            } else if polls % 64 == 0 && start.elapsed() > SPIN {
                break;
            } else {
                std::thread::yield_now();
            }
        }
        let mut guard = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let s = loop {
            let s = self.state.load(Ordering::SeqCst);
            if gen_of(s) != gen || self.shutdown.load(Ordering::SeqCst) {
                break s;
            }
            guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        };
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        (gen_of(s) != gen).then(|| s)
    }

    /// Runs `tasks` tasks of `body` on this thread and the workers; returns when all are done.
    /// A panic in any task is resumed here once no worker touches the job any more.
    fn run(&self, tasks: usize, body: &Body<'_>) {
        let _one = self.submit.lock().unwrap_or_else(|e| e.into_inner());
        let job = JobRef { body };
        // SAFETY (lifetime erasure): workers dereference the pointer only while they hold an
        // unfinished task of this job, and this function returns only after every task is
        // claimed and `active` is 0, so no worker uses `job` after it is dropped.
        self.job.store(&job as *const JobRef<'_> as *mut JobRef<'static>, Ordering::Release);
        let gen = (gen_of(self.state.load(Ordering::Relaxed)) + 1) & ((1 << (64 - 2 * IDX_BITS)) - 1);
        self.state.store(gen << (2 * IDX_BITS) | (tasks as u64) << IDX_BITS, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_all();
        }
        let claims = Claims { first: Cell::new(None), source: Source::Pool { shared: self, gen } };
        let mine = in_task(|| catch_unwind(AssertUnwindSafe(|| body(&claims))));
        // every task is claimed once this thread's last claim failed; after a panic here the
        // rest are dropped. Then wait until no worker runs one.
        if mine.is_err() {
            while self.claim(gen).is_some() {}
        }
        let mut polls = 0u32;
        while self.active.load(Ordering::SeqCst) != 0 {
            polls = polls.wrapping_add(1);
            if polls < PAUSES {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let theirs = self.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if let Some(p) = theirs {
            resume_unwind(p);
        }
    }

    fn worker(&self) {
        let mut gen = 0;
        while let Some(s) = self.wait_newer(gen) {
            gen = gen_of(s);
            // `active` before the claim: a submitter that finds every task claimed and
            // `active` at 0 knows no worker holds (or can still take) one of its tasks
            self.active.fetch_add(1, Ordering::SeqCst);
            if let Some(first) = self.claim(gen) {
                // SAFETY: a task of job `gen` is claimed and unfinished, so its submitter is
                // still waiting and the `JobRef` it stored before publishing `gen` is alive.
                let job = unsafe { &*self.job.load(Ordering::Acquire) };
                let claims = Claims { first: Cell::new(Some(first)), source: Source::Pool { shared: self, gen } };
                let r = in_task(|| catch_unwind(AssertUnwindSafe(|| (job.body)(&claims))));
                if let Err(p) = r {
                    let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                    slot.get_or_insert(p);
                }
            }
            self.active.fetch_sub(1, Ordering::Release);
        }
    }
}

/// A fork-join pool of `threads` threads: the submitting one plus `threads - 1` workers.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

thread_local! {
    /// The pool this thread submits to (set by [`Pool::install`]).
    static CURRENT: Cell<*const Shared> = Cell::new(std::ptr::null());
    /// Set while this thread runs a task: parallel calls inside run in order.
    static IN_TASK: Cell<bool> = Cell::new(false);
}

/// Runs `f` with [`IN_TASK`] set, restoring it afterwards (also when `f` panics).
fn in_task<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_TASK.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(IN_TASK.with(|c| c.replace(true)));
    f()
}

impl Pool {
    /// A pool of `threads` threads (at least 1); fails when a worker thread cannot start.
    pub fn new(threads: usize) -> std::io::Result<Pool> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            threads,
            state: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            active: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            submit: Mutex::new(()),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            panic: Mutex::new(None),
        });
        let mut pool = Pool { shared, workers: Vec::with_capacity(threads - 1) };
        for i in 1..threads {
            let s = Arc::clone(&pool.shared);
            // dropping `pool` on failure stops the workers already started
            let h = std::thread::Builder::new().name(format!("qwen3-vl-cpu-{}", i)).spawn(move || s.worker())?;
            pool.workers.push(h);
        }
        Ok(pool)
    }

    pub fn threads(&self) -> usize {
        self.shared.threads
    }

    /// Runs `f` on this thread with `self` as the pool that parallel calls inside use.
    pub fn install<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Restore(*const Shared);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(CURRENT.with(|c| c.replace(Arc::as_ptr(&self.shared))));
        f()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// Runs `body` for `tasks` tasks: on the current pool's threads, or in order on this thread
/// (outside a pool, inside a task, one task or one thread).
fn dispatch(tasks: usize, body: &Body<'_>) {
    assert!(tasks <= MAX_TASKS, "cpu pool: {} tasks in one job (at most {})", tasks, MAX_TASKS);
    if tasks == 0 {
        return;
    }
    let cur = CURRENT.with(|c| c.get());
    // SAFETY: `CURRENT` is set only by `Pool::install`, which keeps its pool alive (it
    // borrows it) and restores the previous value before returning.
    let shared = if cur.is_null() { None } else { Some(unsafe { &*cur }) };
    match shared {
        Some(sh) if sh.threads > 1 && tasks > 1 && !IN_TASK.with(|c| c.get()) => sh.run(tasks, body),
        _ => {
            let claims = Claims { first: Cell::new(None), source: Source::Serial { next: Cell::new(0), tasks } };
            in_task(|| body(&claims))
        }
    }
}

/// Threads of the pool this thread runs in (1 outside any pool).
pub fn threads() -> usize {
    let cur = CURRENT.with(|c| c.get());
    if cur.is_null() {
        1
    } else {
        // SAFETY: as in `dispatch`.
        unsafe { (*cur).threads }
    }
}

/// `f(i)` for every `i` in `0..tasks`, in parallel.
pub fn for_each(tasks: usize, f: impl Fn(usize) + Sync) {
    for_each_init(tasks, || (), |_, i| f(i));
}

/// `f(&mut state, i)` for every `i` in `0..tasks`, in parallel; each thread that takes part
/// makes its `state` once with `init` (scratch buffers).
pub fn for_each_init<S>(tasks: usize, init: impl Fn() -> S + Sync, f: impl Fn(&mut S, usize) + Sync) {
    dispatch(tasks, &|c: &Claims<'_>| {
        if let Some(first) = c.next() {
            let mut s = init();
            f(&mut s, first);
            while let Some(i) = c.next() {
                f(&mut s, i)
            }
        }
    });
}

/// `f(i)` for every `i` in `0..tasks`, in parallel, collected in order.
pub fn map<T: Send>(tasks: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let mut slots: Vec<Option<T>> = (0..tasks).map(|_| None).collect();
    chunks_mut(&mut slots, 1, |i, slot| slot[0] = Some(f(i)));
    slots.into_iter().map(|x| x.expect("every task ran")).collect()
}

/// `out` split into chunks of `chunk` elements (the last may be shorter), handed out once each.
struct Chunks<'a, T> {
    ptr: *mut T,
    len: usize,
    chunk: usize,
    _out: PhantomData<&'a mut [T]>,
}
// SAFETY: each chunk index is handed to exactly one task (`Claims` yields every index once),
// so the mutable chunks never alias; `T: Send` because they are written from other threads.
unsafe impl<T: Send> Sync for Chunks<'_, T> {}

impl<'a, T> Chunks<'a, T> {
    /// # Safety
    /// Each `i` may be taken at most once while the chunks live.
    unsafe fn get(&self, i: usize) -> &'a mut [T] {
        let start = i * self.chunk;
        std::slice::from_raw_parts_mut(self.ptr.add(start), self.chunk.min(self.len - start))
    }
}

/// `f(i, chunk_i)` for the chunks of `chunk` elements of `out` (`chunk` ≥ 1), in parallel.
pub fn chunks_mut<T: Send>(out: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    chunks_mut_init(out, chunk, || (), |_, i, c| f(i, c));
}

/// [`chunks_mut`] with per-thread state made by `init`, as [`for_each_init`].
pub fn chunks_mut_init<T: Send, S>(out: &mut [T], chunk: usize, init: impl Fn() -> S + Sync, f: impl Fn(&mut S, usize, &mut [T]) + Sync) {
    let chunk = chunk.max(1);
    let tasks = (out.len() + chunk - 1) / chunk;
    let chunks = Chunks { ptr: out.as_mut_ptr(), len: out.len(), chunk, _out: PhantomData };
    // SAFETY: `for_each_init` calls `f` once per index in 0..tasks.
    for_each_init(tasks, init, |s, i| f(s, i, unsafe { chunks.get(i) }));
}

/// Runs `f` in a 3-thread pool of this thread's own (kernel tests: the tasks really split).
#[cfg(test)]
pub(crate) fn in_test_pool<R>(f: impl FnOnce() -> R) -> R {
    thread_local! {
        static TEST_POOL: Pool = Pool::new(3).expect("test pool");
    }
    TEST_POOL.with(|p| p.install(f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_task_runs_once_in_and_outside_a_pool() {
        for threads in [1, 2, 4] {
            let pool = Pool::new(threads).unwrap();
            for tasks in [0, 1, 2, 3, 7, 64, 1000] {
                let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                pool.install(|| for_each(tasks, |i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                }));
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "threads {} tasks {}", threads, tasks);
            }
        }
        let mut v = vec![0u32; 10];
        chunks_mut(&mut v, 3, |i, c| c.iter_mut().for_each(|x| *x = i as u32));
        assert_eq!(v, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]);
    }

    #[test]
    fn workers_take_part_and_nested_calls_run_inline() {
        let pool = Pool::new(3).unwrap();
        assert_eq!(pool.install(threads), 3);
        assert_eq!(threads(), 1);
        let ids = Mutex::new(std::collections::HashSet::new());
        // many rounds, each task slow enough that an idle worker joins in
        for _ in 0..50 {
            pool.install(|| {
                for_each(8, |_| {
                    ids.lock().unwrap().insert(std::thread::current().id());
                    std::thread::sleep(Duration::from_micros(200));
                    // nested: runs on this thread, in order
                    let n = AtomicUsize::new(0);
                    for_each(4, |i| assert_eq!(n.fetch_add(1, Ordering::Relaxed), i));
                })
            });
        }
        assert!(ids.lock().unwrap().len() > 1, "no worker ever ran a task");
        let mut v = vec![0usize; 1000];
        pool.install(|| chunks_mut_init(&mut v, 7, || 5usize, |s, i, c| c.iter_mut().for_each(|x| *x = i * 7 + *s)));
        assert!(v.iter().enumerate().all(|(j, &x)| x == (j / 7) * 7 + 5));
    }

    #[test]
    fn a_panicking_task_panics_the_caller_and_the_pool_still_works() {
        let pool = Pool::new(2).unwrap();
        for _ in 0..20 {
            let r = catch_unwind(AssertUnwindSafe(|| pool.install(|| for_each(16, |i| assert!(i != 11, "task 11")))));
            assert!(r.is_err());
        }
        // a panic on the serial path (one task) leaves the thread able to submit again
        let r = catch_unwind(AssertUnwindSafe(|| pool.install(|| for_each(1, |_| panic!("alone")))));
        assert!(r.is_err() && !IN_TASK.with(|c| c.get()));
        let n = AtomicUsize::new(0);
        pool.install(|| for_each(100, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        }));
        assert_eq!(n.load(Ordering::Relaxed), 100);
    }

    #[test]
    fn two_threads_may_share_one_pool() {
        let pool = Arc::new(Pool::new(2).unwrap());
        let users: Vec<_> = (0..2)
            .map(|_| {
                let pool = Arc::clone(&pool);
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let n = AtomicUsize::new(0);
                        pool.install(|| for_each(9, |_| {
                            n.fetch_add(1, Ordering::Relaxed);
                        }));
                        assert_eq!(n.load(Ordering::Relaxed), 9);
                    }
                })
            })
            .collect();
        users.into_iter().for_each(|u| u.join().unwrap());
    }
}
