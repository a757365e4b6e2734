//! `address_decode`: arbitrary worker addresses to `Worker::connect` over
//! loopback (the engine's address decoder, then the driver's part).
//!
//! Input: byte 0, bit 0: the rest is XORed onto the target's real address
//! (bytes beyond it appended), else the rest is the address itself.
//!
//! Properties: no panic; the real address connects; anything else either
//! connects or fails with an error whose status and message can be had;
//! an endpoint it returns answers `endpoint_state` and completes a NOP
//! exactly once.

use ringfence::{Loopback, Worker};
use ringfence_ring::Sqe;

fn worker() -> Worker {
    Worker::builder()
        .driver(Loopback::new())
        .ignore_env()
        .build()
        .expect("a loopback worker")
}

pub fn address_decode(data: &[u8]) {
    let _ = connects(data);
}

/// Runs [`address_decode`]'s checks; returns whether the address connected.
pub fn connects(data: &[u8]) -> bool {
    let (&mode, rest) = data.split_first().unwrap_or((&0, &[]));
    let target = worker();
    let initiator = worker();
    let real = target.address().to_vec();
    let peer = if mode & 1 != 0 {
        let mut out = real.clone();
        for (i, b) in rest.iter().enumerate() {
            match out.get_mut(i) {
                Some(o) => *o ^= b,
                None => out.push(*b),
            }
        }
        out
    } else {
        rest.to_vec()
    };
    let ep = match initiator.connect(&peer) {
        Ok(ep) => ep,
        Err(e) => {
            assert!(peer != real, "the real address was refused: {e}");
            let _ = (e.status(), e.to_string());
            return false;
        }
    };
    initiator
        .endpoint_state(ep)
        .expect("a new endpoint has a state");
    let mut qp = initiator.create_queue().unwrap();
    let mut nop = Sqe::nop().with_user_data(7);
    nop.endpoint = ep.as_raw();
    qp.push(nop).unwrap();
    qp.submit();
    let mut got = 0;
    for _ in 0..10_000 {
        initiator.progress();
        target.progress();
        while let Some(cqe) = qp.pop().unwrap() {
            assert_eq!(cqe.user_data, 7);
            got += 1;
        }
        if got > 0 {
            break;
        }
    }
    for _ in 0..4 {
        initiator.progress();
    }
    assert!(qp.pop().unwrap().is_none(), "two CQEs for one NOP");
    assert_eq!(got, 1, "the NOP did not complete");
    true
}

pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = vec![
        ("real".to_string(), vec![1]),
        ("empty".to_string(), vec![0]),
        ("magic_only".to_string(), [&[0u8][..], b"RFWA\x01"].concat()),
        (
            "zero_drivers".to_string(),
            [&[0u8][..], b"RFWA\x01\x00"].concat(),
        ),
        (
            "long_name".to_string(),
            [&[0u8][..], b"RFWA\x01\x01\xffloopback"].concat(),
        ),
    ];
    // The real address with its driver count, a name byte, and a part
    // length damaged, and with a byte appended.
    for (name, at, flip) in [
        ("count", 5usize, 0x02u8),
        ("name", 7, 0x20),
        ("part_len", 16, 0xff),
    ] {
        let mut b = vec![1u8];
        b.extend(std::iter::repeat_n(0, at));
        b.push(flip);
        out.push((format!("real_{name}"), b));
    }
    out
}
