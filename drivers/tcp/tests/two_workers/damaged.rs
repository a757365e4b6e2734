//! Damaged packed keys and worker addresses are refused as they are decoded,
//! before the tcp driver sees them.

use crate::{pair, run};
use ringfence_ring::{RemoteBuf, Sqe};

/// A packed key or a worker address damaged on its way (any one bit
/// flipped, cut short, a byte added) is refused as it is decoded
/// (`Error::Malformed`, `InvalidArgument`), before the tcp driver sees it;
/// the undamaged ones still work.
#[test]
fn every_damaged_key_and_address_is_refused_at_unpack_and_connect() {
    let p = pair(4096, 1);
    let blob = p.target.pack_rkey(p.window.handle()).unwrap();
    let address = p.target.address().to_vec();
    let refused = |what: &str, e: ringfence::Error| {
        assert!(
            matches!(e, ringfence::Error::Malformed { .. }),
            "{what}: {e}"
        );
        assert_eq!(e.status(), ringfence::Status::InvalidArgument, "{what}");
    };
    let flip = |b: &[u8], bit: usize| {
        let mut bad = b.to_vec();
        bad[bit / 8] ^= 1 << (bit % 8);
        bad
    };
    for bit in 0..blob.len() * 8 {
        let e = p
            .initiator
            .unpack_rkey(p.ep, &flip(&blob, bit))
            .unwrap_err();
        refused(&format!("key bit {bit}"), e);
    }
    for bit in 0..address.len() * 8 {
        let e = p.initiator.connect(&flip(&address, bit)).unwrap_err();
        refused(&format!("address bit {bit}"), e);
    }
    for cut in 0..blob.len() {
        let e = p.initiator.unpack_rkey(p.ep, &blob[..cut]).unwrap_err();
        refused(&format!("key cut at {cut}"), e);
    }
    for cut in 0..address.len() {
        let e = p.initiator.connect(&address[..cut]).unwrap_err();
        refused(&format!("address cut at {cut}"), e);
    }
    let (mut long_key, mut long_address) = (blob.clone(), address.clone());
    long_key.push(0);
    long_address.push(0);
    refused(
        "key + 1",
        p.initiator.unpack_rkey(p.ep, &long_key).unwrap_err(),
    );
    refused(
        "address + 1",
        p.initiator.connect(&long_address).unwrap_err(),
    );
    // The tcp part's version, with a correct check: the driver refuses it.
    let mut old = blob.clone();
    let at = old
        .windows(4)
        .position(|w| w == b"RFTK")
        .expect("the tcp part");
    old[at + 4] = 1;
    ringfence::reseal(&mut old);
    let e = p.initiator.unpack_rkey(p.ep, &old).unwrap_err();
    assert!(e.to_string().contains("malformed tcp key"), "{e}");

    // The undamaged key still unpacks, and its id works.
    let rkey = p.initiator.unpack_rkey(p.ep, &blob).unwrap();
    let src = p.initiator.alloc_registered(64).unwrap();
    src.write(0, b"intact!!");
    let mut qp = p.initiator.create_queue().unwrap();
    let remote = RemoteBuf {
        rkey: rkey.as_raw(),
        addr: p.window.addr(),
    };
    let cqes = run(
        &p.initiator,
        &p.target,
        &mut qp,
        &[Sqe::put(p.ep.as_raw(), src.local(0), remote, 8).with_user_data(1)],
        1,
    );
    assert_eq!(cqes[0].res, 8);
    let mut out = [0u8; 8];
    p.window.read(0, &mut out);
    assert_eq!(&out, b"intact!!");
}
