//! Matched probes: a message taken out of matching, then received exactly (UCP's
//! `ucp_tag_probe_nb` with remove and `ucp_tag_msg_recv_nbx`; MPI's `MPI_Mprobe` and
//! `MPI_Mrecv`).

use rdmx_proto::{ConnId, ProbeInfo, Tag};

use crate::request::Request;
use crate::worker::Worker;

/// A message that arrived and was taken out of matching by [`Worker::probe_remove`]: no
/// receive, on any thread, can match it any more. Receive exactly this message with
/// [`Message::recv`], into a buffer sized from [`Message::len`].
///
/// Dropping it unreceived discards the message: its data are dropped, and the sender of a
/// rendezvous message learns that it was not received ([`crate::Status::RemoteTruncated`]).
#[must_use = "a probed message is taken out of matching: receive it, or dropping discards it"]
pub struct Message {
    worker: Worker,
    info: ProbeInfo,
    received: bool,
}

impl Message {
    pub(crate) fn new(worker: &Worker, info: ProbeInfo) -> Message {
        Message {
            worker: worker.clone(),
            info,
            received: false,
        }
    }

    /// The sender's tag.
    pub fn tag(&self) -> Tag {
        self.info.tag
    }

    /// The message's length in bytes: a buffer this long receives it whole.
    pub fn len(&self) -> u64 {
        self.info.len
    }

    /// Whether the message is empty (0 bytes).
    pub fn is_empty(&self) -> bool {
        self.info.len == 0
    }

    /// The endpoint it came from, as [`crate::Ep::id`] names it.
    pub fn conn(&self) -> ConnId {
        self.info.conn
    }

    /// Whether its data still have to be fetched from the sender (rendezvous).
    pub fn is_rendezvous(&self) -> bool {
        self.info.rendezvous
    }

    /// Receives this message into `buf` (its length is the capacity; a shorter buffer
    /// completes the request with [`crate::Status::Truncated`]).
    pub fn recv(mut self, buf: Vec<u8>) -> Request {
        self.received = true;
        self.worker.msg_recv(self.info, buf)
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        if !self.received {
            log::debug!(
                "a probed message (tag {:#x}, {} bytes) was dropped unreceived: discarded",
                self.info.tag,
                self.info.len
            );
            // Received into nothing: the engine consumes it as truncated.
            drop(self.worker.msg_recv(self.info, Vec::new()));
        }
    }
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("tag", &self.info.tag)
            .field("len", &self.info.len)
            .field("conn", &self.info.conn)
            .finish()
    }
}
