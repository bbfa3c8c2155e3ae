//! One-sided operations the NIC performs ([`ConnLimits::verbs_rma`]): each operation's work
//! requests ([`Action::RmaVerbs`]) and the NIC's reports of them.

use super::*;

/// The most bytes one RDMA WRITE or READ of a one-sided operation moves (a work request's
/// length is 32 bits).
const VERBS_CHUNK: u64 = 1 << 30;

impl RmaState {
    /// [`RmaState::step`] of an operation the NIC performs: its next work request.
    pub(super) fn step_verbs(
        &mut self,
        rdma: RdmaPart,
        conn: ConnId,
        id: RequestId,
        buf: UserBufId,
        len: u64,
        actions: &mut VecDeque<Action>,
    ) -> Step {
        let (op, n) = match self.op {
            Op::Put => (VerbsOp::Write, VERBS_CHUNK.min(len - self.sent)),
            Op::Get => (VerbsOp::Read, VERBS_CHUNK.min(len - self.sent)),
            Op::Atomic(a) => (VerbsOp::Atomic(a), 8),
            Op::Flush | Op::WorkerFlush => unreachable!("never by verbs"),
        };
        actions.push_back(Action::RmaVerbs {
            conn,
            request: id,
            op,
            buf,
            offset: self.sent,
            len: n,
            remote: RemoteBuf {
                addr: rdma.addr.wrapping_add(self.remote + self.sent),
                rkey: rdma.rkey,
            },
        });
        self.sent += n;
        self.replies += 1;
        if self.sent >= len {
            Step::AllSent
        } else {
            Step::More
        }
    }
}

/// Why a one-sided operation the NIC performed failed ([`Engine::handle_rma_verbs_done`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerbsFailure {
    /// The target's NIC refused the access (`IBV_WC_REM_ACCESS_ERR`): the request completes
    /// with [`RefusalKind::RemoteAccess`], and the connection, whose queue pair it broke,
    /// closes.
    RemoteAccess,
    /// Any other failure (the connection broke, or the work was flushed): the connection
    /// fails with its requests.
    Broken,
}

impl Engine {
    /// The NIC performed (or failed) a work request of the one-sided operation `request`
    /// ([`Action::RmaVerbs`]): `Ok` with an atomic operation's old value (anything for the
    /// others). A report for a request that is gone (its connection failed first) is
    /// ignored.
    pub fn handle_rma_verbs_done(&mut self, request: RequestId, result: Result<u64, VerbsFailure>) {
        let Some(s) = self.reqs.get_mut(request) else {
            return;
        };
        let (conn, len) = (s.conn, s.len);
        let SendPhase::Rma(r) = &mut s.phase else {
            return;
        };
        if r.replies == 0 {
            return;
        }
        r.replies -= 1;
        match result {
            Ok(v) => {
                if let Op::Atomic(_) = r.op {
                    r.value = v;
                }
            }
            Err(VerbsFailure::RemoteAccess) => {
                r.failed.get_or_insert(RefusalKind::RemoteAccess);
            }
            Err(VerbsFailure::Broken) => {
                self.fail_conn(conn, Some(CloseReason::SendFailed));
                return;
            }
        }
        let refused = r.failed.is_some();
        if let Some(done) = r.outcome(len) {
            self.finish_rma(conn, request, len, done);
        }
        if refused {
            // The refusal broke the queue pair: everything else on it fails.
            self.fail_conn(conn, Some(CloseReason::SendFailed));
        } else {
            self.flush(conn);
        }
    }
}
