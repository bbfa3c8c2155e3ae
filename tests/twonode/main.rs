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

#[path = "../pingpong_util/mod.rs"]
mod pingpong_util;

#[path = "../pattern/mod.rs"]
mod pattern;
use pattern::pattern;

mod cable;
mod loss;
mod nodes;
mod peer_process;
mod stream;
mod traffic;

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

/// Asks the host runner for a fault now (`ACTION NODE [ARG]`, what `twonode host` takes) and
/// waits for its answer, failing the test if the host refuses. It makes the helper's request
/// itself (a file in the job's `ctl/`, answered by a `.done` beside it) rather than running
/// the helper: in a guest whose one CPU is busy with rxe's traffic every process the helper
/// starts takes a good fraction of a second, and they put up to 7 s between a test asking for
/// a crash and the crash, all inside the bound measured from the asking.
fn host(action: &[&str]) {
    let request = std::path::Path::new(&env("RDMX_NODE_JOB"))
        .join("ctl")
        .join(format!(
            "{}.{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("the clock is past 1970")
                .as_nanos(),
            env("RDMX_NODE")
        ));
    let file = |ext: &str| std::path::PathBuf::from(format!("{}.{ext}", request.display()));
    std::fs::write(file("new"), action.join(" ") + "\n").expect("write the host request");
    std::fs::rename(file("new"), file("req")).expect("hand the host the request");
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        // Empty while the host is still writing it.
        match std::fs::read_to_string(file("done")) {
            Ok(answer) if !answer.is_empty() => break answer,
            _ => assert!(
                Instant::now() < deadline,
                "the host never answered {action:?}"
            ),
        }
        thread::sleep(Duration::from_millis(10));
    };
    assert!(
        !answer.starts_with("error"),
        "the host refused {action:?}: {answer}"
    );
}

/// Waits for `r`, progressing its worker, at most `LONG`.
fn finish(r: Request) -> rdmx::Result<rdmx::Done> {
    finish_within(r, LONG)
}

/// Waits for `r`, progressing its worker, at most `bound`.
fn finish_within(r: Request, bound: Duration) -> rdmx::Result<rdmx::Done> {
    assert!(
        r.wait_for(bound),
        "{r:?} did not complete within {bound:?}; this node's queue pairs and rxe counters:\n{}",
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
