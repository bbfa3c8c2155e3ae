//! The TCP output queue (issue 48, item 3): what a peer asks for and does not read — GET
//! replies, READ answers — has a bound per connection ([`LIMIT`], the connection's output
//! limit), and past it the worker stops reading that peer's input, which then waits in the
//! peer's own socket; TCP's flow control holds the peer up, no one else. Once the peer
//! reads, it gets every answer. And two legitimate peers never both stop reading each
//! other, however many large messages they exchange.
//!
//! Why two rdmx peers never both stop reading each other: a connection's output queue
//! holds, for a legitimate peer, at most (a) the frames that peer's credit window lets this
//! side have in flight to it — every frame spends a credit the peer returns only once it
//! has read the frame, so frames not yet written are within its window, each no larger
//! than its receive buffers: `RDMX_CREDITS` × `RDMX_RECV_BUF_SIZE`, 4 MiB with the defaults,
//! counted at most twice over for the buffers' spare capacity; (b) the answers to the READs
//! it keeps in flight, at most `MAX_READS_PER_CONN` (64) per connection whatever the number
//! of messages, each a slot of the queue (and, failed, a small buffer); (c) this side's own
//! READ requests, 64 at most too — (b) and (c) well under 1 MiB. The limit is at least
//! 16 MiB and at least 4 × `RDMX_CREDITS` × `RDMX_RECV_BUF_SIZE` of this side's
//! configuration, so a peer configured like this side (or smaller) never reaches it. Of two
//! peers however configured, at most one can: if A's queue to B passed A's limit, B's
//! window × buffers is more than twice A's (less a fraction of a MiB), and then A's make
//! less than half of B's limit: B's queue to A never passes it. The side that paused
//! always has a peer that reads it, and resumes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdmx::proto::rma::{KeyRef, PackedKey};
use rdmx::proto::wire::{self, Body, Opcode, RtsBody};
use rdmx::{Ep, RemoteAccess, Transport, Worker, TAG_MASK_ALL};

use super::raw_tcp::{self, RawTcp};
use super::*;

/// A TCP connection's output limit with the defaults (64 credits × 64 KiB frames, times 4,
/// is no more): 16 MiB.
const LIMIT: usize = rdmx_tcp::DEFAULT_OUTPUT_LIMIT;

/// What the victim's output queues may hold while an attack runs: the limit, and what
/// crossing it can add — the answers to the frame delivered last (a GET reply of 64 KiB),
/// or the queue's ring of items growing by doubling (at most the limit again).
const QUEUED_BOUND: u64 = 2 * LIMIT as u64 + MIB as u64;

/// The bound the victim's resident memory stays within during an attack: the queue's
/// bound, the legitimate exchange's buffers and some slack. Without the limit, the GET
/// flood below grew it by 249 MiB, the READ flood by 234 MiB (each run alone: a process
/// keeps the memory an earlier test freed, and an RSS measured after it grows less).
const RSS_BOUND: usize = 96 * MIB;

/// A raw TCP peer that spoke the rdmx handshake (as a TCP rdmx peer does: 64 KiB receive
/// buffers) and then sends frames built by hand.
struct Raw {
    tcp: RawTcp,
    /// The sequence number of its next frame.
    seq: u32,
}

impl Raw {
    /// Connects to `listener`; returns the peer and the victim's endpoint.
    fn connect(listener: &rdmx::Listener) -> (Raw, Ep) {
        let mut hs = default_handshake();
        hs.recv_buf_size = rdmx::TCP_RECV_BUF_SIZE;
        let (tcp, ep) = raw_tcp::connect(listener, &hs);
        (Raw { tcp, seq: 0 }, ep)
    }

    /// Queues a GET of `len` bytes at offset 0 of `key`'s region, returning a credit (the
    /// one its reply spends: the victim's window never runs dry).
    fn queue_get(&mut self, key: KeyRef, len: u64) {
        let frame = get_frame(self.seq, 1 + u64::from(self.seq), 1, key, 0, len);
        self.seq += 1;
        self.tcp.send(frame.as_bytes());
    }

    /// Takes in what the victim sent, counting its GET replies into `replies`: each in
    /// order and whole (`len` bytes), once the victim sent them. The victim must not close
    /// the connection.
    fn count_replies(&mut self, replies: &mut usize, len: u64) {
        let mut frames = Vec::new();
        assert!(
            self.tcp.poll(&mut frames),
            "the victim closed the attacker's link"
        );
        for bytes in frames {
            let h = wire::decode_header(&bytes).expect("a frame");
            if h.opcode == Opcode::RmaReply {
                *replies += 1;
                assert_eq!(h.sreq, *replies as u64, "replies in order");
                assert_eq!(h.status, wire::WireStatus::Ok);
                assert_eq!(bytes.len() as u64, wire::HEADER_LEN as u64 + len);
            }
        }
    }
}

/// The key of `victim`'s region `mem`, sent to the raw peer over `ep` as a tag message
/// (how an application hands its keys out), as the raw peer decodes it.
fn hand_key(victim: &Worker, ep: &Ep, raw: &mut Raw, mem: &rdmx::MemHandle) -> KeyRef {
    let send = ep.tag_send(0x4b, mem.pack_rkey());
    let key = raw
        .tcp
        .expect(victim, |bytes| match wire::decode(bytes).ok()?.body {
            Body::Eager(payload) => Some(PackedKey::decode(payload).expect("a packed key").key),
            _ => None,
        });
    wait_within(send, "the key's send").expect("the key went out");
    key
}

/// A legitimate rdmx peer connects to `victim` (listening on `listener` at `addr`) and
/// exchanges eager and rendezvous messages both ways; returns its worker and endpoints,
/// left open.
fn legitimate_exchange(victim: &Worker, listener: &rdmx::Listener, addr: &str) -> (Worker, Ep, Ep) {
    let ctx = context(Transport::Tcp, &[]);
    let (client, client_ep, server_ep) = connected(&ctx, listener, addr);
    exchange(&client, &client_ep, victim, &server_ep);
    (client, client_ep, server_ep)
}

/// Progresses `victim` (flushing `raw` meanwhile) until it has been idle for a while:
/// everything it could read, it read.
fn progress_until_idle(victim: &Worker, raw: &RawTcp) {
    let deadline = Instant::now() + LONG;
    let mut idle = 0;
    while idle < 2000 {
        assert!(Instant::now() < deadline, "the victim never went idle");
        let _ = raw.link.flush();
        if victim.progress() == 0 {
            idle += 1;
        } else {
            idle = 0;
        }
    }
}

/// GETs of a flood, each of 64 KiB less the header: 250 KiB sent, 250 MiB asked.
const GETS: usize = 4000;

/// A victim of `settings` and a raw peer that queued [`GETS`] GETs with a valid key (not
/// yet sent): what a GET flood test starts from.
struct GetFlood {
    victim: Worker,
    listener: rdmx::Listener,
    addr: String,
    raw: Raw,
    /// The victim's endpoint for the raw peer.
    ep: Ep,
    /// The region the GETs read (mapped while the flood lasts).
    _region: rdmx::MemHandle,
    /// Bytes each GET asks for.
    len: u64,
    /// The victim's resident set before the flood.
    before: usize,
}

/// The victim listens, the raw peer connects and is handed the key of a MiB region of the
/// victim's, and queues [`GETS`] GETs of it.
fn get_flood(settings: &[(&str, &str)]) -> GetFlood {
    let ctx = context(Transport::Tcp, settings);
    let (victim, listener, addr) = listening(&ctx);
    let (mut raw, ep) = Raw::connect(&listener);
    let region = victim
        .mem_map(MIB, RemoteAccess::READ)
        .expect("map a region");
    let key = hand_key(&victim, &ep, &mut raw, &region);
    let len = u64::from(rdmx::TCP_RECV_BUF_SIZE) - wire::HEADER_LEN as u64;
    let before = rss();
    for _ in 0..GETS {
        raw.queue_get(key, len);
    }
    GetFlood {
        victim,
        listener,
        addr,
        raw,
        ep,
        _region: region,
        len,
        before,
    }
}

/// The victim holds an attack up: its resident set grew by less than [`RSS_BOUND`] since
/// `before`, its output queues hold at most [`QUEUED_BOUND`], and it stopped reading one
/// peer (the attacker). `what` names the attack.
fn assert_held_up(victim: &Worker, before: usize, what: &str) {
    let stats = victim.stats();
    eprintln!(
        "{what}: {} bytes queued, {} inputs paused",
        stats.send_queue_bytes, stats.paused_inputs
    );
    assert_grown_within(before, RSS_BOUND, what);
    assert!(
        stats.send_queue_bytes <= QUEUED_BOUND,
        "{what}: {} bytes queued, more than {QUEUED_BOUND}",
        stats.send_queue_bytes
    );
    assert_eq!(stats.paused_inputs, 1, "{what}: the attacker's input waits");
}

/// The regression: a peer that never reads its socket and floods GETs for a region it
/// holds a valid key to. Without a bound, 4000 GETs of 64 KiB (250 KiB sent) grew the
/// victim by 249 MiB, linearly; with it, the victim queues at most about its output limit
/// for that peer, stops reading it, and a legitimate peer connects and exchanges messages
/// meanwhile. Once the attacker reads, it gets all 4000 replies: nothing was dropped.
#[test]
fn a_get_flood_that_is_never_read_is_held_up_by_its_own_socket() {
    let _measuring = measuring();
    init_log();
    let GetFlood {
        victim,
        listener,
        addr,
        mut raw,
        ep,
        _region,
        len,
        before,
    } = get_flood(&[]);
    progress_until_idle(&victim, &raw.tcp);
    let (_client, _cep, _sep) = legitimate_exchange(&victim, &listener, &addr);
    progress_until_idle(&victim, &raw.tcp);
    assert_held_up(&victim, before, &format!("under {GETS} unread GETs"));
    assert!(ep.is_connected(), "the attacker waits; it is not cut off");

    // The attacker reads at last: every GET is answered, in order.
    let mut replies = 0;
    let deadline = Instant::now() + LONG;
    while replies < GETS {
        assert!(
            Instant::now() < deadline,
            "{replies} of {GETS} replies came"
        );
        victim.progress();
        raw.count_replies(&mut replies, len);
    }
    progress_until_idle(&victim, &raw.tcp);
    let stats = victim.stats();
    assert_eq!(stats.paused_inputs, 0);
    assert!(
        stats.send_queue_bytes < MIB as u64,
        "{}",
        stats.send_queue_bytes
    );
}

/// The READ-request variant: the victim sends the raw peer a rendezvous message, and the
/// peer asks for it again and again without reading. Each answer costs the victim a slot
/// of its output queue (the data is the send buffer itself): 4.4 million of them (176 MB
/// sent) took 234 MiB without a bound; with it, the victim stops reading the peer at
/// the limit.
#[test]
fn a_read_request_flood_that_is_never_read_is_held_up_by_its_own_socket() {
    let _measuring = measuring();
    init_log();
    let ctx = context(Transport::Tcp, &[]);
    let (victim, listener, addr) = listening(&ctx);
    let (mut raw, ep) = Raw::connect(&listener);
    let _send = ep.tag_send(0x52, vec![0x17; MIB]);
    let rts: RtsBody = raw
        .tcp
        .expect(&victim, |bytes| match wire::decode(bytes).ok()?.body {
            Body::Rts(rts) => Some(rts),
            _ => None,
        });
    assert_eq!(rts.len, MIB as u64);

    const READS: u64 = 4_400_000;
    const BATCH: u64 = 10_000;
    let before = rss();
    let deadline = Instant::now() + LONG;
    let (mut sent, mut idle) = (0, 0);
    // Asks in batches, each once the last is written (the raw peer's own queue stays
    // small), until all are asked or the victim stopped taking them.
    while sent < READS && idle < 2000 {
        assert!(Instant::now() < deadline, "the flood never ended");
        if raw.tcp.link.flush().expect("raw flush") {
            for id in sent..sent + BATCH {
                raw.tcp
                    .link
                    .queue_read_request(id, rts.addr, rts.rkey, 256 * 1024);
            }
            sent += BATCH;
        }
        if victim.progress() == 0 {
            idle += 1;
        } else {
            idle = 0;
        }
    }
    progress_until_idle(&victim, &raw.tcp);
    let (_client, _cep, _sep) = legitimate_exchange(&victim, &listener, &addr);
    progress_until_idle(&victim, &raw.tcp);

    assert_held_up(
        &victim,
        before,
        &format!("under {sent} unread READ requests"),
    );
    assert!(sent < READS, "the attacker was held up before it asked all");

    // The attacker leaves: its queue, and the send buffer's clones in it, are freed.
    drop(raw);
    let deadline = Instant::now() + LONG;
    while victim.stats().send_queue_bytes > MIB as u64 || ep.is_connected() {
        assert!(Instant::now() < deadline, "the attacker's queue stays");
        victim.progress();
    }
}

/// Over a worker that waits for events, the GET flood is held up the same way, and the
/// paused peer's input does not wake the worker: the socket stays readable, and the worker
/// watches it for room to write only. A wait returns when signalled, not in a loop around
/// the unread input.
#[test]
fn a_paused_peer_does_not_wake_an_event_mode_wait() {
    let _measuring = measuring();
    init_log();
    let GetFlood {
        victim,
        listener,
        addr,
        raw,
        ep: _ep,
        _region,
        len: _,
        before,
    } = get_flood(&[("RDMX_WAIT_MODE", "event")]);
    let deadline = Instant::now() + LONG;
    while victim.stats().paused_inputs == 0 {
        assert!(Instant::now() < deadline, "the attacker never paused");
        let _ = raw.tcp.link.flush();
        victim.progress();
    }
    let (_client, _cep, _sep) = legitimate_exchange(&victim, &listener, &addr);
    progress_until_idle(&victim, &raw.tcp);
    assert_held_up(&victim, before, "a GET flood, waiting for events");

    let signalled = Arc::new(AtomicBool::new(false));
    let (s, v) = (signalled.clone(), victim.clone());
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        s.store(true, Ordering::Release);
        v.signal();
    });
    let mut wakeups = 0;
    // (Each wait bounded, as a hang guard: one that lasted its whole bound was not woken
    // by the signal.)
    let deadline = Instant::now() + LONG;
    while !signalled.load(Ordering::Acquire) {
        victim.wait(Some(LONG)).expect("wait");
        assert!(
            Instant::now() < deadline,
            "the signal did not wake the wait"
        );
        wakeups += 1;
    }
    t.join().expect("no panic");
    assert!(
        wakeups <= 3,
        "the wait woke {wakeups} times before it was signalled: it spins on the paused input"
    );
    assert_eq!(victim.stats().paused_inputs, 1);
}

/// With a progress thread (waiting for events): the flood is held up the same way, the
/// legitimate peer is served, and once the attacker reads, the held-back GETs are answered
/// by the thread — resumed without any new input to wake it.
#[test]
fn a_progress_thread_holds_the_flood_up_and_resumes_it() {
    let _measuring = measuring();
    init_log();
    let GetFlood {
        victim,
        listener,
        addr,
        mut raw,
        ep: _ep,
        _region,
        len,
        before,
    } = get_flood(&[("RDMX_WAIT_MODE", "event"), ("RDMX_PROGRESS_THREAD", "1")]);
    let deadline = Instant::now() + LONG;
    while raw.tcp.link.wants_write() || victim.stats().paused_inputs == 0 {
        assert!(Instant::now() < deadline, "the attacker never paused");
        let _ = raw.tcp.link.flush();
        std::thread::yield_now();
    }
    let (_client, _cep, _sep) = legitimate_exchange(&victim, &listener, &addr);
    assert_held_up(&victim, before, "a GET flood, with a progress thread");

    let mut replies = 0;
    let deadline = Instant::now() + LONG;
    while replies < GETS {
        assert!(
            Instant::now() < deadline,
            "{replies} of {GETS} replies came"
        );
        raw.count_replies(&mut replies, len);
    }
}

/// Two legitimate peers with many large rendezvous messages outstanding each way, their
/// receives posted late, never both stop reading each other: neither even comes near its
/// output limit (what a legitimate peer can make a connection queue is bounded by its
/// credit window and the READs it keeps in flight), and every message arrives. 64
/// messages of 4 MiB each way; once with one thread progressing both workers, once with
/// progress threads waiting for events.
#[test]
fn two_legitimate_peers_with_large_messages_both_ways_never_stall() {
    let _measuring = measuring();
    init_log();
    for settings in [
        &[][..],
        &[("RDMX_WAIT_MODE", "event"), ("RDMX_PROGRESS_THREAD", "1")][..],
    ] {
        let threads = !settings.is_empty();
        let ctx = context(Transport::Tcp, settings);
        let (a, listener, addr) = listening(&ctx);
        let (b, b_ep, a_ep) = connected(&ctx, &listener, &addr);

        const N: usize = 64;
        const LEN: usize = 4 * MIB;
        let data: [Arc<Vec<u8>>; 2] =
            [0x3c, 0xc3].map(|x| Arc::new((0..LEN).map(|i| (i as u8) ^ x).collect()));
        let sends: Vec<rdmx::Request> = (0..N as u64)
            .flat_map(|k| {
                [
                    a_ep.tag_send_shared(k, &data[0]),
                    b_ep.tag_send_shared(k, &data[1]),
                ]
            })
            .collect();
        let (mut max_queued, mut max_paused) = (0, 0);
        let mut watch = |w: [&Worker; 2]| {
            for w in w {
                let s = w.stats();
                max_queued = max_queued.max(s.send_queue_bytes);
                max_paused = max_paused.max(s.paused_inputs);
            }
        };
        // Receives posted late: once every RTS has arrived, each side's messages unexpected.
        let deadline = Instant::now() + LONG;
        while a.stats().unexpected_messages < N || b.stats().unexpected_messages < N {
            assert!(Instant::now() < deadline, "the RTSs never all arrived");
            if !threads {
                a.progress();
                b.progress();
            }
            watch([&a, &b]);
        }
        let recvs: Vec<(usize, rdmx::Request)> = (0..N as u64)
            .flat_map(|k| {
                [
                    (1, a.tag_recv(k, TAG_MASK_ALL, vec![0; LEN])),
                    (0, b.tag_recv(k, TAG_MASK_ALL, vec![0; LEN])),
                ]
            })
            .collect();
        // And eager messages of the largest size both ways, as many as fit 8 MiB: frames
        // that wait for the peer's credits, or in the connection's queue for it to read.
        let eager = rdmx::TCP_EAGER_THRESHOLD as usize;
        let eagers = 8 * MIB / eager;
        let mut eager_recvs = Vec::new();
        for k in 0..eagers as u64 {
            let tag = 1 << 20 | k;
            eager_recvs.push(a.tag_recv(tag, TAG_MASK_ALL, vec![0; eager]));
            eager_recvs.push(b.tag_recv(tag, TAG_MASK_ALL, vec![0; eager]));
        }
        let mut sends = sends;
        for k in 0..eagers as u64 {
            let tag = 1 << 20 | k;
            sends.push(a_ep.tag_send(tag, vec![0x5e; eager]));
            sends.push(b_ep.tag_send(tag, vec![0xe5; eager]));
        }
        if !threads {
            // Each side in turn stops progressing for a while (a legitimate application
            // busy elsewhere) while the other answers its READs and sends what its credits
            // allow: what waits for the idle side is all a legitimate peer can make a
            // connection queue — far from the limit.
            for (busy, idle) in [(&a, &b), (&b, &a), (&a, &b)] {
                let mut quiet = 0;
                while quiet < 2000 {
                    assert!(Instant::now() < deadline, "one side never went idle");
                    if busy.progress() == 0 {
                        quiet += 1;
                    } else {
                        quiet = 0;
                    }
                }
                watch([busy, idle]);
            }
        }
        let mut spins = 0u64;
        while !(recvs.iter().all(|r| r.1.is_done())
            && eager_recvs.iter().all(|r| r.is_done())
            && sends.iter().all(|s| s.is_done()))
        {
            assert!(
                Instant::now() < deadline,
                "stalled: {} of {} receives done",
                recvs.iter().filter(|r| r.1.is_done()).count(),
                recvs.len()
            );
            if !threads {
                a.progress();
                b.progress();
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
            spins += 1;
            if spins % 64 == 0 {
                watch([&a, &b]);
            }
        }
        watch([&a, &b]);
        for s in sends {
            s.wait().expect("send");
        }
        for (from, r) in recvs {
            let got = r.wait().expect("receive");
            assert!(got.buf == *data[from], "the message's bytes");
        }
        for r in eager_recvs {
            let got = r.wait().expect("eager receive");
            assert!(got.buf.iter().all(|&x| x == 0x5e || x == 0xe5));
        }
        eprintln!(
            "{N} x {} MiB both ways ({settings:?}): at most {max_queued} bytes queued",
            LEN / MIB
        );
        assert_eq!(max_paused, 0, "a legitimate peer's input was paused");
        assert!(
            max_queued < LIMIT as u64 / 2,
            "{max_queued} bytes queued: near the limit"
        );
    }
}
