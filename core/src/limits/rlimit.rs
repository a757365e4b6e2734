//! The resource limits: `RLIMIT_AS` and `RLIMIT_DATA`, where finite.

use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit};

/// The soft `RLIMIT_AS` and `RLIMIT_DATA`, each `None` where infinite or
/// unreadable.
pub(super) fn read() -> (Option<u64>, Option<u64>) {
    let finite = |r| {
        getrlimit(r)
            .ok()
            .map(|(soft, _)| soft)
            .filter(|&soft| soft != RLIM_INFINITY)
    };
    (finite(Resource::RLIMIT_AS), finite(Resource::RLIMIT_DATA))
}
