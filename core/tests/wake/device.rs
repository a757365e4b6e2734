//! `Device`: a driver whose operations finish on their own, on a device
//! thread (see the suite's docs).

// The device copies registered memory, as a NIC would, through raw
// pointers the engine vouches for (`Driver::post`'s safety contract).
#![allow(unsafe_code)]

use nix::sys::eventfd::{EfdFlags, EventFd};
use ringfence::{
    Capabilities, Completion, Connect, Driver, DriverContext, DriverEp, DriverError, DriverMemKey,
    DriverRkey, KeyPart, LaneMask, MemDesc, MemKinds, Op, OpKind, Posted, Prepared, Quiesce,
    Quiesced, Registered, Sleep, Token, Unpacked,
};
use ringfence_ring::Status;
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// What the device thread does for one operation.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Job {
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
pub(crate) struct Queue {
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
pub(crate) struct DeviceState {
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
pub(crate) struct DeviceHandle(Arc<DeviceState>);

impl DeviceHandle {
    pub(crate) fn open_gate(&self) {
        self.0.queue.lock().unwrap().open = true;
        self.0.work.notify_all();
    }

    pub(crate) fn close_gate(&self) {
        self.0.queue.lock().unwrap().open = false;
    }

    /// One-shot: (`prepare_sleep` calls, `woke` calls, writes of each
    /// descriptor).
    pub(crate) fn sleep_counts(&self) -> (u64, u64, [u64; 2]) {
        let load = |a: &AtomicU64| a.load(Ordering::SeqCst);
        let s = &self.0;
        (
            load(&s.prepares),
            load(&s.wokes),
            [load(&s.signals[0]), load(&s.signals[1])],
        )
    }

    /// Jobs the device has received so far.
    pub(crate) fn received(&self) -> u64 {
        // Acquire: pairs with the Release in `commit`, so what the core
        // thread did before handing the jobs over is visible (its sleep
        // count included).
        self.0.received.load(Ordering::Acquire)
    }
}

/// A driver over a simulated device; see the module docs.
#[derive(Debug)]
pub(crate) struct Device {
    state: Arc<DeviceState>,
    /// Posted this round, handed to the device by `commit`. Allocated once.
    round: Vec<Job>,
    /// Registrations by key: (address, length); `None` once withdrawn.
    regions: Vec<Option<(u64, u64)>>,
    thread: Option<JoinHandle<()>>,
}

impl Device {
    /// A device whose gate starts `open` or closed.
    pub(crate) fn new(open: bool) -> (Device, DeviceHandle) {
        Device::build(open, false)
    }

    /// A device with two one-shot descriptors (see the module docs).
    pub(crate) fn one_shot(open: bool) -> (Device, DeviceHandle) {
        Device::build(open, true)
    }

    pub(crate) fn build(open: bool, one_shot: bool) -> (Device, DeviceHandle) {
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
    pub(crate) fn inside(&self, key: u64, addr: u64, len: u32) -> bool {
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

pub(crate) fn device_thread(state: &DeviceState) {
    loop {
        let job = {
            let mut queue = state.queue.lock().unwrap();
            loop {
                if queue.stop {
                    return;
                }
                if queue.open
                    && let Some(job) = queue.jobs.pop_front()
                {
                    queue.busy += 1;
                    break job;
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
