//! Loopback tests of the listener's pending handshakes: silent, slow, malformed and many
//! connectors at once never hold up the one behind them; deadlines and the bound close
//! connections (and so release their descriptors).

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rdmx_tcp::{connect, Listener};

/// The connectors' timeout, and the legitimate one's.
const TIMEOUT: Duration = Duration::from_secs(10);
/// A hang guard: no wait loop of these tests takes longer (nothing is timed against it).
const LONG: Duration = Duration::from_secs(60);

fn listener() -> (Listener, String) {
    let listener = Listener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("local address").to_string();
    (listener, addr)
}

fn envelope(kind: u8, len: u32) -> Vec<u8> {
    let mut m = vec![kind, 0, 0, 0];
    m.extend_from_slice(&len.to_le_bytes());
    m
}

fn hello(data: &[u8]) -> Vec<u8> {
    let mut m = envelope(1, 6 + data.len() as u32);
    m.extend_from_slice(b"RXTC");
    m.extend_from_slice(&1u16.to_le_bytes());
    m.extend_from_slice(data);
    m
}

/// Calls `step` until it returns true; fails the test after [`LONG`].
fn run_until(what: &str, mut step: impl FnMut() -> bool) {
    let start = Instant::now();
    while !step() {
        assert!(start.elapsed() < LONG, "{what}: not done within {LONG:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A legitimate connector in a thread, and the listener's request from it, which must come
/// while whatever else is connected stays as it is.
fn legitimate(listener: &Listener, addr: &str, data: &'static [u8]) {
    let addr = addr.to_string();
    let client = std::thread::spawn(move || connect(&addr, data, TIMEOUT));
    let request = listener
        .get_request(Some(LONG))
        .expect("get_request: a failing connector is not the listener's error")
        .expect("the legitimate connector's request");
    assert_eq!(request.private_data(), data);
    request.accept(b"welcome").expect("accept");
    let link = client.join().unwrap().expect("the legitimate connect");
    assert_eq!(link.peer_private_data(), b"welcome");
}

/// Whether the listener closed `raw`: EOF or a reset, nothing else, within [`LONG`].
fn closed(raw: &mut TcpStream) -> bool {
    raw.set_read_timeout(Some(LONG)).unwrap();
    match raw.read(&mut [0u8; 64]) {
        Ok(0) => true,
        Err(e) => e.kind() == ErrorKind::ConnectionReset,
        Ok(n) => panic!("the listener sent {n} bytes to a connector it did not answer"),
    }
}

/// Whether `fd` polls readable within `timeout`.
fn readable(listener: &Listener, timeout: Duration) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let fd = listener.fd();
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let t = Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: timeout.subsec_nanos().into(),
    };
    poll(&mut fds, Some(&t)).expect("poll") == 1
}

/// The regression: a connection that sends nothing held `get_request` until its deadline,
/// and every connector behind it waited (and with no timeout, forever).
#[test]
fn a_silent_connection_does_not_hold_up_the_next() {
    let (listener, addr) = listener();
    let silent = TcpStream::connect(&addr).unwrap();
    assert!(listener
        .get_request(Some(Duration::ZERO))
        .expect("nothing failed")
        .is_none());
    legitimate(&listener, &addr, b"next");
    drop(silent);
}

/// Malformed HELLOs (bad magic, bad version, another kind, a body too long, garbage) and a
/// connector that closes before its HELLO are closed and logged, never the caller's error;
/// the next connector gets through.
#[test]
fn malformed_hellos_are_dropped_and_the_listener_goes_on() {
    let (listener, addr) = listener();
    let mut bad_magic = envelope(1, 6);
    bad_magic.extend_from_slice(b"XXXX\x01\x00");
    let mut bad_version = envelope(1, 6);
    bad_version.extend_from_slice(b"RXTC\x02\x00");
    let frame = envelope(4, 3);
    let too_long = envelope(1, 6 + 257);
    let garbage: Vec<u8> = (0..200u32).map(|i| (i * 97 + 13) as u8).collect();
    let mut raws = Vec::new();
    for bytes in [bad_magic, bad_version, frame, too_long, garbage] {
        let mut raw = TcpStream::connect(&addr).unwrap();
        raw.write_all(&bytes).unwrap();
        raws.push(raw);
    }
    drop(TcpStream::connect(&addr).unwrap());
    legitimate(&listener, &addr, b"after them");
    run_until("the malformed ones closed", || {
        assert!(listener
            .get_request(Some(Duration::ZERO))
            .unwrap()
            .is_none());
        listener.pending_handshakes() == 0
    });
    for raw in &mut raws {
        assert!(closed(raw));
    }
}

/// A HELLO dribbled a byte at a time is read as it comes, while other connectors get
/// through; one that has not all arrived by its deadline is closed.
#[test]
fn a_slow_hello_completes_or_expires_without_holding_anyone_up() {
    let (mut listener, addr) = listener();
    listener.set_handshake_timeout(Duration::from_millis(1500));
    let msg = hello(b"slowly");
    let mut slow = TcpStream::connect(&addr).unwrap();
    slow.set_nodelay(true).unwrap();
    let mut loris = TcpStream::connect(&addr).unwrap();
    loris.set_nodelay(true).unwrap();
    for (i, &b) in msg.iter().enumerate() {
        slow.write_all(&[b]).unwrap();
        if i < 10 {
            loris.write_all(&[b]).unwrap();
        }
        let got = listener.get_request(Some(Duration::ZERO)).unwrap();
        if i + 1 < msg.len() {
            assert!(
                got.is_none(),
                "a request from {} of {} bytes",
                i + 1,
                msg.len()
            );
            continue;
        }
        // (Its last byte may take a moment on loopback.)
        let request = match got {
            Some(r) => r,
            None => listener
                .get_request(Some(LONG))
                .unwrap()
                .expect("the slow HELLO"),
        };
        assert_eq!(request.private_data(), b"slowly");
    }
    assert_eq!(listener.pending_handshakes(), 1, "the loris");
    legitimate(&listener, &addr, b"meanwhile");
    // The loris's deadline: the listener's descriptor polls readable, and the call closes it.
    run_until("the loris expired", || {
        readable(&listener, LONG);
        assert!(listener
            .get_request(Some(Duration::ZERO))
            .unwrap()
            .is_none());
        listener.pending_handshakes() == 0
    });
    assert!(closed(&mut loris));
}

/// The descriptor polls readable only when there is something to do: not for idle pending
/// connections, but for a connection waiting, input on a pending one, and a deadline.
#[test]
fn the_descriptor_is_readable_only_with_work() {
    let (mut listener, addr) = listener();
    listener.set_handshake_timeout(Duration::from_secs(3600));
    assert!(!readable(&listener, Duration::ZERO));
    let mut silent = TcpStream::connect(&addr).unwrap();
    assert!(readable(&listener, LONG), "a connection waits");
    assert!(listener
        .get_request(Some(Duration::ZERO))
        .unwrap()
        .is_none());
    assert_eq!(listener.pending_handshakes(), 1);
    assert!(
        !readable(&listener, Duration::from_millis(50)),
        "an idle pending connection is nothing to do"
    );
    silent.write_all(&hello(b"late")).unwrap();
    assert!(readable(&listener, LONG), "its HELLO");
    let request = listener.get_request(Some(Duration::ZERO)).unwrap();
    assert_eq!(request.expect("the HELLO").private_data(), b"late");
    assert_eq!(listener.pending_handshakes(), 0);
    // A request taken is out of the listener's set: its input is the link's.
    silent.write_all(b"more").unwrap();
    assert!(!readable(&listener, Duration::from_millis(50)));

    listener.set_handshake_timeout(Duration::from_millis(100));
    let mut idle = TcpStream::connect(&addr).unwrap();
    assert!(listener
        .get_request(Some(Duration::ZERO))
        .unwrap()
        .is_none());
    assert_eq!(listener.pending_handshakes(), 1);
    assert!(readable(&listener, LONG), "its deadline");
    assert!(listener
        .get_request(Some(Duration::ZERO))
        .unwrap()
        .is_none());
    assert_eq!(listener.pending_handshakes(), 0);
    assert!(closed(&mut idle));
    assert!(!readable(&listener, Duration::from_millis(50)));
}

/// Past the bound, the oldest pending connection is closed for room: the pending count
/// never exceeds it, and a legitimate connector still gets through.
#[test]
fn the_bound_closes_the_oldest() {
    let (mut listener, addr) = listener();
    listener.set_max_pending(10);
    let mut silent: Vec<TcpStream> = (0..15)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    run_until("15 taken", || {
        assert!(listener
            .get_request(Some(Duration::ZERO))
            .unwrap()
            .is_none());
        assert!(listener.pending_handshakes() <= 10);
        // (The five oldest closed: their peers read EOF; the others did not.)
        silent[..5].iter_mut().all(|s| {
            s.set_nonblocking(true).unwrap();
            matches!(s.read(&mut [0u8; 8]), Ok(0))
        })
    });
    assert_eq!(listener.pending_handshakes(), 10);
    for s in &mut silent[5..] {
        s.set_nonblocking(true).unwrap();
        let e = s.read(&mut [0u8; 8]).expect_err("still pending");
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
    }
    legitimate(&listener, &addr, b"past the bound");
    // (Taken before its HELLO arrived, the legitimate connection was pending for a moment
    // and closed the oldest silent one for room.)
    let pending = listener.pending_handshakes();
    assert!(pending == 9 || pending == 10, "{pending}");
}

/// Many handshakes at once, each arriving in two halves in an order of their own: every
/// request comes out once with its own private data.
#[test]
fn many_handshakes_at_once() {
    const N: usize = 300;
    let (listener, addr) = listener();
    let mut raws: Vec<(TcpStream, Vec<u8>)> = (0..N)
        .map(|i| {
            let mut raw = TcpStream::connect(&addr).unwrap();
            raw.set_nodelay(true).unwrap();
            let msg = hello(format!("connector {i}").as_bytes());
            raw.write_all(&msg[..5 + i % 9]).unwrap();
            // (Taken as they come: a small kernel backlog must not drop connects.)
            assert!(listener
                .get_request(Some(Duration::ZERO))
                .unwrap()
                .is_none());
            (raw, msg)
        })
        .collect();
    run_until("all taken", || {
        assert!(listener
            .get_request(Some(Duration::ZERO))
            .unwrap()
            .is_none());
        listener.pending_handshakes() == N
    });
    // The second halves, from the last connector to the first.
    for (i, (raw, msg)) in raws.iter_mut().enumerate().rev() {
        raw.write_all(&msg[5 + i % 9..]).unwrap();
    }
    let mut seen = vec![false; N];
    for _ in 0..N {
        let request = listener
            .get_request(Some(LONG))
            .unwrap()
            .expect("a request");
        let text = std::str::from_utf8(request.private_data()).unwrap();
        let i: usize = text.strip_prefix("connector ").unwrap().parse().unwrap();
        assert!(!seen[i], "connector {i} twice");
        seen[i] = true;
        request.reject(b"").unwrap();
    }
    assert_eq!(listener.pending_handshakes(), 0);
    assert!(listener
        .get_request(Some(Duration::ZERO))
        .unwrap()
        .is_none());
}

/// With no timeout, a call waits for a complete HELLO however many connections idle
/// before it (the old listener waited on the first for ever: the call runs in a thread, so
/// that the test fails rather than hangs).
#[test]
fn no_timeout_waits_past_idle_connections() {
    let (listener, addr) = listener();
    let idle: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let got = listener.get_request(None).map(|r| {
            let r = r.expect("no timeout: a request");
            (r.private_data().to_vec(), r.accept(b""))
        });
        let _ = tx.send(got);
    });
    let client = connect(&addr, b"patient", TIMEOUT).expect("connect past the idle ones");
    let (data, link) = rx
        .recv_timeout(LONG)
        .expect("get_request(None) returned")
        .expect("get_request");
    assert_eq!(data, b"patient");
    link.expect("accept");
    assert!(client.peer_private_data().is_empty());
    drop(idle);
}
