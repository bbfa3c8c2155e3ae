//! Carrying out the protocol engine's actions: frames, buffer exposure and release, READs,
//! copies and completions.

use super::*;

impl Protocol {
    // (Once per message: inlined, as the request table's operations are; see
    // `worker::requests`.)
    #[inline(always)]
    pub(super) fn new_buf(&mut self, mem: UserMem) -> UserBufId {
        self.requests.insert_buf(mem)
    }

    /// Copies `data` into the user buffer `dst` at `off`; false when the buffer is gone or
    /// the bytes do not fit.
    pub(super) fn write_user(&mut self, dst: UserBufId, off: u64, data: &[u8]) -> bool {
        self.requests
            .mem_mut(dst)
            .is_some_and(|mem| mem.write_at(off, data))
    }

    pub(super) fn take_buf(&mut self, id: UserBufId) -> Vec<u8> {
        self.requests
            .take_mem(id)
            .and_then(UserMem::into_vec)
            .unwrap_or_default()
    }

    /// Runs the engine's actions.
    pub(super) fn run_actions(&mut self, out: &mut AfterUnlock) {
        while let Some(action) = self.engine.poll_action() {
            self.execute(action, out);
        }
    }

    /// Carries out one of the engine's actions. (Not inlined: in `run_actions`, which most
    /// often finds none, its frame would be set up on every call.)
    #[inline(never)]
    fn execute(&mut self, action: Action, out: &mut AfterUnlock) {
        match action {
            Action::SendFrame {
                conn,
                frame,
                payload,
            } => self.send_frame(conn, &frame, payload, out),
            Action::SendFrameData { conn, frame, data } => {
                if let Some(cs) = self.conns.get(&conn) {
                    let queued = cs.link.queue_frame(&mut self.ifaces, &frame, &data);
                    frame_queued(&mut self.engine, cs, queued, out);
                }
                self.engine.recycle_payload(data);
            }
            Action::ExposeSendBuffer { request, buf, len } => {
                let exposed = self.expose(buf, len, out);
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
                let read = ReadOp {
                    key: self.next_read,
                    remote,
                    len,
                    buf: dst,
                    offset: dst_offset,
                };
                if let Err(e) = self.post_read(conn, request, read, out) {
                    log::warn!("cannot read {len} bytes on {conn:?}: {e}");
                    self.engine.handle_read_complete(request, dst_offset, false);
                }
            }
            Action::RmaVerbs {
                conn,
                request,
                op,
                buf,
                offset,
                len,
                remote,
            } => {
                let work = RmaWork {
                    key: self.next_read,
                    op,
                    remote,
                    len,
                    offset,
                };
                if let Err(e) = self.post_rma(conn, request, buf, work, out) {
                    log::warn!("cannot start a one-sided {op:?} of {len} bytes on {conn:?}: {e}");
                    self.engine
                        .handle_rma_verbs_done(request, Err(VerbsFailure::Broken));
                }
            }
            Action::CopyFromRecvBuf { len, dst, .. } => {
                // Only `Engine::handle_frame` asks for it; the worker delivers frames with
                // `Engine::handle_frame_delivering` (see `Protocol::deliver`).
                log::error!("eager copy of {len} bytes into {dst:?} from a frame no longer held");
            }
            Action::CopyToUser {
                dst,
                dst_offset,
                data,
            } => {
                if !self.write_user(dst, dst_offset, &data) {
                    log::error!("copy of {} bytes into {dst:?} out of range", data.len());
                }
                self.engine.recycle_payload(data);
            }
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

    pub(super) fn send_frame(
        &mut self,
        conn: ConnId,
        frame: &rdmx_proto::wire::FrameBuf,
        payload: Option<rdmx_proto::PayloadRef>,
        out: &mut AfterUnlock,
    ) {
        let Some(cs) = self.conns.get(&conn) else {
            log::debug!("frame for closed {conn:?} dropped");
            return;
        };
        let data: &[u8] = match payload {
            Some(p) => match self
                .requests
                .mem(p.buf)
                .and_then(|m| m.head((p.offset + p.len) as usize))
                .and_then(|d| d.get(p.offset as usize..))
            {
                Some(d) => d,
                None => {
                    log::error!("eager payload of {} bytes unavailable", p.len);
                    return;
                }
            },
            None => &[],
        };
        let queued = cs.link.queue_frame(&mut self.ifaces, frame, data);
        frame_queued(&mut self.engine, cs, queued, out);
    }

    /// Exposes `len` bytes of the send buffer `buf` to the peer of its send, for its READ.
    fn expose(
        &mut self,
        buf: UserBufId,
        len: u64,
        out: &mut AfterUnlock,
    ) -> Result<RemoteBuf, String> {
        let (cs, mem) = self
            .requests
            .send_mem(buf)
            .ok_or("the send or its connection is gone")?;
        let remote = cs.link.expose(&mut self.ifaces, buf, mem, len)?;
        out.flush(cs);
        Ok(remote)
    }

    /// Starts `read` on `conn` for the receive `request`.
    pub(super) fn post_read(
        &mut self,
        conn: ConnId,
        request: RequestId,
        read: ReadOp,
        out: &mut AfterUnlock,
    ) -> Result<(), String> {
        let ctx = ReadCtx {
            conn,
            request,
            buf: read.buf,
            off: read.offset,
            rma: false,
            bounce: None,
        };
        self.post_work(read.key, ctx, out, |cs, ifaces, mem| {
            cs.link.start_read(ifaces, read, mem).map(|()| None)
        })
    }

    /// Starts the one-sided `work` on `conn` for `request`, whose buffer is `buf`.
    fn post_rma(
        &mut self,
        conn: ConnId,
        request: RequestId,
        buf: UserBufId,
        work: RmaWork,
        out: &mut AfterUnlock,
    ) -> Result<(), String> {
        let ctx = ReadCtx {
            conn,
            request,
            buf,
            off: work.offset,
            rma: true,
            bounce: None,
        };
        let copy = work.op == rdmx_proto::VerbsOp::Read;
        self.post_work(work.key, ctx, out, |cs, ifaces, mem| {
            let bounced = cs.link.start_rma(ifaces, work, mem)?;
            Ok(bounced.then_some((work.len, copy)))
        })
    }

    /// Starts the work `start` posts on the connection `ctx` names with the request's
    /// buffer, and records it under `key` (the next of the READs' keys) until its link
    /// reports it. `start` says whether it went through a bounce buffer
    /// ([`ReadCtx::bounce`]).
    fn post_work(
        &mut self,
        key: u64,
        mut ctx: ReadCtx,
        out: &mut AfterUnlock,
        start: impl FnOnce(&Arc<Conn>, &mut LockedIfaces, &mut UserMem) -> Bounced,
    ) -> Result<(), String> {
        let cs = self
            .conns
            .get(&ctx.conn)
            .ok_or("the connection is closed")?;
        let mem = self
            .requests
            .mem_mut(ctx.buf)
            .ok_or("the request's buffer is gone")?;
        ctx.bounce = start(cs, &mut self.ifaces, mem)?;
        self.next_read = (self.next_read + 1) & READ_KEY_MASK;
        self.reads.insert(key, ctx);
        out.flush(cs);
        Ok(())
    }

    /// Ends a buffer's exposure or registration (copying `copy_back` bytes back from a
    /// staged receive), leaving it plain memory when nothing else holds it. False when its
    /// exposure cannot end yet (see [`LockedIfaces::release`]): then nothing is released, and
    /// the caller must try again once completions were polled.
    pub(super) fn release(&mut self, buf: UserBufId, copy_back: u64) -> bool {
        self.ifaces
            .release(buf, self.requests.mem_mut(buf), copy_back)
    }

    /// Retries what waited for a window to die (see [`Protocol::release`]).
    pub(super) fn release_held(&mut self, out: &mut AfterUnlock) {
        for (buf, done) in std::mem::take(&mut self.held) {
            let copy_back = match &done {
                Some(c) if c.status == Status::Ok => c.length,
                _ => 0,
            };
            if !self.release(buf, copy_back) {
                self.held.push((buf, done));
            } else if let Some(c) = done {
                self.hand_back(buf, c, out);
            }
        }
    }

    /// Completes the receive an eager message matched ([`Engine::handle_frame_delivering`]):
    /// copies the message (`data`: `None` when the frame is shorter than the delivery says)
    /// into its buffer and finishes it. The common case of a small message, so the request is
    /// looked up once and its buffer taken out of the table at once, without what
    /// [`Protocol::complete`] does for any request: a receive that no message had matched
    /// holds plain memory (a rendezvous registers or lends its buffer only once it matched),
    /// so there is nothing to release. Any other memory takes the general way.
    pub(super) fn deliver_eager(
        &mut self,
        d: rdmx_proto::Delivery,
        data: Option<&[u8]>,
        out: &mut AfterUnlock,
    ) {
        let Some(slot) = self.requests.claim(d.dst, d.request) else {
            return;
        };
        let Some(mut buf) = self.requests.take_plain(slot) else {
            self.deliver_eager_into_other(slot, d, data, out);
            return;
        };
        let copied = data.is_some_and(|data| write_into(&mut buf, data));
        if !copied {
            out_of_range(&d);
        }
        let outcome = Outcome {
            status: Status::Ok,
            kind: RequestKind::Recv,
            length: u64::from(d.len),
            tag: d.tag,
            buf,
            conn: Some(d.conn),
        };
        // (An outcome nobody will take is dropped: its handle is gone.)
        if self.requests.finish(slot, outcome).is_none() {
            out.completed.push(slot);
        }
    }

    /// [`Protocol::deliver_eager`] into a buffer that is not plain memory (registered or
    /// lent): written in place. (Out of line, as a cold call: small messages go into plain
    /// buffers.)
    #[cold]
    #[inline(never)]
    fn deliver_eager_into_other(
        &mut self,
        slot: u32,
        d: rdmx_proto::Delivery,
        data: Option<&[u8]>,
        out: &mut AfterUnlock,
    ) {
        if !data.is_some_and(|data| self.write_user(d.dst, 0, data)) {
            log::error!("eager delivery of {} bytes into {:?} failed", d.len, d.dst);
        }
        self.complete_claimed(slot, d.dst, d.completion(), out);
    }

    pub(super) fn complete(&mut self, c: rdmx_proto::Completion, out: &mut AfterUnlock) {
        if c.request.is_immediate() {
            // A receive done as it was made: `Worker::tag_recv` takes it.
            self.immediate_recv = Some(c);
            return;
        }
        let Some(buf) = c.buf else {
            log::error!("{:?} completed naming no buffer", c.request);
            return;
        };
        let Some(slot) = self.requests.claim(buf, c.request) else {
            return;
        };
        self.complete_claimed(slot, buf, c, out);
    }

    /// [`Protocol::complete`] of the request in `slot` with the buffer `buf`, claimed.
    fn complete_claimed(
        &mut self,
        slot: u32,
        buf: UserBufId,
        c: rdmx_proto::Completion,
        out: &mut AfterUnlock,
    ) {
        let cs = self.requests.take_conn(slot);
        if let Some(cs) = &cs {
            if cs.pending_sends.fetch_sub(1, Ordering::AcqRel) == 1 {
                // A flushing endpoint waits for this.
                out.news = true;
            }
        }
        if !self.release(buf, if c.status == Status::Ok { c.length } else { 0 }) {
            // A bind of its window is still posted: the buffer comes back once it is dead.
            self.held.retain(|(b, _)| *b != buf);
            self.held.push((buf, Some(c)));
            return;
        }
        if c.status == Status::TimedOut {
            if let Some(cs) = cs.filter(|cs| cs.link.transport() == Transport::Shm) {
                self.keep_from_peer(cs.id, buf);
            }
        }
        self.hand_back(buf, c, out);
    }

    /// Keeps the buffer `buf` of a rendezvous send to `conn`'s peer that timed out over
    /// shared memory until the connection is destroyed: the peer reads by CMA, straight from
    /// this process's memory, and no withdrawal stops a READ of it, so the memory must not go
    /// back to the user, to be changed or freed, while the peer may still read it. (Its
    /// request completes with an empty buffer, as one the NIC may still use does.)
    #[cold]
    fn keep_from_peer(&mut self, conn: ConnId, buf: UserBufId) {
        if let Some(mem) = self.requests.take_mem(buf) {
            log::debug!("{conn:?}: the buffer of a timed-out send is kept until it closes");
            self.kept.push((conn, mem));
        }
    }

    /// Hands a completed request its buffer `buf` (released already) and its outcome.
    pub(super) fn hand_back(
        &mut self,
        buf: UserBufId,
        c: rdmx_proto::Completion,
        out: &mut AfterUnlock,
    ) {
        let Some(slot) = self.requests.slot(buf) else {
            log::error!("{:?} completed with its buffer {buf:?} gone", c.request);
            return;
        };
        let vec = match self.requests.mem(buf) {
            Some(mem) if mem.in_flight() => {
                // A READ into it was never reported (connection died): the worker keeps it
                // until the READ completes or the connection is destroyed.
                self.orphans.insert(buf);
                Vec::new()
            }
            Some(_) => self
                .requests
                .take_mem(buf)
                .and_then(UserMem::into_vec)
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let outcome = Outcome::of(&c, vec);
        // (An outcome nobody will take is dropped: its handle is gone.)
        if self.requests.finish(slot, outcome).is_none() {
            out.completed.push(slot);
        }
    }
}

/// Copies `data` to the start of `buf`; false when it does not fit. A payload of 8 to 16
/// bytes is copied as two words that may overlap, inline: as a call to `memcpy`, an 8 B
/// message's copy cost 18 instructions (callgrind).
#[inline]
fn write_into(buf: &mut [u8], data: &[u8]) -> bool {
    let Some(dst) = buf.get_mut(..data.len()) else {
        return false;
    };
    let n = data.len();
    if (8..=16).contains(&n) {
        let mut lo = [0u8; 8];
        let mut hi = [0u8; 8];
        lo.copy_from_slice(&data[..8]);
        hi.copy_from_slice(&data[n - 8..]);
        dst[..8].copy_from_slice(&lo);
        dst[n - 8..].copy_from_slice(&hi);
        return true;
    }
    dst.copy_from_slice(data);
    true
}

/// What is left to do once a frame was queued or posted on `cs` (`queued`, from
/// [`TransportLink::queue_frame`]).
pub(super) fn frame_queued(
    engine: &mut Engine,
    cs: &Arc<Conn>,
    queued: Result<Queued, String>,
    out: &mut AfterUnlock,
) {
    match queued {
        Ok(Queued::ForFlush) => out.flush(cs),
        Ok(Queued::Posted) => {}
        Err(e) => queue_failed(engine, cs, e),
    }
}

/// A frame `cs`'s link refused: the connection fails. (Out of line, as a cold call.)
#[cold]
#[inline(never)]
fn queue_failed(engine: &mut Engine, cs: &Arc<Conn>, e: String) {
    log::error!("{:?}: {e}", cs.id);
    engine.handle_send_complete(cs.id, false);
}

/// Gives a received frame's buffer back to where it came from: the link of `conn`, or
/// without it, the worker's receive queue. Returns whether that link's input is paused
/// (see [`crate::transport::TransportLink::input_paused`]; a stream's only).
pub(super) fn give_back(
    conns: &HashMap<ConnId, Arc<Conn>>,
    frame: RecvFrame,
    conn: ConnId,
    deferred: &mut Deferred,
) -> bool {
    // (An SRQ's buffer goes back to the worker: its connection is not looked up.)
    let link = if frame.is_link_buffer() {
        conns.get(&conn)
    } else {
        None
    };
    match link {
        Some(cs) => {
            cs.link.give_back(frame, deferred);
            cs.input_paused()
        }
        None => {
            deferred.return_frame(frame);
            false
        }
    }
}

/// Logs an eager delivery whose payload did not fit its buffer (the engine checked it
/// would: never expected). Out of line, as a cold call.
#[cold]
#[inline(never)]
fn out_of_range(d: &rdmx_proto::Delivery) {
    log::error!(
        "eager delivery of {} bytes into {:?} out of range",
        d.len,
        d.dst
    );
}

/// What starting a READ or one-sided operation gave: `Some((len, copy))` when it went
/// through a bounce buffer (see [`ReadCtx::bounce`]).
type Bounced = Result<Option<(u64, bool)>, String>;

#[cfg(test)]
mod tests {
    use super::write_into;

    /// Every length, including those copied as two overlapping words (8 to 16), lands at
    /// the start of the buffer and touches nothing past it; a payload longer than the
    /// buffer is refused and writes nothing.
    #[test]
    fn a_payload_is_copied_exactly() {
        for n in 0..=24usize {
            let data: Vec<u8> = (0..n as u8).map(|b| b.wrapping_mul(7) ^ 0x5a).collect();
            let mut buf = vec![0xee; 20];
            let fits = write_into(&mut buf, &data);
            assert_eq!(fits, n <= 20, "length {n}");
            if fits {
                assert_eq!(&buf[..n], &data[..], "length {n}");
                assert!(
                    buf[n..].iter().all(|&b| b == 0xee),
                    "length {n}: wrote past it"
                );
            } else {
                assert!(
                    buf.iter().all(|&b| b == 0xee),
                    "length {n}: wrote a refused payload"
                );
            }
        }
    }
}
