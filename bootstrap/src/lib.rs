//! Finding ringfence peers through systems users already run: an etcd
//! cluster ([`Etcd`], as nixlbench does) or an MPI launcher ([`Mpi`]:
//! `mpirun`, `srun`). ringfence has no rendezvous service of its own.
//!
//! A [`Bootstrap`] gives each process of a run its rank and the run's
//! size, lets it publish named values (a worker address, remote keys) and
//! fetch those of other ranks, and offers a barrier. The portable order is
//! *publish, barrier, fetch*: with etcd a value is visible as soon as it is
//! published; with MPI the barrier is the exchange (an allgather of what
//! each rank published since the last one).
//!
//! ```no_run
//! use std::time::Duration;
//! use ringfence_bootstrap::{Bootstrap, connect};
//!
//! # fn main() -> Result<(), ringfence_bootstrap::Error> {
//! // "etcd://127.0.0.1:2379?run=job7&size=2", or "mpi" under mpirun.
//! let mut boot = connect("etcd://127.0.0.1:2379?run=job7&size=2")?;
//! let peer = (boot.rank() + 1) % boot.size();
//! boot.publish("address", b"this rank's worker address")?;
//! boot.barrier(Duration::from_secs(30))?;
//! let theirs = boot.fetch(peer, "address", Duration::from_secs(10))?;
//! # let _ = theirs;
//! # Ok(())
//! # }
//! ```
//!
//! The engine crates never depend on this one (DESIGN.md: `bootstrap` is
//! used by tools, tests, benches and applications); applications that
//! already have an exchange of their own keep passing the address and key
//! blobs through it.

use std::time::Duration;

#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "mpi")]
mod mpi;
mod uri;
#[cfg(any(feature = "mpi", test))]
mod wire;

#[cfg(feature = "etcd")]
pub use etcd::{Etcd, EtcdConfig};
#[cfg(feature = "mpi")]
pub use mpi::Mpi;
pub use uri::{Spec, connect};

/// What a bootstrap call can fail with. Each names what it was waiting
/// for, and the rank when one is to blame.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The rendezvous service cannot be reached (bad address, nothing
    /// listening, no answer within the connect timeout).
    #[error("cannot reach etcd at {endpoints}: {reason}")]
    Unreachable { endpoints: String, reason: String },
    /// A rank left the run (its lease expired: the process died or lost
    /// its connection to etcd) while this one still waited for it.
    #[error("rank {rank} is gone: {why}")]
    RankGone { rank: u32, why: String },
    /// Nothing came within the time allowed.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
    /// A rank fetched a value its owner never published (MPI: not before
    /// the last barrier).
    #[error("rank {rank} published nothing under {key:?}")]
    NotPublished { rank: u32, key: String },
    /// Every rank of the run is taken, or the given one is.
    #[error("cannot join the run: {0}")]
    Join(String),
    /// This process's own lease expired (etcd did not hear from it in
    /// time): the other ranks count it as gone.
    #[error("this rank's etcd lease {lease:#x} expired")]
    LeaseLost { lease: i64 },
    /// Bad input: a key name, a rank, a URI.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// Another rank's data could not be decoded.
    #[error("malformed bootstrap data from rank {rank}: {why}")]
    Malformed { rank: u32, why: String },
    /// An error from the etcd client.
    #[error("etcd: {0}")]
    Etcd(String),
    /// An error from MPI.
    #[error("mpi: {0}")]
    Mpi(String),
    /// The implementation asked for is not built into this binary.
    #[error("{0} bootstrap is not built in (enable the crate's `{0}` feature)")]
    NotBuilt(&'static str),
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Publishing and fetching per-rank values, a barrier, rank and size: what
/// a ringfence run needs from its launcher. Implementations: [`Etcd`] and
/// [`Mpi`]. A bootstrap is used from one thread at a time (MPI's handles
/// are not `Send`): the one that set it up.
pub trait Bootstrap: std::fmt::Debug {
    /// This process's rank, `0..size()`.
    fn rank(&self) -> u32;
    /// The number of ranks in the run.
    fn size(&self) -> u32;
    /// Publishes `value` under `key` for this rank (a later publish of the
    /// same key replaces it). `key` is 1 to 128 bytes of ASCII letters,
    /// digits, `-`, `_` and `.`. Other ranks may fetch it after the next
    /// [`barrier`](Self::barrier) (etcd: at once).
    fn publish(&mut self, key: &str, value: &[u8]) -> Result<()>;
    /// The value `rank` published under `key`: this rank's own too. Waits
    /// up to `timeout` for it where the implementation can (etcd);
    /// [`Error::RankGone`] if that rank leaves meanwhile.
    fn fetch(&mut self, rank: u32, key: &str, timeout: Duration) -> Result<Vec<u8>>;
    /// Returns once every rank has called it as often as this one, or
    /// fails with the ranks that did not come ([`Error::Timeout`]) or one
    /// that left ([`Error::RankGone`]).
    fn barrier(&mut self, timeout: Duration) -> Result<()>;
}

/// Checks a key name (see [`Bootstrap::publish`]).
pub(crate) fn check_key(key: &str) -> Result<()> {
    let ok = !key.is_empty()
        && key.len() <= 128
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "key {key:?}: 1 to 128 of A-Z a-z 0-9 - _ ."
        )))
    }
}

/// Checks a rank against the run's size.
pub(crate) fn check_rank(rank: u32, size: u32) -> Result<()> {
    if rank < size {
        Ok(())
    } else {
        Err(Error::Invalid(format!("rank {rank} of a run of {size}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_are_checked() {
        for good in ["address", "rkey.0", "lane_3-b", &"k".repeat(128)] {
            check_key(good).unwrap();
        }
        for bad in ["", "a/b", "sp ace", "é", &"k".repeat(129)] {
            assert!(matches!(check_key(bad), Err(Error::Invalid(_))), "{bad:?}");
        }
        assert!(check_rank(3, 4).is_ok());
        assert!(matches!(check_rank(4, 4), Err(Error::Invalid(_))));
    }
}
