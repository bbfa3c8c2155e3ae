//! The rings: frames in order and intact, across wrap-around, full rings, two mappings of
//! one segment handed over a Unix socket, two threads — and a hostile peer scribbling the
//! segment, which must yield errors and never a panic or an access outside it.

use std::collections::VecDeque;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use proptest::prelude::*;
use rdmx_shm::channel::{self, Side};
use rdmx_shm::ring::{ring_len, PUBLISHED, RING_HEADER_LEN};
use rdmx_shm::{fdpass, Consumer, Doorbell, Error, Producer, RecordBuf, Segment};

const CAP: usize = 256;

fn pair(cap: usize) -> (Arc<Segment>, Producer, Consumer) {
    let seg = Arc::new(Segment::create("test", ring_len(cap)).expect("segment"));
    let p = Producer::new(seg.clone(), 0, cap).expect("producer");
    let c = Consumer::new(seg.clone(), 0, cap).expect("consumer");
    (seg, p, c)
}

fn pop(c: &mut Consumer) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    c.pop(&mut out).expect("an intact ring").then_some(out)
}

#[test]
fn frames_arrive_in_order_and_intact_across_the_wrap() {
    let (_seg, mut p, mut c) = pair(CAP);
    assert_eq!(pop(&mut c), None);
    for round in 0..200u32 {
        let len = (round as usize * 13) % 60;
        let frame: Vec<u8> = (0..len).map(|i| (i as u32 ^ round) as u8).collect();
        // Gathered from two pieces split anywhere.
        let cut = (round as usize * 7) % (len + 1);
        assert!(p.push(&[&frame[..cut], &frame[cut..]]).expect("push"));
        assert_eq!(pop(&mut c).as_deref(), Some(&frame[..]), "round {round}");
    }
    assert!(p.drained().expect("drained"));
}

/// The next record by [`Consumer::take_words`], as bytes (its space not yet freed).
fn take(c: &mut Consumer, buf: &mut RecordBuf) -> Option<Vec<u8>> {
    let (kind, len) = c.take_words(buf).expect("an intact ring")?;
    assert_eq!(kind, 0);
    Some(buf.bytes(len).to_vec())
}

#[test]
fn records_taken_as_words_free_their_space_only_when_freed() {
    let (_seg, mut p, mut c) = pair(CAP);
    let mut buf = RecordBuf::default();
    assert_eq!(take(&mut c, &mut buf), None);
    for lap in 0..20u8 {
        // 7 records of 24 bytes fill the ring (see the test below); lengths that are not
        // whole words, across the wrap.
        let frames: Vec<Vec<u8>> = (0..7u8)
            .map(|i| vec![lap ^ i; 17 + usize::from(i % 3) * 3])
            .collect();
        for f in &frames {
            assert!(p.push(&[f]).expect("room"), "lap {lap}");
        }
        assert!(!p.push(&[&[9; 17]]).expect("full"));
        for f in &frames[..4] {
            assert_eq!(take(&mut c, &mut buf).as_ref(), Some(f), "lap {lap}");
        }
        // Taken, not freed: the producer still finds no room.
        assert!(!p.push(&[&[9; 17]]).expect("still full"));
        c.free();
        c.free();
        for f in &frames[4..] {
            assert_eq!(take(&mut c, &mut buf).as_ref(), Some(f), "lap {lap}");
        }
        assert_eq!(take(&mut c, &mut buf), None);
        assert!(
            !p.drained().expect("drained"),
            "nothing freed since the fourth"
        );
        c.free();
        assert!(p.drained().expect("drained"));
    }
}

#[test]
fn a_full_ring_refuses_until_the_consumer_catches_up() {
    let (_seg, mut p, mut c) = pair(CAP);
    // 24-byte frames take 32 bytes each, and a word past the last stays free: 7 fill the
    // ring.
    for i in 0..7u8 {
        assert!(p.push(&[&[i; 24]]).expect("room"), "frame {i}");
    }
    assert!(!p.push(&[&[9; 24]]).expect("full, not an error"));
    assert_eq!(pop(&mut c), Some(vec![0; 24]));
    assert!(p.push(&[&[7; 24]]).expect("room again"));
    for i in 1..=7u8 {
        assert_eq!(pop(&mut c), Some(vec![i; 24]));
    }
    assert_eq!(pop(&mut c), None);
}

#[test]
fn frames_too_long_for_the_ring_are_refused() {
    let (_seg, mut p, _c) = pair(CAP);
    // The header and the zero word past the record take 16 bytes.
    assert_eq!(p.max_frame(), CAP - 16);
    assert!(p.push(&[&[1; CAP - 16]]).expect("the longest fits"));
    let e = p.push(&[&[1; CAP - 15]]).expect_err("too long");
    assert!(matches!(e, Error::TooLong { len: 241, max: 240 }), "{e}");
}

#[test]
fn rings_that_do_not_fit_are_refused() {
    let seg = Arc::new(Segment::create("test", ring_len(CAP)).expect("segment"));
    assert!(Producer::new(seg.clone(), 0, CAP + 8).is_err());
    assert!(Producer::new(seg.clone(), 64, CAP).is_err());
    assert!(Producer::new(seg.clone(), 0, 60).is_err());
    // Not a power of two (a word's place in the ring is a mask, not a division).
    assert!(Producer::new(seg.clone(), 0, 192).is_err());
    assert!(Consumer::new(seg.clone(), 0, 192).is_err());
    assert!(Consumer::new(seg.clone(), 8, 64).is_err());
    assert!(Segment::create("test", 12).is_err());
    assert!(Segment::create("test", 0).is_err());
}

#[test]
fn a_channel_handed_over_a_unix_socket_carries_frames_both_ways() {
    let seg = channel::create("rdmx-test", CAP).expect("channel");
    let bell = Doorbell::new().expect("doorbell");
    let (a, b) = UnixStream::pair().expect("socketpair");
    fdpass::send_with_fds(&a, b"hello", &[seg.fd().expect("the memfd"), bell.fd()]).expect("send");
    let mut buf = [0u8; 16];
    let (n, mut fds) = fdpass::recv_with_fds(&b, &mut buf).expect("recv");
    assert_eq!(&buf[..n], b"hello");
    assert_eq!(fds.len(), 2);
    let (pid, uid) = fdpass::peer_credentials(&b).expect("credentials");
    assert_eq!(pid as u32, std::process::id());
    assert_eq!(uid, rustix::process::getuid().as_raw());
    let their_bell = Doorbell::from_fd(fds.pop().expect("doorbell")).expect("an eventfd");
    // A second mapping of the same memfd, as the peer process has; its memfd closed once
    // mapped (as rdmx does: a connection holds no descriptor for its segment), which the
    // mapping outlives.
    let mut theirs =
        Segment::open(fds.pop().expect("segment"), channel::channel_len(CAP)).expect("open");
    theirs.close_fd();
    assert!(theirs.fd().is_none());
    let theirs = Arc::new(theirs);
    let (mut my_tx, mut my_rx) = channel::ends(&seg, CAP, Side::Creator).expect("ends");
    let (mut their_tx, mut their_rx) = channel::ends(&theirs, CAP, Side::Opener).expect("ends");
    assert!(my_tx.push(&[b"ping"]).expect("push"));
    assert_eq!(pop(&mut their_rx).as_deref(), Some(&b"ping"[..]));
    assert!(their_tx.push(&[b"pong"]).expect("push"));
    assert_eq!(pop(&mut my_rx).as_deref(), Some(&b"pong"[..]));
    // The doorbell: rung only while the consumer says it may sleep.
    assert!(!their_tx.consumer_waiting());
    my_rx.may_sleep(true);
    assert!(my_rx.is_empty());
    assert!(their_tx.push(&[b"wake"]).expect("push"));
    assert!(their_tx.consumer_waiting());
    their_bell.ring().expect("ring");
    assert!(bell.drain().expect("rung"));
    assert!(!bell.drain().expect("drained"));
    my_rx.may_sleep(false);
    assert_eq!(pop(&mut my_rx).as_deref(), Some(&b"wake"[..]));
    // A consumer that never sleeps (a busy-polling worker) says so once: its producer stops
    // asking, and never rings.
    their_rx.never_sleeps();
    assert!(my_tx.push(&[b"busy"]).expect("push"));
    assert!(!my_tx.consumer_waiting());
    // (Even a consumer that broke its word and sleeps is not rung: only its loss.)
    their_rx.may_sleep(true);
    assert!(!my_tx.consumer_waiting());
    assert_eq!(pop(&mut their_rx).as_deref(), Some(&b"busy"[..]));
}

#[test]
fn handed_over_descriptors_are_checked() {
    // Not a memfd.
    let file = std::fs::File::open("/proc/self/status").expect("a file");
    let e = Segment::open(file.into(), 4096).expect_err("not a memfd");
    assert!(matches!(e, Error::BadSegment(_)), "{e}");
    // A memfd of another size.
    let seg = Segment::create("test", 4096).expect("segment");
    let dup = rustix::io::dup(seg.fd().expect("the memfd")).expect("dup");
    let e = Segment::open(dup, 8192).expect_err("wrong size");
    assert!(e.to_string().contains("4096 bytes"), "{e}");
    // A memfd that can still shrink.
    let open =
        rustix::fs::memfd_create("unsealed", rustix::fs::MemfdFlags::CLOEXEC).expect("memfd");
    rustix::fs::ftruncate(&open, 4096).expect("size");
    assert!(matches!(
        Segment::open(open, 4096),
        Err(Error::BadSegment(_))
    ));
    // A sealed segment cannot be shrunk by the peer.
    assert!(rustix::fs::ftruncate(seg.fd().expect("the memfd"), 0).is_err());
    // A doorbell that is not an eventfd.
    let (a, _b) = UnixStream::pair().expect("socketpair");
    assert!(matches!(
        Doorbell::from_fd(a.into()),
        Err(Error::BadSegment(_))
    ));
}

#[test]
fn two_threads_stream_frames_through_a_small_ring() {
    const N: u32 = 50_000;
    let (_seg, mut p, mut c) = pair(CAP);
    let producer = std::thread::spawn(move || {
        for i in 0..N {
            let len = (i % 41) as usize;
            let mut frame = i.to_le_bytes().to_vec();
            frame.extend((0..len).map(|j| (i as usize + j) as u8));
            while !p.push(&[&frame]).expect("an intact ring") {
                std::thread::yield_now();
            }
        }
    });
    let mut out = Vec::new();
    for i in 0..N {
        while !c.pop(&mut out).expect("an intact ring") {
            std::thread::yield_now();
        }
        assert_eq!(out[..4], i.to_le_bytes(), "frame {i}");
        let len = (i % 41) as usize;
        assert_eq!(out.len(), 4 + len);
        assert!(out[4..]
            .iter()
            .enumerate()
            .all(|(j, &b)| b == (i as usize + j) as u8));
    }
    producer.join().expect("producer");
}

/// The peer writes `value` at `offset` of the segment: through the memfd, which every
/// mapping of it sees, as another process's stores would be seen.
fn scribble(seg: &Segment, offset: usize, value: u64) {
    rustix::io::pwrite(
        seg.fd().expect("the memfd"),
        &value.to_ne_bytes(),
        offset as u64,
    )
    .expect("pwrite");
}

#[test]
fn a_record_header_out_of_range_is_corruption() {
    for (header, what) in [
        (PUBLISHED | CAP as u64, "longer than the ring holds"),
        (
            PUBLISHED | u64::from(u32::MAX),
            "longer than the ring holds",
        ),
        (8, "not published"),
        (PUBLISHED | 8 | 1 << 40, "reserved bits"),
        (PUBLISHED | 8 | 1 << 62, "reserved bits"),
    ] {
        let (seg, _p, mut c) = pair(CAP);
        scribble(&seg, RING_HEADER_LEN, header);
        let e = c.pop(&mut Vec::new()).expect_err("corrupt");
        assert!(
            matches!(e, Error::Corrupt(_)) && e.to_string().contains(what),
            "header {header:#x}: {e}"
        );
    }
}

#[test]
fn indices_near_the_end_of_their_range_are_corruption() {
    // A peer that made the segment can start the ring anywhere: near 2^64, index arithmetic
    // would overflow.
    for start in [u64::MAX - 7, 1 << 63] {
        let seg = Arc::new(Segment::create("test", ring_len(CAP)).expect("segment"));
        scribble(&seg, 64, start);
        assert!(matches!(
            Producer::new(seg.clone(), 0, CAP),
            Err(Error::Corrupt(_))
        ));
        assert!(matches!(
            Consumer::new(seg.clone(), 0, CAP),
            Err(Error::Corrupt(_))
        ));
    }
    // Just below the limit: works, and a push or pop past it is refused.
    let start = (1u64 << 62) - 64;
    let seg = Arc::new(Segment::create("test", ring_len(CAP)).expect("segment"));
    scribble(&seg, 64, start);
    let mut p = Producer::new(seg.clone(), 0, CAP).expect("producer");
    let mut c = Consumer::new(seg.clone(), 0, CAP).expect("consumer");
    assert!(p.push(&[b"x"]).expect("push"));
    assert_eq!(pop(&mut c).as_deref(), Some(&b"x"[..]));
    assert!(matches!(p.push(&[&[0; 40]]), Err(Error::Corrupt(_))));
    let at = RING_HEADER_LEN + (start as usize + 16) % CAP;
    scribble(&seg, at, PUBLISHED | 56);
    assert!(matches!(c.pop(&mut Vec::new()), Err(Error::Corrupt(_))));
}

#[test]
fn a_record_rewritten_after_it_was_published_yields_only_its_bytes() {
    // The header is the signal: a peer that rewrites it to a longer (in-range) length hands
    // over whatever bytes follow, as a frame the engine above validates.
    let (seg, mut p, mut c) = pair(CAP);
    assert!(p.push(&[&[7; 8]]).expect("push"));
    scribble(&seg, RING_HEADER_LEN, PUBLISHED | 200);
    let mut out = Vec::new();
    assert!(c.pop(&mut out).expect("a record"));
    assert_eq!(out.len(), 200);
    assert_eq!(&out[..8], &[7; 8]);
}

#[test]
fn records_carry_their_kind() {
    let (_seg, mut p, mut c) = pair(CAP);
    assert!(p.push_kind(2, &[b"get"]).expect("push"));
    assert!(p.push(&[b"frame"]).expect("push"));
    assert!(p.push_kind(255, &[b"data"]).expect("push"));
    let mut out = Vec::new();
    assert_eq!(c.pop_kind(&mut out).expect("intact"), Some(2));
    assert_eq!(out, b"get");
    assert!(c.pop(&mut out).expect("a kind-0 record"));
    assert_eq!(out, b"frame");
    // `pop` takes kind 0 only.
    assert!(matches!(c.pop(&mut out), Err(Error::Corrupt(_))));
}

#[test]
fn a_record_may_start_with_whole_words_across_the_wrap() {
    // A frame header handed over as words, then a payload of any length: the record's
    // bytes are the words' bytes in memory, then the payload's, wherever the ring wraps.
    let (_seg, mut p, mut c) = pair(CAP);
    let head = [0x0102_0304_0506_0708u64, u64::MAX, 0];
    let mut want: Vec<u8> = head.iter().flat_map(|w| w.to_ne_bytes()).collect();
    want.extend_from_slice(b"payload");
    let mut out = Vec::new();
    for _ in 0..3 * CAP / want.len() {
        assert!(p
            .push_words_then(1, &head, &[b"pay", b"load"])
            .expect("push"));
        assert_eq!(c.pop_kind(&mut out).expect("intact"), Some(1));
        assert_eq!(out, want);
    }
}

#[test]
fn records_popped_one_after_another_share_one_buffer() {
    let (_seg, mut p, mut c) = pair(CAP);
    let mut out = b"kept".to_vec();
    assert_eq!(c.pop_kind_append(&mut out).expect("empty"), None);
    assert_eq!(out, b"kept", "an empty ring leaves the buffer as it was");
    let frames: [&[u8]; 4] = [b"", b"a", b"seven b", &[9; 21]];
    for (kind, f) in frames.iter().enumerate() {
        assert!(p.push_kind(kind as u8, &[f]).expect("push"));
    }
    let mut ends = Vec::new();
    for kind in 0..frames.len() {
        assert_eq!(
            c.pop_kind_append(&mut out).expect("intact"),
            Some(kind as u8)
        );
        ends.push(out.len());
    }
    // Each record right after the one before, at its exact length (no padding left).
    assert_eq!(
        out,
        [&b"kept"[..], b"", b"a", b"seven b", &[9; 21]].concat()
    );
    assert_eq!(ends, vec![4, 5, 12, 33]);
    assert_eq!(c.pop_kind_append(&mut out).expect("empty"), None);
}

#[test]
fn a_tail_out_of_range_is_corruption_for_the_producer() {
    let (seg, mut p, _c) = pair(CAP);
    for _ in 0..7 {
        assert!(p.push(&[&[1; 24]]).expect("push"));
    }
    // The consumer "consumed" more than was published.
    scribble(&seg, 64, 4096);
    assert!(matches!(p.push(&[&[1; 24]]), Err(Error::Corrupt(_))));
}

/// Reference model: what an honest ring holds.
#[derive(Debug, Clone)]
enum Op {
    Push(Vec<u8>),
    Pop,
    /// A record taken as words, its space kept until a `Free` (or a `Pop`, which frees).
    Take,
    Free,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..100).prop_map(Op::Push),
        Just(Op::Pop),
        Just(Op::Take),
        Just(Op::Free),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any sequence of pushes (each of a frame in three pieces of any lengths) and pops
    /// behaves as a bounded FIFO of frames.
    #[test]
    fn a_ring_is_a_fifo(ops in proptest::collection::vec(op(), 1..200)) {
        let (_seg, mut p, mut c) = pair(CAP);
        let mut buf = RecordBuf::default();
        let mut model: VecDeque<Vec<u8>> = VecDeque::new();
        // Bytes of records taken and not yet freed.
        let mut held = 0;
        let size = |f: &Vec<u8>| 8 + f.len().div_ceil(8) * 8;
        let used = |m: &VecDeque<Vec<u8>>| m.iter().map(size).sum::<usize>();
        for op in ops {
            match op {
                Op::Push(f) => {
                    // (A word past the last record stays free.)
                    let fits = held + used(&model) + size(&f) + 8 <= CAP;
                    // In pieces, as frames go (a header, then the payload): cut where the
                    // frame's first byte says, whole words or not.
                    let cut = f.first().map_or(0, |&b| usize::from(b) % (f.len() + 1));
                    let (head, rest) = f.split_at(cut);
                    let (mid, tail) = rest.split_at(rest.len() / 2);
                    prop_assert_eq!(p.push(&[head, mid, tail]).expect("push"), fits);
                    if fits { model.push_back(f); }
                }
                Op::Pop => {
                    prop_assert_eq!(pop(&mut c), model.pop_front());
                    held = 0;
                }
                Op::Take => {
                    let f = model.pop_front();
                    held += f.as_ref().map_or(0, size);
                    prop_assert_eq!(take(&mut c, &mut buf), f);
                }
                Op::Free => {
                    c.free();
                    held = 0;
                }
            }
        }
    }

    /// A peer writing random words anywhere in the segment, between honest pushes: every pop
    /// and push either works or says the ring is corrupt — no panic, no frame longer than
    /// the ring, nothing outside the segment.
    #[test]
    fn scribbling_never_panics(
        writes in proptest::collection::vec((0usize..ring_len(CAP) / 8, any::<u64>(), 0u64..512), 1..40),
        frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..40),
    ) {
        let (seg, mut p, mut c) = pair(CAP);
        let mut out = Vec::new();
        let mut buf = RecordBuf::default();
        let mut consumer_ok = true;
        let mut producer_ok = true;
        for (i, f) in frames.iter().enumerate() {
            if producer_ok {
                producer_ok = p.push(&[f]).is_ok();
            }
            if let Some(&(word, value, small)) = writes.get(i) {
                // Half the time a plausible small value (an index or length near the truth).
                scribble(&seg, word * 8, if value % 2 == 0 { value } else { small });
            }
            if consumer_ok {
                // Every other record taken as words, freed with the next pop.
                let got = if i % 2 == 0 {
                    c.pop(&mut out).map(|_| out.len())
                } else {
                    c.take_words(&mut buf).map(|r| r.map_or(0, |(_, len)| buf.bytes(len).len()))
                };
                match got {
                    Ok(len) => prop_assert!(len <= c.max_frame()),
                    Err(Error::Corrupt(_)) => consumer_ok = false,
                    Err(e) => prop_assert!(false, "unexpected error {}", e),
                }
            }
        }
    }
}
