//! Dropping the worker while the driver holds operations or memory:
//! quiesce before free, and a teardown whose quiesce finishes late or
//! never.

use crate::{BIG, HANG, SLOT, freed, initiator, is_fence, target};
use ringfence::{Loopback, Quiesce, Worker};
use ringfence_ring::{FenceMode, RemoteBuf, Sqe, Status};
use ringfence_testkit::{SimDriver, SimEvent, SimHandle, SimTiming};
use std::time::{Duration, Instant};

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
