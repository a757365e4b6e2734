//! Engine round trips: NOPs through a ringfence worker beside NOPs through
//! the kernel's io_uring, and 8-byte PUTs through the engine over the
//! loopback driver.
//!
//! Every contender of the throughput groups (`nop_roundtrip`,
//! `loopback_put_8B`) runs the same loop on the bench thread (`drive`): it
//! writes a batch of 32 operations (user_data `i..i + 32`), submits it,
//! and keeps writing batches while at most 128 operations (four batches)
//! are in flight, i.e. submitted but not yet reaped; then it reaps what
//! is ready, up to 64 completions at a time, busy-polling with
//! `spin_loop` (never sleeping) when nothing is. Four batches keep the
//! core thread busy while the bench thread writes the next batch, and stay
//! far inside the default rings (SQ 256, CQ 512, 1024 requests), so a push
//! never finds the SQ full. `iter_custom` times `iters` operations from the
//! first submit to the last reap; the last batch may be partial. Setup
//! (workers, rings, the core thread) is outside the clock and shared by all
//! samples of one function. Throughput is in elements: one element is one
//! operation submitted and its completion reaped.
//!
//! - `nop_roundtrip`: `Sqe::nop()` through a loopback worker, progress made
//!   by the worker's core thread (`core_thread`) or by the bench thread
//!   itself after each submit and before each reap (`inline`); beside
//!   io_uring's `IORING_OP_NOP` on a 256-entry ring, one `io_uring_enter`
//!   (`submit`) per batch, where the kernel completes NOPs inside the call
//!   (`io_uring/nop`), and with an SQPOLL thread on the CPU the core thread
//!   would take, the peer of `core_thread` (`io_uring/sqpoll`).
//! - `loopback_put_8B`: 8-byte PUTs from a registered source buffer into a
//!   target worker's registered window, through an endpoint of the loopback
//!   driver (which copies inside `post`), inline or with a core thread.
//!
//! - `wake`: latency of one operation from a sleeping core thread
//!   (`ringfence/core_thread_asleep`: an 8-byte loopback PUT, submit to
//!   CQE, the bench thread spinning on its CQ) beside a plain eventfd wake
//!   between two threads (`eventfd/pingpong`). Each round trip starts with
//!   its sleeper asleep for `WAKE_GAP`; both sleepers run on the core
//!   thread's default CPU, the bench thread on its own.
//!
//! Before any timing, each contender runs 10,000 operations and checks that
//! every user_data came back exactly once with the expected result (0 for a
//! NOP, 8 for a PUT) and, for PUTs, that the window holds the source bytes
//! (the `wake` group: 200 round trips each, the same checks for its PUTs).
//! If io_uring is not available (kernel or seccomp), its function is skipped
//! with a message.
//!
//! The `core_thread` functions keep two threads busy-polling (this one and
//! the core thread): on a machine with two vCPUs they need both, and their
//! figures collapse whenever anything else runs.
//!
//! Run: `cargo bench -p ringfence-benches --bench engine` (add `-- wake`
//! for the `wake` group alone).

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use criterion::{criterion_group, criterion_main};
use io_uring::{IoUring, opcode, squeue};
use ringfence::{Loopback, QueuePair, RegisteredBuf, Worker};
use ringfence_ring::{Cqe, RemoteBuf, Sqe};
use std::hint::{black_box, spin_loop};
use std::time::{Duration, Instant};

/// Operations per submit.
const BATCH: usize = 32;
/// Operations in flight (submitted, not yet reaped) at most: four batches.
/// The same for every contender.
const DEPTH: u64 = 4 * BATCH as u64;
/// Completions taken per reap call.
const REAP: usize = 64;
/// Operations in each correctness check.
const CHECK: u64 = 10_000;
/// What the PUTs carry.
const PAYLOAD: [u8; 8] = *b"rfput-8B";

/// One contender: a submission and a completion queue, and whoever makes
/// progress between them.
trait Rig {
    /// Writes and submits `len` operations with user_data `first..first + len`.
    fn submit(&mut self, first: u64, len: usize);
    /// Takes the completions that are ready, calls `seen(user_data, res)`
    /// for each, and returns how many there were.
    fn reap<F: FnMut(u64, i32)>(&mut self, seen: &mut F) -> usize;
}

/// Runs `n` operations through `rig` with at most `DEPTH` in flight.
fn drive<R: Rig>(rig: &mut R, n: u64, mut seen: impl FnMut(u64, i32)) {
    let (mut sent, mut done) = (0u64, 0u64);
    while done < n {
        while sent < n && sent - done + BATCH as u64 <= DEPTH {
            let len = (n - sent).min(BATCH as u64) as usize;
            rig.submit(sent, len);
            sent += len as u64;
        }
        match rig.reap(&mut seen) {
            0 => spin_loop(),
            got => done += got as u64,
        }
    }
}

/// `CHECK` operations: every user_data back exactly once with `res`, and
/// nothing after the last.
fn check<R: Rig>(name: &str, rig: &mut R, res: i32) {
    let mut seen = vec![false; CHECK as usize];
    drive(rig, CHECK, |user_data, got| {
        assert_eq!(
            got, res,
            "{name}: user_data {user_data} completed with {got}"
        );
        let slot = seen
            .get_mut(user_data as usize)
            .unwrap_or_else(|| panic!("{name}: a completion for unknown user_data {user_data}"));
        assert!(!*slot, "{name}: user_data {user_data} completed twice");
        *slot = true;
    });
    // `drive` stopped after CHECK completions of distinct user_data in
    // 0..CHECK: all of them. Nothing more may come.
    for _ in 0..100 {
        assert_eq!(
            rig.reap(&mut |user_data, _| panic!("{name}: a completion too many ({user_data})")),
            0
        );
    }
}

/// Times `iters` operations through `rig`.
fn time<R: Rig>(rig: &mut R, iters: u64) -> Duration {
    let start = Instant::now();
    drive(rig, iters, |user_data, res| {
        black_box((user_data, res));
    });
    start.elapsed()
}

fn bench<R: Rig>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, mut rig: R) {
    group.bench_function(BenchmarkId::from_parameter(name), |b| {
        b.iter_custom(|iters| time(&mut rig, iters))
    });
}

// ------------------------------------------------------------ ringfence

fn loopback_worker() -> Worker {
    Worker::builder()
        .driver(Loopback::new())
        .ignore_env()
        .build()
        .expect("a loopback worker")
}

/// One queue pair of a worker; `template` is the operation, user_data set
/// per entry.
struct EngineRig {
    qp: QueuePair,
    worker: Worker,
    /// The bench thread makes progress itself (no core thread).
    inline: bool,
    template: Sqe,
    batch: [Sqe; BATCH],
    cqes: [Cqe; REAP],
}

impl EngineRig {
    fn new(mut worker: Worker, core_thread: bool, template: Sqe) -> EngineRig {
        if core_thread {
            worker
                .start_core_thread(None)
                .expect("a core thread (on its default CPU)");
        }
        let qp = worker.create_queue().expect("a queue pair");
        EngineRig {
            qp,
            worker,
            inline: !core_thread,
            template,
            batch: [Sqe::default(); BATCH],
            cqes: [Cqe::default(); REAP],
        }
    }
}

impl Rig for EngineRig {
    fn submit(&mut self, first: u64, len: usize) {
        for (k, slot) in self.batch[..len].iter_mut().enumerate() {
            *slot = self.template.with_user_data(first + k as u64);
        }
        let pushed = self.qp.push_batch(&self.batch[..len]).expect("SQ corrupt");
        assert_eq!(pushed, len, "the SQ holds DEPTH entries");
        self.qp.submit();
        if self.inline {
            self.qp.progress().expect("queue pair failed");
        }
    }

    fn reap<F: FnMut(u64, i32)>(&mut self, seen: &mut F) -> usize {
        if self.inline {
            self.qp.progress().expect("queue pair failed");
        }
        let n = self.qp.reap(&mut self.cqes).expect("CQ corrupt");
        for cqe in &self.cqes[..n] {
            seen(cqe.user_data, cqe.res);
        }
        n
    }
}

/// 8-byte PUTs from an initiator to a target worker's window.
struct PutRig {
    rig: EngineRig,
    /// Kept alive: the PUTs land in its window.
    _target: Worker,
    window: RegisteredBuf,
    _src: RegisteredBuf,
}

impl PutRig {
    fn new(core_thread: bool) -> Result<PutRig, ringfence::Error> {
        let target = loopback_worker();
        let initiator = loopback_worker();
        let window = target.alloc_registered(4096)?;
        let ep = initiator.connect(target.address())?;
        let rkey = initiator.unpack_rkey(ep, &target.pack_rkey(window.handle())?)?;
        let src = initiator.alloc_registered(64)?;
        src.write(0, &PAYLOAD);
        let remote = RemoteBuf {
            rkey: rkey.as_raw(),
            addr: window.addr(),
        };
        let put = Sqe::put(ep.as_raw(), src.local(0), remote, PAYLOAD.len() as u32);
        Ok(PutRig {
            rig: EngineRig::new(initiator, core_thread, put),
            _target: target,
            window,
            _src: src,
        })
    }

    /// `CHECK` PUTs, each completing with 8, and the bytes in the window.
    fn checked(mut self, name: &str) -> PutRig {
        let mut landed = [0u8; 8];
        self.window.read(0, &mut landed);
        assert_ne!(landed, PAYLOAD, "{name}: the window starts without them");
        check(name, &mut self, PAYLOAD.len() as i32);
        self.window.read(0, &mut landed);
        assert_eq!(landed, PAYLOAD, "{name}: the window holds the source bytes");
        let stats = self.rig.worker.stats();
        assert_eq!((stats.ops, stats.errors), (CHECK, 0), "{name}: {stats:?}");
        self
    }
}

impl Rig for PutRig {
    fn submit(&mut self, first: u64, len: usize) {
        self.rig.submit(first, len);
    }

    fn reap<F: FnMut(u64, i32)>(&mut self, seen: &mut F) -> usize {
        self.rig.reap(seen)
    }
}

// ------------------------------------------------------------ io_uring

/// The kernel's io_uring with NOPs. Plain: the kernel completes each NOP
/// inside the `io_uring_enter` that submits it. SQPOLL: a kernel thread
/// polls the SQ (pinned to the CPU the core thread would take, as the core
/// thread is, so that it and the bench thread run apart); `submit` enters
/// the kernel only to wake it, and the bench thread spins on the CQ.
struct UringRig {
    ring: IoUring,
    batch: Vec<squeue::Entry>,
}

impl UringRig {
    fn new() -> std::io::Result<UringRig> {
        Ok(UringRig {
            ring: IoUring::new(256)?,
            batch: Vec::with_capacity(BATCH),
        })
    }

    /// With an SQPOLL thread on `cpu` (unpinned if `None`) that sleeps
    /// after 1 s idle (never while the bench runs).
    fn sqpoll(cpu: Option<usize>) -> std::io::Result<UringRig> {
        let mut builder = IoUring::builder();
        builder.setup_sqpoll(1000);
        if let Some(cpu) = cpu {
            builder.setup_sqpoll_cpu(cpu as u32);
        }
        Ok(UringRig {
            ring: builder.build(256)?,
            batch: Vec::with_capacity(BATCH),
        })
    }
}

/// The CPU a core thread takes when none is chosen: the highest-numbered
/// one this thread may use other than the one it runs on now (as
/// `Worker::start_core_thread` picks it); `None` on a single CPU.
fn core_thread_cpu() -> Option<usize> {
    use nix::sched::{CpuSet, sched_getaffinity, sched_getcpu};
    let allowed = sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok()?;
    let here = sched_getcpu().ok();
    (0..CpuSet::count())
        .rev()
        .find(|&cpu| Some(cpu) != here && allowed.is_set(cpu).unwrap_or(false))
}

impl Rig for UringRig {
    fn submit(&mut self, first: u64, len: usize) {
        self.batch.clear();
        self.batch.extend(
            (first..first + len as u64)
                .map(|user_data| opcode::Nop::new().build().user_data(user_data)),
        );
        // SAFETY: a NOP refers to no buffer or file that could go away
        // before it completes.
        unsafe { self.ring.submission().push_multiple(&self.batch) }
            .expect("the SQ holds DEPTH entries");
        self.ring.submit().expect("io_uring_enter");
    }

    fn reap<F: FnMut(u64, i32)>(&mut self, seen: &mut F) -> usize {
        let mut n = 0;
        for cqe in self.ring.completion().take(REAP) {
            seen(cqe.user_data(), cqe.result());
            n += 1;
        }
        n
    }
}

// ------------------------------------------------------------ groups

fn nop_roundtrip(c: &mut Criterion) {
    // Correctness once per contender, before any timing.
    let mut core = EngineRig::new(loopback_worker(), true, Sqe::nop());
    check("ringfence/core_thread/batch32", &mut core, 0);
    let mut inline = EngineRig::new(loopback_worker(), false, Sqe::nop());
    check("ringfence/inline/batch32", &mut inline, 0);
    let uring = match UringRig::new() {
        Ok(mut rig) => {
            check("io_uring/nop/batch32", &mut rig, 0);
            Some(rig)
        }
        Err(e) => {
            println!("nop_roundtrip: io_uring/nop/batch32 skipped: io_uring_setup failed: {e}");
            None
        }
    };
    let sqpoll = match UringRig::sqpoll(core_thread_cpu()) {
        Ok(mut rig) => {
            check("io_uring/sqpoll/batch32", &mut rig, 0);
            Some(rig)
        }
        Err(e) => {
            println!("nop_roundtrip: io_uring/sqpoll/batch32 skipped: io_uring_setup failed: {e}");
            None
        }
    };

    let mut group = c.benchmark_group("nop_roundtrip");
    group.throughput(Throughput::Elements(1));
    bench(&mut group, "ringfence/core_thread/batch32", core);
    bench(&mut group, "ringfence/inline/batch32", inline);
    if let Some(rig) = uring {
        bench(&mut group, "io_uring/nop/batch32", rig);
    }
    if let Some(rig) = sqpoll {
        bench(&mut group, "io_uring/sqpoll/batch32", rig);
    }
    group.finish();
}

fn loopback_put_8b(c: &mut Criterion) {
    let inline = PutRig::new(false)
        .expect("loopback PUT setup")
        .checked("ringfence/inline/batch32");
    let core = PutRig::new(true)
        .expect("loopback PUT setup")
        .checked("ringfence/core_thread/batch32");

    let mut group = c.benchmark_group("loopback_put_8B");
    group.throughput(Throughput::Elements(1));
    bench(&mut group, "ringfence/inline/batch32", inline);
    bench(&mut group, "ringfence/core_thread/batch32", core);
    group.finish();
}

// ------------------------------------------------------------ wake

/// How long the sleeper has been asleep when a timed wake starts: every
/// contender waits this long (spinning) after its sleeper went to sleep,
/// so the sleeper's CPU is as idle in both.
const WAKE_GAP: Duration = Duration::from_micros(200);
/// Round trips in each correctness check of the `wake` group.
const WAKE_CHECK: u64 = 200;
/// How long a sleeper may take to fall asleep or answer before the bench
/// gives up (a hang, not a figure).
const WAKE_DEADLINE: Duration = Duration::from_secs(10);

fn spin_for(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        spin_loop();
    }
}

/// The CPU this thread runs on, and where each sleeper of the `wake` group
/// runs: the core thread's default placement (`Worker::start_core_thread`),
/// the highest-numbered CPU of this thread's allowed set other than that
/// one, if there is one.
fn wake_cpus() -> (Option<usize>, Option<usize>) {
    use nix::sched::{CpuSet, sched_getaffinity, sched_getcpu};
    let here = sched_getcpu().ok();
    let Ok(allowed) = sched_getaffinity(nix::unistd::Pid::from_raw(0)) else {
        return (here, None);
    };
    let other = (0..CpuSet::count())
        .rev()
        .find(|&cpu| Some(cpu) != here && allowed.is_set(cpu).unwrap_or(false));
    (here, other)
}

fn pin(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).expect("a CPU of the allowed set");
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).expect("sched_setaffinity");
}

/// One 8-byte PUT at a time through a loopback worker whose core thread
/// sleeps between them: each timed round trip starts with the core thread
/// asleep (in its wait on the SQ doorbell and the drivers' descriptors,
/// for `WAKE_GAP`), and ends when the bench thread, spinning on its CQ,
/// reaps the CQE.
struct AsleepRig {
    rig: PutRig,
    next: u64,
}

impl AsleepRig {
    /// The core thread runs on `cpu` (its default CPU if `None`).
    fn new(cpu: Option<usize>) -> AsleepRig {
        let mut rig = PutRig::new(false).expect("loopback PUT setup");
        rig.rig
            .worker
            .start_core_thread(cpu)
            .expect("a core thread");
        rig.rig.inline = false;
        AsleepRig { rig, next: 0 }
    }

    /// Waits until the core thread has gone to sleep again since the last
    /// round trip and slept for `WAKE_GAP`.
    fn until_asleep(&self, after: u64) {
        let worker = &self.rig.rig.worker;
        let deadline = Instant::now() + WAKE_DEADLINE;
        loop {
            assert!(Instant::now() < deadline, "the core thread never slept");
            if worker.core_thread_sleeps() > after && worker.is_core_thread_asleep() {
                spin_for(WAKE_GAP);
                if worker.is_core_thread_asleep() {
                    return;
                }
            }
            spin_loop();
        }
    }

    /// One timed round trip; returns its time and the CQE's result.
    fn round_trip(&mut self) -> (Duration, i32) {
        let sleeps = self.rig.rig.worker.core_thread_sleeps();
        self.until_asleep(sleeps.saturating_sub(1));
        let user_data = self.next;
        self.next += 1;
        let qp = &mut self.rig.rig.qp;
        let start = Instant::now();
        qp.push(self.rig.rig.template.with_user_data(user_data))
            .expect("an empty SQ");
        qp.submit();
        let cqe = loop {
            match qp.pop().expect("CQ corrupt") {
                Some(cqe) => break cqe,
                None => {
                    assert!(start.elapsed() < WAKE_DEADLINE, "no CQE: a lost wake-up");
                    spin_loop();
                }
            }
        };
        let elapsed = start.elapsed();
        assert_eq!(cqe.user_data, user_data);
        (elapsed, cqe.res)
    }
}

/// Two threads and an eventfd: the sleeper blocks in `read`, and once
/// woken stores the round's number in a flag, which the bench thread spins
/// on, as an application spins on its CQ.
struct EventfdRig {
    bell: std::sync::Arc<nix::sys::eventfd::EventFd>,
    flag: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sleeper: Option<std::thread::JoinHandle<()>>,
    next: u64,
}

impl EventfdRig {
    /// The sleeper runs on `cpu` (unpinned if `None`).
    fn new(cpu: Option<usize>) -> EventfdRig {
        use nix::sys::eventfd::{EfdFlags, EventFd};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let bell =
            Arc::new(EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC).expect("eventfd"));
        let flag = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let sleeper = {
            let (bell, flag, stop) = (bell.clone(), flag.clone(), stop.clone());
            std::thread::spawn(move || {
                if let Some(cpu) = cpu {
                    pin(cpu);
                }
                let mut round = 0;
                loop {
                    // Blocks until the bench thread writes.
                    bell.read().expect("eventfd read");
                    // Acquire: pairs with the Release store before the
                    // last write, so the flag is seen set.
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    round += 1;
                    // Release: pairs with the bench thread's Acquire load.
                    flag.store(round, Ordering::Release);
                }
            })
        };
        EventfdRig {
            bell,
            flag,
            stop,
            sleeper: Some(sleeper),
            next: 1,
        }
    }

    /// One timed wake: the sleeper has been blocked for `WAKE_GAP`.
    fn round_trip(&mut self) -> Duration {
        use std::sync::atomic::Ordering;
        spin_for(WAKE_GAP);
        let round = self.next;
        self.next += 1;
        let start = Instant::now();
        self.bell.write(1).expect("eventfd write");
        // Acquire: pairs with the sleeper's Release store.
        while self.flag.load(Ordering::Acquire) != round {
            assert!(start.elapsed() < WAKE_DEADLINE, "the sleeper never woke");
            spin_loop();
        }
        start.elapsed()
    }
}

impl Drop for EventfdRig {
    fn drop(&mut self) {
        // Release: pairs with the sleeper's Acquire load after its read.
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        let _ = self.bell.write(1);
        if let Some(sleeper) = self.sleeper.take() {
            let _ = sleeper.join();
        }
    }
}

fn wake(c: &mut Criterion) {
    // Both sleepers on the core thread's default CPU; the bench thread
    // (the application) stays on its own for the group, so that neither
    // contender's figure depends on where the scheduler moves it.
    let (here, sleeper_cpu) = wake_cpus();
    let saved =
        nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).expect("sched_getaffinity");
    let mut asleep = AsleepRig::new(sleeper_cpu);
    for _ in 0..WAKE_CHECK {
        let (_, res) = asleep.round_trip();
        assert_eq!(res, PAYLOAD.len() as i32, "a PUT completes with its length");
    }
    let mut landed = [0u8; 8];
    asleep.rig.window.read(0, &mut landed);
    assert_eq!(landed, PAYLOAD, "the window holds the source bytes");
    let mut eventfd = EventfdRig::new(sleeper_cpu);
    if let (Some(here), Some(_)) = (here, sleeper_cpu) {
        pin(here);
    }
    for _ in 0..WAKE_CHECK {
        eventfd.round_trip();
    }

    let mut group = c.benchmark_group("wake");
    // Every round trip waits (untimed) for its sleeper to fall asleep: keep
    // the iteration count down.
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sampling_mode(criterion::SamplingMode::Flat);
    group.throughput(Throughput::Elements(1));
    group.bench_function("ringfence/core_thread_asleep", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| asleep.round_trip().0).sum())
    });
    group.bench_function("eventfd/pingpong", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| eventfd.round_trip()).sum())
    });
    group.finish();
    let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &saved);
}

criterion_group!(benches, nop_roundtrip, loopback_put_8b, wake);
criterion_main!(benches);
