//! Tests with two sides, a server and a client, written once and run two ways: both sides in
//! one process, a thread each (the host's TCP suite and the one-guest RDMA suite), or one side
//! per node across the wire of `scripts/softroce-twonode` (node A the server, node B the
//! client, `tests/twonode.rs`). A test body is one function of the [`Peer`] it is: it asks
//! the peer for its endpoints and meets the other side at barriers, and says by
//! [`Peer::is_server`] which half it plays. Neither side touches the other's objects, so
//! whatever crosses between them crosses the transport.

use std::sync::{Condvar, Mutex};

use super::*;

/// Which half of a two-sided test a process or thread plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Listens and accepts.
    Server,
    /// Connects.
    Client,
}

/// Where a test binary runs the two sides of its tests.
#[allow(dead_code)] // each binary constructs one of them
pub enum Sides {
    /// Both in this process, a thread each.
    Threads,
    /// This process is one side; the other runs on the other node, whose barriers are the
    /// runner's (`twonode barrier`).
    Nodes {
        /// This node's side.
        me: Side,
        /// The server node's address.
        server_ip: String,
    },
}

/// One side of a running two-sided test.
pub struct Peer<'a> {
    side: Side,
    test: &'static str,
    meet: Meet<'a>,
    /// Barriers and listeners of this side so far (both sides count alike).
    barriers: std::cell::Cell<u32>,
    listeners: std::cell::Cell<u16>,
}

enum Meet<'a> {
    Threads(&'a Shared),
    Nodes { server_ip: String },
}

/// What the two threads of a test share: the server's listening address, barrier counts,
/// and whether a side failed (so that the other stops waiting for it).
#[derive(Default)]
struct Shared {
    state: Mutex<SharedState>,
    changed: Condvar,
}

#[derive(Default)]
struct SharedState {
    addrs: Vec<String>,
    arrived: [u32; 2],
    failed: bool,
}

impl Shared {
    /// Waits until `ready` holds, failing if the other side failed or after [`long`].
    fn wait_until(&self, what: &str, mut ready: impl FnMut(&SharedState) -> bool) {
        let deadline = Instant::now() + long();
        let mut st = self.state.lock().unwrap();
        while !ready(&st) {
            assert!(!st.failed, "{what}: the other side failed");
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{what}: the other side did not come within {:?}",
                long()
            );
            st = self.changed.wait_timeout(st, left).unwrap().0;
        }
    }

    fn update(&self, f: impl FnOnce(&mut SharedState)) {
        f(&mut self.state.lock().unwrap());
        self.changed.notify_all();
    }
}

/// Runs the two-sided test `test`: `body` once per side, where [`crate::net`] says.
pub fn two_sided(test: &'static str, body: impl Fn(&Peer) + Sync) {
    init_log();
    match crate::net().sides {
        Sides::Nodes { me, server_ip } => body(&Peer::new(me, test, Meet::Nodes { server_ip })),
        Sides::Threads => {
            let shared = Shared::default();
            let run = |side: Side| {
                let peer = Peer::new(side, test, Meet::Threads(&shared));
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&peer)));
                if r.is_err() {
                    shared.update(|st| st.failed = true);
                }
                r
            };
            let (server, client) = thread::scope(|s| {
                let client = thread::Builder::new()
                    .name(format!("{test}: client"))
                    .spawn_scoped(s, || run(Side::Client))
                    .expect("the client's thread");
                (run(Side::Server), client.join().expect("client thread"))
            });
            // The first side to fail is the one whose message matters.
            if let Err(panic) = server.and(client) {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

impl<'a> Peer<'a> {
    fn new(side: Side, test: &'static str, meet: Meet<'a>) -> Peer<'a> {
        Peer {
            side,
            test,
            meet,
            barriers: 0.into(),
            listeners: 0.into(),
        }
    }

    /// Whether this side is the server.
    pub fn is_server(&self) -> bool {
        self.side == Side::Server
    }

    /// Waits until the other side reached its barrier of the same number.
    pub fn barrier(&self) {
        let n = self.barriers.get() + 1;
        self.barriers.set(n);
        let what = format!("{}: barrier {n}", self.test);
        match &self.meet {
            Meet::Threads(shared) => {
                let me = self.side as usize;
                shared.update(|st| st.arrived[me] = n);
                shared.wait_until(&what, |st| st.arrived[1 - me] >= n);
            }
            Meet::Nodes { .. } => {
                let name = format!("{}-{n}", self.test);
                let secs = long().as_secs().to_string();
                let out = std::process::Command::new("twonode")
                    .args(["barrier", &name, &secs])
                    .output()
                    .expect("the twonode helper (on PATH under scripts/softroce-twonode)");
                assert!(out.status.success(), "{what}: the other node did not come");
            }
        }
    }

    /// This side's worker and its `n` endpoints to the other side, in connection order: the
    /// server's worker listens and accepts `n`, the client's connects `n` times.
    pub fn endpoints(&self, ctx: &Context, n: usize) -> (Worker, Vec<Ep>) {
        let w = new_worker(ctx);
        let eps = self.endpoints_of(&w, n);
        (w, eps)
    }

    /// [`Peer::endpoints`] with `w`'s worker (a second set of endpoints of one worker).
    pub fn endpoints_of(&self, w: &Worker, n: usize) -> Vec<Ep> {
        if self.is_server() {
            let listener = self.listen(w);
            return accept_n(&listener, n, &format!("{}: {n} endpoints", self.test));
        }
        let addr = self.server_addr();
        (0..n).map(|_| self.connect(w, &addr)).collect()
    }

    /// The server's next listener, on `w` (server side only): the address the client's
    /// next [`Peer::server_addr`] names.
    pub fn listen(&self, w: &Worker) -> rdmx::Listener {
        assert!(self.is_server(), "only the server listens");
        let k = self.next_listener();
        match &self.meet {
            Meet::Threads(shared) => {
                let listener = w.listen(&format!("{}:0", addr_a())).expect("listen");
                let addr = listener.local_addr().expect("bound").to_string();
                shared.update(|st| st.addrs.push(addr));
                listener
            }
            Meet::Nodes { server_ip } => w
                .listen(&format!("{server_ip}:{}", self.port(k)))
                .expect("listen"),
        }
    }

    /// The address of the server's next listener (client side only).
    pub fn server_addr(&self) -> String {
        assert!(!self.is_server(), "the client connects");
        let k = self.next_listener();
        match &self.meet {
            Meet::Threads(shared) => {
                let what = format!("{}: listener {k}", self.test);
                shared.wait_until(&what, |st| st.addrs.len() > usize::from(k));
                shared.state.lock().unwrap().addrs[usize::from(k)].clone()
            }
            Meet::Nodes { server_ip } => format!("{server_ip}:{}", self.port(k)),
        }
    }

    /// `w` connects to `addr`: [`connect_retrying`].
    pub fn connect(&self, w: &Worker, addr: &str) -> Ep {
        connect_retrying(w, addr)
    }

    fn next_listener(&self) -> u16 {
        let k = self.listeners.get();
        self.listeners.set(k + 1);
        k
    }

    /// The port of this test's listener `k` across nodes: its own for every test and
    /// listener (a client retrying to connect must never reach another test's listener).
    fn port(&self, k: u16) -> u16 {
        let hash = self.test.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        20_000 + (hash % 4_000) as u16 * 8 + k
    }
}

/// `w` connects to `addr`, retrying within [`long`] while the server is not listening yet
/// (across nodes nothing tells a client when it is).
pub fn connect_retrying(w: &Worker, addr: &str) -> Ep {
    let deadline = Instant::now() + long();
    loop {
        match w.connect(addr) {
            Ok(ep) => return ep,
            Err(e) if Instant::now() < deadline => {
                log::debug!("connect to {addr}: {e}; retrying");
                thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("cannot connect to {addr}: {e}"),
        }
    }
}

/// Accepts `n` connection requests on `listener`, each within [`long`].
pub fn accept_n(listener: &rdmx::Listener, n: usize, what: &str) -> Vec<Ep> {
    (0..n)
        .map(|i| {
            listener
                .next_request(Some(long()))
                .expect("a connection request")
                .unwrap_or_else(|| {
                    panic!("{what}: connection {i} did not come within {:?}", long())
                })
                .accept()
                .expect("accept")
        })
        .collect()
}
