//! What the transports report ([`LinkEvent`]s: received frames, sends, exposures and READs
//! finished, connections lost), turned into engine inputs.

use super::*;

impl Protocol {
    /// Turns `ev` into engine inputs. Returns the connection of a frame it delivered if
    /// that connection's input is paused now (see [`Protocol::deliver`]).
    pub(super) fn on_link_event(&mut self, ev: LinkEvent, out: &mut AfterUnlock) -> Option<ConnId> {
        match ev {
            LinkEvent::Frame { conn, frame, len } => {
                return self.deliver(conn, frame, len, out).then_some(conn)
            }
            LinkEvent::SendDone { conn, error } => {
                // A flushing endpoint waits for its sends' work to complete.
                out.news = true;
                if let Some(cs) = self.conns.get(&conn) {
                    // (Flushed only if work waits for the room: most sends leave nothing.)
                    if cs.link.work_done() {
                        out.flush(cs);
                    }
                    if let (Some(e), false) = (&error, cs.is_closing()) {
                        log::warn!("send on {conn:?} to {:?} failed: {e}", cs.peer);
                    }
                }
                self.engine.handle_send_complete(conn, error.is_none());
            }
            LinkEvent::SendFailed { conn } => self.engine.handle_send_complete(conn, false),
            LinkEvent::Bound { conn, error } => {
                // The bind's record (and with it, maybe, the window's last hold) is gone.
                self.release_held(out);
                if let Some(cs) = self.conns.get(&conn) {
                    let _ = cs.link.work_done();
                    out.flush(cs);
                    if let (Some(e), false) = (&error, cs.is_closing()) {
                        // The connection fails as a whole (RDMA: its QP is in the error state).
                        log::warn!("{conn:?}: {e}");
                    }
                }
            }
            LinkEvent::ReadDone {
                key,
                piece,
                ok,
                refused,
                value,
                posted,
            } => {
                let end = WorkEnd { ok, refused, value };
                self.read_done(key, piece, end, posted, out)
            }
            LinkEvent::Down {
                conn,
                reason,
                reads_lost,
            } => {
                let cs = self.conns.get(&conn).cloned()?;
                if !cs.is_closing() {
                    log::info!("{conn:?}: {:?}: {reason}", cs.peer);
                }
                self.link_down(&cs, reason, reads_lost, out);
            }
        }
        None
    }

    /// A frame arrived on `conn`: the engine reads it, an eager message for a posted receive
    /// is copied into the receive's buffer here (no action of the engine reads a frame: see
    /// [`Engine::handle_frame_delivering`]), the actions it queued run, and its buffer goes
    /// back to its link. Frames on closing connections go straight back: the engine forgot
    /// the connection before it started closing (every way a connection starts closing
    /// follows the engine's `fail_conn`), and drops what arrives on a connection it does not
    /// know. Returns whether the link's input is paused now: the frame's answers took its
    /// output queue past its limit (TCP), and its next frames are to wait.
    fn deliver(
        &mut self,
        conn: ConnId,
        frame: RecvFrame,
        len: usize,
        out: &mut AfterUnlock,
    ) -> bool {
        self.deliver_bytes(conn, &frame[..len.min(frame.len())], out);
        super::executor::give_back(&self.conns, frame, conn, &mut out.deferred)
    }

    /// [`Protocol::deliver`] of a frame's bytes, which stay the caller's (shared memory's
    /// frames, copied out of their ring into one buffer: see
    /// [`crate::transport::ifaces::Ifaces::deliver_shm`]).
    pub(super) fn deliver_bytes(&mut self, conn: ConnId, bytes: &[u8], out: &mut AfterUnlock) {
        // (Not looked up in `conns` first: see `deliver`.)
        if let Some(d) = self.engine.handle_frame_delivering(conn, bytes) {
            let data = bytes.get(d.payload());
            self.deliver_eager(d, data, out);
        }
        // (What else it caused runs now, before the next event: completions keep the order
        // of arrival.)
        self.run_actions(out);
    }

    /// A READ completed (`posted`) or could not be posted: give its piece back and report it.
    pub(super) fn read_done(
        &mut self,
        key: u64,
        piece: Option<ReadPiece>,
        end: WorkEnd,
        posted: bool,
        out: &mut AfterUnlock,
    ) {
        let Some(r) = self.reads.remove(&key) else {
            return;
        };
        if let Some(cs) = self.conns.get(&r.conn) {
            if posted {
                let _ = cs.link.work_done();
            }
            cs.link.read_finished(r.buf, self.requests.mem_mut(r.buf));
            out.flush(cs);
        }
        match (piece, r.bounce) {
            // Through a bounce buffer: a get's bytes are copied out of it, and it goes back.
            (Some(piece), Some((len, copy))) => {
                if let (true, true, Some(mem)) = (end.ok, copy, self.requests.mem_mut(r.buf)) {
                    #[cfg(feature = "rdma")]
                    if !mem.write_at(r.off, &piece[..len as usize]) {
                        log::error!("a get's {len} bytes do not fit its buffer");
                    }
                    let _ = (mem, len);
                }
                self.ifaces.give_bounce(piece);
            }
            (Some(piece), None) => {
                if let Some(mem) = self.requests.mem_mut(r.buf) {
                    mem.put_back(r.off, piece);
                }
            }
            (None, _) => {}
        }
        if self.orphans.contains(&r.buf) {
            if self.requests.mem(r.buf).map_or(true, |m| !m.in_flight()) {
                self.orphans.remove(&r.buf);
                self.requests.take_mem(r.buf);
            }
            return;
        }
        if r.rma {
            let result = match end {
                WorkEnd {
                    ok: true, value, ..
                } => Ok(value),
                WorkEnd { refused: true, .. } => Err(VerbsFailure::RemoteAccess),
                _ => Err(VerbsFailure::Broken),
            };
            self.engine.handle_rma_verbs_done(r.request, result);
        } else {
            self.engine.handle_read_complete(r.request, r.off, end.ok);
        }
    }

    /// A connection is destroyed with READs still posted on it: they will never complete,
    /// and their targets go with it. Each is reported failed and its piece written off, so
    /// that the buffer it belongs to is freed (or its request failed) instead of waiting for
    /// ever.
    pub(super) fn reads_lost_with(&mut self, conn: ConnId, out: &mut AfterUnlock) {
        let lost = self.reads_on(conn);
        if !lost.is_empty() {
            log::debug!("{conn:?}: {} READs lost with the connection", lost.len());
        }
        for key in lost {
            let buf = self.reads[&key].buf;
            if let Some(mem) = self.requests.mem_mut(buf) {
                mem.lose_piece();
            }
            self.read_done(key, None, WorkEnd::FAILED, true, out);
        }
    }

    /// The keys of the READs started on `conn` and not yet reported.
    fn reads_on(&self, conn: ConnId) -> Vec<u64> {
        self.reads
            .iter()
            .filter(|(_, r)| r.conn == conn)
            .map(|(&k, _)| k)
            .collect()
    }

    /// Takes back every buffer lent to `cs`'s link as a READ destination.
    pub(super) fn reclaim_lent(&mut self, cs: &Conn) {
        for (buf, vec) in cs.link.reclaim_lent() {
            if let Some(mem) = self.requests.mem_mut(buf) {
                *mem = UserMem::Plain(vec);
            }
        }
    }

    /// The link of `cs` is lost: its requests fail, its lent buffers come back, every READ it
    /// owed is reported failed if they are lost with it (`reads_lost`; otherwise they are
    /// reported as they flush), and it closes for `reason`.
    pub(super) fn link_down(
        &mut self,
        cs: &Arc<Conn>,
        reason: String,
        reads_lost: bool,
        out: &mut AfterUnlock,
    ) {
        self.engine.handle_connection_down(cs.id);
        self.reclaim_lent(cs);
        if reads_lost {
            for key in self.reads_on(cs.id) {
                self.read_done(key, None, WorkEnd::FAILED, true, out);
            }
        }
        self.start_closing(cs, reason, out);
    }
}
