//! Issue 48: what a peer's one-sided operations can make the target spend is bounded by the
//! target, whatever the peer declares in its handshake or withholds in credits; and a key
//! that names no mapped region is answered one way, stale or forged. On the simulated
//! fabric, the hostile peer played by the test: its frames injected, the target's answers
//! captured ([`Sim::capture`]). (What a get makes the target allocate, counted by a heap
//! profiler: tests/get_reply_alloc.rs.)

mod common;

use common::rma::*;
use common::*;
use rdmx_proto::rma::{KeyRef, RefusalKind, RemoteAccess};
use rdmx_proto::wire::{self, Header, Opcode, RmaBody, WireStatus};
use rdmx_proto::*;

/// The largest receive buffer a handshake may declare: TCP's largest frame, 16 MiB.
const LARGEST_FRAME: u32 = 16 << 20;

/// A GET frame: `len` bytes at `offset` of `key`'s region, for the initiator's request
/// `sreq`, numbered `seq` and granting `credits`.
fn get_frame(seq: u32, credits: u16, sreq: u64, key: KeyRef, offset: u64, len: u64) -> Vec<u8> {
    let mut h = Header::new(Opcode::Get);
    h.seq = seq;
    h.credits = credits;
    h.sreq = sreq;
    h.tag = offset;
    h.payload_len = RmaBody::LEN as u32;
    wire::FrameBuf::encode_rma(&h, &RmaBody { key, word: len })
        .as_bytes()
        .to_vec()
}

/// A CREDIT frame numbered `seq`, granting `credits`.
fn credit_frame(seq: u32, credits: u16) -> Vec<u8> {
    let mut h = Header::new(Opcode::Credit);
    h.seq = seq;
    h.credits = credits;
    wire::FrameBuf::encode(&h, None).as_bytes().to_vec()
}

/// Peers `a` and `b` exchange an eager message and a rendezvous one (a legitimate peer's
/// traffic while an attack runs).
fn exchange(sim: &mut Sim, a: usize, b: usize, tag: Tag) {
    for (from, to, len) in [(a, b, 100), (b, a, 20_000)] {
        let (r, buf) = sim.recv(to, tag, u64::MAX, len);
        let s = sim.send(from, to, tag, pattern(len, tag));
        sim.run();
        assert_eq!(status(sim, to, r), Status::Ok, "legitimate receive");
        assert_eq!(status(sim, from, s), Status::Ok, "legitimate send");
        assert_eq!(sim.data(to, buf, len as u64), pattern(len, tag));
    }
}

/// Issue 48, item 2: only a lower bound of the peer's declared receive buffers was
/// checked, and a get's reply was sized by them: a peer declaring `u32::MAX` made one
/// 64-byte get allocate 1 GiB. A peer declaring more than the largest frame any transport
/// carries is now refused at the handshake, naming the size; and a configuration may not
/// declare more either (two engines always take each other's handshakes).
#[test]
fn receive_buffers_larger_than_any_frame_are_refused_at_the_handshake() {
    let mut e = Engine::new(Config::default());
    let mut hs = e.local_handshake();
    for size in [u32::MAX, LARGEST_FRAME + 1] {
        hs.recv_buf_size = size;
        match e.handle_connection_up(ConnId(1), &hs) {
            Err(Error::Handshake(why)) => assert!(
                why.contains(&format!("{size} bytes")) && why.contains("largest frame"),
                "{why}"
            ),
            other => panic!("a peer declaring {size}-byte receive buffers was taken: {other:?}"),
        }
        assert!(e.conn_stats(ConnId(1)).is_none());
    }
    hs.recv_buf_size = LARGEST_FRAME;
    e.handle_connection_up(ConnId(1), &hs).unwrap();
    assert!(Config::builder()
        .recv_buf_size(LARGEST_FRAME + 1)
        .build()
        .is_err());
    assert!(Config::builder()
        .recv_buf_size(LARGEST_FRAME)
        .build()
        .is_ok());
}

/// Issue 48, item 2: a get's reply is sized by the smaller of the two sides' receive
/// buffers, not by the peer's alone. A peer declaring 16 MiB buffers may ask a target with
/// 8 KiB ones for what a reply carries into 8 KiB; a byte more is a protocol error that
/// closes only its connection (before: served, the target allocating as much as the peer
/// declared). A legitimate peer exchanges messages with the target meanwhile.
#[test]
fn a_get_is_sized_by_the_target_s_buffers_not_by_the_peer_s_handshake() {
    let big = Config::builder()
        .recv_buf_size(LARGEST_FRAME)
        .build()
        .unwrap();
    let mut sim = Sim::new(vec![big, Config::default(), Config::default()], 48);
    let mem = with_memory(&mut sim);
    let key = mem[1].map(1 << 20, RemoteAccess::READ);
    mem[1].set(&key, &pattern(1 << 20, 3));
    sim.capture(1, 0);
    let room = u64::from(Config::default().recv_buf_size) - HEADER_LEN as u64;

    sim.inject(0, 1, get_frame(0, 0, 7, key.key, 0, room));
    sim.run();
    let replies = sim.take(1, 0);
    assert_eq!(replies.len(), 1);
    let f = wire::decode(&replies[0]).expect("a valid reply");
    assert_eq!(
        (f.header.opcode, f.header.status, f.header.sreq),
        (Opcode::RmaReply, WireStatus::Ok, 7)
    );
    assert_eq!(
        replies[0][HEADER_LEN..],
        pattern(1 << 20, 3)[..room as usize]
    );
    exchange(&mut sim, 1, 2, 1);

    sim.inject(0, 1, get_frame(1, 0, 8, key.key, 0, room + 1));
    sim.run();
    match sim.peers[1].closed.as_slice() {
        [(c, CloseReason::ProtocolError(why))] if *c == conn(0) => {
            assert!(why.contains(&format!("more than the {room}")), "{why}")
        }
        other => panic!("a get larger than a reply into 8 KiB buffers: {other:?}"),
    }
    assert!(sim
        .take(1, 0)
        .iter()
        .all(|f| wire::decode_header(f).unwrap().opcode != Opcode::RmaReply));
    exchange(&mut sim, 1, 2, 2);
}

/// Issue 48, item 2: the replies to a peer's operations wait in its connection's queue for
/// credits, and each reply returned every credit owed, so a peer that sent gets and
/// granted the target a credit or two per round got its whole window back each time and
/// grew the queue without bound (before: hundreds of replies after 50 rounds). Now each
/// operation's credit is held until its reply leaves: the target holds at most the
/// peer's window of replies, the peer waits, and once it grants credits every reply goes
/// out, none lost. A legitimate peer exchanges messages with the target throughout.
#[test]
fn a_peer_withholding_credits_makes_the_target_hold_at_most_its_window_of_replies() {
    let target = Config::builder()
        .initial_credits(16)
        .credits(64)
        .build()
        .unwrap();
    let mut sim = Sim::new(vec![Config::default(), target.clone(), target], 49);
    let mem = with_memory(&mut sim);
    let key = mem[1].map(4096, RemoteAccess::READ);
    sim.capture(1, 0);
    let window = sim.peers[1].engine.conn_stats(conn(0)).unwrap().window;
    assert_eq!(window, 16);
    // The peer's side: frames it may still send, its next sequence number, gets made and
    // replies seen.
    let (mut avail, mut seq, mut gets, mut replies) = (u64::from(window), 0u32, 0u64, 0u64);
    let mut read = |sim: &mut Sim, avail: &mut u64| {
        for f in sim.take(1, 0) {
            let f = wire::decode(&f).expect("valid frames");
            *avail += u64::from(f.header.credits);
            if f.header.opcode == Opcode::RmaReply {
                assert_eq!(f.header.status, WireStatus::Ok);
                replies += 1;
            }
        }
        replies
    };
    let mut most = 0;
    for round in 0..50u64 {
        // As many gets as its credits allow, the first granting the target 2 credits: a
        // reply or two each round, never all of them.
        for k in 0..avail {
            let grant = if k == 0 { 2 } else { 0 };
            sim.inject(0, 1, get_frame(seq, grant, 1 + gets, key.key, 0, 64));
            seq += 1;
            gets += 1;
        }
        avail = 0;
        sim.run();
        read(&mut sim, &mut avail);
        let s = sim.peers[1]
            .engine
            .conn_stats(conn(0))
            .expect("the connection stays up");
        most = most.max(s.queued);
        assert!(
            s.queued <= s.window as usize,
            "round {round}: {} replies wait, over the peer's window of {}",
            s.queued,
            s.window
        );
        exchange(&mut sim, 2, 1, 100 + round);
    }
    println!("{gets} gets in 50 rounds; at most {most} replies waited");
    assert!(most > 8, "the attack made replies wait: {most}");
    // The peer grants credits: every reply comes, none lost.
    let mut rounds = 0;
    while sim.peers[1].engine.conn_stats(conn(0)).unwrap().queued > 0 {
        rounds += 1;
        assert!(rounds < 100, "the replies do not drain");
        assert!(avail > 0, "the peer has no credit left to grant with");
        let tx = sim.peers[1].engine.conn_stats(conn(0)).unwrap().tx_credits;
        sim.inject(0, 1, credit_frame(seq, (64 - tx) as u16));
        seq += 1;
        avail -= 1;
        sim.run();
        read(&mut sim, &mut avail);
    }
    assert_eq!(read(&mut sim, &mut avail), gets, "a reply for every get");
    assert!(sim.peers[1].closed.is_empty());
}

/// Issue 48, item 8 (stale-key oracle): a key of an unmapped region was answered
/// `StaleKey` before its secret was checked, so a peer holding no key learnt from keys with
/// made-up secrets which of the target's regions had been unmapped. Now a stale key, with
/// its genuine secret or a made-up one, and a forged one are refused alike (`BadKey`),
/// and the connection stays up.
#[test]
fn stale_and_forged_keys_are_answered_alike() {
    let mut sim = sim3(50);
    let mem = with_memory(&mut sim);
    let old = mem[1].map(64, RemoteAccess::ALL);
    mem[1].unmap(&old);
    let gone = mem[1].map(64, RemoteAccess::ALL);
    mem[1].unmap(&gone);
    let new = mem[1].map(64, RemoteAccess::ALL);
    assert_eq!(new.key.region, old.key.region, "the slot was reused");
    let made_up = 0x5eed_5eed_5eed_5eed;
    let with = |k: KeyRef| rdmx_proto::rma::PackedKey { key: k, ..new };
    let keys = [
        with(old.key),
        with(KeyRef {
            secret: made_up,
            ..old.key
        }),
        with(gone.key),
        with(KeyRef {
            secret: made_up,
            ..gone.key
        }),
        with(KeyRef {
            secret: made_up,
            ..new.key
        }),
        with(KeyRef {
            generation: new.key.generation + 1,
            secret: made_up,
            ..new.key
        }),
    ];
    let reqs: Vec<_> = keys
        .iter()
        .map(|k| get(&mut sim, 0, 1, k, 0, 8).0)
        .collect();
    sim.run();
    for (k, r) in keys.iter().zip(reqs) {
        assert_eq!(
            status(&sim, 0, r),
            Status::Refused(RefusalKind::BadKey),
            "{:?}",
            k.key
        );
    }
    let (r, buf) = get(&mut sim, 0, 1, &new, 0, 8);
    sim.run();
    assert_eq!(status(&sim, 0, r), Status::Ok);
    assert_eq!(sim.data(0, buf, 8), vec![0; 8]);
    assert!(sim.peers.iter().all(|p| p.closed.is_empty()));
}

/// Issue 48 (found by the fuzzer with one-sided operations): a peer declaring the smallest
/// receive buffers a put frame fits in (65 bytes: one byte of payload a frame) and 65 472
/// credits made one 20 000-byte put queue 20 000 frames at once — what this side queues was
/// sized by the peer. Now one operation has at most 64 frames out whose replies did not come
/// back; each reply lets the next go, and the put completes.
#[test]
fn one_operation_has_a_bounded_number_of_frames_out_whatever_the_peer_grants() {
    let mut e = Engine::new(Config::default());
    let mut hs = e.local_handshake();
    hs.recv_buf_size = 65;
    hs.credits = 65_472;
    hs.max_credits = u16::MAX;
    e.handle_connection_up(ConnId(1), &hs).unwrap();
    let key = rdmx_proto::rma::PackedKey {
        key: KeyRef {
            region: 0,
            generation: 0,
            secret: 1,
        },
        len: 1 << 20,
        access: RemoteAccess::ALL,
        rdma: None,
    };
    let put = e.rma_put(ConnId(1), &key, 0, UserBufId(1), 20_000).unwrap();
    let frames = |e: &mut Engine| -> Vec<Header> {
        std::iter::from_fn(|| e.poll_action())
            .filter_map(|a| match a {
                Action::SendFrame { frame, .. } => {
                    Some(wire::decode_header(frame.as_bytes()).unwrap())
                }
                _ => None,
            })
            .collect()
    };
    let out = frames(&mut e);
    assert_eq!(out.len(), 64, "frames of one put queued at once");
    // The peer answers every frame (granting nothing): the put goes on, 64 frames out at
    // most, until all 20 000 bytes went and came back.
    let (mut seq, mut answered, mut pending) = (0u32, 0u64, out);
    while !pending.is_empty() {
        for h in std::mem::take(&mut pending) {
            assert_eq!(h.opcode, Opcode::Put);
            let mut r = Header::new(Opcode::RmaReply);
            r.seq = seq;
            r.sreq = h.sreq;
            r.tag = h.tag;
            seq += 1;
            answered += 1;
            e.handle_frame(
                ConnId(1),
                RecvBufId(0),
                wire::FrameBuf::encode(&r, None).as_bytes(),
            );
            let more = frames(&mut e);
            assert!(more.len() <= 1, "{} frames for one reply", more.len());
            pending.extend(more.into_iter().filter(|h| h.opcode == Opcode::Put));
        }
    }
    assert_eq!(answered, 20_000);
    assert_eq!(e.conn_stats(ConnId(1)).unwrap().queued, 0);
    assert_eq!(e.pending_requests(), 0, "the put completed");
    let _ = put;
}
