//! Criterion benchmarks for ringfence live in `benches/benches/`; this
//! library holds what the two-process driver benches (`shm`, `tcp`)
//! share: the peer process, and the initiator's link to its window.
#![deny(missing_docs)]

pub mod peer {
    //! A bench binary that re-executes itself as its peer process: the
    //! environment variable a bench names carries the peer's role, and a
    //! socket pair on the peer's standard input carries length-prefixed
    //! byte strings (worker addresses, keys, window addresses) and single
    //! bytes ("go on") both ways.

    use std::io::{Read, Write};
    use std::os::fd::{AsFd, OwnedFd};
    use std::os::unix::net::UnixStream;
    use std::process::{Child, Command, Stdio};

    /// Sends `bytes`, prefixed with its length (a little-endian `u32`).
    ///
    /// # Panics
    /// If the socket fails: the bench cannot go on.
    pub fn send(s: &mut UnixStream, bytes: &[u8]) {
        s.write_all(&(bytes.len() as u32).to_le_bytes()).unwrap();
        s.write_all(bytes).unwrap();
    }

    /// Receives what [`send`] sent.
    ///
    /// # Panics
    /// If the socket fails or closes.
    pub fn recv(s: &mut UnixStream) -> Vec<u8> {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut out = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut out).unwrap();
        out
    }

    /// The peer process, killed and reaped on drop.
    #[derive(Debug)]
    pub struct Peer {
        process: Child,
        /// This side of the socket pair.
        pub socket: UnixStream,
    }

    impl Peer {
        /// Runs this bench binary again with `role` in `role_env`.
        ///
        /// # Panics
        /// If the process cannot be spawned.
        pub fn spawn(role_env: &str, role: &str) -> Peer {
            let (socket, theirs) = UnixStream::pair().unwrap();
            let process = Command::new(std::env::current_exe().unwrap())
                .env(role_env, role)
                .stdin(Stdio::from(OwnedFd::from(theirs)))
                .stdout(Stdio::null())
                .spawn()
                .expect("spawning the peer process");
            Peer { process, socket }
        }
    }

    impl Drop for Peer {
        fn drop(&mut self) {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }

    /// In the peer process: its end of the socket pair (standard input).
    ///
    /// # Panics
    /// If standard input cannot be duplicated.
    pub fn socket_of_peer() -> UnixStream {
        let stdin = std::io::stdin().lock();
        UnixStream::from(stdin.as_fd().try_clone_to_owned().unwrap())
    }
}

pub mod link {
    //! The initiator side of the two-process driver benches: one worker,
    //! one queue pair and one endpoint to the peer's window, and the loops
    //! the benches time (PUT streams closed by a FLUSH, an 8-byte
    //! ping-pong PUT) or check (PUT, then GET back).

    use ringfence::{EndpointId, QueuePair, RegisteredBuf, RkeyId, Worker};
    use ringfence_ring::{Cqe, RemoteBuf, Sqe, SqeFlags};
    use std::hint::spin_loop;
    use std::time::{Duration, Instant};

    /// PUTs pushed per submit.
    pub const BATCH: usize = 32;
    /// Only catches a hang.
    pub const HANG: Duration = Duration::from_secs(120);

    /// One idle round of a ping-pong wait, the `spins`-th: spin first (an
    /// answer normally comes within a few thousand spins), then yield, so
    /// that when both processes land on one vCPU (anything else running on
    /// a two-vCPU machine) a round trip costs a yield, not a scheduler
    /// time slice.
    pub fn pause(spins: u64) {
        if spins < 4096 {
            spin_loop();
        } else {
            std::thread::yield_now();
        }
    }

    /// An initiator connected to a peer's window.
    #[derive(Debug)]
    pub struct Link {
        /// The initiator's worker.
        pub worker: Worker,
        /// Its queue pair.
        pub qp: QueuePair,
        /// PUT sources and GET destinations.
        pub src: RegisteredBuf,
        /// The start of the peer's window.
        pub remote: RemoteBuf,
        /// The endpoint, raw.
        pub ep: u32,
        /// The ping-pong's PUT: the first 8 bytes of `src` to the start of
        /// the peer's window (built once, as `ucx_perftest` builds its
        /// parameters).
        pub put8: Sqe,
    }

    impl Link {
        /// A link over the connected endpoint `ep` of `worker` to the
        /// window at `base` under `rkey`, with a source buffer of
        /// `src_len` bytes.
        ///
        /// # Panics
        /// If the buffer or the queue pair cannot be made.
        pub fn new(
            worker: Worker,
            ep: EndpointId,
            rkey: RkeyId,
            base: u64,
            src_len: usize,
        ) -> Link {
            let src = worker.alloc_registered(src_len).unwrap();
            let qp = worker.create_queue().unwrap();
            let remote = RemoteBuf {
                rkey: rkey.as_raw(),
                addr: base,
            };
            let put8 =
                Sqe::put(ep.as_raw(), src.local(0), remote, 8).with_flags(SqeFlags::SKIP_SUCCESS);
            Link {
                worker,
                qp,
                src,
                remote,
                ep: ep.as_raw(),
                put8,
            }
        }

        /// Runs progress until one CQE comes; returns it.
        ///
        /// # Panics
        /// If none comes within [`HANG`].
        pub fn one_cqe(&mut self) -> Cqe {
            let deadline = Instant::now() + HANG;
            loop {
                self.worker.progress();
                if let Some(c) = self.qp.pop().unwrap() {
                    return c;
                }
                assert!(Instant::now() < deadline, "no completion");
                spin_loop();
            }
        }

        /// Pushes `sqe`, submitting and progressing while the SQ is full.
        pub fn push(&mut self, sqe: Sqe) {
            while self.qp.push(sqe).is_err() {
                self.qp.submit();
                self.worker.progress();
            }
        }

        /// `count` PUTs of `len` bytes from offset 0 of `src` to the start
        /// of the window, all SKIP_SUCCESS, pushed [`BATCH`] at a time with
        /// a progress round after each submit, then a FLUSH that must be the
        /// only CQE.
        ///
        /// # Panics
        /// If a PUT failed.
        pub fn puts(&mut self, count: u64, len: usize) {
            let put = Sqe::put(self.ep, self.src.local(0), self.remote, len as u32)
                .with_flags(SqeFlags::SKIP_SUCCESS);
            let batch = [put; BATCH];
            let mut left = count;
            while left > 0 {
                let n = self
                    .qp
                    .push_batch(&batch[..left.min(BATCH as u64) as usize])
                    .unwrap();
                self.qp.submit();
                self.worker.progress();
                left -= n as u64;
            }
            self.push(Sqe::flush(self.ep).with_user_data(u64::MAX));
            self.qp.submit();
            let c = self.one_cqe();
            assert_eq!((c.user_data, c.res), (u64::MAX, 0), "a PUT failed: {c:?}");
        }

        /// `rounds` PUTs of a pattern of `len` bytes, each read back with
        /// GET and compared. The PUT completes before the GET starts: on an
        /// endpoint of several lanes the two may take different lanes,
        /// which are not ordered with each other.
        ///
        /// # Panics
        /// If an operation failed or the bytes differ.
        pub fn check(&mut self, len: usize, rounds: u64) {
            for i in 0..rounds {
                let data: Vec<u8> = (0..len).map(|k| (k as u64 * 31 + i) as u8).collect();
                self.src.write(0, &data);
                for sqe in [
                    Sqe::put(self.ep, self.src.local(0), self.remote, len as u32),
                    Sqe::get(self.ep, self.src.local(len as u64), self.remote, len as u32),
                ] {
                    self.push(sqe);
                    self.qp.submit();
                    let c = self.one_cqe();
                    assert_eq!(c.res, len as i32, "{c:?}");
                }
                let mut back = vec![0u8; len];
                self.src.read(len, &mut back);
                assert!(back == data, "GET read other bytes than the PUT wrote");
            }
        }

        /// One 8-byte PUT of `seq` to the start of the peer's window: with
        /// `try_now` if `now` (through the ring if that declines), or
        /// pushed, submitted and run by one progress round.
        ///
        /// # Panics
        /// If `try_now` ran the PUT and it failed.
        pub fn put_seq(&mut self, seq: u64, now: bool) {
            self.src.store_u64(0, seq);
            let put = self.put8;
            if now && let Some(result) = self.qp.try_now(&put) {
                assert_eq!(result, Ok(8));
                return;
            }
            self.push(put);
            self.qp.submit();
            self.worker.progress();
        }
    }
}
