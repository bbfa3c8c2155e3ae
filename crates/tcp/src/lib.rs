//! # rdmx-tcp — rdmx's transport over plain TCP
//!
//! The links under an rdmx worker on machines without RDMA. The worker's protocol engine
//! (`rdmx-proto`) emits opaque *frames* to send on a connection, and for large messages
//! (rendezvous) asks the receiver to "RDMA READ" a remote buffer named by `(addr, rkey,
//! len)`. Over TCP such a READ becomes a READ_REQ sent to the data's owner, whose worker
//! answers with READ_DATA written straight from the exposed buffer (one vectored write of
//! header and buffer slice, no staging copy); the requester's link reads the payload
//! straight into the destination buffer the worker lent it.
//!
//! This crate is only the links — sockets, framing and buffers. The worker decides what to
//! send and what to read; nothing here knows about tags, credits or requests, and this crate
//! does not depend on `rdmx-proto`.
//!
//! * [`Listener`] → [`Listener::get_request`] → [`ConnectionRequest::accept`] /
//!   [`ConnectionRequest::reject`], and [`connect`]: connections with a handshake carrying
//!   up to [`MAX_PRIVATE_DATA`] bytes of private data each way (like rdmacm's). No
//!   connector can hold a listener up: the connections it takes wait for their HELLO in a
//!   bounded table ([`Listener::set_max_pending`], the oldest closed for room), each with a
//!   deadline ([`Listener::set_handshake_timeout`]), read only when they have input; one
//!   that fails its handshake is closed and logged, never returned as an error.
//! * [`Link`]: the output side queues frames ([`Link::queue_frame`]), read requests
//!   ([`Link::queue_read_request`]) and read answers ([`Link::queue_read_data`]), and
//!   [`Link::flush`] writes them without blocking; the input side
//!   ([`Link::poll`]) turns what arrived into [`Event`]s, landing READ_DATA in buffers lent
//!   with [`Link::lend`] and announced with [`Link::expect_read`].
//! * Every socket is nonblocking once connected and has `TCP_NODELAY`; a worker polls
//!   [`Link::fd`] (readable → [`Link::poll`]; writable while [`Link::wants_write`] →
//!   [`Link::flush`]) with level-triggered readiness.
//! * Output is bounded by back-pressure: once the output queue holds more than the link's
//!   limit ([`Link::set_output_limit`], default [`DEFAULT_OUTPUT_LIMIT`]), the link stops
//!   reading its input ([`Link::input_paused`]) until the peer has read enough of its
//!   output, so a peer that asks for answers and never reads them is held up by TCP's
//!   flow control instead of growing the queue (then watch the fd for writability only).
//! * [`Link`] is `Send + Sync`, every method takes `&self`, and the output and input sides
//!   have separate locks, so one thread can write while another reads.
//! * Input is never trusted: nothing panics on any byte sequence, and nothing is allocated
//!   beyond a bounded length the peer announced. Anything malformed ends the link with an
//!   [`Event::Closed`] naming what was wrong.
//!
//! ## Wire format (version 1)
//!
//! Every message is an 8-byte envelope header followed by its body (integers little-endian):
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0 | 1 | kind: 1 HELLO, 2 ACCEPT, 3 REJECT, 4 FRAME, 5 READ_REQ, 6 READ_DATA |
//! | 1 | 3 | reserved, zero |
//! | 4 | 4 | `len`: body length in bytes |
//!
//! Bodies:
//!
//! * **HELLO** (connector → listener), **ACCEPT** / **REJECT** (the listener's answer): magic
//!   `b"RXTC"`, version `u16` = 1, then the private data (at most [`MAX_PRIVATE_DATA`]
//!   bytes; so `6 ≤ len ≤ 262`). A connection starts with exactly one HELLO and one answer;
//!   after ACCEPT both directions carry only the kinds below. REJECT is followed by the
//!   listener closing the connection.
//! * **FRAME**: an opaque frame, `len ≤` [`MAX_FRAME_LEN`] (16 MiB).
//! * **READ_REQ** (32 bytes): `read_id: u64`, `addr: u64`, `rkey: u32`, reserved `u32` (0),
//!   `len: u64` — "send me `len` bytes at `addr` under `rkey`, naming the answer `read_id`".
//! * **READ_DATA** (16 + n bytes): `read_id: u64`, `status: u8` (0 ok, 1 failed), 7 reserved
//!   zero bytes, then the data: `n = len − 16` bytes, exactly the length of the expected read
//!   when ok, 0 when failed.
//!
//! The receiver closes the link ([`Event::Closed`]) on: an unknown kind, non-zero reserved
//! bytes, a handshake message after the handshake, a FRAME longer than [`MAX_FRAME_LEN`], a
//! READ_REQ body other than 32 bytes, READ_DATA for a read id that is not expected (see
//! [`Link::expect_read`]), READ_DATA whose data length differs from the expected one (or is
//! not 0 on failure), an unknown READ_DATA status, and EOF or a reset. During the handshake,
//! a bad magic or version, a wrong kind or a body outside `6..=262` bytes fails
//! [`connect`], and makes [`Listener::get_request`] close that connection (and go on).
//!
//! ## Example
//!
//! ```
//! use std::time::Duration;
//! use rdmx_tcp::{connect, Event, Listener};
//!
//! # fn main() -> rdmx_tcp::Result<()> {
//! let listener = Listener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr().expect("bound").to_string();
//! let client = std::thread::spawn(move || connect(&addr, b"hello", Duration::from_secs(5)));
//! let request = listener.get_request(Some(Duration::from_secs(5)))?.expect("a client");
//! assert_eq!(request.private_data(), b"hello");
//! let server = request.accept(b"welcome")?;
//! let client = client.join().expect("no panic")?;
//! assert_eq!(client.peer_private_data(), b"welcome");
//!
//! client.queue_frame(b"header", b"payload");
//! while !client.flush()? {}
//! let mut events = Vec::new();
//! while events.is_empty() {
//!     server.poll(&mut events)?;
//! }
//! assert_eq!(events[0], Event::Frame(b"headerpayload".to_vec()));
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

mod error;
mod handshake;
mod link;
mod listener;
mod output;
mod parser;
mod wire;

pub use error::Error;
pub use handshake::{connect, ConnectionRequest};
pub use link::{Event, Link};
pub use listener::Listener;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The most private data a HELLO, ACCEPT or REJECT carries (bytes).
pub const MAX_PRIVATE_DATA: usize = 256;

/// The longest FRAME body (frame and payload together) a link sends or accepts: 16 MiB.
pub const MAX_FRAME_LEN: usize = 16 << 20;

/// A link's output limit unless set ([`Link::set_output_limit`]): 16 MiB of queued output
/// (see [`Link`]'s "Output limit and back-pressure"), above which the link stops reading
/// its input.
pub const DEFAULT_OUTPUT_LIMIT: usize = 16 << 20;

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Link>();
    send_sync::<Listener>();
    send_sync::<ConnectionRequest>();
    send_sync::<Error>();
};
