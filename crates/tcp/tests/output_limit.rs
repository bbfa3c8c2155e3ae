//! Loopback tests of a link's output limit: a peer that asks for answers and does not read
//! them pauses the link's input, which resumes once the peer has read enough.

use std::sync::Arc;

use rdmx_tcp::{Event, Link};

mod common;
use common::*;

/// What a link holds for a frame of `n` bytes, about.
const BIG: usize = 64 * 1024;

/// Queues big frames on `link` and writes what its socket takes, until its input pauses
/// (the peer reads nothing meanwhile); returns how many frames it queued.
fn fill_until_paused(link: &Link) -> usize {
    let body = vec![0x42u8; BIG];
    let mut frames = 0;
    run_until("the input pauses", || {
        link.queue_frame(&body, b"");
        frames += 1;
        link.flush().expect("flush");
        link.input_paused()
    });
    frames
}

/// Above its output limit a link stops reading its input: the peer's frames wait in the
/// socket until the peer has read enough of the link's output to bring the queue down to
/// half the limit. Then they arrive, in order.
#[test]
fn queueing_past_the_output_limit_pauses_input_and_draining_resumes_it() {
    let (client, server) = pair();
    const LIMIT: usize = 1 << 20;
    server.set_output_limit(LIMIT);
    assert_eq!(server.queued_bytes(), 0);
    assert!(!server.input_paused());

    // The client asks for something, and does not read what the server sends.
    client.queue_frame(b"request", b" 1");
    run_until("flush the request", || client.flush().expect("flush"));
    let frames = fill_until_paused(&server);
    assert!(server.queued_bytes() > LIMIT, "{}", server.queued_bytes());
    // While paused the request is not read, however often the server polls.
    let mut events = Vec::new();
    for _ in 0..100 {
        assert_eq!(server.poll(&mut events).expect("poll"), 0);
    }
    assert!(events.is_empty(), "{events:?}");
    // Queueing more keeps it paused (and the limit holds what is queued, not what is sent).
    server.queue_frame(b"more", b"");
    server.flush().expect("flush");
    assert!(server.input_paused());

    // The client reads: the server's queue drains, and the request is read at last.
    let mut got = Vec::new();
    run_until("drain and resume", || {
        client.poll(&mut got).expect("client poll");
        server.flush().expect("flush");
        !server.input_paused()
    });
    assert!(server.queued_bytes() <= LIMIT / 2);
    run_until("read the request", || {
        server.flush().expect("flush");
        client.poll(&mut got).expect("client poll");
        server.poll(&mut events).expect("poll");
        !events.is_empty()
    });
    assert_eq!(events, [Event::Frame(b"request 1".to_vec())]);
    run_until("everything arrives", || {
        server.flush().expect("flush");
        client.poll(&mut got).expect("client poll");
        got.len() == frames + 1
    });
    assert_eq!(got.last(), Some(&Event::Frame(b"more".to_vec())));
    // (The queue's ring stays, a few slots.)
    assert!(
        server.queued_bytes() < 16 * 1024,
        "{}",
        server.queued_bytes()
    );
}

/// A READ answer counts as a slot of the queue, not as its data (the caller's buffer, held
/// by `Arc`): a peer asking again and again for the same buffer pauses the input by the
/// number of answers it makes the link hold, whatever their length.
#[test]
fn read_answers_count_their_slots_not_their_data() {
    let (client, server) = pair();
    const LIMIT: usize = 256 * 1024;
    server.set_output_limit(LIMIT);
    let src = Arc::new(vec![0x33u8; 32 << 20]);
    server.queue_read_data(1, true, Some((src.clone(), 0, src.len())));
    assert!(server.queued_bytes() < 4096, "{}", server.queued_bytes());
    assert!(!server.input_paused());
    let mut answers = 1;
    while !server.input_paused() {
        server.queue_read_data(answers + 1, true, Some((src.clone(), 0, 1 << 20)));
        answers += 1;
        assert!(answers < 1 << 20, "never paused");
    }
    // Each answer costs tens of bytes, so thousands of them fit in the limit.
    assert!(answers > 1000, "paused after {answers} answers");
    assert!(server.queued_bytes() > LIMIT);
    // The peer goes away: the output side fails, its queue is dropped (and with it the
    // buffer's clones), and the input resumes, to report the end.
    drop(client);
    run_until("the write fails", || server.flush().is_err());
    assert!(!server.input_paused());
    assert_eq!(server.queued_bytes(), 0);
    assert_eq!(Arc::strong_count(&src), 1);
    let events = events_until_closed(&server);
    assert!(matches!(events.last(), Some(Event::Closed { .. })));
}

/// Without a limit (`usize::MAX`) the input never pauses; the default is
/// `DEFAULT_OUTPUT_LIMIT`.
#[test]
fn an_unlimited_output_never_pauses() {
    let (_client, server) = pair();
    server.set_output_limit(usize::MAX);
    let body = vec![1u8; BIG];
    for _ in 0..(2 * rdmx_tcp::DEFAULT_OUTPUT_LIMIT / BIG) {
        server.queue_frame(&body, b"");
    }
    assert!(server.queued_bytes() > rdmx_tcp::DEFAULT_OUTPUT_LIMIT);
    assert!(!server.input_paused());
    // Back to the default: above it, paused at once.
    server.set_output_limit(rdmx_tcp::DEFAULT_OUTPUT_LIMIT);
    assert!(server.input_paused());
}

/// One poll returns about a thousand events at most (and what its last read brought),
/// whatever is waiting: what a caller holds of one poll's input stays small.
#[test]
fn one_poll_returns_a_bounded_number_of_events() {
    let (client, server) = pair();
    for i in 0..20_000u32 {
        client.queue_frame(&i.to_le_bytes(), b"");
    }
    let mut events = Vec::new();
    let mut polls = 0;
    run_until("all frames", || {
        client.flush().expect("flush");
        let before = events.len();
        server.poll(&mut events).expect("poll");
        // At most a thousand, and what the read under way brought: 64 KiB of 8-byte
        // messages at most (these are 12 bytes each).
        assert!(
            events.len() - before <= 1024 + 65536 / 12,
            "{}",
            events.len() - before
        );
        polls += 1;
        events.len() == 20_000
    });
    assert!(polls > 3, "{polls} polls");
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e, &Event::Frame((i as u32).to_le_bytes().to_vec()));
    }
}
