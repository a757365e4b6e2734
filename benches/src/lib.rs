//! Criterion benchmarks for ringfence live in `benches/benches/`; this
//! library holds what several of them share: the peer process of the
//! two-process driver benches (`shm`, `tcp`).
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
