//! Moving bytes: PUT and GET, lengths, atomics, notifications, flushes,
//! fences, and a mixed load.

use super::*;
use ringfence_ring::{Cqe, FenceMode, Sqe};

/// PUTs of sizes from 1 byte to the large one, each followed by a
/// COMPLETE fence and a GET of the same range: each moves its bytes, the
/// target's window holds them, and the GET reads them back.
pub fn put_get_round_trip<S: Subject>(s: &mut S) {
    let mut p = pair(s);
    let half = (p.config.local / 2) as u64;
    let sizes = [1, 7, 8, 64, 4095, 4096, 65_537, large(&p)];
    let mut offset = 0u64;
    for (i, &len) in sizes.iter().enumerate() {
        let data = pattern(len as usize, i as u64 + 1);
        p.local.write(0, &data);
        let ud = i as u64 * 10;
        let sqes = [
            Sqe::put(p.e(), p.local.local(0), p.remote(offset), len).with_user_data(ud),
            Sqe::fence(p.e(), FenceMode::COMPLETE).with_user_data(ud + 1),
            Sqe::get(p.e(), p.local.local(half), p.remote(offset), len).with_user_data(ud + 2),
        ];
        let res = p.results(&sqes);
        assert_eq!(res, [len as i32, 0, len as i32], "PUT, FENCE, GET of {len}");
        assert!(
            read(&p.window, offset, len as usize) == data,
            "the target's bytes, {len}"
        );
        assert!(
            read(&p.local, half, len as usize) == data,
            "the GET's bytes, {len}"
        );
        // Not overlapping the next one, 8-byte aligned.
        offset = (offset + u64::from(len) + 7) & !7;
        if offset + u64::from(large(&p)) > p.config.window as u64 {
            offset = 0;
        }
    }
    assert_connected(&p);
}

/// A PUT or GET of 0 bytes, or of one more than the driver's `max_len`,
/// is refused with `InvalidLength` and fails alone; one of `max_len`
/// bytes is accepted (moved, up to the 1 MiB the checks move).
pub fn lengths_at_the_limits<S: Subject>(s: &mut S) {
    let mut p = pair(s);
    let e = p.e();
    let mut sqes = vec![
        Sqe::put(e, p.local.local(0), p.remote(0), 0).with_user_data(1),
        Sqe::get(e, p.local.local(0), p.remote(0), 0).with_user_data(2),
    ];
    if let Some(over) = p.caps.max_len.checked_add(1) {
        sqes.push(Sqe::put(e, p.local.local(0), p.remote(0), over).with_user_data(3));
        sqes.push(Sqe::get(e, p.local.local(0), p.remote(0), over).with_user_data(4));
    }
    let res = p.results(&sqes);
    assert!(
        res.iter().all(|&r| r == status(Status::InvalidLength)),
        "0 and max_len + 1 bytes: {res:?}"
    );
    let len = large(&p);
    let data = pattern(len as usize, 9);
    p.local.write(0, &data);
    let sqes = [
        Sqe::put(e, p.local.local(0), p.remote(8), len).with_user_data(5),
        Sqe::flush(e).with_user_data(6),
    ];
    assert_eq!(p.results(&sqes), [len as i32, 0]);
    assert!(read(&p.window, 8, len as usize) == data);
    assert_connected(&p);
}

/// ADD, FADD, SWAP and CSWAP (a hit and a miss) on one word, each
/// fetching the old value where it does; an atomic the driver does not
/// claim is refused (`Unsupported`).
pub fn every_atomic<S: Subject>(s: &mut S) {
    let mut p = pair(s);
    let e = p.e();
    const WORD: u64 = 64;
    p.window.store_u64(WORD as usize, 40);
    let word = p.remote(WORD);
    let result = |i: u64| p.local.local(i * 8);
    // (SQE, the old value it fetches, the word after it).
    let steps = [
        (Sqe::atomic_add(e, word, 2), None, 42),
        (Sqe::atomic_fadd(e, result(1), word, 8), Some(42), 50),
        (Sqe::atomic_swap(e, result(2), word, 7), Some(50), 7),
        (Sqe::atomic_cswap(e, result(3), word, 7, 99), Some(7), 99),
        (Sqe::atomic_cswap(e, result(4), word, 7, 1), Some(99), 99),
    ];
    let ops = p.caps.atomic_ops;
    let claimed = |sqe: &Sqe| ops.contains(sqe.atomic_op().expect("an atomic"));
    if !steps.iter().all(|(sqe, ..)| claimed(sqe)) {
        // The order of values needs them all: check the refusals alone.
        for (i, (sqe, ..)) in steps.iter().enumerate() {
            let res = p.results(&[sqe.with_user_data(i as u64)])[0];
            if !claimed(sqe) {
                assert_eq!(res, status(Status::Unsupported), "{sqe:?} is not claimed");
            }
        }
        return;
    }
    for (i, (sqe, old, after)) in steps.into_iter().enumerate() {
        let op = sqe.atomic_op().expect("an atomic");
        let res = p.results(&[sqe.with_user_data(i as u64)])[0];
        assert!(res >= 0, "{op:?}: {res}");
        if let Some(old) = old {
            assert_eq!(p.local.load_u64(i * 8), old, "{op:?} fetched");
        }
        assert_eq!(p.window.load_u64(WORD as usize), after, "after {op:?}");
    }
    // A fetched value lands in local memory only where asked: ADD fetches
    // nothing, so slot 0 is untouched.
    assert_eq!(p.local.load_u64(0), 0);
    assert_connected(&p);
}

/// Each NOTIFY reaches the target's first queue pair with its tag and its
/// payload, in submission order, after the PUT submitted before it has
/// landed; one larger than the peer's notification buffers is refused
/// (`InvalidLength`).
pub fn notify_is_delivered_after_the_writes_before_it<S: Subject>(s: &mut S) {
    let mut p = pair(s);
    let e = p.e();
    if !p.caps.notify {
        let n = Sqe::notify(e, p.local.local(0), 4).with_user_data(1);
        assert_eq!(p.results(&[n]), [status(Status::Unsupported)]);
        return;
    }
    const RECORD: u64 = 256;
    for i in 0..4u64 {
        let record = pattern(RECORD as usize, 100 + i);
        let at = i * 1024;
        p.local.write(at as usize, &record);
        let payload = format!("notification {i} of the conformance suite").into_bytes();
        p.local.write(at as usize + 512, &payload);
        let mut n = Sqe::notify(e, p.local.local(at + 512), payload.len() as u32)
            .with_user_data(10 * i + 1);
        n.operand = 0x7a6 + i;
        let sqes = [
            Sqe::put(e, p.local.local(at), p.remote(i * RECORD), RECORD as u32)
                .with_user_data(10 * i),
            n,
        ];
        let res = p.results(&sqes);
        assert_eq!(
            res,
            [RECORD as i32, payload.len() as i32],
            "PUT, NOTIFY {i}"
        );
        let (cqe, got) = p.next_notification();
        assert_eq!(cqe.user_data, 0x7a6 + i, "the tag (in order)");
        assert!(got == payload, "notification {i}'s payload");
        assert!(
            read(&p.window, i * RECORD, RECORD as usize) == record,
            "notification {i} arrived before the PUT before it"
        );
    }
    let too_big = p.config.notify.1 + 1;
    let n = Sqe::notify(e, p.local.local(0), too_big).with_user_data(99);
    assert_eq!(p.results(&[n]), [status(Status::InvalidLength)]);
    assert_connected(&p);
}

/// PUTs of mixed sizes (so on every lane) then a FLUSH: when the FLUSH's
/// CQE is reaped, every byte of every PUT is in the target's window.
pub fn flush_completes_after_the_writes_it_covers<S: Subject>(s: &mut S) {
    let mut p = pair(s);
    let e = p.e();
    let sizes = [8u32, 8192, 64, 20_000, 8, 4096, 100_000, 512];
    let mut sqes = Vec::new();
    let mut expect = Vec::new();
    let mut at = 0u64;
    for round in 0..4u64 {
        for (i, &len) in sizes.iter().enumerate() {
            let seed = round * 100 + i as u64 + 1;
            let data = pattern(len as usize, seed);
            p.local.write(at as usize, &data);
            sqes.push(Sqe::put(e, p.local.local(at), p.remote(at), len).with_user_data(seed));
            expect.push((at, data));
            at = (at + u64::from(len) + 63) & !63;
        }
    }
    sqes.push(Sqe::flush(e).with_user_data(0));
    let window = p.window.clone();
    let mut checked = false;
    let cqes = p.complete_watching(&sqes, |c: &Cqe| {
        if c.user_data == 0 {
            assert_eq!(c.res, 0, "the FLUSH");
            for (at, data) in &expect {
                assert!(
                    read(&window, *at, data.len()) == *data,
                    "{} bytes at {at} were not in place at the FLUSH's CQE",
                    data.len()
                );
            }
            checked = true;
        }
    });
    assert!(checked);
    assert!(cqes.iter().all(|c| c.res >= 0), "{cqes:?}");
    assert_connected(&p);
}

/// Writes to one word from different lanes (small and large PUTs take
/// different ones), each behind an ORDER fence: the last one wins every
/// time, whatever path the engine takes to keep the order.
pub fn fence_orders_writes_across_lanes<S: Subject>(s: &mut S) {
    let mut p = pair(s);
    let e = p.e();
    const BIG: u32 = 8192;
    for round in 0..24u64 {
        let mut sqes = Vec::new();
        for k in 0..4u64 {
            let big = (round + k) % 2 == 0;
            let value = round * 10 + k + 1;
            let at = k * u64::from(BIG);
            let mut data = vec![0u8; BIG as usize];
            data[..8].copy_from_slice(&value.to_le_bytes());
            p.local.write(at as usize, &data);
            let len = if big { BIG } else { 8 };
            let ud = 10 * k;
            sqes.push(Sqe::put(e, p.local.local(at), p.remote(0), len).with_user_data(ud));
            sqes.push(Sqe::fence(e, FenceMode::ORDER).with_user_data(ud + 1));
        }
        sqes.push(Sqe::flush(e).with_user_data(100));
        let res = p.results(&sqes);
        assert!(res.iter().all(|&r| r >= 0), "round {round}: {res:?}");
        assert_eq!(
            p.window.load_u64(0),
            round * 10 + 4,
            "round {round}: a write behind a fence was overtaken"
        );
    }
    assert_connected(&p);
}

/// FLUSH, a worker FLUSH and both FENCE modes on an endpoint with nothing
/// outstanding succeed (the peer is alive).
pub fn flushes_and_fences_with_nothing_outstanding_succeed<S: Subject>(s: &mut S) {
    let mut p = pair(s);
    let e = p.e();
    let sqes = [
        Sqe::flush(e).with_user_data(1),
        Sqe::flush_worker().with_user_data(2),
        Sqe::fence(e, FenceMode::ORDER).with_user_data(3),
        Sqe::fence(e, FenceMode::COMPLETE).with_user_data(4),
        Sqe::flush(e).with_user_data(5),
    ];
    assert_eq!(p.results(&sqes), [0; 5]);
    assert_connected(&p);
}

/// A seeded mix of PUTs, GETs, atomics, fences and flushes over every
/// lane, in batches: each completes exactly once and succeeds, and the
/// ADDs all landed.
pub fn every_operation_of_a_mixed_load_completes_once<S: Subject>(s: &mut S) {
    let mut p = pair(s);
    let e = p.e();
    const COUNTER: u64 = 0;
    let mut x = 0x5eed_u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut ud = 0;
    let mut adds = 0u64;
    let half = (p.config.local / 2) as u64;
    for _ in 0..12 {
        let mut sqes = Vec::new();
        for _ in 0..48 {
            ud += 1;
            let at = 4096 + (next() % 256) * 1024;
            let sqe = match next() % 8 {
                0 | 1 => Sqe::put(e, p.local.local(at), p.remote(at), 8),
                2 => Sqe::put(e, p.local.local(at), p.remote(at), 6000),
                3 => Sqe::get(e, p.local.local(half + at), p.remote(at), 1000),
                4 => {
                    adds += 1;
                    Sqe::atomic_add(e, p.remote(COUNTER), 1)
                }
                5 => Sqe::atomic_fadd(e, p.local.local(8 * (ud % 64)), p.remote(8), 1),
                6 => Sqe::fence(e, [FenceMode::ORDER, FenceMode::COMPLETE][ud as usize % 2]),
                _ => Sqe::flush(e),
            };
            sqes.push(sqe.with_user_data(ud));
        }
        let res = p.results(&sqes);
        assert!(res.iter().all(|&r| r >= 0), "{res:?}");
    }
    assert_eq!(
        p.window.load_u64(COUNTER as usize),
        adds,
        "every ADD landed once"
    );
    assert_connected(&p);
}
