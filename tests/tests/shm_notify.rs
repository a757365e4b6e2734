//! Notifications between two real processes: each one carries the index of
//! a record the initiator PUT just before it, and the target checks, when
//! the notification arrives, that the record is already in its memory
//! (NOTIFY is ordered after every earlier operation of its endpoint), that
//! notifications arrive in order, and that every payload is intact.

use ringfence::Status;
use ringfence_ring::{RemoteBuf, Sqe};
use ringfence_tests::child::{self, ChildProcess};
use ringfence_tests::shm::{self, Link, checksum, pattern};
use ringfence_tests::{Backoff, Deadline};
use std::time::{Duration, Instant};

const COUNT: u64 = 10_000;
const RECORD: u64 = 64;

/// The payload of notification `i`: its index, the checksum of its record,
/// and filler of a length that varies with `i` (so the channel wraps at
/// many different offsets).
fn payload(i: u64) -> Vec<u8> {
    let record = pattern(RECORD as usize, i);
    let mut p = i.to_le_bytes().to_vec();
    p.extend_from_slice(&checksum(&record).to_le_bytes());
    p.extend(pattern((i * 37 % 300) as usize, !i));
    p
}

fn target() {
    let mut link = Link::new(child::parent_socket());
    let w = shm::worker(2);
    let window = w.alloc_registered((COUNT * RECORD) as usize).unwrap();
    let mut qp = w.create_queue().unwrap();
    link.send_offer(&w, &window);
    let deadline = Deadline::after(shm::HANG, "target");
    let mut backoff = Backoff::default();
    let mut next = 0u64;
    let mut record = vec![0u8; RECORD as usize];
    while next < COUNT {
        let mut work = w.progress();
        while let Some(cqe) = qp.pop().unwrap() {
            work += 1;
            let i = cqe.user_data;
            assert_eq!(i, next, "notifications out of order");
            let data = qp.notification(&cqe).expect("a notification CQE");
            assert!(*data == payload(i)[..], "payload {i} damaged");
            window.read((i * RECORD) as usize, &mut record);
            assert_eq!(
                checksum(&record),
                u64::from_le_bytes(data[8..16].try_into().unwrap()),
                "notification {i} arrived before its data"
            );
            next += 1;
        }
        if work > 0 {
            backoff.reset();
        } else {
            backoff.idle();
        }
        deadline.check(|| format!("{next} of {COUNT} notifications"));
    }
    link.send_u64s(&[next]);
    assert!(link.recv().is_empty());
}

#[test]
fn notifications_arrive_in_order_after_their_data() {
    if child::role().is_some() {
        return target();
    }
    let child = ChildProcess::spawn("notifications_arrive_in_order_after_their_data", "target");
    let mut link = Link::new(child.socket.try_clone().unwrap());
    let offer = link.recv_offer();
    let base = offer.base();
    let w = shm::worker(2);
    let (ep, rkey) = offer.connect(&w);
    let src = w.alloc_registered(64 * 1024).unwrap();
    let mut qp = w.create_queue().unwrap();
    let e = ep.as_raw();
    const PAIRS: u64 = 32;
    for start in (0..COUNT).step_by(PAIRS as usize) {
        let mut sqes = Vec::new();
        for (k, i) in (start..(start + PAIRS).min(COUNT)).enumerate() {
            let at = k as u64 * 1024;
            src.write(at as usize, &pattern(RECORD as usize, i));
            let p = payload(i);
            src.write(at as usize + 512, &p);
            let remote = RemoteBuf {
                rkey: rkey.as_raw(),
                addr: base + i * RECORD,
            };
            sqes.push(Sqe::put(e, src.local(at), remote, RECORD as u32).with_user_data(2 * i));
            let mut n =
                Sqe::notify(e, src.local(at + 512), p.len() as u32).with_user_data(2 * i + 1);
            n.operand = i;
            sqes.push(n);
        }
        for c in shm::complete(&w, &mut qp, &sqes, sqes.len()) {
            assert!(c.res >= 0, "{c:?}");
        }
    }
    assert_eq!(link.recv_u64s(), [COUNT]);

    // Larger than the target's buffers (4 KiB, learnt at connect):
    // refused at submission, before any driver sees it.
    let n = Sqe::notify(e, src.local(0), 5000).with_user_data(7);
    let c = shm::complete(&w, &mut qp, &[n], 1);
    assert_eq!(c[0].res, Status::InvalidLength.as_raw());
    link.send(&[]);
    child.join();
}

const WAKE_ROUNDS: u64 = 40;
/// How long the initiator leaves the target alone before each
/// notification, so that the target's core thread has gone to sleep (it
/// sleeps after about a thousand idle rounds). This is not synchronization:
/// the test passes the same if the target stayed awake.
const IDLE_GAP: Duration = Duration::from_millis(50);
/// Without the driver's wake path, every round would wait for the core
/// thread's one-second sleep backstop (40 s in all); with it, a round
/// waits at most a few control ticks (10 ms each) beyond the gap.
const WAKE_BOUND: Duration = Duration::from_secs(20);

/// Creates the condition under test (a target whose core thread sleeps);
/// nothing waits on this for an event, so it is not synchronization.
#[allow(clippy::disallowed_methods)]
fn let_the_target_go_idle() {
    std::thread::sleep(IDLE_GAP);
}

#[test]
fn a_sleeping_target_is_woken_by_each_notification() {
    if child::role().is_some() {
        let mut link = Link::new(child::parent_socket());
        let mut w = shm::worker(1);
        let mut qp = w.create_queue().unwrap();
        w.start_core_thread(None).unwrap();
        link.send(w.address());
        for round in 0..WAKE_ROUNDS {
            let cqe = loop {
                if let Some(c) = qp.pop().unwrap() {
                    break c;
                }
                // Sleeps until the core thread posts a CQE: the core thread
                // itself sleeps when idle, so only the driver's wake path
                // brings the notification in before its backstop.
                qp.wait_cqe(Some(shm::HANG)).unwrap();
            };
            assert_eq!(cqe.user_data, round);
            assert_eq!(&*qp.notification(&cqe).unwrap(), &round.to_le_bytes());
            link.send(b"ack");
        }
        return;
    }
    let child = ChildProcess::spawn("a_sleeping_target_is_woken_by_each_notification", "target");
    let mut link = Link::new(child.socket.try_clone().unwrap());
    let address = link.recv();
    let w = shm::worker(1);
    let ep = w.connect(&address).unwrap();
    let src = w.alloc_registered(64).unwrap();
    let mut qp = w.create_queue().unwrap();
    let start = Instant::now();
    for round in 0..WAKE_ROUNDS {
        let_the_target_go_idle();
        src.write(0, &round.to_le_bytes());
        let mut n = Sqe::notify(ep.as_raw(), src.local(0), 8).with_user_data(round);
        n.operand = round;
        assert_eq!(shm::complete(&w, &mut qp, &[n], 1)[0].res, 8);
        assert_eq!(link.recv(), b"ack");
        assert!(
            start.elapsed() < WAKE_BOUND,
            "round {round}: the target slept through notifications"
        );
    }
    eprintln!(
        "a notification to a sleeping target: {:?} per round trip",
        start.elapsed() / WAKE_ROUNDS as u32 - IDLE_GAP
    );
    child.join();
}
