//! Many connections on one event channel: no descriptor each, and each gets only its own
//! events.

use std::collections::HashSet;

use super::*;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Waits until the channel reports a connection with events; returns their tokens.
fn ready(events: &EventChannel) -> HashSet<u64> {
    let deadline = Instant::now() + LONG;
    let mut tokens = Vec::new();
    loop {
        events.take_ready(&mut tokens).unwrap();
        if !tokens.is_empty() {
            return tokens.into_iter().collect();
        }
        assert!(Instant::now() < deadline, "no connection got an event");
        thread::sleep(Duration::from_millis(5));
    }
}

/// 32 connections, connected from 4 threads at once on the client's one channel (each
/// waiting for its own ESTABLISHED) and accepted on the server's: the process holds not one
/// descriptor more (nextest, as the guest runs it, gives each test a process of its own).
/// Then the client closes some: exactly their server connections get DISCONNECTED —
/// reported by their tokens, and to threads waiting for them at once — and no other
/// connection gets anything. Torn down in any order, the channels close with their last id.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn connections_share_one_event_channel_and_get_only_their_own_events() {
    const N: usize = 32;
    let ip = addr_a();
    let server = Verbs::new(ip, Some(64), false);
    let client = Verbs::new(ip, None, false);
    let (listener, addr) = listen(ip);
    let before = open_fds();
    let connecting: Vec<_> = (0..4)
        .map(|_| {
            let config = client.config();
            thread::spawn(move || {
                (0..N / 4)
                    .map(|_| connect(&dst(addr), &config, b"", LONG).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let config = server.config();
    let mut server_conns: Vec<Connection> = (0..N)
        .map(|_| {
            let request = listener
                .get_request(Some(LONG))
                .unwrap()
                .expect("a request");
            request.accept(&config, b"", LONG).unwrap()
        })
        .collect();
    let client_conns: Vec<Connection> = connecting
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert_eq!(
        open_fds(),
        before,
        "{N} connections each way cost no descriptor"
    );
    // Pair them up by address: the server's peer is the client's local address.
    server_conns.sort_by_key(|c| c.peer_addr());
    let mut client_conns = client_conns;
    client_conns.sort_by_key(|c| c.local_addr());
    for (i, (s, c)) in server_conns.iter().zip(&client_conns).enumerate() {
        assert_eq!(s.peer_addr(), c.local_addr());
        s.set_event_token(i as u64 + 1);
    }
    let mut none = Vec::new();
    server.events.take_ready(&mut none).unwrap();
    assert!(none.is_empty(), "no events yet: {none:?}");

    // One closes: only its server connection hears of it.
    let mut client_conns: Vec<Option<Connection>> = client_conns.into_iter().map(Some).collect();
    drop(client_conns[5].take());
    assert_eq!(ready(&server.events), HashSet::from([6]));
    let event = server_conns[5]
        .next_event(Some(LONG))
        .unwrap()
        .expect("an event");
    assert_eq!(
        event.kind,
        CmEventKind::DISCONNECTED,
        "{}",
        event.kind.name()
    );

    // Two threads wait at once, each for its own connection's event, while two close.
    thread::scope(|scope| {
        let waiting: Vec<_> = [10, 11]
            .map(|i| {
                let conn = &server_conns[i];
                scope.spawn(move || conn.next_event(Some(LONG)).unwrap().expect("an event"))
            })
            .into_iter()
            .collect();
        thread::sleep(Duration::from_millis(200));
        drop(client_conns[10].take());
        drop(client_conns[11].take());
        for w in waiting {
            assert_eq!(w.join().unwrap().kind, CmEventKind::DISCONNECTED);
        }
    });
    for (i, conn) in server_conns.iter().enumerate() {
        if ![5, 10, 11].contains(&i) {
            assert!(
                conn.next_event(Some(Duration::ZERO)).unwrap().is_none(),
                "connection {i} got another's event"
            );
        }
    }
    // Torn down in any order: each id leaves the channel before it is destroyed.
    drop(server);
    drop(config);
    drop(listener);
    server_conns.truncate(N / 2);
    drop(client_conns);
    drop(server_conns);
    assert_eq!(
        open_fds(),
        before - 2,
        "the listener's and the server's channels closed with their last ids"
    );
}
