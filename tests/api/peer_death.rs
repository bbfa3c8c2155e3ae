//! Peer death: the peer process (this test binary again, in the peer role) is killed with
//! SIGKILL while a rendezvous send to it is pending; the send fails within 5 s and the
//! worker's other endpoint keeps working.

use super::*;

/// A peer process that dies by SIGKILL while requests on its ep are in flight.
struct Victim {
    child: std::process::Child,
    ep: Ep,
}

const VICTIM_BIG: usize = 64 << 20;

impl Victim {
    /// Starts the peer process in `role` and accepts its connection on `listener`; returns once
    /// the peer said READY (it is then in the middle of its role).
    fn start(listener: &rdmx::Listener, role: &str) -> Victim {
        use std::io::{BufRead, BufReader};
        let addr = listener.local_addr().unwrap().to_string();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--include-ignored",
                "--exact",
                "peer_death_fails_pending_requests",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("RDMX_TEST_ROLE", format!("victim:{role}:{addr}"))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn the peer process");
        let ep = listener
            .next_request(Some(long()))
            .unwrap()
            .expect("the peer process connects")
            .accept()
            .unwrap();
        if role == "rndv-recv" {
            // Our receive is posted before the peer sends, so we READ at once.
            return Victim { child, ep };
        }
        ep.send(1, b"go").unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        assert!(
            lines.any(|l| l.is_ok_and(|l| l.contains("READY"))),
            "peer did not start"
        );
        Victim { child, ep }
    }

    fn kill(mut self) -> (Ep, Instant) {
        self.child.kill().expect("SIGKILL the peer");
        let at = Instant::now();
        self.child.wait().unwrap();
        (self.ep, at)
    }
}

/// The victim's side, in the child process.
fn victim(role: &str, addr: &str) {
    let ctx = builder().build().unwrap();
    let worker = new_worker(&ctx);
    let ep = worker.connect(addr).unwrap();
    match role {
        "eager-stream" => {
            worker.recv_vec(1, TAG_MASK_ALL).unwrap();
            println!("READY");
            // Take the stream slowly, so that the sender has a backlog when we die.
            loop {
                worker.recv_vec(2, TAG_MASK_ALL).unwrap();
                thread::sleep(Duration::from_millis(2));
            }
        }
        "rndv-send" => {
            worker.recv_vec(1, TAG_MASK_ALL).unwrap();
            let r = worker.tag_recv(2, TAG_MASK_ALL, vec![0; VICTIM_BIG]);
            println!("READY");
            let _ = r.wait();
        }
        "rndv-recv" => {
            worker.recv_vec(1, TAG_MASK_ALL).unwrap();
            let big = vec![5; VICTIM_BIG];
            ep.send(4, b"next").unwrap();
            let s = ep.tag_send(3, big);
            let _ = s.wait();
        }
        other => panic!("unknown victim role {other}"),
    }
    thread::sleep(long());
}

/// Waits at most 5 s after `killed_at` for every request; returns their results.
fn all_within_5s(reqs: Vec<Request>, killed_at: Instant) -> Vec<rdmx::Result<rdmx::Done>> {
    let deadline = killed_at + Duration::from_secs(5);
    let mut out = Vec::new();
    for r in reqs {
        while !r.wait_for(Duration::from_millis(1)) {
            assert!(
                Instant::now() < deadline,
                "a request on the dead peer's ep is still pending 5 s after SIGKILL: {r:?}"
            );
            WORKERS.with(|v| {
                for w in v.borrow().iter() {
                    w.progress();
                }
            });
        }
        out.push(r.wait());
    }
    println!("all requests done {:?} after SIGKILL", killed_at.elapsed());
    out
}

/// The worker's other endpoint still works, both ways: eager (inline and through the send
/// buffer pool) and rendezvous.
fn still_serves(server: &Worker, sep: &Ep, client: &Worker, cep: &Ep, seed: u8) {
    for len in [100, 4000, 1 << 20] {
        let r = server.tag_recv(9, TAG_MASK_ALL, vec![0; len]);
        let s = cep.tag_send(9, pattern(len, seed));
        assert_eq!(finish(r).unwrap().buf, pattern(len, seed));
        finish(s).unwrap();
        let r = client.tag_recv(10, TAG_MASK_ALL, vec![0; len]);
        let s = sep.tag_send(10, pattern(len, seed));
        assert_eq!(finish(r).unwrap().buf, pattern(len, seed));
        finish(s).unwrap();
    }
}

/// A peer process is SIGKILLed during an eager stream, while it reads a rendezvous message
/// from us, and while we read one from it. Every pending request on its ep fails within 5 s,
/// the worker's other ep keeps working, and memory regions, fds, buffers and connections
/// return to where they were.
pub fn peer_death_fails_pending_requests() {
    init_log();
    let role = std::env::var("RDMX_TEST_ROLE").unwrap_or_default();
    if let Some(rest) = role.strip_prefix("victim:") {
        let (role, addr) = rest.split_once(':').unwrap();
        return victim(role, addr);
    }
    if role != "survivor" {
        return isolated("peer_death_fails_pending_requests", "survivor");
    }
    let ctx = builder().build().unwrap();
    let (server, sep, client, cep) = pair(&ctx);
    let listener = server.listen(&format!("{}:0", addr_a())).unwrap();
    still_serves(&server, &sep, &client, &cep, 1);
    let base = resources(&server);
    println!("before: {base:?}");

    // 1. An eager stream: 2000 messages, most waiting for credits when the peer dies.
    let v = Victim::start(&listener, "eager-stream");
    let sends: Vec<Request> = (0..2000)
        .map(|i| v.ep.tag_send(2, vec![i as u8; 200 + (i % 7) * 500]))
        .collect();
    let deadline = Instant::now() + long();
    while sends.iter().filter(|r| r.is_done()).count() < 20 {
        assert!(Instant::now() < deadline, "the stream did not start");
        server.progress();
    }
    let (ep, killed_at) = v.kill();
    let results = all_within_5s(sends, killed_at);
    let failed = results.iter().filter(|r| r.is_err()).count();
    println!(
        "eager stream: {} delivered, {failed} failed",
        results.len() - failed
    );
    assert!(failed > 0, "the peer died with nothing pending");
    for e in results.into_iter().filter_map(|r| r.err()) {
        assert_eq!(e.status(), Some(Status::ConnectionClosed), "{e}");
    }
    drop(ep);
    still_serves(&server, &sep, &client, &cep, 2);
    settle(&server, &base);

    // 2. The peer is reading our rendezvous message when it dies.
    let v = Victim::start(&listener, "rndv-send");
    let send = v.ep.tag_send(2, pattern(VICTIM_BIG, 3));
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(if is_rdma() { 300 } else { 5 }) {
        server.progress();
    }
    assert!(
        !send.is_done(),
        "the read finished before the kill; make VICTIM_BIG larger"
    );
    let (ep, killed_at) = v.kill();
    let mut results = all_within_5s(vec![send], killed_at);
    let mut err = results.remove(0).expect_err("the reader died");
    assert_eq!(err.status(), Some(Status::ConnectionClosed), "{err}");
    assert_eq!(err.take_buffer().len(), VICTIM_BIG);
    drop(ep);
    still_serves(&server, &sep, &client, &cep, 4);
    settle(&server, &base);

    // 3. We are reading the peer's rendezvous message when it dies.
    let recv = server.tag_recv(3, TAG_MASK_ALL, vec![0; VICTIM_BIG]);
    let v = Victim::start(&listener, "rndv-recv");
    v.ep.send(1, b"go").unwrap();
    finish(server.tag_recv(4, TAG_MASK_ALL, vec![0; 4])).unwrap();
    let deadline = Instant::now() + long();
    while server.stats().reads_in_flight == 0 {
        assert!(Instant::now() < deadline, "the READ did not start");
        server.progress();
    }
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(if is_rdma() { 300 } else { 5 }) {
        server.progress();
    }
    assert!(
        !recv.is_done(),
        "the read finished before the kill; make VICTIM_BIG larger"
    );
    let (ep, killed_at) = v.kill();
    let mut results = all_within_5s(vec![recv], killed_at);
    let err = results.remove(0).expect_err("the sender died");
    println!("receive failed: {err}");
    assert!(
        matches!(
            err.status(),
            Some(Status::ConnectionClosed) | Some(Status::ReadFailed)
        ),
        "{err}"
    );
    drop(ep);
    still_serves(&server, &sep, &client, &cep, 5);
    settle(&server, &base);
}
