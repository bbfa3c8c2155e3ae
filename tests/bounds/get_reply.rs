//! Issue 48, item 2: a peer's one-sided operations cost a worker what the worker bounds,
//! not what the peer declares. A raw peer (its handshake altered, its frames built by hand)
//! lies about its receive buffers, asks for gets with bogus and valid keys, larger than a
//! reply may carry, and withholds credits; a legitimate peer exchanges messages with the
//! victim meanwhile. Each attack runs over TCP and over shared memory, whose one-sided
//! operations also go as frames the victim's engine performs.
//!
//! The bounds (crate docs, "Bounds"): a handshake declaring receive buffers above
//! `MAX_RECV_BUF_SIZE` (16 MiB, TCP's largest frame) is rejected at connect, naming the
//! size; a get may ask at most what a reply carries into the smaller of both sides' receive
//! buffers (over TCP 64 KiB less the 40-byte header, over shared memory 16 KiB), and more
//! closes that endpoint as a protocol error naming the sizes; a refused get allocates
//! nothing; each get's credit is held until its reply leaves, so a peer withholding credits
//! makes the victim hold at most its window of replies, and waits.

use super::*;

use rdmx::proto::rma::{KeyRef, PackedKey};
use rdmx::proto::wire::{self, FrameBuf, Header, Opcode, WireStatus};
use rdmx::proto::{HEADER_LEN, MAX_RECV_BUF_SIZE};
use rdmx::{Ep, RemoteAccess};

/// How much the victim's resident set may grow while an attack runs. (Before: each bogus
/// 16 MiB get allocated and zeroed 16 MiB, held while its reply waited for credit: some
/// 450 MiB for 32 of them; with a declared `u32::MAX`, 1 GiB a get.)
const GROWTH: usize = 96 * MIB;

/// A hand-made rdmx peer over a raw connection (TCP or shared memory): it numbers its
/// frames, counts the credits the victim returned, and keeps the victim's replies.
struct RawPeer {
    wire: Box<dyn RawWire>,
    /// The victim's handshake, from the TCP ACCEPT.
    victim: Handshake,
    seq: u32,
    /// Frames this peer may still send.
    credits: u64,
    next_req: u64,
    /// The victim's RMA replies: request, status, bytes.
    replies: Vec<(u64, WireStatus, Vec<u8>)>,
    /// The victim sent an ERROR frame or closed the connection.
    closed: bool,
}

impl RawPeer {
    /// Connects over `transport` with `hs`; the victim's endpoint for it, accepted by
    /// `listener`.
    fn connect(transport: Transport, listener: &Listener, hs: Handshake) -> (RawPeer, Ep) {
        let (wire, ep): (Box<dyn RawWire>, Ep) = match transport {
            Transport::Shm => {
                let raw = shm_raw::connect(listener, &hs);
                let ep = raw.ep.clone();
                (Box::new(raw), ep)
            }
            _ => {
                let (raw, ep) = raw_tcp::connect(listener, &hs);
                (Box::new(raw), ep)
            }
        };
        let victim = wire.victim();
        let peer = RawPeer {
            wire,
            credits: victim.credits.into(),
            victim,
            seq: 0,
            next_req: 1,
            replies: Vec::new(),
            closed: false,
        };
        (peer, ep)
    }

    /// The most a get may ask of the victim: what a reply carries into the smaller of both
    /// sides' receive buffers (the victim's are the smaller: 64 KiB - 40 over TCP, 16 KiB
    /// over shared memory).
    fn room(&self, own: u32) -> u64 {
        u64::from(self.victim.recv_buf_size.min(own)) - HEADER_LEN as u64
    }

    /// Queues the frame `frame` makes of the next sequence number, if a credit allows it.
    fn queue(&mut self, frame: impl FnOnce(u32) -> FrameBuf) -> bool {
        if self.credits == 0 {
            return false;
        }
        self.wire.send(frame(self.seq).as_bytes());
        self.seq += 1;
        self.credits -= 1;
        true
    }

    /// Queues a get of `len` bytes at `offset` of `key`'s region, granting the victim
    /// `grant` credits; false when no credit is left for it.
    fn get(&mut self, key: KeyRef, offset: u64, len: u64, grant: u16) -> bool {
        let sreq = self.next_req;
        let sent = self.queue(|seq| get_frame(seq, sreq, grant, key, offset, len));
        self.next_req += u64::from(sent);
        sent
    }

    /// Queues a CREDIT frame granting `grant`.
    fn grant(&mut self, grant: u16) -> bool {
        self.queue(|seq| {
            let mut h = Header::new(Opcode::Credit);
            h.seq = seq;
            h.credits = grant;
            FrameBuf::encode(&h, None)
        })
    }

    /// Sends what is queued and takes in what the victim sent.
    fn poll(&mut self) {
        if self.closed {
            return;
        }
        let mut frames = Vec::new();
        if !self.wire.poll(&mut frames) {
            self.closed = true;
        }
        for bytes in frames {
            let f = wire::decode(&bytes).expect("the victim sends valid frames");
            self.credits += u64::from(f.header.credits);
            match f.header.opcode {
                Opcode::RmaReply => self.replies.push((
                    f.header.sreq,
                    f.header.status,
                    bytes[HEADER_LEN..].to_vec(),
                )),
                Opcode::Error => self.closed = true,
                _ => {}
            }
        }
    }

    /// Progresses `victim` and this peer until `done` holds.
    fn until(&mut self, victim: &Worker, what: &str, done: impl Fn(&RawPeer) -> bool) {
        let deadline = Instant::now() + LONG;
        while !done(self) {
            assert!(Instant::now() < deadline, "hung waiting for {what}");
            victim.progress();
            self.poll();
        }
    }
}

/// The victim's resident set grew by less than [`GROWTH`] since `base`.
fn within_bound(base: usize, when: &str) {
    assert_grown_within(base, GROWTH, when);
}

/// A victim worker listening over `transport`, with a legitimate client connected to it:
/// (victim, listener, client worker, client's endpoint, victim's endpoint for it).
fn victim_and_client(transport: Transport) -> (Worker, Listener, Worker, Ep, Ep) {
    let ctx = context(transport, &[]);
    let (server, listener, addr) = listening(&ctx);
    let (client, cep, sep) = connected(&ctx, &listener, &addr);
    assert_eq!(cep.transport(), transport);
    (server, listener, client, cep, sep)
}

/// Issue 48, item 2: a handshake saying `recv_buf_size = u32::MAX` was taken (only a lower
/// bound was checked), and each 64-byte get with a bogus key then allocated as much as the
/// peer declared. Now such a peer is rejected at connect (over shared memory too, its offer
/// taken and the segment handed over first): its connect fails, and the victim's accept,
/// with the reason naming the size; a legitimate peer exchanges messages with the victim
/// before and after.
fn receive_buffers_beyond_any_frame_are_rejected_at_connect(transport: Transport) {
    init_log();
    let _measuring = measuring();
    let (server, listener, client, cep, sep) = victim_and_client(transport);
    exchange(&client, &cep, &server, &sep);
    let base = rss();
    let mut hs = default_handshake();
    hs.recv_buf_size = u32::MAX;
    // (Over shared memory, the raw peer's hand-over socket lives until the peer is refused.)
    let (private, socket) = match transport {
        Transport::Shm => {
            let (private, socket) = shm_raw::offering(&hs);
            (private, Some(socket))
        }
        _ => (hs.encode(), None),
    };
    let a = listener.local_addr().expect("bound").to_string();
    let t = std::thread::spawn(move || {
        let connected = rdmx_tcp::connect(&a, &private, LONG);
        // (Accepted, the peer takes the segment handed over: the victim's accept completes.)
        if let (Ok(_), Some(socket)) = (&connected, &socket) {
            drop(socket.take_hand_over());
        }
        connected
    });
    // (Listener::accept skips a request its peer made fail and waits for the next: the
    // request itself reports why.)
    let request = listener
        .next_request(Some(LONG))
        .expect("the listener")
        .expect("the peer's request");
    let accepted = request.accept();
    let connected = t.join().unwrap();
    let why = format!("{}", accepted.expect_err("the victim refuses the peer"));
    assert!(
        why.contains("4294967295 bytes") && why.contains("largest frame"),
        "{why}"
    );
    let refused = connected.expect_err("the peer's connect fails");
    let told = String::from_utf8_lossy(refused.reject_data());
    assert!(told.contains("4294967295 bytes"), "{refused}: {told}");
    exchange(&client, &cep, &server, &sep);
    within_bound(base, "after the rejected peer");
}

#[test]
fn receive_buffers_beyond_any_frame_are_rejected_at_connect_over_tcp() {
    receive_buffers_beyond_any_frame_are_rejected_at_connect(Transport::Tcp);
}

#[test]
fn receive_buffers_beyond_any_frame_are_rejected_at_connect_over_shm() {
    receive_buffers_beyond_any_frame_are_rejected_at_connect(Transport::Shm);
}

/// Issue 48, item 2: a peer declaring the largest receive buffers a handshake may (16 MiB)
/// gets what a reply into the victim's receive buffers carries (64 KiB - 40 over TCP, 16 KiB
/// over shared memory), and no more: gets with a valid key at that size are served
/// byte-exact, those with a bogus key are refused (`BadKey`, no bytes); 32 64-byte gets with
/// a bogus key, and 32 with a valid one, each asking for 16 MiB, close the asking endpoint
/// as a protocol error naming the sizes (before: each was served or refused after the
/// victim allocated and zeroed 16 MiB, held while the replies waited for the credits the
/// peer withheld). The victim's RSS stays within [`GROWTH`] throughout, and a legitimate
/// peer exchanges messages meanwhile.
fn a_get_costs_the_victim_its_own_bounds_not_the_peer_s(transport: Transport) {
    init_log();
    let _measuring = measuring();
    let (server, listener, client, cep, sep) = victim_and_client(transport);
    let data: Vec<u8> = (0..MIB).map(|i| (i % 253) as u8).collect();
    let region = server.mem_map_from(&data, RemoteAccess::READ).unwrap();
    let key = PackedKey::decode(&region.pack_rkey()).unwrap().key;
    let bogus = KeyRef {
        secret: key.secret ^ 0x5a5a,
        ..key
    };
    let mut hs = default_handshake();
    hs.recv_buf_size = MAX_RECV_BUF_SIZE;
    let base = rss();

    // What a reply carries: served with a valid key (granting a credit each), refused with
    // a bogus one.
    let (mut peer, pep) = RawPeer::connect(transport, &listener, hs);
    let room = peer.room(hs.recv_buf_size);
    let expected_room = match transport {
        Transport::Shm => 16 * 1024,
        _ => 64 * 1024 - HEADER_LEN as u64,
    };
    assert_eq!(room, expected_room);
    for i in 0..8 {
        assert!(peer.get(key, i * room, room, 1));
    }
    for _ in 0..4 {
        assert!(peer.get(bogus, 0, room, 1));
    }
    peer.until(&server, "12 replies", |p| p.replies.len() == 12);
    for (i, (req, status, bytes)) in peer.replies.iter().enumerate() {
        assert_eq!(*req, i as u64 + 1);
        if i < 8 {
            let at = i * room as usize;
            assert_eq!(*status, WireStatus::Ok);
            assert!(
                bytes[..] == data[at..at + room as usize],
                "bytes of get {i}"
            );
        } else {
            assert_eq!((*status, bytes.len()), (WireStatus::BadKey, 0));
        }
    }
    exchange(&client, &cep, &server, &sep);
    within_bound(base, "after the gets a reply carries");

    // 32 gets for 16 MiB each, withholding credits, with the bogus key and then (another
    // peer) with the valid one: the first closes the endpoint.
    let huge = u64::from(MAX_RECV_BUF_SIZE) - HEADER_LEN as u64;
    let attack = |name: &str, mut peer: RawPeer, pep: Ep, k: KeyRef| {
        let answered = peer.replies.len();
        let mut sent = 0;
        while sent < 32 && peer.get(k, 0, huge, 0) {
            sent += 1;
        }
        assert!(sent >= 16, "{name}: only {sent} gets sent");
        peer.poll();
        exchange(&client, &cep, &server, &sep);
        within_bound(base, &format!("{sent} {name}-key gets for 16 MiB"));
        peer.until(&server, "the victim to close", |p| p.closed);
        let why = pep.close_reason().expect("the asking endpoint closed");
        assert!(
            why.contains("protocol error")
                && why.contains(&format!("get of {huge} bytes, more than the {room}")),
            "{name}: {why}"
        );
        assert_eq!(
            peer.replies.len(),
            answered,
            "{name}: a 16 MiB get was answered"
        );
        exchange(&client, &cep, &server, &sep);
        within_bound(base, &format!("after the {name}-key gets"));
    };
    attack("bogus", peer, pep, bogus);
    let (peer, pep) = RawPeer::connect(transport, &listener, hs);
    attack("valid", peer, pep, key);
    drop(region);
}

#[test]
fn a_get_costs_the_victim_its_own_bounds_not_the_peer_s_over_tcp() {
    a_get_costs_the_victim_its_own_bounds_not_the_peer_s(Transport::Tcp);
}

#[test]
fn a_get_costs_the_victim_its_own_bounds_not_the_peer_s_over_shm() {
    a_get_costs_the_victim_its_own_bounds_not_the_peer_s(Transport::Shm);
}

/// Issue 48, item 2: replies waiting for credits are bounded by the asking peer's window.
/// A peer sends as many gets as its credits allow (each what a reply into its 8 KiB buffers
/// carries) and grants none: the victim answers while it has credits, then holds the rest —
/// at most the peer's window of them (what the victim granted it: over TCP its initial grant
/// from the worker's pool, over shared memory the ring's fixed 1024), each still holding
/// that get's credit, so the peer runs out and waits (its next get is not sent). Once it grants credits every reply arrives, byte-exact. The
/// victim's RSS stays within [`GROWTH`]; a legitimate peer exchanges messages meanwhile.
fn a_peer_withholding_credits_waits_for_its_replies(transport: Transport) {
    init_log();
    let _measuring = measuring();
    let (server, listener, client, cep, sep) = victim_and_client(transport);
    let data: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
    let region = server.mem_map_from(&data, RemoteAccess::READ).unwrap();
    let key = PackedKey::decode(&region.pack_rkey()).unwrap().key;
    let hs = default_handshake();
    let base = rss();
    let (mut peer, pep) = RawPeer::connect(transport, &listener, hs);
    let room = peer.room(hs.recv_buf_size);
    let window = peer.credits;
    let mut gets = 0u64;
    // Rounds of gets while the peer has credits (but the one an rdmx engine keeps for a
    // CREDIT frame): the victim returns only the credits of the replies it could send.
    for _ in 0..8 {
        while peer.credits > 1 && peer.get(key, (gets * room) % (MIB as u64 - room), room, 0) {
            gets += 1;
        }
        peer.poll();
        exchange(&client, &cep, &server, &sep);
        peer.poll();
        within_bound(base, "gets with credits withheld");
    }
    let answered = peer.replies.len() as u64;
    println!("{transport}: {gets} gets, {answered} answered, window {window}");
    assert!(
        gets - answered <= window,
        "{gets} gets, {answered} answered: more waiting than the window of {window}"
    );
    assert!(gets > answered, "no reply waited");
    assert!(pep.is_connected(), "{:?}", pep.close_reason());
    // The peer grants credits (with the one it kept): every reply comes.
    let mut rounds = 0;
    while (peer.replies.len() as u64) < gets {
        rounds += 1;
        assert!(rounds < 1000, "the replies do not come");
        let before = peer.replies.len();
        assert!(
            peer.grant(hs.max_credits / 2),
            "no credit left to grant with"
        );
        peer.until(&server, "replies", |p| p.replies.len() > before || p.closed);
        assert!(!peer.closed, "{:?}", pep.close_reason());
        peer.until(&server, "a credit", |p| p.credits > 0 || p.closed);
    }
    for (i, (req, status, bytes)) in peer.replies.iter().enumerate() {
        let at = ((i as u64 * room) % (MIB as u64 - room)) as usize;
        assert_eq!((*req, *status), (i as u64 + 1, WireStatus::Ok));
        assert!(
            bytes[..] == data[at..at + room as usize],
            "bytes of get {i}"
        );
    }
    exchange(&client, &cep, &server, &sep);
    within_bound(base, "after the replies");
}

#[test]
fn a_peer_withholding_credits_waits_for_its_replies_over_tcp() {
    a_peer_withholding_credits_waits_for_its_replies(Transport::Tcp);
}

#[test]
fn a_peer_withholding_credits_waits_for_its_replies_over_shm() {
    a_peer_withholding_credits_waits_for_its_replies(Transport::Shm);
}

/// The largest receive buffer a handshake may declare is the TCP transport's largest frame
/// (the engine cannot name the constant of a transport it does not know).
#[test]
fn the_largest_declared_buffer_is_tcp_s_largest_frame() {
    assert_eq!(MAX_RECV_BUF_SIZE as usize, rdmx_tcp::MAX_FRAME_LEN);
}
