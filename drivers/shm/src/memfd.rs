//! Creating, sealing and checking memfds.
//!
//! Every memfd this driver hands to a peer is sealed against resizing
//! (`F_SEAL_SHRINK | F_SEAL_GROW`, then `F_SEAL_SEAL` so the seals are
//! final), and every memfd it receives is checked before it is mapped: it
//! must be sealed against shrinking (a file truncated under a mapping makes
//! accesses past the new end fault with `SIGBUS`) and at least as large as
//! the range about to be mapped.

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// The seals of every memfd this driver shares.
pub(crate) const RESIZE_SEALS: SealFlag = SealFlag::F_SEAL_SHRINK
    .union(SealFlag::F_SEAL_GROW)
    .union(SealFlag::F_SEAL_SEAL);

/// A new memfd of `size` bytes (zero-filled), not yet sealed.
///
/// # Errors
/// `memfd_create` or `ftruncate` failed.
pub(crate) fn create(name: &str, size: u64) -> io::Result<OwnedFd> {
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)?;
    let size = i64::try_from(size).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    nix::unistd::ftruncate(&fd, size)?;
    Ok(fd)
}

/// Adds `seals` to a memfd.
///
/// # Errors
/// `fcntl(F_ADD_SEALS)` failed.
pub(crate) fn seal(fd: BorrowedFd<'_>, seals: SealFlag) -> io::Result<()> {
    fcntl(fd, FcntlArg::F_ADD_SEALS(seals))?;
    Ok(())
}

/// Why a memfd from a peer was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BadMemfd {
    /// Not a sealable file (not a memfd), or the seals could not be read.
    #[error("descriptor is not a sealed memfd")]
    NotMemfd,
    /// Could shrink under our mapping.
    #[error("memfd is not sealed against shrinking")]
    NotSealed,
    /// Smaller than the range to map.
    #[error("memfd is {actual} bytes, needs at least {needed}")]
    TooSmall {
        /// Its size.
        actual: u64,
        /// The end of the range to map.
        needed: u64,
    },
}

/// Checks a memfd from a peer before mapping `[0, needed)` of it: sealed
/// against shrinking (and growing) and at least `needed` bytes. Returns its
/// size.
///
/// # Errors
/// [`BadMemfd`].
pub(crate) fn check(fd: &impl AsFd, needed: u64) -> Result<u64, BadMemfd> {
    let seals = fcntl(fd.as_fd(), FcntlArg::F_GET_SEALS).map_err(|_| BadMemfd::NotMemfd)?;
    let required = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW;
    if seals & required.bits() != required.bits() {
        return Err(BadMemfd::NotSealed);
    }
    let size = nix::sys::stat::fstat(fd.as_fd())
        .map_err(|_| BadMemfd::NotMemfd)?
        .st_size;
    let size = u64::try_from(size).map_err(|_| BadMemfd::NotMemfd)?;
    if size < needed {
        return Err(BadMemfd::TooSmall {
            actual: size,
            needed,
        });
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsealed_small_and_non_memfd_descriptors_are_refused() {
        let fd = create("check-test", 8192).unwrap();
        assert_eq!(check(&fd, 8192), Err(BadMemfd::NotSealed));
        seal(fd.as_fd(), RESIZE_SEALS).unwrap();
        assert_eq!(check(&fd, 8192), Ok(8192));
        assert_eq!(
            check(&fd, 8193),
            Err(BadMemfd::TooSmall {
                actual: 8192,
                needed: 8193
            })
        );
        assert!(nix::unistd::ftruncate(&fd, 4096).is_err(), "sealed");
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(check(&a, 1), Err(BadMemfd::NotMemfd));
    }
}
