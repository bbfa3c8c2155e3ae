//! # rdmx-shm — the pieces of rdmx's shared-memory transport
//!
//! Two rdmx processes on one host can skip the network: frames go through rings in a
//! shared segment, and a rendezvous receiver reads the sender's buffer directly with
//! `process_vm_readv` (cross-memory attach, CMA) — the same READ as RDMA's. Like `rdmx-tcp`,
//! this crate is only the mechanism; it knows nothing of tags, credits or requests.
//!
//! * [`Segment`]: a memfd, sealed against resizing, mapped shared. It has no path, so no
//!   file is left in `/dev/shm` when either process dies. Only atomic word accesses touch it.
//! * [`channel`]: a connection's two [`ring`]s (one each way) in one segment, each a
//!   single-producer single-consumer queue of length-prefixed records ([`Producer`],
//!   [`Consumer`]). No system call per frame.
//! * [`Doorbell`]: an eventfd a consumer sleeps on while it has said it may sleep
//!   ([`Consumer::may_sleep`]); producers ring it only then ([`Producer::consumer_waiting`]).
//!   A consumer that never sleeps says so once ([`Consumer::never_sleeps`]), and its
//!   producer stops asking.
//! * [`fdpass`]: handing the segment and doorbells to the peer over a Unix socket, and the
//!   peer's pid and uid from the kernel. The socket's hang-up tells a peer died.
//! * [`HostIdentity`]: whether a peer shares this host: boot id, user and namespaces,
//!   never the address alone.
//! * [`cma`]: reading a peer's memory, and probing whether the kernel allows it.
//!
//! ## Trust
//!
//! The segment is a trust boundary: the peer can write anything into it at any time. No
//! reference to shared memory is ever made (the compiler would be entitled to assume it does
//! not change); every index and length read from it is validated before use, against
//! private copies this side keeps of its own indices; record bytes are copied into private
//! memory before anything reads them. A violation is [`Error::Corrupt`] for that ring alone:
//! this process never reads or writes outside the segment and never panics because of what
//! the peer wrote. The descriptors a peer hands over are checked too: a segment must be a
//! memfd of the announced size sealed against shrinking (a shrunk file would turn our next
//! access into SIGBUS), a doorbell must be an eventfd.
//!
//! `unsafe` lives in [`Segment`]'s two accessors of its words (borrowed, or held with the
//! segment), each with its `// SAFETY:` argument.

pub mod channel;
pub mod cma;
mod doorbell;
mod error;
pub mod fdpass;
mod host;
pub mod ring;
mod segment;

pub use doorbell::Doorbell;
pub use error::Error;
pub use host::{HostIdentity, IDENTITY_LEN};
pub use ring::{Consumer, Producer, RecordBuf};
pub use segment::Segment;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Segment>();
    send_sync::<Producer>();
    send_sync::<Consumer>();
    send_sync::<Doorbell>();
    send_sync::<Error>();
};
