//! The transports under a worker, chosen per connection: how its connections move frames
//! and rendezvous data, and what each does natively ([`Capabilities`]).
//!
//! A connection's transport half is a [`TransportLink`]; the worker keeps each as a
//! `Box<dyn TransportLink>` in the connection's [`Conn`], so one worker holds connections of
//! several transports at once and one executor drives the protocol engine for all of them.
//! One implementation per folder: `rdma` (rdmacm + verbs: SRQ, RDMA READ, memory windows)
//! and `tcp` (over `rdmx-tcp`'s nonblocking sockets; a rendezvous READ becomes a request
//! answered by the sender's link streaming straight from the exposed buffer). What a
//! transport keeps for all of a worker's connections over it lives in [`Ifaces`] (used
//! without the worker's protocol lock: RDMA's device resources, TCP's exposure table) and
//! [`LockedIfaces`] (under the lock: RDMA's send buffers, registration cache and memory
//! windows). The protocol engine above never learns which transport a connection runs on:
//! it sees frames, send completions and READ completions either way, as [`LinkEvent`]s.

use std::fmt;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use rdmx_proto::{ConnId, RemoteBuf, UserBufId};

mod conn;
mod ifaces;
#[cfg(test)]
pub(crate) mod memory;
#[cfg(feature = "rdma")]
pub(crate) mod rdma;
pub(crate) mod shm;
pub(crate) mod tcp;

pub(crate) use conn::Conn;
pub(crate) use ifaces::{Deferred, Ifaces, LockedIfaces, PollScratch};

use crate::readiness::Interest;
use crate::usermem::UserMem;

/// A transport, as `RDMX_TRANSPORT` names it. A context may use several, in order of
/// preference; each connection runs on one of them (see [`crate::Ep::transport`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// In a list: RDMA for peers an RDMA device reaches, TCP for the others.
    Auto,
    /// rdmacm + verbs; an error where there is no RDMA device.
    Rdma,
    /// TCP sockets, with the same API and semantics.
    Tcp,
    /// Shared memory, for a peer on this host (same boot, user and namespaces): frames
    /// through rings in a shared segment, rendezvous data read from the sender's memory
    /// (CMA). Set up over a TCP connection, so listeners and addresses are TCP's.
    Shm,
    /// Tests only: two workers of one process joined by in-memory queues (see
    /// `transport::memory`), with TCP's capabilities.
    #[cfg(test)]
    Memory,
}

impl Transport {
    pub(crate) fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(Transport::Auto),
            "rdma" | "verbs" | "rc" => Some(Transport::Rdma),
            "tcp" => Some(Transport::Tcp),
            "shm" | "sm" | "posix" => Some(Transport::Shm),
            _ => None,
        }
    }

    /// Parses `RDMX_TRANSPORT`: `auto`, or transports in order of preference separated by
    /// commas (`rdma,tcp`), each at most once.
    pub(crate) fn parse_list(value: &str) -> Option<Vec<Self>> {
        let list: Vec<Transport> = value
            .split(',')
            .map(Transport::parse)
            .collect::<Option<_>>()?;
        let auto_alone = list == [Transport::Auto] || !list.contains(&Transport::Auto);
        let unique = list.iter().enumerate().all(|(i, t)| !list[..i].contains(t));
        (auto_alone && unique).then_some(list)
    }

    /// Writes a list as `RDMX_TRANSPORT` takes it.
    pub(crate) fn list_string(list: &[Transport]) -> String {
        list.iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Parses a transport's name as `RDMX_TRANSPORT` takes it (`auto`, `rdma`, `tcp`, `shm`
/// and their aliases `verbs`, `rc`, `sm`, `posix`; any case).
impl std::str::FromStr for Transport {
    type Err = crate::Error;

    fn from_str(value: &str) -> crate::Result<Self> {
        Transport::parse(value).ok_or_else(|| {
            crate::Error::Invalid(format!(
                "{value:?} is not a transport (auto, rdma, tcp or shm)"
            ))
        })
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Transport::Auto => "auto",
            Transport::Rdma => "rdma",
            Transport::Tcp => "tcp",
            Transport::Shm => "shm",
            #[cfg(test)]
            Transport::Memory => "memory",
        })
    }
}

/// What a transport does natively, like UCX's interface capabilities: the worker's choices
/// per connection (how a rendezvous is exposed and read, where frames land) follow these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Frames are SENT into receive buffers pre-posted on a queue all the worker's
    /// connections share (an SRQ), so receive memory does not grow with connections.
    pub shared_receive_queue: bool,
    /// The receiver of a rendezvous GETs the data without the sender's CPU (RDMA READ).
    /// Without it, the sender's progress engine streams the data on request.
    pub zero_copy_get: bool,
    /// One side can PUT into the other's memory (RDMA WRITE); rdmx grants no peer that
    /// today.
    pub zero_copy_put: bool,
    /// Waiting can sleep on a file descriptor (completion channel, socket).
    pub event_fd: bool,
}

impl Transport {
    /// What this transport does natively (`Auto` has no capabilities of its own).
    pub fn capabilities(self) -> Capabilities {
        match self {
            Transport::Rdma => Capabilities {
                shared_receive_queue: true,
                zero_copy_get: true,
                zero_copy_put: true,
                event_fd: true,
            },
            #[cfg(test)]
            Transport::Memory => Transport::Tcp.capabilities(),
            Transport::Tcp => Capabilities {
                shared_receive_queue: false,
                zero_copy_get: false,
                zero_copy_put: false,
                event_fd: true,
            },
            Transport::Shm => Capabilities {
                shared_receive_queue: false,
                zero_copy_get: true,
                zero_copy_put: false,
                event_fd: true,
            },
            Transport::Auto => Capabilities {
                shared_receive_queue: false,
                zero_copy_get: false,
                zero_copy_put: false,
                event_fd: false,
            },
        }
    }
}

/// A connection's transport half: what the worker's driver, executor and progress ask of a
/// connection, whatever it runs on.
///
/// Methods taking an [`LockedIfaces`] run under the worker's protocol lock and get the
/// transports' worker-wide state that lock guards; they only queue work. The others run
/// without it, from any thread: [`flush`](TransportLink::flush) posts or writes what was
/// queued, [`poll`](TransportLink::poll) reads the link's own fd.
pub(crate) trait TransportLink: Send + Sync {
    /// The transport the link runs on.
    fn transport(&self) -> Transport;

    /// How the link carries data, for logs and [`crate::Ep::data_path`] (the transport's
    /// name, and how rendezvous data moves where a transport has more than one way).
    fn data_path(&self) -> String {
        self.transport().to_string()
    }

    /// What the link's transport does natively.
    fn capabilities(&self) -> Capabilities {
        self.transport().capabilities()
    }

    /// The peer's address.
    fn peer_addr(&self) -> Option<SocketAddr>;

    /// This side's address.
    fn local_addr(&self) -> Option<SocketAddr>;

    /// The private data the peer sent with its accept or connect (its handshake).
    fn peer_private_data(&self) -> &[u8];

    /// The fd that becomes readable when the link has news (TCP data, a shared-memory
    /// peer's hang-up), and writable when held-back output can go (TCP, while
    /// [`wants_write`]); `None` for a link without one of its own (RDMA: its rdmacm events
    /// come through the worker's one event channel, [`LockedIfaces`]' `rdma`, at
    /// housekeeping).
    ///
    /// [`wants_write`]: TransportLink::wants_write
    fn event_fd(&self) -> Option<BorrowedFd<'_>>;

    /// Whether the link's frames arrive on its [`event_fd`](TransportLink::event_fd): those
    /// of a transport without a shared receive queue (TCP). Progress then reads the link
    /// whenever it is readable. Otherwise they arrive on the worker's queue (RDMA's SRQ,
    /// reported by [`LockedIfaces::completions`]) and the fd carries only connection events,
    /// read at housekeeping.
    fn frames_on_event_fd(&self) -> bool {
        !self.capabilities().shared_receive_queue
    }

    // ---- under the protocol lock

    /// The worker took the link in: what it received before it was known (RDMA: frames on
    /// its QP that arrived before the connection was added) is reported now.
    fn joined(&self, st: &mut LockedIfaces, out: &mut Vec<LinkEvent>) {
        let _ = (st, out);
    }

    /// The worker forgets the link (it was reaped).
    fn reaped(&self, st: &mut LockedIfaces) {
        let _ = st;
    }

    /// Queues one frame whose body is `frame` (the protocol header) followed by `payload`;
    /// it goes out at the next [`flush`](TransportLink::flush), unless the link sent it at
    /// once ([`Queued::Posted`]). An error means the frame cannot be sent: the send fails.
    fn queue_frame(
        &self,
        st: &mut LockedIfaces,
        frame: &rdmx_proto::wire::FrameBuf,
        payload: &[u8],
    ) -> Result<Queued, String>;

    /// Starts a rendezvous READ into `mem` (the user buffer `read.buf`); it is reported as
    /// [`LinkEvent::ReadDone`] under `read.key`, whatever its outcome, unless this fails.
    fn start_read(
        &self,
        st: &mut LockedIfaces,
        read: ReadOp,
        mem: &mut UserMem,
    ) -> Result<(), String>;

    /// Starts a one-sided operation the NIC performs (`rdmx_proto::Action::RmaVerbs`) on
    /// `mem` (the request's buffer); it is reported as [`LinkEvent::ReadDone`] under
    /// `work.key`, whatever its outcome, unless this fails. Only a link that said
    /// `verbs_rma` in its limits (RDMA) is given any. `Ok(true)`: the bytes go through a
    /// bounce buffer of the worker's ([`LockedIfaces::give_bounce`] takes it back), which
    /// the report hands back as its piece: a get's bytes are then to be copied from it.
    fn start_rma(
        &self,
        st: &mut LockedIfaces,
        work: RmaWork,
        mem: &mut UserMem,
    ) -> Result<bool, String> {
        let _ = (st, work, mem);
        Err(format!(
            "{} links perform no one-sided operations by verbs",
            self.transport()
        ))
    }

    /// Makes the first `len` bytes of the send buffer `buf` (`mem`) readable by this link's
    /// peer alone, and names them for the peer's READ. The exposure ends with
    /// [`LockedIfaces::release`], which concerns the buffer whichever link exposed it.
    fn expose(
        &self,
        st: &mut LockedIfaces,
        buf: UserBufId,
        mem: &mut UserMem,
        len: u64,
    ) -> Result<RemoteBuf, String>;

    /// A READ started on this link was reported: the link hands back what it held of the
    /// destination `buf` once no READ into it is left (TCP: the buffer lent to it).
    fn read_finished(&self, buf: UserBufId, mem: Option<&mut UserMem>) {
        let _ = (buf, mem);
    }

    /// Work the link posted completed (RDMA: a send queue slot is free again). Returns
    /// whether work waits in the link's queue, to be flushed now that there is room.
    fn work_done(&self) -> bool {
        true
    }

    /// Gives the buffer of a frame this link received back once the engine has read it (RDMA:
    /// reposted on the SRQ after the lock is released; TCP: reused by the link).
    fn give_back(&self, frame: RecvFrame, deferred: &mut Deferred) {
        deferred.return_frame(frame);
    }

    /// Takes back every buffer lent to the link as a READ destination (the link failed or
    /// is reaped): the READs into them are forgotten.
    fn reclaim_lent(&self) -> Vec<(UserBufId, Vec<u8>)> {
        Vec::new()
    }

    /// The connection is closing: disconnect once what is queued has gone out.
    fn close(&self);

    /// Reports the work whose post failed since the last call (RDMA; see
    /// [`flush`](TransportLink::flush)).
    fn take_failures(&self, st: &mut LockedIfaces, out: &mut Vec<LinkEvent>) {
        let _ = (st, out);
    }

    // ---- without the protocol lock

    /// Posts or writes what is queued. True when something failed that the worker must
    /// look at ([`take_failures`](TransportLink::take_failures); TCP: the socket broke).
    /// `closing` says whether the connection is closing (failures are expected then; TCP
    /// shuts the socket down once everything is written).
    fn flush(&self, closing: bool) -> bool;

    /// The keepalive, called at housekeeping with the coarse time `now` (ns): a link whose
    /// transport checks liveness itself (RDMA: a probe when it has posted nothing for a
    /// keepalive interval) queues that check. Returns whether it queued work to flush. TCP's
    /// kernel keepalive needs nothing here.
    fn keepalive(&self, _now: u64) -> bool {
        false
    }

    /// Whether output waits for room in the socket (TCP only: RDMA posts never wait).
    fn wants_write(&self) -> bool {
        false
    }

    /// What the worker's readiness registry is to watch [`event_fd`] for now, and whether
    /// input the link held back waits for a [`poll`] that no readiness will ask for: read
    /// interest, and write interest while output waits for room ([`wants_write`]) — or,
    /// while the link's input is paused ([`input_paused`]), write interest alone.
    ///
    /// [`event_fd`]: TransportLink::event_fd
    /// [`poll`]: TransportLink::poll
    /// [`wants_write`]: TransportLink::wants_write
    /// [`input_paused`]: TransportLink::input_paused
    fn watch(&self) -> Watch {
        Watch {
            interest: if self.wants_write() {
                Interest::ReadWrite
            } else {
                Interest::Read
            },
            held_ready: false,
        }
    }

    /// Whether the link stopped reading its peer's input because its output queue holds
    /// more than its limit (TCP: a peer that asks for answers and does not read them); its
    /// input is read again once the peer has read enough.
    fn input_paused(&self) -> bool {
        false
    }

    /// The flags of a link whose input can pause, for the worker to read without calling
    /// the link on every frame (see [`InputFlags`]); `None` for one whose input never
    /// pauses.
    fn input_flags(&self) -> Option<InputFlags> {
        None
    }

    /// Takes back, in order and ahead of anything it holds, events this link's
    /// [`poll`](TransportLink::poll) reported that the worker did not deliver because the
    /// link's input paused meanwhile: its next poll, once it is no longer paused, reports
    /// them first. (Only links that pause ask for this.)
    fn hold_input(&self, events: Vec<LinkEvent>) {
        log::error!(
            "a {} link cannot hold back {} events: dropped",
            self.transport(),
            events.len()
        );
    }

    /// Bytes the link's output queue holds against its limit (TCP; see
    /// [`crate::WorkerStats::send_queue_bytes`]).
    fn queued_bytes(&self) -> u64 {
        0
    }

    /// Whether nothing is posted or waiting to be written.
    fn idle(&self) -> bool;

    /// Bytes this connection holds for received input between progress calls, beyond the
    /// worker's shared receive buffers (TCP: a frame partly read, recycled frame buffers).
    fn held_recv_bytes(&self) -> u64 {
        0
    }

    /// Reads what the link's fd reported (it was readable; RDMA: its worker's event channel
    /// said it has events), appending what it means to `out`. `housekeeping` says whether
    /// connection events are due (RDMA reads its rdmacm events only then). Returns how many requests of the peer it answered by queueing
    /// output as it read (TCP: READ requests), to be flushed.
    fn poll(
        &self,
        housekeeping: bool,
        scratch: &mut PollScratch,
        out: &mut Vec<LinkEvent>,
    ) -> usize;
}

/// A pausing link's flags, set by the link alone (see [`TransportLink::input_flags`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct InputFlags {
    /// Its input is paused ([`TransportLink::input_paused`]).
    pub(crate) paused: Arc<AtomicBool>,
    /// It holds back input it read while paused ([`TransportLink::hold_input`]).
    pub(crate) holding: Arc<AtomicBool>,
}

/// What to watch a link's fd for, and whether input it held back waits for a poll (see
/// [`TransportLink::watch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Watch {
    /// The readiness the registry is to watch the fd for.
    pub(crate) interest: Interest,
    /// The link's input is no longer paused and events it held back wait for its next poll.
    pub(crate) held_ready: bool,
}

/// What [`TransportLink::queue_frame`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Queued {
    /// Queued: the link's next flush sends it.
    ForFlush,
    /// Handed to the transport already (RDMA: a frame small enough to go inline, on a link
    /// with nothing queued before it and room in its send queue, is posted at once).
    Posted,
}

/// A rendezvous READ to start: `len` bytes at `remote` into the user buffer `buf` at
/// `offset`, reported under `key`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadOp {
    /// The worker's name for the READ (its top two bits are clear: see [`READ_KEY_MASK`]).
    pub(crate) key: u64,
    /// Where the peer's data is, as its RTS named it.
    pub(crate) remote: RemoteBuf,
    /// Bytes to read.
    pub(crate) len: u64,
    /// The destination.
    pub(crate) buf: UserBufId,
    /// Where in the destination the data goes.
    pub(crate) offset: u64,
}

/// A one-sided operation for the NIC ([`TransportLink::start_rma`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RmaWork {
    /// The worker's name for it, from the READs' key space ([`READ_KEY_MASK`]).
    pub(crate) key: u64,
    /// What to perform.
    pub(crate) op: rdmx_proto::VerbsOp,
    /// The remote address (offset already) and key.
    pub(crate) remote: RemoteBuf,
    /// Bytes (8 for an atomic operation).
    pub(crate) len: u64,
    /// Where in the request's buffer the bytes start.
    pub(crate) offset: u64,
}

/// READ keys leave the top two bits free (RDMA's completion cookies carry their kind there).
pub(crate) const READ_KEY_MASK: u64 = !(3 << 62);

/// The piece of a receive buffer a finished RDMA READ hands back (none without RDMA).
#[cfg(feature = "rdma")]
pub(crate) type ReadPiece = rdmx_conn::RegisteredBuf;
/// The piece of a receive buffer a finished RDMA READ hands back (none without RDMA).
#[cfg(not(feature = "rdma"))]
pub(crate) enum ReadPiece {}

/// A received frame's buffer, held while the engine's actions read it, then given back to
/// where it came from ([`TransportLink::give_back`]).
pub(crate) enum RecvFrame {
    /// A receive buffer of the worker's SRQ and its index there: reposted once read.
    #[cfg(feature = "rdma")]
    Srq {
        /// The buffer.
        buf: rdmx_conn::RegisteredBuf,
        /// Its index on the SRQ (its work request's cookie).
        index: u64,
    },
    /// A frame read from a byte stream (TCP): its link reuses the buffer.
    Owned(Vec<u8>),
}

impl RecvFrame {
    /// Whether the buffer goes back to the link it came from (a stream's, which the link
    /// reuses) rather than to the worker (an SRQ's: [`Deferred::return_frame`]).
    pub(crate) fn is_link_buffer(&self) -> bool {
        matches!(self, RecvFrame::Owned(_))
    }
}

impl std::ops::Deref for RecvFrame {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            #[cfg(feature = "rdma")]
            RecvFrame::Srq { buf, .. } => buf,
            RecvFrame::Owned(v) => v,
        }
    }
}

impl LinkEvent {
    /// The connection whose input stream this event holds a place in — a frame, or the
    /// connection's loss: delivered in order with the connection's other frames (and held
    /// back with them while its input is paused, see [`TransportLink::hold_input`]).
    #[inline]
    pub(crate) fn stream_conn(&self) -> Option<ConnId> {
        match self {
            LinkEvent::Frame { conn, .. } | LinkEvent::Down { conn, .. } => Some(*conn),
            _ => None,
        }
    }
}

/// What a transport reports, for the worker to turn into engine inputs.
pub(crate) enum LinkEvent {
    /// A frame arrived on `conn`: the first `len` bytes of `frame`.
    Frame {
        /// The connection.
        conn: ConnId,
        /// Its buffer.
        frame: RecvFrame,
        /// The frame's length.
        len: usize,
    },
    /// A send posted on `conn` completed; `error` says how it failed, if it did.
    SendDone {
        /// The connection.
        conn: ConnId,
        /// Why it failed.
        error: Option<String>,
    },
    /// A send could not be posted on `conn`.
    SendFailed {
        /// The connection.
        conn: ConnId,
    },
    /// Setting up an exposure on `conn` completed (RDMA: a memory window's bind): buffers
    /// whose exposure could not end while it was posted may be released now.
    Bound {
        /// The connection.
        conn: ConnId,
        /// Why it failed, if it did.
        error: Option<String>,
    },
    /// The READ `key` finished (`ok`: all its data landed), or could not be posted
    /// (`posted` false); `piece` is what it held of the destination (RDMA).
    ReadDone {
        /// The READ's key ([`ReadOp::key`], or a one-sided operation's [`RmaWork::key`]).
        key: u64,
        /// The piece of the destination (a one-sided WRITE's: source) it held.
        piece: Option<ReadPiece>,
        /// Whether the data arrived.
        ok: bool,
        /// Failed because the peer's NIC refused the access (a bad rkey or range).
        refused: bool,
        /// A one-sided atomic operation's result: the remote word's old value.
        value: u64,
        /// Whether it had been posted (its completion frees posted work).
        posted: bool,
    },
    /// `conn` is lost (the peer disconnected, the link broke, or the peer broke the
    /// protocol): its requests fail and it closes for `reason`. `reads_lost`: READs the link
    /// owes are never reported (TCP); otherwise they complete as flushed (RDMA).
    Down {
        /// The connection.
        conn: ConnId,
        /// Why, as [`crate::Ep::close_reason`] gives it.
        reason: String,
        /// Whether the READs it owes are lost with it.
        reads_lost: bool,
    },
}
