//! Ordering and liveness: notifications arrive after the data before them,
//! a strong fence orders PUTs across lanes, and a FLUSH (even with nothing to
//! flush) fails once the peer is gone.

use crate::{ALL, HANG, Over, Pair, pattern, run};
use ringfence_ring::{FenceMode, Sqe, Status};
use std::time::Instant;

#[test]
fn notifications_arrive_after_earlier_data_with_their_payload() {
    for mode in ALL {
        let p = Pair::new(mode, 4, 1 << 16);
        let src = p.initiator.alloc_registered(1 << 16).unwrap();
        let mut qp = p.initiator.create_queue().unwrap();
        let mut target_qp = p.target.create_queue().unwrap();
        let ep = p.ep.as_raw();
        for round in 0..20u64 {
            let data = pattern(8192, round as u8);
            src.write(0, &data);
            src.write(10_000, format!("round {round}").as_bytes());
            let sqes = [
                // Large: a bandwidth lane; the notify goes on lane 0.
                Sqe::put(ep, src.local(0), p.remote(0), 8192).with_user_data(1),
                Sqe::notify(ep, src.local(10_000), format!("round {round}").len() as u32)
                    .with_user_data(2),
            ];
            let mut sqes = sqes;
            sqes[1].operand = 0xabc0 + round;
            let cqes = run(&p.initiator, &mut qp, &sqes, 2);
            assert!(cqes.iter().all(|c| c.res >= 0), "{cqes:?}");
            // The target sees the notification, and by then the data.
            let deadline = Instant::now() + HANG;
            let note = loop {
                p.target.progress();
                if let Some(c) = target_qp.pop().unwrap() {
                    break c;
                }
                assert!(Instant::now() < deadline);
            };
            assert_eq!(note.user_data, 0xabc0 + round, "the tag");
            let payload = target_qp.notification(&note).expect("a notification CQE");
            assert_eq!(&*payload, format!("round {round}").as_bytes());
            drop(payload);
            assert!(target_qp.notification(&note).is_none(), "read once");
            let mut landed = vec![0u8; 8192];
            p.window.read(0, &mut landed);
            assert_eq!(landed, data, "data before notification");
        }
        assert_eq!(p.target.stats().notifications, 20);
    }
}

#[test]
fn a_strong_fence_orders_puts_across_lanes() {
    for over in [Over::NextPoll, Over::Sim] {
        // Four lanes, completion on poll with rotating lane order: without the
        // fence, the second PUT (another lane) could land first.
        let p = Pair::new(over, 4, 1 << 16);
        let src = p.initiator.alloc_registered(1 << 16).unwrap();
        let mut qp = p.initiator.create_queue().unwrap();
        let ep = p.ep.as_raw();
        for round in 0..50u64 {
            src.write(0, &vec![round as u8; 8192]);
            src.write(8192, &vec![round as u8 + 1; 8192]);
            let sqes = [
                Sqe::put(ep, src.local(0), p.remote(0), 8192).with_user_data(1),
                Sqe::fence(ep, FenceMode::COMPLETE).with_user_data(2),
                Sqe::put(ep, src.local(8192), p.remote(0), 8192).with_user_data(3),
            ];
            run(&p.initiator, &mut qp, &sqes, 3);
            let mut landed = vec![0u8; 8192];
            p.window.read(0, &mut landed);
            assert!(
                landed.iter().all(|&b| b == round as u8 + 1),
                "round {round}: the later PUT must win"
            );
        }
        let stats = p.initiator.endpoint_stats(p.ep).unwrap();
        assert!(stats.flushes >= 50 && stats.deferrals >= 50, "{stats:?}");
    }
}

/// A FLUSH succeeds only if the peer is alive when it completes, even
/// with nothing to flush (`Driver::check_alive`); so does a graceful
/// CLOSE, which closes the endpoint all the same; a FENCE on the failed
/// endpoint fails too. Over a peer that lives,
/// both succeed.
#[test]
fn a_flush_with_nothing_to_flush_fails_once_the_peer_is_gone() {
    for over in [Over::Immediate, Over::NextPoll, Over::Sim] {
        let p = Pair::new(over, 1, 64);
        let mut qp = p.initiator.create_queue().unwrap();
        let e = p.ep.as_raw();
        let flush = Sqe::flush(e).with_user_data(1);
        assert_eq!(
            run(&p.initiator, &mut qp, &[flush], 1)[0].res,
            0,
            "{over:?}"
        );
        let Pair {
            target,
            initiator,
            ep,
            ..
        } = p;
        drop(target);
        let c = run(&initiator, &mut qp, &[flush], 1);
        assert_eq!(c[0].res, Status::PeerUnreachable.as_raw(), "{over:?}");
        // The endpoint failed with it: a FENCE there fails the same way.
        let fence = Sqe::fence(e, ringfence_ring::FenceMode::ORDER).with_user_data(3);
        let c = run(&initiator, &mut qp, &[fence], 1);
        assert_eq!(c[0].res, Status::PeerUnreachable.as_raw(), "{over:?}");
        let close = Sqe::close(e, ringfence_ring::CloseMode::GRACEFUL).with_user_data(2);
        let c = run(&initiator, &mut qp, &[close], 1);
        assert_eq!(c[0].res, Status::PeerUnreachable.as_raw(), "{over:?}");
        assert!(
            matches!(
                initiator.endpoint_state(ep),
                Ok(ringfence::EndpointState::Closed)
            ),
            "{over:?}"
        );
    }
}
