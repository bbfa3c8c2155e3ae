//! Loopback tests of the links: handshake, frames, emulated RDMA READ, hostile input.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rdmx_tcp::{connect, Event, Link, MAX_PRIVATE_DATA};

mod common;
use common::*;

/// Flushes `from` until everything is written, while `to` polls into `events`, until `done`.
fn pump(from: &Link, to: &Link, events: &mut Vec<Event>, mut done: impl FnMut(&[Event]) -> bool) {
    run_until("pump", || {
        from.flush().expect("flush");
        to.poll(events).expect("poll");
        done(events)
    });
}

fn envelope(kind: u8, len: u32) -> Vec<u8> {
    let mut m = vec![kind, 0, 0, 0];
    m.extend_from_slice(&len.to_le_bytes());
    m
}

fn handshake_msg(kind: u8, data: &[u8]) -> Vec<u8> {
    let mut m = envelope(kind, 6 + data.len() as u32);
    m.extend_from_slice(b"RXTC");
    m.extend_from_slice(&1u16.to_le_bytes());
    m.extend_from_slice(data);
    m
}

/// A raw socket that completed the handshake with a listener, and the listener's link.
fn raw_pair() -> (TcpStream, Link) {
    let (listener, addr) = listener();
    let mut raw = TcpStream::connect(&addr).expect("raw connect");
    raw.set_nodelay(true).expect("nodelay");
    raw.write_all(&handshake_msg(1, b"raw"))
        .expect("send HELLO");
    let request = listener
        .get_request(Some(TIMEOUT))
        .expect("get_request")
        .expect("a request");
    assert_eq!(request.private_data(), b"raw");
    let link = request.accept(b"ok").expect("accept");
    let mut answer = [0u8; 16];
    raw.read_exact(&mut answer).expect("read ACCEPT");
    assert_eq!(answer.to_vec(), handshake_msg(2, b"ok"));
    (raw, link)
}

fn closed_reason(events: &[Event]) -> &str {
    match events {
        [Event::Closed { reason }] => reason,
        other => panic!("expected exactly one Closed event, got {other:?}"),
    }
}

// ---- 1. connect / accept / reject

#[test]
fn connect_accept_exchanges_private_data_both_ways() {
    let (listener, addr) = listener();
    let client = std::thread::spawn(move || connect(&addr, b"client-hello", TIMEOUT));
    let request = listener
        .get_request(Some(TIMEOUT))
        .unwrap()
        .expect("a request");
    assert_eq!(request.private_data(), b"client-hello");
    let server = request.accept(b"server-welcome").unwrap();
    let client = client.join().unwrap().unwrap();
    assert_eq!(client.peer_private_data(), b"server-welcome");
    assert_eq!(server.peer_private_data(), b"client-hello");
    assert_eq!(client.local_addr(), server.peer_addr());
    assert_eq!(client.peer_addr(), server.local_addr());
    assert_eq!(client.peer_addr(), listener.local_addr());
}

#[test]
fn private_data_limits() {
    let (listener, addr) = listener();
    let long = vec![7u8; MAX_PRIVATE_DATA + 1];
    let err = connect(&addr, &long, TIMEOUT).unwrap_err();
    assert!(!err.is_refused() && !err.is_timeout(), "{err}");
    assert!(err.to_string().contains("private data"), "{err}");

    let max = vec![9u8; MAX_PRIVATE_DATA];
    let sent = max.clone();
    let client = std::thread::spawn(move || connect(&addr, &sent, TIMEOUT));
    let request = listener
        .get_request(Some(TIMEOUT))
        .unwrap()
        .expect("a request");
    assert_eq!(request.private_data(), &max[..]);
    let server = request.accept(&max).unwrap();
    assert_eq!(
        client.join().unwrap().unwrap().peer_private_data(),
        &max[..]
    );
    assert_eq!(server.peer_private_data(), &max[..]);
}

#[test]
fn reject_is_refused_with_reason() {
    let (listener, addr) = listener();
    let client = std::thread::spawn(move || connect(&addr, b"let me in", TIMEOUT));
    let request = listener
        .get_request(Some(TIMEOUT))
        .unwrap()
        .expect("a request");
    assert_eq!(request.private_data(), b"let me in");
    request.reject(b"go away").unwrap();
    let err = client.join().unwrap().unwrap_err();
    assert!(err.is_refused(), "{err}");
    assert!(!err.is_timeout(), "{err}");
    assert_eq!(err.reject_data(), b"go away");
    assert_eq!(err.peer_addr(), listener.local_addr());
}

#[test]
fn connect_to_closed_port_is_refused() {
    let (listener, addr) = listener();
    drop(listener);
    // Refusal must be reported as such, not after the (long) timeout as a timeout.
    let err = connect(&addr, b"", Duration::from_secs(20)).unwrap_err();
    assert!(err.is_refused(), "{err}");
    assert!(!err.is_timeout(), "{err}");
    assert!(err.reject_data().is_empty());
}

#[test]
fn connect_to_silent_listener_times_out() {
    let (listener, addr) = listener();
    // The kernel completes the TCP handshake, but nobody ever answers the HELLO.
    let err = connect(&addr, b"anyone?", Duration::from_millis(300)).unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(!err.is_refused(), "{err}");
    drop(listener);
}

#[test]
fn get_request_without_connector_returns_none() {
    let (listener, _addr) = listener();
    assert!(listener
        .get_request(Some(Duration::ZERO))
        .unwrap()
        .is_none());
    assert!(listener
        .get_request(Some(Duration::from_millis(20)))
        .unwrap()
        .is_none());
}

// (What a listener does with silent, slow and malformed connectors: tests/listener.rs.)

// ---- 2. frames

#[test]
fn frames_round_trip_in_order_both_ways() {
    let (client, server) = pair();
    let sizes = [0usize, 1, 40, 8192, 1 << 20];
    let bodies: Vec<Vec<u8>> = sizes
        .iter()
        .map(|&n| (0..n).map(|i| (i * 31 + n) as u8).collect())
        .collect();
    for (from, to) in [(&client, &server), (&server, &client)] {
        for body in &bodies {
            // Split each body between frame and payload: the receiver sees their concatenation.
            let (frame, payload) = body.split_at(body.len() / 3);
            from.queue_frame(frame, payload);
        }
        let mut events = Vec::new();
        pump(from, to, &mut events, |ev| ev.len() >= bodies.len());
        let expected: Vec<Event> = bodies.iter().cloned().map(Event::Frame).collect();
        assert_eq!(events, expected);
        assert!(!from.wants_write());
    }
}

#[test]
fn ten_thousand_small_frames() {
    const N: u32 = 10_000;
    let (client, server) = pair();
    let frame = |i: u32| -> Vec<u8> {
        let mut f = i.to_le_bytes().to_vec();
        f.resize(4 + (i % 61) as usize, i as u8);
        f
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..N {
                let f = frame(i);
                client.queue_frame(&f[..2], &f[2..]);
                if i % 100 == 99 {
                    client.flush().expect("flush");
                }
            }
            run_until("flush everything", || client.flush().expect("flush"));
        });
        let mut events = Vec::new();
        run_until("receive all frames", || {
            server.poll(&mut events).expect("poll");
            events.len() >= N as usize
        });
        assert_eq!(events.len(), N as usize);
        for (i, ev) in events.iter().enumerate() {
            assert_eq!(ev, &Event::Frame(frame(i as u32)), "frame {i}");
        }
    });
}

#[test]
fn one_link_written_and_read_by_two_threads() {
    const N: usize = 2000;
    let (client, server) = pair();
    std::thread::scope(|s| {
        // The server echoes every frame back.
        s.spawn(|| {
            let mut echoed = 0;
            let mut events = Vec::new();
            run_until("echo", || {
                events.clear();
                server.poll(&mut events).expect("server poll");
                for ev in &events {
                    let Event::Frame(f) = ev else {
                        panic!("unexpected {ev:?}")
                    };
                    server.queue_frame(f, b"!");
                    echoed += 1;
                }
                server.flush().expect("server flush");
                echoed == N && !server.wants_write()
            });
        });
        // One thread writes on the client link while this one reads from it.
        s.spawn(|| {
            for i in 0..N {
                client.queue_frame(format!("msg {i}").as_bytes(), b"");
                client.flush().expect("client flush");
            }
            run_until("client flush", || client.flush().expect("client flush"));
        });
        let mut events = Vec::new();
        run_until("echoes", || {
            client.poll(&mut events).expect("client poll");
            events.len() >= N
        });
        for (i, ev) in events.iter().enumerate() {
            assert_eq!(ev, &Event::Frame(format!("msg {i}!").into_bytes()));
        }
    });
}

// ---- 3. rendezvous (emulated RDMA READ)

const BASE: u64 = 0x7f00_0000_0000;
const RKEY: u32 = 0x5eed;

/// Serves every ReadRequest of `events` from `src` (exposed at `BASE` under `RKEY`).
fn serve(link: &Link, src: &Arc<Vec<u8>>, events: &mut Vec<Event>, served: &mut usize) {
    for ev in events.drain(..) {
        let Event::ReadRequest {
            read_id,
            addr,
            rkey,
            len,
        } = ev
        else {
            panic!("unexpected event {ev:?}");
        };
        let offset = addr.wrapping_sub(BASE) as usize;
        if rkey == RKEY
            && offset
                .checked_add(len as usize)
                .is_some_and(|e| e <= src.len())
        {
            link.queue_read_data(read_id, true, Some((src.clone(), offset, len as usize)));
        } else {
            link.queue_read_data(read_id, false, None);
        }
        *served += 1;
    }
}

#[test]
fn rendezvous_reads_land_in_lent_buffer() {
    let (a, b) = pair();
    let total = (16 << 20) + 5;
    let src: Arc<Vec<u8>> = Arc::new((0..total).map(|i| (i ^ (i >> 9)) as u8).collect());
    b.lend(1, vec![0; total]);
    let c1 = 1000;
    let c2 = 8 << 20;
    let c3 = (3 << 20) + 7;
    let chunks = [
        (0, c1),
        (c1, c2),
        (c1 + c2, c3),
        (c1 + c2 + c3, total - (c1 + c2 + c3)),
    ];
    for (i, &(offset, len)) in chunks.iter().enumerate() {
        let read_id = 100 + i as u64;
        b.expect_read(read_id, 1, offset, len).unwrap();
        b.queue_read_request(read_id, BASE + offset as u64, RKEY, len as u64);
    }
    assert!(b.reclaim(1).is_none(), "reads are outstanding");

    let mut a_events = Vec::new();
    let mut b_events = Vec::new();
    let mut served = 0;
    let mut sent_after = false;
    run_until("rendezvous", || {
        b.flush().unwrap();
        a.poll(&mut a_events).unwrap();
        serve(&a, &src, &mut a_events, &mut served);
        if served == chunks.len() && !sent_after {
            // Ordering: a frame queued after the answers arrives after them.
            a.queue_frame(b"after", b"");
            sent_after = true;
        }
        a.flush().unwrap();
        b.poll(&mut b_events).unwrap();
        b_events.len() == chunks.len() + 1
    });
    let mut expected: Vec<Event> = (0..chunks.len() as u64)
        .map(|i| Event::ReadDone {
            read_id: 100 + i,
            ok: true,
        })
        .collect();
    expected.push(Event::Frame(b"after".to_vec()));
    assert_eq!(b_events, expected);
    let got = b.reclaim(1).expect("no read outstanding");
    assert!(got == *src, "received bytes differ from the source");
    assert!(b.reclaim(1).is_none(), "already reclaimed");
}

#[test]
fn failed_and_empty_reads() {
    let (a, b) = pair();
    let src = Arc::new(vec![0x11u8; 64]);
    b.lend(2, vec![0xAB; 64]);

    // Bad arguments are refused.
    assert!(b.expect_read(1, 99, 0, 1).is_err(), "unknown key");
    assert!(
        b.expect_read(1, 2, 60, 5).is_err(),
        "range outside the buffer"
    );
    assert!(
        b.expect_read(1, 2, usize::MAX, 2).is_err(),
        "overflowing range"
    );
    assert_eq!(
        b.reclaim(2).as_deref(),
        Some(&[0xAB; 64][..]),
        "nothing pending"
    );
    b.lend(2, vec![0xAB; 64]);

    b.expect_read(200, 2, 8, 16).unwrap();
    assert!(b.expect_read(200, 2, 0, 1).is_err(), "duplicate read id");
    b.expect_read(201, 2, 64, 0).unwrap();
    b.queue_read_request(200, BASE, 0xbad, 16); // wrong rkey: the owner answers failure
    b.queue_read_request(201, BASE, RKEY, 0);
    assert!(b.reclaim(2).is_none());

    let mut a_events = Vec::new();
    let mut b_events = Vec::new();
    let mut served = 0;
    run_until("failed read", || {
        b.flush().unwrap();
        a.poll(&mut a_events).unwrap();
        serve(&a, &src, &mut a_events, &mut served);
        a.flush().unwrap();
        b.poll(&mut b_events).unwrap();
        b_events.len() == 2
    });
    assert_eq!(
        b_events,
        vec![
            Event::ReadDone {
                read_id: 200,
                ok: false
            },
            Event::ReadDone {
                read_id: 201,
                ok: true
            },
        ]
    );
    assert_eq!(b.reclaim(2), Some(vec![0xAB; 64]), "buffer untouched");
}

#[test]
fn out_of_range_read_data_is_answered_with_failure() {
    let (a, b) = pair();
    b.lend(3, vec![0; 8]);
    b.expect_read(300, 3, 0, 8).unwrap();
    // The owner names a slice beyond its buffer: the link turns it into a failure.
    a.queue_read_data(300, true, Some((Arc::new(vec![1; 4]), 0, 8)));
    let mut events = Vec::new();
    pump(&a, &b, &mut events, |ev| !ev.is_empty());
    assert_eq!(
        events,
        vec![Event::ReadDone {
            read_id: 300,
            ok: false
        }]
    );
    assert_eq!(b.reclaim_all(), vec![(3, vec![0; 8])]);
}

#[test]
fn reclaim_all_takes_everything_back() {
    let (_a, b) = pair();
    b.lend(1, vec![1; 4]);
    b.lend(2, vec![2; 4]);
    b.expect_read(7, 1, 0, 4).unwrap();
    let mut all = b.reclaim_all();
    all.sort();
    assert_eq!(all, vec![(1, vec![1; 4]), (2, vec![2; 4])]);
    assert!(b.reclaim(1).is_none());
    // The expected read was forgotten.
    b.lend(1, vec![1; 4]);
    b.expect_read(7, 1, 0, 4).unwrap();
}

#[test]
fn shutdown_is_seen_as_eof() {
    let (a, b) = pair();
    a.queue_frame(b"last words", b"");
    a.flush().unwrap();
    a.shutdown();
    let events = events_until_closed(&b);
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0], Event::Frame(b"last words".to_vec()));
    assert_eq!(
        events[1],
        Event::Closed {
            reason: "the peer closed the connection".into()
        }
    );
    a.queue_frame(b"too late", b"");
    assert!(a.flush().is_err());
    assert!(a.flush().is_err(), "the output side stays dead");
    assert!(!a.wants_write());
}

#[test]
fn oversized_frame_fails_the_output_side() {
    let (a, _b) = pair();
    a.queue_frame(&vec![0; rdmx_tcp::MAX_FRAME_LEN], b"x");
    let err = a.flush().unwrap_err();
    assert!(err.to_string().contains("MAX_FRAME_LEN"), "{err}");
}

// ---- 4. hostile input

#[test]
fn hostile_unknown_kind() {
    let (mut raw, link) = raw_pair();
    let mut m = envelope(9, 4);
    m.extend_from_slice(b"abcd");
    raw.write_all(&m).unwrap();
    let events = events_until_closed(&link);
    let reason = closed_reason(&events);
    assert!(reason.contains("unknown message kind 9"), "{reason}");
}

#[test]
fn hostile_huge_frame() {
    let (mut raw, link) = raw_pair();
    let mut m = envelope(4, 1 << 30);
    m.extend_from_slice(&[0; 100]);
    raw.write_all(&m).unwrap();
    let events = events_until_closed(&link);
    let reason = closed_reason(&events);
    assert!(
        reason.contains("FRAME") && reason.contains("exceeds"),
        "{reason}"
    );
    // The link shut the socket down: the raw peer sees EOF (or a reset).
    let mut buf = [0u8; 16];
    assert!(matches!(raw.read(&mut buf), Ok(0) | Err(_)));
}

#[test]
fn hostile_unexpected_read_data() {
    let (mut raw, link) = raw_pair();
    let mut m = envelope(6, 16 + 4);
    m.extend_from_slice(&99u64.to_le_bytes());
    m.extend_from_slice(&[0; 8]);
    m.extend_from_slice(b"data");
    raw.write_all(&m).unwrap();
    let events = events_until_closed(&link);
    let reason = closed_reason(&events);
    assert!(reason.contains("unexpected READ_DATA"), "{reason}");
}

#[test]
fn hostile_read_data_length_mismatch() {
    let (mut raw, link) = raw_pair();
    link.lend(1, vec![0; 32]);
    link.expect_read(5, 1, 0, 10).unwrap();
    let mut m = envelope(6, 16 + 4);
    m.extend_from_slice(&5u64.to_le_bytes());
    m.extend_from_slice(&[0; 8]);
    m.extend_from_slice(b"data");
    raw.write_all(&m).unwrap();
    let events = events_until_closed(&link);
    let reason = closed_reason(&events);
    assert!(reason.contains("carries 4 bytes, 10 expected"), "{reason}");
    assert_eq!(link.reclaim_all(), vec![(1, vec![0; 32])]);
}

#[test]
fn hostile_nonzero_reserved_bytes() {
    let (mut raw, link) = raw_pair();
    raw.write_all(&[4, 0, 1, 0, 0, 0, 0, 0]).unwrap();
    let events = events_until_closed(&link);
    let reason = closed_reason(&events);
    assert!(reason.contains("reserved"), "{reason}");
}

#[test]
fn hostile_handshake_after_handshake() {
    let (mut raw, link) = raw_pair();
    raw.write_all(&handshake_msg(1, b"again")).unwrap();
    let events = events_until_closed(&link);
    let reason = closed_reason(&events);
    assert!(reason.contains("unexpected HELLO"), "{reason}");
}

#[test]
fn dribbled_frame_still_parses() {
    let (mut raw, link) = raw_pair();
    let body: Vec<u8> = (0..100u8).collect();
    let mut m = envelope(4, body.len() as u32);
    m.extend_from_slice(&body);
    let mut events = Vec::new();
    for b in &m {
        raw.write_all(std::slice::from_ref(b)).unwrap();
        link.poll(&mut events).unwrap();
    }
    run_until("dribbled frame", || {
        link.poll(&mut events).unwrap();
        !events.is_empty()
    });
    assert_eq!(events, vec![Event::Frame(body)]);
    // The parser is back at a message boundary: a second frame parses too.
    let mut m = envelope(4, 2);
    m.extend_from_slice(b"ok");
    raw.write_all(&m).unwrap();
    events.clear();
    run_until("second frame", || {
        link.poll(&mut events).unwrap();
        !events.is_empty()
    });
    assert_eq!(events, vec![Event::Frame(b"ok".to_vec())]);
    drop(raw);
    let events = events_until_closed(&link);
    assert_eq!(closed_reason(&events), "the peer closed the connection");
}

#[test]
fn eof_mid_header() {
    let (mut raw, link) = raw_pair();
    raw.write_all(&[4, 0, 0]).unwrap();
    raw.shutdown(Shutdown::Write).unwrap();
    let events = events_until_closed(&link);
    let reason = closed_reason(&events);
    assert!(
        reason.contains("mid-header") && reason.contains("3 of 8"),
        "{reason}"
    );
}

#[test]
fn eof_mid_frame_body() {
    let (mut raw, link) = raw_pair();
    let mut m = envelope(4, 10);
    m.extend_from_slice(b"abc");
    raw.write_all(&m).unwrap();
    raw.shutdown(Shutdown::Write).unwrap();
    let events = events_until_closed(&link);
    let reason = closed_reason(&events);
    assert!(reason.contains("FRAME body (3 of 10 bytes)"), "{reason}");
}

// ---- 5. thread safety

#[test]
fn link_is_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Link>();
    send_sync::<rdmx_tcp::Listener>();
    send_sync::<rdmx_tcp::ConnectionRequest>();
    send_sync::<rdmx_tcp::Error>();
}

// ---- buffer reuse

/// A recycled frame buffer carries the next frame, and nothing of the one before: a long
/// frame, recycled, then a short one, then an empty one arrive exactly as sent; buffers of
/// another size or a link's first frames come from the allocator as before.
#[test]
fn recycled_frame_buffers_carry_only_the_next_frame() {
    let (a, b) = pair();
    let mut events = Vec::new();
    a.queue_frame(&[1; 40], &[2; 1000]);
    pump(&a, &b, &mut events, |e| e.len() == 1);
    let Some(Event::Frame(first)) = events.pop() else {
        panic!("expected a frame")
    };
    assert_eq!(first.len(), 1040);
    let capacity = first.capacity();
    b.recycle(first);
    a.queue_frame(b"short", b"!");
    pump(&a, &b, &mut events, |e| e.len() == 1);
    let Some(Event::Frame(second)) = events.pop() else {
        panic!("expected a frame")
    };
    assert_eq!(second, b"short!");
    assert_eq!(
        second.capacity(),
        capacity,
        "the recycled buffer was reused"
    );
    b.recycle(second);
    a.queue_frame(b"", b"");
    pump(&a, &b, &mut events, |e| e.len() == 1);
    assert!(matches!(events.pop(), Some(Event::Frame(f)) if f.is_empty()));
    // A buffer too large to keep is dropped, not reused.
    b.recycle(Vec::with_capacity(1 << 20));
    a.queue_frame(b"x", b"");
    pump(&a, &b, &mut events, |e| e.len() == 1);
    let Some(Event::Frame(third)) = events.pop() else {
        panic!("expected a frame")
    };
    assert_eq!(third, b"x");
    assert!(third.capacity() < 1 << 20);
}

/// The keepalive bounds how long a dead peer of an idle connection goes unnoticed: probes
/// after an idle interval (rounded up to whole seconds), then every interval, 3 of them —
/// read back from the socket. No user timeout: Linux counts a zero window against it, so a
/// peer slow to read would be cut off.
#[test]
fn keepalive_sets_the_sockets_probes_and_user_timeout() {
    use rustix::net::sockopt;
    let (client, server) = pair();
    assert!(
        !sockopt::socket_keepalive(client.fd()).unwrap(),
        "off by default"
    );
    client
        .set_keepalive(Duration::from_millis(1500))
        .expect("set");
    server
        .set_keepalive(Duration::from_millis(10))
        .expect("set");
    let fd = client.fd();
    assert!(sockopt::socket_keepalive(fd).unwrap());
    assert_eq!(sockopt::tcp_keepidle(fd).unwrap(), Duration::from_secs(2));
    assert_eq!(sockopt::tcp_keepintvl(fd).unwrap(), Duration::from_secs(2));
    assert_eq!(sockopt::tcp_keepcnt(fd).unwrap(), 3);
    assert_eq!(
        sockopt::tcp_user_timeout(fd).unwrap(),
        0,
        "the kernel's default"
    );
    // Under a second: one second, the kernel's unit.
    assert_eq!(
        sockopt::tcp_keepidle(server.fd()).unwrap(),
        Duration::from_secs(1)
    );
}
