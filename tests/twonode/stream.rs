//! What the fault tests share: the rendezvous stream a fault lands in the middle of, and
//! how each node watches its requests fail.

use super::*;

/// Messages and bytes of each fault test's rendezvous stream: long enough that a fault asked
/// for once READs are under way lands mid-stream (about 20 MB/s across the emulated wire).
pub(super) const MSGS: usize = 4;
pub(super) const LEN: usize = 64 * MIB;

/// A fault test's RDMA endpoint on `port` over `ctx` (node A listens, node B connects), with
/// node B's stamped payloads of the stream, made before it connects: an emulated debug build
/// takes seconds to fill them, during which the worker would not progress.
pub(super) struct FaultStream {
    pub(super) w: Worker,
    pub(super) ep: Ep,
    pub(super) payloads: Vec<Vec<u8>>,
    pub(super) _ctx: Context,
}

impl FaultStream {
    pub(super) fn new(ctx: Context, port: u16) -> FaultStream {
        let payloads = if is_server() {
            Vec::new()
        } else {
            (0..MSGS).map(|i| pattern(LEN, i as u8)).collect()
        };
        let w = ctx.worker().unwrap();
        let ep = connected(&w, port);
        FaultStream {
            w,
            ep,
            payloads,
            _ctx: ctx,
        }
    }
}

/// Progresses `w` until `ep` closes; fails the test unless that is within [`BOUND`] of
/// `since`. Returns how long it took.
pub(super) fn closed_within(ep: &Ep, w: &Worker, since: Instant) -> Duration {
    let deadline = since + LONG;
    while ep.is_connected() {
        assert!(Instant::now() < deadline, "the endpoint never closed");
        w.progress();
        thread::yield_now();
    }
    let took = since.elapsed();
    println!(
        "node {}: endpoint closed {took:?} after the reference point: {}",
        env("RDMX_NODE"),
        ep.close_reason().unwrap_or_default()
    );
    assert!(
        took < BOUND,
        "the endpoint closed {took:?} after the reference point"
    );
    took
}

/// Node A's side of a fault test's stream: `msgs` receives of `len` bytes on `tag`,
/// progressed until READs have been under way for 2 s, so that a fault asked for now lands
/// mid-stream (every matched message is read at once, so the messages finish together,
/// near the end).
pub(super) fn receives_mid_stream(w: &Worker, tag: u64, msgs: usize, len: usize) -> Vec<Request> {
    let recvs: Vec<Request> = (0..msgs)
        .map(|_| w.tag_recv(tag, TAG_MASK_ALL, vec![0; len]))
        .collect();
    let deadline = Instant::now() + LONG;
    while w.stats().reads_in_flight == 0 {
        assert!(Instant::now() < deadline, "no READ started");
        w.progress();
    }
    let reading = Instant::now();
    while reading.elapsed() < Duration::from_secs(2) {
        w.progress();
    }
    assert!(
        recvs.iter().all(|r| !r.is_done()),
        "the stream ended too soon"
    );
    recvs
}

/// Node A's receives once its endpoint closed: a receive matched to the stream fails with
/// the connection (within [`BOUND`]); one never matched is the worker's, not the
/// endpoint's, and waits for any other sender (MPI's rule), so it is cancelled. Returns how
/// many completed before the close, failed, and were never matched.
pub(super) fn receives_after_close(recvs: Vec<Request>) -> (usize, usize, usize) {
    let (mut ok, mut failed, mut unmatched) = (0, 0, 0);
    for r in recvs {
        if !r.is_done() && r.cancel() {
            unmatched += 1;
            continue;
        }
        assert!(
            r.wait_for(BOUND),
            "a matched receive still pending after the close"
        );
        match r.wait() {
            Ok(_) => ok += 1,
            Err(e) => {
                let status = e.status();
                assert!(
                    matches!(status, Some(Status::ConnectionClosed | Status::ReadFailed)),
                    "{status:?}"
                );
                failed += 1;
            }
        }
    }
    (ok, failed, unmatched)
}

/// Node A's side of a fault that silences node B mid-stream: READs of B's stream under way,
/// then `twonode host FAULT...` (after the `signal` B takes as its reference point, if
/// any); the endpoint must close within [`BOUND`] and the receives reading then fail. Marks
/// `A-failed` on the runner's timeline.
pub(super) fn node_a_silences_b_mid_stream(
    w: &Worker,
    ep: &Ep,
    signal: Option<&str>,
    fault: &[&str],
) {
    let recvs = receives_mid_stream(w, 9, MSGS, LEN);
    if let Some(signal) = signal {
        twonode(&["signal", signal]);
    }
    let asked = Instant::now();
    host(fault);
    let answered = asked.elapsed();
    let closed = closed_within(ep, w, asked);
    let (ok, failed, unmatched) = receives_after_close(recvs);
    let fault = fault.join(" ");
    println!(
        "node A: closed {closed:?} after `{fault}` was asked for (the host answered after \
         {answered:?}); receives: {ok} completed, {failed} failed, {unmatched} never matched \
         (cancelled)"
    );
    assert!(failed >= 1, "the receives reading when `{fault}` came fail");
    twonode(&["mark", "A-failed"]);
}

/// How node B's sends of a fault test ended.
pub(super) struct Sent {
    pub(super) ok: usize,
    pub(super) failed: usize,
    /// When the last send failed, after the reference point: A's signal `signal` (given
    /// just before it caused the fault), or a send that completed after that signal.
    pub(super) last_failure: Option<Duration>,
}

/// A signal of node A's (`twonode signal NAME`) as node B watches for it while it progresses:
/// the file the runner's helper creates, looked at every 10 ms (a `stat` over 9p).
pub(super) struct SignalWatch {
    file: std::path::PathBuf,
    /// The last moment the file was seen absent: the signal was given after it.
    absent_at: Instant,
    seen_at: Option<Instant>,
}

impl SignalWatch {
    pub(super) fn new(name: &str) -> SignalWatch {
        SignalWatch {
            file: std::path::PathBuf::from(env("RDMX_NODE_JOB")).join(format!("sync/s.{name}")),
            absent_at: Instant::now(),
            seen_at: None,
        }
    }

    /// When B first saw the signal, looking again if 10 ms have passed since it last looked.
    pub(super) fn seen(&mut self) -> Option<Instant> {
        if self.seen_at.is_none() && self.absent_at.elapsed() > Duration::from_millis(10) {
            self.look();
        }
        self.seen_at
    }

    /// The reference point for a failure B sees now. A causes the fault right after giving the
    /// signal, and the fault can reach B before B's next look: so B looks at once, and if the
    /// signal is there but was not seen before, the reference is the last moment B saw it absent
    /// (A gave it later, so this can only lengthen the time measured). Fails the test if the
    /// signal has not been given: the failure came before A caused any fault.
    pub(super) fn reference_for_failure(&mut self) -> Instant {
        if self.seen_at.is_none() {
            let absent_at = self.absent_at;
            if self.look() {
                return absent_at;
            }
        }
        self.seen_at
            .expect("a request failed before A gave the signal that comes just before its fault")
    }

    fn look(&mut self) -> bool {
        let now = Instant::now();
        if self.file.exists() {
            self.seen_at = Some(now);
            true
        } else {
            self.absent_at = now;
            false
        }
    }
}

/// Progresses node B's `sends` until all are done (at most [`LONG`]), watching for A's
/// `signal`. A send may complete or fail with [`Status::ConnectionClosed`]; nothing else.
pub(super) fn sends_until_done(w: &Worker, sends: Vec<Request>, signal: &str) -> Sent {
    let mut sends: Vec<Option<Request>> = sends.into_iter().map(Some).collect();
    let mut signal = SignalWatch::new(signal);
    let (mut ok, mut failed) = (0, 0);
    // The signal, or the last send that completed after it.
    let mut reference: Option<Instant> = None;
    let mut last_failure = None;
    let deadline = Instant::now() + LONG;
    while sends.iter().any(Option::is_some) {
        if reference.is_none() {
            reference = signal.seen();
        }
        assert!(
            Instant::now() < deadline,
            "sends still pending after {LONG:?}"
        );
        w.progress();
        for slot in &mut sends {
            if !slot.as_ref().is_some_and(Request::is_done) {
                continue;
            }
            match slot.take().expect("done").wait() {
                Ok(_) => {
                    ok += 1;
                    if reference.is_some() {
                        reference = Some(Instant::now());
                    }
                }
                Err(e) => {
                    assert_eq!(e.status(), Some(Status::ConnectionClosed), "{e}");
                    failed += 1;
                    let since = *reference.get_or_insert_with(|| signal.reference_for_failure());
                    last_failure = Some(since.elapsed());
                }
            }
        }
    }
    Sent {
        ok,
        failed,
        last_failure,
    }
}
