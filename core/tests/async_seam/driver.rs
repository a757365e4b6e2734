//! The simulated driver itself, driven without a worker: commit and
//! completion, lane order, the wake descriptor, quiesce and its violation
//! log, failed handshakes, and standing in for a device driver.

use crate::{HANG, run, target};
use ringfence::{
    Completion, Connect, Driver, DriverContext, DriverEp, DriverMemKey, DriverMemory, DriverRkey,
    EndpointState, KeyPart, Loopback, MemDesc, MemKind, MemKinds, NotifyPool, Op, OpKind, Posted,
    Prepared, Quiesce, Quiesced, Token, Unpacked, Worker,
};
use ringfence_ring::{FenceMode, RemoteBuf, Sqe, Status};
use ringfence_testkit::{SimDriver, SimEvent, SimHandle, SimTiming};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A `SimDriver` over loopback connected, at the driver level, to a
/// loopback target with an 8 KiB window; the initiator has 8 KiB of its
/// own memory from `alloc_memory`, registered.
struct Bare {
    sim: SimDriver<Loopback>,
    handle: SimHandle,
    _target: Loopback,
    _window: Vec<u64>,
    window_addr: u64,
    ep: DriverEp,
    rkey: DriverRkey,
    local: Arc<dyn DriverMemory>,
    local_key: DriverMemKey,
}

/// Registers `desc` with `sim` through both phases, as a worker does.
fn register(sim: &mut SimDriver<Loopback>, desc: MemDesc) -> DriverMemKey {
    let prepared = sim.prepare().expect("a first phase");
    let prepared = prepared.register(&desc).unwrap();
    sim.register(&desc, prepared).unwrap().key().unwrap()
}

fn bare(lanes: u8, connect: SimTiming) -> Bare {
    let mut target = Loopback::new();
    let window = vec![0u64; 1024];
    let window_addr = window.as_ptr() as u64;
    let key = target
        .register(
            &MemDesc {
                addr: window_addr,
                len: 8192,
                kind: MemKind::Host,
                secret: 0x1234,
            },
            Prepared::none(),
        )
        .unwrap()
        .key()
        .unwrap();
    let blob = target.pack_rkey(key).unwrap();
    let (mut sim, handle) = SimDriver::new(Loopback::new());
    sim.attach(DriverContext {
        notify: Arc::new(NotifyPool::new(0, 0).unwrap()),
    });
    handle.connect_timing(connect);
    let Ok(Connect::InFlight(ep)) = sim.connect(&target.address(), lanes, Token(77)) else {
        panic!("a SimDriver connect is always in flight");
    };
    let done = poll_until(&mut sim, Token(77));
    assert_eq!(done.result, Ok(0));
    let part = KeyPart {
        kind: MemKind::Host,
        base: window_addr,
        len: 8192,
        blob: &blob,
    };
    let prepared = sim.prepare().expect("a first phase");
    let prepared = prepared.unpack(ep, &part).unwrap();
    let Unpacked::Key(rkey) = sim.unpack_rkey(ep, &part, prepared).unwrap() else {
        panic!("loopback reaches host memory");
    };
    let local = sim.alloc_memory(8192, MemKind::Host).unwrap().unwrap();
    let local_key = register(
        &mut sim,
        MemDesc {
            addr: local.addr(),
            len: 8192,
            kind: MemKind::Host,
            secret: 1,
        },
    );
    Bare {
        sim,
        handle,
        _target: target,
        _window: window,
        window_addr,
        ep,
        rkey,
        local,
        local_key,
    }
}

impl Bare {
    /// An 8-byte PUT from local offset `from` to window offset `to`.
    fn put(&self, lane: u8, from: u64, to: u64) -> Op {
        Op {
            kind: OpKind::Put,
            lane,
            local_addr: self.local.addr() + from,
            local_key: Some(self.local_key),
            remote: Some((self.rkey, self.window_addr + to)),
            len: 8,
            operand: 0,
            operand2: 0,
            fence: false,
        }
    }

    fn post(&mut self, op: &Op, token: u64) -> Posted {
        // SAFETY: the op's local range lies inside `self.local`, registered
        // with this driver, which lives as long as `self`.
        unsafe { self.sim.post(self.ep, op, Token(token)) }
    }
}

/// Polls until `token` completes (waiting on the wake descriptor in
/// between, so delays pass without spinning); returns its completion.
fn poll_until<D: Driver>(sim: &mut D, token: Token) -> Completion {
    let deadline = Instant::now() + HANG;
    loop {
        let mut out = [Completion::default(); 16];
        let n = sim.poll(&mut out);
        if let Some(c) = out[..n].iter().find(|c| c.token == token) {
            return *c;
        }
        if let Some(&fd) = sim.wake_fds().first() {
            readable(fd, 10);
        }
        assert!(Instant::now() < deadline, "{token:?} never completed");
    }
}

/// Whether `fd` is readable within `ms` milliseconds.
fn readable(fd: BorrowedFd<'_>, ms: u16) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::from(ms)).unwrap() == 1
}

fn word(b: &Bare, offset: u64) -> u64 {
    // SAFETY: inside the target's window, which `b` keeps alive; nothing
    // else writes it during the read (every operation has completed).
    unsafe { std::ptr::read_volatile((b.window_addr + offset) as *const u64) }
}

/// Posted but not committed: no number of polls executes it; the commit
/// makes it eligible, and it executes at its completion, not before.
#[test]
fn the_driver_executes_nothing_before_commit_and_effects_land_at_completion() {
    let mut b = bare(2, SimTiming::Polls(1));
    b.handle.set_timing(SimTiming::Polls(3));
    // SAFETY: inside `local`, 8-aligned, and nothing else accesses it.
    unsafe { std::ptr::write_volatile(b.local.addr() as *mut u64, 0xfeed) };
    assert_eq!(b.post(&b.put(0, 0, 0), 1), Posted::InFlight);
    let mut out = [Completion::default(); 4];
    for _ in 0..50 {
        assert_eq!(b.sim.poll(&mut out), 0);
    }
    assert_eq!(word(&b, 0), 0, "landed before the commit");
    b.sim.commit();
    assert_eq!(b.sim.poll(&mut out), 0);
    assert_eq!(b.sim.poll(&mut out), 0);
    assert_eq!(word(&b, 0), 0, "landed before its completion");
    assert_eq!(b.sim.poll(&mut out), 1);
    assert_eq!(out[0], Completion::new(Token(1), Ok(8)));
    assert_eq!(word(&b, 0), 0xfeed);
    assert_eq!(b.handle.stats().executed_uncommitted, 0);
}

/// Lanes complete out of order, a lane in order; a flush completes only
/// after everything posted before it on its lanes executed.
#[test]
fn the_driver_reorders_lanes_keeps_each_lane_in_order_and_flushes_after_them() {
    let mut reordered = false;
    for seed in 0..20 {
        let mut b = bare(4, SimTiming::Polls(1));
        b.handle.seed(seed);
        for i in 0..40u64 {
            let lane = (i % 4) as u8;
            b.handle.set_timing(if lane.is_multiple_of(2) {
                SimTiming::PollsBetween(5, 12)
            } else {
                SimTiming::PollsBetween(1, 12)
            });
            assert_eq!(b.post(&b.put(lane, 0, 8 * i), i), Posted::InFlight);
        }
        b.handle.set_timing(SimTiming::Polls(1));
        // Lanes 0 and 2 come due late; the flush of them comes due early
        // and must wait for them all the same.
        assert_eq!(b.sim.flush(b.ep, 0b0101, Token(100)), Posted::InFlight);
        assert_eq!(b.sim.flush(b.ep, 0, Token(101)), Posted::Done(Ok(0)));
        b.sim.commit();
        let mut order = Vec::new();
        let deadline = Instant::now() + HANG;
        while order.len() < 41 {
            let mut out = [Completion::default(); 8];
            let n = b.sim.poll(&mut out);
            order.extend(out[..n].iter().map(|c| c.token.0));
            assert!(Instant::now() < deadline);
        }
        for lane in 0..4 {
            let on: Vec<u64> = order
                .iter()
                .copied()
                .filter(|&t| t < 40 && t % 4 == lane)
                .collect();
            assert!(on.windows(2).all(|p| p[0] < p[1]), "lane {lane}: {on:?}");
        }
        let flush = order.iter().position(|&t| t == 100).unwrap();
        for t in order
            .iter()
            .copied()
            .filter(|t| *t < 40 && t % 4 != 1 && t % 4 != 3)
        {
            let at = order.iter().position(|&x| x == t).unwrap();
            assert!(at < flush, "seed {seed}: the flush passed {t}");
        }
        reordered |= !order[..40].windows(2).all(|p| p[0] < p[1]);
        assert_eq!(b.handle.flushes(), vec![(b.ep, 0b0101)]);
    }
    assert!(reordered, "lanes never completed out of order");
}

/// The wake descriptor: not readable while nothing is due; readable once
/// something is (level-triggered: it stays so until a poll); re-armed by a
/// poll that returned fewer than are due; cleared by a poll that took
/// everything. A handshake with a delay arms it too. Under `Polls` timing
/// nothing arms it.
#[test]
fn the_wake_descriptor_follows_what_is_due() {
    let mut b = bare(2, SimTiming::Delay(Duration::from_millis(1)));
    let fd_readable = |b: &Bare, ms| readable(b.sim.wake_fds()[0], ms);
    let wait = HANG.as_millis() as u16;
    // Polls timing: held, committed, and nothing arms the descriptor.
    b.handle.set_timing(SimTiming::Polls(2));
    assert_eq!(b.post(&b.put(0, 0, 0), 1), Posted::InFlight);
    b.sim.commit();
    assert!(!fd_readable(&b, 0));
    let mut out = [Completion::default(); 8];
    assert_eq!(b.sim.poll(&mut out), 0);
    assert_eq!(b.sim.poll(&mut out), 1);
    assert!(!fd_readable(&b, 0), "nothing pending");

    // An hour away: not readable.
    b.handle
        .set_timing(SimTiming::Delay(Duration::from_secs(3600)));
    assert_eq!(b.post(&b.put(0, 0, 8), 2), Posted::InFlight);
    b.sim.commit();
    assert!(!fd_readable(&b, 0));
    assert_eq!(b.sim.poll(&mut out), 0);
    assert!(!fd_readable(&b, 0));

    // A millisecond away, on the other lane: readable once due, and it
    // stays readable until a poll.
    b.handle
        .set_timing(SimTiming::Delay(Duration::from_millis(1)));
    for t in 3..6 {
        assert_eq!(b.post(&b.put(1, 0, 8 * t), t), Posted::InFlight);
    }
    b.sim.commit();
    assert!(fd_readable(&b, wait), "never became readable");
    assert!(fd_readable(&b, 0), "level-triggered: still readable");
    // A poll with room for one: two are due still, so it stays readable.
    assert_eq!(b.sim.poll(&mut out[..1]), 1);
    assert!(fd_readable(&b, wait), "re-armed for what is still due");
    assert_eq!(b.sim.poll(&mut out), 2);
    assert!(
        !fd_readable(&b, 0),
        "cleared: only the hour-long one is left"
    );

    // quiesce(All) cancels the hour-long one: readable at once, unexecuted.
    assert_eq!(b.sim.quiesce(Quiesce::All), Quiesced::Done);
    assert!(fd_readable(&b, wait));
    assert_eq!(b.sim.poll(&mut out), 1);
    assert_eq!(out[0], Completion::new(Token(2), Err(Status::Canceled)));
    assert!(!fd_readable(&b, 0));
    assert_eq!(word(&b, 8), 0, "a canceled PUT never lands");
    assert!(
        b.handle.violations().is_empty(),
        "{:?}",
        b.handle.violations()
    );
}

/// `quiesce(Memory(key))` cancels, unexecuted, what uses that key and
/// nothing else; an execution after a quiesce that covered its memory, or
/// on freed memory, is recorded as a violation (the log catches an engine
/// that would free too early).
#[test]
fn quiesce_cancels_what_uses_the_memory_and_later_accesses_are_violations() {
    let mut b = bare(1, SimTiming::Polls(1));
    let other = b.sim.alloc_memory(64, MemKind::Host).unwrap().unwrap();
    let other_key = register(
        &mut b.sim,
        MemDesc {
            addr: other.addr(),
            len: 64,
            kind: MemKind::Host,
            secret: 2,
        },
    );
    let mut on_other = b.put(0, 0, 16);
    on_other.local_addr = other.addr();
    on_other.local_key = Some(other_key);
    assert_eq!(b.post(&b.put(0, 0, 0), 1), Posted::InFlight);
    assert_eq!(b.post(&on_other, 2), Posted::InFlight);
    b.sim.commit();
    b.sim.deregister(b.local_key);
    assert_eq!(b.sim.quiesce(Quiesce::Memory(b.local_key)), Quiesced::Done);
    let done = poll_until(&mut b.sim, Token(2));
    assert_eq!(done.result, Ok(8));
    let mut out = [Completion::default(); 4];
    b.sim.poll(&mut out);
    assert!(
        b.handle.violations().is_empty(),
        "{:?}",
        b.handle.violations()
    );
    assert_eq!(b.handle.log().len(), 1, "only the other key's PUT ran");
    assert_eq!(b.handle.stats().canceled, 1);

    // A (misbehaving) post through the quiesced key: recorded, and
    // refused.
    assert_eq!(b.post(&b.put(0, 0, 0), 3), Posted::InFlight);
    b.sim.commit();
    let refused = poll_until(&mut b.sim, Token(3));
    assert_eq!(refused.result, Err(Status::AccessDenied));
    let v = b.handle.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("quiesce(Memory"), "{v:?}");

    // Memory freed under an operation: recorded.
    assert_eq!(b.post(&on_other, 4), Posted::InFlight);
    b.sim.commit();
    b.sim.deregister(other_key);
    drop(other);
    let refused = poll_until(&mut b.sim, Token(4));
    assert_eq!(refused.result, Err(Status::AccessDenied), "never touched");
    let v = b.handle.violations();
    assert!(v.len() == 2 && v[1].contains("freed"), "{v:?}");
    let events = b.handle.events();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, SimEvent::Freed { len: 64, .. }))
    );
}

/// A failed handshake reports its status through `poll`, with the token
/// `connect` was given; the dead handle takes no posts.
#[test]
fn a_failed_handshake_completes_through_poll_with_its_token() {
    let target = Loopback::new();
    let (mut sim, handle) = SimDriver::new(Loopback::new());
    handle.connect_polls(3);
    handle.fail_connect(Status::Timeout);
    let Ok(Connect::InFlight(ep)) = sim.connect(&target.address(), 1, Token(9)) else {
        panic!("in flight");
    };
    let mut out = [Completion::default(); 4];
    assert_eq!(sim.poll(&mut out), 0);
    assert_eq!(sim.poll(&mut out), 0);
    assert_eq!(sim.poll(&mut out), 1);
    assert_eq!(out[0], Completion::new(Token(9), Err(Status::Timeout)));
    // The next connect is not programmed to fail.
    let Ok(Connect::InFlight(_)) = sim.connect(&target.address(), 1, Token(10)) else {
        panic!("in flight");
    };
    assert_eq!(poll_until(&mut sim, Token(10)).result, Ok(0));
    assert_eq!(
        sim.flush(ep, 1, Token(11)),
        Posted::Done(Err(Status::EndpointClosed))
    );
    assert!(handle.violations().is_empty());
    let _ = handle.events();
}

/// `with_mem_kinds` lets the simulated driver stand in for a device
/// driver: it allocates and registers CUDA memory (host memory
/// underneath), and a host-only driver of the same worker never sees that
/// memory. With `named` it sits beside a plain loopback in one worker, and
/// connects to a peer's driver of the same name.
#[test]
fn a_named_simulated_driver_stands_in_for_a_device_driver() {
    let (target_sim, _) = SimDriver::named(Loopback::new(), "sim");
    let t = Worker::builder()
        .driver(target_sim)
        .ignore_env()
        .build()
        .unwrap();
    let window = t.alloc_registered(4096).unwrap();
    window.write(0, &[0x3c; 64]);
    let (host_only, host_window) = target(4096);

    let (sim, handle) = SimDriver::named(Loopback::new(), "sim");
    let sim = sim.with_mem_kinds(MemKinds::HOST.union(MemKinds::CUDA));
    let w = Worker::builder()
        .driver(Loopback::new())
        .driver(sim)
        .ignore_env()
        .build()
        .unwrap();
    // The target has no "loopback" part: the endpoint goes through "sim".
    let ep = w.connect(t.address()).unwrap();
    assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Connecting);
    let rkey = w
        .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let device = w.alloc_registered_kind(4096, MemKind::Cuda(0)).unwrap();
    assert_eq!(device.kind(), MemKind::Cuda(0));
    assert!(
        handle
            .events()
            .iter()
            .any(|e| matches!(e, SimEvent::Allocated { len: 4096, .. })),
        "the device memory came from the simulated driver"
    );
    let mut qp = w.create_queue().unwrap();
    let remote = |offset: u64| RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window.addr() + offset,
    };
    // GET into device memory, then PUT from it: the bytes come back.
    let e = ep.as_raw();
    let cqes = run(
        &w,
        &mut qp,
        &[
            Sqe::get(e, device.local(0), remote(0), 64).with_user_data(1),
            Sqe::fence(e, FenceMode::COMPLETE).with_user_data(2),
            Sqe::put(e, device.local(0), remote(1024), 64).with_user_data(3),
            Sqe::flush(e).with_user_data(4),
        ],
        4,
    );
    assert!(cqes.iter().all(|c| c.res >= 0), "{cqes:?}");
    let mut back = [0u8; 64];
    window.read(1024, &mut back);
    assert_eq!(back, [0x3c; 64]);

    // An endpoint through the host-only loopback cannot use it.
    let host_ep = w.connect(host_only.address()).unwrap();
    let host_rkey = w
        .unpack_rkey(host_ep, &host_only.pack_rkey(host_window.handle()).unwrap())
        .unwrap();
    let put = Sqe::put(
        host_ep.as_raw(),
        device.local(0),
        RemoteBuf {
            rkey: host_rkey.as_raw(),
            addr: host_window.addr(),
        },
        64,
    );
    let cqes = run(&w, &mut qp, &[put.with_user_data(5)], 1);
    assert_eq!(cqes[0].res, Status::Unsupported.as_raw());
    assert!(handle.violations().is_empty(), "{:?}", handle.violations());
}
