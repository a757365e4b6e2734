//! Every field an opcode does not use must be zero (the table on `Sqe`):
//! a sweep over every bit of every such field of a valid SQE of each
//! opcode, over the loopback driver (completing inside `post`) and over
//! `SimDriver` (completing later). Each flipped SQE completes exactly once
//! with the documented status and moves no byte; `try_now` declines each
//! flipped PUT and GET. The unflipped SQEs, run last, succeed: the flips
//! are what the engine refuses.

use ringfence::{EndpointId, Loopback, QueuePair, RegisteredBuf, RkeyId, Worker};
use ringfence_ring::{CloseMode, Cqe, FenceMode, RemoteBuf, Sqe, SqeFlags, Status};
use ringfence_testkit::{SimDriver, SimTiming};
use std::collections::HashMap;
use std::time::{Duration, Instant};

const HANG: Duration = Duration::from_secs(120);
const WINDOW: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    Immediate,
    Sim,
}

fn worker(over: Over) -> Worker {
    let mut b = Worker::builder();
    match over {
        Over::Immediate => b.driver(Loopback::new()),
        Over::Sim => {
            let (sim, handle) = SimDriver::new(Loopback::new());
            handle.set_timing(SimTiming::PollsBetween(1, 3));
            b.driver(sim)
        }
    };
    b.notify_buffers(8, 256)
        .ring_entries(1024, 1024)
        .requests(1024)
        .ignore_env()
        .build()
        .unwrap()
}

struct Pair {
    target: Worker,
    initiator: Worker,
    window: RegisteredBuf,
    src: RegisteredBuf,
    ep: EndpointId,
    rkey: RkeyId,
}

impl Pair {
    fn new(over: Over) -> Pair {
        let target = worker(over);
        let initiator = worker(over);
        let window = target.alloc_registered(WINDOW).unwrap();
        let src = initiator.alloc_registered(WINDOW).unwrap();
        window.write(0, &pattern(0x31));
        src.write(0, &pattern(0x77));
        let ep = initiator.connect(target.address()).unwrap();
        let rkey = initiator
            .unpack_rkey(ep, &target.pack_rkey(window.handle()).unwrap())
            .unwrap();
        Pair {
            target,
            initiator,
            window,
            src,
            ep,
            rkey,
        }
    }

    fn remote(&self, offset: u64) -> RemoteBuf {
        RemoteBuf {
            rkey: self.rkey.as_raw(),
            addr: self.window.addr() + offset,
        }
    }

    /// One valid SQE of each opcode (and sub-operation), named.
    fn bases(&self) -> Vec<(&'static str, Sqe)> {
        let (ep, src) = (self.ep.as_raw(), &self.src);
        let mut notify = Sqe::notify(ep, src.local(3000), 5);
        notify.operand = 0x7a6; // the tag: a field NOTIFY uses
        vec![
            ("put", Sqe::put(ep, src.local(0), self.remote(0), 8)),
            ("get", Sqe::get(ep, src.local(1024), self.remote(64), 8)),
            ("add", Sqe::atomic_add(ep, self.remote(128), 5)),
            (
                "fadd",
                Sqe::atomic_fadd(ep, src.local(2048), self.remote(136), 6),
            ),
            (
                "swap",
                Sqe::atomic_swap(ep, src.local(2056), self.remote(144), 7),
            ),
            (
                "cswap",
                Sqe::atomic_cswap(ep, src.local(2064), self.remote(152), 8, 9),
            ),
            ("fence order", Sqe::fence(ep, FenceMode::ORDER)),
            ("fence complete", Sqe::fence(ep, FenceMode::COMPLETE)),
            ("flush", Sqe::flush(ep)),
            ("flush worker", Sqe::flush_worker()),
            ("notify", notify),
            ("nop", Sqe::nop()),
            ("close", Sqe::close(ep, CloseMode::GRACEFUL)),
        ]
    }
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..WINDOW)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// A field of an SQE: its name and width in bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Flags,
    Subop,
    Reserved0,
    Endpoint,
    Len,
    LocalMem,
    LocalAddr,
    RemoteAddr,
    Rkey,
    Reserved1,
    Operand,
    Operand2,
}

impl Field {
    fn bits(self) -> u32 {
        match self {
            Field::Flags | Field::Subop | Field::Reserved0 => 8,
            Field::Endpoint | Field::Len | Field::LocalMem | Field::Rkey | Field::Reserved1 => 32,
            Field::LocalAddr | Field::RemoteAddr | Field::Operand | Field::Operand2 => 64,
        }
    }

    fn flip(self, sqe: &mut Sqe, bit: u32) {
        match self {
            Field::Flags => sqe.flags ^= 1 << bit,
            Field::Subop => sqe.subop ^= 1 << bit,
            Field::Reserved0 => sqe.reserved0 ^= 1 << bit,
            Field::Endpoint => sqe.endpoint ^= 1 << bit,
            Field::Len => sqe.len ^= 1 << bit,
            Field::LocalMem => sqe.local_mem ^= 1 << bit,
            Field::LocalAddr => sqe.local_addr ^= 1 << bit,
            Field::RemoteAddr => sqe.remote_addr ^= 1 << bit,
            Field::Rkey => sqe.rkey ^= 1 << bit,
            Field::Reserved1 => sqe.reserved1 ^= 1 << bit,
            Field::Operand => sqe.operand ^= 1 << bit,
            Field::Operand2 => sqe.operand2 ^= 1 << bit,
        }
    }
}

/// The fields `name`'s opcode does not use, each with the status a
/// non-zero one gets (the table on `Sqe`); `flags` (its undefined bits)
/// and `subop` where the opcode takes none are listed too.
fn unused(name: &str) -> Vec<(Field, Status)> {
    use Field::*;
    let arg = Status::InvalidArgument;
    let mut fields = vec![(Reserved0, arg), (Reserved1, arg)];
    let rest: &[Field] = match name {
        "put" | "get" => &[Operand, Operand2],
        "add" => &[LocalMem, LocalAddr, Operand2],
        "fadd" | "swap" => &[Operand2],
        "cswap" => &[],
        "fence order" | "fence complete" | "flush" | "close" => &[
            Len, LocalMem, LocalAddr, RemoteAddr, Rkey, Operand, Operand2,
        ],
        "flush worker" => {
            fields.push((Endpoint, Status::InvalidEndpoint));
            &[
                Len, LocalMem, LocalAddr, RemoteAddr, Rkey, Operand, Operand2,
            ]
        }
        "notify" => &[RemoteAddr, Rkey, Operand2],
        "nop" => &[
            Endpoint, Len, LocalMem, LocalAddr, RemoteAddr, Rkey, Operand, Operand2,
        ],
        _ => unreachable!("{name}"),
    };
    fields.extend(rest.iter().map(|&f| (f, arg)));
    if matches!(name, "put" | "get" | "notify" | "nop") {
        fields.push((Subop, Status::InvalidSubop));
    }
    fields.push((Flags, Status::InvalidFlags));
    fields
}

/// Every flipped SQE of `bases`: the SQE, its description, the status.
fn flipped(bases: &[(&'static str, Sqe)]) -> Vec<(Sqe, String, Status)> {
    let mut out = Vec::new();
    for &(name, base) in bases {
        assert_eq!(base.unused_bits(), 0, "{name}");
        for (field, want) in unused(name) {
            for bit in 0..field.bits() {
                if field == Field::Flags && 1 << bit == SqeFlags::SKIP_SUCCESS.bits() {
                    continue; // a defined flag: not garbage
                }
                let mut sqe = base;
                field.flip(&mut sqe, bit);
                out.push((sqe, format!("{name}: {field:?} bit {bit}"), want));
            }
        }
    }
    out
}

/// Pushes `sqes` (user_data 0..n) and runs both workers until each has
/// its CQE; then one more flush, after which no other CQE may come.
fn run_all(p: &Pair, qp: &mut QueuePair, sqes: &[Sqe]) -> Vec<Cqe> {
    let deadline = Instant::now() + HANG;
    let (mut pushed, mut out) = (0, Vec::new());
    let fence = u64::MAX;
    let mut closing = Vec::from(sqes);
    closing.push(Sqe::flush(p.ep.as_raw()).with_user_data(fence));
    while !out.iter().any(|c: &Cqe| c.user_data == fence) {
        if pushed < closing.len() {
            pushed += qp.push_batch(&closing[pushed..]).unwrap();
            qp.submit();
        }
        p.initiator.progress();
        p.target.progress();
        let mut batch = [Cqe::default(); 64];
        let n = qp.reap(&mut batch).unwrap();
        out.extend_from_slice(&batch[..n]);
        assert!(Instant::now() < deadline, "hung: {} CQEs", out.len());
    }
    let flush = out.pop().unwrap();
    assert_eq!(flush.res, 0, "the flush after them");
    // Nothing more comes, however long progress runs.
    for _ in 0..64 {
        p.initiator.progress();
        p.target.progress();
        assert_eq!(qp.pop().unwrap(), None);
    }
    out
}

fn sweep(over: Over) {
    let p = Pair::new(over);
    let mut qp = p.initiator.create_queue().unwrap();
    let mut target_qp = p.target.create_queue().unwrap();
    let bases = p.bases();
    let cases = flipped(&bases);
    assert_eq!(cases.len(), 3523, "every bit of every unused field");
    let sqes: Vec<Sqe> = cases
        .iter()
        .enumerate()
        .map(|(i, (s, _, _))| s.with_user_data(i as u64))
        .collect();
    let errors_before = p.initiator.stats().errors;
    let mut seen: HashMap<u64, i32> = HashMap::new();
    for chunk in sqes.chunks(512) {
        for c in run_all(&p, &mut qp, chunk) {
            assert!(
                seen.insert(c.user_data, c.res).is_none(),
                "two CQEs for {}",
                cases[c.user_data as usize].1
            );
        }
    }
    assert_eq!(seen.len(), cases.len(), "one CQE each");
    for (i, (_, what, want)) in cases.iter().enumerate() {
        let res = seen[&(i as u64)];
        assert_eq!(
            res,
            want.as_raw(),
            "{over:?} {what}: {}",
            ringfence_ring::strerror(res)
        );
    }
    assert_eq!(
        p.initiator.stats().errors - errors_before,
        cases.len() as u64
    );
    // No byte moved, on either side; no notification reached the target.
    let (mut window, mut src) = (vec![0u8; WINDOW], vec![0u8; WINDOW]);
    p.window.read(0, &mut window);
    p.src.read(0, &mut src);
    assert!(
        window == pattern(0x31),
        "{over:?}: the target's window changed"
    );
    assert!(
        src == pattern(0x77),
        "{over:?}: the initiator's buffer changed"
    );
    assert_eq!(p.target.stats().notifications, 0);
    assert_eq!(target_qp.pop().unwrap(), None, "no notification came");

    // The SQEs the flips started from are valid: they succeed.
    let valid: Vec<Sqe> = bases
        .iter()
        .enumerate()
        .map(|(i, (_, s))| s.with_user_data(i as u64))
        .collect();
    let (last, rest) = valid.split_last().unwrap(); // the CLOSE goes last
    let mut cqes = run_all(&p, &mut qp, rest);
    cqes.sort_by_key(|c| c.user_data);
    assert_eq!(cqes.len(), rest.len());
    for c in &cqes {
        assert!(c.res >= 0, "{}: {}", bases[c.user_data as usize].0, c.res);
    }
    p.window.read(0, &mut window);
    assert_eq!(&window[..8], &pattern(0x77)[..8], "the valid PUT landed");
    let deadline = Instant::now() + HANG;
    let note = loop {
        p.target.progress();
        if let Some(c) = target_qp.pop().unwrap() {
            break c;
        }
        assert!(Instant::now() < deadline);
    };
    assert_eq!(note.user_data, 0x7a6, "the valid NOTIFY's tag");
    assert_eq!(target_qp.pop().unwrap(), None, "one notification only");
    qp.push(*last).unwrap();
    qp.submit();
    let deadline = Instant::now() + HANG;
    let close = loop {
        p.initiator.progress();
        p.target.progress();
        if let Some(c) = qp.pop().unwrap() {
            break c;
        }
        assert!(Instant::now() < deadline);
    };
    assert_eq!(close.res, 0, "the valid CLOSE");
}

#[test]
fn every_unused_bit_is_refused_over_loopback() {
    sweep(Over::Immediate);
}

#[test]
fn every_unused_bit_is_refused_over_the_sim_driver() {
    sweep(Over::Sim);
}

/// `try_now` declines every flipped PUT and GET (nothing done, nothing
/// counted), and the same SQE pushed afterwards completes with the status.
#[test]
fn try_now_declines_every_flipped_put_and_get() {
    let p = Pair::new(Over::Immediate);
    let mut qp = p.initiator.create_queue().unwrap();
    let bases: Vec<_> = p
        .bases()
        .into_iter()
        .filter(|(n, _)| matches!(*n, "put" | "get"))
        .collect();
    // Unflipped, they run at once (a warm lookup, then each again).
    for (name, sqe) in &bases {
        assert_eq!(qp.try_now(sqe), Some(Ok(8)), "{name}");
    }
    p.window.write(0, &pattern(0x31));
    p.src.write(0, &pattern(0x77));
    let ops = p.initiator.stats().ops;
    let cases = flipped(&bases);
    for (sqe, what, _) in &cases {
        assert_eq!(qp.try_now(sqe), None, "{what}");
        // The lookups it may have left are those of a valid SQE: the next
        // valid one still runs.
    }
    assert_eq!(p.initiator.stats().ops, ops, "nothing was counted");
    let sqes: Vec<Sqe> = cases
        .iter()
        .enumerate()
        .map(|(i, (s, _, _))| s.with_user_data(i as u64))
        .collect();
    let cqes = run_all(&p, &mut qp, &sqes);
    assert_eq!(cqes.len(), cases.len());
    for c in &cqes {
        let (_, what, want) = &cases[c.user_data as usize];
        assert_eq!(c.res, want.as_raw(), "{what}");
    }
    let (mut window, mut src) = (vec![0u8; WINDOW], vec![0u8; WINDOW]);
    p.window.read(0, &mut window);
    p.src.read(0, &mut src);
    assert!(window == pattern(0x31), "the target's window changed");
    assert!(src == pattern(0x77), "the initiator's buffer changed");
    // A valid PUT after all that still runs at once.
    assert_eq!(qp.try_now(&bases[0].1), Some(Ok(8)));
}
