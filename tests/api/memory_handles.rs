//! Memory mapped for remote access and remote keys (`Worker::mem_map`, `MemHandle`,
//! `Ep::unpack_rkey`): keys travel to the peer as tag messages and unpack there; local
//! access goes through the handle's copying and atomic accessors only.

use super::*;
use rdmx::{Error, RemoteAccess};

pub fn memory_handles_and_remote_keys() {
    init_log();
    let ctx = builder().build().unwrap();
    let (sw, se, cw, ce) = pair(&ctx);
    // A region for each access, its key sent to the peer in a tag message.
    let accesses = [
        RemoteAccess::NONE,
        RemoteAccess::READ,
        RemoteAccess::WRITE,
        RemoteAccess::ATOMIC,
        RemoteAccess::ALL,
    ];
    let regions: Vec<_> = accesses
        .iter()
        .enumerate()
        .map(|(i, &a)| sw.mem_map(4096 * i + 1, a).expect("mem_map"))
        .collect();
    assert_eq!(sw.stats().mapped_regions, regions.len());
    for (i, m) in regions.iter().enumerate() {
        assert_eq!((m.len(), m.access()), (4096 * i + 1, accesses[i]));
        finish(se.tag_send(100 + i as u64, m.pack_rkey())).expect("key sent");
    }
    for (i, m) in regions.iter().enumerate() {
        let d = finish(cw.tag_recv(100 + i as u64, TAG_MASK_ALL, vec![0; 64])).expect("key");
        let key = ce.unpack_rkey(&d.buf[..d.length]).expect("a packed key");
        assert_eq!(key.len(), m.len() as u64);
        assert_eq!(key.access(), m.access());
        assert_eq!(key.ep(), ce.id());
    }
    // Bytes that are not a packed key: a clear error, never a panic.
    let packed = regions[4].pack_rkey();
    let mut wrong_magic = packed.clone();
    wrong_magic[0] ^= 0xff;
    for bad in [
        &packed[..packed.len() - 1],
        &[][..],
        &[0u8; 32][..],
        &wrong_magic[..],
    ] {
        let err = ce.unpack_rkey(bad).expect_err("not a key");
        assert!(matches!(err, Error::RemoteKey(_)), "{err:?}");
        assert!(err.to_string().contains("not a packed remote key"), "{err}");
    }

    // Local access: byte-exact at the region's edges, bytes around a write untouched.
    let base = pattern(1000, 3);
    let m = sw.mem_map_from(&base, RemoteAccess::ALL).unwrap();
    assert_eq!(m.to_vec(), base);
    let mut want = base.clone();
    for (offset, len) in [
        (0, 0),
        (0, 1),
        (999, 1),
        (3, 13),
        (8, 8),
        (500, 500),
        (1000, 0),
    ] {
        let data = pattern(len, offset as u8);
        m.write(offset, &data).unwrap();
        want[offset..offset + len].copy_from_slice(&data);
        let mut got = vec![0; len];
        m.read(offset, &mut got).unwrap();
        assert_eq!(got, data, "{len} bytes at {offset}");
    }
    assert_eq!(m.to_vec(), want);
    // Outside the region, and unaligned words: refused, naming what was wrong.
    let err = m.read(999, &mut [0; 2]).expect_err("past the end");
    assert!(matches!(err, Error::Rma(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("2 bytes at offset 999 are outside the 1000-byte region"),
        "{err}"
    );
    assert!(m.write(1001, &[]).is_err());
    let err = m.fetch_add(4, 1).expect_err("unaligned");
    assert!(err.to_string().contains("not a multiple of 8"), "{err}");
    assert!(m.load(1000).is_err());
    m.store(992, u64::MAX).unwrap();
    want[992..].fill(0xff);

    // Atomic words from several threads: 4 × 10 000 fetch-and-adds give the exact total;
    // compare-and-swap used as a lock by 4 threads keeps a plain counter exact.
    let counter = sw.mem_map(64, RemoteAccess::ATOMIC).unwrap();
    thread::scope(|s| {
        for t in 1..=4u64 {
            let c = &counter;
            s.spawn(move || {
                for _ in 0..10_000 {
                    c.fetch_add(0, 1).unwrap();
                }
                for _ in 0..1_000 {
                    while c.compare_swap(8, 0, t).unwrap() != 0 {
                        std::hint::spin_loop();
                    }
                    let v = c.load(16).unwrap();
                    c.store(16, v + 1).unwrap();
                    assert_eq!(c.compare_swap(8, t, 0).unwrap(), t);
                }
            });
        }
    });
    assert_eq!(counter.load(0).unwrap(), 40_000);
    assert_eq!(counter.load(16).unwrap(), 4_000);

    // Unmapping hands the bytes back; dropping a handle unmaps it too.
    let mapped = sw.stats().mapped_regions;
    assert_eq!(m.unmap(), want);
    drop(counter);
    assert_eq!(sw.stats().mapped_regions, mapped - 2);
    drop(regions);
    assert_eq!(sw.stats().mapped_regions, 0);
    // (The client mapped nothing.)
    assert_eq!(cw.stats().mapped_regions, 0);
}
