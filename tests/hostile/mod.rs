//! The hostile peer (a peer speaking raw verbs, built from `rdmx::conn` alone) and the
//! hardening tests that face an rdmx worker with it, written two-sided
//! ([`crate::api::two_sided`]): the worker under attack is the server side, the raw peer (and
//! a good rdmx peer beside it) the client side. `tests/device_hostile.rs` runs them in the
//! one guest (a thread each), `tests/twonode_api.rs` across the wire (a node each).
//!
//! The raw peer has its own protection domain, completion queue and queue pair, a few
//! receive buffers of its own, and connects to a [`Worker::listen`] listener with a valid
//! rdmx handshake as rdmacm private data, so rdmx accepts it as one of its own. Then it
//! misbehaves:
//!
//! * it SENDs one crafted frame (too long for rdmx's receive buffers, or malformed): the
//!   rdmx endpoint must close within a bounded wait, [`Ep::close_reason`] must name what was
//!   wrong, nothing of the frame may reach the application, and another endpoint of the same
//!   worker must keep working (an eager and a 1 MiB rendezvous roundtrip);
//! * it plays the receiver of a rendezvous and probes what the advertised rkey grants, in
//!   every `RDMX_RNDV_REG` mode: READ of its own message while the send runs, nothing for
//!   another peer holding the key, nothing after the send completed, never WRITE, and never
//!   the bytes of a message staged earlier in the same cache region.

/// One `#[test]` per two-sided test of this module, each with the given attributes.
macro_rules! two_sided_hostile_tests {
    (@each [$($attr:tt)*];) => {};
    (@each [$($attr:tt)*]; $name:ident $(, $rest:ident)* $(,)?) => {
        #[test]
        $($attr)*
        fn $name() {
            hostile::$name();
        }
        two_sided_hostile_tests!(@each [$($attr)*]; $($rest),*);
    };
    ($($attr:tt)*) => {
        two_sided_hostile_tests!(@each [$($attr)*];
            oversized_frame_closes_only_its_endpoint,
            malformed_frames_close_only_their_endpoint,
            per_operation_rkey_reads_one_message_for_one_peer_while_in_flight,
            cache_rkey_reads_one_message_for_one_peer_while_in_flight,
            cache_regions_never_show_an_earlier_message,
        );
    };
}

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use rdmx::conn::{
    connect, Access, AddrInfo, Completion, CompletionQueue, Connection, Device, EventChannel,
    ProtectionDomain, QpConfig, RegisteredBuf, RemoteBuf, Side, WcStatus, WorkKind,
};
use rdmx::proto::wire::{
    self, Body, FrameBuf, Handshake, Header, Opcode, RtsBody, WireStatus, HEADER_LEN, MAX_RNDV_LEN,
    RTS_BODY_LEN,
};
use rdmx::proto::Engine;
use rdmx::{
    Context, ContextBuilder, Ep, Listener, Request, Status, Transport, Worker, TAG_MASK_ALL,
};

use crate::api::{accept_n, pattern, two_sided, Endpoints, Peer};

/// A generous bound for anything to happen in the emulated guest (a hang guard, not a timing).
pub const LONG: Duration = Duration::from_secs(30);
/// Size of each receive buffer the raw peer posts (and announces in its handshake).
const RAW_RECV_BUF: usize = 256;
/// Frames rdmx may have in flight towards the raw peer (its receive buffers).
const RAW_CREDITS: u16 = 8;
/// The tag of the hostile frames; a receive for it is posted while they arrive.
const TAG_HOSTILE: u64 = 0xbad;
/// The tag of the good endpoint's traffic.
pub const TAG_GOOD: u64 = 7;
/// The tag of the rendezvous messages the raw peer receives.
pub const TAG_RNDV: u64 = 0x5e4d;
pub const MIB: usize = 1 << 20;

pub fn init_log() {
    let _ = env_logger::builder().is_test(true).try_init();
}

/// rdmx over RDMA with its defaults (8 KiB receive buffers), ignoring the environment.
pub fn builder() -> ContextBuilder {
    Context::builder()
        .env_lookup(|_| None)
        .transport(Transport::Rdma)
        .srq_depth(1024)
        .credits(16)
}

/// Progresses `workers` until `done()` holds; fails the test if it never does.
pub fn until(workers: &[&Worker], what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LONG;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {LONG:?}");
        for w in workers {
            w.progress();
        }
        thread::yield_now();
    }
}

/// Waits for a request while progressing `workers`.
pub fn finish(r: Request, workers: &[&Worker]) -> rdmx::Result<rdmx::Done> {
    let what = format!("{r:?} completes");
    until(workers, &what, || r.is_done());
    r.wait()
}

pub fn accept(listener: &Listener) -> Ep {
    accept_n(listener, 1, "an endpoint").remove(0)
}

/// The handshake the raw peer sends: rdmx's own, announcing the raw peer's receive buffers.
pub fn raw_handshake() -> Vec<u8> {
    let mut hs = Engine::new(Default::default()).local_handshake();
    hs.recv_buf_size = RAW_RECV_BUF as u32;
    hs.credits = RAW_CREDITS;
    hs.encode()
}

/// A peer speaking raw verbs: its own PD, CQ and QP (with its own receive queue).
pub struct RawPeer {
    pub conn: Connection,
    pub pd: ProtectionDomain,
    cq: CompletionQueue,
    /// Completions polled but not yet asked for.
    stash: Vec<Completion>,
    /// The handshake rdmx accepted with.
    pub rdmx: Handshake,
    /// Sequence number of the next frame to rdmx.
    tx_seq: u32,
    next_cookie: u64,
}

impl RawPeer {
    /// Connects to `addr`, retrying within [`LONG`] while nobody listens there yet (across
    /// nodes nothing tells the raw peer when the server listens).
    pub fn connect(addr: SocketAddr) -> RawPeer {
        let dst = AddrInfo::from_socket_addr(addr, Side::Active).unwrap();
        let device = Device::for_route(&dst).expect("a device routes to the listener");
        let pd = ProtectionDomain::new(&device).unwrap();
        let cq = CompletionQueue::new(&device, 256, false).unwrap();
        let events = EventChannel::new().unwrap();
        let mut config = QpConfig::new(&pd, &cq, None, &events);
        config.recv_depth = u32::from(RAW_CREDITS);
        let conn = rdmx_two_sided::retry(&format!("raw connect to {addr}"), LONG, || {
            connect(&dst, &config, &raw_handshake(), LONG)
        });
        for buf in pd
            .register_chunks(RAW_RECV_BUF, RAW_CREDITS.into(), Access::LOCAL_WRITE)
            .unwrap()
        {
            conn.post_recv(buf, 0).map_err(|(e, _)| e).unwrap();
        }
        let rdmx = Handshake::decode(conn.peer_private_data()).expect("rdmx's handshake");
        RawPeer {
            conn,
            pd,
            cq,
            stash: Vec::new(),
            rdmx,
            tx_seq: 0,
            next_cookie: 1,
        }
    }

    fn cookie(&mut self) -> u64 {
        self.next_cookie += 1;
        self.next_cookie
    }

    /// SENDs `bytes` as they are.
    pub fn send(&mut self, bytes: &[u8]) {
        let buf = self.pd.register_from(bytes, Access::SEND).unwrap();
        let cookie = self.cookie();
        self.conn
            .post_send(buf, bytes.len(), cookie)
            .map_err(|(e, _)| e)
            .unwrap();
    }

    /// SENDs a well-formed frame, numbered as rdmx expects.
    pub fn send_frame(&mut self, mut h: Header, rts: Option<&RtsBody>) {
        h.seq = self.tx_seq;
        self.tx_seq = self.tx_seq.wrapping_add(1);
        self.send(FrameBuf::encode(&h, rts).as_bytes());
    }

    pub fn poll(&mut self) {
        self.cq.poll(&mut self.stash, 16).unwrap();
    }

    /// The next completion of `kind`, progressing `workers` meanwhile.
    pub fn wait(&mut self, kind: WorkKind, workers: &[&Worker]) -> Completion {
        let mut found = None;
        until(workers, &format!("a raw {kind:?} completion"), || {
            self.poll();
            if let Some(i) = self.stash.iter().position(|c| c.kind == kind) {
                found = Some(self.stash.remove(i));
            }
            found.is_some()
        });
        found.expect("found")
    }

    /// Frames received so far (successful receives), without waiting. Each receive
    /// buffer goes back on the receive queue, as a conforming peer's would, so the credit
    /// it stands for can be returned to rdmx.
    pub fn frames(&mut self) -> Vec<Vec<u8>> {
        self.poll();
        let mut frames = Vec::new();
        let conn = &self.conn;
        self.stash.retain_mut(|c| {
            if c.kind != WorkKind::Recv {
                return true;
            }
            if c.status.is_success() {
                let buf = c.buffer.take().expect("a receive buffer");
                frames.push(buf[..c.byte_len as usize].to_vec());
                conn.post_recv(buf, 0).map_err(|(e, _)| e).expect("repost");
            }
            false
        });
        frames
    }

    /// Waits for an RTS from rdmx and returns its header and body.
    pub fn expect_rts(&mut self, workers: &[&Worker]) -> (Header, RtsBody) {
        let c = self.wait(WorkKind::Recv, workers);
        assert!(c.status.is_success(), "receive failed: {c:?}");
        let buf = c.buffer.as_ref().expect("a receive buffer");
        let frame = wire::decode(&buf[..c.byte_len as usize]).expect("rdmx sent a valid frame");
        match frame.body {
            Body::Rts(rts) => (frame.header, rts),
            other => panic!("expected an RTS, got {:?} {other:?}", frame.header),
        }
    }

    /// Acknowledges the rendezvous announced by `rts` (the ATS rdmx's own receiver would send),
    /// returning the credit of the RTS's receive buffer.
    pub fn send_ats(&mut self, rts: &Header) {
        let mut h = Header::new(Opcode::Ats);
        h.sreq = rts.sreq;
        h.rreq = 1;
        h.status = WireStatus::Ok;
        h.credits = 1;
        self.send_frame(h, None);
    }

    /// RDMA READs `len` bytes at `addr` with `rkey`: the completion status and the bytes.
    pub fn read(
        &mut self,
        addr: u64,
        rkey: u32,
        len: usize,
        workers: &[&Worker],
    ) -> (WcStatus, Option<RegisteredBuf>) {
        let target = self.pd.register(len, Access::LOCAL_WRITE).unwrap();
        let remote = RemoteBuf {
            addr,
            len: len as u32,
            rkey,
        };
        let cookie = self.cookie();
        self.conn
            .post_read(target, len, remote, cookie)
            .map_err(|(e, _)| e)
            .unwrap();
        let c = self.wait(WorkKind::Read, workers);
        (c.status, c.buffer)
    }

    /// RDMA WRITEs `data` to `addr` with `rkey`: the completion status.
    pub fn write(&mut self, addr: u64, rkey: u32, data: &[u8], workers: &[&Worker]) -> WcStatus {
        let source = self.pd.register_from(data, Access::SEND).unwrap();
        let remote = RemoteBuf {
            addr,
            len: data.len() as u32,
            rkey,
        };
        let cookie = self.cookie();
        self.conn
            .post_write(source, data.len(), remote, cookie)
            .map_err(|(e, _)| e)
            .unwrap();
        self.wait(WorkKind::Write, workers).status
    }
}

/// Connects a raw peer to `listener` (at `addr`): the peer and rdmx's endpoint for it.
pub fn raw_connect(listener: &Listener, addr: SocketAddr) -> (RawPeer, Ep) {
    let t = thread::spawn(move || RawPeer::connect(addr));
    let ep = accept(listener);
    (t.join().expect("raw peer"), ep)
}

/// A well-formed EAGER header for `TAG_HOSTILE` declaring `declared` payload bytes, followed by
/// `actual` bytes.
fn eager(declared: u32, actual: usize) -> Vec<u8> {
    let mut h = Header::new(Opcode::Eager);
    h.tag = TAG_HOSTILE;
    h.sreq = 1;
    h.payload_len = declared;
    let mut v = vec![0x5a; HEADER_LEN + actual];
    h.write(&mut v);
    v
}

/// An RTS for `TAG_HOSTILE` advertising `len` bytes at `addr`.
fn rts(addr: u64, len: u64) -> Vec<u8> {
    let mut h = Header::new(Opcode::Rts);
    h.tag = TAG_HOSTILE;
    h.sreq = 1;
    h.payload_len = RTS_BODY_LEN as u32;
    let body = RtsBody {
        addr,
        rkey: 0x1234,
        len,
    };
    FrameBuf::encode(&h, Some(&body)).as_bytes().to_vec()
}
/// The good endpoint between the two sides still works: an eager message and a 1 MiB
/// rendezvous each way (each side posts its receive, then sends the same bytes).
fn good_roundtrip(w: &Worker, ep: &Ep, seed: u8) {
    assert!(ep.is_connected());
    for len in [100, MIB] {
        let data = pattern(len, seed);
        let r = w.tag_recv(TAG_GOOD, TAG_MASK_ALL, vec![0; len]);
        let s = ep.tag_send(TAG_GOOD, data.clone());
        let got = finish(r, &[w]).expect("good receive");
        assert_eq!(got.length, len);
        assert!(
            got.buf == data,
            "the good endpoint's {len} bytes arrived intact"
        );
        finish(s, &[w]).expect("good send");
    }
}

/// Makes a hostile frame from the handshake rdmx accepted the raw peer with.
type MakeFrame = Box<dyn Fn(&Handshake) -> Vec<u8> + Sync>;

/// A hostile frame: what it is, how to make it, and what the close reason must contain.
pub struct Attack {
    case: String,
    frame: MakeFrame,
    want: String,
}

/// Each attack on a fresh raw connection to the server's worker, which also has a good
/// endpoint from the client side's rdmx worker: rdmx's endpoint for the raw peer closes with
/// a reason naming the fault, nothing of the frame is delivered, the connection is reaped,
/// whatever rdmx told the raw peer is an ERROR frame, and the good endpoint keeps working.
fn attacks(test: &'static str, attacks: &[Attack]) {
    two_sided(test, |p| {
        init_log();
        let ctx = builder().build().unwrap();
        let w = ctx.worker().unwrap();
        if p.is_server() {
            attacked(p, &w, attacks);
        } else {
            attacker(p, &w, attacks);
        }
    });
}

/// The server side of [`attacks`]: the worker under attack.
fn attacked(p: &Peer, server: &Worker, attacks: &[Attack]) {
    let workers = [server];
    let listener = p.listen(server);
    let good = accept(&listener);
    good_roundtrip(server, &good, 0);
    for (i, Attack { case, want, .. }) in attacks.iter().enumerate() {
        let base = server.stats();
        let ep = accept(&listener);
        assert!(ep.is_connected() && ep.close_reason().is_none());
        let guard = server.tag_recv(TAG_HOSTILE, TAG_MASK_ALL, vec![0; 1 << 16]);
        p.barrier(); // the raw peer sends its frame
        let what = format!("{case}: rdmx closes the endpoint (it stays connected: {ep:?})");
        until(&workers, &what, || !ep.is_connected());
        let reason = ep.close_reason().expect("a closed endpoint says why");
        println!("{case}: closed with {reason:?}");
        assert!(
            reason.contains(want.as_str()),
            "{case}: the close reason {reason:?} should contain {want:?}"
        );

        // Nothing of the frame reached the application.
        assert!(!guard.test(), "{case}: the hostile frame was delivered");
        assert!(guard.cancel());
        let err = finish(guard, &workers).expect_err("cancelled");
        assert_eq!(err.status(), Some(Status::Cancelled));
        assert_eq!(server.stats().unexpected_messages, 0, "{case}");
        // The closed endpoint refuses new work at once.
        let late = ep.tag_send(TAG_HOSTILE, vec![1; 10]);
        assert!(
            late.is_done(),
            "{case}: a send on a closed endpoint completes at once"
        );
        assert_eq!(
            late.wait().unwrap_err().status(),
            Some(Status::ConnectionClosed)
        );

        // The connection is reaped; the rest of the worker is untouched.
        until(
            &workers,
            &format!("{case}: the connection is reaped"),
            || {
                let s = server.stats();
                s.connections == base.connections && s.eps == base.eps
            },
        );
        let s = server.stats();
        assert_eq!(
            (s.pending_requests, s.user_buffers, s.reads_in_flight),
            (
                base.pending_requests,
                base.user_buffers,
                base.reads_in_flight
            ),
            "{case}: requests or buffers left behind"
        );
        p.barrier(); // the raw peer reads what it was told, and leaves
        good_roundtrip(server, &good, i as u8 + 1);
    }
    p.barrier();
}

/// The client side of [`attacks`]: a good rdmx endpoint, and a raw peer per attack.
fn attacker(p: &Peer, w: &Worker, attacks: &[Attack]) {
    let addr = p.server_addr();
    let good = p.connect(w, &addr);
    good_roundtrip(w, &good, 0);
    let addr: SocketAddr = addr.parse().expect("a socket address");
    for (i, Attack { case, frame, .. }) in attacks.iter().enumerate() {
        let mut raw = RawPeer::connect(addr);
        p.barrier();
        let frame = frame(&raw.rdmx);
        raw.send(&frame);
        p.barrier(); // rdmx closed and reaped the endpoint
                     // Whatever rdmx told the raw peer before disconnecting is an ERROR frame.
        let told = raw.frames();
        for f in &told {
            let frame = wire::decode(f).expect("rdmx sent a valid frame");
            assert_eq!(frame.header.opcode, Opcode::Error, "{case}: {frame:?}");
            assert_eq!(
                frame.header.status,
                WireStatus::Protocol,
                "{case}: {frame:?}"
            );
        }
        println!("{case}: the raw peer got {} ERROR frame(s)", told.len());
        drop(raw);
        good_roundtrip(w, &good, i as u8 + 1);
    }
    p.barrier();
}

/// A SEND longer than rdmx's receive buffers (a valid EAGER frame otherwise) fails in the
/// receiving NIC; rdmx must close that endpoint, saying why, and only that one. (The NIC
/// completes the SRQ receive with an error and puts that connection's queue pair in the error
/// state; the failed receive is rdmx's only sign of it until it next posts on that endpoint.)
pub fn oversized_frame_closes_only_its_endpoint() {
    let frame = |rdmx: &Handshake| {
        assert_eq!(rdmx.recv_buf_size, 8192, "rdmx's default receive buffer");
        let payload = rdmx.recv_buf_size as usize + 64 - HEADER_LEN;
        eager(payload as u32, payload)
    };
    attacks(
        "oversized_frame_closes_only_its_endpoint",
        &[Attack {
            case: "oversized frame".into(),
            frame: Box::new(frame),
            want: "receive".into(),
        }],
    );
}

/// Malformed frames, each on a fresh raw connection to the same worker: each closes its own
/// endpoint with a protocol error naming the fault; the worker's good endpoint keeps working
/// after every one.
pub fn malformed_frames_close_only_their_endpoint() {
    let mut bad_opcode = eager(16, 16);
    bad_opcode[3] = 99;
    let mut bad_version = eager(16, 16);
    bad_version[2] = 9;
    let mut bad_magic = eager(16, 16);
    bad_magic[..2].copy_from_slice(&0xbeef_u16.to_le_bytes());
    let cases: Vec<(&str, Vec<u8>, String)> = vec![
        (
            "payload_len disagreeing with the bytes sent",
            eager(100, 10),
            "payload length 100 disagrees with 10 bytes".into(),
        ),
        ("unknown opcode", bad_opcode, "unknown opcode 99".into()),
        (
            "bad version",
            bad_version,
            "unsupported protocol version 9".into(),
        ),
        ("bad magic", bad_magic, "bad magic 0xbeef".into()),
        (
            "RTS of 0 bytes",
            rts(0x10000, 0),
            "RTS advertises 0 bytes at 0x10000: out of range".into(),
        ),
        (
            "RTS longer than 2^47",
            rts(0x10000, MAX_RNDV_LEN + 1),
            format!("RTS advertises {} bytes", MAX_RNDV_LEN + 1),
        ),
        (
            "RTS whose addr + len overflows",
            rts(u64::MAX - 4095, 8192),
            "RTS advertises 8192 bytes at 0xfffffffffffff000: out of range".into(),
        ),
    ];
    let attacks_list: Vec<Attack> = cases
        .into_iter()
        .map(|(case, frame, want)| Attack {
            case: case.into(),
            frame: Box::new(move |_: &Handshake| frame.clone()),
            want: format!("protocol error: {want}"),
        })
        .collect();
    attacks("malformed_frames_close_only_their_endpoint", &attacks_list);
}

/// The rkey in an RTS gives access to exactly the bytes of one message, for the one peer it
/// was sent to, while the rendezvous is in flight (crate docs, "What stays readable"), in
/// every registration mode: another peer of the same worker holding the key is refused; the
/// peer it was sent to READs the message; once the send completed the key is dead; and a
/// WRITE is refused. (rxe exposes the message through a memory window bound to the peer's
/// QP.) A refused remote access breaks the RC queue pair that made it, so each refusal is the
/// last thing its raw connection does. The server sends; the client side's raw peers probe.
fn rkey_reads_one_message_for_one_peer_while_in_flight(
    test: &'static str,
    mode: &'static str,
    len: usize,
) {
    two_sided(test, |p| {
        init_log();
        if !p.is_server() {
            let addr: SocketAddr = p.server_addr().parse().expect("a socket address");
            let mut p1 = RawPeer::connect(addr);
            let mut p2 = RawPeer::connect(addr);
            let (h, body) = p1.expect_rts(&[]);
            assert_eq!((h.tag, h.seq, body.len), (TAG_RNDV, 0, len as u64));
            let (other, _) = p2.read(body.addr, body.rkey, len, &[]);
            println!("{mode}: another peer READs with the key: {other:?}");
            assert_eq!(
                other,
                WcStatus::REMOTE_ACCESS,
                "{mode}: a key sent to one peer must not work for another"
            );
            let (status, data) = p1.read(body.addr, body.rkey, len, &[]);
            assert!(status.is_success(), "{mode}: READ with the key: {status:?}");
            assert!(
                data.expect("the READ target")[..] == pattern(len, 1)[..],
                "{mode}"
            );
            p.barrier(); // the server checks its send still waits
            p.barrier();
            p1.send_ats(&h);
            p.barrier(); // the send completed
            let (late, _) = p1.read(body.addr, body.rkey, len.min(4096), &[]);
            println!("{mode}: READ after the send completed: {late:?}");
            assert_eq!(
                late,
                WcStatus::REMOTE_ACCESS,
                "{mode}: the key of a completed send must be dead"
            );
            // A third peer gets its own message: its key reads it, never writes it.
            let mut p3 = RawPeer::connect(addr);
            let (_, body3) = p3.expect_rts(&[]);
            let (status, data) = p3.read(body3.addr, body3.rkey, len.min(4096), &[]);
            assert!(status.is_success(), "{mode}: {status:?}");
            assert!(data.expect("the READ target")[..] == pattern(len, 3)[..len.min(4096)]);
            let write = p3.write(body3.addr, body3.rkey, &[0xee; 64], &[]);
            println!("{mode}: WRITE with the key: {write:?}");
            assert_eq!(
                write,
                WcStatus::REMOTE_ACCESS,
                "rdmx never grants REMOTE_WRITE"
            );
            // The raw peer's QP is broken now; it leaves, which fails the send without its
            // ATS.
            drop(p3);
            p.barrier();
            p.barrier();
            drop((p1, p2));
            return;
        }
        let ctx = builder().set("RDMX_RNDV_REG", mode).build().unwrap();
        let server = ctx.worker().unwrap();
        let listener = p.listen(&server);
        let w = [&server];
        let ep1 = accept(&listener);
        let _ep2 = accept(&listener);
        let msg = pattern(len, 1);
        let send = ep1.tag_send(TAG_RNDV, msg.clone());
        p.barrier(); // the raw peers READ
        assert!(!send.test(), "{mode}: the send waits for the ATS");
        p.barrier(); // the ATS comes
        let done = finish(send, &w).expect("the send completes after the ATS");
        assert!(done.buf == msg, "{mode}: the sender gets its buffer back");
        p.barrier();
        let ep3 = accept(&listener);
        let msg3 = pattern(len, 3);
        let send3 = ep3.tag_send(TAG_RNDV, msg3.clone());
        p.barrier(); // the third peer READ, tried to WRITE, and left
        let mut err = finish(send3, &w).expect_err("the send fails when the peer leaves");
        assert_eq!(err.status(), Some(Status::ConnectionClosed));
        assert!(
            err.take_buffer() == msg3,
            "{mode}: the refused WRITE changed nothing"
        );
        until(&w, "the third endpoint closes", || !ep3.is_connected());
        p.barrier();
    });
}

pub fn per_operation_rkey_reads_one_message_for_one_peer_while_in_flight() {
    rkey_reads_one_message_for_one_peer_while_in_flight(
        "per_operation_rkey_reads_one_message_for_one_peer_while_in_flight",
        "per-op",
        MIB,
    );
}

pub fn cache_rkey_reads_one_message_for_one_peer_while_in_flight() {
    rkey_reads_one_message_for_one_peer_while_in_flight(
        "cache_rkey_reads_one_message_for_one_peer_while_in_flight",
        "cache",
        16 * 1024,
    );
}

/// Cache mode stages a message through a region of the registration cache (a 64 KiB size
/// class, reused). A peer may READ through its key nothing but its own message: where the
/// provider enforces the window's range the rest of the region is refused, and where it
/// only enforces the region's (rxe) the rest reads as zeros — never the bytes of a message
/// staged there earlier for another peer (the worker wipes a send-staging region before
/// reusing it). The server sends an earlier, larger message to the client's good rdmx
/// worker, then a smaller one to its raw peer through the same region.
pub fn cache_regions_never_show_an_earlier_message() {
    const LEN: usize = 16 * 1024;
    const EARLIER: usize = 48 * 1024;
    const REGION: usize = 64 * 1024;
    two_sided("cache_regions_never_show_an_earlier_message", |p| {
        init_log();
        let ctx = builder().set("RDMX_RNDV_REG", "cache").build().unwrap();
        let w = ctx.worker().unwrap();
        if !p.is_server() {
            let addr = p.server_addr();
            let _good = p.connect(&w, &addr);
            let r = w.tag_recv(TAG_GOOD, TAG_MASK_ALL, vec![0; EARLIER]);
            assert!(finish(r, &[&w]).expect("good receive").buf == pattern(EARLIER, 4));
            let mut raw = RawPeer::connect(addr.parse().expect("a socket address"));
            let (h, body) = raw.expect_rts(&[]);
            let (status, data) = raw.read(body.addr, body.rkey, LEN, &[]);
            assert!(status.is_success(), "{status:?}");
            assert!(data.expect("the READ target")[..] == pattern(LEN, 5)[..]);
            let (status, data) = raw.read(body.addr, body.rkey, REGION, &[]);
            println!("cache: READ of the whole {REGION}-byte region through the key: {status:?}");
            if status.is_success() {
                let data = data.expect("the READ target");
                assert!(data[..LEN] == pattern(LEN, 5)[..]);
                assert!(
                    data[LEN..].iter().all(|&b| b == 0),
                    "the region beyond the message holds nothing (an earlier message was there)"
                );
                // The QP survived (rxe): the send completes.
                raw.send_ats(&h);
            } else {
                // Refused: the QP broke, the raw peer leaves, the send fails.
                assert_eq!(status, WcStatus::REMOTE_ACCESS);
                drop(raw);
                p.barrier();
                p.barrier();
                return;
            }
            p.barrier();
            p.barrier();
            return;
        }
        let listener = p.listen(&w);
        let good = accept(&listener);
        finish(good.tag_send(TAG_GOOD, pattern(EARLIER, 4)), &[&w]).expect("good send");
        let ep = accept(&listener);
        let send = ep.tag_send(TAG_RNDV, pattern(LEN, 5));
        p.barrier(); // the raw peer READ
        assert_eq!(
            w.stats().rcache_registrations,
            1,
            "both messages went through one cached region"
        );
        // It completes if the raw peer's QP survived its READ of the whole region (rxe), and
        // fails with the peer otherwise.
        match finish(send, &[&w]) {
            Ok(done) => assert!(done.buf == pattern(LEN, 5)),
            Err(e) => assert_eq!(e.status(), Some(Status::ConnectionClosed), "{e}"),
        }
        p.barrier();
    });
}
