//! Hardening on real RDMA (Soft-RoCE): an rdmx worker facing a peer that speaks raw verbs
//! (`tests/hostile`). The two-sided tests there run here a thread each (the worker under
//! attack, and the raw peer); the tests below make a peer fall silent, which only one process
//! can inject (`rdmx::conn::fault::silence`; across the wire the cable-pull tests of
//! `tests/twonode/` do it for real).
//!
//! `#[ignore]`d on the host, which has no RDMA; `scripts/test` runs them in the guest (rxe0
//! on $SOFTROCE_ADDR_A, rxe1 on $SOFTROCE_ADDR_B).

use std::thread;
use std::time::{Duration, Instant};

use rdmx::conn::Access;
use rdmx::proto::wire::{self, Header, Opcode, RtsBody, RTS_BODY_LEN};
use rdmx::{Context, Listener, Request, Status, Worker, TAG_MASK_ALL};

// The two-sided harness (and the API suite, which runs in tests/device_api.rs).
#[macro_use]
#[allow(dead_code, unused_imports, unused_macros)]
mod api;
#[macro_use]
mod hostile;
use api::pattern;
use hostile::*;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the device tests through scripts/test (it boots the Soft-RoCE guest)")
    })
}

fn addr_a() -> String {
    env("SOFTROCE_ADDR_A")
}

fn net() -> api::Net {
    api::Net {
        transport: rdmx::Transport::Rdma,
        addr_a: addr_a(),
        addr_b: env("SOFTROCE_ADDR_B"),
        sides: api::Sides::Threads,
        keepalive_ms: None,
        settings: Vec::new(),
    }
}

two_sided_hostile_tests!(#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]);

/// A peer that goes silent (its node dies, its cable is cut) in the middle of rendezvous
/// READs: nothing ever answers them and no CM message arrives, so they never complete. Here
/// the worker has more READs for that peer than the QP may have posted (33 messages of
/// 1 MiB, 4 READs each, against a send queue of 128), so when the endpoint is closed its
/// disconnect waits behind them, and the connection is destroyed at the reap timeout with
/// READs still posted. Those READs, and the buffers they were reading into, must be written
/// off: afterwards no READ, request, user buffer or memory region is left (resource counts
/// before and after), and the worker keeps serving a new connection.
///
/// The silence is injected (`rdmx::conn::fault::silence`: the peer's QP moves to the error
/// state without any CM exchange); in one guest nothing else can make a peer vanish without
/// a word. The keepalive is off, so that the unanswered READs stay posted (rdma_cm's 2.1 s
/// ACK timeout, 6 tries) until the reap instead of failing on their own within a
/// second (see `a_peer_gone_silent_is_found_by_the_keepalive_and_its_requests_fail`).
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn reads_to_a_peer_gone_silent_are_written_off_when_its_connection_is_reaped() {
    init_log();
    const MSGS: usize = 33;
    let ctx = builder()
        .credits(32)
        .keepalive(Duration::ZERO)
        .build()
        .unwrap();
    let server = ctx.worker().unwrap();
    let listener = server.listen(&format!("{}:0", addr_a())).unwrap();
    let addr = listener.local_addr().expect("bound");
    let w = [&server];
    let base = server.stats();
    let base_mrs = rdmx::conn::live_registrations();

    // The peer announces MSGS rendezvous messages (one registered source), minding credits.
    let (mut p, ep) = raw_connect(&listener, addr);
    let source =
        p.pd.register_from(&pattern(MIB, 9), Access::REMOTE_READ)
            .unwrap();
    let remote = source.remote().expect("remote read");
    // Credits rdmx granted, and credits the peer owes rdmx (one per frame from rdmx: its
    // credit updates, returned on the next RTS so rdmx can go on updating).
    let mut credits = u32::from(p.rdmx.credits);
    let mut owed = 0u16;
    for i in 0..MSGS {
        until(&w, "credits from rdmx", || {
            for f in p.frames() {
                credits += u32::from(wire::decode(&f).expect("a valid frame").header.credits);
                owed += 1;
            }
            credits > 0
        });
        let mut h = Header::new(Opcode::Rts);
        h.credits = std::mem::take(&mut owed);
        h.tag = TAG_RNDV;
        h.sreq = i as u64 + 1;
        h.payload_len = RTS_BODY_LEN as u32;
        let body = RtsBody {
            addr: remote.addr,
            rkey: remote.rkey,
            len: MIB as u64,
        };
        p.send_frame(h, Some(&body));
        credits -= 1;
    }
    until(&w, "every RTS arrived", || {
        server.stats().unexpected_messages == MSGS
    });
    // The peer goes silent, then the receives are posted: every READ goes unanswered.
    rdmx::conn::fault::silence(&p.conn).expect("silence the peer's QP");
    let recvs: Vec<Request> = (0..MSGS)
        .map(|_| server.tag_recv(TAG_RNDV, TAG_MASK_ALL, vec![0; MIB]))
        .collect();
    // Four READs per receive, at most MAX_READS_PER_CONN on the connection: the rest wait
    // behind them, and are written off with them.
    let stuck = (4 * MSGS).min(rdmx::proto::MAX_READS_PER_CONN as usize);
    until(&w, "the READs are issued", || {
        server.stats().reads_in_flight == stuck
    });
    let mid = server.stats();
    println!(
        "silent peer: {} READs issued, {} user buffers held",
        mid.reads_in_flight, mid.user_buffers
    );
    for _ in 0..100 {
        server.progress();
    }
    assert_eq!(
        server.stats().reads_in_flight,
        stuck,
        "nothing answers a silent peer's READs"
    );

    // Close: the disconnect queues behind the stuck READs; the reaper destroys the QP.
    let closed_at = Instant::now();
    let _ = ep.close();
    let results: Vec<_> = recvs.into_iter().map(|r| finish(r, &w)).collect();
    assert!(
        results
            .iter()
            .all(|r| r.as_ref().err().and_then(|e| e.status()) == Some(Status::ConnectionClosed)),
        "every receive fails: {results:?}"
    );
    until(&w, "the connection is reaped", || {
        server.stats().connections == base.connections
    });
    println!(
        "silent peer: receives failed and connection reaped {:?} after the close",
        closed_at.elapsed()
    );
    let after = server.stats();
    println!(
        "silent peer: after the reap: {} READs, {} user buffers, {} pending requests",
        after.reads_in_flight, after.user_buffers, after.pending_requests
    );
    assert_eq!(
        (
            after.reads_in_flight,
            after.user_buffers,
            after.pending_requests,
            after.eps
        ),
        (
            base.reads_in_flight,
            base.user_buffers,
            base.pending_requests,
            base.eps
        ),
        "the READs lost with the connection and their buffers are written off"
    );
    drop(ep);
    drop(source);
    drop(p);
    assert_eq!(
        rdmx::conn::live_registrations().regions,
        base_mrs.regions,
        "every READ target's registration is gone"
    );

    // The worker serves a new connection.
    send_to_a_good_peer(&ctx, &server, &listener, pattern(MIB, 10));
}

/// Connects a new rdmx worker of `ctx` to `listener` (of `server`) and sends it `data` from
/// `server`, checking it arrives intact.
fn send_to_a_good_peer(ctx: &Context, server: &Worker, listener: &Listener, data: Vec<u8>) {
    let good = ctx.worker().unwrap();
    let (g, a) = (
        good.clone(),
        listener.local_addr().expect("bound").to_string(),
    );
    let t = thread::spawn(move || g.connect(&a).expect("good connect"));
    let sgood = accept(listener);
    let _cgood = t.join().unwrap();
    let r = good.tag_recv(TAG_GOOD, TAG_MASK_ALL, vec![0; data.len()]);
    let s = sgood.tag_send(TAG_GOOD, data.clone());
    assert!(finish(r, &[server, &good]).expect("good receive").buf == data);
    finish(s, &[server, &good]).expect("good send");
}

/// A peer that goes silent (its node dies, its cable is cut: the injected silence moves its
/// QP to the error state, so nothing it was sent is acknowledged and no CM message comes):
/// - an idle endpoint to it, with nothing posted, is found out by the keepalive
///   (`RDMX_KEEPALIVE_MS`, 1 s): its zero-length probe goes unacknowledged and the endpoint
///   closes within 5 s, saying why;
/// - a send to it fails within 5 s: the QP retries 6 times (rxe retries 7 for ever) with
///   the ACK timeout the keepalive implies (134 ms), not rdma_cm's 2.1 s;
/// - without the keepalive, an idle endpoint to a silent peer stays up: nothing tells it.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn a_peer_gone_silent_is_found_by_the_keepalive_and_its_requests_fail() {
    init_log();
    const BOUND: Duration = Duration::from_secs(5);
    for keepalive in [Duration::from_secs(1), Duration::ZERO] {
        let ctx = builder().keepalive(keepalive).build().unwrap();
        let server = ctx.worker().unwrap();
        let listener = server.listen(&format!("{}:0", addr_a())).unwrap();
        let addr = listener.local_addr().expect("bound");
        let w = [&server];
        // Idle: nothing posted on the endpoint when its peer goes silent.
        let (p, idle) = raw_connect(&listener, addr);
        rdmx::conn::fault::silence(&p.conn).expect("silence the peer's QP");
        let silent_at = Instant::now();
        if keepalive.is_zero() {
            while silent_at.elapsed() < BOUND {
                server.progress();
                thread::yield_now();
            }
            assert!(
                idle.is_connected(),
                "without a keepalive nothing tells an idle endpoint: {:?}",
                idle.close_reason()
            );
            continue;
        }
        until(&w, "the idle endpoint to the silent peer closes", || {
            !idle.is_connected()
        });
        let took = silent_at.elapsed();
        let why = idle.close_reason().expect("a reason");
        println!("silent peer, idle endpoint: closed {took:?} after the silence: {why}");
        assert!(why.contains("keepalive"), "{why}");
        assert!(took < BOUND, "found out after {took:?}");

        // Busy: a rendezvous send to another silent peer (its RTS goes unacknowledged)
        // fails, and the worker goes on. (An eager send completes once its data is copied,
        // as in UCP: the failure is the endpoint's.)
        let (p2, busy) = raw_connect(&listener, addr);
        rdmx::conn::fault::silence(&p2.conn).expect("silence the second peer's QP");
        let silent_at = Instant::now();
        let send = busy.tag_send(TAG_RNDV, pattern(MIB, 3));
        let result = finish(send, &w);
        let took = silent_at.elapsed();
        println!(
            "silent peer, pending send: {:?} after {took:?}",
            result.as_ref().map(|d| d.length).map_err(|e| e.status())
        );
        assert_eq!(
            result.err().and_then(|e| e.status()),
            Some(Status::ConnectionClosed)
        );
        assert!(took < BOUND, "the send failed after {took:?}");
        assert!(!busy.is_connected());
        // The worker goes on: a new connection to it works.
        let client = ctx.worker().unwrap();
        let (c, a) = (client.clone(), addr.to_string());
        let t = thread::spawn(move || c.connect(&a).expect("a new connection"));
        let _sep = accept(&listener);
        let cep = t.join().unwrap();
        let both = [&server, &client];
        let r = server.tag_recv(TAG_GOOD, TAG_MASK_ALL, vec![0; 100]);
        let s = cep.tag_send(TAG_GOOD, pattern(100, 4));
        assert_eq!(finish(r, &both).expect("received").buf, pattern(100, 4));
        finish(s, &both).expect("sent");
    }
}

/// A peer that sends a connect request with a valid rdmx handshake and never completes the
/// exchange (it never reads the answer, so the CM's last message, the RTU, never goes: as a
/// peer that vanished, or froze, right after asking) holds up no other connection:
/// [`Listener::accept`], called in a loop by an accepting thread, answers it and goes on,
/// and a legitimate client connecting right after — with a connect timeout of 5 s, against
/// the victim's 20 s — connects and exchanges an eager and a 1 MiB rendezvous message each
/// way while the hostile accept is still under way (the listener has 1 accept under way,
/// the engine's admission of it holds its credits). At its deadline the hostile one is
/// dropped: no accept left under way, the credits it was granted given back.
///
/// Before accepts were kept under way, `accept` waited on the hostile peer for the whole
/// connect timeout, and the legitimate connect timed out.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn a_peer_that_never_completes_its_connect_holds_up_no_other() {
    use rdmx::conn::{fault, AddrInfo, CompletionQueue, Device, EventChannel};
    use rdmx::conn::{ProtectionDomain, QpConfig, Side};
    use std::sync::mpsc;
    use std::sync::Arc;

    init_log();
    const VICTIM_TIMEOUT: Duration = Duration::from_secs(20);
    let ctx = builder().connect_timeout(VICTIM_TIMEOUT).build().unwrap();
    let server = ctx.worker().unwrap();
    let listener = Arc::new(server.listen(&format!("{}:0", addr_a())).unwrap());
    let addr = listener.local_addr().expect("bound");
    let (tx, rx) = mpsc::channel();
    let accepting = listener.clone();
    // The application's accepting thread: every endpoint accepted is handed over.
    thread::spawn(move || loop {
        let ep = accepting.accept().expect("accept");
        if tx.send(ep).is_err() {
            break;
        }
    });
    // (The worker's resources come with the first connection: the base is taken after.)
    let first = ctx.worker().unwrap();
    let a = addr.to_string();
    let f = thread::spawn(move || first.connect(&a).expect("a first connection"));
    let first_ep = rx
        .recv_timeout(LONG)
        .expect("the first connection accepted");
    let first_client = f.join().unwrap();
    let base = server.stats();

    // The hostile peer asks, is answered, and never completes.
    let dst = AddrInfo::from_socket_addr(addr, Side::Active).unwrap();
    let device = Device::for_route(&dst).unwrap();
    let pd = ProtectionDomain::new(&device).unwrap();
    let cq = CompletionQueue::new(&device, 16, false).unwrap();
    let events = EventChannel::new().unwrap();
    let config = QpConfig::new(&pd, &cq, None, &events);
    let hostile = fault::connect_unanswered(&dst, &config, &raw_handshake()).unwrap();
    let asked = Instant::now();
    until(
        &[&server],
        "the listener answers the hostile request",
        || hostile.answered(),
    );
    println!(
        "hostile connect answered {:?} after asking",
        asked.elapsed()
    );

    // A legitimate client, whose connect gives up long before the victim's would.
    let good_ctx = builder()
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let good = good_ctx.worker().unwrap();
    let (g, a) = (good.clone(), addr.to_string());
    let c = thread::spawn(move || g.connect(&a));
    let cgood = c
        .join()
        .unwrap()
        .expect("the legitimate client connects while the hostile accept is under way");
    let sgood = rx
        .recv_timeout(LONG)
        .expect("the listener accepts the legitimate client");
    println!(
        "legitimate client connected {:?} after the hostile request",
        asked.elapsed()
    );
    let both = [&server, &good];
    for (len, seed) in [(100, 1), (MIB, 2)] {
        let data = pattern(len, seed);
        let r = good.tag_recv(TAG_GOOD, TAG_MASK_ALL, vec![0; len]);
        let s = sgood.tag_send(TAG_GOOD, data.clone());
        assert!(finish(r, &both).expect("good receive").buf == data);
        finish(s, &both).expect("good send");
        let r = server.tag_recv(TAG_GOOD, TAG_MASK_ALL, vec![0; len]);
        let s = cgood.tag_send(TAG_GOOD, data.clone());
        assert!(finish(r, &both).expect("server receive").buf == data);
        finish(s, &both).expect("client send");
    }
    assert_eq!(
        listener.pending_accepts(),
        1,
        "the hostile accept is under way"
    );
    let during = server.stats();
    assert!(
        during.credits.granted > base.credits.granted,
        "admitted, the hostile peer and the good client hold credits: {:?} then {:?}",
        base.credits,
        during.credits
    );

    // At its deadline the hostile accept is dropped (by the accepting thread, whose wait
    // ends then, or the worker's progress).
    let deadline = Instant::now() + VICTIM_TIMEOUT + LONG;
    while listener.pending_accepts() > 0 {
        assert!(
            Instant::now() < deadline,
            "the hostile accept was never dropped"
        );
        server.progress();
        thread::sleep(Duration::from_millis(50));
    }
    println!(
        "hostile accept dropped {:?} after its request",
        asked.elapsed()
    );
    assert!(asked.elapsed() >= VICTIM_TIMEOUT, "dropped at its deadline");
    drop(hostile);
    drop((cgood, sgood));
    until(&[&server, &good], "the good connection is gone", || {
        server.stats().eps == base.eps
    });
    assert_eq!(
        server.stats().credits.granted,
        base.credits.granted,
        "the hostile peer's admission is undone"
    );
    drop((first_ep, first_client));
}
