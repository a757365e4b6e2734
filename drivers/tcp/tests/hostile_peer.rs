//! A peer that does not follow the protocol, on a real socket to a worker's
//! tcp driver: requests with a wrong key, a wrong secret or an address
//! outside the window fail with their own status and the connection goes
//! on; a malformed header, an oversized frame, a request before HELLO or a
//! stream cut inside a frame closes that connection. Through all of it no
//! byte outside (or, refused, inside) the window is written, and the worker
//! keeps serving a well-behaved initiator.

use ringfence::{Cqe, EndpointState, Worker};
use ringfence_ring::{RemoteBuf, Sqe, Status};
use ringfence_tcp::Tcp;
use ringfence_tcp::wire::{Address, HEADER_LEN, Header, KEY_LEN, KeyBlob, Opcode};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const WINDOW: usize = 4096;
/// Registered bytes on each side of the window, which no request may
/// reach.
const GUARD: usize = 4096;
/// Only catches a hang.
const HANG: Duration = Duration::from_secs(60);

fn worker() -> Worker {
    Worker::builder()
        .driver(Tcp::builder().ignore_env().build().unwrap())
        .ignore_env()
        .build()
        .unwrap()
}

/// The tcp part of a worker address.
fn tcp_address(worker: &Worker) -> Address {
    let a = worker.address();
    let at = a
        .windows(4)
        .position(|w| w == b"\x03tcp")
        .expect("a tcp part");
    let len = u16::from_le_bytes([a[at + 4], a[at + 5]]) as usize;
    Address::decode(&a[at + 6..at + 6 + len]).expect("the tcp part decodes")
}

/// The tcp driver's key inside a packed key: the `KEY_LEN` bytes that decode to
/// a key over exactly `base..base + len`.
fn tcp_key(blob: &[u8], base: u64, len: u64) -> KeyBlob {
    blob.windows(KEY_LEN)
        .filter_map(KeyBlob::decode)
        .find(|k| k.base == base && k.len == len)
        .expect("the tcp key in the packed key")
}

/// A raw connection to the target, run while the target's core thread
/// serves it.
struct Raw {
    s: TcpStream,
}

impl Raw {
    fn connect(to: &Address) -> Raw {
        let s = TcpStream::connect(to.socket).unwrap();
        s.set_read_timeout(Some(HANG)).unwrap();
        s.set_nodelay(true).unwrap();
        Raw { s }
    }

    fn send(&mut self, h: &Header, payload: &[u8]) {
        let mut frame = h.encode().to_vec();
        frame.extend_from_slice(payload);
        self.s.write_all(&frame).unwrap();
    }

    fn hello(&mut self, instance: u64) {
        let hello = Header {
            arg: 1,
            seq: 0x1111,
            operand: instance,
            ..Header::new(Opcode::Hello, 0)
        };
        self.send(&hello, &[]);
        let ack = self.answer().expect("a HELLO_ACK");
        assert_eq!((ack.opcode, ack.status), (Opcode::HelloAck, 0));
    }

    /// The next frame header (and its payload, skipped); `None` when the
    /// target closed the connection.
    fn answer(&mut self) -> Option<Header> {
        let mut b = [0u8; HEADER_LEN];
        match self.s.read_exact(&mut b) {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset
                ) =>
            {
                return None;
            }
            Err(e) => panic!("reading an answer: {e}"),
        }
        let h = Header::decode(&b, u32::MAX).expect("the target sends well-formed frames");
        if h.opcode.has_payload() {
            let mut skip = vec![0u8; h.len as usize];
            self.s.read_exact(&mut skip).unwrap();
        }
        Some(h)
    }

    /// The target closes this connection (reads end with EOF or a reset).
    fn expect_closed(&mut self) {
        let mut b = [0u8; 256];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return,
                // Answers to what came before the bad frame.
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
                Err(e) => panic!("the target did not close the connection: {e}"),
            }
        }
    }
}

#[test]
fn requests_a_peer_gets_wrong_fail_alone_and_malformed_frames_close_only_their_connection() {
    let mut target = worker();
    // Guard, window, guard: one registration around the window would let
    // a window-relative check pass; three keep the window's bounds exact.
    let below = target.alloc_registered(GUARD).unwrap();
    let window = target.alloc_registered(WINDOW).unwrap();
    let above = target.alloc_registered(GUARD).unwrap();
    for (buf, byte) in [(&below, 0xb1u8), (&window, 0u8), (&above, 0xa6)] {
        buf.write(0, &vec![byte; buf.len()]);
    }
    let addr = tcp_address(&target);
    let packed = target.pack_rkey(window.handle()).unwrap();
    let key = tcp_key(&packed, window.addr(), WINDOW as u64);
    target.start_core_thread(None).unwrap();

    let put = |addr: u64, len: u32, key_id: u32, secret: u64, seq: u64| Header {
        len,
        seq,
        key: key_id,
        secret,
        addr,
        ..Header::new(Opcode::Put, 0)
    };
    let base = window.addr();

    // Refused requests: each answered with its own status, in order, and
    // the connection goes on.
    let mut raw = Raw::connect(&addr);
    raw.hello(addr.instance);
    let refused: [(Header, Status); 5] = [
        (
            put(base, 8, key.key, key.secret ^ 1, 1),
            Status::AccessDenied,
        ),
        (
            put(base, 8, key.key + 100, key.secret, 2),
            Status::AccessDenied,
        ),
        (
            put(base + WINDOW as u64 - 4, 8, key.key, key.secret, 3),
            Status::OutOfBounds,
        ),
        (
            put(base - 8, 8, key.key, key.secret, 4),
            Status::OutOfBounds,
        ),
        (
            put(u64::MAX - 3, 8, key.key, key.secret, 5),
            Status::OutOfBounds,
        ),
    ];
    for (i, (h, status)) in refused.iter().enumerate() {
        raw.send(h, &[0xee; 8]);
        let a = raw.answer().expect("an answer");
        assert_eq!(
            (a.opcode, a.seq, a.result()),
            (Opcode::Ack, h.seq, Err(*status)),
            "request {i}"
        );
    }
    // A GET past the end: its own status, no data.
    let get = Header {
        len: 16,
        seq: 6,
        key: key.key,
        secret: key.secret,
        addr: base + WINDOW as u64 - 8,
        ..Header::new(Opcode::Get, 0)
    };
    raw.send(&get, &[]);
    let a = raw.answer().expect("an answer");
    assert_eq!((a.opcode, a.seq, a.len), (Opcode::GetData, 6, 0));
    assert_eq!(a.result(), Err(Status::OutOfBounds));
    // A good PUT still works on the same connection.
    raw.send(
        &put(base + 64, 8, key.key, key.secret, 7),
        &7u64.to_le_bytes(),
    );
    let a = raw.answer().expect("an answer");
    assert_eq!((a.opcode, a.seq, a.status), (Opcode::Ack, 7, 0));
    assert_eq!(window.load_u64(64), 7);

    // Framing errors: the connection closes.
    let bad_version = {
        let mut b = put(base, 8, key.key, key.secret, 8).encode();
        b[0] = 9;
        b
    };
    let bad_opcode = {
        let mut b = put(base, 8, key.key, key.secret, 8).encode();
        b[1] = 0x77;
        b
    };
    let reserved = {
        let mut b = put(base, 8, key.key, key.secret, 8).encode();
        b[40] = 1; // operand of a PUT
        b
    };
    let oversized = put(base, u32::MAX, key.key, key.secret, 8).encode();
    let response = Header::new(Opcode::Ack, 0).encode();
    let mut cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("bad version", bad_version.to_vec(), true),
        ("bad opcode", bad_opcode.to_vec(), true),
        ("reserved field", reserved.to_vec(), true),
        ("oversized", oversized.to_vec(), true),
        ("a response sent to a target", response.to_vec(), true),
        ("garbage", vec![0xff; 200], true),
    ];
    // A request before HELLO.
    cases.push((
        "no hello",
        put(base, 8, key.key, key.secret, 1).encode().to_vec(),
        false,
    ));
    // BYE out of turn (before HELLO), and BYE on a connection that carries
    // nothing of the worker's own: it closes (what follows is not read).
    let bye = Header::new(Opcode::Bye, 0).encode().to_vec();
    cases.push(("a BYE before HELLO", bye.clone(), false));
    cases.push(("a second BYE", [bye.clone(), bye.clone()].concat(), true));
    cases.push((
        "BYE, then a request",
        [
            bye.clone(),
            put(base, 8, key.key, key.secret, 1).encode().to_vec(),
        ]
        .concat(),
        true,
    ));
    for (name, bytes, greet) in cases {
        let mut raw = Raw::connect(&addr);
        if greet {
            raw.hello(addr.instance);
        }
        raw.s.write_all(&bytes).unwrap();
        raw.expect_closed();
        eprintln!("{name}: closed");
    }
    // A HELLO for another worker instance: refused in the HELLO_ACK.
    let mut raw = Raw::connect(&addr);
    let hello = Header {
        arg: 1,
        operand: addr.instance ^ 1,
        ..Header::new(Opcode::Hello, 0)
    };
    raw.send(&hello, &[]);
    let a = raw.answer().expect("a HELLO_ACK");
    assert_eq!(a.opcode, Opcode::HelloAck);
    assert_eq!(a.result(), Err(Status::PeerUnreachable));
    // A stream cut inside a PUT's payload: the bytes that came may land in
    // the window (they passed the checks), nothing beyond it.
    let mut raw = Raw::connect(&addr);
    raw.hello(addr.instance);
    raw.send(&put(base + 128, 64, key.key, key.secret, 1), &[0x5a; 10]);
    raw.s.shutdown(std::net::Shutdown::Write).unwrap();
    raw.expect_closed();

    // A well-behaved initiator is served as before.
    let initiator = worker();
    let ep = initiator.connect(target.address()).unwrap();
    let deadline = Instant::now() + HANG;
    while initiator.endpoint_state(ep).unwrap() == EndpointState::Connecting {
        initiator.progress();
        assert!(Instant::now() < deadline, "connect hung");
        std::thread::yield_now();
    }
    let rkey = initiator.unpack_rkey(ep, &packed).unwrap();
    let src = initiator.alloc_registered(WINDOW).unwrap();
    src.write(0, &[0x42; 32]);
    let mut qp = initiator.create_queue().unwrap();
    let remote = RemoteBuf {
        rkey: rkey.as_raw(),
        addr: base + 1024,
    };
    qp.push(Sqe::put(ep.as_raw(), src.local(0), remote, 32).with_user_data(1))
        .unwrap();
    qp.push(Sqe::flush(ep.as_raw()).with_user_data(2)).unwrap();
    qp.submit();
    let mut got = Vec::new();
    while got.len() < 2 {
        initiator.progress();
        let mut c = [Cqe::default(); 4];
        let n = qp.reap(&mut c).unwrap();
        got.extend(c[..n].iter().map(|c| (c.user_data, c.res)));
        assert!(Instant::now() < deadline, "the good initiator hung");
        std::thread::yield_now();
    }
    assert_eq!(got, [(1, 32), (2, 0)]);

    // Every byte where it should be: the guards untouched, the window
    // written only where accepted requests wrote.
    target.stop_core_thread();
    for (buf, byte) in [(&below, 0xb1u8), (&above, 0xa6)] {
        let mut b = vec![0u8; buf.len()];
        buf.read(0, &mut b);
        assert!(b.iter().all(|&x| x == byte), "a guard was written");
    }
    let mut w = vec![0u8; WINDOW];
    window.read(0, &mut w);
    for (i, &b) in w.iter().enumerate() {
        let expected = match i {
            64..72 => 7u64.to_le_bytes()[i - 64],
            128..138 => w[i], // the cut PUT's bytes, if they landed
            1024..1056 => 0x42,
            _ => 0,
        };
        assert_eq!(b, expected, "window byte {i}");
    }
    assert!(w[128..138].iter().all(|&b| b == 0 || b == 0x5a));
}

/// A large PUT a peer has sent half of when its window is deregistered.
const BIG: usize = 1 << 20;
const HALF: usize = BIG / 2;

/// Byte `i` of the large PUT's payload (never zero).
fn pattern(i: usize) -> u8 {
    (i % 251) as u8 + 1
}

/// A target progressed by the test (no core thread) with a 1 s timeout,
/// its `BIG`-byte window, and a raw peer (on its own thread) that greets,
/// sends a PUT of the whole window with only its first half, and waits:
/// told `true` it sends the rest and reports the answer, told `false` it
/// sends nothing more and reports `None` once the target closed the
/// connection. The target is progressed until that first half has landed.
fn half_a_put() -> (
    Worker,
    ringfence::RegisteredBuf,
    std::sync::mpsc::Sender<bool>,
    std::sync::mpsc::Receiver<Option<Header>>,
) {
    let target = Worker::builder()
        .driver(
            Tcp::builder()
                .ignore_env()
                .timeout(Duration::from_secs(1))
                .build()
                .unwrap(),
        )
        .ignore_env()
        .build()
        .unwrap();
    let window = target.alloc_registered(BIG).unwrap();
    let addr = tcp_address(&target);
    let packed = target.pack_rkey(window.handle()).unwrap();
    let key = tcp_key(&packed, window.addr(), BIG as u64);
    let put = Header {
        len: BIG as u32,
        seq: 1,
        key: key.key,
        secret: key.secret,
        addr: window.addr(),
        ..Header::new(Opcode::Put, 0)
    };
    let payload: Vec<u8> = (0..BIG).map(pattern).collect();
    let (go, told) = std::sync::mpsc::channel::<bool>();
    let (answer, answered) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut raw = Raw::connect(&addr);
        raw.hello(addr.instance);
        raw.send(&put, &payload[..HALF]);
        if told.recv().unwrap() {
            raw.s.write_all(&payload[HALF..]).unwrap();
            let _ = answer.send(raw.answer());
        } else {
            raw.expect_closed();
            let _ = answer.send(None);
        }
    });
    let deadline = Instant::now() + HANG;
    let last = |w: &ringfence::RegisteredBuf| {
        let mut b = [0u8];
        w.read(HALF - 1, &mut b);
        b[0]
    };
    while last(&window) == 0 {
        target.progress();
        assert!(Instant::now() < deadline, "the first half never landed");
        std::thread::yield_now();
    }
    (target, window, go, answered)
}

/// The window of a PUT whose payload is still arriving (received straight
/// into it) is deregistered: the deregistration returns, and the worker
/// keeps the memory while the receive can still write; the rest of the
/// payload lands, the PUT succeeds, and only then is the memory released.
#[test]
fn a_window_deregistered_inside_a_put_is_kept_until_the_put_ends() {
    let (target, window, go, answered) = half_a_put();
    target.deregister(window.handle()).unwrap();
    assert_eq!(
        target.unreleased_memory().pending,
        1,
        "released while the PUT's receive can still write into it"
    );
    go.send(true).unwrap();
    let deadline = Instant::now() + HANG;
    let ack = loop {
        target.progress();
        if let Ok(a) = answered.try_recv() {
            break a.expect("an answer");
        }
        assert!(Instant::now() < deadline, "the PUT never ended");
        std::thread::yield_now();
    };
    assert_eq!(
        (ack.opcode, ack.seq, ack.result()),
        (Opcode::Ack, 1, Ok(()))
    );
    while target.unreleased_memory().pending > 0 {
        target.progress();
        assert!(Instant::now() < deadline, "never released");
        std::thread::yield_now();
    }
    assert_eq!(target.unreleased_memory().leaked, 0);
    let mut got = vec![0u8; BIG];
    window.read(0, &mut got);
    assert!(got.iter().enumerate().all(|(i, &b)| b == pattern(i)));
}

/// The same, with a peer that stops: it never sends the rest (nor reads).
/// The worker keeps the memory while the receive can still write; after
/// the timeout the connection closes, and the memory is released once
/// the canceled receive has ended, not before.
#[test]
fn a_window_deregistered_under_a_stalled_put_is_kept_until_its_receive_ended() {
    let (target, window, go, answered) = half_a_put();
    target.deregister(window.handle()).unwrap();
    assert_eq!(
        target.unreleased_memory().pending,
        1,
        "released while the PUT's receive can still write into it"
    );
    go.send(false).unwrap();
    let deadline = Instant::now() + HANG;
    while target.unreleased_memory().pending > 0 {
        target.progress();
        assert!(Instant::now() < deadline, "never released");
        std::thread::yield_now();
    }
    assert_eq!(target.unreleased_memory().leaked, 0);
    assert_eq!(answered.recv_timeout(HANG).unwrap(), None, "closed");
}
