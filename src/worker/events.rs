//! What the transports report: work completions, received frames, READ results and
//! connection events, turned into engine inputs.

use super::*;

impl Protocol {
    #[cfg(feature = "rdma")]
    pub(super) fn deliver(&mut self, conn: ConnId, id: u64, buf: RegisteredBuf, len: usize) {
        let bytes = &buf[..len.min(buf.len())];
        self.engine.handle_frame(conn, RecvBufId(id), bytes);
        self.recv_held.insert(id, RecvBuf::Rdma(buf));
    }

    #[cfg(feature = "rdma")]
    pub(super) fn on_completion(&mut self, wc: rdmx_conn::Completion, out: &mut AfterUnlock) {
        let ok = wc.status.is_success();
        match (wc.kind, wc.cookie & COOKIE_KIND) {
            (WorkKind::Recv, _) => {
                let Some(buf) = wc.buffer else { return };
                let id = wc.cookie;
                if !ok {
                    if wc.status != WcStatus::FLUSHED {
                        out.reposts.push((buf, id));
                        // The QP is in the error state now: the connection is lost, typically
                        // because the peer sent more than a receive buffer holds.
                        let why = format!(
                            "a receive failed ({}): the peer sent a frame larger than the \
                             {}-byte receive buffer, or the connection broke",
                            wc.status.description(),
                            self.engine.config().recv_buf_size
                        );
                        log::warn!("{why}");
                        let cs = self
                            .qp_map
                            .get(&wc.qp_num)
                            .and_then(|id| self.conns.get(id))
                            .cloned();
                        if let Some(cs) = cs {
                            self.engine.handle_connection_down(cs.id);
                            self.start_closing(&cs, why, out);
                        }
                    }
                    return;
                }
                match self.qp_map.get(&wc.qp_num) {
                    Some(&conn) => self.deliver(conn, id, buf, wc.byte_len as usize),
                    None => self.parked.push(Parked {
                        qp: wc.qp_num,
                        id,
                        buf,
                        len: wc.byte_len as usize,
                        since: crate::clock::coarse_now_ns(),
                    }),
                }
            }
            (_, COOKIE_SEND) => {
                // A flushing endpoint waits for its sends' work to complete.
                out.news = true;
                let conn = ConnId(wc.cookie & !COOKIE_KIND);
                if let Some(buf) = wc.buffer {
                    self.send_pool.give(buf);
                }
                if let Some(cs) = self.conns.get(&conn) {
                    if let Some(link) = cs.rdma() {
                        link.completed();
                    }
                    out.flush(cs);
                    if !ok && !cs.closing.load(Ordering::Acquire) {
                        log::warn!(
                            "send on {conn:?} to {:?} failed: {}",
                            cs.peer,
                            wc.status.description()
                        );
                    }
                }
                self.engine.handle_send_complete(conn, ok);
            }
            (WorkKind::Bind, _) => {
                // The bind's record (and with it, maybe, the window's last hold) is gone.
                self.release_held(out);
                let conn = ConnId(wc.cookie & !COOKIE_KIND);
                if let Some(cs) = self.conns.get(&conn) {
                    if let Some(link) = cs.rdma() {
                        link.completed();
                    }
                    out.flush(cs);
                    if !ok && !cs.is_closing() {
                        // The QP is in the error state: the connection fails as a whole.
                        log::warn!(
                            "binding a memory window on {conn:?} failed: {}",
                            wc.status.description()
                        );
                    }
                }
            }
            (_, COOKIE_READ) => {
                if !ok {
                    log::debug!("RDMA READ failed: {}", wc.status.description());
                }
                self.read_done(wc.cookie & !COOKIE_KIND, wc.buffer, ok, true, out);
            }
            _ => log::debug!("completion with unknown cookie {:#x}", wc.cookie),
        }
    }

    /// A READ completed (`posted`) or could not be posted: give its piece back and report it.
    pub(super) fn read_done(
        &mut self,
        key: u64,
        buf: Option<ReadPiece>,
        ok: bool,
        posted: bool,
        out: &mut AfterUnlock,
    ) {
        let Some(r) = self.reads.remove(&key) else {
            return;
        };
        if let Some(cs) = self.conns.get(&r.conn).cloned() {
            match &cs.link {
                #[cfg(feature = "rdma")]
                Link::Rdma(link) if posted => link.completed(),
                Link::Tcp(link) => {
                    // The link hands the destination back once no READ into it is left.
                    if let (Some(vec), Some(mem)) =
                        (link.reclaim(r.buf.0), self.user_bufs.get_mut(&r.buf))
                    {
                        *mem = UserMem::Plain(vec);
                    }
                }
                #[cfg(feature = "rdma")]
                Link::Rdma(_) => {}
            }
            out.flush(&cs);
        }
        if let (Some(buf), Some(mem)) = (buf, self.user_bufs.get_mut(&r.buf)) {
            #[cfg(feature = "rdma")]
            mem.put_back(r.off, buf);
            #[cfg(not(feature = "rdma"))]
            match (buf, mem) {}
        }
        if self.orphans.contains(&r.buf) {
            if self.user_bufs.get(&r.buf).map_or(true, |m| !m.in_flight()) {
                self.orphans.remove(&r.buf);
                self.user_bufs.remove(&r.buf);
            }
            return;
        }
        self.engine.handle_read_complete(r.request, r.off, ok);
    }

    /// A connection is destroyed with RDMA READs still posted on it: they will never complete,
    /// and their targets go with its QP. Each is reported failed and its piece written off, so
    /// that the buffer it belongs to is freed (or its request failed) instead of waiting for
    /// ever.
    pub(super) fn reads_lost_with(&mut self, conn: ConnId, out: &mut AfterUnlock) {
        let lost: Vec<u64> = self
            .reads
            .iter()
            .filter(|(_, r)| r.conn == conn)
            .map(|(&k, _)| k)
            .collect();
        if !lost.is_empty() {
            log::debug!("{conn:?}: {} READs lost with the connection", lost.len());
        }
        for key in lost {
            let buf = self.reads[&key].buf;
            #[cfg(feature = "rdma")]
            if let Some(mem) = self.user_bufs.get_mut(&buf) {
                mem.lose_piece();
            }
            #[cfg(not(feature = "rdma"))]
            let _ = buf;
            self.read_done(key, None, false, true, out);
        }
    }

    #[cfg(feature = "rdma")]
    pub(super) fn on_post_failure(
        &mut self,
        cs: &Arc<Conn>,
        item: Outgoing,
        out: &mut AfterUnlock,
    ) {
        match item {
            Outgoing::Frame { buf, .. } => {
                self.send_pool.give(buf);
                self.engine.handle_send_complete(cs.id, false);
            }
            Outgoing::Inline { .. } => self.engine.handle_send_complete(cs.id, false),
            Outgoing::Read { target, cookie, .. } => {
                self.read_done(cookie & !COOKIE_KIND, Some(target), false, false, out)
            }
            Outgoing::Bind(_) => {
                // The RTS behind it would announce a key that grants nothing.
                self.engine.handle_connection_down(cs.id);
                self.start_closing(cs, "cannot bind a memory window".to_string(), out);
            }
            Outgoing::Disconnect => {}
        }
    }

    #[cfg(feature = "rdma")]
    pub(super) fn on_cm_event(&mut self, id: ConnId, ev: CmEvent, out: &mut AfterUnlock) {
        match ev.kind {
            CmEventKind::DISCONNECTED | CmEventKind::DEVICE_REMOVAL => {
                let Some(cs) = self.conns.get(&id).cloned() else {
                    return;
                };
                if !cs.closing.load(Ordering::Acquire) {
                    log::info!("{id:?}: {:?} disconnected ({})", cs.peer, ev.kind.name());
                }
                self.engine.handle_connection_down(id);
                let why = if ev.kind == CmEventKind::DISCONNECTED {
                    "the peer disconnected (rdmacm DISCONNECTED)"
                } else {
                    "the RDMA device was removed"
                };
                self.start_closing(&cs, why.to_string(), out);
            }
            other => log::debug!("{id:?}: {}", other.name()),
        }
    }

    pub(super) fn on_tcp_event(
        &mut self,
        cs: &Arc<Conn>,
        ev: rdmx_tcp::Event,
        out: &mut AfterUnlock,
    ) {
        match ev {
            rdmx_tcp::Event::Frame(bytes) => {
                if cs.is_closing() {
                    return;
                }
                let id = self.next_tcp_frame;
                self.next_tcp_frame += 1;
                self.engine.handle_frame(cs.id, RecvBufId(id), &bytes);
                self.recv_held.insert(id, RecvBuf::Tcp(bytes, cs.id));
            }
            rdmx_tcp::Event::ReadRequest {
                read_id,
                addr,
                rkey,
                len,
            } => self.answer_read(cs, read_id, (addr, rkey, len), out),
            rdmx_tcp::Event::ReadDone { read_id, ok } => {
                self.read_done(read_id, None, ok, true, out)
            }
            rdmx_tcp::Event::Closed { reason } => {
                if !cs.is_closing() {
                    log::info!("{:?}: {:?} closed: {reason}", cs.id, cs.peer);
                }
                self.tcp_down(cs, format!("connection lost: {reason}"), out);
            }
        }
    }

    /// TCP: takes back every buffer lent to the link as a READ destination.
    pub(super) fn reclaim_lent(&mut self, cs: &Conn) {
        if let Some(link) = cs.tcp() {
            for (key, vec) in link.reclaim_all() {
                if let Some(mem) = self.user_bufs.get_mut(&UserBufId(key)) {
                    *mem = UserMem::Plain(vec);
                }
            }
        }
    }

    /// TCP: the link is gone. Its requests fail, its lent buffers come back, and every READ
    /// it owed is reported failed.
    pub(super) fn tcp_down(&mut self, cs: &Arc<Conn>, reason: String, out: &mut AfterUnlock) {
        self.engine.handle_connection_down(cs.id);
        self.reclaim_lent(cs);
        let owed: Vec<u64> = self
            .reads
            .iter()
            .filter(|(_, r)| r.conn == cs.id)
            .map(|(&k, _)| k)
            .collect();
        for key in owed {
            self.read_done(key, None, false, true, out);
        }
        self.start_closing(cs, reason, out);
    }
}
