//! Arrivals: a frame is checked (credits, size, sequence), decoded and dispatched.

use super::*;

impl Engine {
    /// A frame arrived in SRQ buffer `buf` on `conn`. The engine keeps nothing of the buffer:
    /// once the driver has executed the actions this call queued (an
    /// [`Action::CopyFromRecvBuf`] out of it among them), it may repost or reuse it. A
    /// malformed frame or a protocol violation closes only this connection.
    pub fn handle_frame(&mut self, conn_id: ConnId, buf: RecvBufId, bytes: &[u8]) {
        let result = self.process_frame(conn_id, buf, bytes);
        match result {
            Ok(true) => self.flush(conn_id),
            Ok(false) => {}
            Err(reason) => {
                warn!("connection {conn_id:?} closed: {reason:?}");
                self.fail_conn(conn_id, Some(reason));
            }
        }
    }

    pub(super) fn process_frame(
        &mut self,
        conn_id: ConnId,
        buf: RecvBufId,
        bytes: &[u8],
    ) -> Result<bool, CloseReason> {
        let Some(c) = self.conns.get_mut(&conn_id) else {
            debug!("frame on unknown connection {conn_id:?} dropped");
            return Ok(false);
        };
        let recv_buf_size = c.recv_buf_size as usize;
        c.rx_unreturned += 1;
        if c.rx_unreturned > c.window {
            return Err(perr(format!(
                "peer overran its credits ({} frames unreturned, {} granted)",
                c.rx_unreturned, c.window
            )));
        }
        if bytes.len() > recv_buf_size {
            return Err(perr(format!(
                "{}-byte frame exceeds the {recv_buf_size}-byte receive buffer",
                bytes.len()
            )));
        }
        let frame = wire::decode(bytes).map_err(|e| perr(e.to_string()))?;
        let h = frame.header;
        if h.seq != c.rx_seq {
            return Err(perr(format!(
                "sequence {} where {} was expected",
                h.seq, c.rx_seq
            )));
        }
        c.rx_seq = c.rx_seq.wrapping_add(1);
        let new_credits = c.tx_credits + u32::from(h.credits);
        if new_credits > u32::from(c.peer.max_credits) {
            return Err(perr(format!(
                "peer granted {} credits, more than the {} it advertised",
                new_credits, c.peer.max_credits
            )));
        }
        c.tx_credits = new_credits;
        if h.flags & wire::FLAG_CREDIT_WANTED != 0 {
            let more = self.credits.grow(c.window);
            c.window += more;
            c.rx_unreturned += more;
        }
        let threshold = c.credit_threshold();
        // An eager message or a credit update adds nothing to send: unless frames wait for
        // credits or the peer is owed a credit update, there is nothing to flush after it.
        let quiet = c.ctrl_q.is_empty() && c.data_q.is_empty() && c.rx_unreturned < threshold;
        match frame.body {
            Body::Eager(payload) => {
                if let Some(p) = self.take_posted_match(h.tag) {
                    let Some(Req::Recv(r)) = self.reqs.get(p.req) else {
                        return Ok(!quiet);
                    };
                    let len = payload.len() as u64;
                    if len > r.cap {
                        self.complete(
                            p.req,
                            RequestKind::Recv,
                            Status::Truncated,
                            len,
                            h.tag,
                            Some(conn_id),
                        );
                    } else {
                        if len > 0 {
                            self.actions.push_back(Action::CopyFromRecvBuf {
                                src: buf,
                                src_offset: HEADER_LEN,
                                len: payload.len(),
                                dst: r.buf,
                                dst_offset: 0,
                            });
                        }
                        self.complete(
                            p.req,
                            RequestKind::Recv,
                            Status::Ok,
                            len,
                            h.tag,
                            Some(conn_id),
                        );
                    }
                } else {
                    let data = self.payload_copy(payload);
                    self.push_unexpected(conn_id, h.tag, UnexpKind::Eager(data));
                }
                return Ok(!quiet);
            }
            Body::Rts(body) => {
                if let Some(p) = self.take_posted_match(h.tag) {
                    self.start_rndv(p.req, conn_id, h.tag, h.sreq, body);
                } else {
                    self.push_unexpected(conn_id, h.tag, UnexpKind::Rts { sreq: h.sreq, body });
                }
            }
            Body::Ats => {
                let req = RequestId(h.sreq);
                match self.reqs.get(req) {
                    Some(Req::Send(s))
                        if s.conn == conn_id && matches!(s.phase, SendPhase::AwaitAts) =>
                    {
                        let (tag, len, sbuf) = (s.tag, s.len, s.buf);
                        let status = match h.status {
                            WireStatus::Ok => Status::Ok,
                            WireStatus::Truncated => Status::RemoteTruncated,
                            WireStatus::ReadFailed | WireStatus::Protocol => {
                                Status::RemoteReadFailed
                            }
                        };
                        self.actions.push_back(Action::ReleaseSendBuffer {
                            request: req,
                            buf: sbuf,
                        });
                        self.complete(req, RequestKind::Send, status, len, tag, Some(conn_id));
                    }
                    _ => debug!("ATS for unknown or cancelled request {req:?}"),
                }
            }
            Body::Credit => return Ok(!quiet),
            Body::Error => return Err(CloseReason::PeerError(h.status)),
            Body::Handshake(_) => return Err(perr("unexpected in-band handshake".into())),
        }
        Ok(true)
    }
}
