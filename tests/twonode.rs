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
    assert!(r.wait_for(LONG), "{r:?} did not complete within {LONG:?}");
    r.wait()
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
    // Long enough that the cut, asked for once the first message is in, lands mid-stream
    // (about 20 MB/s across the emulated wire).
    const MSGS: usize = 4;
    const LEN: usize = 64 * MIB;
    let node = env("RDMX_NODE");
    // Made before the stream starts: an emulated debug build takes seconds to fill them,
    // during which the worker would not progress.
    let payloads: Vec<Vec<u8>> = if is_server() {
        Vec::new()
    } else {
        (0..MSGS).map(|i| stamped(LEN, i as u8)).collect()
    };
    let ctx = context(Transport::Rdma);
    let w = ctx.worker().unwrap();
    let ep = connected(&w, 7611);
    if is_server() {
        let recvs: Vec<Request> = (0..MSGS)
            .map(|_| w.tag_recv(9, TAG_MASK_ALL, vec![0; LEN]))
            .collect();
        // Mid-stream: READs under way for a while (every matched message is read at once,
        // so the messages finish together, near the end).
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
        // A receive matched to the stream fails with the connection; one never matched is
        // the worker's, not the endpoint's, and waits for any other sender (MPI's rule).
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
        println!(
            "node A: closed {closed:?} after the cut was asked for; receives: {ok} completed \
             before it, {failed} failed, {unmatched} never matched (cancelled)"
        );
        assert!(failed >= 1, "the receives reading when the cable went fail");
        twonode(&["mark", "A-failed"]);
    } else {
        let mut sends: Vec<Option<Request>> = payloads
            .into_iter()
            .map(|p| Some(ep.tag_send(9, p)))
            .collect();
        let (mut ok, mut failed) = (0, 0);
        // The reference point: A's signal that it asks for the cut now (so, before the cut),
        // or a send that completed after it.
        let signal = std::path::PathBuf::from(env("RDMX_NODE_JOB")).join("sync/s.cut-asked");
        let mut reference = None;
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
                        last_failure = Some(Instant::now());
                    }
                }
            }
        }
        let reference = reference.expect("A's signal seen before the sends failed");
        let took = last_failure.expect("the cut came mid-stream") - reference;
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

/// Packet loss on the wire (netem on both nodes' eth0, 1 %, `limit 10000`): during an eager
/// stream and a 64 MiB rendezvous each way, RC retransmits and everything arrives exactly
/// once, in order, byte-exact. The same transfers without loss first give the slowdown,
/// printed (about 5x: rxe's go-back-N makes each loss at the tail of a burst cost an ACK
/// timeout, 134 ms with the default keepalive). 5 % is not here yet: there rxe stalled, no
/// completion and no error for over 2 minutes, in 2 runs of 3.
#[test]
#[ignore = "runs on two Soft-RoCE nodes: scripts/test runs it with scripts/softroce-twonode"]
fn lossy_wire_loses_nothing_reorders_nothing() {
    let (loss, rndv) = ("1%", 64 * MIB);
    let ctx = context(Transport::Rdma);
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
