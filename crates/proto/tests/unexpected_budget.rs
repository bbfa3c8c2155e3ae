//! The unexpected-message budget on the simulated fabric: a peer that floods a worker whose
//! application posts no receive waits on credit once the worker holds its budget, while
//! the worker's other peers, its own frames to the flooder and the flooder's control frames
//! go on; once receives drain the queue, every message arrives, whole and in order.

mod common;

use common::*;
use rdmx_proto::config::UNEXPECTED_ENTRY_COST;
use rdmx_proto::rma::{KeyRef, PackedKey, RefusalKind, RemoteAccess};
use rdmx_proto::*;

/// Payload of each flooded message (eager: at most 200 bytes with `cfg`).
const LEN: usize = 200;
/// The largest window a peer is granted with `cfg`.
const WINDOW: u64 = 8;

fn cfg(budget: u64) -> Config {
    Config::builder()
        .recv_buf_size(256)
        .eager_threshold(200)
        .srq_depth(64)
        .credits(WINDOW as u16)
        .rndv_chunk_size(100)
        .max_unexpected(budget)
        .build()
        .unwrap()
}

/// What the victim may hold with `budget`: the budget, and what one peer's window held in
/// flight when it was reached (a window of eager frames per flooding peer).
fn bound(budget: u64, flooders: u64) -> u64 {
    budget + flooders * WINDOW * (LEN as u64 + UNEXPECTED_ENTRY_COST)
}

/// A key no peer mapped: a one-sided operation on it is answered with a refusal.
fn unmapped_key() -> PackedKey {
    PackedKey {
        key: KeyRef {
            region: 0,
            generation: 0,
            secret: 1,
        },
        len: 64,
        access: RemoteAccess::ALL,
        rdma: None,
    }
}

/// Peer `from` sends `n` messages of `LEN` bytes tagged `base + k` to peer `to`.
fn flood(s: &mut Sim, from: usize, to: usize, base: u64, n: u64) -> Vec<RequestId> {
    (0..n)
        .map(|k| s.send(from, to, base + k, pattern(LEN, base + k)))
        .collect()
}

/// Peer `at` receives `n` messages tagged `base + k` from anyone, in order, checking each
/// (and the bound after each); returns the most it held meanwhile.
fn drain(s: &mut Sim, at: usize, base: u64, n: u64, limit: u64) -> u64 {
    let mut most = 0;
    for k in 0..n {
        let tag = base + k;
        let (r, buf) = s.recv(at, 0, 0, LEN);
        s.run();
        let c = s.completion(at, r).expect("a flooded message arrived");
        assert_eq!((c.status, c.tag), (Status::Ok, tag), "message {k} in order");
        assert_eq!(
            s.data(at, buf, LEN as u64),
            pattern(LEN, tag),
            "bytes of {k}"
        );
        most = most.max(s.peers[at].engine.unexpected_bytes());
        assert!(most <= limit, "{most} bytes held, bound {limit}");
    }
    most
}

fn pending_sends(s: &Sim, i: usize, sends: &[RequestId]) -> usize {
    sends
        .iter()
        .filter(|r| s.completion(i, **r).is_none())
        .count()
}

#[test]
fn a_flood_waits_on_credit_past_the_budget_and_other_peers_go_on() {
    const N: u64 = 1000;
    let budget = 2000;
    // Peer 0 is the victim, 1 floods it, 2 is a legitimate peer.
    let mut s = Sim::star(cfg(budget), cfg(1 << 30), 2, 7);
    let sends = flood(&mut s, 1, 0, 0, N);
    s.run();
    let v = &s.peers[0].engine;
    let held = v.unexpected_bytes();
    let limit = bound(budget, 1);
    assert!(
        held > budget && held <= limit,
        "{held} bytes held by the victim, {} messages; bound {limit}",
        v.unexpected_len()
    );
    assert!(
        (v.unexpected_len() as u64) < N / 10,
        "{} messages queued",
        v.unexpected_len()
    );
    let withheld = v.conn_stats(conn(1)).unwrap().withheld;
    assert!(withheld > 0 && u64::from(withheld) == v.withheld_credits());
    let waiting = pending_sends(&s, 1, &sends);
    assert!(
        waiting as u64 > N - 20,
        "{waiting} of the flooder's sends wait on credit"
    );
    let flooder = s.peers[1].engine.conn_stats(conn(0)).unwrap();
    assert!(flooder.tx_credits <= 2 && flooder.queued > 0, "{flooder:?}");

    // The legitimate peer: receives posted first (expected messages) both ways, eager and
    // rendezvous; it is not slowed, and the victim's queue does not grow.
    for (k, len) in [(0u64, 100usize), (1, 150), (2, 5000)] {
        let tag = 0x900d_0000 + k;
        let (r0, b0) = s.recv(0, tag, !0, len);
        let (r2, b2) = s.recv(2, tag, !0, len);
        let s2 = s.send(2, 0, tag, pattern(len, tag));
        let s0 = s.send(0, 2, tag, pattern(len, tag + 1));
        s.run();
        for (i, r) in [(0, r0), (2, r2), (2, s2), (0, s0)] {
            assert_eq!(s.completion(i, r).map(|c| c.status), Some(Status::Ok));
        }
        assert_eq!(s.data(0, b0, len as u64), pattern(len, tag));
        assert_eq!(s.data(2, b2, len as u64), pattern(len, tag + 1));
    }
    assert_eq!(s.peers[0].engine.unexpected_bytes(), held, "no growth");
    assert_eq!(s.peers[0].engine.conn_stats(conn(2)).unwrap().withheld, 0);

    // The victim's own frames to the flooder go on, and the flooder's control frames come
    // back: the ATS of a rendezvous it receives, the reply to a one-sided operation.
    let tag = 0xA75;
    let (r1, b1) = s.recv(1, tag, !0, 3000);
    let big = s.send(0, 1, tag, pattern(3000, tag));
    let buf = s.alloc(0, vec![0; 8]);
    let get = s.peers[0]
        .engine
        .rma_get(conn(1), &unmapped_key(), 0, buf, 8)
        .unwrap();
    s.pump(0);
    s.run();
    assert_eq!(s.completion(0, big).map(|c| c.status), Some(Status::Ok));
    assert_eq!(s.completion(1, r1).map(|c| c.status), Some(Status::Ok));
    assert_eq!(s.data(1, b1, 3000), pattern(3000, tag));
    assert_eq!(
        s.completion(0, get).map(|c| c.status),
        Some(Status::Refused(RefusalKind::BadKey))
    );
    assert!(
        pending_sends(&s, 1, &sends) as u64 > N - 20,
        "the flood still waits"
    );

    // The victim's application receives: everything arrives, and the queue stays bounded.
    drain(&mut s, 0, 0, N, limit);
    assert_eq!(pending_sends(&s, 1, &sends), 0);
    let v = &s.peers[0].engine;
    assert_eq!((v.unexpected_bytes(), v.withheld_credits()), (0, 0));
    assert_eq!(v.conn_stats(conn(1)).unwrap().withheld, 0);
    assert!(s.peers.iter().all(|p| p.closed.is_empty()));
    s.assert_srq_full();
}

#[test]
fn two_peers_flooding_each_other_neither_deadlock_nor_exchange_credits_for_ever() {
    const N: u64 = 300;
    let budget = 1000;
    let mut s = Sim::uniform(2, cfg(budget), 3);
    // A rendezvous each way first (its RTS unexpected at the other side), then the floods.
    let sa = s.send(0, 1, 77, pattern(1000, 1));
    let sb = s.send(1, 0, 77, pattern(1000, 2));
    let a = flood(&mut s, 0, 1, 0, N);
    let b = flood(&mut s, 1, 0, 1 << 20, N);
    // (`run` ends: no CREDIT frames go back and forth for ever.)
    s.run();
    let frames = s.frames_delivered;
    s.run();
    assert_eq!(s.frames_delivered, frames, "quiet once both wait");
    for (i, sends) in [(0, &a), (1, &b)] {
        let peer = &s.peers[1 - i].engine;
        assert!(peer.unexpected_bytes() <= bound(budget, 1));
        assert!(peer.withheld_credits() > 0);
        assert!(pending_sends(&s, i, sends) > 0);
    }
    // Both receive the rendezvous now: their ATS go through the withheld windows.
    let (ra, ba) = s.recv(0, 77, !0, 1000);
    let (rb, bb) = s.recv(1, 77, !0, 1000);
    s.run();
    for (i, r) in [(0, ra), (1, rb), (0, sa), (1, sb)] {
        assert_eq!(
            s.completion(i, r).map(|c| c.status),
            Some(Status::Ok),
            "{i}"
        );
    }
    assert_eq!(s.data(0, ba, 1000), pattern(1000, 2));
    assert_eq!(s.data(1, bb, 1000), pattern(1000, 1));
    drain(&mut s, 0, 1 << 20, N, bound(budget, 1));
    drain(&mut s, 1, 0, N, bound(budget, 1));
    assert_eq!(pending_sends(&s, 0, &a) + pending_sends(&s, 1, &b), 0);
    s.assert_srq_full();
}

#[test]
fn matched_probes_drain_the_queue_and_give_the_credits_back() {
    const N: u64 = 200;
    let budget = 1500;
    let mut s = Sim::uniform(2, cfg(budget), 5);
    let sends = flood(&mut s, 1, 0, 0, N);
    s.run();
    assert!(s.peers[0].engine.withheld_credits() > 0);
    // A claimed message still counts; its msg_recv frees it.
    let mut k = 0;
    while k < N {
        let Some(info) = s.peers[0].engine.probe_remove(k, !0) else {
            panic!("message {k} was not queued (withheld credits not returned?)");
        };
        let held = s.peers[0].engine.unexpected_bytes();
        assert!(held >= LEN as u64 + UNEXPECTED_ENTRY_COST);
        let buf = s.alloc(0, vec![0; LEN]);
        let r = s.peers[0]
            .engine
            .msg_recv(info.msg, buf, LEN as u64)
            .unwrap();
        s.pump(0);
        s.run();
        assert_eq!(s.completion(0, r).map(|c| c.status), Some(Status::Ok));
        assert_eq!(s.data(0, buf, LEN as u64), pattern(LEN, k));
        assert!(s.peers[0].engine.unexpected_bytes() <= bound(budget, 1));
        k += 1;
    }
    assert_eq!(pending_sends(&s, 1, &sends), 0);
    assert_eq!(s.peers[0].engine.unexpected_bytes(), 0);
    s.assert_srq_full();
}

#[test]
fn rendezvous_messages_count_a_fixed_cost() {
    const N: u64 = 100;
    // A budget of three entries: RTS frames are held past it, their senders wait.
    let budget = 3 * UNEXPECTED_ENTRY_COST;
    let mut s = Sim::uniform(2, cfg(budget), 9);
    let sends: Vec<RequestId> = (0..N).map(|k| s.send(1, 0, k, pattern(500, k))).collect();
    s.run();
    let v = &s.peers[0].engine;
    assert!(
        v.unexpected_len() as u64 <= 3 + WINDOW,
        "{}",
        v.unexpected_len()
    );
    assert_eq!(
        v.unexpected_bytes(),
        v.unexpected_len() as u64 * UNEXPECTED_ENTRY_COST
    );
    for k in 0..N {
        let (r, buf) = s.recv(0, k, !0, 500);
        s.run();
        assert_eq!(s.completion(0, r).map(|c| c.status), Some(Status::Ok));
        assert_eq!(s.data(0, buf, 500), pattern(500, k));
    }
    assert_eq!(pending_sends(&s, 1, &sends), 0);
    s.assert_srq_full();
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

/// Shared memory's window: fixed, not from the pool. The credits are withheld all the same.
#[test]
fn a_fixed_window_is_withheld_too() {
    let window = 256u16;
    let budget = 4096;
    let cfg = Config::builder().max_unexpected(budget).build().unwrap();
    let mut e = [Engine::new(cfg.clone()), Engine::new(cfg)];
    let limits = e.each_ref().map(|e| ConnLimits {
        credits: window,
        pooled: false,
        ..e.default_limits()
    });
    let hs = [0, 1].map(|i| e[i].local_handshake_for(&limits[i]));
    e[0].handle_connection_up_with(ConnId(1), &hs[1], limits[0])
        .unwrap();
    e[1].handle_connection_up_with(ConnId(0), &hs[0], limits[1])
        .unwrap();
    let n = 4 * u64::from(window);
    for k in 0..n {
        e[0].tag_send(ConnId(1), k, UserBufId(k), 100).unwrap();
    }
    let mut wire = frames_out(&mut e[0]);
    while !wire.is_empty() {
        for f in wire.drain(..) {
            assert!(e[1].handle_frame_delivering(ConnId(0), &f).is_none());
        }
        for f in frames_out(&mut e[1]) {
            assert!(e[0].handle_frame_delivering(ConnId(1), &f).is_none());
        }
        wire = frames_out(&mut e[0]);
    }
    let held = e[1].unexpected_bytes();
    assert!(
        held > budget && held <= budget + u64::from(window) * (100 + UNEXPECTED_ENTRY_COST),
        "{held}"
    );
    let st = e[1].conn_stats(ConnId(0)).unwrap();
    assert_eq!(
        st.window,
        u32::from(window),
        "a fixed window stays as it is"
    );
    assert!(st.withheld > 0);
    assert!(
        e[0].conn_stats(ConnId(1)).unwrap().queued > 0,
        "the sender waits"
    );
    // Receives drain it; the sender's frames all arrive, in order.
    let mut k = 0;
    let mut buf = vec![0u8; 100];
    while k < n {
        let c = e[1]
            .tag_recv_now(k, !0, &mut buf)
            .unwrap_or_else(|| panic!("message {k} queued"));
        assert_eq!(c.tag, k);
        k += 1;
        let mut back = frames_out(&mut e[1]);
        while !back.is_empty() {
            for f in back.drain(..) {
                assert!(e[0].handle_frame_delivering(ConnId(1), &f).is_none());
            }
            for f in frames_out(&mut e[0]) {
                assert!(e[1].handle_frame_delivering(ConnId(0), &f).is_none());
            }
            back = frames_out(&mut e[1]);
        }
        assert!(e[1].unexpected_bytes() <= budget + u64::from(window) * 164);
    }
    assert_eq!(e[0].pending_requests(), 0);
    assert_eq!(e[1].unexpected_bytes(), 0);
}

/// A peer that sends messages with the credit left for its control frames once its credits
/// are withheld, or past the credits it holds, is closed, and only its connection:
/// withholding binds hostile peers too.
#[test]
fn a_peer_ignoring_withheld_credits_is_closed_and_only_it() {
    let budget = 1000;
    let mut e = Engine::new(cfg(budget));
    let hs = Engine::new(cfg(budget)).local_handshake();
    for c in [1, 2] {
        e.handle_connection_up(ConnId(c), &hs).unwrap();
    }
    let window = u64::from(e.conn_stats(ConnId(1)).unwrap().window);
    // The hostile peer (connection 1) counts the credits the engine gives back, and sends a
    // frame whenever it holds one; then, withheld, sends on regardless.
    let mut held = window;
    let mut seq = 0u32;
    let mut closed = None;
    for k in 0..200u64 {
        if held == 0 && k < 100 {
            continue;
        }
        let frame = eager_frame(seq, k, &pattern(LEN, k));
        seq += 1;
        held = held.saturating_sub(1);
        e.handle_frame(ConnId(1), RecvBufId(0), &frame);
        while let Some(a) = e.poll_action() {
            match a {
                Action::SendFrame { frame, .. } => {
                    held += u64::from(wire::decode_header(frame.as_bytes()).unwrap().credits);
                }
                Action::CloseConnection { conn, reason } => closed = Some((conn, reason)),
                _ => {}
            }
        }
        if closed.is_some() {
            break;
        }
    }
    let Some((conn, CloseReason::ProtocolError(why))) = closed else {
        panic!("the peer was not closed: {closed:?}");
    };
    assert_eq!(conn, ConnId(1));
    assert!(why.contains("credits"), "{why}");
    // Its queued messages stay receivable; the other connection is up and unaffected.
    assert!(e.unexpected_bytes() <= bound(budget, 1));
    assert!(e.conn_stats(ConnId(2)).is_some());
    let r = e.tag_recv(0xABC, !0, UserBufId(1), 8);
    e.handle_frame(ConnId(2), RecvBufId(1), &eager_frame(0, 0xABC, &[1; 8]));
    let done: Vec<Action> = std::iter::from_fn(|| e.poll_action()).collect();
    assert!(
        done.iter()
            .any(|a| matches!(a, Action::Complete(c) if c.request == r && c.status == Status::Ok)),
        "{done:?}"
    );
}

/// Three peers flooding each other every way, with budgets from none to a few messages (and
/// unlimited), windows from 4 to 64 credits, at random interleavings: each holds no more
/// than twice its budget and a window of eager frames per peer; rendezvous and
/// one-sided operations made while every window is withheld complete, then every message
/// arrives in order, nothing is left pending or withheld, no connection is closed (no false
/// alarm of the checks on withheld credits), and every run ends (no CREDIT frames back and
/// forth for ever).
#[test]
fn floods_every_way_neither_deadlock_nor_livelock() {
    let edges = [(0, 1), (1, 0), (1, 2), (2, 0), (0, 2), (2, 1)];
    for seed in 0..150u64 {
        for (credits, depth) in [(4u16, 16u32), (5, 16), (8, 16), (16, 24), (64, 4096)] {
            let budget = match seed % 8 {
                7 => u64::MAX,
                b => b * 300,
            };
            let cfg = Config::builder()
                .recv_buf_size(256)
                .eager_threshold(200)
                .srq_depth(depth)
                .credits(credits)
                .rndv_chunk_size(100)
                .max_unexpected(budget)
                .build()
                .unwrap();
            let mut s = Sim::uniform(3, cfg, seed + 1);
            let n = 30 + seed % 40;
            let tag = |i: usize, j: usize, k: u64| (i as u64) << 40 | (j as u64) << 32 | k;
            let len = |k: u64| {
                if k % 17 == 5 {
                    450
                } else {
                    (k as usize * 13) % 201
                }
            };
            let mut reqs = Vec::new();
            for (i, j) in edges {
                reqs.push((i, s.send(i, j, 1 << 50 | tag(i, j, 0), pattern(700, 5))));
                for k in 0..n {
                    reqs.push((i, s.send(i, j, tag(i, j, k), pattern(len(k), tag(i, j, k)))));
                }
            }
            s.run();
            // The documented bound: twice the budget, and a window of eager frames per peer.
            if budget != u64::MAX {
                let limit = 2 * budget + 2 * u64::from(credits) * (200 + UNEXPECTED_ENTRY_COST);
                for (i, p) in s.peers.iter().enumerate() {
                    let held = p.engine.unexpected_bytes();
                    assert!(
                        held <= limit,
                        "seed {seed}: peer {i} holds {held} > {limit}"
                    );
                }
            }
            for (i, j) in edges {
                let buf = s.alloc(i, vec![0; 8]);
                let get = s.peers[i]
                    .engine
                    .rma_get(conn(j), &unmapped_key(), 0, buf, 8);
                reqs.push((i, get.unwrap()));
                s.pump(i);
            }
            s.run();
            let what = format!("seed {seed}, window {credits}, budget {budget}");
            for (i, j) in edges {
                let (r, _) = s.recv(j, 1 << 50 | tag(i, j, 0), !0, 700);
                s.run();
                assert!(s.completion(j, r).is_some(), "{what}: rendezvous {i}->{j}");
            }
            for (i, j) in edges {
                for k in 0..n {
                    let (r, buf) = s.recv(j, tag(i, j, k), !0, 500);
                    s.run();
                    let c = s.completion(j, r);
                    assert_eq!(
                        c.map(|c| c.status),
                        Some(Status::Ok),
                        "{what}: {i}->{j} {k}"
                    );
                    let want = pattern(len(k), tag(i, j, k));
                    assert_eq!(s.data(j, buf, want.len() as u64), want);
                }
            }
            s.run();
            for (i, r) in reqs {
                assert!(
                    s.completion(i, r).is_some(),
                    "{what}: a request of {i} pending"
                );
            }
            for p in &s.peers {
                assert_eq!(
                    (p.engine.unexpected_bytes(), p.engine.withheld_credits()),
                    (0, 0)
                );
                assert!(p.closed.is_empty(), "{what}: {:?}", p.closed);
            }
            s.assert_srq_full();
        }
    }
}

/// A peer that floods, goes and comes back again and again (its messages stay queued until
/// received) gets no fresh share of the budget each time: the messages of connections gone
/// count against the shares of those that remain, so each new connection adds at most what
/// its initial window carries before its credits are withheld.
#[test]
fn a_peer_reconnecting_gets_no_fresh_share() {
    let budget = 2000;
    let mut e = Engine::new(cfg(budget));
    let hs = Engine::new(cfg(budget)).local_handshake();
    let per_window = u64::from(hs.credits) * (LEN as u64 + UNEXPECTED_ENTRY_COST);
    let mut before = 0;
    for c in 1..=20u64 {
        e.handle_connection_up(ConnId(c), &hs).unwrap();
        // An honest sender: a message while it holds the two credits one needs.
        let mut held = u64::from(hs.credits);
        let mut seq = 0u32;
        while held >= 2 && seq < 200 {
            let frame = eager_frame(seq, c << 32 | u64::from(seq), &pattern(LEN, 0));
            seq += 1;
            held -= 1;
            e.handle_frame(ConnId(c), RecvBufId(0), &frame);
            while let Some(a) = e.poll_action() {
                if let Action::SendFrame { frame, .. } = a {
                    held += u64::from(wire::decode_header(frame.as_bytes()).unwrap().credits);
                }
            }
        }
        assert!(seq < 200, "connection {c}: its credits were never withheld");
        e.handle_connection_down(ConnId(c));
        while e.poll_action().is_some() {}
        let now = e.unexpected_bytes();
        if c > 1 {
            assert!(
                now - before <= per_window,
                "connection {c} added {} bytes, more than its window's {per_window}",
                now - before
            );
        }
        before = now;
    }
    // They are all still there, in order, for the application.
    let mut buf = vec![0; LEN];
    let mut n = 0;
    while let Some(c) = e.tag_recv_now(0, 0, &mut buf) {
        assert_eq!(c.status, Status::Ok);
        n += 1;
    }
    assert_eq!(
        (
            n * (LEN as u64 + UNEXPECTED_ENTRY_COST),
            e.unexpected_bytes()
        ),
        (before, 0)
    );
}
