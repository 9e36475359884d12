//! The thread team behind [`crate::CpuBackend::for_each`]: `threads − 1` helper threads and the
//! calling thread, which runs items too. Between calls the helpers spin for a while (the
//! backend's `spin`, [`DEFAULT_SPIN`] unless set) before they park, as OpenMP's threads do:
//! a parked thread on a virtual machine's idle vCPU takes 60–110 µs to wake (measured on the
//! 2-core CI machines, `examples/parcost.rs`), longer than a whole decode step of one layer.
//!
//! Items are claimed in shrinking runs from the two ends of `0..n`: the caller from the front,
//! the helpers from the back, so each thread walks consecutive items (consecutive memory) and
//! a helper that is late costs nothing but its share. A call made while another is running
//! (another thread on the same backend, or an item calling back into the backend) runs its
//! items on its own thread, in order.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long helpers spin for the next call before they park.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(250);

/// `state`: the generation in the high 32 bits, [`CLOSED`], and the helpers that joined it in
/// the low 31 bits.
const CLOSED: u64 = 1 << 31;
const JOINED: u64 = CLOSED - 1;

/// One call's items, lifetime-erased (see [`Team::run`]'s SAFETY note).
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
}

struct Shared {
    /// Generation, closed bit and joined helpers (see [`CLOSED`]).
    state: AtomicU64,
    /// The open generation's job. Written only by the submitter while the previous generation
    /// is closed and every helper that joined it has finished; read only by a helper that
    /// joined the open generation.
    job: UnsafeCell<Job>,
    /// Unclaimed items `[front, back)`: front in the low 32 bits, back in the high 32 bits.
    items: AtomicU64,
    /// Helpers of the open generation that are done with it.
    finished: AtomicUsize,
    /// The first panic of a helper's item, re-raised on the calling thread.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Helpers parked (or about to): the submitter wakes them only when this is nonzero.
    sleepers: AtomicUsize,
    park: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    spin: Duration,
    /// Helpers that have started.
    started: AtomicUsize,
}

// SAFETY: `job` is the only field that is not `Sync` by itself; the generation protocol above
// orders every write of it before the reads of the helpers that join (Release store of `state`,
// Acquire CAS), and no write happens while a joined helper may read it.
unsafe impl Sync for Shared {}
// SAFETY: the raw job pointer is only dereferenced under the same protocol.
unsafe impl Send for Shared {}

/// `threads − 1` helpers and the caller.
pub(crate) struct Team {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    /// Held by the running call; a call that finds it held runs alone.
    submit: Mutex<()>,
}

impl Team {
    /// A team of `threads` (the caller and `threads − 1` helpers named `ssm-cpu-1..`). With
    /// more threads than the machine has cores the helpers park at once: a spinning helper would
    /// hold a core that the caller or another helper needs.
    pub(crate) fn new(threads: usize, spin: Duration) -> std::io::Result<Team> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let spin = if threads > cores { Duration::ZERO } else { spin };
        let shared = Arc::new(Shared {
            state: AtomicU64::new(CLOSED),
            job: UnsafeCell::new(Job { f: &nothing as &(dyn Fn(usize) + Sync) }),
            items: AtomicU64::new(0),
            finished: AtomicUsize::new(0),
            panic: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            park: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            spin,
            started: AtomicUsize::new(0),
        });
        let mut team = Team { shared, helpers: Vec::new(), submit: Mutex::new(()) };
        for i in 1..threads.max(1) {
            let s = Arc::clone(&team.shared);
            // On error, `team` drops here and stops the helpers already started.
            team.helpers.push(std::thread::Builder::new().name(format!("ssm-cpu-{i}")).spawn(move || helper(&s))?);
        }
        // Every helper running before the first call: a thread's start (its allocations included)
        // belongs to the backend's construction, not to some later call.
        while team.shared.started.load(Ordering::Acquire) < team.helpers.len() {
            std::thread::yield_now();
        }
        Ok(team)
    }

    /// Runs `f(i)` for every `i in 0..n` on the team; returns when all have run. A panic of an
    /// item is re-raised here after every item that started has finished.
    pub(crate) fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let guard = match self.submit.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        if guard.is_none() || self.helpers.is_empty() || n <= 1 || n > u32::MAX as usize {
            (0..n).for_each(f);
            return;
        }
        let sh = &*self.shared;
        let generation = ((sh.state.load(Ordering::Relaxed) >> 32) + 1) & 0xffff_ffff;
        // SAFETY: the previous generation is closed and all its joined helpers finished (the
        // previous `run` waited for them while holding `submit`, which this call holds now), so
        // no helper reads `job`. The erased lifetime: `f` outlives every use, because a helper
        // dereferences it only after joining this generation, and this function returns only
        // after closing the generation and waiting for every helper that joined it.
        unsafe {
            let f =
                std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const (dyn Fn(usize) + Sync + 'static)>(f);
            *sh.job.get() = Job { f };
        }
        sh.items.store((n as u64) << 32, Ordering::Relaxed);
        sh.finished.store(0, Ordering::Relaxed);
        sh.state.store(generation << 32, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = sh.park.lock().unwrap_or_else(|p| p.into_inner());
            sh.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| {
            while let Some(run) = claim(&sh.items, true) {
                run.for_each(f);
            }
        }));
        let joined = (sh.state.fetch_or(CLOSED, Ordering::AcqRel) & JOINED) as usize;
        while sh.finished.load(Ordering::Acquire) < joined {
            std::hint::spin_loop();
        }
        // A helper's panic is taken even when the caller's own is re-raised, so that no later
        // call reports it.
        let theirs = sh.panic.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(p) = mine.err().or(theirs) {
            resume_unwind(p);
        }
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.park.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.helpers.drain(..) {
            // A helper never panics (items run under `catch_unwind`); nothing to report.
            let _ = h.join();
        }
    }
}

/// The job before the first call.
fn nothing(_: usize) {}

/// Claims the next run of items from the front (the caller) or the back (helpers): an eighth of
/// what is left, at least one, so that a call of `n` items costs about `8·ln n` claims, not
/// `n` exchanges of one cache line between the cores, and the last runs are single items.
#[inline]
fn claim(items: &AtomicU64, front: bool) -> Option<std::ops::Range<usize>> {
    let mut s = items.load(Ordering::Relaxed);
    loop {
        let (lo, hi) = (s & 0xffff_ffff, s >> 32);
        if lo >= hi {
            return None;
        }
        let take = ((hi - lo) / 8).max(1);
        let (next, run) = if front { (s + take, lo..lo + take) } else { (s - (take << 32), hi - take..hi) };
        match items.compare_exchange_weak(s, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some(run.start as usize..run.end as usize),
            Err(now) => s = now,
        }
    }
}

/// A helper: wait for an open generation (spinning, then parked), join it, take items from the
/// back, report done; until shutdown.
fn helper(sh: &Shared) {
    let mut seen = sh.state.load(Ordering::Acquire) >> 32;
    sh.started.fetch_add(1, Ordering::Release);
    loop {
        let mut since = Instant::now();
        let mut polls = 0u32;
        loop {
            if sh.shutdown.load(Ordering::Relaxed) {
                return;
            }
            let s = sh.state.load(Ordering::Acquire);
            if s >> 32 != seen {
                if s & CLOSED != 0 {
                    seen = s >> 32;
                    since = Instant::now();
                } else if sh.state.compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    seen = s >> 32;
                    break;
                }
                continue;
            }
            polls = polls.wrapping_add(1);
            if !polls.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            if since.elapsed() < sh.spin {
                // Now and then the core is offered to any other runnable thread (a machine
                // busier than its cores, or one that runs threads one at a time, as valgrind does).
                std::thread::yield_now();
                continue;
            }
            // Park. The count is raised before the state is checked again under the lock, and the
            // submitter reads it after publishing, so one of them sees the other (both SeqCst).
            let mut g = sh.park.lock().unwrap_or_else(|p| p.into_inner());
            sh.sleepers.fetch_add(1, Ordering::SeqCst);
            while sh.state.load(Ordering::SeqCst) >> 32 == seen && !sh.shutdown.load(Ordering::SeqCst) {
                g = sh.wake.wait(g).unwrap_or_else(|p| p.into_inner());
            }
            sh.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(g);
            since = Instant::now();
        }
        // SAFETY: this helper joined the open generation `seen` (see `Shared::job`).
        let job = unsafe { *sh.job.get() };
        let r = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: the submitter keeps `f` alive until this helper reports done below.
            let f = unsafe { &*job.f };
            while let Some(run) = claim(&sh.items, false) {
                run.for_each(f);
            }
        }));
        if let Err(p) = r {
            sh.panic.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(p);
        }
        sh.finished.fetch_add(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    #[test]
    fn every_item_runs_once() {
        for threads in [1, 2, 3, 5] {
            let team = Team::new(threads, Duration::from_micros(50)).unwrap();
            for n in [0usize, 1, 2, 7, 100, 1000] {
                for round in 0..20 {
                    let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                    if round % 5 == 4 {
                        // Long enough for the helpers to park in between.
                        std::thread::sleep(Duration::from_micros(300));
                    }
                    team.run(n, &|i| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    });
                    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "threads {threads} n {n}");
                }
            }
        }
    }

    #[test]
    fn nested_and_concurrent_calls_run() {
        let team = Arc::new(Team::new(2, DEFAULT_SPIN).unwrap());
        let total = AtomicUsize::new(0);
        team.run(4, &|_| team.run(3, &|_| _ = total.fetch_add(1, Ordering::Relaxed)));
        assert_eq!(total.load(Ordering::Relaxed), 12);
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let t = Arc::clone(&team);
                std::thread::spawn(move || {
                    let c = AtomicUsize::new(0);
                    for _ in 0..200 {
                        t.run(16, &|_| _ = c.fetch_add(1, Ordering::Relaxed));
                    }
                    c.load(Ordering::Relaxed)
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), 3200);
        }
    }

    #[test]
    fn a_panicking_item_reaches_the_caller_and_the_team_goes_on() {
        let team = Team::new(2, DEFAULT_SPIN).unwrap();
        // The first item (the caller's), the last (a helper's), and both at once.
        for bad in [&[0usize][..], &[63], &[0, 63]] {
            let r = catch_unwind(AssertUnwindSafe(|| team.run(64, &|i| assert!(!bad.contains(&i), "item {i}"))));
            assert!(r.is_err());
        }
        let c = AtomicUsize::new(0);
        team.run(64, &|_| _ = c.fetch_add(1, Ordering::Relaxed));
        assert_eq!(c.load(Ordering::Relaxed), 64);
    }
}
