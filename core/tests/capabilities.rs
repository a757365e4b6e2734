//! The engine keeps to what a driver claims (`Capabilities`) and to what
//! the peer of a connection takes (`PeerLimits`): the per-operation atomic
//! mask, the atomic domain on mixed endpoints, the driver's largest
//! message for NOTIFY, the peer's notification buffers, and the weak
//! NOTIFY path of drivers whose lanes deliver a NOTIFY after the writes
//! before it (`notify_ordered`, docs/fence.md R8, R9).
//!
//! The drivers are loopback drivers claiming less than they could do
//! (`Loopback::with_capabilities`), wrapped in `FaultInjector`s where a
//! test needs writes in flight or to see what reached the driver.

use ringfence::{AtomicDomain, AtomicOps, Loopback, QueuePair, RegisteredBuf, RkeyId, Worker};
use ringfence_ring::{AtomicOp, Cqe, RemoteBuf, Sqe, Status};
use ringfence_testkit::{FaultHandle, FaultInjector, LoopbackTarget, Timing, run_sqes};

/// PUTs from this size take bandwidth lanes (lanes 1 and up).
const BIG: u32 = 4096;

/// An initiator whose endpoint to a target has `lanes` lanes on `driver`
/// (a `FaultInjector` completing at the next poll, so writes are in
/// flight when the next request comes), the target's window, and the
/// target's notification queue.
struct Pair {
    target: Worker,
    initiator: Worker,
    handle: FaultHandle,
    window: RegisteredBuf,
    src: RegisteredBuf,
    ep: u32,
    rkey: RkeyId,
    qp: QueuePair,
    target_qp: QueuePair,
}

impl Pair {
    fn new(driver: Loopback, lanes: u8, notify_size: u32) -> Pair {
        let (driver, handle) = FaultInjector::new(driver);
        handle.set_timing(Timing::NextPoll);
        let initiator = Worker::builder()
            .driver(driver)
            .lanes(lanes)
            .bw_threshold(BIG)
            .ignore_env()
            .build()
            .unwrap();
        let target = Worker::builder()
            .driver(Loopback::new())
            .notify_buffers(8, notify_size)
            .ignore_env()
            .build()
            .unwrap();
        let window = target.alloc_registered(1 << 16).unwrap();
        let ep = initiator.connect(target.address()).unwrap();
        let rkey = initiator
            .unpack_rkey(ep, &target.pack_rkey(window.handle()).unwrap())
            .unwrap();
        let src = initiator.alloc_registered(1 << 16).unwrap();
        let qp = initiator.create_queue().unwrap();
        let target_qp = target.create_queue().unwrap();
        Pair {
            target,
            initiator,
            handle,
            window,
            src,
            ep: ep.as_raw(),
            rkey,
            qp,
            target_qp,
        }
    }

    fn remote(&self, offset: u64) -> RemoteBuf {
        RemoteBuf {
            rkey: self.rkey.as_raw(),
            addr: self.window.addr() + offset,
        }
    }

    fn run(&mut self, sqes: &[Sqe]) -> Vec<Cqe> {
        let mut cqes = run_sqes(&self.initiator, &mut self.qp, sqes, sqes.len());
        cqes.sort_by_key(|c| c.user_data);
        cqes
    }

    /// The next notification the target receives, and the window's first
    /// `len` bytes as it was when the notification was read.
    fn notification(&mut self, len: usize) -> (Vec<u8>, Vec<u8>) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let cqe = loop {
            self.target.progress();
            if let Some(cqe) = self.target_qp.pop().unwrap() {
                break cqe;
            }
            assert!(std::time::Instant::now() < deadline, "no notification");
        };
        let payload = self.target_qp.notification(&cqe).expect("a notification");
        let mut landed = vec![0; len];
        self.window.read(0, &mut landed);
        (payload.to_vec(), landed)
    }
}

fn ok(cqes: &[Cqe]) {
    for c in cqes {
        assert!(
            c.res >= 0,
            "user_data {}: {}",
            c.user_data,
            ringfence_ring::strerror(c.res)
        );
    }
}

/// A PUT and then a NOTIFY on the same lane of a driver whose lanes deliver
/// a NOTIFY after the writes before it: the NOTIFY's boundary is a weak
/// fence (a fence flag on the NOTIFY, no flush, R8), and the target still
/// sees the data before the notification. The same driver claiming
/// `notify_ordered = false` takes the strong path (a flush first).
#[test]
fn a_notify_behind_writes_on_its_own_lane_takes_the_weak_path() {
    for ordered in [true, false] {
        let driver = if ordered {
            Loopback::new()
        } else {
            Loopback::new().with_capabilities(|mut caps| {
                caps.notify_ordered = false;
                caps
            })
        };
        let mut p = Pair::new(driver, 4, 256);
        for round in 0..4u8 {
            let data = vec![round + 1; 512];
            p.src.write(0, &data);
            p.src.write(8192, b"landed");
            let sqes = [
                Sqe::put(p.ep, p.src.local(0), p.remote(0), 512).with_user_data(1),
                Sqe::notify(p.ep, p.src.local(8192), 6).with_user_data(2),
            ];
            ok(&p.run(&sqes));
            let (payload, landed) = p.notification(512);
            assert_eq!(payload, b"landed");
            assert_eq!(landed, data, "round {round}: data before the notification");
        }
        let stats = p.initiator.stats();
        if ordered {
            assert_eq!(stats.notify_flushes, 0, "{stats:?}");
            assert_eq!(stats.flushes, 0, "{stats:?}");
            assert_eq!(stats.weak_fences, 4, "{stats:?}");
            // Each NOTIFY reached the driver with its fence flag.
            let fenced = p
                .handle
                .log()
                .iter()
                .filter(|x| x.kind == ringfence::OpKind::Notify && x.fence)
                .count();
            assert_eq!(fenced, 4);
        } else {
            assert_eq!(stats.notify_flushes, 4, "{stats:?}");
        }
    }
}

/// A NOTIFY behind writes on other lanes than its own flushes them first
/// (R9), on a `notify_ordered` driver too: its lane's order says nothing
/// of theirs.
#[test]
fn a_notify_behind_writes_on_other_lanes_flushes_them() {
    let mut p = Pair::new(Loopback::new(), 4, 256);
    let data = vec![7; BIG as usize];
    p.src.write(0, &data);
    p.src.write(8192, b"big");
    let sqes = [
        // Large: a bandwidth lane; the NOTIFY goes on lane 0.
        Sqe::put(p.ep, p.src.local(0), p.remote(0), BIG).with_user_data(1),
        Sqe::notify(p.ep, p.src.local(8192), 3).with_user_data(2),
    ];
    ok(&p.run(&sqes));
    let (payload, landed) = p.notification(BIG as usize);
    assert_eq!(payload, b"big");
    assert_eq!(landed, data);
    let stats = p.initiator.stats();
    assert_eq!(stats.notify_flushes, 1, "{stats:?}");
    assert_eq!(stats.weak_fences, 0, "{stats:?}");
}

/// A driver without SWAP: a SWAP fails with `Unsupported` and reaches no
/// driver; the atomics it has run.
#[test]
fn an_atomic_the_driver_lacks_is_unsupported() {
    let no_swap = Loopback::new().with_capabilities(|mut caps| {
        caps.atomic_ops = AtomicOps::ALL.without(AtomicOp::SWAP);
        caps
    });
    let mut p = Pair::new(no_swap, 1, 256);
    p.window.store_u64(0, 5);
    let sqes = [
        Sqe::atomic_swap(p.ep, p.src.local(0), p.remote(0), 9).with_user_data(1),
        Sqe::atomic_fadd(p.ep, p.src.local(8), p.remote(0), 1).with_user_data(2),
        Sqe::atomic_cswap(p.ep, p.src.local(16), p.remote(0), 6, 10).with_user_data(3),
    ];
    let cqes = p.run(&sqes);
    assert_eq!(cqes[0].res, Status::Unsupported.as_raw());
    ok(&cqes[1..]);
    assert_eq!(p.src.load_u64(8), 5, "FADD's old value");
    assert_eq!(p.src.load_u64(16), 6, "CSWAP's old value");
    assert_eq!(p.window.load_u64(0), 10, "the SWAP did nothing");
    let kinds: Vec<_> = p.handle.log().iter().map(|x| x.kind).collect();
    assert_eq!(
        kinds,
        [
            ringfence::OpKind::Atomic(AtomicOp::FADD),
            ringfence::OpKind::Atomic(AtomicOp::CSWAP)
        ]
    );
}

/// On a driver whose largest message is 64 bytes, a NOTIFY of 65 is
/// refused at submission with `InvalidLength` (it was checked against the
/// engine's limit alone and handed to the driver).
#[test]
fn a_notify_longer_than_the_driver_takes_is_refused() {
    let small = Loopback::new().with_capabilities(|mut caps| {
        caps.max_len = 64;
        caps
    });
    let mut p = Pair::new(small, 1, 4096);
    let sqes = [
        Sqe::notify(p.ep, p.src.local(0), 64).with_user_data(1),
        Sqe::notify(p.ep, p.src.local(0), 65).with_user_data(2),
    ];
    let cqes = p.run(&sqes);
    ok(&cqes[..1]);
    assert_eq!(cqes[1].res, Status::InvalidLength.as_raw());
    assert_eq!(p.handle.log().len(), 1, "the long one reached no driver");
}

/// A target whose notification buffers hold 256 bytes: the connection
/// learns it (`Driver::peer_limits`), and a NOTIFY of 257 is refused at
/// submission with `InvalidLength`, not sent to fail at the target with
/// `Truncated`.
#[test]
fn a_notify_longer_than_the_peer_takes_is_refused_at_submission() {
    let mut p = Pair::new(Loopback::new(), 1, 256);
    let sqes = [
        Sqe::notify(p.ep, p.src.local(0), 256).with_user_data(1),
        Sqe::notify(p.ep, p.src.local(0), 257).with_user_data(2),
    ];
    let cqes = p.run(&sqes);
    ok(&cqes[..1]);
    assert_eq!(
        cqes[1].res,
        Status::InvalidLength.as_raw(),
        "{}",
        ringfence_ring::strerror(cqes[1].res)
    );
    assert_eq!(p.handle.log().len(), 1, "the long one reached no driver");
    assert_eq!(p.notification(0).0.len(), 256);
}

/// An endpoint over a host driver ("lb-a", CPU atomics, every op) and a
/// NIC-like one ("lb-b", NIC atomics, no SWAP): every ATOMIC goes to lb-b,
/// the atomic lane group; a SWAP, which only lb-a could run, fails with
/// `Unsupported` instead of mixing CPU and NIC atomics on one word.
#[test]
fn a_mixed_endpoint_never_mixes_atomic_domains() {
    let (a, a_handle) = FaultInjector::new(Loopback::new().named("lb-a"));
    let (b, b_handle) =
        FaultInjector::new(Loopback::new().named("lb-b").with_capabilities(|mut caps| {
            caps.atomic_ops = AtomicOps::ALL.without(AtomicOp::SWAP);
            caps.atomic_domain = AtomicDomain::Nic;
            caps
        }));
    let initiator = Worker::builder()
        .driver(a)
        .driver(b)
        .ignore_env()
        .build()
        .unwrap();
    let LoopbackTarget {
        worker: _target,
        window,
        ep,
        rkey,
    } = LoopbackTarget::connect_mixed(&initiator, &[("lb-a", 2), ("lb-b", 2)], 4096);
    let src = initiator.alloc_registered(4096).unwrap();
    let mut qp = initiator.create_queue().unwrap();
    let remote = RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window.addr(),
    };
    let e = ep.as_raw();
    let sqes = [
        Sqe::atomic_add(e, remote, 3).with_user_data(1),
        Sqe::atomic_fadd(e, src.local(0), remote, 4).with_user_data(2),
        Sqe::atomic_swap(e, src.local(8), remote, 100).with_user_data(3),
    ];
    let mut cqes = run_sqes(&initiator, &mut qp, &sqes, 3);
    cqes.sort_by_key(|c| c.user_data);
    ok(&cqes[..2]);
    assert_eq!(cqes[2].res, Status::Unsupported.as_raw());
    assert_eq!(window.load_u64(0), 7);
    assert_eq!(src.load_u64(0), 3, "FADD's old value");
    assert!(a_handle.log().is_empty(), "no atomic on the host driver");
    assert_eq!(b_handle.log().len(), 2);
}
