//! The TCP transport: connections over `rdmx-tcp`'s nonblocking sockets ([`TcpLink`]), and
//! what stands in for RDMA READ over a byte stream: the exposure table (`exposures`) a
//! sender's links answer READ requests from, and the receiver's destination buffers lent to
//! its link.

mod exposures;
mod link;

use std::sync::Arc;

use parking_lot::Mutex;
use rdmx_proto::ConnId;

use crate::transport::Transport;

pub(crate) use exposures::{Answer, Exposures};
pub(crate) use link::TcpLink;

/// What takes `conn` down when its peer asks to READ a buffer exposed to another endpoint
/// ([`Answer::OtherEndpoint`]): a protocol error, and the READs it owes are never reported.
pub(crate) fn foreign_read_down(conn: ConnId) -> crate::transport::LinkEvent {
    crate::transport::LinkEvent::Down {
        conn,
        reason: "protocol error: READ request for a buffer exposed to another endpoint".to_string(),
        reads_lost: true,
    }
}

use crate::config::Config;
use crate::usermem::UserMem;

/// The output limit of a worker's TCP connections: the memory one connection's output
/// queue may hold for a peer that has not read it (copied frames and small messages, and a
/// slot per queued item; a READ answer's data is the send buffer itself, not counted)
/// before the worker stops reading that peer's input, until the peer has read half of it.
///
/// [`rdmx_tcp::DEFAULT_OUTPUT_LIMIT`] (16 MiB), or four times `RDMX_CREDITS` frames of the
/// TCP receive buffer size (`RDMX_RECV_BUF_SIZE`) if that is more. A legitimate peer can
/// make a connection queue at most: the frames its credit window lets this side have in
/// flight to it (each spends a credit the peer returns only once it read the frame), each
/// no larger than its receive buffers — 4 MiB with the defaults, counted at most twice over
/// for the buffers' spare capacity —, and the answers to the READs it keeps in flight (at
/// most [`rdmx_proto::MAX_READS_PER_CONN`] per connection, a slot each) with this side's
/// own READ requests, well under 1 MiB. So a peer configured like this side (or smaller)
/// never reaches the limit, and of two peers however configured at most one can (if A's
/// queue passed A's limit, B's window × buffers is more than twice A's, so A's stay under
/// half of B's limit): two rdmx peers never both stop reading each other.
pub(crate) fn output_limit(cfg: &Config) -> usize {
    let window = usize::from(cfg.credits()) * cfg.recv_buf_size_for(Transport::Tcp) as usize;
    rdmx_tcp::DEFAULT_OUTPUT_LIMIT.max(4 * window)
}

/// The TCP transport's worker-wide part: the send buffers exposed to READ requests, which
/// every TCP link of the worker answers from (under the table's own short lock, without the
/// worker's protocol lock).
pub(crate) struct TcpIface {
    exposures: Arc<Mutex<Exposures>>,
}

impl TcpIface {
    pub(crate) fn new() -> Self {
        TcpIface {
            exposures: Arc::new(Mutex::new(Exposures::new())),
        }
    }

    /// The worker's part under its protocol lock.
    pub(crate) fn locked(&self) -> TcpLockedIface {
        TcpLockedIface {
            exposures: self.exposures.clone(),
        }
    }

    /// The link of the worker's connection `id` over `link`, with `cfg`'s socket keepalive
    /// (see [`crate::Config::keepalive`]; zero: none) and output limit ([`output_limit`]).
    pub(crate) fn link(&self, id: ConnId, link: rdmx_tcp::Link, cfg: &Config) -> TcpLink {
        let keepalive = cfg.keepalive();
        if !keepalive.is_zero() {
            if let Err(e) = link.set_keepalive(keepalive) {
                log::warn!("{id:?}: cannot set the socket's keepalive: {e}");
            }
        }
        link.set_output_limit(output_limit(cfg));
        TcpLink::new(id, link, self.exposures.clone())
    }

    /// The worker's exposure table (shared-memory links keep their exposed buffers in it,
    /// and the in-memory test transport answers READs from it).
    pub(crate) fn exposure_table(&self) -> Arc<Mutex<Exposures>> {
        self.exposures.clone()
    }
}

/// What the worker's TCP connections share under its protocol lock: the exposure table, to
/// withdraw exposures.
pub(crate) struct TcpLockedIface {
    exposures: Arc<Mutex<Exposures>>,
}

impl TcpLockedIface {
    /// Ends `mem`'s exposure, if it has one: later READ requests for it are refused, and it
    /// is plain memory again.
    #[inline]
    pub(crate) fn withdraw(&mut self, mem: &mut UserMem) {
        if let Some(key) = mem.exposure_key() {
            self.exposures.lock().withdraw(key);
            mem.unexpose();
        }
    }
}
