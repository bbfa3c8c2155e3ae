//! The suite's two-sided tests (`rdmx-two-sided`): a server side and a client side written
//! once, run a thread each in one process (the host's TCP suite and the one-guest RDMA suite)
//! or one side per node across the wire of `scripts/softroce-twonode` (`tests/twonode_api.rs`).
//! Here they get their rdmx endpoints: [`Endpoints`] on a [`Peer`].

use super::*;

pub use rdmx_two_sided::{Peer, Side, Sides};

/// Runs the two-sided test `test`: `body` once per side, where [`crate::net`] says, every wait
/// for the other side bounded by [`long`].
pub fn two_sided(test: &'static str, body: impl Fn(&Peer) + Sync) {
    init_log();
    rdmx_two_sided::two_sided(test, crate::net().sides, long(), body);
}

/// A side's rdmx endpoints to the other side.
pub trait Endpoints {
    /// This side's worker and its `n` endpoints to the other side, in connection order: the
    /// server's worker listens and accepts `n`, the client's connects `n` times.
    fn endpoints(&self, ctx: &Context, n: usize) -> (Worker, Vec<Ep>);
    /// [`Endpoints::endpoints`] with `w`'s worker.
    fn endpoints_of(&self, w: &Worker, n: usize) -> Vec<Ep>;
    /// The server's next listener, on `w` (server side only): the address the client's
    /// next [`Peer::server_addr`] names.
    fn listen(&self, w: &Worker) -> rdmx::Listener;
    /// `w` connects to `addr`, retrying while the server is not listening yet.
    fn connect(&self, w: &Worker, addr: &str) -> Ep;
}

impl Endpoints for Peer<'_> {
    fn endpoints(&self, ctx: &Context, n: usize) -> (Worker, Vec<Ep>) {
        let w = new_worker(ctx);
        let eps = self.endpoints_of(&w, n);
        (w, eps)
    }

    fn endpoints_of(&self, w: &Worker, n: usize) -> Vec<Ep> {
        if self.is_server() {
            let listener = Endpoints::listen(self, w);
            return accept_n(&listener, n, &format!("{}: {n} endpoints", self.test()));
        }
        let addr = self.server_addr();
        (0..n).map(|_| Endpoints::connect(self, w, &addr)).collect()
    }

    fn listen(&self, w: &Worker) -> rdmx::Listener {
        let listener = w.listen(&self.listen_addr(&addr_a())).expect("listen");
        self.listening(listener.local_addr().expect("bound"));
        listener
    }

    fn connect(&self, w: &Worker, addr: &str) -> Ep {
        connect_retrying(w, addr)
    }
}

/// `w` connects to `addr`, retrying within [`long`] while the server is not listening yet
/// (across nodes nothing tells a client when it is).
pub fn connect_retrying(w: &Worker, addr: &str) -> Ep {
    rdmx_two_sided::retry(&format!("connect to {addr}"), long(), || w.connect(addr))
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
