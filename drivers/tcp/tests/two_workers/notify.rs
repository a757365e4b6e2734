//! Notifications: after the data before them, split over many receive
//! buffers, behind a PUT on their lane without a flush, and refused at
//! submission when longer than the target takes.

use crate::{pair, pattern, run, run_with};
use ringfence::{Cqe, EndpointState, Worker};
use ringfence_ring::{RemoteBuf, Sqe};
use ringfence_tcp::Tcp;
use std::time::{Duration, Instant};

#[test]
fn notifications_arrive_after_the_data_before_them() {
    let p = pair(1 << 20, 4);
    let src = p.initiator.alloc_registered(1 << 20).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let mut tq = p.target.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let remote = RemoteBuf {
        rkey: p.rkey.as_raw(),
        addr: p.window.addr(),
    };
    for round in 0..20u64 {
        let data = pattern(1 << 20, round);
        src.write(0, &data);
        src.store_u64(0, round);
        let mut notify = Sqe::notify(ep, src.local(0), 8).with_user_data(2);
        notify.operand = round;
        // A large PUT (a bandwidth lane), then the notification (lane 0).
        let sqes = [
            Sqe::put(ep, src.local(0), remote, 1 << 20).with_user_data(1),
            notify,
        ];
        let mut initiated = 0;
        let mut pushed = false;
        let deadline = Instant::now() + Duration::from_secs(30);
        let cqe = loop {
            if !pushed {
                qp.push_batch(&sqes).unwrap();
                qp.submit();
                pushed = true;
            }
            p.initiator.progress();
            p.target.progress();
            let mut batch = [Cqe::default(); 8];
            initiated += qp.reap(&mut batch).unwrap();
            if let Some(c) = tq.pop().unwrap() {
                break c;
            }
            assert!(Instant::now() < deadline, "no notification");
        };
        // When the notification is seen, the data before it is there.
        assert_eq!(cqe.user_data, round);
        let mut got = vec![0u8; 1 << 20];
        p.window.read(0, &mut got);
        assert!(got[8..] == data[8..], "round {round}");
        drop(tq.notification(&cqe).unwrap());
        while initiated < 2 {
            p.initiator.progress();
            p.target.progress();
            let mut batch = [Cqe::default(); 8];
            initiated += qp.reap(&mut batch).unwrap();
            assert!(Instant::now() < deadline);
        }
    }
}

/// NOTIFYs of the largest length (64 KiB) to a target whose receive
/// buffers are 4 KiB: each payload arrives in at least 16 pieces, is put
/// together on the target, and reaches the application intact, round
/// after round (each round's bytes differ).
#[test]
fn a_notification_split_over_many_receive_buffers_arrives_intact() {
    const LEN: usize = 64 << 10;
    let build = |recv: u32| {
        Worker::builder()
            .driver(
                Tcp::builder()
                    .ignore_env()
                    .recv_buffers(64, recv)
                    .build()
                    .unwrap(),
            )
            .notify_buffers(2, LEN as u32)
            .ignore_env()
            .build()
            .unwrap()
    };
    let target = build(4096);
    let initiator = build(64 << 10);
    let ep = initiator.connect(target.address()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while initiator.endpoint_state(ep).unwrap() == EndpointState::Connecting {
        initiator.progress();
        target.progress();
        assert!(Instant::now() < deadline, "connect hung");
        std::thread::yield_now();
    }
    let src = initiator.alloc_registered(LEN).unwrap();
    let mut qp = initiator.create_queue().unwrap();
    let mut tq = target.create_queue().unwrap();
    for round in 0..20u64 {
        let data = pattern(LEN, round);
        src.write(0, &data);
        let mut notify = Sqe::notify(ep.as_raw(), src.local(0), LEN as u32).with_user_data(round);
        notify.operand = round;
        qp.push_batch(&[notify]).unwrap();
        qp.submit();
        let (mut sent, mut got) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(30);
        while sent.is_none() || got.is_none() {
            initiator.progress();
            target.progress();
            if let Some(c) = qp.pop().unwrap() {
                sent = Some(c);
            }
            if got.is_none()
                && let Some(c) = tq.pop().unwrap()
            {
                got = Some(c);
            }
            assert!(Instant::now() < deadline, "round {round} hung");
            std::thread::yield_now();
        }
        let (sent, got) = (sent.unwrap(), got.unwrap());
        assert!(sent.res >= 0, "round {round}: {sent:?}");
        assert_eq!(got.user_data, round, "the tag");
        let payload = tq.notification(&got).unwrap();
        assert_eq!(payload.len(), LEN);
        assert!(*payload == data[..], "round {round}: the payload differs");
    }
}

/// An 8-byte PUT and then a NOTIFY, both on lane 0: the tcp stream
/// delivers the NOTIFY after the PUT (`notify_ordered`), so the boundary
/// is a weak fence, no flush (docs/fence.md R8), and the data is there when
/// the notification is seen.
#[test]
fn a_notification_behind_a_put_on_its_lane_needs_no_flush() {
    let p = pair(4096, 4);
    let src = p.initiator.alloc_registered(4096).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let mut tq = p.target.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let remote = RemoteBuf {
        rkey: p.rkey.as_raw(),
        addr: p.window.addr(),
    };
    for round in 1..=10u64 {
        src.store_u64(0, round);
        let sqes = [
            Sqe::put(ep, src.local(0), remote, 8).with_user_data(1),
            Sqe::notify(ep, src.local(0), 8).with_user_data(2),
        ];
        let cqes = run(&p.initiator, &p.target, &mut qp, &sqes, 2);
        assert!(cqes.iter().all(|c| c.res >= 0), "{cqes:?}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let cqe = loop {
            p.target.progress();
            if let Some(c) = tq.pop().unwrap() {
                break c;
            }
            assert!(Instant::now() < deadline, "no notification");
            std::thread::yield_now();
        };
        assert_eq!(p.window.load_u64(0), round, "the PUT landed first");
        let payload = tq.notification(&cqe).unwrap();
        assert_eq!(*payload, round.to_le_bytes());
    }
    let stats = p.initiator.stats();
    assert_eq!(stats.notify_flushes, 0, "{stats:?}");
    assert_eq!(stats.weak_fences, 10, "{stats:?}");
}

/// The target's notification buffers hold 256 bytes and its HELLO_ACK
/// says so: a NOTIFY of 257 bytes fails with `InvalidLength` at
/// submission, with only the initiator progressing (it is never sent to
/// be refused by the target); one of 256 is delivered.
#[test]
fn a_notification_longer_than_the_target_takes_fails_at_submission() {
    let p = pair(4096, 1);
    let src = p.initiator.alloc_registered(4096).unwrap();
    let mut qp = p.initiator.create_queue().unwrap();
    let ep = p.ep.as_raw();
    let deadline = Instant::now() + Duration::from_secs(30);
    let cqes = run_with(
        &mut qp,
        &[Sqe::notify(ep, src.local(0), 257)],
        1,
        deadline,
        || {
            p.initiator.progress();
        },
    );
    assert_eq!(
        cqes[0].res,
        ringfence::Status::InvalidLength.as_raw(),
        "{}",
        ringfence_ring::strerror(cqes[0].res)
    );
    let cqes = run(
        &p.initiator,
        &p.target,
        &mut qp,
        &[Sqe::notify(ep, src.local(0), 256)],
        1,
    );
    assert!(cqes[0].res >= 0, "{cqes:?}");
}
