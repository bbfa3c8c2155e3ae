//! Time inside accept spent on one peer's part of a setup (issue 48, the accept path): a
//! peer whose setup needs one more step from it — over shared memory the connector's
//! doorbell, after the TCP ACCEPT and the segment's hand-over — and that never takes it,
//! holds up no other connection: [`Listener::accept`] keeps it among the accepts under way
//! with a deadline (the connect timeout) and goes on answering. (Over RDMA the same holds
//! for a peer that never completes the CM's exchange: tests/device_hostile.rs, in the
//! Soft-RoCE guest.)

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rdmx::{Ep, Listener, Transport, CONNECT_TIMEOUT_VAR};

use super::shm_raw::{offer, RawSocket};
use super::{context, default_handshake, exchange, init_log, listening, LONG};

/// The victim's connect timeout: how long an accept under way may wait for its peer.
const VICTIM_TIMEOUT: Duration = Duration::from_secs(20);

/// `listener`'s accept loop in a thread of its own, handing over every endpoint it
/// accepts (as an application's accepting thread does).
fn accept_loop(listener: Arc<Listener>) -> mpsc::Receiver<Ep> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || loop {
        let ep = listener.accept().expect("accept");
        if tx.send(ep).is_err() {
            return;
        }
    });
    rx
}

/// A same-user process that offers shared memory, takes the segment handed over and never
/// sends its doorbell: the victim's accept waited for it up to the connect timeout (20 s
/// here), and a legitimate shared-memory client, whose own connect gives up after 3 s,
/// failed. Now the accept is kept under way (1, a segment and 2 descriptors: its TCP and
/// Unix sockets), the legitimate client connects and exchanges messages meanwhile, and at
/// its deadline the withheld one is dropped: its TCP connection closed, no accept left
/// under way.
#[test]
fn a_connector_withholding_its_doorbell_holds_up_no_other() {
    init_log();
    let victim_ms = VICTIM_TIMEOUT.as_millis().to_string();
    let ctx = context(Transport::Shm, &[(CONNECT_TIMEOUT_VAR, &victim_ms)]);
    let (server, listener, addr) = listening(&ctx);
    let listener = Arc::new(listener);
    let accepted = accept_loop(listener.clone());
    let base = server.stats();

    // The hostile connector: an offer naming its own socket, the hand-over taken, no doorbell.
    let unix = RawSocket::new();
    let probe: &'static u64 = Box::leak(Box::new(0x5eed_u64));
    let mut private = default_handshake().encode().to_vec();
    private.resize(rdmx::proto::MAX_HANDSHAKE_LEN, 0);
    private.extend_from_slice(&offer(0x7e57, probe, &unix.name));
    let asked = Instant::now();
    let hostile_tcp = rdmx_tcp::connect(&addr, &private, LONG).expect("the offer is accepted");
    let (hand_over, _) = unix.listener.accept().expect("the hand-over");
    let mut buf = [0u8; 64];
    let (n, fds) = rdmx_shm::fdpass::recv_with_fds(&hand_over, &mut buf).expect("hand-over");
    assert_eq!(
        (n, fds.len()),
        (32, 2),
        "the segment and the victim's doorbell"
    );

    // A legitimate client, whose connect gives up long before the victim's would.
    let client_ctx = context(Transport::Shm, &[(CONNECT_TIMEOUT_VAR, "3000")]);
    let client = client_ctx.worker().unwrap();
    let cep = client
        .connect(&addr)
        .expect("the legitimate client connects while the withheld accept is under way");
    let sep = accepted
        .recv_timeout(LONG)
        .expect("Listener::accept returns the legitimate client");
    assert_eq!(sep.transport(), Transport::Shm);
    exchange(&client, &cep, &server, &sep);
    assert!(
        asked.elapsed() < VICTIM_TIMEOUT,
        "all this happened before the withheld accept's deadline"
    );
    assert_eq!(
        listener.pending_accepts(),
        1,
        "the withheld accept is under way"
    );

    // At its deadline it is dropped: its TCP connection closes.
    let closed = closed_within(&hostile_tcp, VICTIM_TIMEOUT + LONG);
    println!(
        "withheld doorbell: accept dropped {:?} after the request",
        asked.elapsed()
    );
    assert!(closed, "the victim closed the withheld connection");
    assert!(asked.elapsed() >= VICTIM_TIMEOUT, "at its deadline");
    assert_eq!(listener.pending_accepts(), 0);
    drop((cep, sep));
    let deadline = Instant::now() + LONG;
    while server.stats().eps > base.eps || server.stats().connections > base.connections {
        assert!(
            Instant::now() < deadline,
            "the legitimate connection is never reaped"
        );
        server.progress();
        client.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    drop((hand_over, fds));
}

/// An accept under way whose peer does its part while no thread is in `accept` is set up by
/// the worker's progress (its peer may be sending already): a connector sends its doorbell
/// only after the one `accept` call, which returned another client, has returned; the
/// server's progress alone sets it up (no accept left under way), and the next `accept`
/// returns it at once, an endpoint that works.
#[test]
fn an_accept_under_way_is_set_up_by_the_workers_progress() {
    init_log();
    let ctx = context(Transport::Shm, &[(CONNECT_TIMEOUT_VAR, "20000")]);
    let (server, listener, addr) = listening(&ctx);
    let listener = Arc::new(listener);
    let (tx, rx) = mpsc::channel();
    let l = listener.clone();
    std::thread::spawn(move || tx.send(l.accept().expect("accept")));

    // A connector that holds its doorbell back for now.
    let unix = RawSocket::new();
    let probe: &'static u64 = Box::leak(Box::new(0x5eed_u64));
    let mut private = default_handshake().encode().to_vec();
    private.resize(rdmx::proto::MAX_HANDSHAKE_LEN, 0);
    private.extend_from_slice(&offer(0x1a7e, probe, &unix.name));
    let late_tcp = rdmx_tcp::connect(&addr, &private, LONG).expect("the offer is accepted");
    let (hand_over, _) = unix.listener.accept().expect("the hand-over");
    let mut buf = [0u8; 64];
    let (_, mut fds) = rdmx_shm::fdpass::recv_with_fds(&hand_over, &mut buf).expect("hand-over");

    // The one accept call returns another client.
    let client = context(Transport::Shm, &[]).worker().unwrap();
    let cep = client.connect(&addr).expect("a client connects");
    let sep = rx.recv_timeout(LONG).expect("accept returns the client");
    exchange(&client, &cep, &server, &sep);
    assert_eq!(
        listener.pending_accepts(),
        1,
        "the late connector's accept is under way"
    );

    // Now its doorbell; nobody is in accept: the worker's progress sets it up.
    let bell = rdmx_shm::Doorbell::new().expect("doorbell");
    rdmx_shm::fdpass::send_with_fds(&hand_over, b"RXSD", &[bell.fd()]).expect("the doorbell");
    let deadline = Instant::now() + LONG;
    while listener.pending_accepts() > 0 {
        assert!(
            Instant::now() < deadline,
            "the worker's progress never set it up"
        );
        server.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    let late = listener
        .accept()
        .expect("the next accept returns it at once");
    assert_eq!(late.transport(), Transport::Shm);
    assert!(late.is_connected());
    drop((late, late_tcp, hand_over, fds.pop(), bell));
}

/// Whether the peer of `link` closes it within `timeout` (its socket reads EOF).
fn closed_within(link: &rdmx_tcp::Link, timeout: Duration) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    use rustix::net::{recv, RecvFlags};
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let t = rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: left.subsec_nanos().into(),
        };
        let fd = link.fd();
        if poll(&mut [PollFd::new(&fd, PollFlags::IN)], Some(&t)).is_ok_and(|n| n > 0) {
            let mut b = [0u8; 1];
            match recv(fd, &mut b, RecvFlags::PEEK | RecvFlags::DONTWAIT) {
                Ok((0, _)) | Err(_) => return true,
                Ok(_) => return false,
            }
        }
    }
}
