//! Fault injection for tests: makes verbs calls that never fail on a healthy device fail, so
//! the paths that handle those failures can be tested on real hardware.
//!
//! Nothing here is meant for applications; each fault is armed for exactly one call.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};

static FAIL_QP_DESTROY: AtomicBool = AtomicBool::new(false);

/// Makes the next connection teardown behave as if `ibv_destroy_qp` had failed with `EBUSY`:
/// the QP is left alive, and the connection must leak what is posted on it.
pub fn fail_next_qp_destroy() {
    FAIL_QP_DESTROY.store(true, Ordering::Release);
}

/// Whether the next QP destroy is to fail (and disarms the fault).
pub(crate) fn take_qp_destroy_failure() -> bool {
    FAIL_QP_DESTROY.swap(false, Ordering::AcqRel)
}

/// Silences `conn` the way a peer whose node died or whose cable was cut goes silent: its QP
/// moves to the error state, so it answers nothing any more (requests to it go unanswered and
/// are retried by the other side), and no connection-manager message tells the other side.
pub fn silence(conn: &crate::Connection) -> crate::Result<()> {
    conn.move_to_error()
}

/// A connect request that is never completed: sends the request to `dst` with
/// `private_data` (as [`crate::connect`] does, on `config`) and never reads the answer, so
/// the CM's last message (the RTU, which rdmacm sends as the answer is read) never goes:
/// the listener that accepted it waits for it as for a peer that vanished after asking.
/// Keep the returned [`Unanswered`] as long as the peer is to stay silent; dropping it
/// destroys the id (the CM then rejects the connection). `config`'s event channel must be
/// one nothing reads (a new one).
pub fn connect_unanswered(
    dst: &crate::AddrInfo,
    config: &crate::QpConfig,
    private_data: &[u8],
) -> crate::Result<Unanswered> {
    crate::cm::send_request(dst, config, private_data).map(|conn| Unanswered { conn })
}

/// A connect request left unanswered (see [`connect_unanswered`]).
#[derive(Debug)]
pub struct Unanswered {
    conn: crate::Connection,
}

impl Unanswered {
    /// Whether the answer arrived (the listener accepted; unread, so the exchange stays
    /// incomplete): its event channel is readable.
    pub fn answered(&self) -> bool {
        crate::cq::poll_readable(
            self.conn.config().events.event_fd().as_raw_fd(),
            Some(std::time::Duration::ZERO),
            "poll",
        )
        .unwrap_or(false)
    }
}
