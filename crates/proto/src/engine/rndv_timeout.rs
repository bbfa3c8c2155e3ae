//! The sender's optional deadline on a rendezvous (`Config::rndv_timeout_ns`, 0: none, the
//! default): a send whose receiver has not ended it with an ATS within the timeout after
//! its RTS went out completes with [`Status::TimedOut`], and its exposure is released
//! ([`Action::ReleaseSendBuffer`]), so a peer that never reads no longer pins the buffer.
//! A READ of it that comes later fails (the receive that made it completes with
//! [`Status::ReadFailed`]); an ATS that comes later names a request that is gone and is
//! ignored, as one for a cancelled send is; the connection stays up.
//!
//! The deadline runs from the RTS to the ATS: it covers the receiver posting its receive
//! and reading the data. A receive posted late is legitimate MPI and UCP behaviour (UCP's
//! rendezvous has no such timeout), and so is a slow read: the timeout is for applications
//! that prefer a failed send to a peer holding their buffer for ever, and must be set well
//! above the longest a receiver may take to post its receive and read the largest message.
//!
//! The engine reads no clock: an RTS that goes out is stamped with the time the next
//! [`Engine::handle_timeout`] brings (which [`Engine::poll_timeout`] asks for at once), so
//! a deadline is never earlier than the timeout after the RTS left; the deadlines, set in
//! order from a monotonic clock with one timeout, stay in order.

use super::*;

/// Rendezvous sends under a deadline (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Deadlines {
    /// Whether any send is listed below (one flag for `Engine::poll_timeout` to look at).
    armed: bool,
    /// Sends whose RTS went out since the clock last advanced: their deadline is set by the
    /// next [`Engine::handle_timeout`].
    sent: Vec<RequestId>,
    /// Deadline (ns) and send, in deadline order. A send that ended meanwhile stays until
    /// its deadline (or a sweep: see [`Engine::expire_rendezvous`]) and is skipped then.
    due: VecDeque<(u64, RequestId)>,
}

impl Deadlines {
    /// A rendezvous send's RTS went out.
    #[inline]
    pub(super) fn rts_sent(&mut self, id: RequestId) {
        self.sent.push(id);
        self.armed = true;
    }

    /// Whether no send is under a deadline.
    #[inline(always)]
    pub(super) fn is_empty(&self) -> bool {
        !self.armed
    }

    /// When the earliest deadline falls, if any (0: sends wait for theirs to be set).
    pub(super) fn next(&self) -> Option<u64> {
        if !self.sent.is_empty() {
            return Some(0);
        }
        self.due.front().map(|d| d.0)
    }
}

/// How many deadlines may be kept before those of sends that ended are swept out (they
/// are also dropped as their deadlines pass).
const SWEEP_AT: usize = 1024;

impl Engine {
    /// Sets the deadlines of the rendezvous sends whose RTS went out since the last call,
    /// and fails those whose deadline has passed at `now` (see the module docs).
    pub(super) fn expire_rendezvous(&mut self, now: u64) {
        let timeout = self.cfg.rndv_timeout_ns;
        if timeout == 0 || self.rndv_timeouts.is_empty() {
            return;
        }
        let Deadlines { sent, due, .. } = &mut self.rndv_timeouts;
        let at = now.saturating_add(timeout);
        due.extend(sent.drain(..).map(|id| (at, id)));
        if due.len() >= SWEEP_AT && due.len() > 2 * self.reqs.len() {
            let reqs = &self.reqs;
            due.retain(|&(_, id)| awaits_ats(reqs, id));
        }
        while let Some(&(at, id)) = self.rndv_timeouts.due.front() {
            if at > now {
                break;
            }
            self.rndv_timeouts.due.pop_front();
            let Some(s) = self.reqs.get(id) else {
                continue;
            };
            if !matches!(s.phase, SendPhase::AwaitAts) {
                continue;
            }
            let (tag, len, conn, buf) = (s.tag, s.len, s.conn, s.buf);
            warn!(
                "rendezvous send {id:?} of {len} bytes (tag {tag:#x}) on {conn:?}: not read \
                 within the rendezvous timeout of {} ms; failed, its buffer released",
                timeout / 1_000_000
            );
            self.actions
                .push_back(Action::ReleaseSendBuffer { request: id, buf });
            self.complete(
                id,
                RequestKind::Send,
                Status::TimedOut,
                len,
                tag,
                Some(conn),
            );
        }
        let d = &mut self.rndv_timeouts;
        d.armed = !d.due.is_empty();
    }
}

/// Whether `id` is a rendezvous send waiting for its ATS.
fn awaits_ats(reqs: &Requests<SendReq>, id: RequestId) -> bool {
    reqs.get(id)
        .is_some_and(|s| matches!(s.phase, SendPhase::AwaitAts))
}
