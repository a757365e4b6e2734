//! A queue pair whose ring memory is found corrupt fails loudly, and alone:
//! the FAILED flags in both rings, `RingCorrupt` from its progress, waits,
//! `try_now`, `pop` and `push`, a count at the worker's level; its requests
//! in flight are finished and their slots freed without a CQE; dropping it
//! tears it down; a second queue pair on the same worker keeps completing
//! operations throughout.
//!
//! Operations are held in flight by a `FaultInjector` that releases them
//! after a number of polls; every loop is bounded by a count of calls, and
//! the only timeouts are generous limits that catch a hang.

#![allow(unsafe_code)] // writes garbage into the ring memory, on purpose

use ringfence::{CompletionMode, EndpointId, Loopback, QueuePair, RegisteredBuf, RkeyId, Worker};
use ringfence_ring::{ConsumerLine, Cqe, ProducerLine, RemoteBuf, RingError, Sqe, Status};
use ringfence_testkit::{FaultHandle, FaultInjector, LoopbackTarget, Timing};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Progress calls before a loop counts as hung.
const LIMIT: usize = 100_000;
/// Polls the injector holds each operation for: the operations are still
/// in flight while the ring is corrupted and the failure checked (a few
/// rounds), and finish in the bounded loops after.
const HOLD: u32 = 200;
/// A limit that only catches a hang.
const HANG: Duration = Duration::from_secs(60);
/// PUTs held in flight on the queue pair that fails.
const IN_FLIGHT: u64 = 4;

struct Rig {
    _target: Worker,
    initiator: Worker,
    fault: FaultHandle,
    window: RegisteredBuf,
    ep: EndpointId,
    rkey: RkeyId,
    src: RegisteredBuf,
    /// The queue pair that fails: an SQ of 8, a CQ of 4.
    victim: QueuePair,
    /// Another queue pair of the same worker.
    other: QueuePair,
}

fn rig() -> Rig {
    let (injector, fault) = FaultInjector::new(Loopback::with_mode(CompletionMode::Immediate));
    fault.set_timing(Timing::Delayed(HOLD));
    let initiator = Worker::builder()
        .ignore_env()
        .driver(injector)
        .build()
        .unwrap();
    let LoopbackTarget {
        worker: target,
        window,
        ep,
        rkey,
    } = LoopbackTarget::connect(&initiator, 4096);
    let src = initiator.alloc_registered(64).unwrap();
    src.write(0, &[0x5a; 64]);
    let victim = initiator.create_queue_with(8, 4).unwrap();
    let other = initiator.create_queue().unwrap();
    Rig {
        _target: target,
        initiator,
        fault,
        window,
        ep,
        rkey,
        src,
        victim,
        other,
    }
}

/// One 32-bit word of ring memory, as the other side sees it.
fn word(ptr: std::ptr::NonNull<u32>) -> &'static AtomicU32 {
    // SAFETY: the words of a queue pair's ring stay mapped while its worker
    // lives (the engine keeps the ring), which outlives every use in these
    // tests; they are aligned `AtomicU32`s and only accessed atomically.
    unsafe { AtomicU32::from_ptr(ptr.as_ptr()) }
}

impl Rig {
    fn put(&self, slot: u64, user_data: u64) -> Sqe {
        let remote = RemoteBuf {
            rkey: self.rkey.as_raw(),
            addr: self.window.addr() + slot * 8,
        };
        Sqe::put(self.ep.as_raw(), self.src.local(0), remote, 8).with_user_data(user_data)
    }

    /// `IN_FLIGHT` PUTs from the victim, taken by the engine and held at
    /// the driver.
    fn puts_in_flight(&mut self) {
        for i in 0..IN_FLIGHT {
            self.victim.push(self.put(i, 100 + i)).unwrap();
        }
        self.victim.submit();
        self.initiator.progress();
        assert_eq!(
            self.fault.held(),
            IN_FLIGHT as usize,
            "the PUTs are in flight"
        );
        assert_eq!(
            self.initiator.fence_state(self.ep).unwrap().in_flight,
            IN_FLIGHT as u32
        );
    }

    /// The victim's failure as every one of its calls reports it.
    fn assert_failed(&mut self) {
        let victim = &mut self.victim;
        assert!(victim.is_failed());
        assert_eq!(victim.check(), Err(Status::RingCorrupt));
        let (sq, cq) = (victim.as_raw_sq(), victim.as_raw_cq());
        assert_ne!(
            word(sq.consumer_flags).load(Ordering::Acquire) & ConsumerLine::FAILED,
            0,
            "the SQ's FAILED flag"
        );
        assert_ne!(
            word(cq.producer_flags).load(Ordering::Acquire) & ProducerLine::FAILED,
            0,
            "the CQ's FAILED flag"
        );
        assert_eq!(victim.progress(), Err(Status::RingCorrupt));
        assert_eq!(victim.wait_cqes(1, Some(HANG)), Err(Status::RingCorrupt));
        assert_eq!(
            victim.wait_cqes_published(1, Some(HANG)),
            Err(Status::RingCorrupt)
        );
        assert!(victim.wait_cqe(Some(HANG)).is_err());
        assert!(
            victim.arm_cq_doorbell().is_err(),
            "nothing will come: no sleep"
        );
        assert!(victim.pop().is_err());
        assert!(victim.reap(&mut [Cqe::default(); 4]).is_err());
        let put = self.put(9, 9);
        assert_eq!(self.victim.try_now(&put), Some(Err(Status::RingCorrupt)));
        assert_eq!(self.initiator.failed_queues(), 1);
        assert_eq!(self.initiator.progress_checked(), Err(Status::RingCorrupt));
    }

    /// A PUT and a flush on the other queue pair complete (the flush after
    /// the victim's PUTs too: they are on the same endpoint).
    fn other_works(&mut self, tag: u64) {
        let put = self.put(8, tag);
        self.other.push(put).unwrap();
        self.other
            .push(Sqe::flush(self.ep.as_raw()).with_user_data(tag + 1))
            .unwrap();
        self.other.submit();
        let mut got = Vec::new();
        for _ in 0..LIMIT {
            self.initiator.progress();
            while let Some(c) = self.other.pop().unwrap() {
                got.push(c);
            }
            if got.len() == 2 {
                break;
            }
        }
        assert_eq!(
            got,
            vec![Cqe::new(tag, 8, 0), Cqe::new(tag + 1, 0, 0)],
            "the other queue pair completes its PUT and flush"
        );
    }

    /// Lets the victim's PUTs finish; checks that they took effect, freed
    /// their requests and posted nothing into the victim's CQ.
    fn in_flight_are_reclaimed(&mut self) {
        let cq_tail = word(self.victim.as_raw_cq().tail).load(Ordering::Acquire);
        // A flush of their endpoint on another queue pair completes only
        // after the victim's PUTs, whose CQEs will never come.
        self.other_works(200);
        assert_eq!(self.fault.held(), 0);
        assert_eq!(
            self.initiator.fence_state(self.ep).unwrap().in_flight,
            0,
            "every request of the failed queue pair finished"
        );
        assert_eq!(
            word(self.victim.as_raw_cq().tail).load(Ordering::Acquire),
            cq_tail,
            "no CQE was posted to the failed CQ"
        );
        let mut landed = [0u8; 8];
        self.window.read(0, &mut landed);
        assert_eq!(landed, [0x5a; 8], "the PUTs the engine had taken ran");
        self.assert_failed();
    }

    /// Drops the victim: the worker stops reporting it, and keeps working.
    fn tear_down(mut self) {
        let fresh = self.initiator.create_queue().unwrap();
        drop(std::mem::replace(&mut self.victim, fresh));
        // The replacement is a new, healthy queue pair.
        assert!(!self.victim.is_failed());
        assert_eq!(self.initiator.failed_queues(), 0);
        assert!(self.initiator.progress_checked().is_ok());
        self.other_works(300);
        self.victim.push(Sqe::nop().with_user_data(7)).unwrap();
        self.victim.submit();
        assert_eq!(self.victim.wait_cqes(1, Some(HANG)), Ok(1));
        assert_eq!(self.victim.pop().unwrap(), Some(Cqe::new(7, 0, 0)));
    }
}

#[test]
fn a_corrupt_sq_tail_fails_only_its_queue_pair() {
    let mut rig = rig();
    rig.other_works(10);
    rig.puts_in_flight();
    let sq = rig.victim.as_raw_sq();
    // A tail far more than the SQ holds ahead of what the engine took.
    word(sq.tail).store(sq.index.wrapping_add(1000), Ordering::Release);
    rig.initiator.progress();
    rig.assert_failed();
    // Restoring the tail does not revive it.
    word(sq.tail).store(sq.index, Ordering::Release);
    rig.initiator.progress();
    rig.assert_failed();
    rig.in_flight_are_reclaimed();
    rig.tear_down();
}

#[test]
fn a_corrupt_sq_head_fails_its_queue_pair() {
    let mut rig = rig();
    rig.puts_in_flight();
    let sq = rig.victim.as_raw_sq();
    // The engine took everything: the head must be the tail. Garbage there
    // would read as free space to the application.
    word(sq.head).store(sq.index.wrapping_add(3), Ordering::Release);
    rig.initiator.progress();
    rig.assert_failed();
    // The SQ still has room by the victim's cached head; once that says
    // full, the push reports the ring corrupt instead of full.
    let mut pushed = 0;
    let err = loop {
        match rig.victim.push(Sqe::nop()) {
            Ok(()) => pushed += 1,
            Err(e) => break e,
        }
        assert!(pushed <= 8, "the SQ holds 8");
    };
    assert!(matches!(err, RingError::Corrupt(_)), "{err:?}");
    assert_eq!(err.status(), Status::RingCorrupt);
    rig.in_flight_are_reclaimed();
    rig.tear_down();
}

#[test]
fn a_corrupt_cq_head_fails_its_queue_pair_when_the_engine_posts() {
    let mut rig = rig();
    // Fill the 4-entry CQ once and reap it: the engine's cached head is
    // now a whole CQ behind, so its next post reloads the head.
    for i in 0..4 {
        rig.victim.push(Sqe::nop().with_user_data(i)).unwrap();
    }
    rig.victim.submit();
    assert_eq!(rig.victim.wait_cqes(4, Some(HANG)), Ok(4));
    for i in 0..4 {
        assert_eq!(rig.victim.pop().unwrap(), Some(Cqe::new(i, 0, 0)));
    }
    rig.puts_in_flight();
    let cq = rig.victim.as_raw_cq();
    word(cq.head).store(cq.index.wrapping_add(0x1000), Ordering::Release);
    assert!(!rig.victim.is_failed(), "nothing is posted yet");
    // The PUTs finish; posting the first CQE finds the head corrupt.
    for _ in 0..LIMIT {
        if rig.victim.is_failed() {
            break;
        }
        rig.initiator.progress();
    }
    rig.assert_failed();
    rig.in_flight_are_reclaimed();
    rig.tear_down();
}

#[test]
fn garbage_over_the_whole_sq_fails_its_queue_pair() {
    let mut rig = rig();
    rig.puts_in_flight();
    let sq = rig.victim.as_raw_sq();
    // The region header (128 bytes) and the four index lines (128 bytes
    // each) around the SQ tail, which is the first word of the first line.
    let base = sq.tail.as_ptr().wrapping_byte_sub(128);
    for i in 0..(128 + 4 * 128) / 4 {
        let at = std::ptr::NonNull::new(base.wrapping_add(i)).unwrap();
        word(at).store(0xa5a5_a5a5, Ordering::Release);
    }
    // And every SQ slot.
    let slots = sq.entries.as_ptr().cast::<u32>();
    for i in 0..sq.capacity as usize * std::mem::size_of::<Sqe>() / 4 {
        let at = std::ptr::NonNull::new(slots.wrapping_add(i)).unwrap();
        word(at).store(0xa5a5_a5a5, Ordering::Release);
    }
    rig.initiator.progress();
    rig.assert_failed();
    rig.in_flight_are_reclaimed();
    rig.tear_down();
}

#[test]
fn a_sleeping_waiter_wakes_when_its_queue_pair_fails() {
    let mut rig = rig();
    rig.fault.set_timing(Timing::NextPoll);
    rig.initiator.start_core_thread(None).unwrap();
    let sq = rig.victim.as_raw_sq();
    let mut victim = std::mem::replace(&mut rig.victim, rig.initiator.create_queue().unwrap());
    let waiter = std::thread::spawn(move || {
        let result = victim.wait_cqes(1, Some(HANG));
        (result, victim)
    });
    // Whether the waiter sleeps already or not, the failure ends its wait:
    // the engine rings its CQ doorbell as it fails the queue pair.
    word(sq.tail).store(sq.index.wrapping_add(1000), Ordering::Release);
    // The core thread sleeps on an idle worker; a submit on the other
    // queue pair wakes it, and its round finds the corrupt tail.
    rig.other_works(20);
    let (result, victim) = waiter.join().unwrap();
    assert_eq!(result, Err(Status::RingCorrupt));
    assert!(victim.is_failed());
    assert_eq!(rig.initiator.failed_queues(), 1);
    drop(victim);
    assert_eq!(rig.initiator.failed_queues(), 0);
    rig.other_works(30);
}
