//! The rendezvous timeout (`RDMX_RNDV_TIMEOUT_MS`): a peer that gets a rendezvous message's
//! RTS and never reads it (its application never posts the receive) no longer pins the
//! sender's buffer for as long as the endpoint lives. With the timeout set, the send fails
//! with `Status::TimedOut`, its buffer is no longer exposed (a READ the peer makes later is
//! refused), and the endpoint carries later messages; a sender that only waits, with no
//! traffic, wakes for the deadline. Without it (the default) the send stays pending, as in
//! UCP, and is read whenever the receiver gets to it (checked over TCP).

use std::time::Instant;

use rdmx::{Status, Transport, Worker, RNDV_TIMEOUT_VAR, SHM_CMA_VAR, WAIT_MODE_VAR};

use crate::*;

const TAG: u64 = 0x7a7e;
const TIMEOUT_MS: u64 = 200;

fn big() -> Vec<u8> {
    (0..MIB).map(|i| (i % 253) as u8).collect()
}

/// A sender with `settings` connected to a receiver with `receiving` (settings): (sender
/// worker, sender's ep, receiver worker, receiver's ep).
fn pair(
    transport: Transport,
    settings: &[(&str, &str)],
    receiving: &[(&str, &str)],
) -> (Worker, Ep, Worker, Ep) {
    let (receiver, listener, addr) = listening(&context(transport, receiving));
    let (sender, sep, rep) = connected(&context(transport, settings), &listener, &addr);
    assert_eq!(sep.transport(), transport);
    (sender, sep, receiver, rep)
}

/// `settings` go to both sides.
fn an_unread_rendezvous_times_out(transport: Transport, settings: &[(&str, &str)]) {
    init_log();
    let timeout = TIMEOUT_MS.to_string();
    let mut all = vec![(RNDV_TIMEOUT_VAR, timeout.as_str())];
    all.extend_from_slice(settings);
    let (sender, sep, receiver, rep) = pair(transport, &all, settings);
    let data = big();
    let s = sep.tag_send(TAG, data.clone());
    // The receiver progresses (its RTS arrives, unexpected) but never posts the receive.
    progress_until(&[&sender, &receiver], "the unread send", || s.is_done());
    let mut err = s.wait().expect_err("the unread send fails");
    assert_eq!(err.status(), Some(Status::TimedOut), "{err}");
    assert!(err.to_string().contains("RDMX_RNDV_TIMEOUT_MS"), "{err}");
    let st = sender.stats();
    if transport == Transport::Shm {
        // The peer may read this process's memory itself (CMA), which nothing refuses: the
        // worker keeps the buffer (the error's is empty) until the endpoint closes.
        assert!(err.take_buffer().is_empty());
        assert_eq!(st.user_buffers, 1, "{st:?}");
    } else {
        assert_eq!(err.take_buffer(), data, "the buffer comes back");
        assert_eq!(st.user_buffers, 0, "nothing left exposed: {st:?}");
    }
    assert_eq!(st.pending_requests, 0, "{st:?}");

    // The receiver posts its receive late: the exposure is gone, its READ is refused (by
    // CMA the kept memory reads as the message, never as anything else).
    let by_cma = transport == Transport::Shm && rep.data_path().ends_with("by CMA");
    let r = receiver.tag_recv(TAG, !0, vec![0; MIB]);
    progress_until(&[&sender, &receiver], "the late receive", || r.is_done());
    match r.wait() {
        Err(e) if !by_cma => assert_eq!(e.status(), Some(Status::ReadFailed), "{e}"),
        Ok(done) if by_cma => assert!(done.buf == data, "bytes of the late read"),
        other => panic!("late receive: {other:?}"),
    }

    // The endpoint stays up and carries later messages, eager and rendezvous, read in time.
    for len in [100, MIB] {
        let r = receiver.tag_recv(TAG + 1, !0, vec![0; len]);
        let s = sep.tag_send(TAG + 1, vec![0x42; len]);
        progress_until(&[&sender, &receiver], "a later message", || {
            r.is_done() && s.is_done()
        });
        s.wait().expect("a later send");
        assert!(r
            .wait()
            .expect("a later receive")
            .buf
            .iter()
            .all(|&b| b == 0x42));
    }
    assert!(sep.is_connected() && rep.is_connected());
    let st = sender.stats();
    assert_eq!(st.pending_requests, 0, "{st:?}");
}

/// (And without the timeout, the default, the same send stays pending — for ten times the
/// timeout here — and is read whenever the receiver gets to it.)
#[test]
fn an_unread_rendezvous_times_out_over_tcp() {
    an_unread_rendezvous_times_out(Transport::Tcp, &[]);

    let (sender, sep, receiver, _rep) = pair(Transport::Tcp, &[], &[]);
    let data = big();
    let s = sep.tag_send(TAG, data.clone());
    let until_then = Instant::now() + std::time::Duration::from_millis(10 * TIMEOUT_MS);
    while Instant::now() < until_then {
        sender.progress();
        receiver.progress();
    }
    assert!(!s.is_done(), "the send stays pending");
    assert_eq!(sender.stats().user_buffers, 1, "its buffer stays exposed");
    let r = receiver.tag_recv(TAG, !0, vec![0; MIB]);
    progress_until(&[&sender, &receiver], "the read at last", || {
        r.is_done() && s.is_done()
    });
    s.wait().expect("read at last");
    assert!(r.wait().expect("the late receive").buf == data);
}

#[test]
fn an_unread_rendezvous_times_out_over_shm() {
    an_unread_rendezvous_times_out(Transport::Shm, &[]);
}

#[test]
fn an_unread_rendezvous_times_out_over_shm_without_cma() {
    an_unread_rendezvous_times_out(Transport::Shm, &[(SHM_CMA_VAR, "0")]);
}

/// A sender that only waits for its send, in event mode with no traffic at all (the
/// receiver is never progressed), sees the deadline pass: its worker's clock is fed while it
/// sleeps (it sleeps until the engine's next deadline, `Engine::poll_timeout`).
#[test]
fn a_waiting_sender_wakes_for_the_deadline() {
    init_log();
    let timeout = TIMEOUT_MS.to_string();
    let (_sender, sep, _receiver, _rep) = pair(
        Transport::Tcp,
        &[(RNDV_TIMEOUT_VAR, &timeout), (WAIT_MODE_VAR, "event")],
        &[],
    );
    let s = sep.tag_send(TAG, big());
    let deadline = Instant::now() + LONG;
    while !s.wait_for(std::time::Duration::from_millis(100)) {
        assert!(Instant::now() < deadline, "hung");
    }
    let err = s.wait().expect_err("timed out");
    assert_eq!(err.status(), Some(Status::TimedOut), "{err}");
}
