//! Carrying out the protocol engine's actions: frames, buffer exposure and release, READs,
//! copies and completions.

use super::*;

impl Protocol {
    pub(super) fn new_buf(&mut self, mem: UserMem) -> UserBufId {
        self.user_bufs.insert(mem)
    }

    /// Records a request the engine accepted, with its buffer and (for sends) connection.
    pub(super) fn track(
        &mut self,
        id: RequestId,
        buf: UserBufId,
        slot: u32,
        conn: Option<&Arc<Conn>>,
    ) {
        self.requests.set_id(slot, id);
        self.reqs.insert(
            id,
            Tracked {
                buf,
                slot,
                conn: conn.cloned(),
            },
        );
    }

    pub(super) fn take_buf(&mut self, id: UserBufId) -> Vec<u8> {
        self.user_bufs
            .remove(&id)
            .and_then(UserMem::into_vec)
            .unwrap_or_default()
    }

    pub(super) fn run_actions(
        &mut self,
        rdma: Option<&Rdma>,
        mode: RndvRegistration,
        out: &mut AfterUnlock,
    ) {
        while let Some(action) = self.engine.poll_action() {
            match action {
                Action::SendFrame {
                    conn,
                    frame,
                    payload,
                } => self.send_frame(rdma, conn, frame.as_bytes(), payload, out),
                Action::ExposeSendBuffer { request, buf, len } => {
                    let conn = self.reqs.get(&request).and_then(|p| p.conn.clone());
                    let exposed = match (rdma, conn) {
                        (_, None) => Err("the send's connection is gone".to_string()),
                        // Without zero-copy GET the sender streams the data on request.
                        (_, Some(cs)) if !cs.transport().capabilities().zero_copy_get => {
                            match self.user_bufs.get_mut(&buf) {
                                Some(mem) => self.exposed.expose(cs.id, mem),
                                None => Err("the send buffer is gone".to_string()),
                            }
                        }
                        #[cfg(feature = "rdma")]
                        (Some(r), Some(cs)) => self.expose_rdma(r, mode, &cs, buf, len, out),
                        #[cfg(not(feature = "rdma"))]
                        (Some(r), Some(_)) => match *r {},
                        (None, Some(_)) => Err("no RDMA resources".to_string()),
                    };
                    match exposed {
                        Ok(remote) => self.engine.handle_send_buffer_exposed(request, remote),
                        Err(e) => {
                            log::warn!("cannot expose a {len}-byte send buffer: {e}");
                            self.engine.handle_send_buffer_expose_failed(request);
                        }
                    }
                }
                Action::ReleaseSendBuffer { buf, .. } => {
                    if !self.release(buf, 0) {
                        self.held.push((buf, None));
                    }
                }
                Action::RdmaRead {
                    conn,
                    request,
                    remote,
                    len,
                    dst,
                    dst_offset,
                } => {
                    if let Err(e) =
                        self.post_read(rdma, mode, conn, request, remote, len, dst, dst_offset, out)
                    {
                        log::warn!("cannot read {len} bytes on {conn:?}: {e}");
                        self.engine.handle_read_complete(request, dst_offset, false);
                    }
                }
                Action::CopyFromRecvBuf {
                    src,
                    src_offset,
                    len,
                    dst,
                    dst_offset,
                } => {
                    let copied = match (self.recv_held.get(&src.0), self.user_bufs.get_mut(&dst)) {
                        (Some(b), Some(mem)) => b
                            .get(src_offset..src_offset + len)
                            .is_some_and(|data| mem.write_at(dst_offset, data)),
                        _ => false,
                    };
                    if !copied {
                        log::error!("eager copy of {len} bytes into {dst:?} out of range");
                    }
                }
                Action::CopyToUser {
                    dst,
                    dst_offset,
                    data,
                } => {
                    let copied = self
                        .user_bufs
                        .get_mut(&dst)
                        .is_some_and(|mem| mem.write_at(dst_offset, &data));
                    if !copied {
                        log::error!("copy of {} bytes into {dst:?} out of range", data.len());
                    }
                }
                Action::RepostRecv { buf } => match self.recv_held.remove(&buf.0) {
                    #[cfg(feature = "rdma")]
                    Some(RecvBuf::Rdma(b)) => out.reposts.push((b, buf.0)),
                    Some(RecvBuf::Tcp(bytes, conn)) => {
                        if let Some(link) = self.conns.get(&conn).and_then(|c| c.tcp()) {
                            link.recycle(bytes);
                        }
                    }
                    None => {}
                },
                Action::Complete(c) => self.complete(c, out),
                Action::CloseConnection { conn, reason } => {
                    let why = match &reason {
                        CloseReason::Local => "closed locally".to_string(),
                        CloseReason::ProtocolError(e) => format!("protocol error: {e}"),
                        CloseReason::PeerError(status) => {
                            format!("the peer reported an error ({status:?}) and closed")
                        }
                        CloseReason::SendFailed => {
                            "a send or READ failed: the connection is broken".to_string()
                        }
                    };
                    match &reason {
                        CloseReason::Local => log::debug!("{conn:?}: closed locally"),
                        _ => log::warn!("{conn:?}: closing: {why}"),
                    }
                    if let Some(cs) = self.conns.get(&conn).cloned() {
                        self.start_closing(&cs, why, out);
                    }
                }
            }
        }
        // Every frame's buffer is reposted by the engine at once; anything left is a bug in
        // the driver or the engine, so put it back rather than lose SRQ depth.
        if !self.recv_held.is_empty() {
            log::error!("receive buffers were not reposted");
            #[cfg(feature = "rdma")]
            out.reposts.extend(
                self.recv_held
                    .drain()
                    .into_iter()
                    .filter_map(|(id, b)| match b {
                        RecvBuf::Rdma(b) => Some((b, id)),
                        RecvBuf::Tcp(..) => None,
                    }),
            );
            #[cfg(not(feature = "rdma"))]
            drop(self.recv_held.drain());
        }
    }

    pub(super) fn send_frame(
        &mut self,
        rdma: Option<&Rdma>,
        conn: ConnId,
        frame: &[u8],
        payload: Option<rdmx_proto::PayloadRef>,
        out: &mut AfterUnlock,
    ) {
        let Some(cs) = self.conns.get(&conn).cloned() else {
            log::debug!("frame for closed {conn:?} dropped");
            return;
        };
        let data: &[u8] = match payload {
            Some(p) => match self
                .user_bufs
                .get(&p.buf)
                .and_then(|m| m.head(p.len as usize))
            {
                Some(d) => d,
                None => {
                    log::error!("eager payload of {} bytes unavailable", p.len);
                    return;
                }
            },
            None => &[],
        };
        let link = match &cs.link {
            Link::Tcp(link) => {
                link.queue_frame(frame, data);
                out.flush(&cs);
                return;
            }
            #[cfg(feature = "rdma")]
            Link::Rdma(link) => link,
        };
        #[cfg(not(feature = "rdma"))]
        let _ = (link, rdma);
        #[cfg(feature = "rdma")]
        {
            let total = frame.len() + data.len();
            let item = if total <= link.max_inline().min(INLINE_MAX) {
                let mut bytes = [0u8; INLINE_MAX];
                bytes[..frame.len()].copy_from_slice(frame);
                bytes[frame.len()..total].copy_from_slice(data);
                Outgoing::Inline {
                    bytes,
                    len: total as u16,
                }
            } else {
                let Some(rdma) = rdma else { return };
                if total > self.send_pool.buf_len() {
                    log::error!("a {total}-byte frame exceeds the send buffers");
                    return;
                }
                let mut buf = match self.send_pool.take(&rdma.pd) {
                    Ok(b) => b,
                    Err(e) => {
                        log::error!("no send buffer: {e}");
                        self.engine.handle_send_complete(conn, false);
                        return;
                    }
                };
                buf[..frame.len()].copy_from_slice(frame);
                buf[frame.len()..total].copy_from_slice(data);
                Outgoing::Frame { buf, len: total }
            };
            link.push(item);
            out.flush(&cs);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn post_read(
        &mut self,
        rdma: Option<&Rdma>,
        mode: RndvRegistration,
        conn: ConnId,
        request: RequestId,
        remote: RemoteBuf,
        len: u64,
        dst: UserBufId,
        dst_offset: u64,
        out: &mut AfterUnlock,
    ) -> Result<(), String> {
        let cs = self
            .conns
            .get(&conn)
            .cloned()
            .ok_or("the connection is closed")?;
        let key = self.next_read;
        if let Link::Tcp(link) = &cs.link {
            // Lend the destination to the link, which writes the READ data straight into it.
            let mem = self
                .user_bufs
                .get_mut(&dst)
                .ok_or("the receive buffer is gone")?;
            if let UserMem::Plain(vec) = std::mem::replace(mem, UserMem::Lent) {
                link.lend(dst.0, vec);
            }
            if let Err(e) = link.expect_read(key, dst.0, dst_offset as usize, len as usize) {
                if let Some(vec) = link.reclaim(dst.0) {
                    *mem = UserMem::Plain(vec);
                }
                return Err(e.to_string());
            }
            link.queue_read_request(key, remote.addr, remote.rkey, len);
        }
        self.next_read = (self.next_read + 1) & !READ_KEY_KIND;
        self.reads.insert(
            key,
            ReadCtx {
                conn,
                request,
                buf: dst,
                off: dst_offset,
            },
        );
        let link = match &cs.link {
            Link::Tcp(_) => {
                out.flush(&cs);
                return Ok(());
            }
            #[cfg(feature = "rdma")]
            Link::Rdma(link) => link,
        };
        #[cfg(not(feature = "rdma"))]
        {
            let _ = (link, rdma, mode);
            Ok(())
        }
        #[cfg(feature = "rdma")]
        {
            let rdma = rdma.ok_or("no RDMA resources")?;
            let mem = self
                .user_bufs
                .get_mut(&dst)
                .ok_or("the receive buffer is gone")?;
            if let Err(e) =
                mem.register(mode, &rdma.pd, &mut self.rcache, Access::LOCAL_WRITE, true)
            {
                self.reads.remove(&key);
                return Err(e);
            }
            let Some(target) = mem.take_range(dst_offset, len) else {
                self.reads.remove(&key);
                return Err("the READ falls outside the receive buffer".into());
            };
            link.push(Outgoing::Read {
                target,
                len: len as usize,
                remote: rdmx_conn::RemoteBuf {
                    addr: remote.addr,
                    len: len as u32,
                    rkey: remote.rkey,
                },
                cookie: COOKIE_READ | key,
            });
            out.flush(&cs);
            Ok(())
        }
    }

    /// Ends a buffer's exposure or registration (copying `copy_back` bytes back from a
    /// staged receive), leaving it plain memory when nothing else holds it.
    ///
    /// The buffer's memory window goes first: it kills the rkey, and neither the buffer nor
    /// a staging region may be reused while a window over it could still be bound. False when
    /// the window cannot be invalidated yet (its bind is still posted): then nothing is
    /// released, and the caller must try again once completions were polled.
    pub(super) fn release(&mut self, buf: UserBufId, copy_back: u64) -> bool {
        #[cfg(feature = "rdma")]
        if !self.windows.invalidate(buf) {
            return false;
        }
        let Some(mem) = self.user_bufs.get_mut(&buf) else {
            return true;
        };
        if let Some(key) = mem.exposure_key() {
            self.exposed.withdraw(key);
        }
        #[cfg(feature = "rdma")]
        mem.unregister(&mut self.rcache, copy_back);
        #[cfg(not(feature = "rdma"))]
        {
            let _ = copy_back;
            mem.unexpose();
        }
        true
    }

    /// Retries what waited for a window to die (see [`Protocol::release`]).
    pub(super) fn release_held(&mut self, out: &mut AfterUnlock) {
        for (buf, done) in std::mem::take(&mut self.held) {
            let copy_back = match &done {
                Some((_, c)) if c.status == Status::Ok => c.length,
                _ => 0,
            };
            if !self.release(buf, copy_back) {
                self.held.push((buf, done));
            } else if let Some((p, c)) = done {
                self.hand_back(p, c, out);
            }
        }
    }

    /// RDMA: exposes a send buffer to the peer of `cs` (see [`Windows::expose`]).
    #[cfg(feature = "rdma")]
    pub(super) fn expose_rdma(
        &mut self,
        rdma: &Rdma,
        mode: RndvRegistration,
        cs: &Arc<Conn>,
        buf: UserBufId,
        len: u64,
        out: &mut AfterUnlock,
    ) -> Result<RemoteBuf, String> {
        let link = cs.rdma().ok_or("not an RDMA connection")?;
        let mem = self
            .user_bufs
            .get_mut(&buf)
            .ok_or("the send buffer is gone")?;
        let remote = self
            .windows
            .expose(rdma, mode, link, buf, mem, &mut self.rcache, len)?;
        out.flush(cs);
        Ok(remote)
    }

    /// TCP: exposes a send buffer to READ requests arriving on `conn`, under a fresh random
    /// key; addresses are offsets into the buffer.
    /// TCP: answers a peer's READ request (see [`crate::transport::tcp`]).
    pub(super) fn answer_read(
        &mut self,
        cs: &Arc<Conn>,
        read_id: u64,
        (addr, rkey, len): (u64, u32, u64),
        out: &mut AfterUnlock,
    ) {
        let Some(link) = cs.tcp() else { return };
        match self.exposed.answer(cs.id, addr, rkey, len) {
            Answer::Data { data, offset, len } => {
                link.queue_read_data(read_id, true, Some((data, offset, len)))
            }
            Answer::Refused => {
                log::debug!("{:?}: READ request for bytes not exposed", cs.id);
                link.queue_read_data(read_id, false, None);
            }
            Answer::OtherEndpoint => {
                log::warn!(
                    "{:?}: {:?} asked to READ a buffer exposed to another endpoint",
                    cs.id,
                    cs.peer
                );
                link.queue_read_data(read_id, false, None);
                out.flush(cs);
                self.tcp_down(
                    cs,
                    "protocol error: READ request for a buffer exposed to another endpoint"
                        .to_string(),
                    out,
                );
                return;
            }
        }
        out.flush(cs);
    }

    pub(super) fn complete(&mut self, c: rdmx_proto::Completion, out: &mut AfterUnlock) {
        let Some(p) = self.reqs.remove(&c.request) else {
            return;
        };
        if let Some(cs) = &p.conn {
            if cs.pending_sends.fetch_sub(1, Ordering::AcqRel) == 1 {
                // A flushing endpoint waits for this.
                out.news = true;
            }
        }
        if !self.release(p.buf, if c.status == Status::Ok { c.length } else { 0 }) {
            // A bind of its window is still posted: the buffer comes back once it is dead.
            self.held.retain(|(b, _)| *b != p.buf);
            self.held.push((p.buf, Some((p, c))));
            return;
        }
        self.hand_back(p, c, out);
    }

    /// Hands a completed request its buffer (released already) and its outcome.
    pub(super) fn hand_back(
        &mut self,
        p: Tracked,
        c: rdmx_proto::Completion,
        out: &mut AfterUnlock,
    ) {
        let buf = match self.user_bufs.get(&p.buf) {
            Some(mem) if mem.in_flight() => {
                // A READ into it was never reported (connection died): the worker keeps it
                // until the READ completes or the connection is destroyed.
                self.orphans.insert(p.buf);
                Vec::new()
            }
            Some(_) => self
                .user_bufs
                .remove(&p.buf)
                .and_then(UserMem::into_vec)
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let outcome = Outcome {
            status: c.status,
            length: c.length,
            tag: c.tag,
            buf,
        };
        // (An outcome nobody will take is dropped: its handle is gone.)
        if self.requests.finish(p.slot, outcome).is_none() {
            out.completed.push(p.slot);
        }
    }
}
