//! Two workers with endpoints to each other: the second endpoint adopts
//! the first's connection, which then carries requests both ways (see
//! `ringfence_tcp::wire`, "Both ways on one connection"). Both workers are
//! progressed by the test.

use ringfence::{Cqe, EndpointId, EndpointState, QueuePair, RegisteredBuf, RkeyId, Worker};
use ringfence_ring::{CloseMode, RemoteBuf, Sqe};
use ringfence_tcp::Tcp;
use std::time::{Duration, Instant};

/// One worker, its listening port, a window peers write and read, and a
/// local buffer.
struct Side {
    w: Worker,
    port: u16,
    window: RegisteredBuf,
    local: RegisteredBuf,
    qp: QueuePair,
}

const LEN: usize = 32 << 20;

fn side() -> Side {
    side_with(Tcp::builder().ignore_env())
}

fn side_with(builder: ringfence_tcp::TcpBuilder) -> Side {
    let tcp = builder.build().unwrap();
    let port = tcp.local_addr().port();
    let w = Worker::builder()
        .driver(tcp)
        .ring_entries(1024, 4096)
        .requests(4096)
        .ignore_env()
        .build()
        .unwrap();
    let window = w.alloc_registered(LEN).unwrap();
    let local = w.alloc_registered(LEN).unwrap();
    let qp = w.create_queue().unwrap();
    Side {
        w,
        port,
        window,
        local,
        qp,
    }
}

/// An endpoint of `from` to `to` with `lanes` lanes, and `to`'s window key
/// on it.
fn connect(from: &Side, to: &Side, lanes: u8) -> (EndpointId, RkeyId) {
    let ep = from
        .w
        .connect_lanes(to.w.address(), &[("tcp", lanes)])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while from.w.endpoint_state(ep).unwrap() == EndpointState::Connecting {
        from.w.progress();
        to.w.progress();
        assert!(Instant::now() < deadline, "connect hung");
        std::thread::yield_now();
    }
    assert_eq!(from.w.endpoint_state(ep).unwrap(), EndpointState::Connected);
    let blob = to.w.pack_rkey(to.window.handle()).unwrap();
    (ep, from.w.unpack_rkey(ep, &blob).unwrap())
}

/// Established TCP connections to `port` on loopback (the connecting ends,
/// from `/proc/net/tcp` and `tcp6`).
fn connections_to(port: u16) -> usize {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let remote_port = cols
                .get(2)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            cols.get(3) == Some(&"01") && remote_port == Some(port)
        })
        .count()
}

/// Progresses both sides until `a` has `to_a` and `b` has `to_b`
/// connections to their ports.
fn wait_connections(a: &Side, b: &Side, to_a: usize, to_b: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = (connections_to(a.port), connections_to(b.port));
        if now == (to_a, to_b) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "connections to a and b: {now:?}, expected ({to_a}, {to_b})"
        );
        a.w.progress();
        b.w.progress();
        std::thread::yield_now();
    }
}

/// Submits `a_sqes` on `a` and `b_sqes` on `b` and progresses both until
/// every one has its CQE; returns them (a's, b's), each checked to have
/// succeeded.
fn run_both(a: &mut Side, a_sqes: &[Sqe], b: &mut Side, b_sqes: &[Sqe]) -> (Vec<Cqe>, Vec<Cqe>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut a_pushed, mut b_pushed) = (0, 0);
    let (mut a_out, mut b_out) = (Vec::new(), Vec::new());
    let mut batch = [Cqe::default(); 64];
    while a_out.len() < a_sqes.len() || b_out.len() < b_sqes.len() {
        if a_pushed < a_sqes.len() {
            a_pushed += a.qp.push_batch(&a_sqes[a_pushed..]).unwrap();
            a.qp.submit();
        }
        if b_pushed < b_sqes.len() {
            b_pushed += b.qp.push_batch(&b_sqes[b_pushed..]).unwrap();
            b.qp.submit();
        }
        a.w.progress();
        b.w.progress();
        let n = a.qp.reap(&mut batch).unwrap();
        a_out.extend_from_slice(&batch[..n]);
        let n = b.qp.reap(&mut batch).unwrap();
        b_out.extend_from_slice(&batch[..n]);
        assert!(
            Instant::now() < deadline,
            "hung: a {} of {}, b {} of {}",
            a_out.len(),
            a_sqes.len(),
            b_out.len(),
            b_sqes.len()
        );
        std::thread::yield_now();
    }
    for c in a_out.iter().chain(&b_out) {
        assert!(c.res >= 0, "{c:?}");
    }
    (a_out, b_out)
}

fn remote(window: &RegisteredBuf, rkey: RkeyId, off: u64) -> RemoteBuf {
    RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window.addr() + off,
    }
}

/// A GET of the peer's first `span` bytes into ours at 0, then on the same
/// lane a PUT of ours at `span` over those same bytes.
fn get_then_put(
    ep: EndpointId,
    ours: &RegisteredBuf,
    peer: &RegisteredBuf,
    key: RkeyId,
    span: usize,
) -> [Sqe; 2] {
    let len = span as u32;
    [
        Sqe::get(ep.as_raw(), ours.local(0), remote(peer, key, 0), len),
        Sqe::put(
            ep.as_raw(),
            ours.local(span as u64),
            remote(peer, key, 0),
            len,
        ),
    ]
}

/// A ping-pong both ways over the one connection: each side's PUT of a
/// sequence number lands in the other's window, GETs and atomics both
/// ways; one TCP connection in all.
#[test]
fn one_connection_carries_requests_both_ways() {
    let mut a = side();
    let mut b = side();
    let (ab, b_key) = connect(&a, &b, 1);
    wait_connections(&a, &b, 0, 1);
    let (ba, a_key) = connect(&b, &a, 1);
    // b's endpoint took a's connection: still one.
    wait_connections(&a, &b, 0, 1);
    for round in 1..=500u64 {
        a.local.store_u64(0, round);
        b.local.store_u64(0, round * 3);
        // PUT our word, GET the peer's, add to the peer's counter.
        let ops = |ep: EndpointId, ours: &RegisteredBuf, peer: &RegisteredBuf, key, add| {
            let at = |off| remote(peer, key, off);
            [
                Sqe::put(ep.as_raw(), ours.local(0), at(64), 8),
                Sqe::get(ep.as_raw(), ours.local(64), at(128), 8),
                Sqe::atomic_add(ep.as_raw(), at(192), add),
                Sqe::flush(ep.as_raw()),
            ]
        };
        let a_sqes = ops(ab, &a.local, &b.window, b_key, 1);
        let b_sqes = ops(ba, &b.local, &a.window, a_key, 2);
        a.window.store_u64(128, round + 1000);
        b.window.store_u64(128, round + 2000);
        run_both(&mut a, &a_sqes, &mut b, &b_sqes);
        assert_eq!(b.window.load_u64(64), round);
        assert_eq!(a.window.load_u64(64), round * 3);
        assert_eq!(a.local.load_u64(64), round + 2000, "a read b's window");
        assert_eq!(b.local.load_u64(64), round + 1000, "b read a's window");
        assert_eq!(b.window.load_u64(192), round);
        assert_eq!(a.window.load_u64(192), round * 2);
    }
    assert_eq!(connections_to(a.port), 0);
    assert_eq!(connections_to(b.port), 1);
}

/// A GET answered straight from the window is never overtaken by a later
/// write on its lane: the PUT after it waits for its data. Each round
/// GETs a word, then PUTs a new value over it on the same lane with no
/// fence; the GET must return the value before the PUT.
#[test]
fn a_get_never_returns_a_later_write_on_its_lane() {
    let mut a = side();
    let mut b = side();
    let (ab, b_key) = connect(&a, &b, 1);
    let (_ba, _a_key) = connect(&b, &a, 1);
    wait_connections(&a, &b, 0, 1);
    // A large GET: its data is still in the kernel when the PUT would run.
    const SPAN: usize = 1 << 20;
    for round in 1..=40u64 {
        let old = vec![round as u8; SPAN];
        b.window.write(0, &old);
        a.local.write(SPAN, &vec![!(round as u8); SPAN]);
        let [get, put] = get_then_put(ab, &a.local, &b.window, b_key, SPAN);
        let a_sqes = [get, put, Sqe::flush(ab.as_raw())];
        run_both(&mut a, &a_sqes, &mut b, &[]);
        let mut got = vec![0u8; SPAN];
        a.local.read(0, &mut got);
        assert!(got == old, "round {round}: the GET saw the PUT after it");
        let mut now = vec![0u8; SPAN];
        b.window.read(0, &mut now);
        assert!(now.iter().all(|&x| x == !(round as u8)), "round {round}");
    }
}

/// Both sides stream GETs and PUTs of 4 MiB at each other at once, far
/// more than the sockets and the (small) receive buffers hold, on 1 and
/// on 4 lanes: every byte arrives and nothing stalls. Neither reader ever
/// waits for room to answer; a target that staged GET data would, and the
/// two would wait on each other for ever.
#[test]
fn both_sides_move_bulk_at_each_other_without_stalling() {
    const MIB: usize = 1 << 20;
    const OP: usize = 4 * MIB;
    const HALF: usize = 16 * MIB;
    for lanes in [1u8, 4] {
        let small = || Tcp::builder().ignore_env().recv_buffers(8, 4096);
        let mut a = side_with(small());
        let mut b = side_with(small());
        let (ab, b_key) = connect(&a, &b, lanes);
        let (ba, a_key) = connect(&b, &a, lanes);
        wait_connections(&a, &b, 0, usize::from(lanes));
        // GET the peer's upper half into ours, PUT our lower half into
        // the peer's, one 4 MiB operation of each at a time.
        let sqes = |ep: EndpointId, key: RkeyId, peer: &RegisteredBuf, ours: &RegisteredBuf| {
            let mut v = Vec::new();
            for i in 0..(HALF / OP) as u64 {
                let lo = i * OP as u64;
                let hi = lo + HALF as u64;
                v.push(Sqe::get(
                    ep.as_raw(),
                    ours.local(hi),
                    remote(peer, key, hi),
                    OP as u32,
                ));
                v.push(Sqe::put(
                    ep.as_raw(),
                    ours.local(lo),
                    remote(peer, key, lo),
                    OP as u32,
                ));
            }
            v.push(Sqe::flush(ep.as_raw()));
            v
        };
        let pattern = |seed: u8, range: std::ops::Range<usize>| -> Vec<u8> {
            range.map(|i| (i as u8).wrapping_mul(seed)).collect()
        };
        a.local.write(0, &pattern(3, 0..LEN));
        b.local.write(0, &pattern(5, 0..LEN));
        a.window.write(0, &pattern(7, 0..LEN));
        b.window.write(0, &pattern(11, 0..LEN));
        let a_sqes = sqes(ab, b_key, &b.window, &a.local);
        let b_sqes = sqes(ba, a_key, &a.window, &b.local);
        run_both(&mut a, &a_sqes, &mut b, &b_sqes);
        let read = |buf: &RegisteredBuf, range: std::ops::Range<usize>| {
            let mut v = vec![0u8; range.len()];
            buf.read(range.start, &mut v);
            v
        };
        let (lo, hi) = (0..HALF, HALF..LEN);
        assert!(
            read(&b.window, lo.clone()) == pattern(3, lo.clone()),
            "a's PUTs, {lanes} lanes"
        );
        assert!(
            read(&a.window, lo.clone()) == pattern(5, lo.clone()),
            "b's PUTs, {lanes} lanes"
        );
        assert!(
            read(&a.local, hi.clone()) == pattern(11, hi.clone()),
            "a's GETs, {lanes} lanes"
        );
        assert!(
            read(&b.local, hi.clone()) == pattern(7, hi.clone()),
            "b's GETs, {lanes} lanes"
        );
    }
}

/// Each side may close its endpoint first: the other's endpoint goes on
/// over the same connection, and once both are closed the connection
/// goes away.
#[test]
fn either_side_may_let_go_first() {
    for a_first in [true, false] {
        let mut a = side();
        let mut b = side();
        let (ab, b_key) = connect(&a, &b, 1);
        let (ba, a_key) = connect(&b, &a, 1);
        wait_connections(&a, &b, 0, 1);
        // A PUT, a GET of the same bytes and a FLUSH.
        let ops = |ep: EndpointId, ours: &RegisteredBuf, peer: &RegisteredBuf, key| {
            [
                Sqe::put(ep.as_raw(), ours.local(0), remote(peer, key, 0), 64),
                Sqe::get(ep.as_raw(), ours.local(64), remote(peer, key, 0), 64),
                Sqe::flush(ep.as_raw()),
            ]
        };
        let put_ab = ops(ab, &a.local, &b.window, b_key);
        let put_ba = ops(ba, &b.local, &a.window, a_key);
        let close_ab = [Sqe::close(ab.as_raw(), CloseMode::GRACEFUL)];
        let close_ba = [Sqe::close(ba.as_raw(), CloseMode::GRACEFUL)];
        if a_first {
            run_both(&mut a, &close_ab, &mut b, &[]);
            for _ in 0..50 {
                run_both(&mut a, &[], &mut b, &put_ba);
            }
            wait_connections(&a, &b, 0, 1);
            run_both(&mut a, &[], &mut b, &close_ba);
        } else {
            run_both(&mut a, &[], &mut b, &close_ba);
            for _ in 0..50 {
                run_both(&mut a, &put_ab, &mut b, &[]);
            }
            wait_connections(&a, &b, 0, 1);
            run_both(&mut a, &close_ab, &mut b, &[]);
        }
        wait_connections(&a, &b, 0, 0);
    }
}

/// An endpoint whose adopted connection is closed by the peer before the
/// peer saw its HELLO still comes up, on a connection of its own: the
/// peer closes its endpoint, and right after, without the peer having
/// been progressed, this side connects back.
#[test]
fn an_endpoint_comes_up_when_the_connection_it_took_goes_away() {
    for _ in 0..20 {
        let mut a = side();
        let mut b = side();
        let (ab, _) = connect(&a, &b, 1);
        // a closes; b has not seen the hang-up when it connects back.
        let close = [Sqe::close(ab.as_raw(), CloseMode::FORCE)];
        a.qp.push_batch(&close).unwrap();
        a.qp.submit();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut got = [Cqe::default(); 4];
        while a.qp.reap(&mut got).unwrap() == 0 {
            a.w.progress();
            assert!(Instant::now() < deadline);
        }
        let (ba, a_key) = connect(&b, &a, 1);
        b.local.store_u64(0, 77);
        let put = [
            Sqe::put(
                ba.as_raw(),
                b.local.local(0),
                remote(&a.window, a_key, 8),
                8,
            ),
            Sqe::flush(ba.as_raw()),
        ];
        run_both(&mut a, &[], &mut b, &put);
        assert_eq!(a.window.load_u64(8), 77);
    }
}

/// A window deregistered while its GET data is still being sent straight
/// from it (a peer that does not take the data): deregistration returns at
/// once and the worker keeps the memory while the send may read it; once
/// the timeout has passed the connection closes, and the memory is
/// released only when the kernel no longer reads it. The peer's GET fails
/// once; nothing hangs.
#[test]
fn a_window_deregistered_under_a_get_waits_for_its_send() {
    let quick = || Tcp::builder().ignore_env().timeout(Duration::from_secs(1));
    let a = side_with(quick());
    let mut b = side_with(quick());
    let (_ab, _) = connect(&a, &b, 1);
    let (ba, a_key) = connect(&b, &a, 1);
    wait_connections(&a, &b, 0, 1);
    // More than the sockets hold while b does not progress.
    let get = [Sqe::get(
        ba.as_raw(),
        b.local.local(0),
        remote(&a.window, a_key, 0),
        LEN as u32,
    )];
    b.qp.push_batch(&get).unwrap();
    b.qp.submit();
    // b sends the GET; a answers it, and from then on b does not progress:
    // a's send stalls on b's full socket.
    for _ in 0..3 {
        b.w.progress();
    }
    for _ in 0..50 {
        a.w.progress();
    }
    a.w.deregister(a.window.handle()).unwrap();
    assert_eq!(
        a.w.unreleased_memory().pending,
        1,
        "released while a send reads it"
    );
    // a alone progresses: released only after closing the connection whose
    // send still read the window (b has taken nothing since).
    let deadline = Instant::now() + Duration::from_secs(60);
    while a.w.unreleased_memory().pending > 0 {
        a.w.progress();
        assert!(Instant::now() < deadline, "never released");
        std::thread::yield_now();
    }
    assert_eq!(connections_to(b.port), 0, "the window was left to a send");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = [Cqe::default(); 4];
    let n = loop {
        b.w.progress();
        a.w.progress();
        let n = b.qp.reap(&mut got).unwrap();
        if n > 0 {
            break n;
        }
        assert!(Instant::now() < deadline, "the GET never completed");
        std::thread::yield_now();
    };
    assert_eq!(n, 1);
    assert!(got[0].res < 0, "{:?}", got[0]);
}

/// A GET and a PUT over its bytes that a sent before it knew the
/// connection would carry requests both ways (b takes it over while they
/// are on the wire): b answers that GET from staging as before, so it
/// still returns the data from before the PUT.
#[test]
fn a_get_sent_before_the_takeover_keeps_its_order() {
    for round in 1..=10u8 {
        let mut a = side();
        let b = side();
        let (ab, b_key) = connect(&a, &b, 1);
        const SPAN: usize = 1 << 20;
        b.window.write(0, &vec![round; SPAN]);
        a.local.write(SPAN, &vec![!round; SPAN]);
        let sqes = get_then_put(ab, &a.local, &b.window, b_key, SPAN);
        a.qp.push_batch(&sqes).unwrap();
        a.qp.submit();
        // a sends both; b has not read them when it takes the connection.
        for _ in 0..10 {
            a.w.progress();
        }
        let _back = b.w.connect_lanes(a.w.address(), &[("tcp", 1)]).unwrap();
        // The GET, the PUT and a FLUSH after them.
        let mut b = b;
        let flush = [Sqe::flush(ab.as_raw())];
        let (done, _) = run_both(&mut a, &flush, &mut b, &[]);
        let mut cqes = done.len();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut more = [Cqe::default(); 4];
        while cqes < 3 {
            a.w.progress();
            b.w.progress();
            let n = a.qp.reap(&mut more).unwrap();
            assert!(more[..n].iter().all(|c| c.res >= 0), "{more:?}");
            cqes += n;
            assert!(Instant::now() < deadline, "{cqes} of 3 completions");
        }
        let mut got = vec![0u8; SPAN];
        a.local.read(0, &mut got);
        assert!(
            got.iter().all(|&x| x == round),
            "round {round}: the GET saw the PUT after it"
        );
    }
}

/// b takes over a's connection while a's PUTs stream on it and b has not
/// read them (a's batches are full): a holds its HELLO_ACK until the room
/// kept for answers is free, and then both sides' operations complete,
/// every byte in place.
#[test]
fn a_takeover_in_the_middle_of_a_stream_comes_up() {
    const MIB: usize = 1 << 20;
    let mut a = side();
    let b = side();
    let (ab, b_key) = connect(&a, &b, 1);
    let data: Vec<u8> = (0..16 * MIB).map(|i| (i % 251) as u8).collect();
    a.local.write(0, &data);
    // 16 MiB sent from a's memory fill b's socket; 4 KiB PUTs (staged)
    // behind them fill a's send batches.
    const SMALL: usize = 4096;
    let big = (0..16u64).map(|i| (i * MIB as u64, MIB));
    let small = (0..64u64).map(|i| (i * SMALL as u64, SMALL));
    let puts: Vec<Sqe> = big
        .chain(small)
        .map(|(off, len)| {
            Sqe::put(
                ab.as_raw(),
                a.local.local(off),
                remote(&b.window, b_key, off),
                len as u32,
            )
        })
        .chain(std::iter::once(Sqe::flush(ab.as_raw())))
        .collect();
    a.qp.push_batch(&puts).unwrap();
    a.qp.submit();
    // a streams; b does not read.
    for _ in 0..20 {
        a.w.progress();
    }
    let ba = b.w.connect_lanes(a.w.address(), &[("tcp", 1)]).unwrap();
    let mut b = b;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut done = 0;
    let mut got = [Cqe::default(); 32];
    while done < puts.len() || b.w.endpoint_state(ba).unwrap() == EndpointState::Connecting {
        a.w.progress();
        b.w.progress();
        let n = a.qp.reap(&mut got).unwrap();
        assert!(got[..n].iter().all(|c| c.res >= 0), "{:?}", &got[..n]);
        done += n;
        assert!(
            Instant::now() < deadline,
            "{done} of {} completions",
            puts.len()
        );
        std::thread::yield_now();
    }
    assert_eq!(b.w.endpoint_state(ba).unwrap(), EndpointState::Connected);
    let mut landed = vec![0u8; 16 * MIB];
    b.window.read(0, &mut landed);
    assert!(landed == data, "a's PUTs");
    // b's endpoint works over the connection it took.
    let blob = a.w.pack_rkey(a.window.handle()).unwrap();
    let a_key = b.w.unpack_rkey(ba, &blob).unwrap();
    b.local.store_u64(0, 99);
    let put = [
        Sqe::put(
            ba.as_raw(),
            b.local.local(0),
            remote(&a.window, a_key, 0),
            8,
        ),
        Sqe::flush(ba.as_raw()),
    ];
    run_both(&mut a, &[], &mut b, &put);
    assert_eq!(a.window.load_u64(0), 99);
    assert_eq!(connections_to(a.port), 0);
}
