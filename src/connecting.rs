//! Connecting without blocking the caller: [`Worker::connect_nb`] and its future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::ep::Ep;
use crate::error::Result;
use crate::worker::Worker;

/// A connection being set up, made by [`Worker::connect_nb`]: a future of the endpoint (or
/// of the error [`Worker::connect`] would have returned), or [`Connecting::wait`] for it.
///
/// Setting a connection up is a chain of blocking steps on every transport — resolving
/// the address (`getaddrinfo` has no nonblocking form), TCP's connect and HELLO/ACCEPT
/// exchange, rdmacm's resolve/connect round trips, the shared-memory hand-over — each
/// bounded by the connect timeout. [`Worker::connect_nb`] runs that chain on a thread of a
/// pool made for blocking calls in async programs (the `blocking` crate's, which grows to
/// as many threads as there are setups under way, up to 500, and lets idle ones go), so
/// that the caller's thread or task never waits on a peer: many connections are set up at
/// once, each in about its own time, and a dead address costs only its own future. What the
/// future yields is what [`Worker::connect`] returns. The future is runtime-agnostic: the
/// pool's thread wakes the awaiting task.
///
/// Dropping it before it is ready abandons the connection: the setup runs to its end on
/// its thread, and an endpoint it makes is closed at once (the peer sees it close).
#[must_use = "the connection is closed when this is dropped before it is ready"]
pub struct Connecting {
    task: blocking::Task<Result<Ep>>,
}

impl Worker {
    /// Starts connecting to a listener at `addr` (`"host:port"`), nonblocking, as
    /// [`Worker::connect`] does (the same transports tried in the same order, the same
    /// connect timeout, `RDMX_CONNECT_TIMEOUT_MS`, per transport). The setup runs off the
    /// caller's thread (see [`Connecting`]); await the [`Connecting`]
    /// or [`Connecting::wait`] for it.
    pub fn connect_nb(&self, addr: &str) -> Connecting {
        let (worker, addr) = (self.clone(), addr.to_string());
        Connecting {
            task: blocking::unblock(move || worker.connect(&addr)),
        }
    }
}

impl Connecting {
    /// Whether the setup has ended (awaiting it is then ready at once).
    pub fn is_done(&self) -> bool {
        self.task.is_finished()
    }

    /// Blocks the calling thread until the setup ends: what [`Worker::connect`] returns.
    pub fn wait(self) -> Result<Ep> {
        futures_lite::future::block_on(self)
    }
}

impl Future for Connecting {
    type Output = Result<Ep>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Ep>> {
        Pin::new(&mut self.get_mut().task).poll(cx)
    }
}

impl std::fmt::Debug for Connecting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connecting")
            .field("done", &self.is_done())
            .finish()
    }
}
