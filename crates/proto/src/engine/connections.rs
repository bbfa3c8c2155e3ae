//! Connections: coming up (handshake checks, the initial grant), going down, and failing
//! everything that was pending on one.

use super::*;
use crate::wire::MAX_RECV_BUF_SIZE;

impl Engine {
    /// A connection is established; `peer` is the handshake the peer sent.
    pub fn handle_connection_up(&mut self, conn: ConnId, peer: &Handshake) -> Result<(), Error> {
        self.handle_connection_up_with(conn, peer, self.default_limits())
    }

    /// A connection is established with this side's `limits` on it (the receive buffer size
    /// its handshake advertised, which is also the largest frame it accepts there, its
    /// eager threshold, and the credits its handshake granted); `peer` is the handshake the
    /// peer sent.
    pub fn handle_connection_up_with(
        &mut self,
        conn: ConnId,
        peer: &Handshake,
        limits: ConnLimits,
    ) -> Result<(), Error> {
        if self.conns.contains_key(&conn) {
            return Err(Error::DuplicateConnection(conn));
        }
        if peer.magic != HANDSHAKE_MAGIC || peer.version != u16::from(VERSION) {
            return Err(Error::Handshake(format!(
                "peer speaks version {} (magic {:#x}), this engine version {VERSION}",
                peer.version, peer.magic
            )));
        }
        if (peer.recv_buf_size as usize) < MAX_CTRL_FRAME {
            return Err(Error::Handshake(format!(
                "peer receive buffers of {} bytes cannot hold a {MAX_CTRL_FRAME}-byte control frame",
                peer.recv_buf_size
            )));
        }
        // (An upper bound too: what the peer declares sizes the frames sent to it, and
        // what it may ask of this side — within this side's own bounds besides.)
        if peer.recv_buf_size > MAX_RECV_BUF_SIZE {
            return Err(Error::Handshake(format!(
                "peer receive buffers of {} bytes: more than the {MAX_RECV_BUF_SIZE}-byte \
                 largest frame any transport carries",
                peer.recv_buf_size
            )));
        }
        if peer.credits < crate::config::MIN_CREDITS || peer.max_credits < peer.credits {
            return Err(Error::Handshake(format!(
                "peer grants {} credits growing to {}: at least {} are needed, and no more \
                 than the most it grants",
                peer.credits,
                peer.max_credits,
                crate::config::MIN_CREDITS
            )));
        }
        let eager_limit = limits
            .eager_threshold
            .min(u64::from(peer.recv_buf_size) - HEADER_LEN as u64);
        self.conns.insert(
            conn,
            Conn {
                peer: *peer,
                recv_buf_size: limits.recv_buf_size,
                eager_limit,
                tx_credits: peer.credits.into(),
                starved: false,
                window: if limits.pooled {
                    self.credits.admit(limits.credits)
                } else {
                    u32::from(limits.credits)
                },
                pooled: limits.pooled,
                // (0: the configuration's, which `Config::builder` keeps at 1 or more.)
                rndv_chunk: match limits.rndv_chunk {
                    0 => self.cfg.rndv_chunk_size,
                    n => n,
                },
                rx_unreturned: 0,
                withheld: 0,
                unexpected: 0,
                tx_seq: 0,
                rx_seq: 0,
                ctrl_q: VecDeque::new(),
                data_q: VecDeque::new(),
                rma_pending: 0,
                replies_waiting: 0,
                fence_next: false,
                verbs_rma: limits.verbs_rma,
                reads_out: 0,
                reads_waiting: VecDeque::new(),
            },
        );
        Ok(())
    }

    /// The transport reports the connection gone: every pending request on it fails with
    /// [`Status::ConnectionClosed`] (receives with READs in flight once those are
    /// reported, or at the drain timeout).
    pub fn handle_connection_down(&mut self, conn: ConnId) {
        self.fail_conn(conn, None);
    }

    /// Closes a connection locally: like [`Engine::handle_connection_down`], plus a
    /// [`Action::CloseConnection`] for the driver.
    pub fn close(&mut self, conn: ConnId) {
        self.fail_conn(conn, Some(CloseReason::Local));
    }

    /// Advances the engine's clock (ns, any monotonic origin) and fires expired timeouts.
    pub fn handle_timeout(&mut self, now: u64) {
        self.now = self.now.max(now);
        let now = self.now;
        self.expire_rendezvous(now);
        let expired: Vec<RequestId> = self
            .draining
            .iter()
            .filter(|d| d.0 <= now)
            .map(|d| d.1)
            .collect();
        self.draining.retain(|d| d.0 > now);
        for r in expired {
            if let Some(rr) = self.recvs.get(&r) {
                let (tag, conn) = (rr.tag, rr.reading.as_ref().map(|x| x.conn));
                warn!("request {r:?}: READs not reported within the drain timeout");
                self.complete(r, RequestKind::Recv, Status::ConnectionClosed, 0, tag, conn);
            }
        }
    }

    /// A send completion; a failed one (e.g. retry exceeded, flush) closes the connection.
    pub fn handle_send_complete(&mut self, conn: ConnId, ok: bool) {
        if !ok {
            self.fail_conn(conn, Some(CloseReason::SendFailed));
        }
    }

    pub(super) fn fail_conn(&mut self, conn_id: ConnId, reason: Option<CloseReason>) {
        let Some(mut conn) = self.conns.remove(&conn_id) else {
            return;
        };
        debug!("connection {conn_id:?} failed: {reason:?}");
        if conn.pooled {
            // (Withheld credits are granted too.)
            self.credits.release(conn.window + conn.withheld);
        }
        self.orphan_unexpected(conn.unexpected);
        if let Some(CloseReason::ProtocolError(_)) = reason {
            if conn.tx_credits >= 1 {
                let mut h = Header::new(Opcode::Error);
                h.status = WireStatus::Protocol;
                h.seq = conn.tx_seq;
                conn.tx_seq = conn.tx_seq.wrapping_add(1);
                self.actions.push_back(Action::SendFrame {
                    conn: conn_id,
                    frame: FrameBuf::encode(&h, None),
                    payload: None,
                });
            }
        }
        // Receives whose data arrived and whose ATS waited for credits: done all the same.
        for ctrl in conn.ctrl_q.drain(..) {
            // (An RMA reply is the peer's: it is gone with the connection.)
            if let Ctrl::Ats {
                then: Some(done), ..
            } = ctrl
            {
                report(&mut self.reqs, &mut self.recvs, &mut self.actions, done);
            }
        }
        // In the order they were made, whatever the table's order.
        for id in self.requests_on(conn_id) {
            if let Some(s) = self.reqs.get_mut(id) {
                let (tag, len, buf, kind) = (s.tag, s.len, s.buf, s.phase.kind());
                if s.phase.exposes() {
                    self.actions
                        .push_back(Action::ReleaseSendBuffer { request: id, buf });
                }
                self.complete(id, kind, Status::ConnectionClosed, len, tag, Some(conn_id));
                continue;
            }
            let Some(rr) = self.recvs.get_mut(&id) else {
                continue;
            };
            let tag = rr.tag;
            let Some(rd) = rr.reading.as_mut() else {
                continue;
            };
            rd.conn_dead = true;
            rd.failed = Some(Status::ConnectionClosed);
            if rd.outstanding.is_empty() {
                self.complete(
                    id,
                    RequestKind::Recv,
                    Status::ConnectionClosed,
                    0,
                    tag,
                    Some(conn_id),
                );
            } else {
                self.draining
                    .push((self.now.saturating_add(self.cfg.drain_timeout_ns), id));
            }
        }
        if let Some(reason) = reason {
            self.actions.push_back(Action::CloseConnection {
                conn: conn_id,
                reason,
            });
        }
    }
}
