//! Sends: eager frames, rendezvous RTS once the buffer is exposed, and the credit flow
//! that paces both.

use super::*;

impl Engine {
    /// Starts a tag send of the first `len` bytes of `buf`. Messages of at most the
    /// connection's eager limit go eager (completed once the driver copied them); larger
    /// ones use rendezvous (an [`Action::ExposeSendBuffer`] is emitted first). An eager send
    /// with nothing queued ahead of it and credit to spare goes out at once and gets an id
    /// for which [`RequestId::is_immediate`] holds: the driver completes it itself, and no
    /// [`Action::Complete`] follows.
    pub fn tag_send(
        &mut self,
        conn: ConnId,
        tag: Tag,
        buf: UserBufId,
        len: u64,
    ) -> Result<RequestId, Error> {
        if let Some((id, frame)) = self.frame_now(conn, tag, len) {
            self.actions.push_back(Action::SendFrame {
                conn,
                frame,
                payload: Some(PayloadRef {
                    buf,
                    offset: 0,
                    len,
                }),
            });
            return Ok(id);
        }
        let Some(c) = self.conns.get_mut(&conn) else {
            return Err(Error::UnknownConnection(conn));
        };
        let eager = len <= c.eager_limit;
        let phase = if eager {
            SendPhase::EagerQueued
        } else {
            SendPhase::RtsQueued { remote: None }
        };
        let id = self.new_send(SendReq {
            conn,
            tag,
            buf,
            len,
            phase,
        });
        if !eager {
            self.actions.push_back(Action::ExposeSendBuffer {
                request: id,
                buf,
                len,
            });
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            c.data_q.push_back(id);
        }
        self.flush(conn);
        Ok(id)
    }

    /// [`Engine::tag_send`] for a send that goes out at once, or nothing: when the message is
    /// eager, nothing is queued ahead of it (on its connection or among the actions) and there
    /// is credit to spare, its frame header comes back, numbered and carrying the credits it
    /// returns, for the driver to send at once with the `len` payload bytes after it, before
    /// any action that follows. The send completes as it is made: the returned id
    /// [`is_immediate`](RequestId::is_immediate), and no [`Action::Complete`] follows (nor any
    /// other action). Otherwise `None`, and nothing happened. The engine never names the
    /// payload's buffer, so the driver needs no table entry for it.
    pub fn tag_send_now(
        &mut self,
        conn: ConnId,
        tag: Tag,
        len: u64,
    ) -> Option<(RequestId, FrameBuf)> {
        if !self.actions.is_empty() {
            return None;
        }
        self.frame_now(conn, tag, len)
    }

    /// [`Engine::tag_send_now`] but for the actions: its frame, if it goes out at once, to
    /// send after the actions queued. (Inlined into its two callers, once per eager send: 13
    /// instructions fewer per shared-memory round trip than as a call.)
    #[inline(always)]
    fn frame_now(&mut self, conn: ConnId, tag: Tag, len: u64) -> Option<(RequestId, FrameBuf)> {
        let c = self.conns.get_mut(&conn)?;
        if !c.sends_now(len) {
            return None;
        }
        // Nothing queued ahead and credit to spare: the message goes out now and the send
        // completes with it, never stored (what `flush` would do, without the table).
        let id = immediate_id(&mut self.next_immediate);
        let mut h = Header::new(Opcode::Eager);
        h.tag = tag;
        h.sreq = id.0;
        h.payload_len = len as u32;
        Some((id, c.stamp(h, None, &mut self.credits)))
    }

    /// The driver exposed a rendezvous send buffer.
    pub fn handle_send_buffer_exposed(&mut self, request: RequestId, remote: RemoteBuf) {
        if let Some(s) = self.reqs.get_mut(request) {
            if let SendPhase::RtsQueued { remote: r @ None } = &mut s.phase {
                *r = Some(remote);
                let conn = s.conn;
                self.flush(conn);
            }
        }
    }

    /// The driver could not expose a rendezvous send buffer: the send fails with
    /// [`Status::ExposeFailed`].
    pub fn handle_send_buffer_expose_failed(&mut self, request: RequestId) {
        if let Some(s) = self.reqs.get(request) {
            if matches!(s.phase, SendPhase::RtsQueued { remote: None }) {
                let (tag, len, conn) = (s.tag, s.len, s.conn);
                self.complete(
                    request,
                    RequestKind::Send,
                    Status::ExposeFailed,
                    len,
                    tag,
                    Some(conn),
                );
                self.flush(conn);
            }
        }
    }

    /// Emits every frame of `conn` that credits allow, and a credit update when the peer
    /// is owed enough and nothing else carried it.
    pub(super) fn flush(&mut self, conn_id: ConnId) {
        let Some(c) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let actions = &mut self.actions;
        let pool = &mut self.credits;
        // Control frames and one-sided requests go while CTRL_CREDITS are left, messages
        // (EAGER, RTS) while DATA_CREDITS are (see their docs). Whether a message at the
        // head waits for them:
        let mut short = false;
        while c.tx_credits >= CTRL_CREDITS {
            match c.ctrl_q.pop_front() {
                Some(Ctrl::Ats {
                    sreq,
                    rreq,
                    status,
                    then,
                }) => {
                    let mut h = Header::new(Opcode::Ats);
                    h.sreq = sreq;
                    h.rreq = rreq;
                    h.status = status;
                    c.emit(conn_id, h, None, None, actions, pool);
                    if let Some(done) = then {
                        report(&mut self.reqs, &mut self.recvs, actions, done);
                    }
                    continue;
                }
                Some(Ctrl::RmaReply(reply)) => {
                    c.emit_reply(conn_id, *reply, actions, pool);
                    continue;
                }
                None => {}
            }
            let Some(&id) = c.data_q.front() else { break };
            let Some(s) = self.reqs.get_mut(id) else {
                // Cancelled or failed while queued.
                c.data_q.pop_front();
                continue;
            };
            let (tag, len, buf) = (s.tag, s.len, s.buf);
            match s.phase {
                SendPhase::EagerQueued | SendPhase::RtsQueued { remote: Some(_) }
                    if c.tx_credits < DATA_CREDITS =>
                {
                    short = true;
                    break;
                }
                SendPhase::EagerQueued => {
                    let mut h = Header::new(Opcode::Eager);
                    h.tag = tag;
                    h.sreq = id.0;
                    h.payload_len = len as u32;
                    c.data_q.pop_front();
                    c.emit(
                        conn_id,
                        h,
                        None,
                        Some(PayloadRef {
                            buf,
                            offset: 0,
                            len,
                        }),
                        actions,
                        pool,
                    );
                    self.reqs.discard(id);
                    actions.push_back(Action::Complete(Completion {
                        request: id,
                        kind: RequestKind::Send,
                        status: Status::Ok,
                        length: len,
                        tag,
                        conn: Some(conn_id),
                        buf: Some(buf),
                    }));
                }
                SendPhase::RtsQueued {
                    remote: Some(remote),
                } => {
                    s.phase = SendPhase::AwaitAts;
                    if self.cfg.rndv_timeout_ns != 0 {
                        self.rndv_timeouts.rts_sent(id);
                    }
                    let mut h = Header::new(Opcode::Rts);
                    h.tag = tag;
                    h.sreq = id.0;
                    h.payload_len = wire::RTS_BODY_LEN as u32;
                    let body = RtsBody {
                        addr: remote.addr,
                        rkey: remote.rkey,
                        len,
                    };
                    c.data_q.pop_front();
                    c.emit(conn_id, h, Some(&body), None, actions, pool);
                }
                // Head of line waits for its buffer exposure (send order is preserved).
                SendPhase::RtsQueued { remote: None } => break,
                SendPhase::AwaitAts => {
                    c.data_q.pop_front();
                }
                SendPhase::Rma(ref mut r) => {
                    match r.step(c, conn_id, id, buf, len, actions, pool) {
                        one_sided::Step::More => {}
                        one_sided::Step::AllSent => {
                            c.data_q.pop_front();
                        }
                        one_sided::Step::Wait => break,
                        one_sided::Step::Done(done) => {
                            c.data_q.pop_front();
                            report(&mut self.reqs, &mut self.recvs, actions, done);
                        }
                    }
                }
            }
        }
        if short || (c.tx_credits < CTRL_CREDITS && !(c.ctrl_q.is_empty() && c.data_q.is_empty())) {
            // Frames wait for credits: the next frame asks for a larger window.
            c.starved = true;
        }
        if c.credit_due() {
            c.emit_credit(conn_id, actions, pool);
        }
    }
}

/// The credits a control frame (ATS, RMA reply) or a one-sided request needs to go: one. A
/// CREDIT frame costs none (it must grant at least one credit, or it is a protocol error):
/// so a peer can always give credits back, and two peers can never be left without
/// credits while they owe each other some (what reserving the last credit for CREDIT
/// frames achieved before), and no credit is ever owed for a CREDIT frame, so no CREDIT
/// frame calls for another. What CREDIT frames in flight take of the receive buffers (at
/// most one per credit returned) is beyond the windows: RC's RNR retry, TCP's flow control
/// and the ring's own room absorb it.
pub(super) const CTRL_CREDITS: u32 = 1;

/// The credits a message's frame (EAGER, RTS: what may land in the peer's unexpected queue)
/// needs to go: one more than a control frame. A peer that withholds this side's credits
/// (see `budget`) leaves it one, with which it sends no more messages while its ATS, its
/// RMA replies and requests and its credit updates still go. A window of W credits keeps
/// W - 1 messages in flight.
pub(super) const DATA_CREDITS: u32 = 2;

impl Conn {
    /// Credits owed to the peer that are worth a CREDIT frame of their own: a quarter of
    /// its window, at least 2.
    pub(super) fn credit_threshold(&self) -> u32 {
        (self.window / 4).max(2)
    }

    /// Whether the credits owed to the peer are worth a CREDIT frame of their own: they
    /// reached [`Conn::credit_threshold`], or the peer is left with fewer than a message needs
    /// ([`DATA_CREDITS`]) of what is neither owed nor withheld (see `budget`: while credits
    /// are withheld, that is every credit owed).
    ///
    /// (CREDIT frames cost no credit, so none is owed for them: a ping-pong carries no
    /// CREDIT frames, as it once did with 4- and 8-credit windows when each side's CREDIT
    /// frame could make the other's due, beside every message, each way, for good.)
    #[inline(always)]
    pub(super) fn credit_due(&self) -> bool {
        // (`window` leaves withheld credits out. At one, this can hold with nothing owed: no
        // CREDIT frame goes then, see `Conn::emit_credit`.)
        self.rx_unreturned >= self.credit_threshold()
            || self.rx_unreturned + DATA_CREDITS > self.window
    }

    /// Whether a send of `len` bytes goes out at once (see [`Engine::tag_send_now`]): with
    /// the credits of a data frame ([`DATA_CREDITS`]).
    fn sends_now(&self, len: u64) -> bool {
        len <= self.eager_limit
            && self.data_q.is_empty()
            && self.ctrl_q.is_empty()
            && self.tx_credits >= DATA_CREDITS
    }

    /// Emits a frame on this connection (`id`), [stamped](Conn::stamp), as a
    /// [`Action::SendFrame`].
    pub(super) fn emit(
        &mut self,
        id: ConnId,
        h: Header,
        rts: Option<&RtsBody>,
        payload: Option<PayloadRef>,
        actions: &mut VecDeque<Action>,
        pool: &mut CreditPool,
    ) {
        let frame = self.stamp(h, rts, pool);
        actions.push_back(Action::SendFrame {
            conn: id,
            frame,
            payload,
        });
    }

    /// Makes the next frame of this connection: piggybacks the credits owed to the peer
    /// (less what `pool` takes back from its window), asks for more if this side ran out,
    /// numbers it and spends a credit. The frame must be sent before any made later.
    fn stamp(&mut self, h: Header, rts: Option<&RtsBody>, pool: &mut CreditPool) -> FrameBuf {
        let h = self.number(h, pool);
        FrameBuf::encode(&h, rts)
    }

    /// What [`Conn::stamp`] does to the header of the next frame, for a frame with another
    /// body (the caller encodes it).
    #[inline(always)]
    pub(super) fn number(&mut self, h: Header, pool: &mut CreditPool) -> Header {
        let h = self.grant(h, pool, 0);
        self.tx_credits -= 1;
        h
    }

    /// Emits a CREDIT frame with the credits owed to the peer (it costs no credit), unless
    /// the pool takes them all back.
    pub(super) fn emit_credit(
        &mut self,
        id: ConnId,
        actions: &mut VecDeque<Action>,
        pool: &mut CreditPool,
    ) {
        if self.rx_unreturned == 0 {
            return;
        }
        // (The pool may take all but one back: a CREDIT frame grants at least one.)
        let h = self.grant(Header::new(Opcode::Credit), pool, 1);
        actions.push_back(Action::SendFrame {
            conn: id,
            frame: FrameBuf::encode(&h, None),
            payload: None,
        });
    }

    /// Numbers the next frame and grants it the credits owed to the peer, but for what the
    /// pool takes back from its window (leaving at least `keep` of them, if there are).
    #[inline(always)]
    fn grant(&mut self, mut h: Header, pool: &mut CreditPool, keep: u32) -> Header {
        if self.rx_unreturned > keep && self.pooled {
            // (Withheld credits are not the pool's to take: `window` leaves them out.)
            let back = pool.reclaim(self.window, self.rx_unreturned - keep);
            self.window -= back;
            self.rx_unreturned -= back;
        }
        if std::mem::take(&mut self.starved) {
            h.flags |= wire::FLAG_CREDIT_WANTED;
        }
        let grant = self.rx_unreturned.min(u32::from(u16::MAX));
        self.rx_unreturned -= grant;
        h.credits = grant as u16;
        h.seq = self.tx_seq;
        self.tx_seq = self.tx_seq.wrapping_add(1);
        h
    }
}
