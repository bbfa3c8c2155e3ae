//! Sends: eager frames, rendezvous RTS once the buffer is exposed, and the credit flow
//! that paces both.

use super::*;

impl Engine {
    /// Starts a tag send of the first `len` bytes of `buf`. Messages of at most the
    /// connection's eager limit go eager (completed once the driver copied them); larger
    /// ones use rendezvous (an [`Action::ExposeSendBuffer`] is emitted first).
    pub fn tag_send(
        &mut self,
        conn: ConnId,
        tag: Tag,
        buf: UserBufId,
        len: u64,
    ) -> Result<RequestId, Error> {
        let Some(c) = self.conns.get(&conn) else {
            return Err(Error::UnknownConnection(conn));
        };
        let eager = len <= c.eager_limit;
        if eager && c.data_q.is_empty() && c.ctrl_q.is_empty() && c.tx_credits >= 2 {
            // Nothing queued ahead and credit to spare: the message goes out now and the send
            // completes with it, never stored (what `flush` would do, without the table).
            let id = RequestId(IMMEDIATE | self.next_immediate);
            self.next_immediate = (self.next_immediate + 1) & !IMMEDIATE;
            let mut h = Header::new(Opcode::Eager);
            h.tag = tag;
            h.sreq = id.0;
            h.payload_len = len as u32;
            self.emit_frame(conn, h, None, Some(PayloadRef { buf, len }));
            self.actions.push_back(Action::Complete(Completion {
                request: id,
                kind: RequestKind::Send,
                status: Status::Ok,
                length: len,
                tag,
                conn: Some(conn),
            }));
            return Ok(id);
        }
        let phase = if eager {
            SendPhase::EagerQueued
        } else {
            SendPhase::RtsQueued { remote: None }
        };
        let id = self.new_req(Req::Send(SendReq {
            conn,
            tag,
            buf,
            len,
            phase,
        }));
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

    /// The driver exposed a rendezvous send buffer.
    pub fn handle_send_buffer_exposed(&mut self, request: RequestId, remote: RemoteBuf) {
        if let Some(Req::Send(s)) = self.reqs.get_mut(request) {
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
        if let Some(Req::Send(s)) = self.reqs.get(request) {
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

    pub(super) fn credit_threshold(&self) -> u32 {
        (u32::from(self.cfg.credits) / 4).max(2)
    }

    pub(super) fn emit_frame(
        &mut self,
        conn_id: ConnId,
        mut h: Header,
        rts: Option<&RtsBody>,
        payload: Option<PayloadRef>,
    ) {
        let c = self
            .conns
            .get_mut(&conn_id)
            .expect("emit on open connection");
        let grant = c.rx_unreturned.min(u32::from(u16::MAX));
        c.rx_unreturned -= grant;
        h.credits = grant as u16;
        h.seq = c.tx_seq;
        c.tx_seq = c.tx_seq.wrapping_add(1);
        c.tx_credits -= 1;
        self.actions.push_back(Action::SendFrame {
            conn: conn_id,
            frame: FrameBuf::encode(&h, rts),
            payload,
        });
    }

    /// Emits every frame of `conn` that credits allow.
    pub(super) fn flush(&mut self, conn_id: ConnId) {
        loop {
            let Some(c) = self.conns.get_mut(&conn_id) else {
                return;
            };
            // Data and control frames leave one credit in reserve for credit updates.
            if c.tx_credits < 2 {
                break;
            }
            if let Some(Ctrl::Ats { sreq, rreq, status }) = c.ctrl_q.pop_front() {
                let mut h = Header::new(Opcode::Ats);
                h.sreq = sreq;
                h.rreq = rreq;
                h.status = status;
                self.emit_frame(conn_id, h, None, None);
                continue;
            }
            let Some(&id) = c.data_q.front() else { break };
            let Some(Req::Send(s)) = self.reqs.get_mut(id) else {
                // Cancelled or failed while queued.
                if let Some(c) = self.conns.get_mut(&conn_id) {
                    c.data_q.pop_front();
                }
                continue;
            };
            let (tag, len, buf) = (s.tag, s.len, s.buf);
            match s.phase {
                SendPhase::EagerQueued => {
                    let mut h = Header::new(Opcode::Eager);
                    h.tag = tag;
                    h.sreq = id.0;
                    h.payload_len = len as u32;
                    self.conns.get_mut(&conn_id).map(|c| c.data_q.pop_front());
                    self.emit_frame(conn_id, h, None, Some(PayloadRef { buf, len }));
                    self.complete(id, RequestKind::Send, Status::Ok, len, tag, Some(conn_id));
                }
                SendPhase::RtsQueued {
                    remote: Some(remote),
                } => {
                    s.phase = SendPhase::AwaitAts;
                    let mut h = Header::new(Opcode::Rts);
                    h.tag = tag;
                    h.sreq = id.0;
                    h.payload_len = wire::RTS_BODY_LEN as u32;
                    let body = RtsBody {
                        addr: remote.addr,
                        rkey: remote.rkey,
                        len,
                    };
                    self.conns.get_mut(&conn_id).map(|c| c.data_q.pop_front());
                    self.emit_frame(conn_id, h, Some(&body), None);
                }
                // Head of line waits for its buffer exposure (send order is preserved).
                SendPhase::RtsQueued { remote: None } => break,
                SendPhase::AwaitAts => {
                    self.conns.get_mut(&conn_id).map(|c| c.data_q.pop_front());
                }
            }
        }
        let threshold = self.credit_threshold();
        if let Some(c) = self.conns.get(&conn_id) {
            if c.rx_unreturned >= threshold && c.tx_credits >= 1 {
                self.emit_frame(conn_id, Header::new(Opcode::Credit), None, None);
            }
        }
    }
}
