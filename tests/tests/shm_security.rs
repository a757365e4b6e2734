//! What a peer may not do to a target over the shm driver, between two
//! real processes: access outside a region, use a forged, foreign or
//! revoked key, or talk garbage to the target's socket. Every attempt is
//! refused with a specific status before any byte of the target's memory
//! is touched, and the target keeps serving.

use ringfence::{Status, Worker};
use ringfence_ring::{RemoteBuf, Sqe};
use ringfence_tests::child::{self, ChildProcess};
use ringfence_tests::fdpass;
use ringfence_tests::shm::{self, Link, checksum};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;

const WINDOW: usize = 4096;

fn target() {
    let mut link = Link::new(child::parent_socket());
    let w = shm::worker(1);
    let window = w.alloc_registered(WINDOW).unwrap();
    link.send(w.address());
    link.send(&w.pack_rkey(window.handle()).unwrap());
    link.send_u64s(&[window.addr()]);
    loop {
        match link.recv().as_slice() {
            b"sum" => {
                let mut all = vec![0u8; WINDOW];
                window.read(0, &mut all);
                link.send_u64s(&[checksum(&all)]);
            }
            b"dereg" => {
                w.deregister(window.handle()).unwrap();
                link.send(b"ok");
            }
            b"" => break,
            other => panic!("unexpected request {other:?}"),
        }
    }
}

/// The driver's part of a worker key blob: u32 length, core's header (29
/// bytes + the driver's name), then the driver's own blob, 48 bytes.
/// The shm driver's 48-byte part of a packed key of one part: last but
/// for the key's 4-byte integrity check.
fn driver_part(blob: &mut [u8]) -> &mut [u8] {
    let end = blob.len() - 4;
    &mut blob[end - 48..end]
}

/// Where the engine's part header starts in a packed key (after `"RFKY"`,
/// format, part count and the part's `u32` length).
const PART: usize = 6 + 4;

fn status_of(e: &ringfence::Error) -> Status {
    e.status()
}

fn run_one(w: &Worker, qp: &mut ringfence::QueuePair, sqe: Sqe) -> i32 {
    shm::complete(w, qp, &[sqe], 1)[0].res
}

/// Sends `bytes` (with `fds`) as one message on a fresh raw connection to
/// the target's socket and returns whether the target closed the
/// connection (it must, for every malformed message).
fn hostile(name: &[u8], bytes: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) -> bool {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    connect(fd.as_raw_fd(), &UnixAddr::new_abstract(name).unwrap()).unwrap();
    let sock = UnixStream::from(fd);
    // Only catches a target that never closes.
    sock.set_read_timeout(Some(shm::HANG)).unwrap();
    fdpass::send(&sock, bytes, fds).unwrap();
    let mut reply = [0u8; 128];
    // The target may answer (a refusal) before it closes; read until EOF.
    for _ in 0..4 {
        match fdpass::recv(&sock, &mut reply) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            // End of file, or reset: closed.
            Err(_) => return true,
            Ok(_) => {}
        }
    }
    false
}

fn hello(capacity: u32) -> Vec<u8> {
    let mut m = b"RFSC\x01\x01\0\0".to_vec();
    m.extend_from_slice(&1u32.to_le_bytes());
    m.extend_from_slice(&[1, 0, 0, 0]);
    m.extend_from_slice(&capacity.to_le_bytes());
    m.extend_from_slice(&7u64.to_le_bytes());
    m
}

fn memfd(len: u64, sealed: bool) -> std::os::fd::OwnedFd {
    use nix::fcntl::{FcntlArg, SealFlag, fcntl};
    use nix::sys::memfd::{MFdFlags, memfd_create};
    let fd = memfd_create(
        "hostile",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .unwrap();
    nix::unistd::ftruncate(&fd, len as i64).unwrap();
    if sealed {
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW),
        )
        .unwrap();
    }
    fd
}

#[test]
fn out_of_bounds_forged_and_revoked_accesses_are_refused() {
    if child::role().is_some() {
        return target();
    }
    let child = ChildProcess::spawn(
        "out_of_bounds_forged_and_revoked_accesses_are_refused",
        "target",
    );
    let mut link = Link::new(child.socket.try_clone().unwrap());
    let offer = link.recv_offer();
    let base = offer.base();
    let w = shm::worker(1);
    let (ep, rkey) = offer.connect(&w);
    let (address, key) = (&offer.address, &offer.key);
    let src = w.alloc_registered(8192).unwrap();
    src.write(0, &[0xab; 8192]);
    let mut qp = w.create_queue().unwrap();
    let e = ep.as_raw();
    let at = |rkey: ringfence::RkeyId, addr: u64| RemoteBuf {
        rkey: rkey.as_raw(),
        addr,
    };
    let zero = checksum(&[0u8; WINDOW]);

    // Outside the region, per the key's bounds: the engine refuses.
    for (addr, len) in [
        (base + WINDOW as u64 - 4, 8),
        (base - 8, 8),
        (base, WINDOW as u32 + 1),
        (u64::MAX - 3, 8),
    ] {
        let res = run_one(&w, &mut qp, Sqe::put(e, src.local(0), at(rkey, addr), len));
        assert_eq!(res, Status::OutOfBounds.as_raw(), "PUT at {addr:#x}+{len}");
        let res = run_one(&w, &mut qp, Sqe::get(e, src.local(0), at(rkey, addr), len));
        assert_eq!(res, Status::OutOfBounds.as_raw(), "GET at {addr:#x}+{len}");
    }
    let res = run_one(&w, &mut qp, Sqe::atomic_add(e, at(rkey, base + 4), 1));
    assert_eq!(res, Status::Misaligned.as_raw());

    // Wider bounds forged in the engine's header (the driver's part left
    // intact): refused at unpack by the key's integrity check; forged with
    // a correct check, the driver checks the target's true bounds and
    // refuses.
    let mut wide = key.clone();
    wide[PART + 17..PART + 25].copy_from_slice(&(1u64 << 20).to_le_bytes());
    assert!(matches!(
        w.unpack_rkey(ep, &wide).unwrap_err(),
        ringfence::Error::Malformed { .. }
    ));
    ringfence::reseal(&mut wide);
    let wide_rkey = w.unpack_rkey(ep, &wide).unwrap();
    for addr in [base + WINDOW as u64, base + 65536] {
        let res = run_one(
            &w,
            &mut qp,
            Sqe::put(e, src.local(0), at(wide_rkey, addr), 8),
        );
        assert_eq!(
            res,
            Status::OutOfBounds.as_raw(),
            "forged bounds, PUT at +{}",
            addr - base
        );
        let res = run_one(&w, &mut qp, Sqe::atomic_add(e, at(wide_rkey, addr), 1));
        assert_eq!(res, Status::OutOfBounds.as_raw());
    }

    // Forged driver parts (with a correct integrity check: a forger can
    // compute it): refused at unpack, before anything is mapped.
    let cases: [(&str, usize, u8, Status); 4] = [
        ("secret", 24, 1, Status::AccessDenied),
        ("slot", 16, 1, Status::AccessDenied),
        ("generation", 20, 1, Status::AccessDenied),
        ("instance", 8, 1, Status::InvalidRkey),
    ];
    for (what, offset, flip, status) in cases {
        let mut forged = key.clone();
        driver_part(&mut forged)[offset] ^= flip;
        ringfence::reseal(&mut forged);
        let err = w.unpack_rkey(ep, &forged).unwrap_err();
        assert_eq!(status_of(&err), status, "forged {what}: {err}");
    }
    let mut bounds = key.clone();
    driver_part(&mut bounds)[40] ^= 0x10; // the length
    ringfence::reseal(&mut bounds);
    assert_eq!(
        status_of(&w.unpack_rkey(ep, &bounds).unwrap_err()),
        Status::InvalidRkey
    );
    for cut in 0..key.len() {
        assert!(
            w.unpack_rkey(ep, &key[..cut]).is_err(),
            "truncated at {cut}"
        );
    }
    let mut garbage = key.clone();
    for (i, b) in driver_part(&mut garbage).iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(151);
    }
    assert!(w.unpack_rkey(ep, &garbage).is_err());
    ringfence::reseal(&mut garbage);
    assert!(w.unpack_rkey(ep, &garbage).is_err());

    // Nothing above touched a byte of the target.
    link.send(b"sum");
    assert_eq!(
        link.recv_u64s(),
        [zero],
        "a refused access changed the target's memory"
    );

    // Garbage on the target's socket: each connection is closed, and the
    // target keeps serving.
    let name = shm::shm_socket_name(address);
    assert!(hostile(&name, b"hello?", &[]), "garbage");
    assert!(hostile(&name, &hello(4096), &[]), "HELLO without a page");
    let unsealed = memfd(512 + 4096, false);
    assert!(
        hostile(&name, &hello(4096), &[unsealed.as_fd()]),
        "unsealed page"
    );
    let small = memfd(512, true);
    assert!(
        hostile(&name, &hello(4096), &[small.as_fd()]),
        "page too small"
    );
    let odd = memfd(512 + 5000, true);
    assert!(
        hostile(&name, &hello(5000), &[odd.as_fd()]),
        "capacity not a power of two"
    );
    let mut map = b"RFSC\x03\x01\0\0".to_vec();
    map.extend_from_slice(&[0u8; 20]);
    assert!(hostile(&name, &map, &[]), "MAP before HELLO");
    assert!(hostile(&name, &[0u8; 1000], &[]), "oversized");
    let ep2 = w.connect(address).unwrap();
    let rkey2 = w.unpack_rkey(ep2, key).unwrap();
    let res = run_one(
        &w,
        &mut qp,
        Sqe::put(ep2.as_raw(), src.local(0), at(rkey2, base + 8), 8),
    );
    assert_eq!(res, 8, "the target still serves");
    let res = run_one(
        &w,
        &mut qp,
        Sqe::atomic_cswap(ep2.as_raw(), src.local(64), at(rkey2, base + 8), 0, 1),
    );
    assert_eq!(res, 8);
    assert_eq!(
        src.load_u64(64),
        0xabab_abab_abab_abab,
        "the PUT landed before the CSWAP"
    );

    // Revoked: after the target deregisters, every access is refused.
    link.send(b"dereg");
    assert_eq!(link.recv(), b"ok");
    let res = run_one(&w, &mut qp, Sqe::put(e, src.local(0), at(rkey, base), 8));
    assert_eq!(res, Status::AccessDenied.as_raw());
    let res = run_one(
        &w,
        &mut qp,
        Sqe::get(ep2.as_raw(), src.local(0), at(rkey2, base), 8),
    );
    assert_eq!(res, Status::AccessDenied.as_raw());
    assert_eq!(
        status_of(&w.unpack_rkey(ep, key).unwrap_err()),
        Status::AccessDenied
    );
    link.send(&[]);
    child.join();
}
