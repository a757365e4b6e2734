//! The floors under the tcp driver's 8-byte latency: a 64-byte ping-pong
//! (the size of an 8-byte PUT's frame) over one loopback TCP connection,
//! with no library in the way, through the two kernel interfaces there are.
//!
//! - `loopback_pingpong/syscalls`: each side busy-polls `recv` with
//!   `MSG_DONTWAIT`, then answers with `send` (what UCX's tcp transport
//!   does, through epoll).
//! - `loopback_pingpong/io_uring`: each side has its own ring set up as the
//!   driver's (cooperative task running, the task-run flag), keeps a
//!   one-shot `RECV` armed, answers with `SEND`, and enters the kernel only
//!   when the ring flags task work or it has something to submit, as the
//!   driver's `poll` and `commit` did before busy receives.
//! - `loopback_pingpong/io_uring_spin`: the same ring, with a nonblocking
//!   `RECV` (`MSG_DONTWAIT`) submitted on every empty spin, which completes
//!   inside its `io_uring_enter` (data or EAGAIN) and arms no poll: what
//!   the driver does while a connection awaits an answer (`SPIN_ROUNDS` in
//!   `drivers/tcp/src/driver.rs`).
//!
//! The time reported is one way (half a round trip), as `put_lat_8B` of the
//! `tcp` bench and `ucx_perftest` report it. The echoing side runs in a
//! thread; both spin, yielding after 4,096 idle spins (as the `tcp` bench's
//! peers do).
//!
//! Run: `cargo bench -p ringfence-benches --bench tcp_floor`.

use criterion::Criterion;
use io_uring::{IoUring, opcode, types};
use nix::libc;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Bytes per message: an 8-byte PUT's header and payload.
const MSG: usize = 64;

/// Spins, then yields once the wait grows long (`spins` so far).
fn pause(spins: u64) {
    if spins < 4096 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// A connected pair of loopback sockets, Nagle off.
fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    for s in [&a, &b] {
        s.set_nodelay(true).unwrap();
    }
    (a, b)
}

/// One side of the ping-pong.
trait Side: Send {
    /// Sends one message.
    fn send(&mut self);
    /// Waits for one message; `false` once the other side shut down.
    fn recv(&mut self) -> bool;
    /// The socket.
    fn socket(&self) -> &TcpStream;
}

/// Plain system calls: `recv(MSG_DONTWAIT)` polled, `send`.
struct Syscalls {
    s: TcpStream,
    buf: [u8; MSG],
}

impl Syscalls {
    fn new(s: TcpStream) -> Syscalls {
        s.set_nonblocking(true).unwrap();
        Syscalls { s, buf: [7; MSG] }
    }
}

impl Side for Syscalls {
    fn send(&mut self) {
        let msg = self.buf;
        let mut sent = 0;
        while sent < MSG {
            match self.s.write(&msg[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => panic!("send: {e}"),
            }
        }
    }

    fn socket(&self) -> &TcpStream {
        &self.s
    }

    fn recv(&mut self) -> bool {
        let (mut got, mut spins) = (0, 0u64);
        while got < MSG {
            match self.s.read(&mut self.buf[got..]) {
                Ok(0) => return false,
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    pause(spins);
                    spins += 1;
                }
                Err(e) => panic!("recv: {e}"),
            }
        }
        true
    }
}

/// How an io_uring side receives.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Receive {
    /// A one-shot `RECV` kept armed; the side enters only for task work
    /// or a submission (as the driver's `poll` and `commit` did before
    /// busy receives).
    Armed,
    /// A `RECV` with `MSG_DONTWAIT` submitted on every empty spin (it
    /// completes inline, data or `EAGAIN`; no poll is armed): what the
    /// driver does while a connection awaits an answer.
    Busy,
}

/// io_uring set up as the driver sets it up (cooperative task running,
/// the task-run flag), sending with `SEND`.
struct Uring {
    ring: IoUring,
    s: TcpStream,
    rbuf: Box<[u8; MSG]>,
    sbuf: Box<[u8; MSG]>,
    how: Receive,
    armed: bool,
}

const RECV: u64 = 1;
const SEND: u64 = 2;

impl Uring {
    fn new(s: TcpStream, how: Receive) -> Uring {
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(64)
            .unwrap();
        Uring {
            ring,
            s,
            rbuf: Box::new([0; MSG]),
            sbuf: Box::new([7; MSG]),
            how,
            armed: false,
        }
    }

    /// A `RECV` of the rest of a message, after `have` bytes of it.
    fn recv_entry(&mut self, have: usize, flags: i32) -> io_uring::squeue::Entry {
        let fd = types::Fd(self.s.as_raw_fd());
        let rest = self.rbuf[have..].as_mut_ptr();
        opcode::Recv::new(fd, rest, (MSG - have) as u32)
            .flags(flags)
            .build()
            .user_data(RECV)
    }

    fn push(&mut self, entry: &io_uring::squeue::Entry) {
        // SAFETY: the buffers entries name, `rbuf` and `sbuf`, are boxed
        // and live as long as the ring (dropped after it: field order),
        // which ends every request it holds.
        unsafe { self.ring.submission().push(entry) }.expect("SQ room");
    }

    fn arm(&mut self) {
        if self.armed {
            return;
        }
        let entry = self.recv_entry(0, libc::MSG_WAITALL);
        self.push(&entry);
        self.armed = true;
    }

    /// Receives with a `RECV` kept armed (`Receive::Armed`).
    fn recv_armed(&mut self) -> bool {
        if !self.armed {
            self.arm();
            self.ring.submit().unwrap();
        }
        let mut spins = 0u64;
        loop {
            let done = {
                let mut cq = self.ring.completion();
                cq.sync();
                let mut got = None;
                for c in cq {
                    if c.user_data() == RECV {
                        got = Some(c.result());
                    } else {
                        assert!(c.result() == MSG as i32, "send: {}", c.result());
                    }
                }
                got
            };
            if let Some(res) = done {
                self.armed = false;
                return res == MSG as i32;
            }
            if self.ring.submission().taskrun() {
                self.ring.submit().unwrap();
                continue;
            }
            pause(spins);
            spins += 1;
        }
    }

    /// Receives by busy receives (`Receive::Busy`).
    fn recv_busy(&mut self) -> bool {
        let mut have = 0usize;
        let mut spins = 0u64;
        loop {
            // Nonblocking: it completes inside this `submit`.
            let entry = self.recv_entry(have, libc::MSG_DONTWAIT);
            self.push(&entry);
            self.ring.submit().unwrap();
            let mut got = None;
            for c in self.ring.completion() {
                if c.user_data() == RECV {
                    got = Some(c.result());
                }
            }
            match got {
                Some(0) => return false,
                Some(n) if n > 0 => {
                    have += n as usize;
                    if have == MSG {
                        return true;
                    }
                }
                _ => {
                    pause(spins);
                    spins += 1;
                }
            }
        }
    }
}

impl Side for Uring {
    fn send(&mut self) {
        let fd = types::Fd(self.s.as_raw_fd());
        let entry = opcode::Send::new(fd, self.sbuf.as_ptr(), MSG as u32)
            .flags(libc::MSG_WAITALL)
            .build()
            .user_data(SEND);
        self.push(&entry);
        if self.how == Receive::Armed {
            self.arm();
        }
        self.ring.submit().unwrap();
    }

    fn socket(&self) -> &TcpStream {
        &self.s
    }

    fn recv(&mut self) -> bool {
        match self.how {
            Receive::Armed => self.recv_armed(),
            Receive::Busy => self.recv_busy(),
        }
    }
}

/// Times round trips of `ping` against `pong` echoing in a thread, one way
/// (half a round trip). The echo ends when `ping` shuts its socket down,
/// with no request of its ring left in flight.
fn bench(c: &mut Criterion, name: &str, mut ping: impl Side, mut pong: impl Side + 'static) {
    let echo = std::thread::spawn(move || {
        while pong.recv() {
            pong.send();
        }
    });
    let mut round_trip = || {
        ping.send();
        assert!(ping.recv(), "the echo side went away");
    };
    for _ in 0..1000 {
        round_trip();
    }
    c.benchmark_group("loopback_pingpong")
        .bench_function(name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    round_trip();
                }
                start.elapsed() / 2
            })
        });
    ping.socket().shutdown(Shutdown::Write).unwrap();
    echo.join().unwrap();
}

fn main() {
    let mut c = Criterion::default()
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let (a, b) = pair();
    bench(&mut c, "syscalls", Syscalls::new(a), Syscalls::new(b));
    let (a, b) = pair();
    bench(
        &mut c,
        "io_uring",
        Uring::new(a, Receive::Armed),
        Uring::new(b, Receive::Armed),
    );
    let (a, b) = pair();
    bench(
        &mut c,
        "io_uring_spin",
        Uring::new(a, Receive::Busy),
        Uring::new(b, Receive::Busy),
    );
    c.final_summary();
}
