//! The target's bookkeeping of one-sided operations: regions, packed keys and the checks of
//! every remote access (`rdmx_proto::rma`).

use proptest::prelude::*;
use rdmx_proto::rma::{
    KeyDecodeError, KeyRef, PackedKey, RdmaPart, Refusal, Regions, RemoteAccess, RmaOp, KEY_LEN,
    KEY_LEN_RDMA,
};

fn packed(regions: &mut Regions, len: u64, access: RemoteAccess, secret: u64) -> PackedKey {
    PackedKey {
        key: regions.map(len, access, secret).expect("a slot"),
        len,
        access,
        rdma: None,
    }
}

#[test]
fn accesses_inside_the_region_and_its_edges_pass() {
    let mut regions = Regions::default();
    let k = packed(&mut regions, 4096, RemoteAccess::ALL, 0x1234_5678_9abc_def0);
    for (op, offset, len) in [
        (RmaOp::Put, 0, 0),
        (RmaOp::Put, 0, 1),
        (RmaOp::Put, 4095, 1),
        (RmaOp::Put, 4096, 0),
        (RmaOp::Get, 0, 4096),
        (RmaOp::Get, 4000, 96),
        (RmaOp::Atomic, 0, 8),
        (RmaOp::Atomic, 4088, 8),
    ] {
        assert_eq!(
            regions.check(&k.key, op, offset, len).map(|r| r.0),
            Ok(k.key.region),
            "{op:?} of {len} at {offset}"
        );
        assert_eq!(k.allows(op, offset, len), Ok(()));
    }
}

#[test]
fn accesses_past_the_end_are_refused_with_the_bounds() {
    let mut regions = Regions::default();
    let k = packed(&mut regions, 4096, RemoteAccess::ALL, 7);
    for (op, offset, len, reported) in [
        (RmaOp::Put, 4096, 1, 1),
        (RmaOp::Put, 4095, 2, 2),
        (RmaOp::Get, 0, 4097, 4097),
        (RmaOp::Get, u64::MAX, 2, 2),
        (RmaOp::Put, 1, u64::MAX, u64::MAX),
        (RmaOp::Atomic, 4096, 8, 8),
        // (An atomic's length is its word's, whatever was asked.)
        (RmaOp::Atomic, 4092, 0, 8),
    ] {
        let want = Refusal::OutOfBounds {
            offset,
            len: reported,
            region_len: 4096,
        };
        assert_eq!(regions.check(&k.key, op, offset, len), Err(want));
        assert_eq!(k.allows(op, offset, len), Err(want));
    }
    let e = regions.check(&k.key, RmaOp::Put, 4095, 2).unwrap_err();
    assert_eq!(
        e.to_string(),
        "2 bytes at offset 4095 are outside the 4096-byte region"
    );
}

#[test]
fn unaligned_atomics_are_refused() {
    let mut regions = Regions::default();
    let k = packed(&mut regions, 64, RemoteAccess::ATOMIC, 7);
    for offset in [1, 4, 7, 12, 55] {
        assert_eq!(
            regions.check(&k.key, RmaOp::Atomic, offset, 8),
            Err(Refusal::Unaligned(offset))
        );
    }
}

#[test]
fn each_operation_needs_its_own_access() {
    let mut regions = Regions::default();
    for (granted, ok) in [
        (RemoteAccess::NONE, [false, false, false]),
        (RemoteAccess::READ, [false, true, false]),
        (RemoteAccess::WRITE, [true, false, false]),
        (RemoteAccess::ATOMIC, [false, false, true]),
        (RemoteAccess::ALL, [true, true, true]),
    ] {
        let k = packed(&mut regions, 64, granted, 99);
        for (op, ok) in [RmaOp::Put, RmaOp::Get, RmaOp::Atomic].into_iter().zip(ok) {
            let got = regions.check(&k.key, op, 0, 8);
            if ok {
                assert!(got.is_ok(), "{op:?} with {granted}");
            } else {
                assert_eq!(got, Err(Refusal::NotPermitted { op, granted }));
            }
        }
    }
    let e = Refusal::NotPermitted {
        op: RmaOp::Put,
        granted: RemoteAccess::READ,
    };
    assert_eq!(
        e.to_string(),
        "Put needs remote write, the region was mapped with remote read"
    );
    assert_eq!(RemoteAccess::NONE.to_string(), "no remote access");
    assert!(!RemoteAccess::READ.peer_may_modify());
    assert!(RemoteAccess::WRITE.peer_may_modify() && RemoteAccess::ATOMIC.peer_may_modify());
}

/// A key is refused after its region's unmap, even once its slot is reused under the next
/// generation; refused as a forged key is (`BadKey`: see `stale_and_forged_keys_are_answered_alike`).
#[test]
fn a_key_is_refused_after_unmap_even_once_its_slot_is_reused() {
    let mut regions = Regions::default();
    let old = packed(&mut regions, 64, RemoteAccess::ALL, 1);
    regions.unmap(&old.key).unwrap();
    assert!(regions.is_empty());
    assert_eq!(
        regions.check(&old.key, RmaOp::Get, 0, 8),
        Err(Refusal::BadKey)
    );
    // The slot again, under the next generation and another secret.
    let new = packed(&mut regions, 64, RemoteAccess::ALL, 2);
    assert_eq!(new.key.region, old.key.region);
    assert_eq!(new.key.generation, old.key.generation + 1);
    assert_eq!(
        regions.check(&old.key, RmaOp::Get, 0, 8),
        Err(Refusal::BadKey)
    );
    assert!(regions.check(&new.key, RmaOp::Get, 0, 8).is_ok());
    // Unmapping twice is refused, and leaves the new region alone.
    assert_eq!(regions.unmap(&old.key), Err(Refusal::BadKey));
    assert_eq!(regions.len(), 1);
}

/// Issue 48 (stale-key oracle): a key of an earlier generation was answered `StaleKey`
/// before its secret was checked, so a peer with no key at all learnt, from keys with
/// made-up secrets, which slots had been unmapped and reused (and how often). Now every key
/// that names no mapped region gets the same answer, whether stale with its genuine secret,
/// stale with a made-up one, or forged for the current, a later or an unused generation.
#[test]
fn stale_and_forged_keys_are_answered_alike() {
    let mut regions = Regions::default();
    let a = packed(&mut regions, 64, RemoteAccess::ALL, 0x1111);
    let b = packed(&mut regions, 64, RemoteAccess::ALL, 0x2222);
    // Slot `a` unmapped and mapped again (generation 1); slot `b` unmapped and left free.
    regions.unmap(&a.key).unwrap();
    let a2 = packed(&mut regions, 64, RemoteAccess::ALL, 0x3333);
    assert_eq!(a2.key.region, a.key.region);
    regions.unmap(&b.key).unwrap();
    let made_up = 0x5eed_5eed_5eed_5eed;
    let keys = [
        // Stale, with the genuine secret: the initiator held the key once.
        a.key,
        b.key,
        // Stale generations with a made-up secret: the probe the oracle answered.
        KeyRef {
            secret: made_up,
            ..a.key
        },
        KeyRef {
            secret: made_up,
            ..b.key
        },
        // The current generation of a mapped slot, with a made-up secret.
        KeyRef {
            secret: made_up,
            ..a2.key
        },
        // Later generations, and a slot never used.
        KeyRef {
            generation: 2,
            ..a2.key
        },
        KeyRef {
            generation: 7,
            secret: made_up,
            ..b.key
        },
        KeyRef {
            region: 99,
            generation: 0,
            secret: made_up,
        },
    ];
    for k in keys {
        for op in [RmaOp::Get, RmaOp::Put, RmaOp::Atomic] {
            assert_eq!(regions.check(&k, op, 0, 8), Err(Refusal::BadKey), "{k:?}");
            // Out of bounds too: no check after the key's says anything of the region.
            assert_eq!(
                regions.check(&k, op, 1 << 40, 8),
                Err(Refusal::BadKey),
                "{k:?}"
            );
        }
        assert_eq!(regions.unmap(&k), Err(Refusal::BadKey), "{k:?}");
    }
    assert!(regions.check(&a2.key, RmaOp::Get, 0, 8).is_ok());
    assert_eq!(regions.len(), 1);
}

#[test]
fn forged_keys_are_refused() {
    let mut regions = Regions::default();
    let k = packed(&mut regions, 64, RemoteAccess::ALL, 0xfeed);
    let forged = [
        KeyRef {
            secret: 0xfeee,
            ..k.key
        },
        KeyRef { region: 1, ..k.key },
        KeyRef {
            region: u32::MAX,
            ..k.key
        },
        KeyRef {
            generation: 1,
            ..k.key
        },
    ];
    for f in forged {
        assert_eq!(
            regions.check(&f, RmaOp::Get, 0, 8),
            Err(Refusal::BadKey),
            "{f:?}"
        );
        assert_eq!(regions.unmap(&f), Err(Refusal::BadKey));
    }
    assert_eq!(regions.len(), 1);
}

#[test]
fn many_regions_keep_their_own_keys() {
    let mut regions = Regions::default();
    let keys: Vec<_> = (0..1000u64)
        .map(|i| packed(&mut regions, 8 * (i + 1), RemoteAccess::ALL, i * 31 + 5))
        .collect();
    // Every other one unmapped; the rest still pass, each with its own length.
    for k in keys.iter().step_by(2) {
        regions.unmap(&k.key).unwrap();
    }
    assert_eq!(regions.len(), 500);
    for (i, k) in keys.iter().enumerate() {
        let got = regions.check(&k.key, RmaOp::Get, 0, k.len);
        if i % 2 == 0 {
            assert_eq!(got, Err(Refusal::BadKey));
        } else {
            assert!(got.is_ok());
            assert!(regions.check(&k.key, RmaOp::Get, 0, k.len + 1).is_err());
        }
    }
}

#[test]
fn packed_keys_round_trip() {
    let plain = PackedKey {
        key: KeyRef {
            region: 3,
            generation: 9,
            secret: 0x0102_0304_0506_0708,
        },
        len: 1 << 26,
        access: RemoteAccess {
            read: true,
            write: false,
            atomic: true,
        },
        rdma: None,
    };
    let bytes = plain.encode();
    assert_eq!(bytes.len(), KEY_LEN);
    assert_eq!(&bytes[..2], b"RK");
    assert_eq!(PackedKey::decode(&bytes), Ok(plain));
    let rdma = PackedKey {
        rdma: Some(RdmaPart {
            addr: 0x7f00_dead_b000,
            rkey: 0xabcd,
        }),
        ..plain
    };
    let bytes = rdma.encode();
    assert_eq!(bytes.len(), KEY_LEN_RDMA);
    assert_eq!(PackedKey::decode(&bytes), Ok(rdma));
}

#[test]
fn malformed_keys_are_rejected_by_what_is_wrong() {
    let good = PackedKey {
        key: KeyRef {
            region: 0,
            generation: 0,
            secret: 1,
        },
        len: 64,
        access: RemoteAccess::ALL,
        rdma: Some(RdmaPart {
            addr: 4096,
            rkey: 5,
        }),
    }
    .encode();
    let with = |i: usize, v: u8| {
        let mut b = good.clone();
        b[i] = v;
        b
    };
    assert_eq!(PackedKey::decode(&[]), Err(KeyDecodeError::Length(0)));
    assert_eq!(
        PackedKey::decode(&good[..47]),
        Err(KeyDecodeError::Length(47))
    );
    assert_eq!(
        PackedKey::decode(&with(0, b'X')),
        Err(KeyDecodeError::BadMagic(u16::from_le_bytes([b'X', b'K'])))
    );
    assert_eq!(
        PackedKey::decode(&with(2, 2)),
        Err(KeyDecodeError::BadVersion(2))
    );
    assert_eq!(
        PackedKey::decode(&with(3, 8)),
        Err(KeyDecodeError::BadAccess(8))
    );
    assert_eq!(
        PackedKey::decode(&with(4, 2)),
        Err(KeyDecodeError::BadParts { parts: 2, len: 48 })
    );
    // An RDMA part announced on a key without one, and the other way round.
    assert_eq!(
        PackedKey::decode(&with(4, 0)),
        Err(KeyDecodeError::BadParts { parts: 0, len: 48 })
    );
    let mut short = with(4, 1);
    short.truncate(KEY_LEN);
    assert_eq!(
        PackedKey::decode(&short),
        Err(KeyDecodeError::BadParts { parts: 1, len: 32 })
    );
    assert_eq!(
        PackedKey::decode(&with(6, 1)),
        Err(KeyDecodeError::Reserved)
    );
    assert_eq!(
        PackedKey::decode(&with(45, 1)),
        Err(KeyDecodeError::Reserved)
    );
}

proptest! {
    /// Any bytes: an error or a key, never a panic; and a key decoded re-encodes to the
    /// same bytes (nothing is dropped or defaulted on the way).
    #[test]
    fn decoding_any_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(k) = PackedKey::decode(&bytes) {
            prop_assert_eq!(k.encode(), bytes);
        }
    }

    /// Any key fields survive the round trip.
    #[test]
    fn any_key_round_trips(
        region in any::<u32>(), generation in any::<u32>(), secret in any::<u64>(),
        len in any::<u64>(), bits in 0u8..8, rdma in any::<Option<(u64, u32)>>(),
    ) {
        let k = PackedKey {
            key: KeyRef { region, generation, secret },
            len,
            access: RemoteAccess { read: bits & 1 != 0, write: bits & 2 != 0, atomic: bits & 4 != 0 },
            rdma: rdma.map(|(addr, rkey)| RdmaPart { addr, rkey }),
        };
        prop_assert_eq!(PackedKey::decode(&k.encode()), Ok(k));
    }

    /// The initiator's check and the target's agree on every access.
    #[test]
    fn the_initiator_and_the_target_agree(
        region_len in 0u64..10_000, bits in 0u8..8, op in 0u8..3,
        offset in prop_oneof![0u64..10_100, any::<u64>()], len in prop_oneof![0u64..10_100, any::<u64>()],
    ) {
        let access = RemoteAccess { read: bits & 1 != 0, write: bits & 2 != 0, atomic: bits & 4 != 0 };
        let op = [RmaOp::Put, RmaOp::Get, RmaOp::Atomic][op as usize];
        let mut regions = Regions::default();
        let k = packed(&mut regions, region_len, access, 42);
        let target = regions.check(&k.key, op, offset, len).map(|_| ());
        prop_assert_eq!(k.allows(op, offset, len), target);
        // And an access that passes lies inside the region.
        if target.is_ok() {
            let n = if op == RmaOp::Atomic { 8 } else { len };
            prop_assert!(offset + n <= region_len);
        }
    }
}
