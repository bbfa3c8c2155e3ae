//! The TCP transport: connections over `rdmx-tcp`'s nonblocking sockets ([`TcpLink`]), and
//! what stands in for RDMA READ over a byte stream: the exposure table (`exposures`) a
//! sender's links answer READ requests from, and the receiver's destination buffers lent to
//! its link.

mod exposures;
mod link;

use std::sync::Arc;

use parking_lot::Mutex;
use rdmx_proto::ConnId;

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

use crate::usermem::UserMem;

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

    /// The link of the worker's connection `id` over `link`, its socket's keepalive set to
    /// `keepalive` (see [`crate::Config::keepalive`]; zero: none).
    pub(crate) fn link(
        &self,
        id: ConnId,
        link: rdmx_tcp::Link,
        keepalive: std::time::Duration,
    ) -> TcpLink {
        if !keepalive.is_zero() {
            if let Err(e) = link.set_keepalive(keepalive) {
                log::warn!("{id:?}: cannot set the socket's keepalive: {e}");
            }
        }
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
