//! PUT, GET and atomics move the right bytes: every size, every atomic, two
//! initiators on one word, and `store_u64`.

use crate::{ALL, Over, Pair, pattern, run, worker};
use ringfence_ring::{FenceMode, RemoteBuf, Sqe};

#[test]
fn put_and_get_move_the_right_bytes_at_every_size() {
    for mode in ALL {
        let max = 4 << 20;
        let p = Pair::new(mode, 4, max + 64);
        let src = p.initiator.alloc_registered(max).unwrap();
        let back = p.initiator.alloc_registered(max).unwrap();
        let mut qp = p.initiator.create_queue().unwrap();
        let mut len = 1;
        while len <= max {
            let data = pattern(len, len as u8);
            src.write(0, &data);
            let ep = p.ep.as_raw();
            let sqes = [
                Sqe::put(ep, src.local(0), p.remote(7), len as u32).with_user_data(1),
                Sqe::fence(ep, FenceMode::COMPLETE).with_user_data(2),
                Sqe::get(ep, back.local(0), p.remote(7), len as u32).with_user_data(3),
            ];
            let cqes = run(&p.initiator, &mut qp, &sqes, 3);
            let mut by_id: Vec<(u64, i32)> = cqes.iter().map(|c| (c.user_data, c.res)).collect();
            by_id.sort();
            assert_eq!(
                by_id,
                vec![(1, len as i32), (2, 0), (3, len as i32)],
                "{mode:?} len {len}"
            );
            let mut landed = vec![0u8; len];
            p.window.read(7, &mut landed);
            assert_eq!(landed, data, "{mode:?}: target bytes at len {len}");
            let mut got = vec![0u8; len];
            back.read(0, &mut got);
            assert_eq!(
                got, data,
                "{mode:?}: GET after the fence read the PUT's bytes at len {len}"
            );
            len = if len < 64 { len + 1 } else { len * 4 };
        }
        let stats = p.initiator.endpoint_stats(p.ep).unwrap();
        assert!(stats.bytes > 0 && stats.fences > 0 && stats.errors == 0);
    }
}

#[test]
fn atomics_fetch_and_apply() {
    for mode in ALL {
        let p = Pair::new(mode, 2, 64);
        let result = p.initiator.alloc_registered(64).unwrap();
        let mut qp = p.initiator.create_queue().unwrap();
        let ep = p.ep.as_raw();
        p.window.write(8, &10u64.to_ne_bytes());
        let strong = |ud| Sqe::fence(ep, FenceMode::COMPLETE).with_user_data(ud);
        let sqes = [
            Sqe::atomic_add(ep, p.remote(8), 5).with_user_data(1),
            strong(100),
            Sqe::atomic_fadd(ep, result.local(0), p.remote(8), 2).with_user_data(2),
            strong(101),
            Sqe::atomic_swap(ep, result.local(8), p.remote(8), 40).with_user_data(3),
            strong(102),
            Sqe::atomic_cswap(ep, result.local(16), p.remote(8), 41, 99).with_user_data(4),
            strong(103),
            Sqe::atomic_cswap(ep, result.local(24), p.remote(8), 40, 77).with_user_data(5),
        ];
        let cqes = run(&p.initiator, &mut qp, &sqes, sqes.len());
        assert!(cqes.iter().all(|c| c.res >= 0), "{cqes:?}");
        assert_eq!(result.load_u64(0), 15, "FADD fetched the value after ADD");
        assert_eq!(result.load_u64(8), 17, "SWAP fetched the value after FADD");
        assert_eq!(
            result.load_u64(16),
            40,
            "failed CSWAP fetches the current value"
        );
        assert_eq!(
            result.load_u64(24),
            40,
            "successful CSWAP fetches the old value"
        );
        assert_eq!(p.window.load_u64(8), 77);
    }
}

#[test]
fn two_initiators_contend_on_one_word() {
    for over in [Over::Immediate, Over::Sim] {
        const N: u64 = 2000;
        let target = worker(over, 1);
        let window = target.alloc_registered(8).unwrap();
        let key = target.pack_rkey(window.handle()).unwrap();
        let address = target.address().to_vec();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (address, key) = (address.clone(), key.clone());
                let window_addr = window.addr();
                std::thread::spawn(move || {
                    let w = worker(over, 1);
                    let ep = w.connect(&address).unwrap();
                    let rkey = w.unpack_rkey(ep, &key).unwrap();
                    let results = w.alloc_registered(8 * N as usize).unwrap();
                    let mut qp = w.create_queue().unwrap();
                    let remote = RemoteBuf {
                        rkey: rkey.as_raw(),
                        addr: window_addr,
                    };
                    let sqes: Vec<Sqe> = (0..N)
                        .map(|i| {
                            Sqe::atomic_fadd(ep.as_raw(), results.local(8 * i), remote, 1)
                                .with_user_data(i)
                        })
                        .collect();
                    let cqes = run(&w, &mut qp, &sqes, N as usize);
                    assert!(cqes.iter().all(|c| c.res == 8));
                    (0..N)
                        .map(|i| results.load_u64(8 * i as usize))
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let mut fetched: Vec<u64> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        fetched.sort_unstable();
        assert_eq!(
            fetched,
            (0..2 * N).collect::<Vec<u64>>(),
            "every old value seen exactly once"
        );
        assert_eq!(window.load_u64(0), 2 * N);
    }
}

/// `store_u64` writes one word that a GET from the peer reads back; an
/// unaligned or out-of-bounds offset panics and writes nothing.
#[test]
fn store_u64_is_one_word_a_peer_reads() {
    for over in [Over::Immediate, Over::Sim] {
        let p = Pair::new(over, 1, 64);
        let mut qp = p.initiator.create_queue().unwrap();
        let local = p.initiator.alloc_registered(64).unwrap();
        p.window.store_u64(8, 0x0102_0304_0506_0708);
        assert_eq!(p.window.load_u64(8), 0x0102_0304_0506_0708);
        let get = Sqe::get(p.ep.as_raw(), local.local(0), p.remote(8), 8).with_user_data(1);
        let c = run(&p.initiator, &mut qp, &[get], 1);
        assert_eq!(c[0].res, 8);
        let mut got = [0u8; 8];
        local.read(0, &mut got);
        assert_eq!(u64::from_ne_bytes(got), 0x0102_0304_0506_0708);
        for offset in [4, 60, 64, usize::MAX - 3] {
            let window = std::panic::AssertUnwindSafe(&p.window);
            let refused = std::panic::catch_unwind(|| window.store_u64(offset, u64::MAX));
            assert!(refused.is_err(), "offset {offset} refused");
        }
        let mut all = [0u8; 64];
        p.window.read(0, &mut all);
        assert!(
            all.iter()
                .enumerate()
                .all(|(i, &b)| (8..16).contains(&i) || b == 0),
            "nothing else written: {all:?}"
        );
    }
}
