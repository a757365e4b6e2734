//! The MPI bootstrap under a real launcher: run by `cargo test`, this
//! binary starts itself under Open MPI's `mpirun` as four ranks on this
//! host (as root it passes `--allow-run-as-root`; `--oversubscribe`, since
//! the machine may have fewer CPUs than ranks), and each rank publishes,
//! passes barriers and checks every other rank's values. A rank's failure
//! makes `mpirun` exit non-zero, which fails the test.

use std::process::Command;
use std::time::Duration;

use ringfence_bootstrap::{Bootstrap, Error, Mpi};

const RANKS: u32 = 4;
const HANG: Duration = Duration::from_secs(60);

fn main() {
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some() {
        rank();
        return;
    }
    // `cargo test -- --list` and filters: one test, named `mpi_four_ranks`.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("mpi_four_ranks: test");
        return;
    }
    if args
        .iter()
        .any(|a| !a.starts_with('-') && !"mpi_four_ranks".contains(a.as_str()))
    {
        return;
    }
    let mut cmd = Command::new("mpirun");
    if nix_is_root() {
        cmd.arg("--allow-run-as-root");
    }
    cmd.args(["--oversubscribe", "-np", &RANKS.to_string()])
        .args([
            "--mca",
            "btl",
            "self,tcp",
            "--mca",
            "btl_tcp_if_include",
            "lo",
        ])
        .args(["--mca", "oob_tcp_if_include", "lo"])
        .arg(std::env::current_exe().unwrap());
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run mpirun ({e}): install Debian's openmpi-bin (scripts/test.sh does)")
    });
    assert!(status.success(), "mpirun: {status}");
    println!("test mpi_four_ranks ... ok ({RANKS} ranks under mpirun)");
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// One rank's part.
fn rank() {
    let mut b = Mpi::init().unwrap();
    assert!(
        matches!(Mpi::init(), Err(Error::Mpi(_))),
        "a second init is refused"
    );
    let (me, n) = (b.rank(), b.size());
    assert_eq!(n, RANKS);
    b.publish("address", format!("worker of rank {me}").as_bytes())
        .unwrap();
    // Sizes differ per rank, and rank 0 publishes an empty value.
    b.publish("rkey.0", &vec![me as u8; me as usize * 1000])
        .unwrap();
    assert!(matches!(
        b.fetch((me + 1) % n, "address", HANG),
        Err(Error::NotPublished { .. })
    ));
    b.barrier(HANG).unwrap();
    for r in 0..n {
        assert_eq!(
            b.fetch(r, "address", HANG).unwrap(),
            format!("worker of rank {r}").as_bytes()
        );
        assert_eq!(
            b.fetch(r, "rkey.0", HANG).unwrap(),
            vec![r as u8; r as usize * 1000]
        );
    }
    // A second round: a replaced value, and a barrier with nothing new
    // from some ranks.
    if me % 2 == 0 {
        b.publish("address", b"moved").unwrap();
    }
    b.barrier(HANG).unwrap();
    for r in 0..n {
        let want: &[u8] = if r % 2 == 0 {
            b"moved"
        } else {
            format!("worker of rank {r}").leak().as_bytes()
        };
        assert_eq!(b.fetch(r, "address", HANG).unwrap(), want);
    }
    assert!(matches!(
        b.fetch(n, "address", HANG),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        b.fetch(0, "never", HANG),
        Err(Error::NotPublished { rank: 0, .. })
    ));
    b.barrier(HANG).unwrap();
}
