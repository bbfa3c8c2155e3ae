//! The rendezvous timeout on the simulated fabric: a send whose receiver does not read it
//! within `Config::rndv_timeout_ns` of its RTS completes with `Status::TimedOut` and its
//! exposure is released; a READ that comes later fails, a late ATS is ignored, and the
//! connection carries on. Without the timeout (the default) such a send stays pending.

mod common;

use common::*;
use rdmx_proto::*;

const TIMEOUT: u64 = 1_000_000;

fn cfg(timeout_ns: u64) -> Config {
    Config::builder()
        .recv_buf_size(256)
        .eager_threshold(200)
        .srq_depth(16)
        .credits(8)
        .rndv_chunk_size(100)
        .max_reads_in_flight(3)
        .rndv_timeout_ns(timeout_ns)
        .build()
        .unwrap()
}

/// Advances peer `i`'s clock to `now` and runs what it caused.
fn tick(s: &mut Sim, i: usize, now: u64) {
    s.peers[i].engine.handle_timeout(now);
    s.pump(i);
    s.run();
}

/// (And without the timeout, the default, the same send waits for ever.)
#[test]
fn a_rendezvous_not_read_in_time_fails_and_its_exposure_is_released() {
    let mut s = Sim::uniform(2, cfg(TIMEOUT), 1);
    let send = s.send(0, 1, 5, pattern(1000, 5));
    s.run();
    assert_eq!(
        s.peers[1].engine.unexpected_len(),
        1,
        "the RTS waits unexpected"
    );
    // The RTS went out: the engine asks for the clock at once, to set its deadline.
    assert_eq!(s.peers[0].engine.poll_timeout(), Some(0));
    tick(&mut s, 0, 10);
    assert_eq!(s.peers[0].engine.poll_timeout(), Some(10 + TIMEOUT));
    tick(&mut s, 0, 10 + TIMEOUT - 1);
    assert!(
        s.completion(0, send).is_none(),
        "pending until its deadline"
    );
    tick(&mut s, 0, 10 + TIMEOUT);
    let c = s.completion(0, send).expect("timed out");
    assert_eq!((c.status, c.length, c.tag), (Status::TimedOut, 1000, 5));
    assert_eq!(s.peers[0].engine.pending_requests(), 0);
    assert_eq!(s.peers[0].engine.poll_timeout(), None);

    // The receiver posts its receive late: the READ of the released buffer fails, its ATS
    // names a request that is gone and is ignored (no second completion).
    let (r, _) = s.recv(1, 5, !0, 1000);
    s.run();
    assert_eq!(
        s.completion(1, r).map(|c| c.status),
        Some(Status::ReadFailed)
    );
    // The connection carries on, both ways, eager and rendezvous.
    for (from, to, len) in [(0, 1, 100), (1, 0, 100), (0, 1, 900), (1, 0, 900)] {
        let (r, buf) = s.recv(to, 6, !0, len);
        let sr = s.send(from, to, 6, pattern(len, 6));
        s.run();
        assert_eq!(s.completion(to, r).map(|c| c.status), Some(Status::Ok));
        assert_eq!(s.completion(from, sr).map(|c| c.status), Some(Status::Ok));
        assert_eq!(s.data(to, buf, len as u64), pattern(len, 6));
    }
    assert!(s.peers.iter().all(|p| p.closed.is_empty()));
    s.assert_srq_full();

    // Without the timeout (the default), the same send waits for ever and is read late.
    let mut s = Sim::uniform(2, cfg(0), 2);
    let send = s.send(0, 1, 5, pattern(1000, 5));
    s.run();
    assert_eq!(
        s.peers[0].engine.poll_timeout(),
        None,
        "no deadline to keep"
    );
    tick(&mut s, 0, u64::MAX / 2);
    assert!(s.completion(0, send).is_none());
    let (r, buf) = s.recv(1, 5, !0, 1000);
    s.run();
    assert_eq!(s.completion(1, r).map(|c| c.status), Some(Status::Ok));
    assert_eq!(s.completion(0, send).map(|c| c.status), Some(Status::Ok));
    assert_eq!(s.data(1, buf, 1000), pattern(1000, 5));
}

#[test]
fn a_send_read_in_time_completes_and_its_deadline_is_forgotten() {
    let mut s = Sim::uniform(2, cfg(TIMEOUT), 3);
    let (r, _) = s.recv(1, 5, !0, 1000);
    let send = s.send(0, 1, 5, pattern(1000, 5));
    tick(&mut s, 0, 100);
    // (The RTS went out before the READs: its deadline was set.)
    s.run();
    assert_eq!(s.peers[0].engine.poll_timeout(), Some(100 + TIMEOUT));
    assert_eq!(s.completion(0, send).map(|c| c.status), Some(Status::Ok));
    assert_eq!(s.completion(1, r).map(|c| c.status), Some(Status::Ok));
    // (Its deadline may still be listed: when it comes, nothing happens.)
    tick(&mut s, 0, 100 + TIMEOUT);
    assert_eq!(s.peers[0].completion_order.len(), 1, "completed once");
    assert_eq!(s.peers[0].engine.poll_timeout(), None);
}

/// The deadline covers the whole rendezvous, READs included: a receiver that matched but
/// has not finished reading when it comes sees its READs fail, and the sender times out.
#[test]
fn a_send_whose_reads_are_in_flight_at_the_deadline_times_out_too() {
    let mut s = Sim::uniform(2, cfg(TIMEOUT), 4);
    let send = s.send(0, 1, 5, pattern(1000, 5));
    s.run();
    tick(&mut s, 0, 0);
    // The receive matches and issues its first READs, which stay in flight.
    let (r, _) = s.recv(1, 5, !0, 1000);
    assert!(s.completion(1, r).is_none());
    // The sender's deadline comes first.
    s.peers[0].engine.handle_timeout(TIMEOUT);
    s.pump(0);
    assert_eq!(
        s.completion(0, send).map(|c| c.status),
        Some(Status::TimedOut)
    );
    s.run();
    assert_eq!(
        s.completion(1, r).map(|c| c.status),
        Some(Status::ReadFailed)
    );
    assert_eq!(
        s.peers[0].completion_order.len(),
        1,
        "the late ATS is ignored"
    );
    assert!(s.peers.iter().all(|p| p.closed.is_empty()));
}

/// Deadlines are set in order and fire in order, each for its own send; a send's deadline
/// runs from its RTS, not from when it was made (here the RTS waits for its exposure).
#[test]
fn each_send_has_its_own_deadline_from_its_rts() {
    let mut s = Sim::uniform(2, cfg(TIMEOUT), 5);
    s.expose_immediately = false;
    let first = s.send(0, 1, 1, pattern(500, 1));
    s.finish_exposures();
    s.run();
    tick(&mut s, 0, 1000);
    let second = s.send(0, 1, 2, pattern(500, 2));
    tick(&mut s, 0, 5000);
    // Made at 1000, but its buffer is exposed (and its RTS sent) only now.
    s.finish_exposures();
    s.run();
    tick(&mut s, 0, 9000);
    tick(&mut s, 0, 1000 + TIMEOUT);
    assert_eq!(
        s.completion(0, first).map(|c| c.status),
        Some(Status::TimedOut)
    );
    assert!(s.completion(0, second).is_none());
    tick(&mut s, 0, 9000 + TIMEOUT);
    assert_eq!(
        s.completion(0, second).map(|c| c.status),
        Some(Status::TimedOut)
    );
    // Both RTS are still queued at the receiver: its receives fail to read them.
    for tag in [1, 2] {
        let (r, _) = s.recv(1, tag, !0, 500);
        s.run();
        assert_eq!(
            s.completion(1, r).map(|c| c.status),
            Some(Status::ReadFailed)
        );
    }
}
