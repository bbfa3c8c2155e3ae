//! The shared-memory transport: connections between processes on one host, over
//! `rdmx-shm`'s rings, with rendezvous data read straight from the sender's memory by CMA
//! (`process_vm_readv`) — the receiver pulls, as RDMA READ does.
//!
//! A connection starts over TCP (the user connects to `host:port` as always). The connector
//! offers shared memory in its handshake ([`setup`]); an acceptor on the same host (same
//! boot, user and namespaces) answers by handing the connection's
//! segment and its doorbell over the connector's Unix socket (one per worker, which only its
//! user can reach: see `handover`), and both sides then drop the TCP socket: the
//! Unix socket stays only to tell when the peer is gone (its hang-up). Where any check
//! fails, the connection stays TCP, or is refused when TCP is not in the transports.
//!
//! Frames: each connection has a ring each way in its segment ([`rdmx_shm::channel`]). A
//! worker polls its connections' receive rings on every progress call ([`ShmIface`]) — no
//! system call per frame — and sleeps in event mode on its one doorbell, which peers ring
//! only while it says it may sleep.
//!
//! Rendezvous: each side probes at connect whether the kernel lets it read the peer by CMA
//! (`yama/ptrace_scope` or another user can forbid it; `RDMX_SHM_CMA=0` does). Where it may
//! not, its READs are copied through the rings instead: see `copy`.

mod copy;
mod handover;
#[cfg(test)]
mod hostile_tests;
mod iface;
mod link;
mod outbox;
pub(crate) mod setup;

pub(crate) use iface::{ShmIface, ShmRings};
pub(crate) use link::{Parts as ShmParts, ShmLink};

/// Bytes of each ring (one each way per connection). Frames that find it full wait in the
/// link and go at the next progress.
pub(crate) const RING_CAPACITY: usize = 256 << 10;

/// The credits each side of a shared-memory connection grants the other: a fixed window
/// (not from the worker's pool of receive buffers, which a ring does not use), as many
/// frames as the ring holds at 256 bytes each — so a stream of small messages never waits
/// for credits while the peer keeps up, and one of large eager frames waits for room in the
/// ring instead. The peer returns them as it takes frames out of the ring: a CREDIT frame
/// per quarter window (256 frames) when it sends nothing else.
pub(crate) const WINDOW: u16 = (RING_CAPACITY / 256) as u16;
