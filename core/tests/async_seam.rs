//! The engine over the asynchronous driver seam, through `SimDriver`: a
//! handshake that fails or succeeds with SQEs queued behind it, teardown
//! and deregistration while the driver holds operations (quiesce before
//! free), the one doorbell per round, and the driver's own contract (its
//! wake descriptor, quiesce, the violation log).
//!
//! Deterministic on a loaded machine: nothing sleeps to synchronize, no
//! assertion is about time; loops are bounded by a generous deadline that
//! only catches hangs. Delays that are waited for are waited for on the
//! wake descriptor itself.

use ringfence::{
    Completion, Connect, Driver, DriverContext, DriverEp, DriverMemKey, DriverMemory, DriverRkey,
    EndpointId, EndpointState, KeyPart, Loopback, MemDesc, MemKind, MemKinds, NotifyPool, Op,
    OpKind, Posted, Prepared, QueuePair, Quiesce, Quiesced, RegisteredBuf, RkeyId, Token, Unpacked,
    Worker,
};
use ringfence_ring::{Cqe, FenceMode, RemoteBuf, Sqe, Status};
use ringfence_testkit::{SimDriver, SimEvent, SimHandle, SimTiming};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HANG: Duration = Duration::from_secs(30);
const SLOT: u64 = 64;
/// PUTs of this size or more go to the bandwidth lanes.
const BIG: u32 = 256;

/// A target with a plain loopback driver and a registered window.
fn target(window: usize) -> (Worker, RegisteredBuf) {
    let t = Worker::builder()
        .driver(Loopback::new())
        .ignore_env()
        .build()
        .unwrap();
    let w = t.alloc_registered(window).unwrap();
    (t, w)
}

/// An initiator whose only driver is a `SimDriver` over loopback.
fn initiator(lanes: u8) -> (Worker, SimHandle) {
    let (sim, handle) = SimDriver::new(Loopback::new());
    let w = Worker::builder()
        .driver(sim)
        .lanes(lanes)
        .bw_threshold(BIG)
        .ring_entries(512, 512)
        .requests(1024)
        .ignore_env()
        .build()
        .unwrap();
    (w, handle)
}

/// Pushes `sqes`, then runs progress until `n` CQEs arrived; checks that
/// no more follow.
fn run(w: &Worker, qp: &mut QueuePair, sqes: &[Sqe], n: usize) -> Vec<Cqe> {
    let deadline = Instant::now() + HANG;
    let mut pushed = 0;
    let mut out = Vec::new();
    while out.len() < n {
        if pushed < sqes.len() {
            pushed += qp.push_batch(&sqes[pushed..]).unwrap();
            qp.submit();
        }
        w.progress();
        while let Some(c) = qp.pop().unwrap() {
            out.push(c);
        }
        assert!(
            Instant::now() < deadline,
            "hung at {} of {n} CQEs",
            out.len()
        );
    }
    for _ in 0..10 {
        w.progress();
    }
    assert_eq!(qp.pop().unwrap(), None, "more CQEs than SQEs");
    out
}

/// 100 SQEs on `ep`: PUTs of slot numbers (small ones on lane 0, big
/// ones on the bandwidth lanes), weak and strong FENCEs, a FLUSH, fetching
/// atomics. `user_data` is the index; SQE `i` reads `src` at `256 * i`
/// and writes the window at `256 * i`.
fn mixed(ep: EndpointId, rkey: RkeyId, window: u64, src: &RegisteredBuf) -> Vec<Sqe> {
    let remote = |slot: u64| RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window + slot * SLOT * 4,
    };
    let e = ep.as_raw();
    (0..100u64)
        .map(|i| {
            match i % 10 {
                3 => Sqe::fence(e, FenceMode::ORDER),
                7 => Sqe::fence(e, FenceMode::COMPLETE),
                9 if i == 49 => Sqe::flush(e),
                9 => Sqe::atomic_fadd(e, src.local(28 * 1024 + 8 * i), remote(i), 1),
                k if k % 2 == 0 => Sqe::put(e, src.local(u64::from(BIG) * i), remote(i), 8),
                _ => Sqe::put(e, src.local(u64::from(BIG) * i), remote(i), BIG),
            }
            .with_user_data(i)
        })
        .collect()
}

fn is_fence(sqe: &Sqe) -> bool {
    sqe.opcode == ringfence_ring::Opcode::FENCE.as_raw()
}

/// (a) docs/fence.md R18, R20, R32: a handshake that fails after M polls, with
/// 100 SQEs queued on the connecting endpoint (weak and strong fences
/// among them). Nothing reaches the driver; every SQE completes exactly
/// once; everything queued completes with the handshake's error, in
/// submission order. A FENCE completes at once when submitted (R5: it
/// orders, it completes nothing; R34: one on a failed endpoint is
/// accepted), so its CQE is a success, before the queue's.
#[test]
fn a_connect_that_fails_completes_every_queued_sqe_once_with_its_error_in_order() {
    let (t, window) = target(100 * 4 * SLOT as usize);
    let (w, sim) = initiator(4);
    sim.connect_polls(5);
    sim.fail_connect(Status::PeerUnreachable);
    let ep = w.connect(t.address()).unwrap();
    assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Connecting);
    // The handle is good for unpacking keys while the handshake runs.
    let rkey = w
        .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = w.alloc_registered(32 * 1024).unwrap();
    let mut qp = w.create_queue().unwrap();
    let sqes = mixed(ep, rkey, window.addr(), &src);
    qp.push_batch(&sqes).unwrap();
    qp.submit();
    // Polls 1..4: still connecting, nothing posted.
    for _ in 0..4 {
        w.progress();
        assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Connecting);
    }
    let cqes = run(&w, &mut qp, &[], sqes.len());
    assert_eq!(
        w.endpoint_state(ep).unwrap(),
        EndpointState::Failed(Status::PeerUnreachable)
    );
    let mut ids: Vec<u64> = cqes.iter().map(|c| c.user_data).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..100).collect::<Vec<_>>(), "exactly once each");
    let failed: Vec<u64> = cqes
        .iter()
        .filter(|c| !is_fence(&sqes[c.user_data as usize]))
        .map(|c| {
            assert_eq!(
                c.res,
                Status::PeerUnreachable.as_raw(),
                "SQE {}",
                c.user_data
            );
            c.user_data
        })
        .collect();
    assert_eq!(failed.len(), 80);
    assert!(
        failed.windows(2).all(|p| p[0] < p[1]),
        "purged out of submission order: {failed:?}"
    );
    for c in cqes
        .iter()
        .filter(|c| is_fence(&sqes[c.user_data as usize]))
    {
        assert_eq!(c.res, 0, "FENCE {} (R5)", c.user_data);
    }
    assert!(sim.log().is_empty(), "something executed: {:?}", sim.log());
    assert_eq!(
        sim.stats().posted,
        0,
        "nothing may be posted while connecting"
    );
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
    assert!(sim.events().contains(&SimEvent::Connected(
        DriverEp(0),
        Err(Status::PeerUnreachable)
    )));
    // Sticky: a later SQE fails at once with the same error.
    let later = run(&w, &mut qp, &[sqes[0].with_user_data(500)], 1);
    assert_eq!(later[0].res, Status::PeerUnreachable.as_raw());
    let mut all = vec![0u8; 100 * 4 * SLOT as usize];
    window.read(0, &mut all);
    assert!(all.iter().all(|&b| b == 0), "nothing landed");
}

/// (a) The handshake succeeds after M polls with 100 SQEs queued: nothing
/// executes before it has, then they run in order under the fence rules
/// (R14, R18) and their data lands.
#[test]
fn a_connect_that_succeeds_runs_the_queued_sqes_in_order() {
    let (t, window) = target(100 * 4 * SLOT as usize);
    let (w, sim) = initiator(4);
    sim.connect_polls(5);
    sim.set_timing(SimTiming::Polls(3));
    sim.seed(11);
    let ep = w.connect(t.address()).unwrap();
    let rkey = w
        .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = w.alloc_registered(32 * 1024).unwrap();
    for i in 0..100u64 {
        src.write((u64::from(BIG) * i) as usize, &[i as u8 + 1; BIG as usize]);
    }
    let mut qp = w.create_queue().unwrap();
    let sqes = mixed(ep, rkey, window.addr(), &src);
    qp.push_batch(&sqes).unwrap();
    qp.submit();
    for _ in 0..4 {
        w.progress();
        assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Connecting);
        assert_eq!(sim.stats().posted, 0, "posted while connecting");
    }
    let cqes = run(&w, &mut qp, &[], sqes.len());
    assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Connected);
    for c in &cqes {
        assert!(
            c.res >= 0,
            "{}: {}",
            c.user_data,
            ringfence_ring::strerror(c.res)
        );
    }
    // The data landed: each PUT wrote its own slot with its pattern.
    for (i, sqe) in sqes.iter().enumerate() {
        if sqe.opcode != ringfence_ring::Opcode::PUT.as_raw() {
            continue;
        }
        let mut got = vec![0u8; sqe.len as usize];
        window.read((i as u64 * SLOT * 4) as usize, &mut got);
        assert!(
            got.iter().all(|&b| b == i as u8 + 1),
            "PUT {i} did not land"
        );
    }
    // Effects respect every fence (weak or strong): an operation after
    // fence k took effect after every operation before it.
    let log = sim.log();
    assert_eq!(log.len(), 79, "70 PUTs and 9 atomics");
    let index_of = |x: &ringfence_testkit::Executed| (x.remote_addr - window.addr()) / (SLOT * 4);
    let epoch = |i: u64| sqes[..i as usize].iter().filter(|s| is_fence(s)).count();
    let epochs: Vec<usize> = log.iter().map(|x| epoch(index_of(x))).collect();
    assert!(
        epochs.windows(2).all(|p| p[0] <= p[1]),
        "an effect crossed a fence: {epochs:?}"
    );
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
    assert_eq!(sim.stats().executed_uncommitted, 0);
}

/// (b) R44: the worker is dropped while the driver holds operations.
/// Each variant: every SQE completes exactly once; nothing executes after
/// `quiesce(All)` returned; the driver's memory (from `alloc_registered`)
/// is freed only after it returned.
#[test]
fn dropping_the_worker_while_the_driver_holds_operations_quiesces_before_freeing() {
    // (disconnect cancels, timing, posted operations, SQEs)
    for (drain, timing, puts) in [
        // Disconnect cancels what the connection holds (a destroyed QP).
        (false, SimTiming::Polls(1_000_000), 100),
        // Disconnect lets it drain, but it takes an hour: quiesce(All)
        // cancels it. More than one poll batch of the engine's is held.
        (true, SimTiming::Delay(Duration::from_secs(3600)), 300),
        // Disconnect lets it drain, and it does, during teardown's polls:
        // executions after disconnect and before quiesce are fine.
        (true, SimTiming::Polls(3), 100),
    ] {
        let what = format!("drain {drain}, {timing:?}");
        let (t, window) = target(1024 * SLOT as usize);
        let (w, sim) = initiator(4);
        sim.drain_on_disconnect(drain);
        sim.set_timing(timing);
        let ep = w.connect(t.address()).unwrap();
        let rkey = w
            .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
            .unwrap();
        let src = w.alloc_registered(1024 * SLOT as usize).unwrap();
        src.write(0, &[0x5a; BIG as usize]);
        let mut qp = w.create_queue().unwrap();
        let e = ep.as_raw();
        let remote = |slot: u64| RemoteBuf {
            rkey: rkey.as_raw(),
            addr: window.addr() + slot * SLOT,
        };
        // Connect, then PUTs (posted: held by the driver), then a strong
        // fence and more PUTs and a FLUSH (queued behind its flush).
        let mut sqes: Vec<Sqe> = (0..puts)
            .map(|i| Sqe::put(e, src.local(0), remote(i), if i % 3 == 0 { BIG } else { 8 }))
            .collect();
        sqes.push(Sqe::fence(e, FenceMode::COMPLETE));
        sqes.extend((0..20).map(|i| Sqe::put(e, src.local(0), remote(puts + i), 8)));
        sqes.push(Sqe::flush(e));
        let sqes: Vec<Sqe> = sqes
            .iter()
            .enumerate()
            .map(|(i, s)| s.with_user_data(i as u64))
            .collect();
        let mut cqes = Vec::new();
        let mut pushed = 0;
        let deadline = Instant::now() + HANG;
        while pushed < sqes.len() || sim.stats().posted < puts {
            pushed += qp.push_batch(&sqes[pushed..]).unwrap();
            qp.submit();
            w.progress();
            while let Some(c) = qp.pop().unwrap() {
                cqes.push(c);
            }
            assert!(Instant::now() < deadline, "{what}: never posted");
        }
        if !drain {
            assert!(sim.log().is_empty(), "{what}: executed early");
        }
        drop(w);
        while let Some(c) = qp.pop().unwrap() {
            cqes.push(c);
        }
        let mut ids: Vec<u64> = cqes.iter().map(|c| c.user_data).collect();
        ids.sort_unstable();
        assert_eq!(
            ids,
            (0..sqes.len() as u64).collect::<Vec<_>>(),
            "{what}: exactly once each"
        );
        let executed = sim.log().len();
        let mut succeeded = 0;
        for c in &cqes {
            let sqe = &sqes[c.user_data as usize];
            if is_fence(sqe) {
                assert_eq!(c.res, 0, "{what}: the FENCE (R5)");
            } else if drain && timing == SimTiming::Polls(3) {
                // Drained: the PUTs posted before the drop ran; the rest
                // ran or was canceled.
                if c.user_data < puts {
                    assert!(c.res >= 0, "{what}: {c:?} drained");
                }
                let put = sqe.opcode == ringfence_ring::Opcode::PUT.as_raw();
                assert!(
                    c.res >= 0 || c.res == Status::Canceled.as_raw(),
                    "{what}: {c:?}"
                );
                succeeded += usize::from(put && c.res >= 0);
            } else {
                assert_eq!(c.res, Status::Canceled.as_raw(), "{what}: {c:?}");
            }
        }
        assert_eq!(executed, succeeded, "{what}: only what succeeded executed");
        // The memory goes after the worker's queue pairs and handles.
        drop(qp);
        drop(src);
        assert!(
            sim.violations().is_empty(),
            "{what}: {:?}",
            sim.violations()
        );
        let events = sim.events();
        let quiesced = events
            .iter()
            .position(|e| *e == SimEvent::QuiesceReturned(Quiesce::All))
            .unwrap_or_else(|| panic!("{what}: no quiesce(All): {events:?}"));
        let called = events
            .iter()
            .position(|e| *e == SimEvent::QuiesceCalled(Quiesce::All))
            .unwrap();
        let disconnected = events
            .iter()
            .position(|e| matches!(e, SimEvent::Disconnect(_)))
            .unwrap();
        assert!(disconnected < called, "{what}: quiesce before disconnect");
        let freed: Vec<usize> = events
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, SimEvent::Freed { .. }))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(freed.len(), 1, "{what}: the source buffer freed once");
        assert!(
            freed.iter().all(|&f| f > quiesced),
            "{what}: memory freed before quiesce(All) returned: {events:?}"
        );
        drop(t);
    }
}

/// (c) Deregistration while a request uses the registration fails with
/// BUSY and frees nothing; once its operations completed it succeeds, and
/// the driver quiesces the registration before the memory goes.
#[test]
fn deregistration_waits_for_its_operations_and_quiesces_before_freeing() {
    let (t, window) = target(4096);
    let (w, sim) = initiator(2);
    sim.set_timing(SimTiming::Polls(20));
    let ep = w.connect(t.address()).unwrap();
    let rkey = w
        .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = w.alloc_registered(4096).unwrap();
    let addr = src.addr();
    src.write(0, &[7; 64]);
    let mut qp = w.create_queue().unwrap();
    let remote = RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window.addr(),
    };
    let put = Sqe::put(ep.as_raw(), src.local(0), remote, 64).with_user_data(1);
    qp.push(put).unwrap();
    qp.submit();
    let deadline = Instant::now() + HANG;
    while sim.stats().posted == 0 {
        w.progress();
        assert!(Instant::now() < deadline);
    }
    // Held by the driver: the registration is in use.
    let err = w.deregister(src.handle()).unwrap_err();
    assert_eq!(err.status(), Status::Busy);
    let events = sim.events();
    assert!(
        !events.iter().any(|e| matches!(
            e,
            SimEvent::Deregister(_) | SimEvent::QuiesceCalled(_) | SimEvent::Freed { .. }
        )),
        "a refused deregistration changed something: {events:?}"
    );
    let cqes = run(&w, &mut qp, &[], 1);
    assert_eq!(cqes[0].res, 64);
    let mut landed = [0u8; 64];
    window.read(0, &mut landed);
    assert_eq!(landed, [7; 64]);
    // Done: it deregisters; the driver withdraws and quiesces it.
    w.deregister(src.handle()).unwrap();
    drop(src);
    let events = sim.events();
    let key = events
        .iter()
        .find_map(|e| match e {
            SimEvent::Deregister(key) => Some(*key),
            _ => None,
        })
        .expect("deregistered at the driver");
    let at = |want: SimEvent| events.iter().position(|e| *e == want);
    let deregistered = at(SimEvent::Deregister(key)).unwrap();
    let called = at(SimEvent::QuiesceCalled(Quiesce::Memory(key))).expect("quiesced");
    let returned = at(SimEvent::QuiesceReturned(Quiesce::Memory(key))).unwrap();
    let freed = events
        .iter()
        .position(|e| matches!(e, SimEvent::Freed { addr: a, .. } if *a == addr))
        .expect("freed once the last handle went");
    assert!(
        deregistered < called && called < returned && returned < freed,
        "{events:?}"
    );
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

/// (d) One doorbell per round, and nothing executes before it: the engine
/// calls `commit` exactly once per progress round (idle ones included),
/// and an operation posted in a round executes no earlier than the next
/// round's poll, even with the shortest timing.
#[test]
fn nothing_executes_before_the_rounds_commit() {
    let (t, window) = target(4096);
    let (w, sim) = initiator(4);
    sim.set_timing(SimTiming::Polls(0));
    sim.connect_polls(1);
    let ep = w.connect(t.address()).unwrap();
    let rkey = w
        .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = w.alloc_registered(4096).unwrap();
    let mut qp = w.create_queue().unwrap();
    let before = sim.commits();
    let mut rounds = 0;
    // Round 1 finishes the handshake.
    w.progress();
    rounds += 1;
    assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Connected);
    let remote = |slot: u64| RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window.addr() + slot * SLOT,
    };
    for batch in 0..20u64 {
        let sqes: Vec<Sqe> = (0..8)
            .map(|k| {
                let slot = batch * 8 + k;
                let len = if k % 2 == 0 { 8 } else { BIG };
                Sqe::put(ep.as_raw(), src.local(0), remote(slot % 60), len).with_user_data(slot)
            })
            .collect();
        qp.push_batch(&sqes).unwrap();
        qp.submit();
        let executed = sim.stats().executed;
        // The round that takes them posts them; its commit comes after its
        // poll, so none can have executed when it returns.
        w.progress();
        rounds += 1;
        assert_eq!(sim.stats().posted, (batch + 1) * 8);
        assert_eq!(
            sim.stats().executed,
            executed,
            "executed in its posting round"
        );
        // The next round's poll runs them.
        w.progress();
        rounds += 1;
        assert_eq!(sim.stats().executed, executed + 8);
        let mut got = 0;
        while qp.pop().unwrap().is_some() {
            got += 1;
        }
        assert_eq!(got, 8);
    }
    for _ in 0..10 {
        w.progress(); // idle rounds ring the doorbell too (for nothing)
        rounds += 1;
    }
    assert_eq!(sim.commits() - before, rounds, "one commit per round");
    assert_eq!(sim.stats().executed_uncommitted, 0);
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

/// A connect the worker gives up on (the endpoint is closed, or the
/// worker dropped) while the handshake runs: the handshake's completion
/// is canceled and ignored, and the queued SQEs complete once, canceled.
#[test]
fn dropping_the_worker_during_a_handshake_cancels_the_queue_once() {
    let (t, window) = target(100 * 4 * SLOT as usize);
    let (w, sim) = initiator(2);
    sim.connect_timing(SimTiming::Delay(Duration::from_secs(3600)));
    let ep = w.connect(t.address()).unwrap();
    let rkey = w
        .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = w.alloc_registered(32 * 1024).unwrap();
    let mut qp = w.create_queue().unwrap();
    let sqes = mixed(ep, rkey, window.addr(), &src);
    qp.push_batch(&sqes[..40]).unwrap();
    qp.submit();
    for _ in 0..5 {
        w.progress();
    }
    assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Connecting);
    drop(w);
    let mut ids = Vec::new();
    while let Some(c) = qp.pop().unwrap() {
        let want = if is_fence(&sqes[c.user_data as usize]) {
            0
        } else {
            Status::Canceled.as_raw()
        };
        assert_eq!(c.res, want, "{c:?}");
        ids.push(c.user_data);
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..40).collect::<Vec<_>>());
    assert!(sim.log().is_empty());
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

// ---------------------------------------------------------------- the driver itself

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
            b.handle.set_timing(if lane % 2 == 0 {
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

/// What each kind of SQE queued behind a failed handshake completes with,
/// as docs/rust.md's "Connecting" section and `Worker::connect` say: a FENCE
/// completes when it is submitted (R5), while the endpoint is still
/// connecting; the PUTs and FLUSHes queued behind the handshake complete
/// with its error, in submission order; a worker FLUSH covering them fails
/// with it too; a queued graceful CLOSE succeeds (R34) and closes the
/// endpoint, unless the error is `PeerUnreachable`, which it then
/// returns. After the failure, a FENCE succeeds (or fails with
/// `PeerUnreachable` where that is the error) and anything else fails
/// with the error.
#[test]
fn a_failed_handshake_completes_each_kind_of_queued_sqe_as_documented() {
    for error in [Status::Timeout, Status::PeerUnreachable] {
        for close in [false, true] {
            let (t, window) = target(4 * SLOT as usize);
            let (w, sim) = initiator(1);
            sim.connect_polls(5);
            sim.fail_connect(error);
            let ep = w.connect(t.address()).unwrap();
            let rkey = w
                .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
                .unwrap();
            let src = w.alloc_registered(4096).unwrap();
            let e = ep.as_raw();
            let remote = RemoteBuf {
                rkey: rkey.as_raw(),
                addr: window.addr(),
            };
            let mut sqes = vec![
                Sqe::put(e, src.local(0), remote, 8).with_user_data(0),
                Sqe::fence(e, FenceMode::ORDER).with_user_data(1),
                Sqe::put(e, src.local(0), remote, 8).with_user_data(2),
                Sqe::fence(e, FenceMode::COMPLETE).with_user_data(3),
                Sqe::flush(e).with_user_data(4),
                Sqe::flush_worker().with_user_data(5),
            ];
            if close {
                sqes.push(Sqe::close(e, ringfence_ring::CloseMode::GRACEFUL).with_user_data(6));
            }
            let mut qp = w.create_queue().unwrap();
            qp.push_batch(&sqes).unwrap();
            qp.submit();
            // Still connecting: only the FENCEs have completed.
            let mut early = Vec::new();
            for _ in 0..3 {
                w.progress();
                assert_eq!(
                    w.endpoint_state(ep).unwrap(),
                    if close {
                        EndpointState::Closing
                    } else {
                        EndpointState::Connecting
                    }
                );
                while let Some(c) = qp.pop().unwrap() {
                    early.push((c.user_data, c.res));
                }
            }
            assert_eq!(early, [(1, 0), (3, 0)], "{error:?}: FENCEs at submission");
            let rest = run(&w, &mut qp, &[], sqes.len() - 2);
            let rest: Vec<(u64, i32)> = rest.iter().map(|c| (c.user_data, c.res)).collect();
            let status = error.as_raw();
            let mut expected = vec![(0, status), (2, status), (4, status)];
            if close {
                let closed = if error == Status::PeerUnreachable {
                    status
                } else {
                    0
                };
                expected.push((6, closed));
            }
            expected.push((5, status));
            assert_eq!(rest, expected, "{error:?}, close {close}");
            assert_eq!(sim.stats().posted, 0, "nothing posted");
            if close {
                assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Closed);
                continue;
            }
            assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Failed(error));
            let later = run(
                &w,
                &mut qp,
                &[
                    Sqe::fence(e, FenceMode::COMPLETE).with_user_data(7),
                    Sqe::put(e, src.local(0), remote, 8).with_user_data(8),
                ],
                2,
            );
            let fence = if error == Status::PeerUnreachable {
                status
            } else {
                0
            };
            assert_eq!(later[0].res, fence, "{error:?}: a later FENCE");
            assert_eq!(later[1].res, status, "{error:?}: a later PUT");
        }
    }
}

/// Whether the memory from `alloc_memory` at `addr` has been freed.
fn freed(sim: &SimHandle, addr: u64) -> bool {
    sim.events()
        .iter()
        .any(|e| matches!(e, SimEvent::Freed { addr: a, .. } if *a == addr))
}

/// The driver key of the first registration deregistered at the driver.
fn deregistered_key(sim: &SimHandle) -> DriverMemKey {
    sim.events()
        .iter()
        .find_map(|e| match e {
            SimEvent::Deregister(key) => Some(*key),
            _ => None,
        })
        .expect("deregistered at the driver")
}

/// A quiesce that answers `Pending` for 50 asks: the deregistration
/// returns at once, the memory the worker owns is kept (no `Freed`) while
/// the engine asks again from its rounds, another endpoint's PUT completes
/// meanwhile, and the memory is freed only after the driver answered
/// `Done`.
#[test]
fn a_deregistration_the_driver_finishes_later_frees_only_after_done() {
    let (t, window) = target(4096);
    let (w, sim) = initiator(1);
    sim.delay_quiesce(50);
    let src = w.alloc_registered(4096).unwrap();
    let addr = src.addr();
    let other = w.alloc_registered(64).unwrap();
    other.write(0, &[3; 8]);
    let ep = w.connect(t.address()).unwrap();
    let rkey = w
        .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let mut qp = w.create_queue().unwrap();
    w.deregister(src.handle()).unwrap();
    drop(src);
    let key = deregistered_key(&sim);
    assert!(!freed(&sim, addr), "freed while the driver said not yet");
    let held = w.unreleased_memory();
    assert_eq!((held.pending, held.pending_bytes), (1, 4096));
    // The worker goes on: a PUT on the endpoint completes meanwhile.
    let remote = RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window.addr(),
    };
    let put = Sqe::put(ep.as_raw(), other.local(0), remote, 8).with_user_data(1);
    let cqes = run(&w, &mut qp, &[put], 1);
    assert_eq!(cqes[0].res, 8);
    assert_eq!(window.load_u64(0), u64::from_le_bytes([3; 8]));
    assert!(!freed(&sim, addr), "freed while the driver said not yet");
    let deadline = Instant::now() + HANG;
    while !freed(&sim, addr) {
        w.progress();
        assert!(Instant::now() < deadline, "never freed");
    }
    assert_eq!(w.unreleased_memory(), Default::default());
    let events = sim.events();
    let asks = events
        .iter()
        .filter(|e| **e == SimEvent::QuiesceCalled(Quiesce::Memory(key)))
        .count();
    let pending = events
        .iter()
        .filter(|e| **e == SimEvent::QuiescePending(Quiesce::Memory(key)))
        .count();
    assert_eq!((asks, pending), (51, 50), "asked again until done, no more");
    let done = events
        .iter()
        .position(|e| *e == SimEvent::QuiesceReturned(Quiesce::Memory(key)))
        .expect("done");
    let gone = events
        .iter()
        .position(|e| matches!(e, SimEvent::Freed { addr: a, .. } if *a == addr))
        .unwrap();
    assert!(done < gone, "{events:?}");
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

/// A quiesce that answers `Leak`: the deregistration succeeds, and the
/// memory is never freed, not even when the worker goes.
#[test]
fn memory_a_driver_leaks_is_never_freed() {
    let (w, sim) = initiator(1);
    sim.leak_quiesce(true);
    let src = w.alloc_registered(8192).unwrap();
    let addr = src.addr();
    w.deregister(src.handle()).unwrap();
    drop(src);
    let key = deregistered_key(&sim);
    for _ in 0..100 {
        w.progress();
    }
    let held = w.unreleased_memory();
    assert_eq!((held.pending, held.leaked, held.leaked_bytes), (0, 1, 8192));
    drop(w);
    assert!(!freed(&sim, addr), "leaked memory was freed");
    let events = sim.events();
    assert_eq!(
        events
            .iter()
            .filter(|e| **e == SimEvent::QuiesceCalled(Quiesce::Memory(key)))
            .count(),
        1,
        "a leak is final: {events:?}"
    );
    assert!(events.contains(&SimEvent::QuiesceLeaked(Quiesce::Memory(key))));
}

/// Memory the application owns, under a quiesce that answers `Pending`
/// for 3 asks: deregistration answers BUSY (the memory must stay) while
/// the driver holds it, SQEs naming the handle fail at once, and once the
/// progress rounds have asked the driver enough, the same call succeeds,
/// once.
#[test]
fn the_application_keeps_its_memory_until_the_driver_released_it() {
    let (t, window) = target(4096);
    let (w, sim) = initiator(1);
    let ep = w.connect(t.address()).unwrap();
    let rkey = w
        .unpack_rkey(ep, &t.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let mut qp = w.create_queue().unwrap();
    sim.delay_quiesce(3);
    let mut mine = vec![0u64; 512];
    // SAFETY: `mine` outlives the registration: it is dropped only after
    // `deregister` answered `Ok`.
    let handle = unsafe { w.register(mine.as_mut_ptr().cast(), 4096, MemKind::Host) }.unwrap();
    let busy = |w: &Worker| w.deregister(handle).map_err(|e| e.status());
    assert_eq!(busy(&w), Err(Status::Busy));
    assert_eq!(busy(&w), Err(Status::Busy), "no round has asked again");
    assert_eq!(w.unreleased_memory().pending, 1);
    // Withdrawn for SQEs all the same.
    let remote = RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window.addr(),
    };
    let local = ringfence_ring::LocalBuf {
        mem: handle.as_raw(),
        addr: mine.as_ptr() as u64,
    };
    let put = Sqe::put(ep.as_raw(), local, remote, 8).with_user_data(1);
    let cqes = run(&w, &mut qp, &[put], 1);
    assert_eq!(cqes[0].res, Status::InvalidMemHandle.as_raw());
    let deadline = Instant::now() + HANG;
    while w.unreleased_memory().pending > 0 {
        w.progress();
        assert!(Instant::now() < deadline, "never released");
    }
    assert_eq!(busy(&w), Ok(()));
    assert_eq!(busy(&w), Err(Status::InvalidMemHandle));
    drop(mine);
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

/// A worker over a `SimDriver` that gives its teardown at most `timeout`.
fn initiator_with_timeout(timeout: Duration) -> (Worker, SimHandle) {
    let (sim, handle) = SimDriver::new(Loopback::new());
    let w = Worker::builder()
        .driver(sim)
        .quiesce_timeout(timeout)
        .ignore_env()
        .build()
        .unwrap();
    (w, handle)
}

/// Teardown whose `quiesce(All)` answers `Pending`: asked again between
/// polls, and memory is freed only after `Done`; one that never finishes
/// within the worker's quiesce timeout leaks every registration (live
/// and deregistered) rather than free it.
#[test]
fn teardown_frees_after_a_late_done_and_leaks_what_never_finishes() {
    let (w, sim) = initiator_with_timeout(HANG);
    sim.delay_quiesce(5);
    let live = w.alloc_registered(4096).unwrap();
    let addr = live.addr();
    drop(live);
    drop(w);
    let events = sim.events();
    let pending = events
        .iter()
        .filter(|e| **e == SimEvent::QuiescePending(Quiesce::All))
        .count();
    assert_eq!(pending, 5, "{events:?}");
    let done = events
        .iter()
        .position(|e| *e == SimEvent::QuiesceReturned(Quiesce::All))
        .expect("done");
    let gone = events
        .iter()
        .position(|e| matches!(e, SimEvent::Freed { addr: a, .. } if *a == addr))
        .expect("freed");
    assert!(done < gone, "{events:?}");

    let (w, sim) = initiator_with_timeout(Duration::from_millis(50));
    sim.delay_quiesce(u32::MAX);
    let live = w.alloc_registered(4096).unwrap();
    let parked = w.alloc_registered(4096).unwrap();
    let addrs = [live.addr(), parked.addr()];
    w.deregister(parked.handle()).unwrap();
    drop((live, parked));
    drop(w);
    for addr in addrs {
        assert!(!freed(&sim, addr), "freed although teardown never finished");
    }
    let events = sim.events();
    assert!(events.contains(&SimEvent::QuiescePending(Quiesce::All)));
    assert!(!events.contains(&SimEvent::QuiesceReturned(Quiesce::All)));
}
