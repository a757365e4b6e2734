//! Doorbells: eventfds that wake a sleeping consumer.
//!
//! Busy-polling is the default; a doorbell is only rung when the consumer
//! set `NEED_WAKEUP` (see [`Producer::needs_wakeup`](crate::Producer::needs_wakeup)),
//! so a consumer that never sleeps costs the producer no system call. An
//! eventfd rather than a futex on the index word: it can be passed to another
//! process with `SCM_RIGHTS` and put in `epoll`, which is what an application
//! that waits on its CQ wants.

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

/// An eventfd used as a ring's wake-up signal.
#[derive(Debug)]
pub struct Doorbell {
    /// A non-blocking eventfd; its counter is non-zero while rung.
    fd: OwnedFd,
}

impl Doorbell {
    /// A new, unrung doorbell (a non-blocking, close-on-exec eventfd).
    ///
    /// # Errors
    /// The eventfd could not be created (descriptor limit).
    pub fn new() -> io::Result<Doorbell> {
        let fd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        Ok(Doorbell { fd: fd.into() })
    }

    /// Wraps an eventfd received from another process. A descriptor that is
    /// not a non-blocking eventfd makes [`ring`](Doorbell::ring) and
    /// [`wait`](Doorbell::wait) fail with an error; it cannot cause anything
    /// worse.
    pub fn from_fd(fd: OwnedFd) -> Doorbell {
        Doorbell { fd }
    }

    /// Wakes the waiter (or the next one to wait).
    ///
    /// # Errors
    /// The write failed for a reason other than a saturated counter (which
    /// means it is rung already).
    pub fn ring(&self) -> io::Result<()> {
        match nix::unistd::write(&self.fd, &1u64.to_ne_bytes()) {
            Ok(_) | Err(Errno::EAGAIN) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Clears the doorbell; returns whether it had been rung.
    ///
    /// # Errors
    /// The read failed (not an eventfd, or not readable).
    pub fn clear(&self) -> io::Result<bool> {
        let mut buf = [0u8; 8];
        match nix::unistd::read(&self.fd, &mut buf) {
            Ok(8) => Ok(true),
            Ok(n) => Err(io::Error::other(format!(
                "eventfd read returned {n} bytes, not 8"
            ))),
            Err(Errno::EAGAIN) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Sleeps until the doorbell is rung or `timeout` passes (`None`: no
    /// limit), then clears it; returns whether it was rung.
    ///
    /// # Errors
    /// `poll` or the read failed.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let timeout = match timeout {
            None => PollTimeout::NONE,
            // Longer than poll can express (about 24 days): wait without limit.
            Some(d) => PollTimeout::try_from(d).unwrap_or(PollTimeout::MAX),
        };
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        loop {
            match nix::poll::poll(&mut fds, timeout) {
                Ok(0) => return Ok(false),
                Ok(_) => return self.clear(),
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Doorbell {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl From<Doorbell> for OwnedFd {
    fn from(bell: Doorbell) -> OwnedFd {
        bell.fd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "eventfd is a system call miri does not model")]
    fn ring_wait_and_clear() {
        let bell = Doorbell::new().unwrap();
        assert!(!bell.clear().unwrap());
        assert!(!bell.wait(Some(Duration::ZERO)).unwrap());
        bell.ring().unwrap();
        bell.ring().unwrap();
        assert!(bell.wait(Some(Duration::from_secs(60))).unwrap());
        // Two rings, one wake-up: the read cleared the counter.
        assert!(!bell.clear().unwrap());
        let raw = bell.as_raw_fd();
        let owned: OwnedFd = bell.into();
        assert_eq!(owned.as_raw_fd(), raw);
        let again = Doorbell::from_fd(owned);
        again.ring().unwrap();
        assert!(again.clear().unwrap());
    }

    #[test]
    #[cfg_attr(miri, ignore = "eventfd is a system call miri does not model")]
    fn wakes_a_sleeping_thread() {
        let bell = std::sync::Arc::new(Doorbell::new().unwrap());
        let waiter = {
            let bell = bell.clone();
            std::thread::spawn(move || bell.wait(None).unwrap())
        };
        bell.ring().unwrap();
        assert!(waiter.join().unwrap());
    }

    #[test]
    #[cfg_attr(miri, ignore = "pipes are system calls miri does not model")]
    fn a_descriptor_that_is_not_an_eventfd_gives_errors() {
        let (read_end, write_end) = nix::unistd::pipe().unwrap();
        let wrong = Doorbell::from_fd(write_end);
        assert!(
            wrong.clear().is_err(),
            "reading a pipe's write end must fail"
        );
        drop(read_end);
        assert!(
            wrong.ring().is_err(),
            "writing a pipe with no reader must fail (EPIPE)"
        );
    }
}
