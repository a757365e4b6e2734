//! `sqe_validate`: arbitrary SQEs through a real worker over loopback.
//!
//! Input: byte 0 picks the loopback completion mode (bit 0: on the next
//! poll) ; then chunks of 65 bytes, one SQE each (at most [`MAX_SQES`]):
//! the 64 bytes of the SQE as the ring holds it (little-endian fields at
//! their ABI offsets), then a mapping byte that rebases fields onto the
//! real objects so the fuzzer reaches the valid paths:
//!
//! - bit 0: `local_addr` = the local buffer's address + (`local_addr` mod
//!   [`SPAN`]) - [`SLACK`] (wrapping: addresses just outside included);
//! - bit 1: `local_mem` = the local buffer's handle;
//! - bit 2: `remote_addr` = the window's address + (`remote_addr` mod
//!   [`SPAN`]) - [`SLACK`];
//! - bit 3: `rkey` = the window's unpacked key;
//! - bit 4: `endpoint` = the connected endpoint;
//! - bit 5: `len` mod [`SPAN`].
//!
//! `user_data` is replaced by the SQE's index (to match completions).
//!
//! A worker flush (no flags) follows the SQEs, as a barrier: once it and
//! every SQE without `SKIP_SUCCESS` completed, an SQE with `SKIP_SUCCESS`
//! and no CQE succeeded.
//!
//! Properties: every SQE gets exactly one CQE (none for one that succeeded
//! with `SKIP_SUCCESS`); no panic; an SQE with an
//! unknown opcode or non-zero reserved fields fails; a PUT, GET or ATOMIC
//! that succeeds named registered memory with the right handle and key;
//! and no byte of any registered buffer (the window, the local buffer and
//! a registered guard buffer on each side) changes outside the ranges
//! named by the SQEs that succeeded.

use super::Cursor;
use ringfence::{CompletionMode, Loopback, RegisteredBuf, Worker};
use ringfence_ring::{Cqe, Opcode, Sqe, SqeFlags};

/// Most SQEs one input submits.
pub const MAX_SQES: usize = 32;
/// Bytes of every buffer.
pub const BUF: usize = 4096;
/// Offsets of rebased addresses range over `[-SLACK, SPAN - SLACK)`.
pub const SPAN: u64 = 8192;
/// See [`SPAN`].
pub const SLACK: u64 = 64;
/// Progress rounds before an input counts as hung.
const HANG_ROUNDS: usize = 200_000;

fn worker(mode: CompletionMode) -> Worker {
    Worker::builder()
        .driver(Loopback::with_mode(mode))
        .lanes(2)
        .bw_threshold(1024)
        .notify_buffers(4, 256)
        .ignore_env()
        .build()
        .expect("a loopback worker")
}

fn fill(buf: &RegisteredBuf, seed: u8) -> Vec<u8> {
    let bytes: Vec<u8> = (0..buf.len())
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed))
        .collect();
    buf.write(0, &bytes);
    bytes
}

fn snapshot(buf: &RegisteredBuf) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    buf.read(0, &mut out);
    out
}

/// Parses an SQE from its ABI bytes (missing bytes read as zero).
pub fn parse_sqe(bytes: &[u8]) -> Sqe {
    let mut c = Cursor(bytes);
    let mut sqe = Sqe::nop();
    sqe.opcode = c.u8();
    sqe.flags = c.u8();
    sqe.subop = c.u8();
    sqe.reserved0 = c.u8();
    sqe.endpoint = c.u32();
    sqe.len = c.u32();
    sqe.local_mem = c.u32();
    sqe.local_addr = c.u64();
    sqe.remote_addr = c.u64();
    sqe.rkey = c.u32();
    sqe.reserved1 = c.u32();
    sqe.operand = c.u64();
    sqe.operand2 = c.u64();
    sqe.user_data = c.u64();
    sqe
}

/// The ABI bytes of an SQE (the inverse of [`parse_sqe`]).
pub fn sqe_bytes(s: &Sqe) -> Vec<u8> {
    let mut out = vec![s.opcode, s.flags, s.subop, s.reserved0];
    out.extend_from_slice(&s.endpoint.to_le_bytes());
    out.extend_from_slice(&s.len.to_le_bytes());
    out.extend_from_slice(&s.local_mem.to_le_bytes());
    out.extend_from_slice(&s.local_addr.to_le_bytes());
    out.extend_from_slice(&s.remote_addr.to_le_bytes());
    out.extend_from_slice(&s.rkey.to_le_bytes());
    out.extend_from_slice(&s.reserved1.to_le_bytes());
    out.extend_from_slice(&s.operand.to_le_bytes());
    out.extend_from_slice(&s.operand2.to_le_bytes());
    out.extend_from_slice(&s.user_data.to_le_bytes());
    out
}

fn inside(buf: &RegisteredBuf, addr: u64, len: u64) -> bool {
    addr >= buf.addr()
        && addr
            .checked_add(len)
            .is_some_and(|end| end <= buf.addr() + buf.len() as u64)
}

/// `[addr, addr + len)` as a half-open range, saturated.
fn range(addr: u64, len: u64) -> (u64, u64) {
    (addr, addr.saturating_add(len))
}

pub fn sqe_validate(data: &[u8]) {
    let _ = sqe_results(data);
}

/// Runs [`sqe_validate`]'s checks; returns each SQE's completion result.
pub fn sqe_results(data: &[u8]) -> Vec<i32> {
    let mut c = Cursor(data);
    let mode = if c.u8() & 1 != 0 {
        CompletionMode::NextPoll
    } else {
        CompletionMode::Immediate
    };
    let target = worker(mode);
    let initiator = worker(mode);
    let window = target.alloc_registered(BUF).unwrap();
    let guard_t = target.alloc_registered(BUF).unwrap();
    let local = initiator.alloc_registered(BUF).unwrap();
    let guard_l = initiator.alloc_registered(BUF).unwrap();
    let ep = initiator.connect(target.address()).unwrap();
    let rkey = initiator
        .unpack_rkey(ep, &target.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let bufs = [&window, &guard_t, &local, &guard_l];
    let before: Vec<Vec<u8>> = bufs
        .iter()
        .enumerate()
        .map(|(i, b)| fill(b, i as u8 * 61))
        .collect();

    let mut sqes = Vec::new();
    while !c.0.is_empty() && sqes.len() < MAX_SQES {
        let mut sqe = parse_sqe(c.take(64));
        let map = c.u8();
        if map & 1 != 0 {
            sqe.local_addr = local
                .addr()
                .wrapping_add(sqe.local_addr % SPAN)
                .wrapping_sub(SLACK);
        }
        if map & 2 != 0 {
            sqe.local_mem = local.handle().as_raw();
        }
        if map & 4 != 0 {
            sqe.remote_addr = window
                .addr()
                .wrapping_add(sqe.remote_addr % SPAN)
                .wrapping_sub(SLACK);
        }
        if map & 8 != 0 {
            sqe.rkey = rkey.as_raw();
        }
        if map & 16 != 0 {
            sqe.endpoint = ep.as_raw();
        }
        if map & 32 != 0 {
            sqe.len = (u64::from(sqe.len) % SPAN) as u32;
        }
        sqe.user_data = sqes.len() as u64;
        sqes.push(sqe);
    }

    let n = sqes.len();
    sqes.push(Sqe::flush_worker().with_user_data(n as u64));
    let skips = |s: &Sqe| s.flags & SqeFlags::SKIP_SUCCESS.bits() != 0;
    let mut qp = initiator.create_queue().unwrap();
    let mut cqes: Vec<Option<Cqe>> = vec![None; sqes.len()];
    let mut pushed = 0;
    let mut rounds = 0;
    let done = |cqes: &[Option<Cqe>]| sqes.iter().zip(cqes).all(|(s, c)| c.is_some() || skips(s));
    while !done(&cqes) {
        if pushed < sqes.len() {
            pushed += qp.push_batch(&sqes[pushed..]).unwrap();
            qp.submit();
        }
        initiator.progress();
        target.progress();
        let mut batch = [Cqe::default(); 64];
        let n = qp.reap(&mut batch).unwrap();
        for cqe in &batch[..n] {
            let i = cqe.user_data as usize;
            assert!(i < sqes.len(), "a CQE for no SQE: {cqe:?}");
            assert!(cqes[i].is_none(), "two CQEs for SQE {i}: {cqe:?}");
            cqes[i] = Some(*cqe);
        }
        rounds += 1;
        assert!(
            rounds < HANG_ROUNDS,
            "hung; missing CQEs of {:?}",
            sqes.iter()
                .zip(&cqes)
                .filter(|(_, c)| c.is_none())
                .map(|(s, _)| s)
                .collect::<Vec<_>>()
        );
    }
    for _ in 0..4 {
        initiator.progress();
        target.progress();
    }
    while let Some(cqe) = qp.pop().unwrap() {
        let i = cqe.user_data as usize;
        assert!(
            i < sqes.len() && skips(&sqes[i]),
            "a CQE beyond one per SQE: {cqe:?}"
        );
        assert!(cqes[i].is_none(), "two CQEs for SQE {i}: {cqe:?}");
        assert!(
            cqe.result().is_err(),
            "a success CQE for a SKIP_SUCCESS SQE: {cqe:?}"
        );
        cqes[i] = Some(cqe);
    }
    assert!(cqes[n].is_some(), "no CQE for the barrier");
    sqes.pop();
    cqes.pop();

    // What succeeded, and what it could write.
    let local_bufs = [&local, &guard_l];
    let local_ok = |s: &Sqe, len: u64| {
        local_bufs
            .iter()
            .any(|b| b.handle().as_raw() == s.local_mem && inside(b, s.local_addr, len))
    };
    let remote_ok = |s: &Sqe, len: u64| {
        s.endpoint == ep.as_raw() && s.rkey == rkey.as_raw() && inside(&window, s.remote_addr, len)
    };
    let mut written = Vec::new();
    for (s, cqe) in sqes.iter().zip(&cqes) {
        if let Some(cqe) = cqe {
            assert!(
                !skips(s) || cqe.result().is_err(),
                "a success CQE for a SKIP_SUCCESS SQE: {cqe:?}"
            );
        }
        // No CQE: it succeeded with SKIP_SUCCESS.
        let cqe = cqe.unwrap_or(Cqe::new(s.user_data, 0, 0));
        let ok = cqe.result().is_ok();
        let opcode = s.opcode();
        if opcode.is_err() || !s.reserved_are_zero() || s.flags().is_err() {
            assert!(!ok, "an invalid SQE succeeded: {s:?} -> {cqe:?}");
        }
        if !ok {
            continue;
        }
        let len = u64::from(s.len);
        match opcode.unwrap() {
            Opcode::PUT if len > 0 => {
                assert!(
                    local_ok(s, len) && remote_ok(s, len),
                    "a bad PUT succeeded: {s:?} -> {cqe:?}"
                );
                written.push(range(s.remote_addr, len));
            }
            Opcode::GET if len > 0 => {
                assert!(
                    local_ok(s, len) && remote_ok(s, len),
                    "a bad GET succeeded: {s:?} -> {cqe:?}"
                );
                written.push(range(s.local_addr, len));
            }
            Opcode::ATOMIC => {
                assert!(remote_ok(s, 8), "a bad ATOMIC succeeded: {s:?} -> {cqe:?}");
                written.push(range(s.remote_addr, 8));
                if s.atomic_op().is_ok_and(|op| op.is_fetching()) {
                    assert!(
                        local_ok(s, 8),
                        "a fetching ATOMIC into bad memory succeeded: {s:?}"
                    );
                    written.push(range(s.local_addr, 8));
                }
            }
            _ => {}
        }
    }
    for (b, old) in bufs.iter().zip(&before) {
        let now = snapshot(b);
        for (i, (x, y)) in now.iter().zip(old).enumerate() {
            let addr = b.addr() + i as u64;
            if x != y {
                assert!(
                    written.iter().any(|&(s, e)| s <= addr && addr < e),
                    "byte {addr:#x} (buffer at {:#x}, offset {i}) changed, {y:#04x} -> {x:#04x}, \
                     outside every successful SQE's range {written:x?}",
                    b.addr()
                );
            }
        }
    }
    // The result of each SQE (0 for a silent success).
    cqes.iter().map(|c| c.map_or(0, |c| c.res)).collect()
}

/// Seeds: each opcode, valid (all fields rebased) and broken in one way.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    use ringfence_ring::{CloseMode, FenceMode, LocalBuf, RemoteBuf};
    let lb = |off: u64| LocalBuf {
        mem: 0,
        addr: off + SLACK,
    };
    let rb = |off: u64| RemoteBuf {
        rkey: 0,
        addr: off + SLACK,
    };
    let all = 0x3f;
    // The mapping bit that rebases only `endpoint`.
    const ENDPOINT: u8 = 0x10;
    let put = Sqe::put(0, lb(0), rb(128), 256);
    let get = Sqe::get(0, lb(512), rb(0), 1024);
    let fadd = Sqe::atomic_fadd(0, lb(8), rb(64), 5);
    let cswap = Sqe::atomic_cswap(0, lb(24), rb(16), 0, 9);
    let add = Sqe::atomic_add(0, rb(32), 1);
    let swap = Sqe::atomic_swap(0, lb(48), rb(40), 3);
    let mut bad_reserved = put;
    bad_reserved.reserved1 = 1;
    let mut unknown = Sqe::nop();
    unknown.opcode = 0xee;
    let seq = |ops: &[(Sqe, u8)], mode: u8| {
        let mut out = vec![mode];
        for (s, m) in ops {
            out.extend_from_slice(&sqe_bytes(s));
            out.push(*m);
        }
        out
    };
    vec![
        ("nop".into(), seq(&[(Sqe::nop(), 0)], 0)),
        ("put".into(), seq(&[(put, all)], 0)),
        ("put_next_poll".into(), seq(&[(put, all)], 1)),
        ("get".into(), seq(&[(get, all)], 0)),
        (
            "atomics".into(),
            // ADD takes no local buffer: its local fields stay zero (an
            // unused field must be).
            seq(
                &[(add, all & !0b11), (fadd, all), (swap, all), (cswap, all)],
                1,
            ),
        ),
        (
            "put_past_window".into(),
            seq(&[(Sqe::put(0, lb(0), rb(4000), 200), all)], 0),
        ),
        (
            "get_before_local".into(),
            seq(
                &[(Sqe::get(0, LocalBuf { mem: 0, addr: 0 }, rb(0), 64), all)],
                0,
            ),
        ),
        ("put_wrong_key".into(), seq(&[(put, all & !8)], 0)),
        ("put_raw".into(), seq(&[(put, 0)], 0)),
        ("reserved".into(), seq(&[(bad_reserved, all)], 0)),
        ("unknown_opcode".into(), seq(&[(unknown, all)], 0)),
        (
            "fence_flush_close".into(),
            seq(
                &[
                    (put, all),
                    // Only their endpoint is rebased: the fields they do
                    // not use must stay zero.
                    (Sqe::fence(0, FenceMode::COMPLETE), ENDPOINT),
                    (get, all),
                    (Sqe::flush(0), ENDPOINT),
                    (Sqe::flush_worker(), 0),
                    (Sqe::close(0, CloseMode::GRACEFUL), ENDPOINT),
                    (put, all),
                ],
                1,
            ),
        ),
        // A NOTIFY names no remote buffer: those fields stay zero.
        (
            "notify".into(),
            seq(&[(Sqe::notify(0, lb(0), 32), all & !0b1100)], 0),
        ),
        (
            "skip_success".into(),
            seq(
                &[
                    (put.with_flags(SqeFlags::SKIP_SUCCESS), all),
                    (get.with_flags(SqeFlags::SKIP_SUCCESS), all & !8),
                ],
                1,
            ),
        ),
    ]
}
