//! What the engine refuses: every invalid SQE with its own status, forged
//! and foreign keys, and deregistration while the memory is in use.

use crate::{Over, Pair, run, worker};
use ringfence_ring::{FenceMode, LocalBuf, Opcode, RemoteBuf, Sqe, Status};

#[test]
fn every_invalid_sqe_gets_its_own_status_and_writes_nothing() {
    for over in [Over::Immediate, Over::Sim] {
        let p = Pair::new(over, 1, 64);
        let src = p.initiator.alloc_registered(64).unwrap();
        src.write(0, &[0xee; 64]);
        let mut qp = p.initiator.create_queue().unwrap();
        let ep = p.ep.as_raw();
        let put = Sqe::put(ep, src.local(0), p.remote(0), 8);
        let mut bad_opcode = put;
        bad_opcode.opcode = 42;
        let mut bad_flags = put;
        bad_flags.flags = 0x80;
        let mut reserved = put;
        reserved.reserved1 = 1;
        let mut bad_subop = Sqe::fence(ep, FenceMode::COMPLETE);
        bad_subop.subop = 7;
        let mut put_subop = put;
        put_subop.subop = 1;
        let cases: Vec<(Sqe, Status)> = vec![
            (bad_opcode, Status::InvalidOpcode),
            (bad_flags, Status::InvalidFlags),
            (reserved, Status::InvalidArgument),
            (bad_subop, Status::InvalidSubop),
            (put_subop, Status::InvalidSubop),
            (
                Sqe {
                    endpoint: 999,
                    ..put
                },
                Status::InvalidEndpoint,
            ),
            (
                Sqe {
                    local_mem: 0,
                    ..put
                },
                Status::InvalidMemHandle,
            ),
            (
                Sqe {
                    local_mem: src.handle().as_raw() ^ 0x1_0000,
                    ..put
                },
                Status::InvalidMemHandle,
            ),
            (Sqe { rkey: 0, ..put }, Status::InvalidRkey),
            (Sqe { rkey: 777, ..put }, Status::InvalidRkey),
            (Sqe { len: 0, ..put }, Status::InvalidLength),
            (Sqe { len: 65, ..put }, Status::OutOfBounds),
            (
                Sqe {
                    local_addr: src.addr() + 60,
                    ..put
                },
                Status::OutOfBounds,
            ),
            (
                Sqe {
                    remote_addr: p.window.addr() + 57,
                    ..put
                },
                Status::OutOfBounds,
            ),
            (
                Sqe {
                    remote_addr: u64::MAX - 3,
                    ..put
                },
                Status::OutOfBounds,
            ),
            (Sqe::atomic_add(ep, p.remote(4), 1), Status::Misaligned),
            (
                Sqe::atomic_fadd(ep, src.local(4), p.remote(8), 1),
                Status::Misaligned,
            ),
            (
                Sqe {
                    len: 4,
                    ..Sqe::atomic_add(ep, p.remote(8), 1)
                },
                Status::InvalidLength,
            ),
            (
                Sqe {
                    subop: 3,
                    ..Sqe::atomic_add(ep, p.remote(8), 1)
                },
                Status::InvalidMemHandle,
            ),
            (
                Sqe::notify(ep, src.local(0), 1 << 20),
                Status::InvalidLength,
            ),
        ];
        let sqes: Vec<Sqe> = cases
            .iter()
            .enumerate()
            .map(|(i, (s, _))| s.with_user_data(i as u64))
            .collect();
        let mut cqes = run(&p.initiator, &mut qp, &sqes, sqes.len());
        cqes.sort_by_key(|c| c.user_data);
        for (c, (_, want)) in cqes.iter().zip(&cases) {
            assert_eq!(
                c.res,
                want.as_raw(),
                "case {}: {}",
                c.user_data,
                ringfence_ring::strerror(c.res)
            );
        }
        let mut window = [0u8; 64];
        p.window.read(0, &mut window);
        assert_eq!(window, [0u8; 64], "no invalid SQE wrote anything");
        assert_eq!(p.initiator.stats().errors, cases.len() as u64);
    }
}

#[test]
fn forged_and_foreign_keys_are_refused() {
    for over in [Over::Immediate, Over::Sim] {
        let p = Pair::new(over, 1, 64);
        let key = p.target.pack_rkey(p.window.handle()).unwrap();
        for cut in [0, 3, 10, key.len() - 1] {
            assert!(
                p.initiator.unpack_rkey(p.ep, &key[..cut]).is_err(),
                "truncated at {cut}"
            );
        }
        // A key for a third worker's memory cannot be used on this endpoint.
        let other = worker(over, 1);
        let other_buf = other.alloc_registered(64).unwrap();
        let foreign = other.pack_rkey(other_buf.handle()).unwrap();
        assert!(p.initiator.unpack_rkey(p.ep, &foreign).is_err());
        // A forged secret: flip a byte of the driver part (its last 8
        // bytes, before the key's 4-byte integrity check). Refused at
        // unpack as damage; forged with a correct check (anyone can compute
        // it), the target refuses every access.
        let mut forged = key.clone();
        let at = forged.len() - 5;
        forged[at] ^= 0x55;
        let e = p.initiator.unpack_rkey(p.ep, &forged).unwrap_err();
        assert!(matches!(e, ringfence::Error::Malformed { .. }), "{e}");
        ringfence::reseal(&mut forged);
        let bad = p.initiator.unpack_rkey(p.ep, &forged).unwrap();
        let src = p.initiator.alloc_registered(8).unwrap();
        src.write(0, &[1; 8]);
        let mut qp = p.initiator.create_queue().unwrap();
        let remote = RemoteBuf {
            rkey: bad.as_raw(),
            addr: p.window.addr(),
        };
        let cqes = run(
            &p.initiator,
            &mut qp,
            &[Sqe::put(p.ep.as_raw(), src.local(0), remote, 8)],
            1,
        );
        assert_eq!(cqes[0].res, Status::AccessDenied.as_raw());
        assert_eq!(p.window.load_u64(0), 0, "nothing written");
        let _ = LocalBuf::default();
        let _ = Opcode::NOP;
    }
}

#[test]
fn deregistration_is_refused_while_in_use_and_keys_die_with_it() {
    for over in [Over::Immediate, Over::Sim] {
        // The target has 8 notification buffers and reads none: the ninth
        // NOTIFY cannot be delivered and keeps its payload buffer in use.
        let p = Pair::new(over, 1, 64);
        let src = p.initiator.alloc_registered(64).unwrap();
        let mut qp = p.initiator.create_queue().unwrap();
        let mut target_qp = p.target.create_queue().unwrap();
        let ep = p.ep.as_raw();
        let notes: Vec<Sqe> = (0..9)
            .map(|i| Sqe::notify(ep, src.local(0), 4).with_user_data(i))
            .collect();
        let done = run(&p.initiator, &mut qp, &notes[..8], 8);
        assert!(done.iter().all(|c| c.res == 4));
        qp.push(notes[8]).unwrap();
        qp.submit();
        for _ in 0..10 {
            p.initiator.progress();
        }
        assert_eq!(qp.pop().unwrap(), None, "the ninth waits for a buffer");
        let err = p.initiator.deregister(src.handle()).unwrap_err();
        assert_eq!(err.status(), Status::Busy);
        // The target reads one notification: the buffer frees, the ninth lands.
        let note = loop {
            p.target.progress();
            if let Some(c) = target_qp.pop().unwrap() {
                break c;
            }
        };
        drop(target_qp.notification(&note).unwrap());
        let cqes = run(&p.initiator, &mut qp, &[], 1);
        assert_eq!((cqes[0].user_data, cqes[0].res), (8, 4));
        p.initiator.deregister(src.handle()).unwrap();
        assert_eq!(
            p.initiator.deregister(src.handle()).unwrap_err().status(),
            Status::InvalidMemHandle
        );
        // The target withdraws its window: the old key is refused at the target.
        let src2 = p.initiator.alloc_registered(64).unwrap();
        p.target.deregister(p.window.handle()).unwrap();
        let cqes = run(
            &p.initiator,
            &mut qp,
            &[Sqe::put(ep, src2.local(0), p.remote(0), 8).with_user_data(2)],
            1,
        );
        assert_eq!(cqes[0].res, Status::AccessDenied.as_raw());
    }
}
