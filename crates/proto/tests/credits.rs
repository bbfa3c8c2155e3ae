//! Flow control from one pool: many connections on one engine, windows that grow on
//! demand and shrink under pressure, and overcommit with RNR retry as the backstop.

mod common;

use common::*;
use rdmx_proto::*;

/// The receive side of `s`'s hub takes every message by wildcard receives; returns, per
/// leaf, the message numbers in the order they were received (checking each payload).
fn drain_hub(s: &mut Sim, leaves: usize, cap: usize) -> Vec<Vec<u64>> {
    let mut posted = Vec::new();
    while s.peers[0].engine.unexpected_len() > 0 {
        posted.push(s.recv(0, 0, 0, cap));
        s.run();
    }
    let mut per_leaf = vec![Vec::new(); leaves + 1];
    for (r, buf) in posted {
        let c = s.completion(0, r).expect("receive completed");
        assert_eq!(c.status, Status::Ok);
        let leaf = c.conn.expect("receive names its connection").0 as usize;
        let k = c.tag & 0xFFFF_FFFF;
        assert_eq!(c.tag >> 32, leaf as u64, "tag names the sender");
        let want = pattern(c.length as usize, c.tag);
        assert_eq!(s.data(0, buf, c.length), want, "payload of {leaf}/{k}");
        per_leaf[leaf].push(k);
    }
    per_leaf
}

/// Every leaf sends `burst` messages at once (sizes cycling through `sizes`).
fn burst_from_every_leaf(s: &mut Sim, leaves: usize, burst: u64, sizes: &[usize]) {
    for leaf in 1..=leaves {
        for k in 0..burst {
            let tag = (leaf as u64) << 32 | k;
            let len = sizes[(k as usize + leaf) % sizes.len()];
            s.send(leaf, 0, tag, pattern(len, tag));
        }
    }
}

fn cfg(depth: u32, initial: u16, max: u16) -> Config {
    Config::builder()
        .recv_buf_size(256)
        .eager_threshold(200)
        .srq_depth(depth)
        .credits(max)
        .initial_credits(initial)
        .rndv_chunk_size(100)
        .build()
        .unwrap()
}

#[test]
fn a_thousand_connections_share_one_pool() {
    const LEAVES: usize = 1024;
    // The defaults' pool and windows (4096 buffers, 4 credits growing to 64), small buffers.
    let hub = cfg(4096, 4, 64);
    let mut s = Sim::star(hub, small_cfg(), LEAVES, 3);
    let st = s.peers[0].engine.credit_stats();
    assert_eq!(
        (st.pool, st.granted),
        (4096, 4096),
        "1024 initial grants of 4"
    );
    burst_from_every_leaf(&mut s, LEAVES, 6, &[0, 8, 150, 900]);
    s.run();
    assert_eq!(s.rnr_stalls, 0, "a frame found the hub's SRQ empty");
    let per_leaf = drain_hub(&mut s, LEAVES, 1000);
    for (leaf, ks) in per_leaf.iter().enumerate().skip(1) {
        assert_eq!(
            ks,
            &(0..6).collect::<Vec<_>>(),
            "leaf {leaf}: lost or reordered"
        );
    }
    let st = s.peers[0].engine.credit_stats();
    assert!(st.granted <= st.pool, "{st:?}");
    assert!(
        st.refused > 0,
        "bursts of 6 over windows of 4 asked for more: {st:?}"
    );
    for leaf in 1..=LEAVES {
        assert_eq!(s.peers[leaf].engine.pending_requests(), 0);
    }
    assert_eq!(s.peers[0].engine.pending_requests(), 0);
    s.assert_srq_full();
}

#[test]
fn windows_grow_on_demand_and_shrink_for_others() {
    // A pool of 64: one busy peer may take most of it, until a second one needs some.
    let mut s = Sim::star(cfg(64, 4, 60), small_cfg(), 2, 9);
    let window = |s: &Sim, leaf: usize| s.peers[0].engine.conn_stats(conn(leaf)).unwrap().window;
    assert_eq!(window(&s, 1), 4);
    for round in 0..20u64 {
        for k in 0..64 {
            let tag = 1 << 32 | (round * 64 + k);
            s.send(1, 0, tag, pattern(100, tag));
        }
        s.run();
    }
    let grown = window(&s, 1);
    assert_eq!(grown, 60, "a streaming peer's window grew to the largest");
    let st = s.peers[0].engine.credit_stats();
    assert!(st.grown > 0 && st.granted <= 64, "{st:?}");
    // Now both stream: the second asks for more than the pool has left.
    for round in 0..20u64 {
        for leaf in 1..=2u64 {
            for k in 0..64 {
                let tag = leaf << 32 | (10_000 + round * 64 + k);
                s.send(leaf as usize, 0, tag, pattern(100, tag));
            }
        }
        s.run();
    }
    let st = s.peers[0].engine.credit_stats();
    assert!(
        st.refused > 0 && st.reclaimed > 0,
        "{st:?} {} {}",
        window(&s, 1),
        window(&s, 2)
    );
    assert!(
        window(&s, 2) > 4,
        "the second peer got credits back from the first"
    );
    assert!(st.granted <= 64, "{st:?}");
    assert_eq!(s.rnr_stalls, 0, "the pool was never overrun");
    let per_leaf = drain_hub(&mut s, 2, 200);
    assert_eq!(per_leaf[1].len(), 2560);
    let mut first: Vec<u64> = (0..1280).collect();
    first.extend(10_000..11_280);
    assert_eq!(per_leaf[1], first);
    assert_eq!(per_leaf[2], (10_000..11_280).collect::<Vec<_>>());
    s.assert_srq_full();
}

#[test]
fn overcommitted_pool_relies_on_rnr_retry_and_loses_nothing() {
    // 16 buffers, 12 peers granted 4 each: bursts wait in the fabric (RNR), none is lost.
    const LEAVES: usize = 12;
    let mut s = Sim::star(cfg(16, 4, 8), small_cfg(), LEAVES, 5);
    assert_eq!(s.peers[0].engine.credit_stats().granted, 48);
    burst_from_every_leaf(&mut s, LEAVES, 10, &[1, 150, 500]);
    // The hub posts nothing until everything arrived (its buffers come back as each frame
    // is handled, as a driver reposts them).
    s.run();
    let per_leaf = drain_hub(&mut s, LEAVES, 600);
    for (leaf, ks) in per_leaf.iter().enumerate().skip(1) {
        assert_eq!(ks, &(0..10).collect::<Vec<_>>(), "leaf {leaf}");
    }
    let st = s.peers[0].engine.credit_stats();
    assert_eq!(
        st.grown, 0,
        "an overcommitted pool grants nothing more: {st:?}"
    );
    s.assert_srq_full();
}

#[test]
fn admission_is_never_refused_and_handshakes_are_checked() {
    let cfg = small_cfg(); // 16 buffers, windows of 4 growing to 8
    let hs = Engine::new(cfg.clone()).local_handshake();
    assert_eq!((hs.credits, hs.max_credits), (4, 8));
    let mut e = Engine::new(cfg);
    for c in 1..=100 {
        e.handle_connection_up(ConnId(c), &hs).unwrap();
    }
    assert_eq!(e.credit_stats().granted, 400);
    assert!(matches!(
        e.handle_connection_up(ConnId(1), &hs),
        Err(Error::DuplicateConnection(_))
    ));
    for c in (1..=100).step_by(2) {
        e.handle_connection_down(ConnId(c));
    }
    assert_eq!(
        e.credit_stats().granted,
        200,
        "windows of gone connections return"
    );
    let mut bad = hs;
    bad.version = 9;
    let mut shrinking = hs;
    shrinking.max_credits = 3;
    let mut tiny = hs;
    tiny.credits = 2;
    for bad in [bad, shrinking, tiny] {
        assert!(matches!(
            Engine::new(small_cfg()).handle_connection_up(ConnId(1), &bad),
            Err(Error::Handshake(_))
        ));
    }
}

#[test]
fn offers_shrink_as_the_pool_fills() {
    // The defaults: 4096 buffers, windows of 4 growing to 64.
    let cfg = Config::default();
    let hs = Engine::new(cfg.clone()).local_handshake();
    let mut e = Engine::new(cfg);
    let mut offers = Vec::new();
    for c in 0..1024 {
        let limits = ConnLimits {
            credits: e.credit_offer(),
            ..e.default_limits()
        };
        assert_eq!(e.local_handshake_for(&limits).credits, limits.credits);
        e.handle_connection_up_with(ConnId(c), &hs, limits).unwrap();
        assert_eq!(
            e.conn_stats(ConnId(c)).unwrap().window,
            u32::from(limits.credits)
        );
        offers.push(limits.credits);
        if c == 255 {
            assert!(
                e.credit_stats().granted <= 4096,
                "256 endpoints fit the pool"
            );
        }
    }
    assert_eq!(offers[0], 32);
    assert!(offers.windows(2).all(|w| w[1] <= w[0]), "offers never grow");
    assert_eq!(*offers.last().unwrap(), 4, "never below the initial grant");
    println!("offers {:?}; {:?}", &offers[..8], e.credit_stats());
}

/// A ping-pong carries no CREDIT frames, even once one went out: a CREDIT frame is due for
/// the peer's messages, never for its CREDIT frames alone. (When every frame counted, two
/// messages in a row, as a ping-pong's first exchange may have, started a CREDIT frame
/// beside every message, each way, for good: with 4- and 8-credit windows the threshold
/// of 2 is met by one message and one CREDIT frame; RDMX_SRQ_DEPTH=1024 tripled the 8 B
/// latency over TCP that way.)
#[test]
fn a_ping_pong_carries_no_credit_frames() {
    for (initial, max) in [(4, 4), (8, 8), (4, 64)] {
        let mut s = Sim::uniform(2, cfg(1024, initial, max), 11);
        // Two messages before any answer: peer 1 owes 2 credits and sends a CREDIT frame,
        // which peer 0 has not answered when peer 1's first message comes.
        for k in 0..2 {
            s.recv(1, k, !0, 8);
        }
        for k in 0..2 {
            s.send(0, 1, k, pattern(8, k));
        }
        s.run();
        let before = s.frames_delivered;
        let trips = 100;
        for k in 0..trips {
            for (from, to) in [(1, 0), (0, 1)] {
                let (r, buf) = s.recv(to, k, !0, 8);
                s.send(from, to, k, pattern(8, k));
                s.run();
                let c = s.completion(to, r).expect("the message arrived");
                assert_eq!((c.status, s.data(to, buf, 8)), (Status::Ok, pattern(8, k)));
            }
        }
        assert_eq!(
            s.frames_delivered - before,
            2 * trips,
            "frames for {trips} round trips (windows of {initial}..={max})"
        );
        s.assert_srq_full();
    }
}

/// The frames `e`'s actions send (payloads of `len` zero bytes), its other actions dropped.
fn frames_out(e: &mut Engine) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(a) = e.poll_action() {
        if let Action::SendFrame { frame, payload, .. } = a {
            let mut b = frame.as_bytes().to_vec();
            b.resize(b.len() + payload.map_or(0, |p| p.len as usize), 0);
            out.push(b);
        }
    }
    out
}

/// A connection whose link holds the frames in flight itself (shared memory's ring) grants a
/// fixed window: nothing of the pool, never grown though the sender asks, and returned a
/// quarter at a time — three windows of messages to a peer that posts no receive arrive
/// whole, in order, with a handful of CREDIT frames.
#[test]
fn a_fixed_window_is_not_from_the_pool_and_never_grows() {
    let window = 1024u16;
    let cfg = Config::default();
    let mut e = [Engine::new(cfg.clone()), Engine::new(cfg)];
    let limits = e.each_ref().map(|e| ConnLimits {
        credits: window,
        pooled: false,
        ..e.default_limits()
    });
    let hs = [0, 1].map(|i| e[i].local_handshake_for(&limits[i]));
    assert_eq!((hs[0].credits, hs[0].max_credits), (window, window));
    e[0].handle_connection_up_with(ConnId(1), &hs[1], limits[0])
        .unwrap();
    e[1].handle_connection_up_with(ConnId(0), &hs[0], limits[1])
        .unwrap();
    for side in &e {
        assert_eq!(side.credit_stats().granted, 0, "taken from the pool");
    }
    let n = 3 * u64::from(window);
    for k in 0..n {
        e[0].tag_send(ConnId(1), k, UserBufId(k), 8).unwrap();
    }
    let mut wire = frames_out(&mut e[0]);
    // One credit stays in reserve for credit updates.
    assert_eq!(wire.len(), usize::from(window) - 1);
    let stats = e[0].conn_stats(ConnId(1)).unwrap();
    assert_eq!(stats.queued as u64, n - u64::from(window) + 1);
    assert_eq!(stats.peer_max_credits, u32::from(window));
    let mut credit_frames = 0;
    while !wire.is_empty() {
        for f in wire.drain(..) {
            assert!(e[1].handle_frame_delivering(ConnId(0), &f).is_none());
        }
        let back = frames_out(&mut e[1]);
        credit_frames += back.len();
        for f in back {
            assert!(e[0].handle_frame_delivering(ConnId(1), &f).is_none());
        }
        wire = frames_out(&mut e[0]);
    }
    assert_eq!(e[1].unexpected_len() as u64, n, "every message arrived");
    for k in 0..n {
        assert_eq!(e[1].probe_remove(k, !0).map(|p| p.tag), Some(k), "in order");
    }
    assert!(
        (1..=12).contains(&credit_frames),
        "{credit_frames} CREDIT frames for {n} messages (a quarter window each)"
    );
    for (side, peer) in [(0, 1), (1, 0)] {
        let st = e[side].conn_stats(ConnId(peer)).unwrap();
        assert_eq!(st.window, u32::from(window), "side {side}'s window changed");
        assert_eq!(e[side].credit_stats().granted, 0);
    }
}
