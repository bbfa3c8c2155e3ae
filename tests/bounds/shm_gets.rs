//! Shared memory's rendezvous by copy and its outboxes: what a peer can have a worker answer
//! and hold for it. A peer's GETs unanswered are bounded (64 per connection), and so are the
//! bytes waiting to go into a ring the peer leaves full (its window of frames, each as large
//! as this side's receive buffers); at either bound that peer's endpoint fails, alone. Two
//! legitimate peers copying rendezvous data both ways never reach them, and never both stop.

use std::sync::Arc;
use std::time::Instant;

use rdmx::{Ep, Transport, Worker, TAG_MASK_ALL};

use crate::shm_raw::{self, get_record, KIND_GET};
use crate::{
    connected, context, default_handshake, exchange, init_log, listening, measuring,
    progress_until, LONG, MIB,
};

/// Shared memory with rendezvous data copied through the rings.
fn copying() -> rdmx::Context {
    context(Transport::Shm, &[(rdmx::SHM_CMA_VAR, "0")])
}

/// A legitimate peer of the victim listening at `addr` (with `listener`): its worker, its
/// endpoint and the victim's.
fn legitimate(listener: &rdmx::Listener, addr: &str) -> (Worker, Ep, Ep) {
    let (w, ep, victims) = connected(&copying(), listener, addr);
    assert_eq!(ep.transport(), Transport::Shm);
    (w, ep, victims)
}

/// What a worker's outboxes may hold for one peer that never reads its ring: 1024 frames of
/// the 16 KiB receive buffer (each counted 64 bytes more), and 128 GETs or answers: 16.1 MiB.
const OUTBOX_BOUND: u64 = 1024 * (rdmx::SHM_RECV_BUF_SIZE as u64 + 64) + 128 * 96;

/// A peer writes GET records (for a buffer that was never exposed: each is answered with a
/// refusal) into the victim's ring as fast as it can and never reads its own ring. Before
/// the bound the victim queued an answer for every GET once the peer's ring was full (3 M
/// GETs grew it by 137 MiB); now the peer's endpoint fails at its 65th GET unanswered.
#[test]
fn a_peer_flooding_gets_fails_alone_and_the_victim_stays_bounded() {
    let _measuring = measuring();
    init_log();
    let (victim, listener, addr) = listening(&copying());
    let (good, good_ep, victims_good_ep) = legitimate(&listener, &addr);
    let mut raw = shm_raw::connect(&listener, &default_handshake());

    // The bound: what waits for the hostile peer (at most 64 answers of 64 bytes as counted)
    // and for the legitimate one (a few records of its exchange) stays far below 1 MiB.
    let bound = MIB as u64;
    let deadline = Instant::now() + LONG;
    let (mut gets, mut rounds, mut peak) = (0u64, 0u32, 0);
    while raw.ep.close_reason().is_none() {
        assert!(
            Instant::now() < deadline,
            "the flood never ended ({gets} GETs)"
        );
        assert!(
            gets < 4_000_000,
            "the victim took {gets} GETs without stopping the peer"
        );
        let get = get_record(gets, 0xbad_bad, 0x1000, 4096);
        while raw
            .tx
            .push_kind(KIND_GET, &[&get])
            .expect("the victim's ring")
        {
            gets += 1;
        }
        victim.progress();
        let queued = victim.stats().send_queue_bytes;
        peak = peak.max(queued);
        assert!(
            queued <= bound,
            "the victim holds {queued} bytes for its peers after {gets} GETs (bound {bound})"
        );
        rounds += 1;
        if rounds % 256 == 0 {
            exchange(&good, &good_ep, &victim, &victims_good_ep);
        }
    }
    let reason = raw.ep.close_reason().expect("closed");
    assert!(
        reason.contains("more than 64 GETs"),
        "the flooding peer's endpoint closed for {reason}"
    );
    log::info!("the flood ended after {gets} GETs, {rounds} rounds; peak queued {peak} bytes");
    // Its ring is no longer read, and what waited for it is dropped.
    let get = get_record(0, 1, 2, 3);
    while raw
        .tx
        .push_kind(KIND_GET, &[&get])
        .expect("the victim's ring")
    {}
    for _ in 0..1000 {
        victim.progress();
    }
    assert_eq!(victim.stats().send_queue_bytes, 0);
    exchange(&good, &good_ep, &victim, &victims_good_ep);
    assert!(victims_good_ep.close_reason().is_none());
}

/// A peer that declares a window far beyond the ring's (65535 frames) and never reads its
/// ring: the victim's sends to it go into the ring until it is full, then wait in the
/// victim's outbox. Before the bound they waited there without end (every frame the window
/// allows); now the endpoint fails once its outbox would hold more than its bound (1024
/// frames of 16 KiB), and only that endpoint.
#[test]
fn a_peer_that_never_reads_its_ring_fails_at_the_outbox_bound() {
    let _measuring = measuring();
    init_log();
    let (victim, listener, addr) = listening(&copying());
    let (good, good_ep, victims_good_ep) = legitimate(&listener, &addr);
    let mut hs = default_handshake();
    hs.recv_buf_size = rdmx::SHM_RECV_BUF_SIZE;
    hs.credits = u16::MAX;
    hs.max_credits = u16::MAX;
    let raw = shm_raw::connect(&listener, &hs);

    let bound = OUTBOX_BOUND;
    let block = Arc::new(vec![0x33u8; rdmx::SHM_EAGER_THRESHOLD as usize]);
    let mut sends = Vec::new();
    let mut peak = 0;
    for i in 0..4096 {
        if raw.ep.close_reason().is_some() {
            break;
        }
        sends.push(raw.ep.tag_send_shared(7, &block));
        victim.progress();
        let queued = victim.stats().send_queue_bytes;
        peak = peak.max(queued);
        assert!(
            queued <= bound,
            "the victim holds {queued} bytes for a peer that reads nothing, after {i} sends \
             (bound {bound})"
        );
        if i % 512 == 0 {
            exchange(&good, &good_ep, &victim, &victims_good_ep);
        }
    }
    let reason = raw
        .ep
        .close_reason()
        .expect("the endpoint failed at the bound");
    assert!(
        reason.contains("left its ring full"),
        "the endpoint closed for {reason}"
    );
    assert!(peak > bound / 2, "the outbox filled up to {peak} bytes");
    // What waited for it is dropped with it; its sends end.
    progress_until(&[&victim], "the failed endpoint's sends", || {
        victim.stats().send_queue_bytes == 0 && sends.iter().all(|s| s.is_done())
    });
    exchange(&good, &good_ep, &victim, &victims_good_ep);
    assert!(victims_good_ep.close_reason().is_none());
}

/// Two legitimate peers copying rendezvous data (CMA off) both ways at once, many messages
/// each way, large and eager, all posted together: each side has more READs than the 64 GETs
/// a peer may have unanswered (its link holds the rest back), and its outbox fills with
/// eager frames behind a full ring. Neither endpoint fails, every message arrives whole:
/// reading a ring never waits for the outbox, so the two can never both stop.
#[test]
fn two_peers_copying_both_ways_never_both_stop() {
    let _measuring = measuring();
    init_log();
    let (a, listener, addr) = listening(&copying());
    let (b, b_ep, a_ep) = legitimate(&listener, &addr);
    // Sizes each way: eager up to the threshold, rendezvous of one chunk and of several.
    let mut sizes = Vec::new();
    for i in 0..160usize {
        sizes.push(1 + (i * 997) % rdmx::SHM_EAGER_THRESHOLD as usize);
    }
    for i in 0..100usize {
        sizes.push(rdmx::SHM_EAGER_THRESHOLD as usize + 1 + i * 1000);
    }
    sizes.extend([3 * MIB + 5, 2 * MIB]);
    let pattern = |dir: u8, i: usize, len: usize| -> Vec<u8> {
        (0..len).map(|j| (j as u8) ^ (i as u8) ^ dir).collect()
    };
    let mut recvs = Vec::new();
    let mut sends = Vec::new();
    for (dir, (to, from)) in [(1u8, (&b, &a_ep)), (2u8, (&a, &b_ep))] {
        for (i, &len) in sizes.iter().enumerate() {
            let tag = (u64::from(dir) << 32) | i as u64;
            recvs.push((dir, i, len, to.tag_recv(tag, TAG_MASK_ALL, vec![0; len])));
        }
        for (i, &len) in sizes.iter().enumerate() {
            let tag = (u64::from(dir) << 32) | i as u64;
            sends.push(from.tag_send(tag, pattern(dir, i, len)));
        }
    }
    let bound = OUTBOX_BOUND;
    let deadline = Instant::now() + LONG;
    let mut peak = 0;
    while !(sends.iter().all(|s| s.is_done()) && recvs.iter().all(|r| r.3.is_done())) {
        assert!(
            Instant::now() < deadline,
            "the two peers stopped: {} sends and {} receives left",
            sends.iter().filter(|s| !s.is_done()).count(),
            recvs.iter().filter(|r| !r.3.is_done()).count()
        );
        a.progress();
        b.progress();
        for w in [&a, &b] {
            let q = w.stats().send_queue_bytes;
            peak = peak.max(q);
            assert!(q <= bound, "{q} bytes queued, over the bound {bound}");
        }
    }
    for s in sends {
        s.wait().expect("send");
    }
    for (dir, i, len, r) in recvs {
        let got = r.wait().expect("receive");
        assert!(
            got.buf == pattern(dir, i, len),
            "message {i} of direction {dir}"
        );
    }
    assert!(peak > 0, "the outboxes were used");
    assert!(a_ep.close_reason().is_none() && b_ep.close_reason().is_none());
    log::info!("peak queued {peak} bytes");
}
