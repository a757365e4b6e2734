//! An shm unpack asks the target's control thread to map the key (a MAP
//! round trip): that first phase runs without the engine lock, so a peer
//! slow to answer (here: stopped with SIGSTOP) stalls only the unpack, not
//! the worker's other endpoints.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use ringfence_ring::{RemoteBuf, Sqe};
use ringfence_tests::child::{self, ChildProcess};
use ringfence_tests::shm::{self, Link};
use std::sync::atomic::{AtomicBool, Ordering};

/// A target that offers a window and waits for the parent's word.
fn target() {
    let mut link = Link::new(child::parent_socket());
    let w = shm::worker(1);
    let window = w.alloc_registered(4096).unwrap();
    link.send_offer(&w, &window);
    assert_eq!(link.recv(), b"bye");
}

/// "`cuIpcOpenMemHandle` runs under the engine lock and stalls every
/// endpoint" holds for any slow unpack. While an unpack waits for a
/// stopped peer's reply, 100 PUTs complete on another endpoint; the
/// unpack is still waiting after them (the peer cannot answer), and
/// succeeds once the peer runs again. Under the lock, the PUTs would wait
/// for the unpack's control timeout, and the unpack would have failed.
#[test]
fn an_unpack_waiting_for_a_stopped_peer_stalls_no_other_endpoint() {
    if child::role().is_some() {
        return target();
    }
    let test = "an_unpack_waiting_for_a_stopped_peer_stalls_no_other_endpoint";
    let child = ChildProcess::spawn(test, "target");
    let mut link = Link::new(child.socket.try_clone().unwrap());
    let offer = link.recv_offer();
    let w = shm::worker(1);
    let stopped_ep = w.connect(&offer.address).unwrap();
    // Another peer, in this process, that always answers.
    let other = shm::worker(1);
    let window = other.alloc_registered(4096).unwrap();
    let ep = w.connect(other.address()).unwrap();
    let rkey = w
        .unpack_rkey(ep, &other.pack_rkey(window.handle()).unwrap())
        .unwrap();
    let src = w.alloc_registered(64).unwrap();
    let mut qp = w.create_queue().unwrap();
    let put =
        |ep: u32, rkey: u32, addr: u64| Sqe::put(ep, src.local(0), RemoteBuf { rkey, addr }, 8);
    let pid = Pid::from_raw(i32::try_from(child.process.id()).unwrap());
    kill(pid, Signal::SIGSTOP).unwrap();
    let started = AtomicBool::new(false);
    let unpacked = std::thread::scope(|s| {
        let unpack = s.spawn(|| {
            started.store(true, Ordering::Release);
            w.unpack_rkey(stopped_ep, &offer.key)
        });
        while !started.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        let sqe = put(ep.as_raw(), rkey.as_raw(), window.addr());
        for _ in 0..100 {
            assert_eq!(shm::complete(&w, &mut qp, &[sqe], 1)[0].res, 8);
        }
        let waiting = !unpack.is_finished();
        kill(pid, Signal::SIGCONT).unwrap();
        let unpacked = unpack.join().unwrap();
        assert!(waiting, "the unpack finished while its peer was stopped");
        unpacked
    });
    let stopped_rkey = unpacked.expect("the unpack succeeds once the peer runs");
    let sqe = put(stopped_ep.as_raw(), stopped_rkey.as_raw(), offer.base());
    assert_eq!(shm::complete(&w, &mut qp, &[sqe], 1)[0].res, 8);
    link.send(b"bye");
    child.join();
}
