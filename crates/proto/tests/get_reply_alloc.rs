//! Issue 48, item 2: what a peer's get makes the target allocate, counted by dhat's heap
//! profiler — in a test binary of its own, with one test, so that no other test's
//! allocations are counted. The peer, played by the test on the simulated fabric, declares
//! 16 MiB receive buffers (the most a handshake may); the target's are the default 8 KiB.

mod common;

use common::rma::*;
use common::*;
use rdmx_proto::rma::{KeyRef, RemoteAccess};
use rdmx_proto::wire::{self, Header, Opcode, RmaBody, WireStatus};
use rdmx_proto::*;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// A GET frame granting one credit: `len` bytes at 0 of `key`'s region.
fn get_frame(seq: u32, key: KeyRef, len: u64) -> Vec<u8> {
    let mut h = Header::new(Opcode::Get);
    h.seq = seq;
    h.credits = 1;
    h.sreq = u64::from(seq) + 1;
    h.payload_len = RmaBody::LEN as u32;
    wire::FrameBuf::encode_rma(&h, &RmaBody { key, word: len })
        .as_bytes()
        .to_vec()
}

/// Before: the reply buffer was sized to the requested length before the key was checked,
/// and the length was bounded only by the peer's declared buffers — 32 gets with a bogus
/// key for 8152 bytes allocated 32 x 8152 bytes, and one for 16 MiB allocated 16 MiB. Now a
/// refused get allocates nothing of its length (under 1 KiB a get, all told: the frame's
/// copy, the reply's record, the actions), and one asking for more than a reply into the
/// target's buffers carries is a protocol error: the heap never passes 1 MiB. A legitimate
/// peer exchanges messages with the target after it.
#[test]
fn a_get_allocates_within_the_target_s_bounds_whatever_the_peer_declares() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let big = Config::builder().recv_buf_size(16 << 20).build().unwrap();
    let mut sim = Sim::new(vec![big, Config::default(), Config::default()], 51);
    let mem = with_memory(&mut sim);
    let key = mem[1].map(64, RemoteAccess::READ);
    sim.capture(1, 0);
    let bogus = KeyRef {
        secret: key.key.secret ^ 1,
        ..key.key
    };
    let room = u64::from(Config::default().recv_buf_size) - HEADER_LEN as u64;
    let frames: Vec<Vec<u8>> = (0..32).map(|i| get_frame(i, bogus, room)).collect();
    let (n, last) = (frames.len() as u64, frames.len() as u32);

    let before = dhat::HeapStats::get();
    for f in frames {
        sim.inject(0, 1, f);
        sim.run();
    }
    let after = dhat::HeapStats::get();
    let per_get = (after.total_bytes - before.total_bytes) / n;
    println!("a refused {room}-byte get: {per_get} bytes allocated");
    let replies = sim.take(1, 0);
    assert_eq!(replies.len() as u64, n);
    for r in &replies {
        let h = wire::decode_header(r).unwrap();
        assert_eq!((h.opcode, h.status), (Opcode::RmaReply, WireStatus::BadKey));
    }
    assert!(
        per_get < 1024,
        "a refused {room}-byte get allocated {per_get} bytes"
    );

    sim.inject(0, 1, get_frame(last, bogus, (16 << 20) - HEADER_LEN as u64));
    sim.run();
    assert!(
        matches!(sim.peers[1].closed.as_slice(), [(c, CloseReason::ProtocolError(_))] if *c == conn(0)),
        "{:?}",
        sim.peers[1].closed
    );
    let peak = dhat::HeapStats::get().max_bytes;
    println!("heap peak: {peak} bytes");
    assert!(peak < 1 << 20, "the heap peaked at {peak} bytes");

    let (r, buf) = sim.recv(1, 9, u64::MAX, 100);
    let s = sim.send(2, 1, 9, pattern(100, 9));
    sim.run();
    assert_eq!(status(&sim, 1, r), Status::Ok);
    assert_eq!(status(&sim, 2, s), Status::Ok);
    assert_eq!(sim.data(1, buf, 100), pattern(100, 9));
}
