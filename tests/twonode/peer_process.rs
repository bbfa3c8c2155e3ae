//! The peer process SIGKILLed across the wire, in each direction.

use super::pingpong_util::KillOnDrop;
use super::stream::*;
use super::*;

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
                        "peer_process::peer_process_killed_mid_rendezvous_fails_pending_requests_across_the_wire",
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
                .map(|i| ep.tag_send(9, pattern(LEN, i as u8)))
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
            let mut signal = SignalWatch::new(&asked);
            let deadline = Instant::now() + LONG;
            let reference = loop {
                w.progress();
                if let Some(seen) = signal.seen() {
                    break seen;
                }
                if !ep.is_connected() {
                    break signal.reference_for_failure();
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
        (0..MSGS).map(|i| pattern(LEN, i as u8)).collect()
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
