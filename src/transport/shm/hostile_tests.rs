//! A hostile peer on shared memory: it speaks the setup protocol by hand, then writes what
//! it likes into the segment. The worker it talks to must close that endpoint alone, with a
//! reason naming the corruption, never panic or touch memory outside the segment, and keep
//! its other endpoints working.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use rdmx_shm::channel;
use rdmx_shm::ring::{ring_len, PUBLISHED, RING_HEADER_LEN};
use rdmx_shm::{fdpass, Doorbell, HostIdentity, Producer, Segment};

use super::handover::HandOvers;
use super::setup::{self, Answer, Offer};
use crate::worker::Worker;
use crate::{Context, Ep, Transport, TAG_MASK_ALL};

fn shm_worker() -> Worker {
    Context::builder()
        .transport(Transport::Shm)
        .build()
        .expect("context")
        .worker()
        .expect("worker")
}

/// Steps the workers' progress until `done`; a bounded number of steps, never a clock.
fn step_until(ws: &[&Worker], done: impl Fn() -> bool) {
    for _ in 0..200_000 {
        if done() {
            return;
        }
        for w in ws {
            w.progress();
        }
    }
    panic!("no progress after 200 000 steps");
}

/// The victim's side of a hostile connection, the segment as the peer holds it, and the
/// hostile side's doorbell fd holder.
struct Hostile {
    ep: Ep,
    seg: Arc<Segment>,
    _tcp: rdmx_tcp::Link,
    _sock: std::os::unix::net::UnixStream,
    _bell: Doorbell,
}

/// Connects to `victim` (listening at `addr`) as a peer that follows the setup protocol to
/// the letter, so that it ends up holding the connection's segment.
fn hostile_connect(listener: &crate::Listener, helper: &Worker) -> Hostile {
    let addr = listener.local_addr().expect("bound").to_string();
    let hand_overs = HandOvers::new(rustix::process::getuid().as_raw());
    let expected = hand_overs.expect(Duration::from_secs(10));
    // (Leaked: the victim may read it by CMA at any time during the setup.)
    let probe: &'static u64 = Box::leak(Box::new(0x5eed_u64));
    let offer = Offer {
        identity: HostIdentity::this().expect("identity"),
        token: expected.token(),
        probe: (probe as *const u64 as u64, *probe),
        name: hand_overs.name().expect("a hand-over socket").to_string(),
    };
    let (handshake, _) = helper.driver.local_handshake(Transport::Shm);
    let private = setup::with_ext(&handshake, &offer.encode());
    std::thread::scope(|scope| {
        let accepting = scope.spawn(|| listener.accept().expect("accepted"));
        let tcp = rdmx_tcp::connect(&addr, &private, Duration::from_secs(10)).expect("tcp");
        assert_eq!(
            Answer::decode(setup::split(tcp.peer_private_data()).1),
            Ok(Some(Answer::Accepted {
                capacity: super::RING_CAPACITY as u32
            }))
        );
        let sock = expected.claim().expect("the hand-over");
        sock.set_nonblocking(false).expect("blocking");
        let mut buf = [0u8; 64];
        let (_, mut fds) = fdpass::recv_with_fds(&sock, &mut buf).expect("segment");
        let _their_bell = fds.pop();
        let seg = Arc::new(
            Segment::open(
                fds.pop().expect("segment"),
                channel::channel_len(super::RING_CAPACITY),
            )
            .expect("map"),
        );
        let bell = Doorbell::new().expect("doorbell");
        fdpass::send_with_fds(&sock, b"RXSD", &[bell.fd().as_fd()]).expect("reply");
        let ep = accepting.join().expect("acceptor");
        assert_eq!(ep.transport(), Transport::Shm);
        Hostile {
            ep,
            seg,
            _tcp: tcp,
            _sock: sock,
            _bell: bell,
        }
    })
}

/// What a hostile peer does to the segment.
type Corruption = Box<dyn Fn(&Segment)>;

/// Writes `value` at `offset` of the segment, as the peer's stores would land.
fn scribble(seg: &Segment, offset: usize, value: u64) {
    rustix::io::pwrite(
        seg.fd().expect("the memfd"),
        &value.to_ne_bytes(),
        offset as u64,
    )
    .expect("pwrite");
}

#[test]
fn a_peer_scribbling_the_segment_closes_only_its_endpoint() {
    let _ = env_logger::builder().is_test(true).try_init();
    let victim = shm_worker();
    let helper = shm_worker();
    let listener = victim.listen("127.0.0.1:0").expect("listen");
    // A well-behaved peer beside the hostile ones.
    let good_peer = shm_worker();
    let addr = listener.local_addr().expect("bound").to_string();
    let connecting = {
        let good_peer = good_peer.clone();
        std::thread::spawn(move || good_peer.connect(&addr).expect("connect"))
    };
    let good_victim_ep = listener.accept().expect("accept");
    let good_ep = connecting.join().expect("connector");

    // The victim receives on the ring the creator (the victim, as acceptor) does not send on.
    let victim_rx = ring_len(super::RING_CAPACITY);
    let cap = super::RING_CAPACITY;
    let mut noise = rand::rng();
    let cases: Vec<(&str, Corruption)> = vec![
        (
            "a record longer than the ring",
            Box::new(move |s| {
                scribble(s, victim_rx + RING_HEADER_LEN, PUBLISHED | (cap as u64 * 4))
            }),
        ),
        (
            "a record header not published",
            Box::new(move |s| scribble(s, victim_rx + RING_HEADER_LEN, 12)),
        ),
        (
            "reserved bits in a record header",
            Box::new(move |s| scribble(s, victim_rx + RING_HEADER_LEN, PUBLISHED | 8 | (1 << 60))),
        ),
        (
            "random words over the whole segment",
            Box::new({
                let words: Vec<(usize, u64)> = (0..2000)
                    .map(|_| {
                        use rand::RngExt;
                        (
                            noise.random_range(0..channel::channel_len(cap) / 8) * 8,
                            noise.random(),
                        )
                    })
                    .collect();
                move |s| {
                    for &(at, v) in &words {
                        scribble(s, at, v);
                    }
                    // (The first record's header last, out of range, so the victim looks.)
                    scribble(s, victim_rx + RING_HEADER_LEN, u64::MAX);
                }
            }),
        ),
    ];
    for (what, corrupt) in cases {
        let h = hostile_connect(&listener, &helper);
        corrupt(&h.seg);
        step_until(&[&victim], || h.ep.close_reason().is_some());
        let reason = h.ep.close_reason().expect("closed");
        assert!(
            reason.contains("corrupted the shared ring"),
            "{what}: closed for {reason}"
        );
    }

    // The good endpoint still carries eager and rendezvous messages both ways.
    for len in [8, 100_000] {
        let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let recv = victim.tag_recv(5, TAG_MASK_ALL, vec![0; len]);
        let send = good_ep.tag_send(5, data.clone());
        step_until(&[&victim, &good_peer], || recv.is_done() && send.is_done());
        assert_eq!(recv.wait().expect("received").buf, data);
        let recv = good_peer.tag_recv(6, TAG_MASK_ALL, vec![0; len]);
        let send = good_victim_ep.tag_send(6, data.clone());
        step_until(&[&victim, &good_peer], || recv.is_done() && send.is_done());
        assert_eq!(recv.wait().expect("received").buf, data);
    }
    assert!(good_victim_ep.close_reason().is_none());
}

#[test]
fn a_peer_breaking_the_record_protocol_closes_only_its_endpoint() {
    let _ = env_logger::builder().is_test(true).try_init();
    let victim = shm_worker();
    let helper = shm_worker();
    let listener = victim.listen("127.0.0.1:0").expect("listen");
    let victim_rx = ring_len(super::RING_CAPACITY);
    let data_header = |reserved: u8| {
        let mut h = [0u8; 24];
        h[0] = 1;
        h[20] = reserved;
        h.to_vec()
    };
    let cases: Vec<(&str, u8, Vec<u8>)> = vec![
        ("a record of unknown kind 9", 9, vec![0; 8]),
        ("a GET record of 5 bytes", super::copy::KIND_GET, vec![1; 5]),
        (
            "a DATA record of 3 bytes",
            super::copy::KIND_DATA,
            vec![1; 3],
        ),
        (
            "a DATA record with reserved bytes set",
            super::copy::KIND_DATA,
            data_header(1),
        ),
    ];
    let mut alive = Vec::new();
    for (what, kind, record) in cases {
        let h = hostile_connect(&listener, &helper);
        let mut tx =
            Producer::new(h.seg.clone(), victim_rx, super::RING_CAPACITY).expect("producer");
        assert!(tx.push_kind(kind, &[&record]).expect("room"));
        step_until(&[&victim], || h.ep.close_reason().is_some());
        let reason = h.ep.close_reason().expect("closed");
        assert!(reason.contains(what), "{what}: closed for {reason}");
        alive.push(h);
    }
    // A DATA record for no READ of the victim's (one reclaimed while closing, say) is dropped.
    let h = hostile_connect(&listener, &helper);
    let mut tx = Producer::new(h.seg.clone(), victim_rx, super::RING_CAPACITY).expect("producer");
    assert!(tx
        .push_kind(super::copy::KIND_DATA, &[&data_header(0)])
        .expect("room"));
    for _ in 0..1000 {
        victim.progress();
    }
    assert!(h.ep.close_reason().is_none(), "{:?}", h.ep.close_reason());
}
