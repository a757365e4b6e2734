//! Completions that name something no longer in flight: a flush part a
//! driver returns twice, a late part of a worker flush whose request slot
//! the next worker flush took, and a canceled handshake of a connect
//! attempt that was refused, whose endpoint index the next connect took.
//! Each is stray: it completes nothing and fails nothing.
//!
//! Deterministic on a loaded machine: nothing sleeps to synchronize, no
//! assertion is about time; loops are bounded by a generous deadline that
//! only catches hangs.

use ringfence::{
    CompletionMode, EndpointId, EndpointState, Loopback, QueuePair, RegisteredBuf, RkeyId, Worker,
};
use ringfence_ring::{Cqe, FenceMode, RemoteBuf, Sqe, Status};
use ringfence_testkit::{FaultHandle, FaultInjector, LoopbackTarget, SimDriver, Timing};
use std::time::{Duration, Instant};

const HANG: Duration = Duration::from_secs(30);
/// PUTs from this size take bandwidth lanes (on the last lane group).
const BIG: u32 = 1024;

/// Runs `rounds` progress rounds and returns the CQEs they brought.
fn rounds(w: &Worker, qp: &mut QueuePair, rounds: usize) -> Vec<Cqe> {
    let mut out = Vec::new();
    for _ in 0..rounds {
        w.progress();
        while let Some(c) = qp.pop().unwrap() {
            out.push(c);
        }
    }
    out
}

/// Pushes `sqes` and runs progress until a CQE with `user_data` came;
/// returns every CQE seen.
fn until(w: &Worker, qp: &mut QueuePair, sqes: &[Sqe], user_data: u64) -> Vec<Cqe> {
    let deadline = Instant::now() + HANG;
    let mut pushed = 0;
    let mut out = Vec::new();
    while !out.iter().any(|c: &Cqe| c.user_data == user_data) {
        if pushed < sqes.len() {
            pushed += qp.push_batch(&sqes[pushed..]).unwrap();
            qp.submit();
        }
        w.progress();
        while let Some(c) = qp.pop().unwrap() {
            out.push(c);
        }
        assert!(Instant::now() < deadline, "hung waiting for {user_data}");
    }
    out
}

fn res(cqes: &[Cqe], user_data: u64) -> i32 {
    cqes.iter().find(|c| c.user_data == user_data).unwrap().res
}

/// An initiator with "lb-a" (2 lanes, synchronous) and "lb-b" (4 lanes,
/// completing at the next poll), each in a `FaultInjector`, with one
/// endpoint over both to a target that has both.
struct Mixed {
    _target: Worker,
    w: Worker,
    a: FaultHandle,
    b: FaultHandle,
    window: RegisteredBuf,
    src: RegisteredBuf,
    id: EndpointId,
    ep: u32,
    rkey: RkeyId,
    qp: QueuePair,
}

fn mixed() -> Mixed {
    let (a_driver, a) = FaultInjector::new(Loopback::new().named("lb-a"));
    let (b_driver, b) =
        FaultInjector::new(Loopback::with_mode(CompletionMode::Immediate).named("lb-b"));
    a.set_timing(Timing::Synchronous);
    b.set_timing(Timing::NextPoll);
    let w = Worker::builder()
        .driver(a_driver)
        .driver(b_driver)
        .bw_threshold(BIG)
        .ignore_env()
        .build()
        .unwrap();
    let LoopbackTarget {
        worker: target,
        window,
        ep,
        rkey,
    } = LoopbackTarget::connect_mixed(&w, &[("lb-a", 2), ("lb-b", 4)], 1 << 16);
    let src = w.alloc_registered(1 << 16).unwrap();
    let qp = w.create_queue().unwrap();
    Mixed {
        _target: target,
        w,
        a,
        b,
        window,
        src,
        id: ep,
        ep: ep.as_raw(),
        rkey,
        qp,
    }
}

impl Mixed {
    fn put(&self, dst: u64, len: u32, user_data: u64) -> Sqe {
        let remote = RemoteBuf {
            rkey: self.rkey.as_raw(),
            addr: self.window.addr() + dst,
        };
        Sqe::put(self.ep, self.src.local(0), remote, len).with_user_data(user_data)
    }
}

/// A user FLUSH over both drivers: lb-a's part is held, lb-b returns its
/// part twice. The duplicate must not stand for lb-a's part: the FLUSH
/// completes only once lb-a's part has.
#[test]
fn a_part_returned_twice_does_not_complete_a_split_flush() {
    let mut m = mixed();
    m.a.block_flushes(true);
    m.b.duplicate_flush_completions(1);
    let sqes = [
        m.put(0, 8, 1),
        m.put(2048, BIG, 2),
        Sqe::flush(m.ep).with_user_data(3),
    ];
    let mut cqes = until(&m.w, &mut m.qp, &sqes, 2);
    cqes.extend(rounds(&m.w, &mut m.qp, 50));
    assert!(
        !cqes.iter().any(|c| c.user_data == 3),
        "the FLUSH completed while lb-a's part was held: {cqes:?}"
    );
    m.a.block_flushes(false);
    let cqes = until(&m.w, &mut m.qp, &[], 3);
    assert_eq!(res(&cqes, 3), 0);
    assert_eq!(m.w.endpoint_state(m.id).unwrap(), EndpointState::Connected);
}

/// The same for a strong fence's flush: the PUT after the fence must not
/// start before lb-a's part of the fence flush completed.
#[test]
fn a_part_returned_twice_does_not_end_a_split_fence_flush() {
    let mut m = mixed();
    let sqes = [m.put(0, 8, 1), m.put(2048, BIG, 2)];
    until(&m.w, &mut m.qp, &sqes, 2);
    m.a.block_flushes(true);
    m.b.duplicate_flush_completions(1);
    let a_before = m.a.log().len();
    let sqes = [
        m.put(0, 8, 3),
        m.put(2048, BIG, 4),
        Sqe::fence(m.ep, FenceMode::COMPLETE).with_user_data(5),
        m.put(64, 8, 6),
    ];
    let mut cqes = until(&m.w, &mut m.qp, &sqes, 4);
    cqes.extend(rounds(&m.w, &mut m.qp, 50));
    assert!(
        !cqes.iter().any(|c| c.user_data == 6),
        "the PUT after the fence completed while lb-a's part was held"
    );
    assert_eq!(
        m.a.log().len(),
        a_before + 1,
        "only the PUT before the fence ran on lb-a"
    );
    m.a.block_flushes(false);
    let cqes = until(&m.w, &mut m.qp, &[], 6);
    assert_eq!(res(&cqes, 6), 8);
}

/// A worker flush whose part finished inside the driver's call, and whose
/// completion the driver returns a second time later: by then the next
/// worker flush has taken the same request slot (the pool hands the last
/// freed slot out first), and its own part is held. The late duplicate
/// names the earlier flush and must not complete the later one.
#[test]
fn a_late_part_of_a_worker_flush_does_not_complete_the_next_one() {
    let (driver, fault) = FaultInjector::new(Loopback::with_mode(CompletionMode::Immediate));
    fault.set_timing(Timing::Synchronous);
    let w = Worker::builder()
        .driver(driver)
        .ignore_env()
        .build()
        .unwrap();
    let target = Worker::builder()
        .driver(Loopback::new())
        .ignore_env()
        .build()
        .unwrap();
    let window = target.alloc_registered(4096).unwrap();
    let ep = w.connect(target.address()).unwrap();
    let rkey = w
        .unpack_rkey(ep, &target.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = w.alloc_registered(4096).unwrap();
    let mut qp = w.create_queue().unwrap();
    let put = |user_data| {
        let remote = RemoteBuf {
            rkey: rkey.as_raw(),
            addr: window.addr(),
        };
        Sqe::put(ep.as_raw(), src.local(0), remote, 8).with_user_data(user_data)
    };
    fault.duplicate_flush_completions(1);
    let first = [put(1), Sqe::flush_worker().with_user_data(2)];
    let cqes = until(&w, &mut qp, &first, 2);
    assert_eq!(res(&cqes, 2), 0);
    // At once, before the duplicate comes back: the next worker flush,
    // whose part the driver holds.
    fault.block_flushes(true);
    let second = [put(3), Sqe::flush_worker().with_user_data(4)];
    let mut cqes = until(&w, &mut qp, &second, 3);
    cqes.extend(rounds(&w, &mut qp, 50));
    assert!(
        !cqes.iter().any(|c| c.user_data == 4),
        "a late part of the first worker flush completed the second"
    );
    fault.block_flushes(false);
    let cqes = until(&w, &mut qp, &[], 4);
    assert_eq!(res(&cqes, 4), 0);
}

/// A connect over two drivers whose second driver refuses at once: the
/// engine disconnects the first group, whose driver then reports that
/// handshake canceled through `poll`. The next connect takes the same
/// endpoint index; the canceled handshake of the refused attempt must not
/// fail it.
#[test]
fn a_canceled_handshake_of_a_refused_attempt_does_not_fail_the_next_connect() {
    let (a_driver, a) = SimDriver::new(Loopback::new().named("lb-a"));
    let (b_driver, b) = SimDriver::new(Loopback::new().named("lb-b"));
    let w = Worker::builder()
        .driver(a_driver)
        .driver(b_driver)
        .ignore_env()
        .build()
        .unwrap();
    let target = Worker::builder()
        .driver(Loopback::new().named("lb-a"))
        .driver(Loopback::new().named("lb-b"))
        .ignore_env()
        .build()
        .unwrap();
    let window = target.alloc_registered(4096).unwrap();
    // Handshakes complete at the fifth poll: the canceled one (due at
    // once) comes back before the next attempt's.
    a.connect_polls(5);
    b.connect_polls(5);
    b.refuse_connect(Status::PeerUnreachable);
    let groups = [("lb-a", 1), ("lb-b", 1)];
    let refused = w.connect_lanes(target.address(), &groups);
    assert_eq!(refused.unwrap_err().status(), Status::PeerUnreachable);
    let ep = w.connect_lanes(target.address(), &groups).unwrap();
    let rkey = w
        .unpack_rkey(ep, &target.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = w.alloc_registered(4096).unwrap();
    src.write(0, &[9; 8]);
    let mut qp = w.create_queue().unwrap();
    let remote = RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window.addr(),
    };
    let sqes = [
        Sqe::put(ep.as_raw(), src.local(0), remote, 8).with_user_data(1),
        Sqe::flush(ep.as_raw()).with_user_data(2),
    ];
    let cqes = until(&w, &mut qp, &sqes, 2);
    assert_eq!(res(&cqes, 1), 8, "{cqes:?}");
    assert_eq!(res(&cqes, 2), 0, "{cqes:?}");
    assert_eq!(w.endpoint_state(ep).unwrap(), EndpointState::Connected);
    let mut got = [0u8; 8];
    window.read(0, &mut got);
    assert_eq!(got, [9; 8]);
    assert!(a.violations().is_empty() && b.violations().is_empty());
}
