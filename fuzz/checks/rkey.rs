//! `rkey_unpack`: arbitrary key blobs to `Worker::unpack_rkey` over
//! loopback, and to the shm driver's key decoder.
//!
//! Input: byte 0, bit 0: the rest is XORed onto a real packed key of a
//! 4096-byte window (bytes beyond it are appended), else the rest is the
//! blob itself. The shm decoder gets the rest as it is (bit 1 clear) or
//! XORed onto a real shm key part (bit 1 set).
//!
//! Properties: no panic; the real key is accepted with the window's
//! bounds; an accepted key's bounds do not wrap, and a PUT through it
//! succeeds only inside the real window (the loopback target checks its
//! export table), with no byte of the window or of a registered guard
//! buffer changing outside what succeeded; an shm key the decoder accepts
//! is non-empty, does not wrap, and re-encodes to a blob that decodes the
//! same.

use ringfence::{Loopback, Worker};
use ringfence_ring::{Cqe, LocalBuf, RemoteBuf, Sqe};
use ringfence_shm::fuzzing as shm;

const WINDOW: usize = 4096;

fn worker() -> Worker {
    Worker::builder()
        .driver(Loopback::new())
        .ignore_env()
        .build()
        .expect("a loopback worker")
}

fn xor_onto(base: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = base.to_vec();
    for (i, b) in data.iter().enumerate() {
        match out.get_mut(i) {
            Some(o) => *o ^= b,
            None => out.push(*b),
        }
    }
    out
}

/// A real shm key part, as the shm driver packs it.
pub fn sample_shm_key() -> Vec<u8> {
    shm::encode_key(&shm::KeyFields {
        memfd: true,
        instance: 0x1122_3344_5566_7788,
        slot: 5,
        generation: 2,
        secret: 0x0bad_cafe_f00d_d00d,
        base: 0x7f12_3456_0000,
        len: 1 << 20,
    })
}

pub fn rkey_unpack(data: &[u8]) {
    let _ = rkey_outcome(data);
}

/// Runs [`rkey_unpack`]'s checks; returns whether the shm decoder took its
/// blob, and the number of PUTs that succeeded through the unpacked key
/// (`None`: refused).
pub fn rkey_outcome(data: &[u8]) -> (bool, Option<usize>) {
    let (&mode, rest) = data.split_first().unwrap_or((&0, &[]));

    // The shm driver's decoder.
    let shm_blob = if mode & 2 != 0 {
        xor_onto(&sample_shm_key(), rest)
    } else {
        rest.to_vec()
    };
    let shm_ok = shm::decode_key(&shm_blob).is_some();
    if let Some(k) = shm::decode_key(&shm_blob) {
        assert!(k.len > 0, "an empty shm key was accepted: {k:?}");
        assert!(
            k.base.checked_add(k.len).is_some(),
            "a wrapping shm key: {k:?}"
        );
        assert_eq!(
            shm::decode_key(&shm::encode_key(&k)),
            Some(k),
            "re-encoding changed {k:?}"
        );
    }

    // The engine's unpack over loopback.
    let target = worker();
    let initiator = worker();
    let window = target.alloc_registered(WINDOW).unwrap();
    let guard = target.alloc_registered(WINDOW).unwrap();
    let src = initiator.alloc_registered(64).unwrap();
    src.write(0, &[0xa5; 64]);
    window.write(0, &[0; WINDOW]);
    guard.write(0, &[0; WINDOW]);
    let ep = initiator.connect(target.address()).unwrap();
    let real = target.pack_rkey(window.handle()).unwrap();
    let id = initiator
        .unpack_rkey(ep, &real)
        .expect("the real key is accepted");
    assert_eq!(
        initiator.rkey_bounds(ep, id).unwrap(),
        (window.addr(), WINDOW as u64)
    );
    let blob = if mode & 1 != 0 {
        xor_onto(&real, rest)
    } else {
        rest.to_vec()
    };
    let Ok(id) = initiator.unpack_rkey(ep, &blob) else {
        return (shm_ok, None);
    };
    let (base, len) = initiator
        .rkey_bounds(ep, id)
        .expect("an unpacked key has bounds");
    assert!(
        base.checked_add(len).is_some(),
        "the bounds wrap: {base:#x} + {len:#x}"
    );
    let mut qp = initiator.create_queue().unwrap();
    let mut tries = Vec::new();
    for (i, addr) in [base, base.wrapping_add(len).wrapping_sub(8), window.addr()]
        .into_iter()
        .enumerate()
    {
        let sqe = Sqe::put(
            ep.as_raw(),
            LocalBuf {
                mem: src.handle().as_raw(),
                addr: src.addr(),
            },
            RemoteBuf {
                rkey: id.as_raw(),
                addr,
            },
            8,
        )
        .with_user_data(i as u64);
        qp.push(sqe).unwrap();
        tries.push(addr);
    }
    qp.submit();
    let mut done = vec![None; tries.len()];
    let mut rounds = 0;
    while done.iter().any(Option::is_none) {
        initiator.progress();
        target.progress();
        while let Some(cqe) = qp.pop().unwrap() {
            let i = cqe.user_data as usize;
            assert!(done[i].is_none(), "two CQEs for PUT {i}");
            done[i] = Some(cqe);
        }
        rounds += 1;
        assert!(rounds < 100_000, "hung: {done:?}");
    }
    let within = |addr: u64| addr >= window.addr() && addr + 8 <= window.addr() + WINDOW as u64;
    let mut written = Vec::new();
    for (addr, cqe) in tries.iter().zip(&done) {
        let cqe: Cqe = cqe.unwrap();
        if cqe.result().is_ok() {
            assert!(
                within(*addr),
                "a PUT at {addr:#x} through a forged key succeeded outside the window {:#x}+{WINDOW}",
                window.addr()
            );
            written.push(*addr);
        }
    }
    for b in [&window, &guard] {
        let mut now = vec![0u8; WINDOW];
        b.read(0, &mut now);
        for (i, &x) in now.iter().enumerate() {
            let addr = b.addr() + i as u64;
            if x != 0 {
                assert!(
                    written.iter().any(|&w| w <= addr && addr < w + 8),
                    "byte {addr:#x} changed outside every successful PUT"
                );
            }
        }
    }
    (shm_ok, Some(written.len()))
}

pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = vec![
        ("real".to_string(), vec![1]),
        ("real_shm".to_string(), vec![3]),
        ("empty".to_string(), vec![0]),
        ("raw_shm".to_string(), [vec![0], sample_shm_key()].concat()),
    ];
    // The real key with its length field (the first four bytes) or a byte
    // near the end damaged; the real key cut short.
    let mut flip = vec![1u8];
    flip.extend_from_slice(&[0, 0, 0, 0x80]);
    out.push(("part_length".into(), flip));
    let mut tail = vec![1u8];
    tail.extend(std::iter::repeat_n(0, 40));
    tail.push(0x01);
    out.push(("flip_40".into(), tail));
    let mut shm_secret = vec![2u8];
    shm_secret.extend(std::iter::repeat_n(0, 24));
    shm_secret.push(0xff);
    out.push(("shm_secret".into(), shm_secret));
    out
}
