//! Registration by kind: drivers that decline memory, keep it for local
//! use, do not reach a peer's kind or find its part unreachable; key
//! parts that carry the memory's kind and device; routing on a mixed
//! endpoint by what each driver holds; unpacks that fail without leaving
//! parts behind; and the slow first phase that runs without the engine
//! lock.

use ringfence::{
    EndpointId, Error, Loopback, MemKind, MemKinds, QueuePair, Registered, RegisteredBuf, RkeyId,
    Unpacked, Worker,
};
use ringfence_ring::{Cqe, RemoteBuf, Sqe, Status};
use ringfence_testkit::{SimDriver, SimEvent, SimHandle, run_sqes as run};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// PUTs from this size prefer the endpoint's last lane group.
const BIG: u32 = 1024;
const BOTH: MemKinds = MemKinds::HOST.union(MemKinds::CUDA);

/// An initiator with drivers `a` and `b` (both simulated over loopback),
/// a target with plain loopback drivers of the same names, and a mixed
/// endpoint with two lanes on each. `b` stands in for a device driver: it
/// registers both host and device memory, and `edit` shapes it further
/// (declines, local use only, kinds it reaches).
struct Rig {
    target: Worker,
    initiator: Worker,
    a: SimHandle,
    b: SimHandle,
    ep: EndpointId,
    qp: QueuePair,
    src: RegisteredBuf,
}

fn rig(
    edit: impl FnOnce(SimDriver<Loopback>) -> SimDriver<Loopback>,
    target_b: impl FnOnce(SimDriver<Loopback>) -> SimDriver<Loopback>,
) -> Rig {
    let (a_driver, a) = SimDriver::named(Loopback::new(), "a");
    let (b_driver, b) = SimDriver::named(Loopback::new(), "b");
    let initiator = Worker::builder()
        .driver(a_driver)
        .driver(edit(b_driver.with_mem_kinds(BOTH)))
        .bw_threshold(BIG)
        .ignore_env()
        .build()
        .unwrap();
    let (tb, _) = SimDriver::named(Loopback::new(), "b");
    let target = Worker::builder()
        .driver(Loopback::new().named("a"))
        .driver(target_b(tb.with_mem_kinds(BOTH)))
        .ignore_env()
        .build()
        .unwrap();
    let ep = initiator
        .connect_lanes(target.address(), &[("a", 2), ("b", 2)])
        .unwrap();
    let src = initiator.alloc_registered(1 << 14).unwrap();
    let qp = initiator.create_queue().unwrap();
    Rig {
        target,
        initiator,
        a,
        b,
        ep,
        qp,
        src,
    }
}

impl Rig {
    /// One PUT of `len` bytes of `src` to the start of `rkey`'s region at
    /// `base`; its CQE.
    fn put(&mut self, rkey: RkeyId, base: u64, len: u32) -> Cqe {
        let sqe = Sqe::put(
            self.ep.as_raw(),
            self.src.local(0),
            RemoteBuf {
                rkey: rkey.as_raw(),
                addr: base,
            },
            len,
        );
        run(&self.initiator, &mut self.qp, &[sqe], 1)[0]
    }
}

fn executed(h: &SimHandle) -> u64 {
    h.stats().executed
}

fn unpacked(h: &SimHandle) -> Vec<(MemKind, Unpacked)> {
    h.events()
        .into_iter()
        .filter_map(|e| match e {
            SimEvent::Unpacked(_, kind, answer) => Some((kind, answer)),
            _ => None,
        })
        .collect()
}

/// "Once CUDA registers host memory for host-device copies, large
/// host-to-host PUTs would go to CUDA": a driver that registers host memory
/// for local use only gives peers no part of it, so a large host-to-host
/// PUT (which prefers the endpoint's last group, `b`) takes `a`; a PUT into
/// the peer's device memory, which only `b` registers, takes `b` from the
/// same host source (its local key).
#[test]
fn memory_kept_for_local_use_is_not_packed_and_routes_elsewhere() {
    // Declared before the rig, so that it outlives both workers.
    let mut device = vec![0u8; 4096];
    let mut r = rig(
        |b| b.local_only(MemKinds::HOST),
        |b| b.local_only(MemKinds::HOST),
    );
    let window = r.target.alloc_registered(1 << 14).unwrap();
    let key = r.target.pack_rkey(window.handle()).unwrap();
    let rkey = r.initiator.unpack_rkey(r.ep, &key).unwrap();
    assert!(
        unpacked(&r.b).is_empty(),
        "the peer's b kept its host memory local: no part for b"
    );
    assert!(
        r.b.events()
            .iter()
            .any(|e| matches!(e, SimEvent::Registered(MemKind::Host, Registered::Local(_))))
    );
    r.src.write(0, &[0x3c; 2048]);
    assert_eq!(r.put(rkey, window.addr(), 2048).res, 2048);
    assert_eq!((executed(&r.a), executed(&r.b)), (1, 0), "host to host: a");
    let mut landed = vec![0; 2048];
    window.read(0, &mut landed);
    assert!(landed.iter().all(|&b| b == 0x3c));

    // The peer's "device" memory (host memory the target's b is told is
    // device memory; its a does not register device memory at all).
    // SAFETY: `device` outlives every access: the rig, declared after it,
    // is dropped first.
    let dev = unsafe {
        r.target
            .register(device.as_mut_ptr(), device.len(), MemKind::Cuda(0))
            .unwrap()
    };
    let key = r.target.pack_rkey(dev).unwrap();
    let dev_rkey = r.initiator.unpack_rkey(r.ep, &key).unwrap();
    assert_eq!(
        r.initiator.rkey_kind(r.ep, dev_rkey).unwrap(),
        MemKind::Cuda(0)
    );
    assert_eq!(r.put(dev_rkey, device.as_ptr() as u64, 64).res, 64);
    assert_eq!(
        (executed(&r.a), executed(&r.b)),
        (1, 1),
        "host to device: b"
    );
    drop(r);
    assert!(device[..64].iter().all(|&b| b == 0x3c));
}

/// A driver that registers host memory but reaches only a peer's device
/// memory never sees the peer's host part: the part is skipped before any
/// driver call, operations take `a`, and an endpoint with lanes on `b`
/// alone cannot use the key at all (a clear `Unsupported`).
#[test]
fn a_part_of_a_kind_the_driver_does_not_reach_is_skipped() {
    let mut r = rig(|b| b.with_remote_kinds(MemKinds::CUDA), |b| b);
    let window = r.target.alloc_registered(4096).unwrap();
    let key = r.target.pack_rkey(window.handle()).unwrap();
    let rkey = r.initiator.unpack_rkey(r.ep, &key).unwrap();
    assert!(unpacked(&r.b).is_empty(), "b does not reach host memory");
    assert_eq!(r.put(rkey, window.addr(), 2048).res, 2048);
    assert_eq!((executed(&r.a), executed(&r.b)), (1, 0));

    let only_b = r
        .initiator
        .connect_lanes(r.target.address(), &[("b", 1)])
        .unwrap();
    let err = r.initiator.unpack_rkey(only_b, &key).unwrap_err();
    assert_eq!(err.status(), Status::Unsupported, "{err}");
    assert!(err.to_string().contains("Host"), "{err}");
    assert!(r.b.violations().is_empty(), "{:?}", r.b.violations());
}

/// A part the driver finds unreachable (device memory of another host) is
/// skipped and not released later; the key works through the other
/// driver, and a key with no usable part is refused with `Unsupported`,
/// leaving nothing unpacked.
#[test]
fn an_unreachable_part_is_skipped() {
    let mut r = rig(|b| b.unreachable(MemKinds::HOST), |b| b);
    let window = r.target.alloc_registered(4096).unwrap();
    let key = r.target.pack_rkey(window.handle()).unwrap();
    let rkey = r.initiator.unpack_rkey(r.ep, &key).unwrap();
    assert_eq!(
        unpacked(&r.b),
        [(MemKind::Host, Unpacked::Unreachable)],
        "b was asked, and said unreachable"
    );
    assert_eq!(r.put(rkey, window.addr(), 2048).res, 2048);
    assert_eq!((executed(&r.a), executed(&r.b)), (1, 0));
    r.initiator.release_rkey(rkey).unwrap();
    let released = |h: &SimHandle| {
        h.events()
            .iter()
            .filter(|e| matches!(e, SimEvent::ReleaseRkey(..)))
            .count()
    };
    assert_eq!((released(&r.a), released(&r.b)), (1, 0));

    let only_b = r
        .initiator
        .connect_lanes(r.target.address(), &[("b", 1)])
        .unwrap();
    let err = r.initiator.unpack_rkey(only_b, &key).unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
    assert_eq!(r.initiator.unpacked_rkeys(), 0);
}

/// "One driver's error aborts unpack for every driver" — and, before, left
/// the parts the earlier drivers had unpacked behind for ever. A refusal
/// from `b` after `a` unpacked its part fails the whole unpack with `b`'s
/// status and releases `a`'s part.
#[test]
fn a_failed_unpack_releases_the_parts_already_unpacked() {
    let r = rig(|b| b, |b| b);
    let window = r.target.alloc_registered(4096).unwrap();
    let key = r.target.pack_rkey(window.handle()).unwrap();
    r.b.refuse_unpack(Status::InvalidRkey);
    let err = r.initiator.unpack_rkey(r.ep, &key).unwrap_err();
    assert_eq!(err.status(), Status::InvalidRkey, "{err}");
    let a_events = r.a.events();
    let a_key = a_events
        .iter()
        .find_map(|e| match e {
            SimEvent::Unpacked(ep, _, Unpacked::Key(k)) => Some((*ep, *k)),
            _ => None,
        })
        .expect("a unpacked its part first");
    assert!(
        a_events.contains(&SimEvent::ReleaseRkey(a_key.0, a_key.1)),
        "a's part was released: {a_events:?}"
    );
    assert_eq!(r.initiator.unpacked_rkeys(), 0);
    // The same key unpacks once nothing refuses.
    r.initiator.unpack_rkey(r.ep, &key).unwrap();
}

/// A declined registration is never named to that driver again (no
/// deregister, no quiesce), operations on an endpoint of that driver alone
/// fail with `Unsupported`, and memory every driver declines fails to
/// register with `Unsupported`.
#[test]
fn declined_memory_is_never_named_to_the_driver() {
    let mut r = rig(|b| b.declining(MemKinds::HOST), |b| b);
    assert!(
        r.b.events()
            .iter()
            .all(|e| !matches!(e, SimEvent::Register(_)))
    );
    assert!(
        r.b.events()
            .iter()
            .any(|e| matches!(e, SimEvent::Registered(MemKind::Host, Registered::Declined)))
    );
    let only_b = r
        .initiator
        .connect_lanes(r.target.address(), &[("b", 1)])
        .unwrap();
    let window = r.target.alloc_registered(4096).unwrap();
    let key = r.target.pack_rkey(window.handle()).unwrap();
    let rkey = r.initiator.unpack_rkey(only_b, &key).unwrap();
    let sqe = Sqe::put(
        only_b.as_raw(),
        r.src.local(0),
        RemoteBuf {
            rkey: rkey.as_raw(),
            addr: window.addr(),
        },
        64,
    );
    let cqe = run(&r.initiator, &mut r.qp, &[sqe], 1)[0];
    assert_eq!(cqe.result(), Err(Ok(Status::Unsupported)));
    let mut mem = vec![0u8; 64];
    // SAFETY: deregistered below, before `mem` goes.
    let h = unsafe {
        r.initiator
            .register(mem.as_mut_ptr(), mem.len(), MemKind::Host)
            .unwrap()
    };
    r.initiator.deregister(h).unwrap();
    let named_again = r.b.events().into_iter().any(|e| {
        matches!(
            e,
            SimEvent::Deregister(_) | SimEvent::QuiesceCalled(ringfence::Quiesce::Memory(_))
        )
    });
    assert!(!named_again, "{:?}", r.b.events());

    let (only, _) = SimDriver::new(Loopback::new());
    let w = Worker::builder()
        .driver(only.declining(MemKinds::HOST))
        .ignore_env()
        .build()
        .unwrap();
    match w.alloc_registered(64) {
        Err(Error::Unsupported(why)) => assert!(why.contains("declined"), "{why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

/// Memory every driver keeps for local use has no key to give a peer.
#[test]
fn packing_memory_no_driver_shares_is_unsupported() {
    let (only, _) = SimDriver::new(Loopback::new());
    let w = Worker::builder()
        .driver(only.local_only(MemKinds::HOST))
        .ignore_env()
        .build()
        .unwrap();
    let buf = w.alloc_registered(64).unwrap();
    match w.pack_rkey(buf.handle()) {
        Err(Error::Unsupported(why)) => assert!(why.contains("remote access"), "{why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

/// The kind and device ordinal travel in the key: the initiator's driver
/// is handed the peer's `Cuda(3)`, and `rkey_kind` reports it.
#[test]
fn the_device_ordinal_travels_in_the_key() {
    let mut device = vec![0u8; 256];
    let r = rig(|b| b, |b| b);
    // SAFETY: `device` outlives the target worker's use of it (the rig,
    // declared after it, is dropped first).
    let dev = unsafe {
        r.target
            .register(device.as_mut_ptr(), device.len(), MemKind::Cuda(3))
            .unwrap()
    };
    let rkey = r
        .initiator
        .unpack_rkey(r.ep, &r.target.pack_rkey(dev).unwrap())
        .unwrap();
    assert_eq!(r.initiator.rkey_kind(r.ep, rkey).unwrap(), MemKind::Cuda(3));
    assert!(matches!(
        unpacked(&r.b)[..],
        [(MemKind::Cuda(3), Unpacked::Key(_))]
    ));
    assert_eq!(MemKind::Cuda(3).device(), Some(3));
    assert_eq!(MemKind::Host.device(), None);
}

/// "`ibv_reg_mr` of a large region and `cuIpcOpenMemHandle` run under the
/// engine lock and stall every endpoint": with a register and an unpack
/// whose first phase lasts until the engine has polled the driver 100
/// times, another thread keeps completing PUTs on an endpoint meanwhile.
/// Under the lock, no poll could run and the first phase would give up
/// (`Timeout`) after a minute.
#[test]
fn a_slow_registration_runs_without_the_engine_lock() {
    let (sim, handle) = SimDriver::new(Loopback::new());
    let w = Worker::builder().driver(sim).ignore_env().build().unwrap();
    let target = ringfence_testkit::LoopbackTarget::connect(&w, 4096);
    let src = w.alloc_registered(64).unwrap();
    let key = target.worker.pack_rkey(target.window.handle()).unwrap();
    let mut qp = w.create_queue().unwrap();
    handle.slow_registration(100);
    let done = AtomicBool::new(false);
    let (registered, unpacked, puts) = std::thread::scope(|s| {
        let slow = s.spawn(|| {
            let registered = w.alloc_registered(1 << 20);
            let unpacked = w.unpack_rkey(target.ep, &key);
            done.store(true, Ordering::Release);
            (registered, unpacked)
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        let put = Sqe::put(
            target.ep.as_raw(),
            src.local(0),
            RemoteBuf {
                rkey: target.rkey.as_raw(),
                addr: target.window.addr(),
            },
            8,
        );
        let mut puts = 0u64;
        while !done.load(Ordering::Acquire) {
            let cqe = run(&w, &mut qp, &[put], 1)[0];
            assert_eq!(cqe.res, 8);
            puts += 1;
            assert!(Instant::now() < deadline, "hung");
        }
        let (registered, unpacked) = slow.join().unwrap();
        (registered, unpacked, puts)
    });
    let registered = registered.expect("the slow registration finished");
    unpacked.expect("the slow unpack finished");
    let prepared: Vec<(bool, u64)> = handle
        .events()
        .into_iter()
        .filter_map(|e| match e {
            SimEvent::Prepared { register, polls } => Some((register, polls)),
            _ => None,
        })
        .collect();
    assert_eq!(prepared.len(), 2, "{prepared:?}");
    assert!(prepared[0].0 && !prepared[1].0, "{prepared:?}");
    assert!(
        prepared.iter().all(|&(_, polls)| polls >= 100),
        "{prepared:?}"
    );
    assert!(puts > 0, "PUTs completed while the first phases ran");
    assert!(handle.violations().is_empty(), "{:?}", handle.violations());
    drop(registered);
}
