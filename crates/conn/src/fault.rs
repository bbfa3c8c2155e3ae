//! Fault injection for tests: makes verbs calls that never fail on a healthy device fail, so
//! the paths that handle those failures can be tested on real hardware.
//!
//! Nothing here is meant for applications; each fault is armed for exactly one call.

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
