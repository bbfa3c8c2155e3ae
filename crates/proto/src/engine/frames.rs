//! Arrivals: a frame is checked (credits, size, sequence), decoded and dispatched.

use super::*;

impl Engine {
    /// A frame arrived in SRQ buffer `buf` on `conn`. The engine keeps nothing of the buffer:
    /// once the driver has executed the actions this call queued (an
    /// [`Action::CopyFromRecvBuf`] out of it among them), it may repost or reuse it. A
    /// malformed frame or a protocol violation closes only this connection.
    pub fn handle_frame(&mut self, conn_id: ConnId, buf: RecvBufId, bytes: &[u8]) {
        if let Some((m, flush)) = self.arrive(conn_id, bytes) {
            if m.len > 0 {
                self.actions.push_back(Action::CopyFromRecvBuf {
                    src: buf,
                    src_offset: m.offset as usize,
                    len: m.len as usize,
                    dst: m.dst,
                    dst_offset: 0,
                });
            }
            self.actions.push_back(Action::Complete(m.completion()));
            if flush {
                self.flush(conn_id);
            }
        }
    }

    /// [`Engine::handle_frame`], but an eager message that completes a posted receive is
    /// handed back instead of queued as [`Action::CopyFromRecvBuf`] and [`Action::Complete`]:
    /// the driver copies its payload out of `bytes` and completes the receive itself (the
    /// common case of a small message, without going through the action queue). Everything
    /// else the frame causes is queued as by `handle_frame`, and its actions name no receive
    /// buffer, so they may run before or after the delivery.
    pub fn handle_frame_delivering(&mut self, conn_id: ConnId, bytes: &[u8]) -> Option<Delivery> {
        let (m, flush) = self.arrive(conn_id, bytes)?;
        if flush {
            self.flush(conn_id);
        }
        Some(m)
    }

    /// Processes a frame; returns the eager message that completed a posted receive, if it
    /// was one, and whether to flush the connection once it is delivered.
    fn arrive(&mut self, conn_id: ConnId, bytes: &[u8]) -> Option<(Delivery, bool)> {
        match self.process_frame(conn_id, bytes) {
            Ok(Processed::Matched(m, flush)) => return Some((m, flush)),
            Ok(Processed::Flush) => self.flush(conn_id),
            Ok(Processed::Quiet) => {}
            Err(reason) => {
                warn!("connection {conn_id:?} closed: {reason:?}");
                self.fail_conn(conn_id, Some(reason));
            }
        }
        None
    }

    /// Checks, decodes and dispatches a frame: what the caller does next.
    ///
    /// (Inlined into its two callers: as a call, the delivery it returns went through memory
    /// inside `Result<Processed>`, written with 8-byte stores and read back with 16-byte
    /// loads, which the CPU cannot forward: 12.5 % of `deliver_bytes`' samples in a perf
    /// profile of the shared-memory receiver, and 18 instructions per message.)
    #[inline(always)]
    fn process_frame(&mut self, conn_id: ConnId, bytes: &[u8]) -> Result<Processed, CloseReason> {
        let Some(c) = self.conns.get_mut(&conn_id) else {
            debug!("frame on unknown connection {conn_id:?} dropped");
            return Ok(Processed::Quiet);
        };
        let recv_buf_size = c.recv_buf_size as usize;
        if bytes.len() > recv_buf_size {
            return Err(too_long(bytes.len(), recv_buf_size));
        }
        let wire::Frame { header: h, body } = wire::decode(bytes).map_err(malformed)?;
        // A CREDIT frame that grants credits costs none (see `send::CTRL_CREDITS`); any
        // other frame costs one. (`window` leaves withheld credits out: see `budget`; the
        // credits of one-sided operations whose replies wait count as unreturned.)
        if !(matches!(body, Body::Credit) && h.credits > 0) {
            c.rx_unreturned += 1;
            if c.rx_unreturned + c.replies_waiting > c.window {
                return Err(overran(c.rx_unreturned + c.replies_waiting, c.window));
            }
        }
        if h.seq != c.rx_seq {
            return Err(out_of_sequence(h.seq, c.rx_seq));
        }
        c.rx_seq = c.rx_seq.wrapping_add(1);
        let new_credits = c.tx_credits + u32::from(h.credits);
        if new_credits > u32::from(c.peer.max_credits) {
            return Err(overgranted(new_credits, c.peer.max_credits));
        }
        c.tx_credits = new_credits;
        // (A window not from the pool stays as it is, and one whose credits are withheld
        // does not grow: see `budget`.)
        if h.flags & wire::FLAG_CREDIT_WANTED != 0 && c.pooled && c.withheld == 0 {
            let more = self.credits.grow(c.window);
            c.window += more;
            c.rx_unreturned += more;
        }
        // An eager message or a credit update adds nothing to send: unless frames wait for
        // credits or the peer is owed a credit update, there is nothing to flush after it.
        let quiet = c.ctrl_q.is_empty() && c.data_q.is_empty() && !c.credit_due();
        let flush = if quiet {
            Processed::Quiet
        } else {
            Processed::Flush
        };
        match body {
            Body::Eager(payload) => {
                if let Some(p) = self.take_posted_match(h.tag) {
                    let len = payload.len() as u64;
                    if len > p.cap {
                        self.complete_posted(p, Status::Truncated, len, h.tag, Some(conn_id));
                        return Ok(flush);
                    }
                    // (The frame fits its receive buffer, whose size is a u32: checked above.)
                    let delivery = Delivery {
                        request: p.req,
                        dst: p.buf,
                        tag: h.tag,
                        conn: conn_id,
                        offset: HEADER_LEN as u32,
                        len: payload.len() as u32,
                    };
                    return Ok(Processed::Matched(delivery, !quiet));
                }
                let data = self.payload_copy(payload);
                self.push_unexpected(conn_id, h.tag, UnexpKind::Eager(data))?;
                return Ok(flush);
            }
            Body::Rts(body) => {
                if let Some(p) = self.take_posted_match(h.tag) {
                    self.start_rndv(p, conn_id, h.tag, h.sreq, body);
                } else {
                    self.push_unexpected(conn_id, h.tag, UnexpKind::Rts { sreq: h.sreq, body })?;
                }
            }
            Body::Ats => {
                let req = RequestId(h.sreq);
                match self.reqs.get(req) {
                    Some(s) if s.conn == conn_id && matches!(s.phase, SendPhase::AwaitAts) => {
                        let (tag, len, sbuf) = (s.tag, s.len, s.buf);
                        let status = match h.status {
                            WireStatus::Ok => Status::Ok,
                            WireStatus::Truncated => Status::RemoteTruncated,
                            // (Decoding lets no RMA refusal into an ATS.)
                            _ => Status::RemoteReadFailed,
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
            Body::Credit => return Ok(flush),
            Body::Error => return Err(CloseReason::PeerError(h.status)),
            Body::Handshake(_) => return Err(perr("unexpected in-band handshake".into())),
            // (Given the frame's bytes, not its header, to decode again: the header of
            // every frame would be kept in memory for a reference to it.)
            Body::OneSided(_) => self.one_sided_frame(conn_id, bytes)?,
        }
        Ok(Processed::Flush)
    }
}

// Why [`Engine::process_frame`] closes a connection: made out of line, as cold calls, so
// that their formatting is not inlined into the path of every frame, where it took
// registers the path needs.

#[cold]
#[inline(never)]
fn overran(unreturned: u32, window: u32) -> CloseReason {
    perr(format!(
        "peer overran its credits ({unreturned} frames unreturned, {window} granted)"
    ))
}

#[cold]
#[inline(never)]
fn too_long(len: usize, recv_buf_size: usize) -> CloseReason {
    perr(format!(
        "{len}-byte frame exceeds the {recv_buf_size}-byte receive buffer"
    ))
}

#[cold]
#[inline(never)]
fn malformed(e: wire::DecodeError) -> CloseReason {
    perr(e.to_string())
}

#[cold]
#[inline(never)]
fn out_of_sequence(seq: u32, expected: u32) -> CloseReason {
    perr(format!("sequence {seq} where {expected} was expected"))
}

#[cold]
#[inline(never)]
fn overgranted(credits: u32, max: u16) -> CloseReason {
    perr(format!(
        "peer granted {credits} credits, more than the {max} it advertised"
    ))
}

/// What [`Engine::process_frame`] leaves its caller to do.
pub(super) enum Processed {
    /// Nothing more.
    Quiet,
    /// Flush the connection: frames may wait for the credits it brought, or the peer is
    /// owed a credit update.
    Flush,
    /// Deliver an eager message into the receive it matched (the engine forgot the
    /// receive), then flush if true.
    Matched(Delivery, bool),
}

/// An eager message for a posted receive, handed to the driver by
/// [`Engine::handle_frame_delivering`]: it copies the frame's [`Delivery::payload`] into
/// `dst` (at its start), then completes the receive with [`Delivery::completion`], as it
/// would execute [`Action::CopyFromRecvBuf`] and [`Action::Complete`]. (Small: it is handed
/// back for every small message.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// The receive.
    pub request: RequestId,
    /// The receive's buffer.
    pub dst: UserBufId,
    /// The message's tag (the sender's).
    pub tag: Tag,
    /// The connection it came on.
    pub conn: ConnId,
    /// Where the payload starts in the frame.
    pub offset: u32,
    /// Payload bytes (at most the receive's capacity; 0 copies nothing): the message's
    /// length.
    pub len: u32,
}

impl Delivery {
    /// The payload's bytes in the frame.
    #[inline]
    pub fn payload(&self) -> std::ops::Range<usize> {
        self.offset as usize..self.offset as usize + self.len as usize
    }

    /// The receive's completion (status `Ok`).
    pub fn completion(&self) -> Completion {
        Completion {
            request: self.request,
            kind: RequestKind::Recv,
            status: Status::Ok,
            length: u64::from(self.len),
            tag: self.tag,
            conn: Some(self.conn),
            buf: Some(self.dst),
        }
    }
}
