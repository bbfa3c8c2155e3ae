//! What the links' test targets share: loopback pairs and bounded waits.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use rdmx_tcp::{connect, Event, Link, Listener};

/// Overall bound of every wait loop; exceeding it fails the test.
pub const DEADLINE: Duration = Duration::from_secs(30);
/// How long a connect or accept may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Link>();
};

/// Calls `step` until it returns true; fails the test after [`DEADLINE`].
pub fn run_until(what: &str, mut step: impl FnMut() -> bool) {
    let start = Instant::now();
    loop {
        if step() {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{what}: not done within {DEADLINE:?}"
        );
        std::thread::yield_now();
    }
}

pub fn listener() -> (Listener, String) {
    let listener = Listener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("local address").to_string();
    (listener, addr)
}

/// A connected pair: (connector's link, acceptor's link).
pub fn pair() -> (Link, Link) {
    let (listener, addr) = listener();
    let client = std::thread::spawn(move || connect(&addr, b"client", TIMEOUT));
    let request = listener
        .get_request(Some(TIMEOUT))
        .expect("get_request")
        .expect("a request");
    let server = request.accept(b"server").expect("accept");
    let client = client.join().expect("connector panicked").expect("connect");
    (client, server)
}

/// Polls `link` until it reports `Closed`; checks the link stays dead afterwards.
pub fn events_until_closed(link: &Link) -> Vec<Event> {
    let mut events = Vec::new();
    run_until("wait for Closed", || {
        link.poll(&mut events).expect("poll");
        matches!(events.last(), Some(Event::Closed { .. }))
    });
    let mut more = Vec::new();
    assert_eq!(link.poll(&mut more).expect("poll after Closed"), 0);
    assert!(more.is_empty());
    events
}
