//! Tests across a wire: two Soft-RoCE nodes (`scripts/softroce-twonode`), each running this
//! binary, node A the server and node B the client of every test, so that every RoCE packet
//! leaves one kernel and enters another (unlike the one-guest device tests, where rxe takes
//! its loopback path). Both nodes run the same tests in the same order; a client waits for
//! its server by retrying to connect, and faults are asked of the host runner with its
//! `twonode host` helper. `#[ignore]`d everywhere else; `scripts/test` runs it with
//! `--ignored` on both nodes.

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use rdmx::{Context, Ep, Request, Status, Transport, Worker, TAG_MASK_ALL};

mod pingpong_util;
use pingpong_util::{pingpong_env, rows, start_server, text, KillOnDrop};

const MIB: usize = 1 << 20;
/// Bound of every wait that is not a fault's bound: a test that exceeds it fails.
const LONG: Duration = Duration::from_secs(120);
/// The bound a fault's victims must meet: every pending request fails within it.
const BOUND: Duration = Duration::from_secs(5);

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run these tests through scripts/softroce-twonode (scripts/test does)")
    })
}

fn is_server() -> bool {
    env("RDMX_NODE") == "A"
}

fn context(transport: Transport) -> Context {
    let _ = env_logger::builder().is_test(true).try_init();
    Context::builder()
        .env_lookup(|_| None)
        .transport(transport)
        .build()
        .expect("context")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect()
}

/// `len` bytes of `seed`, each 4 KiB block starting with its index: cheap to make in an
/// emulated debug build, and no block can stand in for another.
fn stamped(len: usize, seed: u8) -> Vec<u8> {
    let mut v = vec![seed; len];
    for (i, block) in v.chunks_mut(4096).enumerate() {
        let n = block.len().min(4);
        block[..n].copy_from_slice(&(i as u32).to_le_bytes()[..n]);
    }
    v
}

/// Node A listens on `port` and accepts one endpoint; node B connects to it, retrying
/// until A listens.
fn connected(w: &Worker, port: u16) -> Ep {
    if is_server() {
        let listener = w
            .listen(&format!("{}:{port}", env("RDMX_NODE_ADDR")))
            .expect("listen");
        return listener
            .next_request(Some(LONG))
            .expect("a connection request")
            .expect("a client within the bound")
            .accept()
            .expect("accept");
    }
    let addr = format!("{}:{port}", env("RDMX_PEER_ADDR"));
    let deadline = Instant::now() + LONG;
    loop {
        match w.connect(&addr) {
            Ok(ep) => return ep,
            Err(e) if Instant::now() < deadline => {
                log::debug!("connect to {addr}: {e}; retrying");
                thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("cannot connect to {addr}: {e}"),
        }
    }
}

/// Messages and bytes of each fault test's rendezvous stream: long enough that a fault asked
/// for once READs are under way lands mid-stream (about 20 MB/s across the emulated wire).
const MSGS: usize = 4;
const LEN: usize = 64 * MIB;

/// A fault test's RDMA endpoint on `port` over `ctx` (node A listens, node B connects), with
/// node B's stamped payloads of the stream, made before it connects: an emulated debug build
/// takes seconds to fill them, during which the worker would not progress.
struct FaultStream {
    w: Worker,
    ep: Ep,
    payloads: Vec<Vec<u8>>,
    _ctx: Context,
}

impl FaultStream {
    fn new(ctx: Context, port: u16) -> FaultStream {
        let payloads = if is_server() {
            Vec::new()
        } else {
            (0..MSGS).map(|i| stamped(LEN, i as u8)).collect()
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

/// Runs the host runner's helper (`twonode ARGS...`), failing the test if it fails.
fn twonode(args: &[&str]) {
    let out = Command::new("twonode")
        .args(args)
        .output()
        .expect("the twonode helper (on PATH under scripts/softroce-twonode)");
    assert!(
        out.status.success(),
        "twonode {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits for `r`, progressing its worker, at most `LONG`.
fn finish(r: Request) -> rdmx::Result<rdmx::Done> {
    assert!(
        r.wait_for(LONG),
        "{r:?} did not complete within {LONG:?}; this node's queue pairs and rxe counters:\n{}",
        qp_report()
    );
    r.wait()
}

/// What the kernel says of this node's RDMA queue pairs (`rdma res show qp`, with their
/// PSNs) and rxe's counters, for a test that found its transfers stalled.
fn qp_report() -> String {
    let mut report = String::new();
    for cmd in [
        "rdma -d res show qp",
        "grep -H . /sys/class/infiniband/rxe0/ports/1/hw_counters/*",
    ] {
        let out = Command::new("sh").args(["-c", cmd]).output();
        report.push_str(&format!("$ {cmd}\n"));
        match out {
            Ok(o) => report.push_str(&String::from_utf8_lossy(&o.stdout)),
            Err(e) => report.push_str(&format!("({e})\n")),
        }
    }
    report
}

/// Eager and rendezvous messages, byte-exact, both ways across the wire, over each
/// transport (the guests' TCP crosses the same wire).
#[test]
#[ignore = "runs on two Soft-RoCE nodes: scripts/test runs it with scripts/softroce-twonode"]
fn messages_cross_the_wire_both_ways_byte_exact() {
    for (transport, port) in [(Transport::Rdma, 7601), (Transport::Tcp, 7602)] {
        let ctx = context(transport);
        let w = ctx.worker().unwrap();
        let ep = connected(&w, port);
        assert_eq!(ep.transport(), transport);
        let sizes = [0, 100, 8 * 1024, 64 * 1024, MIB, 16 * MIB];
        let started = Instant::now();
        for (i, &len) in sizes.iter().enumerate() {
            let tag = i as u64;
            // Each side sends its message and receives the other's.
            let seed = if is_server() { 1 } else { 2 };
            let peer_seed = 3 - seed;
            let recv = w.tag_recv(tag, TAG_MASK_ALL, vec![0; len]);
            let send = ep.tag_send(tag, pattern(len, seed));
            let got = finish(recv).expect("received");
            assert_eq!(got.length, len, "{transport} {len} B");
            assert!(
                got.buf == pattern(len, peer_seed),
                "{transport}: {len} bytes arrived intact"
            );
            finish(send).expect("sent");
        }
        println!(
            "node {}: {transport}: {} messages each way ({} MiB) in {:?}",
            env("RDMX_NODE"),
            sizes.len(),
            sizes.iter().sum::<usize>() / MIB,
            started.elapsed()
        );
        ep.close().expect("close");
    }
}

/// The cable pulled (on the host side, `link off A`) in the middle of a rendezvous stream:
/// within 5 s every pending request on that endpoint fails on both nodes — the receiver's
/// READ and the sender's rendezvous sends — and nothing hangs. Both nodes measure from when
/// A asks for the cut (B: when it sees A's signal, given just before), which is no later
/// than the cut, so the bound holds from the cut too (the runner's timeline shows the cut
/// and each node's `*-failed` mark on the host's clock). A's READ fails by the QP's retries;
/// B, whose sends wait for A's answer with nothing posted, finds out by its keepalive: the
/// cable stays out until it has. It is then put back, and a new connection across it works.
#[test]
#[ignore = "runs on two Soft-RoCE nodes: scripts/test runs it with scripts/softroce-twonode"]
fn cable_pulled_mid_rendezvous_fails_every_pending_request_within_5s() {
    let node = env("RDMX_NODE");
    let FaultStream {
        w, ep, payloads, ..
    } = FaultStream::new(context(Transport::Rdma), 7611);
    if is_server() {
        let recvs = receives_mid_stream(&w, 9, MSGS, LEN);
        // B takes this signal as its reference point: it comes before the cut.
        twonode(&["signal", "cut-asked"]);
        let cut_asked = Instant::now();
        twonode(&["host", "link", "off", "A"]);
        // Whatever happens next, the cable goes back once B found out too (by its
        // keepalive, not by A's disconnect), so that the next tests have a wire.
        let _restore = CableBack;
        println!(
            "node A: the host pulled the cable {:?} after it was asked",
            cut_asked.elapsed()
        );
        let closed = closed_within(&ep, &w, cut_asked);
        let (ok, failed, unmatched) = receives_after_close(recvs);
        println!(
            "node A: closed {closed:?} after the cut was asked for; receives: {ok} completed \
             before it, {failed} failed, {unmatched} never matched (cancelled)"
        );
        assert!(failed >= 1, "the receives reading when the cable went fail");
        twonode(&["mark", "A-failed"]);
    } else {
        let sends = payloads.into_iter().map(|p| ep.tag_send(9, p)).collect();
        let Sent {
            ok,
            failed,
            last_failure,
        } = sends_until_done(&w, sends, "cut-asked");
        let took = last_failure.expect("the cut came mid-stream");
        println!(
            "node B: {ok} sends completed, {failed} failed, the last {took:?} after A asked \
             for the cut: {}",
            ep.close_reason().unwrap_or_default()
        );
        assert!(!ep.is_connected());
        assert!(
            took < BOUND,
            "pending sends failed {took:?} after A asked for the cut"
        );
        twonode(&["mark", "B-failed"]);
        twonode(&["signal", "B-failed"]);
        twonode(&["wait", "cable-back", "120"]);
    }
    // Across the restored cable, a new connection works.
    println!("node {node}: reconnecting across the restored cable");
    let ep2 = connected(&w, 7612);
    let recv = w.tag_recv(10, TAG_MASK_ALL, vec![0; MIB]);
    let send = ep2.tag_send(10, pattern(MIB, 7));
    assert!(
        finish(recv)
            .expect("received after the cable came back")
            .buf
            == pattern(MIB, 7)
    );
    finish(send).expect("sent after the cable came back");
}

/// Node A's cable goes back in when this is dropped (also when the test fails), once node B
/// reported its failure or a minute passed.
struct CableBack;

impl Drop for CableBack {
    fn drop(&mut self) {
        for args in [
            &["wait", "B-failed", "60"][..],
            &["host", "link", "on", "A"],
            &["signal", "cable-back"],
        ] {
            let _ = Command::new("twonode").args(args).status();
        }
    }
}

/// Progresses `w` until `ep` closes; fails the test unless that is within [`BOUND`] of
/// `since`. Returns how long it took.
fn closed_within(ep: &Ep, w: &Worker, since: Instant) -> Duration {
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
fn receives_mid_stream(w: &Worker, tag: u64, msgs: usize, len: usize) -> Vec<Request> {
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
fn receives_after_close(recvs: Vec<Request>) -> (usize, usize, usize) {
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
fn node_a_silences_b_mid_stream(w: &Worker, ep: &Ep, signal: Option<&str>, fault: &[&str]) {
    let recvs = receives_mid_stream(w, 9, MSGS, LEN);
    if let Some(signal) = signal {
        twonode(&["signal", signal]);
    }
    let asked = Instant::now();
    twonode(&[&["host"][..], fault].concat());
    let closed = closed_within(ep, w, asked);
    let (ok, failed, unmatched) = receives_after_close(recvs);
    let fault = fault.join(" ");
    println!(
        "node A: closed {closed:?} after `{fault}` was asked for; receives: {ok} completed, \
         {failed} failed, {unmatched} never matched (cancelled)"
    );
    assert!(failed >= 1, "the receives reading when `{fault}` came fail");
    twonode(&["mark", "A-failed"]);
}

/// How node B's sends of a fault test ended.
struct Sent {
    ok: usize,
    failed: usize,
    /// When the last send failed, after the reference point: A's signal `signal` (given
    /// just before it caused the fault), or a send that completed after that signal.
    last_failure: Option<Duration>,
}

/// The file the runner's helper creates for `twonode signal NAME` (what `twonode wait`
/// waits for), for a test that checks it while it progresses.
fn signal_file(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env("RDMX_NODE_JOB")).join(format!("sync/s.{name}"))
}

/// Progresses node B's `sends` until all are done (at most [`LONG`]), watching for A's
/// `signal`. A send may complete or fail with [`Status::ConnectionClosed`]; nothing else.
fn sends_until_done(w: &Worker, sends: Vec<Request>, signal: &str) -> Sent {
    let mut sends: Vec<Option<Request>> = sends.into_iter().map(Some).collect();
    let signal = signal_file(signal);
    let (mut ok, mut failed) = (0, 0);
    let mut reference: Option<Instant> = None;
    let mut last_check = Instant::now();
    let mut last_failure = None;
    let deadline = Instant::now() + LONG;
    while sends.iter().any(Option::is_some) {
        if reference.is_none() && last_check.elapsed() > Duration::from_millis(10) {
            last_check = Instant::now();
            if signal.exists() {
                reference = Some(Instant::now());
            }
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
                    let reference = reference.expect("A's signal seen before a send failed");
                    last_failure = Some(reference.elapsed());
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

/// The cable pulled for 1 s in the middle of a rendezvous stream, then put back. The RC
/// queue pair retransmits unacknowledged work 6 times, each try waiting the ACK timeout the
/// keepalive implies (`Config::keepalive`): with the default 1 s, 7 tries of 134 ms, 0.94 s
/// in all — shorter than the cut, so the READs under way exhaust their retries while the
/// cable is out and the endpoint fails cleanly on both nodes (A by its QP, B by A's
/// disconnect or its keepalive once the cable is back), every pending request within 5 s;
/// with `RDMX_KEEPALIVE_MS=4000`, 7 tries of 537 ms, 3.8 s, ride the cut out: the
/// retransmissions after the cable is back deliver everything, byte-exact. (A slow emulated
/// guest may fire its timers late enough that the default also rides a 1 s cut out: that
/// is accepted, and printed; data is never lost or damaged either way.) Then a new
/// connection across the cable works.
#[test]
#[ignore = "runs on two Soft-RoCE nodes: scripts/test runs it with scripts/softroce-twonode"]
fn cable_pulled_for_one_second_fails_cleanly_or_with_a_longer_keepalive_survives() {
    let node = env("RDMX_NODE");
    for (keepalive, port, must_survive) in [(1000u64, 7631u16, false), (4000, 7632, true)] {
        let _ = env_logger::builder().is_test(true).try_init();
        let ctx = Context::builder()
            .env_lookup(|_| None)
            .transport(Transport::Rdma)
            .keepalive(Duration::from_millis(keepalive))
            .build()
            .expect("context");
        let FaultStream {
            w, ep, payloads, ..
        } = FaultStream::new(ctx, port);
        let asked = format!("cut1-asked-{port}");
        let survived: bool;
        if is_server() {
            let mut recvs = receives_mid_stream(&w, 9, MSGS, LEN);
            twonode(&["signal", &asked]);
            let cut_asked = Instant::now();
            // The host puts it back 1 s later (to within 50 ms; the timeline shows both).
            twonode(&["host", "link", "off", "A", "1"]);
            // Either every receive completes byte-exact, or the endpoint closes within the
            // bound and every matched receive fails (a failed READ fails its receive a moment
            // before the endpoint closes).
            let deadline = Instant::now() + LONG;
            while ep.is_connected() && recvs.iter().any(|r| !r.is_done()) {
                assert!(Instant::now() < deadline, "neither done nor closed");
                w.progress();
            }
            // (completed, failed) of receives that ended while the endpoint was up.
            let mut ended_up = (0, 0);
            if ep.is_connected() {
                for (i, r) in recvs.drain(..).enumerate() {
                    match r.wait() {
                        Ok(got) => {
                            assert!(got.buf == stamped(LEN, i as u8), "message {i} intact");
                            ended_up.0 += 1;
                        }
                        Err(e) => {
                            assert!(
                                matches!(
                                    e.status(),
                                    Some(Status::ConnectionClosed | Status::ReadFailed)
                                ),
                                "{e}"
                            );
                            ended_up.1 += 1;
                        }
                    }
                }
            }
            survived = ended_up == (MSGS, 0);
            if survived {
                println!(
                    "node A, keepalive {keepalive} ms: survived; {MSGS} x {} MiB arrived \
                     intact {:?} after the cut",
                    LEN / MIB,
                    cut_asked.elapsed()
                );
            } else {
                let closed = closed_within(&ep, &w, cut_asked);
                let (ok, failed, unmatched) = receives_after_close(recvs);
                let (ok, failed) = (ok + ended_up.0, failed + ended_up.1);
                println!(
                    "node A, keepalive {keepalive} ms: failed cleanly, closed {closed:?} after \
                     the cut was asked for ({}); receives: {ok} completed, {failed} failed, \
                     {unmatched} never matched",
                    ep.close_reason().unwrap_or_default()
                );
                assert!(
                    failed >= 1,
                    "the receives reading when the connection broke fail"
                );
            }
            twonode(&["signal", &format!("cut1-{port}-{survived}")]);
        } else {
            let sends = payloads.into_iter().map(|p| ep.tag_send(9, p)).collect();
            let sent = sends_until_done(&w, sends, &asked);
            survived = sent.failed == 0;
            if let Some(took) = sent.last_failure {
                assert!(
                    took < BOUND,
                    "pending sends failed {took:?} after A asked for the cut"
                );
            }
            println!(
                "node B, keepalive {keepalive} ms: {} sends completed, {} failed{}",
                sent.ok,
                sent.failed,
                sent.last_failure
                    .map(|t| format!(", the last {t:?} after A asked for the cut"))
                    .unwrap_or_default()
            );
            // Both nodes tell the same story.
            twonode(&["wait", &format!("cut1-{port}-{survived}"), "120"]);
        }
        assert!(
            survived || !must_survive,
            "a 1 s cut with a {keepalive} ms keepalive must be ridden out"
        );
        if survived {
            assert!(ep.is_connected(), "{:?}", ep.close_reason());
            ep.close().expect("close");
        } else {
            let closing = Instant::now();
            while ep.is_connected() {
                assert!(
                    closing.elapsed() < BOUND,
                    "B's endpoint still up after A's closed"
                );
                w.progress();
            }
        }
        println!(
            "node {node}, keepalive {keepalive} ms: {}",
            if survived {
                "the connection survived the 1 s cut"
            } else {
                "the connection failed cleanly"
            }
        );
        twonode(&["barrier", &format!("cut1-done-{port}"), "120"]);
    }
    // Across the restored cable, a new connection works.
    let ctx = context(Transport::Rdma);
    let w = ctx.worker().unwrap();
    let ep = connected(&w, 7633);
    let recv = w.tag_recv(10, TAG_MASK_ALL, vec![0; MIB]);
    let send = ep.tag_send(10, pattern(MIB, 8));
    assert!(finish(recv).expect("received").buf == pattern(MIB, 8));
    finish(send).expect("sent");
}

/// The peer node paused (its VM stopped) for 8 s, longer than the bound, in the middle of a
/// rendezvous stream: node A's pending requests all fail within 5 s of the pause, as with a
/// cut cable (its READs get no answer). When B runs again its connection is dead: its
/// pending sends fail too, within the bound of its own running time (a paused guest's clock
/// stops with it, so the bound is checked on B's clock plus the pause, whichever the guest
/// saw), and nothing hangs.
#[test]
#[ignore = "runs on two Soft-RoCE nodes: scripts/test runs it with scripts/softroce-twonode"]
fn peer_node_paused_past_the_bound_fails_every_pending_request() {
    const PAUSE: Duration = Duration::from_secs(8);
    let FaultStream {
        w, ep, payloads, ..
    } = FaultStream::new(context(Transport::Rdma), 7641);
    if is_server() {
        let secs = PAUSE.as_secs().to_string();
        node_a_silences_b_mid_stream(&w, &ep, Some("pause-asked"), &["pause", "B", &secs]);
        // B reports once it ran again and found out.
        twonode(&["wait", "B-paused-failed", "120"]);
    } else {
        let sends = payloads.into_iter().map(|p| ep.tag_send(9, p)).collect();
        let sent = sends_until_done(&w, sends, "pause-asked");
        let took = sent.last_failure.expect("the pause came mid-stream");
        println!(
            "node B: {} sends completed, {} failed, the last {took:?} (on this node's clock) \
             after A asked for the pause: {}",
            sent.ok,
            sent.failed,
            ep.close_reason().unwrap_or_default()
        );
        assert!(
            took < BOUND + PAUSE,
            "pending sends failed {took:?} after A asked for the pause"
        );
        assert!(!ep.is_connected());
        twonode(&["mark", "B-failed"]);
        twonode(&["signal", "B-paused-failed"]);
    }
}

/// The peer node crashed (its QEMU killed) in the middle of a rendezvous stream: node A's
/// pending requests all fail within 5 s, as with a cut cable. Node B is the victim: its
/// test never ends on its own, so `scripts/test` runs this one alone (B's only outcome is
/// the runner's "crashed on request"), and skips it in the run of the others.
#[test]
#[ignore = "runs on two Soft-RoCE nodes: scripts/test runs it with scripts/softroce-twonode"]
fn peer_node_crashed_mid_rendezvous_fails_every_pending_request_within_5s() {
    let FaultStream {
        w, ep, payloads, ..
    } = FaultStream::new(context(Transport::Rdma), 7651);
    if is_server() {
        node_a_silences_b_mid_stream(&w, &ep, None, &["crash", "B"]);
    } else {
        let sends: Vec<Request> = payloads.into_iter().map(|p| ep.tag_send(9, p)).collect();
        // Progress until the host kills this node; reaching the end is the failure.
        let deadline = Instant::now() + LONG;
        while Instant::now() < deadline {
            w.progress();
            thread::sleep(Duration::from_millis(1));
        }
        panic!(
            "node B was not crashed within {LONG:?} ({} sends done)",
            sends.iter().filter(|s| s.is_done()).count()
        );
    }
}

/// Packet loss on the wire (netem on both nodes' eth0, 1 %, `limit 10000`): during an eager
/// stream and a 64 MiB rendezvous each way, RC retransmits and everything arrives exactly
/// once, in order, byte-exact. The same transfers without loss first give the slowdown,
/// printed. READs of 16 KiB (`RDMX_RNDV_CHUNK=16k`, what a lossy link wants): about 1.9x
/// slower than without loss, against 5x with the default 256 KiB, whose READs of 256
/// packets rarely arrive whole. Soft-RoCE (Linux 6.1) stalls now and then under loss — no
/// completion and no error, on both nodes' transfers at once — 1 run in 4 to 6 at 1 % with
/// either READ size, most runs at 5 % (so 5 % is not here): a stalled run fails, printing
/// the queue pairs and rxe's counters.
#[test]
#[ignore = "runs on two Soft-RoCE nodes: scripts/test runs it with scripts/softroce-twonode"]
fn lossy_wire_loses_nothing_reorders_nothing() {
    let (loss, rndv) = ("1%", 64 * MIB);
    let _ = env_logger::builder().is_test(true).try_init();
    let ctx = Context::builder()
        .env_lookup(|_| None)
        .transport(Transport::Rdma)
        .rndv_chunk(16 * 1024)
        .build()
        .expect("context");
    let w = ctx.worker().unwrap();
    let ep = connected(&w, 7621);
    let clean = both_ways(&w, &ep, 1000, rndv);
    twonode(&["barrier", "clean"]);
    let _netem = Netem::add(loss);
    twonode(&["barrier", "lossy"]);
    let lossy = both_ways(&w, &ep, 1000, rndv);
    twonode(&["barrier", "done"]);
    println!(
        "node {}: {loss} loss: 1000 eager messages and {} MiB each way in {lossy:?}, \
         {clean:?} without loss ({:.1}x slower)",
        env("RDMX_NODE"),
        rndv / MIB,
        lossy.as_secs_f64() / clean.as_secs_f64()
    );
    assert!(ep.is_connected(), "{:?}", ep.close_reason());
}

/// netem dropping `loss` of eth0's frames on this node, removed when dropped.
struct Netem;

impl Netem {
    fn add(loss: &str) -> Netem {
        let ok = Command::new("tc")
            .args([
                "qdisc", "replace", "dev", "eth0", "root", "netem", "loss", loss,
            ])
            .args(["limit", "10000"])
            .status()
            .expect("tc");
        assert!(ok.success(), "tc qdisc replace ... netem loss {loss}");
        Netem
    }
}

impl Drop for Netem {
    fn drop(&mut self) {
        let _ = Command::new("tc")
            .args(["qdisc", "del", "dev", "eth0", "root"])
            .status();
    }
}

/// Both nodes at once: `eager` numbered 512-byte messages each way on one tag (they must
/// arrive in order: posted receives match in order), then one `rndv`-byte rendezvous message
/// each way, all byte-exact. Returns how long it took.
fn both_ways(w: &Worker, ep: &Ep, eager: u32, rndv: usize) -> Duration {
    let numbered = |i: u32| {
        let mut v = vec![(i % 251) as u8; 512];
        v[..4].copy_from_slice(&i.to_le_bytes());
        v
    };
    let seed = if is_server() { 1 } else { 2 };
    let big = stamped(rndv, seed);
    let expected_big = stamped(rndv, 3 - seed);
    let start = Instant::now();
    let recvs: Vec<Request> = (0..eager)
        .map(|_| w.tag_recv(20, TAG_MASK_ALL, vec![0; 512]))
        .collect();
    let sends: Vec<Request> = (0..eager).map(|i| ep.tag_send(20, numbered(i))).collect();
    for (i, r) in recvs.into_iter().enumerate() {
        let got = finish(r).expect("an eager message");
        assert!(
            got.buf == numbered(i as u32),
            "eager message {i} in order and intact"
        );
    }
    for s in sends {
        finish(s).expect("eager send");
    }
    let recv = w.tag_recv(21, TAG_MASK_ALL, vec![0; rndv]);
    let send = ep.tag_send(21, big);
    let got = finish(recv).expect("the rendezvous message");
    assert!(got.buf == expected_big, "{rndv} bytes intact");
    finish(send).expect("rendezvous send");
    start.elapsed()
}

/// The demo across the wire, as a user runs it between two machines: `pingpong --server` on
/// node A (awaited by its "listening" line), `pingpong --client` on node B, eager and
/// rendezvous sizes, over RDMA.
#[test]
#[ignore = "runs on two Soft-RoCE nodes: scripts/test runs it with scripts/softroce-twonode"]
fn pingpong_demo_across_the_wire() {
    const PORT: u16 = 7661;
    let rdma = [("RDMX_TRANSPORT", "rdma")];
    if is_server() {
        let (mut server, bound) =
            start_server(&format!("{}:{PORT}", env("RDMX_NODE_ADDR")), &rdma, "rdma");
        println!("node A: pingpong listening on {bound}");
        twonode(&["signal", "pingpong-listening"]);
        let deadline = Instant::now() + LONG;
        let status = loop {
            if let Some(status) = server.0.try_wait().expect("the server's status") {
                break status;
            }
            assert!(Instant::now() < deadline, "the pingpong server still runs");
            thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "the pingpong server failed: {status}");
    } else {
        twonode(&["wait", "pingpong-listening", "120"]);
        let addr = format!("{}:{PORT}", env("RDMX_PEER_ADDR"));
        let out = pingpong_env(&["--client", &addr, "-s", "8,4K,64K,1M", "-n", "20"], &rdma);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{}", text(&out.stderr));
        println!("node B: pingpong across the wire:\n{stdout}");
        let protocols: Vec<(String, String)> = rows(&stdout)
            .into_iter()
            .map(|(size, protocol, n)| {
                assert_eq!(n, 20, "iterations of {size}");
                (size, protocol)
            })
            .map(|(s, p)| (s.split_whitespace().next().unwrap_or("").to_string(), p))
            .collect();
        assert_eq!(
            protocols
                .iter()
                .map(|(_, p)| p.as_str())
                .collect::<Vec<_>>(),
            ["eager", "eager", "rndv", "rndv"],
            "{protocols:?}"
        );
    }
}

/// A peer process killed (SIGKILL) across the wire in the middle of a rendezvous stream, in
/// each direction: node A runs the peer (this binary again, in the victim role), node B talks
/// to it. When the victim READs B's sends, B's pending sends fail within 5 s of the kill;
/// when B READs the victim's sends, B's endpoint closes and its matched receives fail within
/// 5 s. (The kernel destroys a dead process's QP and rdma_cm tells the peer.)
#[test]
#[ignore = "runs on two Soft-RoCE nodes: scripts/test runs it with scripts/softroce-twonode"]
fn peer_process_killed_mid_rendezvous_fails_pending_requests_across_the_wire() {
    if let Ok(role) = std::env::var("RDMX_TWONODE_VICTIM") {
        return victim(&role);
    }
    for (role, port) in [("recv", 7671u16), ("send", 7672)] {
        let asked = format!("kill-asked-{port}");
        if is_server() {
            use std::io::{BufRead, BufReader};
            let mut child = KillOnDrop(
                Command::new(std::env::current_exe().expect("this test binary"))
                    .args([
                        "--ignored",
                        "--exact",
                        "peer_process_killed_mid_rendezvous_fails_pending_requests_across_the_wire",
                        "--nocapture",
                        "--test-threads=1",
                    ])
                    .env("RDMX_TWONODE_VICTIM", role)
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .expect("start the victim"),
            );
            if role == "recv" {
                // It says READY once its READs of B's stream have run for a while.
                let stdout = child.0.stdout.take().expect("the victim's stdout");
                let ready = BufReader::new(stdout)
                    .lines()
                    .any(|l| l.is_ok_and(|l| l.contains("READY")));
                assert!(ready, "the victim ended before it was ready");
            } else {
                // B says when its READs of the victim's stream have run for a while.
                twonode(&["wait", &format!("reading-{port}"), "120"]);
            }
            twonode(&["signal", &asked]);
            child.0.kill().expect("SIGKILL the victim");
            child.0.wait().expect("the victim's status");
            println!("node A: killed the {role} victim");
            twonode(&["wait", &format!("b-done-{port}"), "120"]);
            continue;
        }
        let ctx = context(Transport::Rdma);
        let w = ctx.worker().unwrap();
        let ep = connected(&w, port);
        if role == "recv" {
            let sends = (0..MSGS)
                .map(|i| ep.tag_send(9, stamped(LEN, i as u8)))
                .collect();
            let sent = sends_until_done(&w, sends, &asked);
            let took = sent.last_failure.expect("sends failed after the kill");
            println!(
                "node B: the victim reading our sends was killed: {} sends completed, {} \
                 failed, the last {took:?} after A asked for the kill",
                sent.ok, sent.failed
            );
            assert!(
                took < BOUND,
                "sends failed {took:?} after the kill was asked"
            );
        } else {
            let recvs = receives_mid_stream(&w, 9, MSGS, LEN);
            twonode(&["signal", &format!("reading-{port}")]);
            let signal = signal_file(&asked);
            let deadline = Instant::now() + LONG;
            let mut last_check = Instant::now();
            let reference = loop {
                w.progress();
                if last_check.elapsed() > Duration::from_millis(10) {
                    last_check = Instant::now();
                    if signal.exists() {
                        break Instant::now();
                    }
                }
                assert!(Instant::now() < deadline, "A never asked for the kill");
            };
            let closed = closed_within(&ep, &w, reference);
            let (ok, failed, unmatched) = receives_after_close(recvs);
            println!(
                "node B: the victim we were reading from was killed: closed {closed:?} after \
                 A asked; receives: {ok} completed, {failed} failed, {unmatched} never matched"
            );
            assert!(failed >= 1, "the receives reading from the victim fail");
        }
        twonode(&["signal", &format!("b-done-{port}")]);
    }
}

/// The victim process on node A (see the test above): `recv` receives B's rendezvous stream
/// and says READY once its READs ran for a while; `send` sends B one. Either then progresses
/// until it is killed.
fn victim(role: &str) {
    let port = if role == "recv" { 7671 } else { 7672 };
    let payloads: Vec<Vec<u8>> = if role == "send" {
        (0..MSGS).map(|i| stamped(LEN, i as u8)).collect()
    } else {
        Vec::new()
    };
    let ctx = context(Transport::Rdma);
    let w = ctx.worker().unwrap();
    let ep = connected(&w, port);
    let _requests: Vec<Request> = if role == "recv" {
        let recvs = receives_mid_stream(&w, 9, MSGS, LEN);
        println!("READY");
        recvs
    } else {
        payloads.into_iter().map(|p| ep.tag_send(9, p)).collect()
    };
    let deadline = Instant::now() + LONG;
    while Instant::now() < deadline {
        w.progress();
    }
    panic!("the {role} victim was not killed within {LONG:?}");
}
