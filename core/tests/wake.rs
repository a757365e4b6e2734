//! The core thread's sleep and wake-ups: through the SQ doorbell, through a
//! driver's wake descriptor while operations are in flight, and on to an
//! application that sleeps on its CQ eventfd.
//!
//! Nothing here synchronizes by sleeping or asserts on timing: threads wait
//! for conditions, and every wait has a generous deadline that only a hang
//! (a lost wake-up) reaches.
//!
//! `Device` is a driver whose operations finish on their own, as a NIC's
//! do: `post` queues the operation, `commit` hands the round's operations
//! to a device thread, which performs each copy later (when its gate is
//! open), publishes the completion and signals an eventfd, the driver's
//! wake descriptor. `poll` clears the eventfd first and then takes the
//! published completions, so one published after the clear leaves it
//! readable: a level-triggered descriptor, which needs no arming.
//!
//! `Device::one_shot` is the other kind, the kind a verbs completion
//! channel is: two descriptors (one per completion queue, jobs alternate
//! between them), signalled only when armed. `prepare_sleep` arms them
//! and then looks once more (not now if something finished meanwhile);
//! the device signals the first completion after the arming, once; `woke`
//! acknowledges and disarms. A busy-polling core thread arms nothing.

// The device copies registered memory, as a NIC would, through raw
// pointers the engine vouches for (`Driver::post`'s safety contract).
#![allow(unsafe_code)]

use nix::sys::eventfd::{EfdFlags, EventFd};
use ringfence::{
    Capabilities, Completion, CompletionMode, Connect, Driver, DriverContext, DriverEp,
    DriverError, DriverMemKey, DriverRkey, KeyPart, LaneMask, Loopback, MemDesc, MemKinds, Op,
    OpKind, Posted, Prepared, QueuePair, Quiesce, Quiesced, Registered, RegisteredBuf, Sleep,
    Token, Unpacked, Worker,
};
use ringfence_ring::{RemoteBuf, Sqe, Status};
use ringfence_testkit::{FaultInjector, SimDriver, SimTiming, Timing};
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longer than any wait can take on a loaded machine unless a wake-up was
/// lost.
const HANG: Duration = Duration::from_secs(60);

/// What the device thread does for one operation.
#[derive(Debug, Clone, Copy)]
enum Job {
    /// Copy `len` bytes from `src` to `dst`, then complete `token` with
    /// `len`.
    Copy {
        src: u64,
        dst: u64,
        len: u32,
        token: Token,
    },
    /// Complete `token` (a flush: every earlier job is done, FIFO).
    Flush(Token),
}

/// The device's side of the hand-over, under one lock.
#[derive(Debug)]
struct Queue {
    /// Jobs handed over by `commit`, oldest first.
    jobs: VecDeque<Job>,
    /// Jobs taken from `jobs` and not finished yet.
    busy: u64,
    /// While closed, the device takes no job (it "executes later").
    open: bool,
    /// The device thread is told to end.
    stop: bool,
}

/// What the driver and its device thread share.
#[derive(Debug)]
struct DeviceState {
    queue: Mutex<Queue>,
    /// Signalled when jobs arrive, the gate opens or the device must stop.
    work: Condvar,
    /// Signalled when a job finishes (for `quiesce`).
    idle: Condvar,
    /// Finished jobs, in order, not yet returned by `poll`.
    done: Mutex<VecDeque<Completion>>,
    /// Readable while `done` may hold something new: the wake descriptor
    /// (one-shot: the first completion queue's).
    wake: EventFd,
    /// One-shot only: the second completion queue's descriptor.
    wake2: EventFd,
    /// One-shot: the descriptors are armed (`prepare_sleep` sets it, the
    /// first completion after it takes it, `woke` clears it).
    armed: std::sync::atomic::AtomicBool,
    one_shot: bool,
    /// One-shot: `prepare_sleep` calls, `woke` calls, descriptor writes,
    /// and writes per descriptor.
    prepares: AtomicU64,
    wokes: AtomicU64,
    signals: [AtomicU64; 2],
    /// Jobs finished (which descriptor the next one signals).
    finished: AtomicU64,
    /// Jobs the device has received (handed over by `commit`).
    received: AtomicU64,
}

/// The test's handle on a device: its gate and its counters.
#[derive(Debug, Clone)]
struct DeviceHandle(Arc<DeviceState>);

impl DeviceHandle {
    fn open_gate(&self) {
        self.0.queue.lock().unwrap().open = true;
        self.0.work.notify_all();
    }

    fn close_gate(&self) {
        self.0.queue.lock().unwrap().open = false;
    }

    /// One-shot: (`prepare_sleep` calls, `woke` calls, writes of each
    /// descriptor).
    fn sleep_counts(&self) -> (u64, u64, [u64; 2]) {
        let load = |a: &AtomicU64| a.load(Ordering::SeqCst);
        let s = &self.0;
        (
            load(&s.prepares),
            load(&s.wokes),
            [load(&s.signals[0]), load(&s.signals[1])],
        )
    }

    /// Jobs the device has received so far.
    fn received(&self) -> u64 {
        // Acquire: pairs with the Release in `commit`, so what the core
        // thread did before handing the jobs over is visible (its sleep
        // count included).
        self.0.received.load(Ordering::Acquire)
    }
}

/// A driver over a simulated device; see the module docs.
#[derive(Debug)]
struct Device {
    state: Arc<DeviceState>,
    /// Posted this round, handed to the device by `commit`. Allocated once.
    round: Vec<Job>,
    /// Registrations by key: (address, length); `None` once withdrawn.
    regions: Vec<Option<(u64, u64)>>,
    thread: Option<JoinHandle<()>>,
}

impl Device {
    /// A device whose gate starts `open` or closed.
    fn new(open: bool) -> (Device, DeviceHandle) {
        Device::build(open, false)
    }

    /// A device with two one-shot descriptors (see the module docs).
    fn one_shot(open: bool) -> (Device, DeviceHandle) {
        Device::build(open, true)
    }

    fn build(open: bool, one_shot: bool) -> (Device, DeviceHandle) {
        let eventfd = || {
            EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .expect("eventfd")
        };
        let state = Arc::new(DeviceState {
            queue: Mutex::new(Queue {
                jobs: VecDeque::with_capacity(4096),
                busy: 0,
                open,
                stop: false,
            }),
            work: Condvar::new(),
            idle: Condvar::new(),
            done: Mutex::new(VecDeque::with_capacity(4096)),
            wake: eventfd(),
            wake2: eventfd(),
            armed: std::sync::atomic::AtomicBool::new(false),
            one_shot,
            prepares: AtomicU64::new(0),
            wokes: AtomicU64::new(0),
            signals: [AtomicU64::new(0), AtomicU64::new(0)],
            finished: AtomicU64::new(0),
            received: AtomicU64::new(0),
        });
        let thread = {
            let state = state.clone();
            std::thread::Builder::new()
                .name("test-device".into())
                .spawn(move || device_thread(&state))
                .expect("spawn the device thread")
        };
        (
            Device {
                state: state.clone(),
                round: Vec::with_capacity(4096),
                regions: Vec::new(),
                thread: Some(thread),
            },
            DeviceHandle(state),
        )
    }

    /// `[addr, addr + len)` inside live registration `key`.
    fn inside(&self, key: u64, addr: u64, len: u32) -> bool {
        self.regions
            .get(key as usize)
            .copied()
            .flatten()
            .is_some_and(|(base, size)| {
                addr >= base
                    && addr
                        .checked_add(u64::from(len))
                        .is_some_and(|end| end <= base + size)
            })
    }
}

fn device_thread(state: &DeviceState) {
    loop {
        let job = {
            let mut queue = state.queue.lock().unwrap();
            loop {
                if queue.stop {
                    return;
                }
                if queue.open {
                    if let Some(job) = queue.jobs.pop_front() {
                        queue.busy += 1;
                        break job;
                    }
                }
                queue = state.work.wait(queue).unwrap();
            }
        };
        let completion = match job {
            Job::Copy {
                src,
                dst,
                len,
                token,
            } => {
                // SAFETY: `[src, src + len)` lies in memory registered with
                // this driver, which the engine keeps registered until this
                // completion is polled (`Driver::post`'s contract);
                // `[dst, dst + len)` lies in a registration `post` checked,
                // and deregistering it waits in `quiesce` until no job is
                // left. `copy` tolerates overlap.
                unsafe {
                    std::ptr::copy(
                        src as usize as *const u8,
                        dst as usize as *mut u8,
                        len as usize,
                    )
                };
                Completion::new(token, Ok(len))
            }
            Job::Flush(token) => Completion::new(token, Ok(0)),
        };
        // Publish, then signal: a poll that clears the eventfd after this
        // push sees the completion; one that cleared it before leaves the
        // signal below standing.
        state.done.lock().unwrap().push_back(completion);
        if state.one_shot {
            // SeqCst, with the store in `prepare_sleep`: either it sees the
            // arming, or `prepare_sleep`'s look sees this completion.
            let cq = (state.finished.fetch_add(1, Ordering::SeqCst) % 2) as usize;
            if state.armed.swap(false, Ordering::SeqCst) {
                let fd = if cq == 0 { &state.wake } else { &state.wake2 };
                fd.write(1).expect("eventfd write");
                state.signals[cq].fetch_add(1, Ordering::SeqCst);
            }
        } else {
            state.wake.write(1).expect("eventfd write");
        }
        state.queue.lock().unwrap().busy -= 1;
        state.idle.notify_all();
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.state.queue.lock().unwrap().stop = true;
        self.state.work.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Driver for Device {
    fn name(&self) -> &'static str {
        "test-device"
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(1, 1 << 20);
        caps.ordered_lanes = true;
        caps.mem_kinds = MemKinds::HOST;
        caps.remote_kinds = MemKinds::HOST;
        caps
    }

    fn attach(&mut self, _ctx: DriverContext) {}

    fn address(&self) -> Vec<u8> {
        b"DEV".to_vec()
    }

    /// Only to itself: the worker PUTs into its own window, through the
    /// device.
    fn connect(&mut self, peer: &[u8], _lanes: u8, _token: Token) -> Result<Connect, DriverError> {
        if peer != b"DEV" {
            return Err(DriverError::new(
                Status::InvalidArgument,
                "not a device address",
            ));
        }
        Ok(Connect::Done(DriverEp(0)))
    }

    fn disconnect(&mut self, _ep: DriverEp) {}

    fn register(&mut self, mem: &MemDesc, _: Prepared) -> Result<Registered, DriverError> {
        self.regions.push(Some((mem.addr, mem.len)));
        Ok(Registered::Shared(DriverMemKey(
            self.regions.len() as u64 - 1,
        )))
    }

    fn deregister(&mut self, key: DriverMemKey) {
        if let Some(slot) = self.regions.get_mut(key.0 as usize) {
            *slot = None;
        }
    }

    fn pack_rkey(&self, key: DriverMemKey) -> Result<Vec<u8>, DriverError> {
        Ok(key.0.to_le_bytes().to_vec())
    }

    fn unpack_rkey(
        &mut self,
        _ep: DriverEp,
        part: &KeyPart<'_>,
        _: Prepared,
    ) -> Result<Unpacked, DriverError> {
        let key = <[u8; 8]>::try_from(part.blob)
            .map_err(|_| DriverError::new(Status::InvalidArgument, "malformed key"))?;
        Ok(Unpacked::Key(DriverRkey(u64::from_le_bytes(key) as u32)))
    }

    unsafe fn post(&mut self, _ep: DriverEp, op: &Op, token: Token) -> Posted {
        let (OpKind::Put, Some((rkey, dst))) = (op.kind, op.remote) else {
            return Posted::Done(Err(Status::Unsupported));
        };
        if !self.inside(u64::from(rkey.0), dst, op.len) {
            return Posted::Done(Err(Status::OutOfBounds));
        }
        if self.round.len() == self.round.capacity() {
            return Posted::NoResource;
        }
        self.round.push(Job::Copy {
            src: op.local_addr,
            dst,
            len: op.len,
            token,
        });
        Posted::InFlight
    }

    fn flush(&mut self, _ep: DriverEp, _lanes: LaneMask, token: Token) -> Posted {
        if self.round.len() == self.round.capacity() {
            return Posted::NoResource;
        }
        self.round.push(Job::Flush(token));
        Posted::InFlight
    }

    fn commit(&mut self) {
        if self.round.is_empty() {
            return;
        }
        let n = self.round.len() as u64;
        self.state
            .queue
            .lock()
            .unwrap()
            .jobs
            .extend(self.round.drain(..));
        // Release: pairs with the Acquire in `DeviceHandle::received`.
        self.state.received.fetch_add(n, Ordering::Release);
        self.state.work.notify_all();
    }

    fn poll(&mut self, out: &mut [Completion]) -> usize {
        // Clear first, then take: whatever the device publishes after the
        // take signals again (a level-triggered descriptor needs no arming).
        // One-shot descriptors are left to `woke`.
        if !self.state.one_shot {
            let _ = self.state.wake.read();
        }
        let mut done = self.state.done.lock().unwrap();
        let n = done.len().min(out.len());
        for (slot, c) in out.iter_mut().zip(done.drain(..n)) {
            *slot = c;
        }
        if !done.is_empty() && !self.state.one_shot {
            // Left for the next poll: stay readable.
            let _ = self.state.wake.write(1);
        }
        n
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        if self.state.one_shot {
            vec![self.state.wake.as_fd(), self.state.wake2.as_fd()]
        } else {
            vec![self.state.wake.as_fd()]
        }
    }

    /// One-shot: arm, then look once more (the `ibv_req_notify_cq` race).
    fn prepare_sleep(&mut self) -> Sleep {
        if !self.state.one_shot {
            return Sleep::Ready;
        }
        self.state.prepares.fetch_add(1, Ordering::SeqCst);
        self.state.armed.store(true, Ordering::SeqCst);
        if self.state.done.lock().unwrap().is_empty() {
            Sleep::Ready
        } else {
            Sleep::NotNow
        }
    }

    /// One-shot: acknowledge (read) both descriptors and disarm.
    fn woke(&mut self) {
        if self.state.one_shot {
            self.state.wokes.fetch_add(1, Ordering::SeqCst);
            self.state.armed.store(false, Ordering::SeqCst);
            let _ = self.state.wake.read();
            let _ = self.state.wake2.read();
        }
    }

    /// Cancels what the device has not started (its completions come out
    /// of `poll` with CANCELED) and waits for what it has.
    fn quiesce(&mut self, _scope: Quiesce) -> Quiesced {
        let mut queue = self.state.queue.lock().unwrap();
        if !queue.jobs.is_empty() {
            let mut done = self.state.done.lock().unwrap();
            done.extend(queue.jobs.drain(..).map(|job| {
                let (Job::Copy { token, .. } | Job::Flush(token)) = job;
                Completion::new(token, Err(Status::Canceled))
            }));
            let _ = self.state.wake.write(1);
        }
        while queue.busy > 0 {
            queue = self.state.idle.wait(queue).unwrap();
        }
        Quiesced::Done
    }
}

/// A worker over `driver` with its core thread, a queue pair, and a
/// window PUTs land in through an endpoint to itself.
struct Rig {
    worker: Worker,
    qp: QueuePair,
    window: RegisteredBuf,
    src: RegisteredBuf,
    put: Sqe,
}

impl Rig {
    fn new(driver: impl Driver) -> Rig {
        let mut worker = Worker::builder()
            .driver(driver)
            .ignore_env()
            .build()
            .unwrap();
        let window = worker.alloc_registered(4096).unwrap();
        let ep = worker.connect(worker.address()).unwrap();
        let rkey = worker
            .unpack_rkey(ep, &worker.pack_rkey(window.handle()).unwrap())
            .unwrap();
        let src = worker.alloc_registered(64).unwrap();
        let put = Sqe::put(
            ep.as_raw(),
            src.local(0),
            RemoteBuf {
                rkey: rkey.as_raw(),
                addr: window.addr(),
            },
            8,
        );
        worker.start_core_thread(None).unwrap();
        let qp = worker.create_queue().unwrap();
        Rig {
            worker,
            qp,
            window,
            src,
            put,
        }
    }

    /// Waits until the core thread has gone to sleep more than `after`
    /// times and sleeps now; returns its sleep count.
    fn until_asleep(&self, after: u64) -> u64 {
        let deadline = Instant::now() + HANG;
        loop {
            let sleeps = self.worker.core_thread_sleeps();
            if sleeps > after && self.worker.is_core_thread_asleep() {
                return sleeps;
            }
            assert!(
                Instant::now() < deadline,
                "the core thread never went to sleep"
            );
            std::thread::yield_now();
        }
    }

    /// Sleeps on the CQ eventfd until a CQE is ready; returns it.
    fn wait_cqe(&mut self, what: &str) -> ringfence_ring::Cqe {
        assert!(
            self.qp.wait_cqe(Some(HANG)).unwrap(),
            "{what}: no CQE within {HANG:?}: a lost wake-up"
        );
        self.qp.pop().unwrap().expect("wait_cqe said one is ready")
    }

    fn window_word(&self) -> u64 {
        let mut bytes = [0u8; 8];
        self.window.read(0, &mut bytes);
        u64::from_le_bytes(bytes)
    }
}

/// Cycles of one PUT each, every one started while the core thread sleeps:
/// submit (the SQ doorbell wakes it), wait on the CQ eventfd, reap, and
/// wait for the core thread to sleep again.
fn sleep_wake_cycles(driver: impl Driver, cycles: u64) {
    let mut rig = Rig::new(driver);
    let mut sleeps = 0;
    for i in 1..=cycles {
        sleeps = rig.until_asleep(sleeps);
        rig.src.write(0, &i.to_le_bytes());
        rig.qp.push(rig.put.with_user_data(i)).unwrap();
        rig.qp.submit();
        let cqe = rig.wait_cqe(&format!("cycle {i}"));
        assert_eq!((cqe.user_data, cqe.res), (i, 8), "cycle {i}");
        assert_eq!(rig.window_word(), i, "cycle {i}: the PUT landed");
    }
    assert!(rig.worker.core_thread_sleeps() >= cycles);
}

#[test]
fn ten_thousand_sleep_wake_cycles_through_the_sq_doorbell() {
    sleep_wake_cycles(Loopback::new(), 10_000);
}

#[test]
fn ten_thousand_sleep_wake_cycles_with_an_asynchronous_driver() {
    // The core thread may also sleep with the PUT in flight at the device;
    // the device's descriptor wakes it then.
    let (device, _handle) = Device::new(true);
    sleep_wake_cycles(device, 10_000);
}

/// The core thread sleeps with a PUT in flight at the device; the device
/// finishes it on its own; the application, asleep on its CQ eventfd,
/// wakes with the CQE.
#[test]
fn a_driver_completion_wakes_the_core_thread_and_the_application() {
    let (device, handle) = Device::new(false);
    let mut rig = Rig::new(device);
    rig.src.write(0, &0x5eed_u64.to_le_bytes());
    rig.qp.push(rig.put.with_user_data(7)).unwrap();
    rig.qp.submit();
    // The device has the PUT (behind its closed gate), and the core thread
    // has gone to sleep since: with the PUT in flight.
    let deadline = Instant::now() + HANG;
    while handle.received() == 0 {
        assert!(
            Instant::now() < deadline,
            "the PUT never reached the device"
        );
        std::thread::yield_now();
    }
    // The core thread was awake when it handed the PUT over (`received`
    // is read with Acquire, after its Release in `commit`): asleep from
    // now on means asleep with the PUT in flight.
    while !rig.worker.is_core_thread_asleep() {
        assert!(
            Instant::now() < deadline,
            "the core thread never went to sleep"
        );
        std::thread::yield_now();
    }
    assert!(
        rig.qp.arm_cq_doorbell().unwrap(),
        "no CQE can be ready: the device holds the PUT"
    );
    handle.open_gate();
    // Only the device's descriptor can wake the core thread now, and only
    // the core thread's CQE can ring the CQ doorbell.
    let rung = rig.qp.cq_doorbell().wait(Some(HANG)).unwrap();
    rig.qp.disarm_cq_doorbell();
    assert!(rung, "the CQ doorbell was never rung: a lost wake-up");
    let cqe = rig.qp.pop().unwrap().expect("a CQE after the doorbell");
    assert_eq!((cqe.user_data, cqe.res), (7, 8));
    assert_eq!(rig.window_word(), 0x5eed);
}

/// A queue pair created while the core thread sleeps: its SQ had no
/// NEED_WAKEUP when the core thread went to sleep, so creating it must wake
/// the core thread, or its first submit would wake nobody.
#[test]
fn a_queue_pair_created_while_the_core_thread_sleeps_is_served() {
    let mut rig = Rig::new(Loopback::new());
    let mut sleeps = 0;
    for i in 0..20 {
        // Each round starts with the core thread asleep; creating the
        // queue pair wakes it, so the next round waits for a later sleep.
        sleeps = rig.until_asleep(sleeps);
        let mut qp = rig.worker.create_queue().unwrap();
        qp.push(Sqe::nop().with_user_data(i)).unwrap();
        qp.submit();
        assert!(
            qp.wait_cqe(Some(HANG)).unwrap(),
            "queue pair {i}: a lost wake-up"
        );
        assert_eq!(qp.pop().unwrap().map(|c| c.user_data), Some(i));
    }
    rig.qp.push(Sqe::nop().with_user_data(99)).unwrap();
    rig.qp.submit();
    assert_eq!(rig.wait_cqe("the first queue pair").user_data, 99);
}

/// A driver without a wake descriptor (operations released by the fault
/// injector only inside its poll, after a wall-clock latency) keeps the core
/// thread polling while it has work in flight: if it slept, nothing would
/// ever complete the PUT.
#[test]
fn a_driver_without_a_wake_descriptor_keeps_the_core_thread_polling() {
    let (injector, faults) = FaultInjector::new(Loopback::with_mode(CompletionMode::Immediate));
    faults.set_timing(Timing::Latency(Duration::from_millis(5)));
    let mut rig = Rig::new(injector);
    for i in 1..=20 {
        rig.qp.push(rig.put.with_user_data(i)).unwrap();
        rig.qp.submit();
        let cqe = rig.wait_cqe(&format!("PUT {i}"));
        assert_eq!((cqe.user_data, cqe.res), (i, 8));
    }
}

/// Stopping a sleeping core thread, and starting it again.
#[test]
fn a_sleeping_core_thread_stops_and_restarts() {
    let mut rig = Rig::new(Loopback::new());
    rig.until_asleep(0);
    rig.worker.stop_core_thread();
    assert!(!rig.worker.is_core_thread_asleep());
    rig.worker.start_core_thread(None).unwrap();
    rig.qp.push(Sqe::nop().with_user_data(5)).unwrap();
    rig.qp.submit();
    assert_eq!(rig.wait_cqe("after a restart").user_data, 5);
}

/// A one-shot driver with two descriptors (as verbs' completion channels):
/// the core thread sleeps with a PUT in flight, armed through
/// `prepare_sleep`, and the completion that lands on either descriptor
/// wakes it. Each wake comes from an arming (no descriptor is written while
/// nothing is armed: a busy-polling core thread asks for no interrupt),
/// and every `prepare_sleep` is followed by `woke`.
#[test]
fn a_one_shot_driver_wakes_the_core_thread_through_either_descriptor() {
    let (device, handle) = Device::one_shot(false);
    let mut rig = Rig::new(device);
    let mut sleeps = 0;
    for i in 1..=6u64 {
        handle.close_gate();
        rig.src.write(0, &i.to_le_bytes());
        let received = handle.received();
        rig.qp.push(rig.put.with_user_data(i)).unwrap();
        rig.qp.submit();
        let deadline = Instant::now() + HANG;
        while handle.received() == received {
            assert!(
                Instant::now() < deadline,
                "PUT {i} never reached the device"
            );
            std::thread::yield_now();
        }
        // Asleep after the hand-over: asleep with the PUT in flight, and
        // only the device can wake it.
        sleeps = rig.until_asleep(sleeps);
        handle.open_gate();
        let cqe = rig.wait_cqe(&format!("PUT {i}"));
        assert_eq!((cqe.user_data, cqe.res), (i, 8));
        assert_eq!(rig.window_word(), i);
    }
    rig.worker.stop_core_thread();
    let (prepares, wokes, signals) = handle.sleep_counts();
    assert_eq!(prepares, wokes, "every prepare_sleep is followed by woke");
    assert!(
        signals[0] >= 1 && signals[1] >= 1,
        "both descriptors woke the core thread: {signals:?}"
    );
    assert!(
        signals[0] + signals[1] <= prepares,
        "a signal without an arming"
    );
}

/// The test kit's `SimDriver` with a one-shot timer (`arm_on_sleep`): its
/// operations complete after a delay, and a core thread that sleeps
/// meanwhile is woken by the timer `prepare_sleep` armed. The timer is set
/// only when the core thread is about to sleep and disarmed when it woke:
/// no timer call per poll (a level-triggered SimDriver sets it at every
/// poll that has something pending).
#[test]
fn a_one_shot_simulated_driver_arms_its_timer_only_to_sleep() {
    let (sim, handle) = SimDriver::new(Loopback::with_mode(CompletionMode::Immediate));
    handle.arm_on_sleep(true);
    handle.set_timing(SimTiming::Delay(Duration::from_millis(2)));
    handle.connect_timing(SimTiming::Delay(Duration::from_millis(1)));
    let mut rig = Rig::new(sim);
    for i in 1..=20u64 {
        rig.src.write(0, &i.to_le_bytes());
        rig.qp.push(rig.put.with_user_data(i)).unwrap();
        rig.qp.submit();
        let cqe = rig.wait_cqe(&format!("PUT {i}"));
        assert_eq!((cqe.user_data, cqe.res), (i, 8));
        assert_eq!(rig.window_word(), i);
    }
    rig.worker.stop_core_thread();
    let stats = handle.stats();
    assert!(
        stats.timer_sets <= 2 * stats.sleeps_prepared,
        "the timer was set outside sleeps: {stats:?}"
    );
    assert!(stats.polls > stats.timer_sets, "{stats:?}");
    assert!(handle.violations().is_empty(), "{:?}", handle.violations());
}
