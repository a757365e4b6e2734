//! The MPI bootstrap: rank and size from the launcher (`mpirun`, `srun`),
//! published values exchanged by an allgather at each barrier, through
//! the `mpi` crate over the system's MPI (Open MPI on Debian).
//!
//! `publish` only records a value; the next `barrier` gathers every
//! rank's new values to every rank (two non-blocking allgathers: the
//! sizes, then the bytes), and `fetch` reads the gathered table. MPI
//! collectives cannot be called off: if a barrier's deadline passes
//! first, this rank aborts the MPI job (`MPI_Abort`) with a message
//! naming the barrier, which is how an MPI program fails; the launcher
//! then ends every rank. A rank that dies is seen by the launcher, which
//! ends the job too.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mpi::Count;
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;

use crate::{Bootstrap, Error, Result, check_key, check_rank, wire};

/// A rank of a job started by an MPI launcher (see the module docs). Only
/// one may exist in a process: MPI is initialized once, and finalized
/// when it is dropped.
pub struct Mpi {
    /// Kept for its `Drop` (`MPI_Finalize`).
    _universe: Universe,
    world: SimpleCommunicator,
    /// Published since the last barrier, in this rank's byte form.
    pending: Vec<u8>,
    table: HashMap<(u32, String), Vec<u8>>,
    barriers: u64,
}

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpi")
            .field("rank", &self.world.rank())
            .field("size", &self.world.size())
            .field("values", &self.table.len())
            .finish_non_exhaustive()
    }
}

impl Mpi {
    /// Initializes MPI (once per process).
    ///
    /// # Errors
    /// [`Error::Mpi`] if MPI was initialized already in this process.
    pub fn init() -> Result<Mpi> {
        let universe = mpi::initialize()
            .ok_or_else(|| Error::Mpi("MPI is initialized already in this process".into()))?;
        let world = universe.world();
        Ok(Mpi {
            _universe: universe,
            world,
            pending: Vec::new(),
            table: HashMap::new(),
            barriers: 0,
        })
    }

    /// Waits for `req` until `deadline`, yielding the CPU between looks;
    /// past it, aborts the job naming `what`.
    fn finish<'a, D: ?Sized, S: mpi::request::Scope<'a>>(
        &self,
        mut req: mpi::request::Request<'a, D, S>,
        deadline: Instant,
        what: &str,
    ) {
        loop {
            match req.test() {
                Ok(_) => return,
                Err(r) => req = r,
            }
            if Instant::now() >= deadline {
                eprintln!(
                    "ringfence-bootstrap: rank {}: {what} did not complete in time; aborting the MPI job",
                    self.world.rank()
                );
                self.world.abort(1);
            }
            std::thread::yield_now();
        }
    }
}

impl Bootstrap for Mpi {
    fn rank(&self) -> u32 {
        self.world.rank() as u32
    }

    fn size(&self) -> u32 {
        self.world.size() as u32
    }

    fn publish(&mut self, key: &str, value: &[u8]) -> Result<()> {
        check_key(key)?;
        wire::put_entry(&mut self.pending, key, value)
    }

    fn fetch(&mut self, rank: u32, key: &str, _timeout: Duration) -> Result<Vec<u8>> {
        check_key(key)?;
        check_rank(rank, self.size())?;
        self.table
            .get(&(rank, key.to_owned()))
            .cloned()
            .ok_or_else(|| Error::NotPublished {
                rank,
                key: key.to_owned(),
            })
    }

    fn barrier(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        self.barriers += 1;
        let what = format!("barrier {}", self.barriers);
        let n = self.world.size() as usize;
        let mine = Count::try_from(self.pending.len())
            .map_err(|_| Error::Invalid("more than 2 GiB published between barriers".into()))?;
        let mut counts = vec![0 as Count; n];
        mpi::request::scope(|scope| {
            let req = self
                .world
                .immediate_all_gather_into(scope, &mine, &mut counts[..]);
            self.finish(req, deadline, &what);
        });
        let mut displs = Vec::with_capacity(n);
        let mut total: usize = 0;
        for &c in &counts {
            let c = usize::try_from(c).map_err(|_| Error::Malformed {
                rank: 0,
                why: format!("a size of {c}"),
            })?;
            displs.push(Count::try_from(total).map_err(|_| {
                Error::Invalid("more than 2 GiB published in all between barriers".into())
            })?);
            total += c;
        }
        // Neither buffer may be an empty `Vec`'s dangling pointer: for
        // bytes that is address 1, which Open MPI reads as MPI_IN_PLACE.
        let mut all = vec![0u8; total.max(1)];
        let empty = [0u8; 1];
        let send = if self.pending.is_empty() {
            &empty[..0]
        } else {
            &self.pending[..]
        };
        {
            let mut part = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            mpi::request::scope(|scope| {
                let req = self
                    .world
                    .immediate_all_gather_varcount_into(scope, send, &mut part);
                self.finish(req, deadline, &what);
            });
        }
        self.pending.clear();
        for (r, (&start, &len)) in displs.iter().zip(&counts).enumerate() {
            let bytes = &all[start as usize..][..len as usize];
            for (key, value) in wire::entries(r as u32, bytes)? {
                self.table.insert((r as u32, key), value);
            }
        }
        Ok(())
    }
}
