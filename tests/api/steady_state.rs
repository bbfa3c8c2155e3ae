//! Steady-state messaging costs no heap allocation: the test of the hot path's promise.

use rdmx::{Ep, Request, Worker, TAG_MASK_ALL};

use super::{builder, init_log, isolated, pair};

/// Round trips measured (after as many to warm up).
const ROUND_TRIPS: u64 = 2000;

/// Once warm, a small eager message sent and received costs no heap allocation, in rdmx or
/// the transport's driver: 2000 round trips of 8 bytes (receive posted, send, both progressed
/// by one thread until both completed, the buffers reused) after 2000 to warm up, counted by
/// dhat's heap profiler in a process of its own (no other test's allocations counted).
pub fn steady_state_messaging_allocates_nothing() {
    init_log();
    if std::env::var("RDMX_TEST_ROLE").as_deref() != Ok("measure") {
        return isolated("steady_state_messaging_allocates_nothing", "measure");
    }
    let ctx = builder().build().unwrap();
    let (server, sep, client, cep) = pair(&ctx);
    let mut bufs = (vec![7u8; 8], vec![0u8; 8], vec![9u8; 8], vec![0u8; 8]);
    let _profiler = dhat::Profiler::builder().testing().build();
    let run = |n: u64, bufs: &mut (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>)| {
        for i in 0..n {
            let (ping, into) =
                one_way(&client, &cep, &server, take(&mut bufs.0), take(&mut bufs.1));
            assert_eq!(into, [7u8; 8], "round trip {i}: the ping arrived intact");
            let (pong, back) =
                one_way(&server, &sep, &client, take(&mut bufs.2), take(&mut bufs.3));
            assert_eq!(back, [9u8; 8], "round trip {i}: the pong arrived intact");
            *bufs = (ping, into, pong, back);
        }
    };
    run(ROUND_TRIPS, &mut bufs);
    let before = dhat::HeapStats::get();
    run(ROUND_TRIPS, &mut bufs);
    let after = dhat::HeapStats::get();
    let blocks = after.total_blocks - before.total_blocks;
    let bytes = after.total_bytes - before.total_bytes;
    println!("{ROUND_TRIPS} warm round trips of 8 B: {blocks} allocations, {bytes} bytes");
    assert_eq!(
        blocks, 0,
        "warm round trips allocated {blocks} blocks ({bytes} bytes) in {ROUND_TRIPS} round trips"
    );
}

fn take(v: &mut Vec<u8>) -> Vec<u8> {
    std::mem::take(v)
}

/// Posts the receive on `to`, sends on `ep`, and progresses both workers until both
/// requests completed; hands back the send's and the receive's buffers.
fn one_way(from: &Worker, ep: &Ep, to: &Worker, msg: Vec<u8>, into: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
    let r = to.tag_recv(1, TAG_MASK_ALL, into);
    let s = ep.tag_send(1, msg);
    until_done(&[&r, &s], &[from, to]);
    let sent = s.wait().expect("send").buf;
    let got = r.wait().expect("receive");
    assert_eq!(got.length, 8);
    (sent, got.buf)
}

fn until_done(reqs: &[&Request], workers: &[&Worker]) {
    let deadline = std::time::Instant::now() + super::long();
    while !reqs.iter().all(|r| r.is_done()) {
        assert!(std::time::Instant::now() < deadline, "a round trip hung");
        for w in workers {
            w.progress();
        }
    }
}
