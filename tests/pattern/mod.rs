//! Test data: messages whose every byte says where it belongs, made cheaply enough for an
//! unoptimised test binary in an emulated guest.

/// `len` bytes seeded by `seed`: a 256-byte row that depends on the seed, repeated, with
/// each 2 KiB block's first 4 bytes XORed with the block's index, so that neither a byte
/// shifted within a block nor a whole block out of place compares equal. The same `len` and
/// `seed` always give the same bytes, and a shorter message is a prefix of a longer one.
///
/// It is built by copying rows, not byte by byte: in the Soft-RoCE guests (TCG, debug
/// build) a closure per byte took about 13 s for the 40 MiB one test sends, most of that
/// test's time bound.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    let row: Vec<u8> = (0..=255u8)
        .map(|i| i.wrapping_mul(31).wrapping_add(seed))
        .collect();
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        let n = (len - v.len()).min(row.len());
        v.extend_from_slice(&row[..n]);
    }
    for (i, block) in v.chunks_mut(2048).enumerate() {
        for (b, s) in block.iter_mut().zip((i as u32).to_le_bytes()) {
            *b ^= s;
        }
    }
    v
}
