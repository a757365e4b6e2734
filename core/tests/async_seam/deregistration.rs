//! Deregistration while the driver holds the memory: refused while in use,
//! quiesced before the memory goes, finished later, or leaked.

use crate::{HANG, freed, initiator, run, target};
use ringfence::{DriverMemKey, MemKind, Quiesce, Worker};
use ringfence_ring::{RemoteBuf, Sqe, Status};
use ringfence_testkit::{SimEvent, SimHandle, SimTiming};
use std::time::Instant;

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
