//! Deterministic tests of the worker's real driver, executor and protocol engine over the
//! in-memory transport: one thread makes every call and steps both workers' progress, so
//! each run does the same thing in the same order — no socket, no device, no timing.

use super::*;
use crate::transport::memory::Cable;
use crate::{Context, Ep, Request, Status, TAG_MASK_ALL};

fn workers() -> (Worker, Worker) {
    let ctx = Context::builder()
        .transport(Transport::Tcp)
        .build()
        .expect("context");
    (ctx.worker().expect("worker"), ctx.worker().expect("worker"))
}

fn connected() -> (Worker, Ep, Worker, Ep, Cable) {
    let (a, b) = workers();
    let (ea, eb, cable) = a.connect_in_memory(&b).expect("in-memory connection");
    (a, ea, b, eb, cable)
}

/// Steps both workers' progress until `done`; a bounded number of steps, never a clock.
fn step_until(a: &Worker, b: &Worker, done: impl Fn() -> bool) {
    for _ in 0..100_000 {
        if done() {
            return;
        }
        a.progress();
        b.progress();
    }
    panic!("no progress after 100 000 steps of both workers");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn finished(a: &Worker, b: &Worker, r: Request) -> crate::Result<crate::Done> {
    step_until(a, b, || r.is_done());
    r.wait()
}

#[test]
fn messages_of_every_size_cross_the_real_executor_both_ways() {
    let (a, ea, b, eb, _cable) = connected();
    assert_eq!(
        (ea.transport(), eb.transport()),
        (Transport::Memory, Transport::Memory)
    );
    let limit = ea.eager_limit().expect("connected") as usize;
    for (k, len) in [0, 1, 64, limit, limit + 1, 1 << 20]
        .into_iter()
        .enumerate()
    {
        for expected in [true, false] {
            for (from, to, ep, seed) in [(&a, &b, &ea, 1u8), (&b, &a, &eb, 2u8)] {
                let tag = (k as u64) << 8 | u64::from(seed);
                let data = pattern(len, seed ^ k as u8);
                let recv = expected.then(|| to.tag_recv(tag, TAG_MASK_ALL, vec![0; len]));
                let send = ep.tag_send(tag, data.clone());
                let recv = recv.unwrap_or_else(|| {
                    // Unexpected: the message arrives before its receive is posted.
                    step_until(from, to, || to.probe(tag, TAG_MASK_ALL).is_some());
                    to.tag_recv(tag, TAG_MASK_ALL, vec![0; len])
                });
                let got = finished(from, to, recv).expect("received");
                assert_eq!((got.length, got.tag), (len, tag));
                assert!(
                    got.buf == data,
                    "{len} B, expected {expected}: bytes differ"
                );
                let sent = finished(from, to, send).expect("sent");
                assert_eq!(sent.length, len);
            }
        }
    }
    assert_eq!(a.stats().pending_requests, 0);
    assert_eq!(b.stats().pending_requests, 0);
}

#[test]
fn truncation_and_cancel_through_the_executor() {
    let (a, ea, b, _eb, _cable) = connected();
    let limit = ea.eager_limit().expect("connected") as usize;
    for len in [16, limit + 100] {
        // A wildcard receive: the error names the incoming message's own tag and length.
        let recv = b.tag_recv(0, 0, vec![0; 8]);
        let send = ea.tag_send(0x77, pattern(len, 3));
        let err = finished(&a, &b, recv).expect_err("the receive is too small");
        assert_eq!(err.status(), Some(Status::Truncated), "{err}");
        match &err {
            crate::Error::Request {
                length,
                tag,
                buffer,
                ..
            } => assert_eq!((*length, *tag, buffer.len()), (len, 0x77, 8)),
            other => panic!("{other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("has {len} bytes")) && msg.contains("tag 0x77"),
            "{msg}"
        );
        let sent = finished(&a, &b, send);
        if len > limit {
            assert!(sent.is_err(), "a rendezvous send learns of the truncation");
        } else {
            assert!(sent.is_ok(), "an eager send completed as it was made");
        }
    }
    let never = b.tag_recv(99, TAG_MASK_ALL, vec![0; 8]);
    assert!(never.cancel());
    let err = finished(&a, &b, never).expect_err("cancelled");
    assert_eq!(err.status(), Some(Status::Cancelled), "{err}");
}

/// A shared buffer (`Ep::tag_send_shared`) goes back to its owner alone whatever ends its
/// sends: delivered, truncated at the receiver, or failed with the connection. An eager send
/// copies it as it is made and holds no clone at all; a rendezvous send holds clones until
/// it ends.
#[test]
fn shared_sends_give_their_clone_back_however_they_end() {
    let (a, ea, b, _eb, cable) = connected();
    let limit = ea.eager_limit().expect("connected") as usize;
    for len in [16, limit + 100] {
        let data = std::sync::Arc::new(pattern(len, 4));
        let fits = b.tag_recv(1, TAG_MASK_ALL, vec![0; len]);
        let small = b.tag_recv(1, TAG_MASK_ALL, vec![0; 8]);
        let sends = [ea.tag_send_shared(1, &data), ea.tag_send_shared(1, &data)];
        let clones = std::sync::Arc::strong_count(&data) - 1;
        assert_eq!(clones > 0, len > limit, "{len} bytes: {clones} clones held");
        assert!(finished(&a, &b, fits).expect("received").buf == *data);
        let err = finished(&a, &b, small).expect_err("too small");
        assert_eq!(err.status(), Some(Status::Truncated), "{err}");
        let [first, second] = sends;
        assert!(finished(&a, &b, first).expect("sent").buf.is_empty());
        assert_eq!(finished(&a, &b, second).is_err(), len > limit);
        assert_eq!(std::sync::Arc::strong_count(&data), 1, "{len} bytes");
    }
    let data = std::sync::Arc::new(pattern(limit + 1, 5));
    let send = ea.tag_send_shared(2, &data);
    step_until(&a, &b, || b.probe(2, TAG_MASK_ALL).is_some());
    cable.cut();
    let err = finished(&a, &b, send).expect_err("the connection is gone");
    assert_eq!(err.status(), Some(Status::ConnectionClosed), "{err}");
    assert_eq!(std::sync::Arc::strong_count(&data), 1);
}

#[test]
fn a_cut_cable_fails_the_pending_send_and_closes_both_endpoints() {
    let (a, ea, b, eb, cable) = connected();
    let limit = ea.eager_limit().expect("connected") as usize;
    // A rendezvous send waits for the receiver, which never posts its receive.
    let send = ea.tag_send(5, pattern(limit + 1, 9));
    step_until(&a, &b, || b.probe(5, TAG_MASK_ALL).is_some());
    cable.cut();
    let err = finished(&a, &b, send).expect_err("the connection is gone");
    assert_eq!(err.status(), Some(Status::ConnectionClosed), "{err}");
    step_until(&a, &b, || !ea.is_connected() && !eb.is_connected());
    let why = ea.close_reason().expect("a reason");
    assert!(why.contains("cut"), "{why}");
    // The workers go on: a new connection between them works.
    let (ea2, _eb2, _c2) = a.connect_in_memory(&b).expect("a second connection");
    let recv = b.tag_recv(6, TAG_MASK_ALL, vec![0; 3]);
    let send = ea2.tag_send(6, vec![1, 2, 3]);
    assert_eq!(finished(&a, &b, recv).expect("received").buf, [1, 2, 3]);
    finished(&a, &b, send).expect("sent");
}

#[test]
fn an_eager_send_with_credit_is_done_as_it_is_made_without_a_request_slot() {
    let (a, ea, b, _eb, _cable) = connected();
    let recv = b.tag_recv(7, TAG_MASK_ALL, vec![0; 8]);
    let send = ea.tag_send(7, pattern(8, 3));
    // Done before any progress: its frame is queued, and nothing is left to wait for.
    assert!(send.is_done() && send.test());
    assert!(!send.cancel(), "a completed send cannot be cancelled");
    assert_eq!(a.driver.state.lock().requests.open_slots(), 0);
    let sent = send.wait().expect("sent");
    assert_eq!((sent.length, sent.buf), (8, pattern(8, 3)));
    let got = finished(&a, &b, recv).expect("received");
    assert_eq!(got.buf, pattern(8, 3));
    // A send on a closed endpoint is refused at once, the same way, with its buffer back.
    ea.close().expect("closed");
    let refused = ea.tag_send(8, vec![5; 4]);
    assert!(refused.is_done());
    assert_eq!(a.driver.state.lock().requests.open_slots(), 0);
    match refused.wait() {
        Err(crate::Error::Request { status, buffer, .. }) => {
            assert_eq!((status, buffer), (Status::ConnectionClosed, vec![5; 4]));
        }
        other => panic!("a send on a closed endpoint gave {other:?}"),
    }
}

#[test]
fn a_receive_whose_message_arrived_is_done_as_it_is_made_without_a_request_slot() {
    let (a, ea, b, eb, _cable) = connected();
    ea.tag_send(9, pattern(40, 4)).wait().expect("sent");
    ea.tag_send(10, pattern(40, 5)).wait().expect("sent");
    // Both arrive unexpected at b.
    step_until(&a, &b, || {
        b.driver.state.lock().engine.unexpected_len() == 2
    });
    let recv = b.tag_recv(9, TAG_MASK_ALL, vec![0; 64]);
    // Done before any progress, with the message's bytes, tag and sender; no slot taken.
    assert!(recv.is_done());
    assert!(!recv.cancel(), "a completed receive cannot be cancelled");
    assert_eq!(b.driver.state.lock().requests.open_slots(), 0);
    let got = recv.wait().expect("received");
    assert_eq!(
        (got.tag, got.length, &got.buf[..40], got.conn),
        (9, 40, &pattern(40, 4)[..], Some(eb.id()))
    );
    // Too small a buffer: truncated at once, naming the message's length and tag.
    match b.tag_recv(10, TAG_MASK_ALL, vec![0; 8]).wait() {
        Err(crate::Error::Request {
            status: Status::Truncated,
            length,
            tag,
            ..
        }) => assert_eq!((length, tag), (40, 10)),
        other => panic!("a too-small receive gave {other:?}"),
    }
    assert_eq!(b.stats().pending_requests, 0);
    // A receive posted before its message still waits for it in the table.
    let later = b.tag_recv(11, TAG_MASK_ALL, vec![0; 8]);
    assert!(!later.is_done());
    assert_eq!(b.driver.state.lock().requests.open_slots(), 1);
    ea.tag_send(11, vec![7; 8]).wait().expect("sent");
    assert_eq!(finished(&a, &b, later).expect("received").buf, [7; 8]);
}

#[test]
fn credits_pace_a_sender_far_ahead_of_its_receiver() {
    let (a, ea, b, _eb, _cable) = connected();
    // Far more messages than the receiver's credits (64 by default): the engine queues
    // them behind the credits and the receiver's grants release them, in order.
    let n = 500u64;
    let sends: Vec<Request> = (0..n)
        .map(|i| ea.tag_send(i, pattern(100, i as u8)))
        .collect();
    for _ in 0..1000 {
        a.progress();
        b.progress();
    }
    let recvs: Vec<Request> = (0..n).map(|_| b.tag_recv(0, 0, vec![0; 100])).collect();
    for (i, r) in recvs.into_iter().enumerate() {
        let got = finished(&a, &b, r).expect("received");
        assert_eq!(
            got.tag, i as u64,
            "messages of one connection arrive in order"
        );
        assert!(got.buf == pattern(100, i as u8));
    }
    for s in sends {
        finished(&a, &b, s).expect("sent");
    }
    assert_eq!(a.stats().pending_requests, 0);
    assert_eq!(b.stats().pending_requests, 0);
}

#[test]
fn a_malformed_frame_closes_only_its_endpoint() {
    let ctx = Context::builder()
        .transport(Transport::Tcp)
        .build()
        .expect("context");
    let (a, b, c) = (
        ctx.worker().expect("worker"),
        ctx.worker().expect("worker"),
        ctx.worker().expect("worker"),
    );
    let (_ab, ba, cable) = a.connect_in_memory(&b).expect("a to b");
    let (cb, bc, _cable2) = c.connect_in_memory(&b).expect("c to b");
    // Side 1 of the first cable is b: it gets garbage "from a".
    cable.inject(1, vec![0xEE; 64]);
    step_until(&a, &b, || !ba.is_connected());
    let why = ba.close_reason().expect("a reason");
    assert!(why.contains("protocol error"), "{why}");
    // b's other endpoint is untouched.
    assert!(bc.is_connected());
    let recv = b.tag_recv(3, TAG_MASK_ALL, vec![0; 4]);
    let send = cb.tag_send(3, vec![4, 3, 2, 1]);
    step_until(&b, &c, || recv.is_done() && send.is_done());
    assert_eq!(recv.wait().expect("received").buf, [4, 3, 2, 1]);
    send.wait().expect("sent");
}

/// A send that `tag_send_now` declined can find credits when `tag_send` runs: another
/// thread's progress may deliver a CREDIT frame between the two locked sections. The engine
/// then sends it at once (an immediate request id), and the request must complete as it is
/// made. It used to be tracked under that id, which names no slot, and never completed (seen
/// with four threads sending over shared memory).
#[test]
fn a_send_that_finds_credits_on_its_second_try_completes() {
    let (a, ea, b, _eb, _cable) = connected();
    let cs = ea.conn().clone();
    // What the second locked section sees: credits, so the engine sends at once.
    let made = a
        .driver
        .send_later(&cs, 9, crate::usermem::SendData::Owned(pattern(16, 9)));
    let request = made.into_request(
        &a,
        Describe {
            kind: RequestKind::Send,
            tag: 9,
        },
    );
    let recv = b.tag_recv(9, TAG_MASK_ALL, vec![0; 16]);
    let got = finished(&a, &b, recv).expect("received");
    assert_eq!(got.buf, pattern(16, 9));
    let sent = finished(&a, &b, request).expect("the send completes");
    assert_eq!((sent.length, sent.buf), (16, pattern(16, 9)));
    assert_eq!(a.stats().pending_requests, 0);
}
