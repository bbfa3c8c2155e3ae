//! What the engine asks of its driver ([`Action`]) and what it reports: completions and
//! their status, close reasons, and the opaque handles they carry.

use crate::rma::RefusalKind;
use crate::wire::{FrameBuf, WireStatus};
use crate::{ConnId, RecvBufId, RequestId, Tag, UserBufId};

/// Where a rendezvous send buffer was exposed by the sender's driver (opaque values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteBuf {
    /// Remote address (RDMA virtual address, or a transport token).
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// A one-sided operation the NIC performs ([`Action::RmaVerbs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerbsOp {
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// An atomic operation on an 8-byte word.
    Atomic(crate::rma::AtomicOp),
}

/// Final status of a user request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Completed successfully.
    Ok,
    /// Receive: the message was larger than the buffer; nothing was delivered.
    Truncated,
    /// Cancelled by [`Engine::cancel`](super::Engine::cancel).
    Cancelled,
    /// Send: the receiver's matching buffer was too small; the message was not delivered.
    RemoteTruncated,
    /// Send: the receiver could not read the exposed buffer.
    RemoteReadFailed,
    /// Receive: an RDMA READ of the sender's buffer failed.
    ReadFailed,
    /// Send: exposing the send buffer failed.
    ExposeFailed,
    /// The connection failed or was closed before the request finished.
    ConnectionClosed,
    /// Send: the receiver did not read a rendezvous message within the configured timeout
    /// after its RTS went out (`Config::rndv_timeout_ns`); its exposure was released, so a
    /// later READ of it fails, and the connection stays up. UCP's `UCS_ERR_TIMED_OUT`.
    TimedOut,
    /// A one-sided operation: the target refused the access (see [`crate::rma`]), and
    /// nothing of it was performed.
    Refused(RefusalKind),
}

/// Kind of a user request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestKind {
    /// A tag send.
    Send,
    /// A tag receive.
    Recv,
    /// A one-sided put ([`Engine::rma_put`](crate::Engine::rma_put)).
    Put,
    /// A one-sided get ([`Engine::rma_get`](crate::Engine::rma_get)).
    Get,
    /// An atomic operation ([`Engine::rma_atomic`](crate::Engine::rma_atomic)): its
    /// completion's `tag` is the word's old value.
    Atomic,
    /// A flush ([`Engine::rma_flush`](crate::Engine::rma_flush)).
    Flush,
}

/// Completion of a user request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The request.
    pub request: RequestId,
    /// Send or receive.
    pub kind: RequestKind,
    /// Outcome.
    pub status: Status,
    /// Message length in bytes (for `Truncated`, the length of the incoming message).
    pub length: u64,
    /// The message's tag (the sender's tag, for receives); for an atomic operation, the
    /// word's old value.
    pub tag: Tag,
    /// The connection involved (`None` for a receive that never matched).
    pub conn: Option<ConnId>,
    /// The request's buffer, as the driver named it when it made the request (`None` for a
    /// receive [`Engine::tag_recv_now`](crate::Engine::tag_recv_now) completed, which names none): the driver finds its
    /// own record of the request by it, with no table of request ids.
    pub buf: Option<UserBufId>,
}

/// Why the engine closes a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// The peer sent something invalid (malformed frame, credit overrun, bad sequence...).
    ProtocolError(String),
    /// The peer reported an error and is closing.
    PeerError(WireStatus),
    /// A send completion reported failure.
    SendFailed,
    /// Closed locally through [`Engine::close`](super::Engine::close).
    Local,
}

/// User payload to append after a frame header (eager sends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadRef {
    /// The user's send buffer.
    pub buf: UserBufId,
    /// Where the bytes start in the buffer (0 but for a put's later frames).
    pub offset: u64,
    /// Bytes from `offset`.
    pub len: u64,
}

/// Something the driver must do. Actions must be executed in the order they are polled.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Post a SEND of `frame` followed by `payload` (if any) from the user's buffer.
    /// The driver copies both into a registered send buffer; an eager send's
    /// [`Action::Complete`] follows this action, so the user buffer may be reused once
    /// the copy is done.
    SendFrame {
        /// Connection.
        conn: ConnId,
        /// Encoded header (plus RTS body).
        frame: FrameBuf,
        /// Eager payload to append.
        payload: Option<PayloadRef>,
    },
    /// Post a SEND of `frame` followed by `data` (an RMA reply with a get's bytes). The
    /// driver may hand `data` back with [`Engine::recycle_payload`](super::Engine::recycle_payload) once sent.
    SendFrameData {
        /// Connection.
        conn: ConnId,
        /// Encoded header.
        frame: FrameBuf,
        /// Bytes to append.
        data: Vec<u8>,
    },
    /// Register/expose `buf` (its first `len` bytes) for remote reads, then call
    /// [`Engine::handle_send_buffer_exposed`](super::Engine::handle_send_buffer_exposed) (or `..._expose_failed`).
    ExposeSendBuffer {
        /// The send request.
        request: RequestId,
        /// The user buffer.
        buf: UserBufId,
        /// Bytes to expose.
        len: u64,
    },
    /// The exposure requested by `ExposeSendBuffer` is no longer needed (ATS arrived,
    /// cancel, or connection down). If exposure is still in progress, release it when done.
    ReleaseSendBuffer {
        /// The send request.
        request: RequestId,
        /// The user buffer.
        buf: UserBufId,
    },
    /// Post an RDMA READ of `len` bytes from `remote` into `dst` at `dst_offset`, then call
    /// [`Engine::handle_read_complete`](super::Engine::handle_read_complete) with the same request and `dst_offset` (every read
    /// must be reported, including flush errors).
    RdmaRead {
        /// Connection to read over.
        conn: ConnId,
        /// The receive request.
        request: RequestId,
        /// Remote address (already offset) and key.
        remote: RemoteBuf,
        /// Bytes to read.
        len: u64,
        /// Destination user buffer.
        dst: UserBufId,
        /// Offset in the destination.
        dst_offset: u64,
    },
    /// Perform a one-sided operation with the NIC's verbs (on a connection whose limits
    /// said [`ConnLimits::verbs_rma`](super::ConnLimits::verbs_rma)): an RDMA WRITE of the
    /// first `len` bytes of `buf` to `remote`, a READ of `len` bytes at `remote` into the
    /// start of `buf`, or an atomic operation on the word at `remote`; then report it with
    /// [`Engine::handle_rma_verbs_done`](super::Engine::handle_rma_verbs_done) (every one,
    /// failed ones included).
    RmaVerbs {
        /// Connection to perform it on.
        conn: ConnId,
        /// The one-sided request.
        request: RequestId,
        /// What to perform.
        op: VerbsOp,
        /// The request's buffer (a put's source, a get's destination; unused by an atomic
        /// operation, whose result the report carries).
        buf: UserBufId,
        /// Where in `buf` the bytes start.
        offset: u64,
        /// Bytes (8 for an atomic operation).
        len: u64,
        /// The remote address (already offset) and key.
        remote: RemoteBuf,
    },
    /// Copy `len` bytes at `src_offset` of SRQ buffer `src` into `dst` at `dst_offset`.
    /// `src` is the buffer of the frame being handled (see [`Engine::handle_frame`](super::Engine::handle_frame)).
    CopyFromRecvBuf {
        /// SRQ buffer.
        src: RecvBufId,
        /// Offset in the SRQ buffer (the header length).
        src_offset: usize,
        /// Bytes to copy.
        len: usize,
        /// Destination user buffer.
        dst: UserBufId,
        /// Offset in the destination.
        dst_offset: u64,
    },
    /// Copy engine-held bytes (an unexpected eager message) into `dst` at `dst_offset`.
    CopyToUser {
        /// Destination user buffer.
        dst: UserBufId,
        /// Offset in the destination.
        dst_offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Complete a user request.
    Complete(Completion),
    /// Close the connection (the engine already forgot it and failed its requests).
    /// After a protocol error it is preceded by a best-effort `SendFrame` of an ERROR
    /// frame, which the driver should post before disconnecting.
    CloseConnection {
        /// Connection.
        conn: ConnId,
        /// Why.
        reason: CloseReason,
    },
}
