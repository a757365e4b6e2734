//! The shm driver between two real processes: PUT and GET at every size
//! from 1 byte to 64 MiB, atomics contending from both processes on the
//! same words, and 100,000 mixed operations with fences checked against a
//! model. The parent is the initiator; the child (a re-run of this test
//! binary) owns the memory and never runs an engine round for these
//! one-sided operations.

use ringfence::Cqe;
use ringfence_ring::{FenceMode, RemoteBuf, Sqe};
use ringfence_tests::child::{self, ChildProcess};
use ringfence_tests::shm::{self, Link, checksum, pattern};

const MAX: usize = 64 << 20;

/// The child's side: a window of `len` bytes; sends address, key and the
/// window's address and length, then answers `[offset, len, seed]` checks
/// until an empty message.
fn window_child(len: usize, lanes: u8) {
    let mut link = Link::new(child::parent_socket());
    let w = shm::worker(lanes);
    let window = w.alloc_registered(len).unwrap();
    link.send(w.address());
    link.send(&w.pack_rkey(window.handle()).unwrap());
    link.send_u64s(&[window.addr(), len as u64]);
    loop {
        let m = link.recv_u64s();
        match m.as_slice() {
            [] => break,
            &[offset, len, seed] => {
                let mut got = vec![0u8; len as usize];
                window.read(offset as usize, &mut got);
                let ok = got == pattern(len as usize, seed);
                link.send_u64s(&[u64::from(ok)]);
            }
            &[offset, len] => {
                let mut got = vec![0u8; len as usize];
                window.read(offset as usize, &mut got);
                link.send_u64s(&[checksum(&got)]);
            }
            other => panic!("unexpected request {other:?}"),
        }
    }
}

#[test]
fn put_and_get_from_1_byte_to_64_mib() {
    if child::role().is_some() {
        return window_child(MAX + 4096, 4);
    }
    let child = ChildProcess::spawn("put_and_get_from_1_byte_to_64_mib", "target");
    let mut link = Link::new(child.socket.try_clone().unwrap());
    let offer = link.recv_offer();
    let [base, window_len] = offer.window[..] else {
        panic!("window")
    };
    let w = shm::worker(4);
    let (ep, rkey) = offer.connect(&w);
    let src = w.alloc_registered(MAX).unwrap();
    let back = w.alloc_registered(MAX).unwrap();
    let mut qp = w.create_queue().unwrap();

    let mut sizes: Vec<usize> = (1..=64).collect();
    sizes.extend([100, 4093, 4096, 65_537, (1 << 20) + 7, 16 << 20, MAX]);
    for (i, &len) in sizes.iter().enumerate() {
        let seed = i as u64 + 1;
        let offset = (i * 7919) % 4096;
        assert!((offset + len) as u64 <= window_len);
        let data = pattern(len, seed);
        src.write(0, &data);
        let remote = RemoteBuf {
            rkey: rkey.as_raw(),
            addr: base + offset as u64,
        };
        let e = ep.as_raw();
        let sqes = [
            Sqe::put(e, src.local(0), remote, len as u32).with_user_data(1),
            Sqe::fence(e, FenceMode::COMPLETE).with_user_data(2),
            Sqe::get(e, back.local(0), remote, len as u32).with_user_data(3),
        ];
        let mut cqes = shm::complete(&w, &mut qp, &sqes, 3);
        cqes.sort_by_key(|c| c.user_data);
        let res: Vec<i32> = cqes.iter().map(|c| c.res).collect();
        assert_eq!(res, vec![len as i32, 0, len as i32], "len {len}");
        let mut got = vec![0u8; len];
        back.read(0, &mut got);
        assert!(
            got == data,
            "GET after the fence read other bytes at len {len}"
        );
        link.send_u64s(&[offset as u64, len as u64, seed]);
        assert_eq!(
            link.recv_u64s(),
            [1],
            "the target's bytes differ at len {len}"
        );
    }
    link.send(&[]);
    child.join();
}

const FADDS: usize = 20_000;
const CSWAPS: u64 = 2_000;

/// FADD(1) on `word` `FADDS` times (fetching every old value), then
/// `CSWAPS` increments of `word + 8` by compare-and-swap; returns the
/// fetched values.
fn hammer(
    w: &ringfence::Worker,
    ep: ringfence::EndpointId,
    rkey: ringfence::RkeyId,
    word: u64,
) -> Vec<u64> {
    let results = w.alloc_registered(FADDS * 8).unwrap();
    let mut qp = w.create_queue().unwrap();
    let remote = |addr| RemoteBuf {
        rkey: rkey.as_raw(),
        addr,
    };
    let e = ep.as_raw();
    for chunk in (0..FADDS).collect::<Vec<_>>().chunks(256) {
        let sqes: Vec<Sqe> = chunk
            .iter()
            .map(|&i| {
                Sqe::atomic_fadd(e, results.local(i as u64 * 8), remote(word), 1)
                    .with_user_data(i as u64)
            })
            .collect();
        for c in shm::complete(w, &mut qp, &sqes, sqes.len()) {
            assert_eq!(c.res, 8, "{c:?}");
        }
    }
    let fetched: Vec<u64> = (0..FADDS).map(|i| results.load_u64(i * 8)).collect();
    let (mut expected, mut done) = (0u64, 0u64);
    while done < CSWAPS {
        let sqe = Sqe::atomic_cswap(
            e,
            results.local(0),
            remote(word + 8),
            expected,
            expected + 1,
        );
        let c = shm::complete(w, &mut qp, &[sqe], 1);
        assert_eq!(c[0].res, 8);
        let old = results.load_u64(0);
        if old == expected {
            done += 1;
        }
        expected = if old == expected { old + 1 } else { old };
    }
    fetched
}

#[test]
fn atomics_contend_from_both_processes() {
    if child::role().is_some() {
        let mut link = Link::new(child::parent_socket());
        let w = shm::worker(2);
        let window = w.alloc_registered(4096).unwrap();
        let key = w.pack_rkey(window.handle()).unwrap();
        link.send(w.address());
        link.send(&key);
        link.send_u64s(&[window.addr()]);
        // The child's own atomics go through an endpoint to itself, so
        // both processes' LOCK XADDs meet on the same word.
        let ep = w.connect(w.address()).unwrap();
        let rkey = w.unpack_rkey(ep, &key).unwrap();
        assert_eq!(link.recv(), b"go");
        let fetched = hammer(&w, ep, rkey, window.addr());
        link.send_u64s(&fetched);
        assert_eq!(link.recv(), b"done");
        link.send_u64s(&[window.load_u64(0), window.load_u64(8)]);
        return;
    }
    let child = ChildProcess::spawn("atomics_contend_from_both_processes", "target");
    let mut link = Link::new(child.socket.try_clone().unwrap());
    let offer = link.recv_offer();
    let base = offer.base();
    let w = shm::worker(2);
    let (ep, rkey) = offer.connect(&w);
    link.send(b"go");
    let mut all = hammer(&w, ep, rkey, base);
    all.extend(link.recv_u64s());
    link.send(b"done");
    let finals = link.recv_u64s();
    all.sort_unstable();
    let expect: Vec<u64> = (0..2 * FADDS as u64).collect();
    assert!(
        all == expect,
        "every FADD fetched a distinct old value, 0..{}",
        2 * FADDS
    );
    assert_eq!(finals, [2 * FADDS as u64, 2 * CSWAPS]);
    child.join();
}

/// A small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const MIXED_OPS: usize = 100_000;
const WINDOW: usize = 1 << 20;
/// Atomics use the first `ATOMIC_AREA` bytes of the window; PUT and GET
/// the rest, so the two never overlap and the model stays exact.
const ATOMIC_AREA: usize = 512;
const BATCH: usize = 64;
const SLOT: u64 = 2048;

/// What a completed SQE must show.
enum Expect {
    Len(u32),
    Zero,
    /// A GET: its bytes at `SLOT * index` of the landing buffer.
    Get(usize, Vec<u8>),
    /// A fetching atomic: the old value at `8 * index` of the results.
    Fetch(usize, u64),
}

#[test]
fn mixed_operations_with_fences_match_a_model() {
    if child::role().is_some() {
        return window_child(WINDOW, 4);
    }
    let child = ChildProcess::spawn("mixed_operations_with_fences_match_a_model", "target");
    let mut link = Link::new(child.socket.try_clone().unwrap());
    let offer = link.recv_offer();
    let base = offer.base();
    let w = shm::worker(4);
    let (ep, rkey) = offer.connect(&w);
    let src = w.alloc_registered(BATCH * SLOT as usize).unwrap();
    let landing = w.alloc_registered(BATCH * SLOT as usize).unwrap();
    let results = w.alloc_registered(BATCH * 8).unwrap();
    let mut qp = w.create_queue().unwrap();
    let e = ep.as_raw();
    let remote = |off: u64| RemoteBuf {
        rkey: rkey.as_raw(),
        addr: base + off,
    };

    let mut model = vec![0u8; WINDOW];
    let word = |model: &[u8], at: usize| u64::from_le_bytes(model[at..at + 8].try_into().unwrap());
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let mut submitted = 0;
    let (mut fences, mut flushes, mut gets, mut atomics) = (0, 0, 0, 0);
    while submitted < MIXED_OPS {
        let mut sqes = Vec::with_capacity(BATCH);
        let mut expects = Vec::with_capacity(BATCH);
        // Ranges touched by PUT or GET since the last fence.
        let mut touched: Vec<(usize, usize)> = Vec::new();
        let fence = |sqes: &mut Vec<Sqe>, expects: &mut Vec<Expect>, rng: &mut Rng| {
            let mode = if rng.below(2) == 0 {
                FenceMode::ORDER
            } else {
                FenceMode::COMPLETE
            };
            sqes.push(Sqe::fence(e, mode));
            expects.push(Expect::Zero);
        };
        while sqes.len() < BATCH - 1 {
            let i = sqes.len();
            let pick = rng.below(100);
            match pick {
                0..40 => {
                    let len = 1 + rng.below(SLOT) as usize;
                    let off = ATOMIC_AREA + rng.below((WINDOW - ATOMIC_AREA - len) as u64) as usize;
                    if touched.iter().any(|&(a, b)| off < b && a < off + len) {
                        fence(&mut sqes, &mut expects, &mut rng);
                        touched.clear();
                    }
                    let i = sqes.len();
                    let data = pattern(len, rng.next());
                    src.write(i * SLOT as usize, &data);
                    model[off..off + len].copy_from_slice(&data);
                    touched.push((off, off + len));
                    sqes.push(Sqe::put(
                        e,
                        src.local(i as u64 * SLOT),
                        remote(off as u64),
                        len as u32,
                    ));
                    expects.push(Expect::Len(len as u32));
                }
                40..60 => {
                    let len = 1 + rng.below(SLOT) as usize;
                    let off = ATOMIC_AREA + rng.below((WINDOW - ATOMIC_AREA - len) as u64) as usize;
                    fence(&mut sqes, &mut expects, &mut rng);
                    touched.clear();
                    let i = sqes.len();
                    touched.push((off, off + len));
                    sqes.push(Sqe::get(
                        e,
                        landing.local(i as u64 * SLOT),
                        remote(off as u64),
                        len as u32,
                    ));
                    expects.push(Expect::Get(i, model[off..off + len].to_vec()));
                    gets += 1;
                }
                60..85 => {
                    let at = 8 * rng.below((ATOMIC_AREA / 8) as u64) as usize;
                    let old = word(&model, at);
                    let value = rng.below(1000);
                    let new = if pick < 75 {
                        sqes.push(Sqe::atomic_fadd(
                            e,
                            results.local(i as u64 * 8),
                            remote(at as u64),
                            value,
                        ));
                        expects.push(Expect::Fetch(i, old));
                        old.wrapping_add(value)
                    } else {
                        sqes.push(Sqe::atomic_add(e, remote(at as u64), value));
                        expects.push(Expect::Len(8));
                        old.wrapping_add(value)
                    };
                    model[at..at + 8].copy_from_slice(&new.to_le_bytes());
                    atomics += 1;
                }
                85..92 => {
                    let at = 8 * rng.below((ATOMIC_AREA / 8) as u64) as usize;
                    let old = word(&model, at);
                    // Half the compares succeed.
                    let compare = if rng.below(2) == 0 { old } else { old ^ 1 };
                    let swap = rng.next();
                    sqes.push(Sqe::atomic_cswap(
                        e,
                        results.local(i as u64 * 8),
                        remote(at as u64),
                        compare,
                        swap,
                    ));
                    expects.push(Expect::Fetch(i, old));
                    if compare == old {
                        model[at..at + 8].copy_from_slice(&swap.to_le_bytes());
                    }
                    atomics += 1;
                }
                92..96 => {
                    fence(&mut sqes, &mut expects, &mut rng);
                    touched.clear();
                    fences += 1;
                }
                _ => {
                    sqes.push(Sqe::flush(e));
                    expects.push(Expect::Zero);
                    flushes += 1;
                }
            }
        }
        for (i, s) in sqes.iter_mut().enumerate() {
            *s = s.with_user_data(i as u64);
        }
        let cqes: Vec<Cqe> = shm::complete(&w, &mut qp, &sqes, sqes.len());
        let mut seen = vec![false; sqes.len()];
        for c in &cqes {
            let i = c.user_data as usize;
            assert!(!seen[i], "two CQEs for one SQE");
            seen[i] = true;
            match &expects[i] {
                Expect::Len(n) => assert_eq!(c.res, *n as i32, "{c:?}"),
                Expect::Zero => assert_eq!(c.res, 0, "{c:?}"),
                Expect::Get(slot, bytes) => {
                    assert_eq!(c.res, bytes.len() as i32);
                    let mut got = vec![0u8; bytes.len()];
                    landing.read(slot * SLOT as usize, &mut got);
                    assert!(&got == bytes, "GET {i} after a fence read stale bytes");
                }
                Expect::Fetch(slot, old) => {
                    assert_eq!(c.res, 8);
                    assert_eq!(results.load_u64(slot * 8), *old, "atomic {i} fetched");
                }
            }
        }
        submitted += sqes.len();
    }
    assert!(fences > 1000 && flushes > 1000 && gets > 10_000 && atomics > 10_000);
    link.send_u64s(&[0, WINDOW as u64]);
    assert_eq!(
        link.recv_u64s(),
        [checksum(&model)],
        "the target's window differs from the model"
    );
    let stats = w.endpoint_stats(ep).unwrap();
    assert_eq!(stats.errors, 0);
    assert!(stats.ops >= MIXED_OPS as u64);
    link.send(&[]);
    child.join();
}

/// Memory that is not one of the driver's memfd allocations (here a heap
/// buffer of the child) is reached with cross memory attach: PUT and GET
/// work, ATOMIC is unsupported, and a deregistered region is refused.
#[test]
fn cross_memory_attach_for_heap_memory() {
    const LEN: usize = 8192;
    if child::role().is_some() {
        let mut link = Link::new(child::parent_socket());
        let w = shm::worker(1);
        let heap: &'static mut [u8] = Box::leak(vec![0u8; LEN].into_boxed_slice());
        let ptr = heap.as_mut_ptr();
        // SAFETY: the buffer is leaked (lives for the whole process) and
        // read below only through a raw copy, after the parent's operations
        // completed (the parent says so on the socket).
        let handle = unsafe { w.register(ptr, LEN, ringfence::MemKind::Host) }.unwrap();
        link.send(w.address());
        link.send(&w.pack_rkey(handle).unwrap());
        link.send_u64s(&[ptr as u64]);
        let [offset, len, seed] = link.recv_u64s()[..] else {
            panic!("request")
        };
        let mut got = vec![0u8; len as usize];
        // SAFETY: inside the leaked buffer; the parent's writes are done.
        unsafe {
            std::ptr::copy_nonoverlapping(ptr.add(offset as usize), got.as_mut_ptr(), got.len())
        };
        link.send_u64s(&[u64::from(got == pattern(len as usize, seed))]);
        assert_eq!(link.recv(), b"dereg");
        w.deregister(handle).unwrap();
        link.send(b"ok");
        assert!(link.recv().is_empty());
        return;
    }
    let child = ChildProcess::spawn("cross_memory_attach_for_heap_memory", "target");
    let mut link = Link::new(child.socket.try_clone().unwrap());
    let offer = link.recv_offer();
    let base = offer.base();
    let w = shm::worker(1);
    let (ep, rkey) = offer.connect(&w);
    let src = w.alloc_registered(LEN * 2).unwrap();
    let mut qp = w.create_queue().unwrap();
    let e = ep.as_raw();
    let remote = |off: u64| RemoteBuf {
        rkey: rkey.as_raw(),
        addr: base + off,
    };
    let data = pattern(3000, 42);
    src.write(0, &data);
    let sqes = [
        Sqe::put(e, src.local(0), remote(1000), 3000).with_user_data(1),
        Sqe::fence(e, FenceMode::COMPLETE).with_user_data(2),
        Sqe::get(e, src.local(LEN as u64), remote(1000), 3000).with_user_data(3),
        Sqe::atomic_add(e, remote(8), 1).with_user_data(4),
    ];
    let mut cqes = shm::complete(&w, &mut qp, &sqes, sqes.len());
    cqes.sort_by_key(|c| c.user_data);
    let res: Vec<i32> = cqes.iter().map(|c| c.res).collect();
    assert_eq!(
        res,
        vec![3000, 0, 3000, ringfence::Status::Unsupported.as_raw()]
    );
    let mut back = vec![0u8; 3000];
    src.read(LEN, &mut back);
    assert!(back == data);
    link.send_u64s(&[1000, 3000, 42]);
    assert_eq!(link.recv_u64s(), [1], "the child's heap holds the PUT");
    link.send(b"dereg");
    assert_eq!(link.recv(), b"ok");
    let c = shm::complete(&w, &mut qp, &[Sqe::put(e, src.local(0), remote(0), 8)], 1);
    assert_eq!(c[0].res, ringfence::Status::AccessDenied.as_raw());
    link.send(&[]);
    child.join();
}

/// `QueuePair::try_now` between two processes, through the driver's hot
/// key (the last mapped key, kept with its mappings): PUTs and GETs land
/// at once; a key the target revoked is refused before any byte moves,
/// even though the engine's lookups still hold it; and a peer killed
/// mid-stream fails the PUT that meets its death, then the endpoint.
#[test]
fn try_now_through_the_hot_key() {
    const LEN: usize = 4096;
    if child::role().is_some() {
        let mut link = Link::new(child::parent_socket());
        let w = shm::worker(1);
        let window = w.alloc_registered(LEN).unwrap();
        link.send_offer(&w, &window);
        // Check the PUTs, then withdraw the window; then wait to be killed.
        let [offset, len, seed] = link.recv_u64s()[..] else {
            panic!("request")
        };
        let mut got = vec![0u8; len as usize];
        window.read(offset as usize, &mut got);
        link.send_u64s(&[u64::from(got == pattern(len as usize, seed))]);
        assert_eq!(link.recv(), b"dereg");
        w.deregister(window.handle()).unwrap();
        link.send(b"ok");
        let _ = link.try_recv();
        loop {
            std::thread::park();
        }
    }
    let mut child = ChildProcess::spawn("try_now_through_the_hot_key", "target");
    let mut link = Link::new(child.socket.try_clone().unwrap());
    let offer = link.recv_offer();
    let base = offer.base();
    let w = shm::worker(1);
    let (ep, rkey) = offer.connect(&w);
    let src = w.alloc_registered(2 * LEN).unwrap();
    let mut qp = w.create_queue().unwrap();
    let e = ep.as_raw();
    let remote = |off: u64| RemoteBuf {
        rkey: rkey.as_raw(),
        addr: base + off,
    };
    let data = pattern(LEN, 5);
    src.write(0, &data);
    // Sizes around the inline copies and a bulk one, then a GET of it all.
    let mut off = 0u64;
    for len in [1u32, 4, 7, 8, 9, 16, 17, 64, 1000, 2970] {
        let put = Sqe::put(e, src.local(off), remote(off), len);
        assert_eq!(qp.try_now(&put), Some(Ok(len)), "PUT of {len} bytes");
        off += u64::from(len);
    }
    assert_eq!(off, LEN as u64);
    let get = Sqe::get(e, src.local(LEN as u64), remote(0), LEN as u32);
    assert_eq!(qp.try_now(&get), Some(Ok(LEN as u32)));
    let mut back = vec![0u8; LEN];
    src.read(LEN, &mut back);
    assert!(back == data, "the GET read back the PUTs");
    // Past the window's end, below its start, across its end, at the top
    // of the address space: the engine's prefetch hint (which names the
    // hot key) leaves every byte alone, the checks refuse each PUT with
    // its one CQE, and the hot key still serves the window afterwards.
    for (addr, len) in [
        (base + LEN as u64, 8),
        (base - 64, 8),
        (base + LEN as u64 - 4, 8),
        (u64::MAX - 7, 8),
    ] {
        let rb = RemoteBuf {
            rkey: rkey.as_raw(),
            addr,
        };
        let put = Sqe::put(e, src.local(0), rb, len).with_user_data(9);
        assert_eq!(qp.try_now(&put), None, "declined at {addr:#x}");
        let c = shm::complete(&w, &mut qp, &[put], 1);
        assert_eq!(
            c[0].res,
            ringfence::Status::OutOfBounds.as_raw(),
            "{addr:#x}"
        );
    }
    let put = Sqe::put(e, src.local(0), remote(0), 8);
    assert_eq!(qp.try_now(&put), Some(Ok(8)), "the hot key after refusals");
    link.send_u64s(&[0, LEN as u64, 5]);
    assert_eq!(link.recv_u64s(), [1], "the target holds the PUTs");

    // Revoked at the target: the hot key's liveness word refuses it.
    link.send(b"dereg");
    assert_eq!(link.recv(), b"ok");
    let put = Sqe::put(e, src.local(0), remote(0), 8);
    assert_eq!(qp.try_now(&put), Some(Err(ringfence::Status::AccessDenied)));
    let c = shm::complete(&w, &mut qp, &[put.with_user_data(1)], 1);
    assert_eq!(c[0].res, ringfence::Status::AccessDenied.as_raw());

    // Killed and reaped: its liveness word is marked, so the very next
    // try_now fails with PEER_UNREACHABLE, the endpoint with it, and every
    // later one with the endpoint's sticky error.
    child.process.kill().unwrap();
    child.process.wait().unwrap();
    assert_eq!(
        qp.try_now(&put),
        Some(Err(ringfence::Status::PeerUnreachable))
    );
    assert_eq!(
        qp.try_now(&put),
        Some(Err(ringfence::Status::PeerUnreachable)),
        "the endpoint failed"
    );
    let c = shm::complete(&w, &mut qp, &[put.with_user_data(2)], 1);
    assert_eq!(c[0].res, ringfence::Status::PeerUnreachable.as_raw());
}
