//! Safe wrappers over rdmacm and verbs for rdmx.
//!
//! - [`AddrInfo`]: `rdma_getaddrinfo` for either side, from `"host:port"` or a `SocketAddr`.
//! - [`Listener`] → [`ConnectionRequest`] → [`ConnectionRequest::accept`] / `reject`, and
//!   [`connect`]: rdmacm connections, made asynchronous on an [`EventChannel`] so every wait
//!   has a deadline; [`ConnectionRequest::accept_start`] accepts without waiting (an
//!   [`Accepting`], established when its listener's channel says so), so that a listener
//!   never waits on one peer. A worker's connections share one channel (named by [`QpConfig::events`]),
//!   as UCX's do: a connection costs no file descriptor of its own; each gets only its own
//!   events ([`Connection::next_event`]), and [`EventChannel::take_ready`] says which have
//!   some.
//! - [`ProtectionDomain`], [`CompletionQueue`] (with an optional completion channel and the
//!   classic arm/re-poll/sleep loop in [`CompletionQueue::wait`]), [`SharedReceiveQueue`]:
//!   many connections of one worker share one of each, through [`QpConfig`].
//! - [`RegisteredBuf`]: registered memory with exclusive ownership; posting moves a buffer into
//!   the CQ's table of pending work and its [`Completion`] hands it back, so the NIC never touches
//!   memory the user can reach, free or reuse. [`ProtectionDomain::register_vec`] registers a
//!   caller's `Vec<u8>` in place (zero-copy) and [`RegisteredBuf::into_vec`] gives it back.
//! - [`MemoryWindow`]: remote READ of one byte range, for one connection's QP only, while it
//!   is bound ([`Connection::post_bind`]); regions registered with [`Access::WINDOW_READ`]
//!   grant nothing remotely by their own rkey.
//! - [`Poller`] (epoll) and [`Waker`] (eventfd): one thread sleeps on many CQ channels
//!   ([`CompletionQueue::event_fd`], then [`CompletionQueue::take_events`]) and rdmacm channels
//!   ([`EventChannel::event_fd`], [`Listener::event_fd`]), and other threads can wake it.
//!
//! Teardown order is enforced by ownership: a connection holds its PD, CQ and SRQ; an SRQ holds
//! its PD and CQ; a buffer holds its region, and a region its PD. So a QP is always destroyed
//! before its CQ and SRQ, and an MR before its PD, whatever order the user drops things in.
//!
//! Every failure is an [`Error`] naming the call, its errno and what it means (running out of
//! descriptors says so, with the process's limit).
//!
//! ```no_run
//! use std::time::Duration;
//! use rdmx_conn::*;
//!
//! # fn main() -> Result<()> {
//! let listener = Listener::bind(&AddrInfo::resolve("192.0.2.1:7471", Side::Passive)?, 16)?;
//! let device = listener.device()?.expect("bound to a device address");
//! let pd = ProtectionDomain::new(&device)?;
//! let cq = CompletionQueue::new(&device, 256, true)?;
//! let events = EventChannel::new()?;
//! let srq = SharedReceiveQueue::new(&pd, &cq, 128)?;
//! for buf in pd.register_chunks(4096, 128, Access::LOCAL_WRITE)? {
//!     srq.post_recv(buf, 0).map_err(|(e, _)| e)?;
//! }
//! let request = listener.get_request(Some(Duration::from_secs(10)))?.expect("a client");
//! let conn = request.accept(&QpConfig::new(&pd, &cq, Some(&srq), &events), b"welcome", Duration::from_secs(5))?;
//! let mut done = Vec::new();
//! cq.wait(&mut done, 16, Some(Duration::from_secs(5)))?;
//! # drop(conn);
//! # Ok(())
//! # }
//! ```

mod addr;
mod async_events;
mod channel;
mod cm;
mod connection;
mod cq;
mod device;
mod error;
pub mod fault;
mod memory;
mod poll;
mod srq;
mod window;
mod word_region;

pub use addr::{split_host_port, AddrInfo, Side};
pub use channel::{CmEvent, CmEventKind, EventChannel};
pub use cm::{
    connect, Accepting, ConnectionRequest, Listener, QpConfig, MAX_ACCEPT_PRIVATE_DATA,
    MAX_CONNECT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA,
};
pub use connection::{Connection, INLINE_PIECES};
pub use cq::{AtomicOp, Completion, CompletionQueue, WcStatus, WorkKind};
pub use device::{Device, DeviceLimits, PortInfo};
pub use error::{Error, Result};
pub use memory::{
    live_registrations, Access, ProtectionDomain, RegisteredBuf, RegistrationCount, RemoteBuf,
    SharedBuf,
};
pub use poll::{Poller, Waker};
pub use srq::SharedReceiveQueue;
pub use window::{live_windows, MemoryWindow};
pub use word_region::{WordAccess, WordRegion};
