//! Plain send against zero-copy send (`IORING_OP_SEND_ZC`) on a loopback
//! TCP connection, through io_uring as the tcp driver sends: the
//! measurement behind the driver's choice of plain `sendmsg` for large PUT
//! payloads (sent from registered memory without a user-space copy, the
//! kernel copying once into its socket buffers).
//!
//! A receiver thread drains the connection with blocking reads. The sender
//! keeps up to `DEPTH` sends in flight, each from its own region of a
//! buffer; a region is free again when its send completed and, for
//! zero-copy, when the kernel's notification (`IORING_CQE_F_NOTIF`) says
//! it let go of the pages, which is what the driver would have to wait for
//! before completing a PUT whose payload went out that way. Groups:
//! `loopback_send/{plain,zerocopy}/{65536,1048576}`, throughput in bytes.
//!
//! Run: `cargo bench -p ringfence-benches --bench tcp_send`.

use criterion::{BenchmarkId, Criterion, Throughput};
use io_uring::{IoUring, cqueue, opcode, types};
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Instant;

/// Sends in flight at most.
const DEPTH: usize = 4;
const SIZES: [usize; 2] = [64 << 10, 1 << 20];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    ZeroCopy,
}

/// One region's send: bytes still to send, and whether its zero-copy
/// notification is still to come.
#[derive(Clone, Copy, Default)]
struct Slot {
    left: usize,
    notif: bool,
}

struct Sender {
    ring: IoUring,
    socket: TcpStream,
    buf: Vec<u8>,
    slots: [Slot; DEPTH],
}

impl Sender {
    fn push(&mut self, mode: Mode, slot: usize, len: usize) {
        let off = slot * SIZES[1] + (len - self.slots[slot].left);
        let ptr = self.buf[off..].as_ptr();
        let left = self.slots[slot].left as u32;
        let fd = types::Fd(self.socket.as_raw_fd());
        let flags = nix::libc::MSG_WAITALL | nix::libc::MSG_NOSIGNAL;
        let entry = match mode {
            Mode::Plain => opcode::Send::new(fd, ptr, left).flags(flags).build(),
            Mode::ZeroCopy => opcode::SendZc::new(fd, ptr, left).flags(flags).build(),
        }
        .user_data(slot as u64);
        // SAFETY: the region stays allocated and untouched until its send
        // (and, for zero-copy, its notification) completed: `self.buf`
        // lives as long as the ring's requests, which `send` waits out.
        unsafe { self.ring.submission().push(&entry) }.expect("SQ room: DEPTH < entries");
    }

    /// `count` sends of `len` bytes, at most `DEPTH` in flight; returns
    /// when every one has completed (and been released, for zero-copy).
    fn send(&mut self, mode: Mode, count: u64, len: usize) {
        let (mut started, mut busy) = (0u64, 0usize);
        loop {
            for slot in 0..DEPTH {
                let s = &mut self.slots[slot];
                if started < count && s.left == 0 && !s.notif {
                    *s = Slot {
                        left: len,
                        notif: false,
                    };
                    self.push(mode, slot, len);
                    started += 1;
                    busy += 1;
                }
            }
            if busy == 0 {
                return;
            }
            self.ring.submit_and_wait(1).expect("io_uring_enter");
            let mut done = [(0u64, 0i32, 0u32); 2 * DEPTH];
            let mut n = 0;
            for c in self.ring.completion().take(done.len()) {
                done[n] = (c.user_data(), c.result(), c.flags());
                n += 1;
            }
            for &(slot, res, flags) in &done[..n] {
                let slot = slot as usize;
                if cqueue::notif(flags) {
                    self.slots[slot].notif = false;
                    if self.slots[slot].left == 0 {
                        busy -= 1;
                    }
                    continue;
                }
                assert!(res >= 0, "send failed: {res}");
                let s = &mut self.slots[slot];
                if cqueue::more(flags) {
                    s.notif = true;
                }
                s.left -= res as usize;
                if s.left > 0 {
                    // Short send (MSG_WAITALL gave up): the rest.
                    self.push(mode, slot, len);
                } else if !s.notif {
                    busy -= 1;
                }
            }
        }
    }
}

impl Sender {
    /// Whether this kernel takes `SEND_ZC` on a TCP socket (5.19 and
    /// later): one byte sent, its completion and notification awaited.
    fn zerocopy_works(&mut self) -> bool {
        let fd = types::Fd(self.socket.as_raw_fd());
        let entry = opcode::SendZc::new(fd, self.buf.as_ptr(), 1)
            .build()
            .user_data(u64::MAX);
        // SAFETY: `self.buf` outlives the request, which is waited out here.
        unsafe { self.ring.submission().push(&entry) }.expect("an empty SQ");
        let (mut result, mut pending) = (None, true);
        while pending {
            self.ring.submit_and_wait(1).expect("io_uring_enter");
            for c in self.ring.completion() {
                if cqueue::notif(c.flags()) {
                    pending = false;
                } else {
                    result = Some(c.result());
                    pending = cqueue::more(c.flags());
                }
            }
        }
        result.is_some_and(|r| r == 1)
    }
}

fn main() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let socket = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    socket.set_nodelay(true).unwrap();
    let (mut peer, _) = listener.accept().unwrap();
    let receiver = std::thread::spawn(move || {
        let mut sink = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            match peer.read(&mut sink) {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n as u64,
            }
        }
    });
    let mut sender = Sender {
        ring: IoUring::new(64).unwrap(),
        socket,
        buf: (0..DEPTH * SIZES[1]).map(|i| i as u8).collect(),
        slots: [Slot::default(); DEPTH],
    };
    let zerocopy = sender.zerocopy_works();
    let mut sent = u64::from(zerocopy);
    if !zerocopy {
        println!("loopback_send/zerocopy skipped: this kernel refuses IORING_OP_SEND_ZC on TCP");
    }
    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("loopback_send");
    for len in SIZES {
        group.throughput(Throughput::Bytes(len as u64));
        for (name, mode) in [("plain", Mode::Plain), ("zerocopy", Mode::ZeroCopy)] {
            if mode == Mode::ZeroCopy && !zerocopy {
                continue;
            }
            group.bench_function(BenchmarkId::new(name, len), |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    sender.send(mode, iters, len);
                    sent += iters * len as u64;
                    start.elapsed()
                })
            });
        }
    }
    group.finish();
    c.final_summary();
    drop(sender);
    // Every byte sent arrived.
    assert_eq!(receiver.join().unwrap(), sent);
}
