//! The peer node paused past the bound, and crashed.

use super::stream::*;
use super::*;

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
