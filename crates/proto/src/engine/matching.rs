//! Tag matching: posted receives, unexpected messages, probes (plain and matched) and
//! cancel.

use super::*;

impl Engine {
    /// Queues a message no posted receive matched, in arrival order, against the
    /// unexpected-message budget (see `budget`): `conn` is the connection of the frame just
    /// counted.
    pub(super) fn push_unexpected(
        &mut self,
        conn: ConnId,
        tag: Tag,
        kind: UnexpKind,
    ) -> Result<(), CloseReason> {
        let id = MessageId(self.next_msg);
        self.next_msg += 1;
        let u = Unexpected {
            id,
            conn,
            tag,
            kind,
        };
        let cost = u.cost();
        self.unexpected.push_back(u);
        self.hold_unexpected(conn, cost)
    }

    /// Removes and returns the first posted receive (in posting order) whose tag and mask
    /// match `tag`.
    // (Once per message: inlined, as the request tables' operations are; see
    // `worker::requests`.)
    #[inline(always)]
    pub(super) fn take_posted_match(&mut self, tag: Tag) -> Option<Posted> {
        // Most often the oldest receive matches: take it without shifting the queue.
        let front = self.posted.front()?;
        if matches(tag, front.tag, front.mask) {
            return self.posted.pop_front();
        }
        let pos = self
            .posted
            .iter()
            .position(|p| matches(tag, p.tag, p.mask))?;
        self.posted.remove(pos)
    }

    /// Posts a tag receive into the first `capacity` bytes of `buf`, matching messages whose
    /// tag satisfies `(msg_tag & mask) == (tag & mask)` (mask 0 = wildcard).
    ///
    /// A receive whose message already arrived eagerly completes as it is made: its id is
    /// one for which [`RequestId::is_immediate`] holds, it is never stored, and its
    /// [`Action::Complete`] (after the copy) is among the actions this call queued.
    // (Inline, with the common case first: a receive made before its message, when no
    // message waits, is only queued. As a call it cost 55 instructions per message of the
    // shared-memory receiver, callgrind.)
    #[inline]
    pub fn tag_recv(&mut self, tag: Tag, mask: Tag, buf: UserBufId, capacity: u64) -> RequestId {
        if self.unexpected.is_empty() {
            let id = self.new_recv_id();
            self.posted.push_back(Posted {
                req: id,
                tag,
                mask,
                buf,
                cap: capacity,
            });
            return id;
        }
        self.tag_recv_matching(tag, mask, buf, capacity)
    }

    /// [`Engine::tag_recv`] with unexpected messages to match against.
    fn tag_recv_matching(
        &mut self,
        tag: Tag,
        mask: Tag,
        buf: UserBufId,
        capacity: u64,
    ) -> RequestId {
        let found = self.take_unexpected_match(tag, mask);
        let (from, cost) = found
            .as_ref()
            .map_or((ConnId(0), 0), |u| (u.conn, u.cost()));
        if let Some(
            u @ Unexpected {
                kind: UnexpKind::Eager(_),
                ..
            },
        ) = found
        {
            let id = immediate_id(&mut self.next_immediate);
            self.deliver_eager(id, buf, capacity, u);
            self.unhold_unexpected(from, cost);
            return id;
        }
        let id = self.new_recv_id();
        let p = Posted {
            req: id,
            tag,
            mask,
            buf,
            cap: capacity,
        };
        match found {
            Some(u) => {
                self.deliver_unexpected(p, u);
                self.unhold_unexpected(from, cost);
            }
            None => self.posted.push_back(p),
        }
        id
    }

    /// [`Engine::tag_recv`] of a message that arrived eagerly, received at once into `buf`
    /// (its length is the capacity): when the first unexpected message matching
    /// `tag`/`mask` is an eager one, it is copied into `buf` (if it fits; else the receive
    /// is [`Status::Truncated`]) and its completion comes back, under an id for which
    /// [`RequestId::is_immediate`] holds; no action is queued for it (the only actions it
    /// may queue are CREDIT frames, when taking the message gave back credits withheld past
    /// `Config::max_unexpected`: [`Engine::has_actions`] tells). Otherwise (nothing
    /// matches, or the first match is a rendezvous) `None`, and nothing happened. The driver
    /// needs no table entry for the buffer, which the engine never names.
    #[inline]
    pub fn tag_recv_now(&mut self, tag: Tag, mask: Tag, buf: &mut [u8]) -> Option<Completion> {
        // (Most often nothing waits: no call then.)
        if self.unexpected.is_empty() {
            return None;
        }
        self.take_eager_now(tag, mask, buf)
    }

    /// [`Engine::tag_recv_now`] with unexpected messages to look at.
    fn take_eager_now(&mut self, tag: Tag, mask: Tag, buf: &mut [u8]) -> Option<Completion> {
        let pos = self.unexpected_match(tag, mask)?;
        if !matches!(self.unexpected[pos].kind, UnexpKind::Eager(_)) {
            return None;
        }
        let u = self.unexpected.remove(pos)?;
        let (from, cost) = (u.conn, u.cost());
        let UnexpKind::Eager(data) = u.kind else {
            // (Checked just above.)
            return None;
        };
        let len = data.len() as u64;
        let status = match buf.get_mut(..data.len()) {
            Some(dst) => {
                dst.copy_from_slice(&data);
                Status::Ok
            }
            None => Status::Truncated,
        };
        self.recycle_payload(data);
        self.unhold_unexpected(from, cost);
        Some(Completion {
            request: immediate_id(&mut self.next_immediate),
            kind: RequestKind::Recv,
            status,
            length: len,
            tag: u.tag,
            conn: Some(u.conn),
            buf: None,
        })
    }

    /// Where the first unexpected message (in arrival order) matching `tag`/`mask` is.
    #[inline]
    fn unexpected_match(&self, tag: Tag, mask: Tag) -> Option<usize> {
        // Most often the oldest message matches: no search then (and its removal shifts
        // nothing).
        let front = self.unexpected.front()?;
        if matches(front.tag, tag, mask) {
            return Some(0);
        }
        self.unexpected
            .iter()
            .position(|u| matches(u.tag, tag, mask))
    }

    /// Removes and returns the first unexpected message (in arrival order) matching
    /// `tag`/`mask`.
    #[inline]
    fn take_unexpected_match(&mut self, tag: Tag, mask: Tag) -> Option<Unexpected> {
        let pos = self.unexpected_match(tag, mask)?;
        self.unexpected.remove(pos)
    }

    /// Looks for an unexpected message matching `tag`/`mask` without receiving it.
    pub fn probe(&self, tag: Tag, mask: Tag) -> Option<ProbeInfo> {
        self.unexpected
            .iter()
            .find(|u| matches(u.tag, tag, mask))
            .map(Unexpected::info)
    }

    /// A matched probe (`MPI_Mprobe`, `ucp_tag_probe_nb` with remove): finds the first
    /// unexpected message matching `tag`/`mask` and takes it out of matching, so that no
    /// receive or probe sees it any more; only [`Engine::msg_recv`] with its handle receives
    /// it.
    pub fn probe_remove(&mut self, tag: Tag, mask: Tag) -> Option<ProbeInfo> {
        let u = self.take_unexpected_match(tag, mask)?;
        let info = u.info();
        self.claimed.insert(u.id, u);
        Some(info)
    }

    /// Receives the probed message `msg` into `buf`; `None` if it is no longer queued (another
    /// receive took it). A rendezvous message whose connection is gone completes with
    /// [`Status::ConnectionClosed`].
    pub fn msg_recv(&mut self, msg: MessageId, buf: UserBufId, capacity: u64) -> Option<RequestId> {
        let u = match self.claimed.remove(&msg) {
            Some(u) => u,
            None => {
                let pos = self.unexpected.iter().position(|u| u.id == msg)?;
                self.unexpected.remove(pos)?
            }
        };
        let (from, cost) = (u.conn, u.cost());
        let id = self.new_recv_id();
        let p = Posted {
            req: id,
            tag: u.tag,
            mask: !0,
            buf,
            cap: capacity,
        };
        self.deliver_unexpected(p, u);
        self.unhold_unexpected(from, cost);
        Some(id)
    }

    /// Cancels a request. A posted, unmatched receive completes with
    /// [`Status::Cancelled`]; a receive already matched cannot be cancelled. A send can be
    /// cancelled only while nothing of it has left (an eager or rendezvous send still queued
    /// for credits, or a rendezvous send whose buffer is not yet exposed): it completes with
    /// `Cancelled`, its buffer released, and the peer never learns of it, so a cancelled send
    /// is never received (MPI's rule). Once its frame (eager data or RTS) was sent, the
    /// peer may match it at any time: `cancel` returns false and the send completes as it
    /// would have. Returns whether the request was cancelled.
    pub fn cancel(&mut self, request: RequestId) -> bool {
        if request.0 & RECEIVE != 0 {
            // Only while it is posted: once matched, it is filled (or done).
            let Some(pos) = self.posted.iter().position(|p| p.req == request) else {
                return false;
            };
            if let Some(p) = self.posted.remove(pos) {
                self.complete_posted(p, Status::Cancelled, 0, 0, None);
            }
            return true;
        }
        match self.reqs.get(request) {
            // Its RTS is out: the peer may match it, so withdrawing it would leave a trap.
            Some(SendReq {
                phase: SendPhase::AwaitAts,
                ..
            }) => false,
            // Its first frame is out: the target may have performed it already.
            Some(SendReq {
                phase: SendPhase::Rma(r),
                ..
            }) if r.started() => false,
            Some(s) => {
                let (tag, len, conn, buf, kind) = (s.tag, s.len, s.conn, s.buf, s.phase.kind());
                if s.phase.exposes() {
                    self.actions
                        .push_back(Action::ReleaseSendBuffer { request, buf });
                }
                self.complete(request, kind, Status::Cancelled, len, tag, Some(conn));
                self.flush(conn);
                true
            }
            _ => false,
        }
    }

    /// Hands the unexpected message `u` to the receive `p` (in no queue).
    /// A rendezvous message whose connection is gone completes the receive with
    /// [`Status::ConnectionClosed`]: its data can no longer be read, and the receive that
    /// matched it stands in its place, before the connection's later messages.
    pub(super) fn deliver_unexpected(&mut self, p: Posted, u: Unexpected) {
        if matches!(u.kind, UnexpKind::Rts { .. }) && !self.conns.contains_key(&u.conn) {
            let len = u.len();
            self.complete_posted(p, Status::ConnectionClosed, len, u.tag, Some(u.conn));
            return;
        }
        match u.kind {
            UnexpKind::Eager(_) => self.deliver_eager(p.req, p.buf, p.cap, u),
            UnexpKind::Rts { sreq, body } => {
                self.start_rndv(p, u.conn, u.tag, sreq, body);
                self.flush(u.conn);
            }
        }
    }

    /// Completes the posted receive `p` (in no queue) without data.
    pub(super) fn complete_posted(
        &mut self,
        p: Posted,
        status: Status,
        length: u64,
        tag: Tag,
        conn: Option<ConnId>,
    ) {
        self.actions.push_back(Action::Complete(Completion {
            request: p.req,
            kind: RequestKind::Recv,
            status,
            length,
            tag,
            conn,
            buf: Some(p.buf),
        }));
    }

    /// Completes the receive `req` (in no queue or map) with the
    /// unexpected eager message `u`: its bytes are copied into `buf` if they fit in
    /// `capacity`.
    fn deliver_eager(&mut self, req: RequestId, buf: UserBufId, capacity: u64, u: Unexpected) {
        let UnexpKind::Eager(data) = u.kind else {
            return;
        };
        let len = data.len() as u64;
        let status = if len > capacity {
            self.recycle_payload(data);
            Status::Truncated
        } else {
            if !data.is_empty() {
                self.actions.push_back(Action::CopyToUser {
                    dst: buf,
                    dst_offset: 0,
                    data,
                });
            }
            Status::Ok
        };
        self.actions.push_back(Action::Complete(Completion {
            request: req,
            kind: RequestKind::Recv,
            status,
            length: len,
            tag: u.tag,
            conn: Some(u.conn),
            buf: Some(buf),
        }));
    }
}
