//! The driver behind every worker handle: connection and request bookkeeping, and the lock
//! discipline — protocol state under one short-held lock, then posting and waking after it.

use super::*;

impl Driver {
    /// The engine's figures for connection `conn` (`None` once it is gone).
    pub(crate) fn conn_stats(&self, conn: ConnId) -> Option<ConnStats> {
        self.state.lock().engine.conn_stats(conn)
    }

    pub(super) fn now_ns(&self) -> u64 {
        crate::clock::coarse_now_ns()
    }

    pub(crate) fn new_conn_id(&self) -> ConnId {
        ConnId(self.next_conn.fetch_add(1, Ordering::Relaxed))
    }

    /// Registers an established connection the engine already knows as `id`.
    pub(crate) fn add_conn(&self, id: ConnId, link: Box<dyn TransportLink>) -> Arc<Conn> {
        let cs = Arc::new(Conn::new(id, link));
        self.links.fetch_add(1, Ordering::AcqRel);
        if cs.link.frames_on_event_fd() {
            self.fd_links.fetch_add(1, Ordering::AcqRel);
        }
        // (An RDMA link has no fd of its own: its events come through the worker's channel.)
        if let Some(fd) = cs.event_fd() {
            if let Err(e) = self.registry.add(fd, TOKEN_CONN + id.0, Interest::Read) {
                log::warn!("cannot watch {id:?}'s connection events: {e}");
            }
        }
        self.conn_list.write().insert(id.0, cs.clone());
        self.with_protocol_out(|st, out| {
            st.conns.insert(id, cs.clone());
            // What arrived for it before it was known is delivered now.
            let mut early = Vec::new();
            cs.link.joined(&mut st.ifaces, &mut early);
            for ev in early {
                st.on_link_event(ev, out);
            }
        });
        log::debug!("{id:?} up with {:?}", cs.peer);
        // A worker asleep (a loop's driver, an event-mode waiter) was armed without this
        // link: what its peer sent before the link learnt that the worker sleeps rang no
        // doorbell (shared memory). Woken, the worker polls it and arms again with it.
        self.waker.wake();
        cs
    }
}

impl Driver {
    /// The engine takes connection `id` up with the `limits` this side's handshake offered
    /// ([`Driver::local_handshake`]).
    pub(crate) fn engine_up(&self, id: ConnId, peer: &Handshake, limits: ConnLimits) -> Result<()> {
        Ok(self
            .state
            .lock()
            .engine
            .handle_connection_up_with(id, peer, limits)?)
    }

    pub(crate) fn engine_down(&self, id: ConnId) {
        self.with_protocol(|st| st.engine.handle_connection_down(id));
    }

    /// The handshake for a connection over `transport` (its receive buffer size, the
    /// credits the pool offers now), and the limits it promised, for [`Driver::engine_up`].
    pub(crate) fn local_handshake(&self, transport: Transport) -> (Vec<u8>, ConnLimits) {
        let st = self.state.lock();
        let limits = self.cfg.limits(transport, st.engine.credit_offer());
        (st.engine.local_handshake_for(&limits).encode(), limits)
    }

    pub(crate) fn tag_send(
        &self,
        worker: &Worker,
        cs: &Arc<Conn>,
        tag: Tag,
        data: SendData,
    ) -> Request {
        match self.send_now(cs, tag, data) {
            Ok(outcome) => Request::done(outcome),
            Err(data) => self.send_later_request(worker, cs, tag, data),
        }
    }

    /// The request of a send that could not go out at once (see [`Driver::send_later`]).
    fn send_later_request(
        &self,
        worker: &Worker,
        cs: &Arc<Conn>,
        tag: Tag,
        data: SendData,
    ) -> Request {
        let what = Describe {
            kind: RequestKind::Send,
            tag,
        };
        self.send_later(cs, tag, data).into_request(worker, what)
    }

    /// A send `Engine::tag_send_now` declined: queued, or rendezvous, or refused — or sent at
    /// once after all, when credits came in meanwhile (another thread's progress ran between
    /// the two locked sections).
    pub(super) fn send_later(&self, cs: &Arc<Conn>, tag: Tag, data: SendData) -> Made {
        let len = data.bytes().len();
        self.with_protocol_out(|st, out| {
            let bufid = st.new_buf(data.into_mem());
            match st.engine.tag_send(cs.id, tag, bufid, len as u64) {
                Ok(id) if id.is_immediate() => {
                    // Its frame is among the actions just queued: they read the buffer, so
                    // they run before it goes back. It never takes a slot.
                    st.run_actions(out);
                    Made::Done(Outcome::sent(cs, tag, len, st.take_buf(bufid)))
                }
                Ok(id) => {
                    cs.pending_sends.fetch_add(1, Ordering::AcqRel);
                    Made::Pending(st.requests.open(bufid, id, Some(cs)))
                }
                Err(e) => {
                    log::debug!("tag_send on {:?}: {e}", cs.id);
                    Made::Done(Outcome {
                        status: Status::ConnectionClosed,
                        kind: RequestKind::Send,
                        length: len as u64,
                        tag,
                        buf: st.take_buf(bufid),
                        conn: Some(cs.id),
                    })
                }
            }
        })
    }

    /// [`Driver::tag_send`] of a buffer the caller keeps shared ([`crate::Ep::tag_send_shared`]):
    /// a send that goes out at once copies it and takes no clone of it, so the `Arc`'s
    /// count is not touched (two atomic read-modify-writes per message, the second right
    /// after the frame's stores into a shared-memory ring, where it waited for them to
    /// reach the peer's core); one that cannot holds a clone until it completes.
    pub(crate) fn tag_send_shared(
        &self,
        worker: &Worker,
        cs: &Arc<Conn>,
        tag: Tag,
        data: &Arc<Vec<u8>>,
    ) -> Request {
        if self.queue_now(cs, tag, data) {
            return Request::done(Outcome::sent(cs, tag, data.len(), Vec::new()));
        }
        self.send_later_request(worker, cs, tag, SendData::Shared(data.clone()))
    }

    /// A send that goes out as it is made (the common case of a small message), done (see
    /// [`Driver::queue_now`]); `Err(data)` when the send cannot go out at once.
    fn send_now(&self, cs: &Arc<Conn>, tag: Tag, data: SendData) -> Result<Outcome, SendData> {
        if !self.queue_now(cs, tag, data.bytes()) {
            return Err(data);
        }
        let len = data.bytes().len();
        Ok(Outcome::sent(cs, tag, len, data.into_returned()))
    }

    /// Sends `bytes` with `tag` at once if it can (the common case of a small message): the
    /// frame `Engine::tag_send_now` makes is queued at once with `bytes` as its payload,
    /// which never enters the request table (the engine queues no action with it). When it
    /// is posted at once (an RDMA link with nothing queued), that is all: no executor, no
    /// work for after the lock. Otherwise the locked section ends as any does. False when
    /// the send cannot go out at once (nothing was done).
    #[inline(always)]
    fn queue_now(&self, cs: &Arc<Conn>, tag: Tag, bytes: &[u8]) -> bool {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let Some((_, frame)) = st.engine.tag_send_now(cs.id, tag, bytes.len() as u64) else {
            return false;
        };
        let queued = cs.link.queue_frame(&mut st.ifaces, &frame, bytes);
        if matches!(queued, Ok(Queued::Posted)) {
            return true;
        }
        let mut out = AfterUnlock::default();
        super::executor::frame_queued(&mut st.engine, cs, queued, &mut out);
        self.run(st, &mut out);
        drop(guard);
        self.finish(&mut out);
        true
    }

    /// Asks the engine to cancel the request in `slot`, if it is still pending.
    pub(crate) fn cancel(&self, slot: &RequestKey) -> bool {
        self.with_protocol(|st| {
            st.requests
                .pending_id(slot)
                .is_some_and(|id| st.engine.cancel(id))
        })
    }

    /// A completed request's outcome (once), freeing its slot. (Inlined into
    /// `Request::wait`, itself inlined: 91 instructions fewer per shared-memory round trip
    /// than as a call, whose 64-byte result went through memory.)
    #[inline(always)]
    pub(crate) fn take_outcome(&self, slot: &RequestKey) -> Option<Outcome> {
        self.state.lock().requests.take(slot)
    }

    /// The handle of the request in `slot` is gone.
    pub(crate) fn abandon(&self, slot: &RequestKey) {
        let outcome = self.state.lock().requests.abandon(slot);
        // Its buffer is freed here, outside the lock.
        drop(outcome);
    }

    /// Closes `cs` once its sends have completed, or at `timeout` from now (failing those
    /// still pending): for an endpoint whose last handle was dropped, or closed by
    /// [`crate::Ep::close_nb`], without blocking. Returns that deadline on the coarse clock.
    pub(crate) fn linger(&self, cs: &Arc<Conn>, timeout: Duration) -> u64 {
        let deadline = crate::clock::coarse_now_ns().saturating_add(timeout.as_nanos() as u64);
        log::debug!(
            "{:?}: last handle dropped with {} sends pending; closing once they complete",
            cs.id,
            cs.pending_sends.load(Ordering::Acquire)
        );
        self.with_protocol(|st| st.lingering.push((cs.clone(), deadline)));
        deadline
    }

    /// Closes a connection locally (after the caller flushed it).
    pub(crate) fn close_conn(&self, id: ConnId) {
        // A connection the engine had already forgotten (peer gone) is closing already.
        self.with_protocol(|st| st.engine.close(id));
    }

    /// Runs `f` on the protocol state, then the actions it caused, under the state lock;
    /// then posts what they queued, after releasing it.
    pub(super) fn with_protocol<R>(&self, f: impl FnOnce(&mut Protocol) -> R) -> R {
        self.with_protocol_out(|st, _| f(st))
    }

    /// [`Driver::with_protocol`] for an `f` that leaves work for after the lock itself.
    pub(super) fn with_protocol_out<R>(
        &self,
        f: impl FnOnce(&mut Protocol, &mut AfterUnlock) -> R,
    ) -> R {
        let mut out = AfterUnlock::default();
        let result = {
            let mut st = self.state.lock();
            let result = f(&mut st, &mut out);
            self.run(&mut st, &mut out);
            result
        };
        self.finish(&mut out);
        result
    }

    /// Runs the actions a locked section left queued and posts what they made (taking a
    /// message that arrived unexpected can give a peer its withheld credits back: their
    /// CREDIT frames). (Out of line, as it is rare: off the path of a receive.)
    #[cold]
    #[inline(never)]
    pub(super) fn run_pending(&self) {
        self.with_protocol(|_| {});
    }

    pub(super) fn run(&self, st: &mut Protocol, out: &mut AfterUnlock) {
        st.run_actions(out);
        let arrivals = st.engine.unexpected_arrivals();
        if arrivals != st.arrivals_seen {
            // Threads waiting to probe (recv_vec) wait for exactly this.
            st.arrivals_seen = arrivals;
            out.news = true;
        }
        self.housekeeping_pending.store(
            !st.closing.is_empty()
                || !st.lingering.is_empty()
                || st.ifaces.waiting()
                || !st.held.is_empty(),
            Ordering::Release,
        );
        self.next_timer.store(
            st.engine.poll_timeout().unwrap_or(u64::MAX),
            Ordering::Release,
        );
    }

    /// Posts or writes what `cs` has queued, and keeps the registry watching its link for
    /// room to write exactly while output waits for it (TCP) — and not for input while its
    /// input is paused (its socket stays readable: watching that would wake every wait
    /// at once, and a paused link reads nothing). A link that resumed with input it held
    /// back is polled by the next progress call ([`Driver::resume_held`]).
    pub(super) fn flush_conn(&self, cs: &Conn) {
        if cs.flush() {
            self.failures_pending.store(true, Ordering::Release);
            self.waker.wake();
        }
        // (Read interest, and write interest while output waits — unless the input is
        // paused or held back: then the link says.)
        let wants = cs.wants_write();
        if !cs.input_stopped() && cs.is_watched(Interest::for_output(wants)) {
            return;
        }
        self.rewatch(cs);
    }

    /// [`Driver::flush_conn`]'s change of what the registry watches `cs`'s fd for.
    #[cold]
    #[inline(never)]
    fn rewatch(&self, cs: &Conn) {
        if cs.watch().held_ready {
            self.resume_held();
        }
        // The interest changes with the registration, under the connection's watch lock,
        // and each flush checks after its own writing: the last check sees the final state.
        let _guard = cs.watch_lock.lock();
        let interest = cs.watch().interest;
        if cs.is_watched(interest) {
            return;
        }
        let Some(fd) = cs.event_fd() else {
            return;
        };
        match self.registry.modify(fd, TOKEN_CONN + cs.id.0, interest) {
            Ok(()) => cs.set_watched(interest),
            Err(e) => log::warn!("cannot watch {:?} for {interest:?}: {e}", cs.id),
        }
    }

    /// A link resumed with input it held back while paused, which no readiness will report:
    /// the next progress call (a housekeeping one, asked for here) polls the links that
    /// hold some.
    #[cold]
    pub(super) fn resume_held(&self) {
        self.held_due.store(true, Ordering::SeqCst);
        self.cm_due.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Posts, reposts and wakes what the last locked section left to do (`out` is left
    /// empty, to be used again; taken by reference, so that it is not copied on every locked
    /// section).
    pub(super) fn finish(&self, out: &mut AfterUnlock) {
        if !out.deferred.is_empty() {
            self.repost(&mut out.deferred);
        }
        self.after_unlock(out);
    }

    /// [`Driver::finish`] but for the receive buffers to repost (`out.deferred`, kept).
    // (Once per message: inlined, as the request table's operations are; see
    // `worker::requests`.)
    #[inline(always)]
    pub(super) fn after_unlock(&self, out: &mut AfterUnlock) {
        if !out.flush.is_empty() {
            for cs in out.flush.drain(..) {
                self.flush_conn(&cs);
            }
        }
        if !out.reaped.is_empty() {
            self.forget_reaped(&mut out.reaped);
        }
        if out.news || !out.completed.is_empty() {
            // (After the locked section that recorded them: see `super::sleepers`.)
            if self.sleepers.any() {
                self.sleepers.wake(&out.completed, out.news);
            }
            out.news = false;
            out.completed.clear();
        }
    }

    /// Stops watching the connections in `reaped` (left empty) and forgets them.
    #[cold]
    fn forget_reaped(&self, reaped: &mut Vec<Arc<Conn>>) {
        let mut list = self.conn_list.write();
        for cs in reaped.drain(..) {
            if let Some(fd) = cs.event_fd() {
                let _ = self.registry.remove(fd);
            }
            list.remove(&cs.id.0);
            self.links.fetch_sub(1, Ordering::AcqRel);
            if cs.link.frames_on_event_fd() {
                self.fd_links.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

/// What a send or a matched receive became as it was made.
pub(super) enum Made {
    /// A request in the table, completed later by progress.
    Pending(RequestKey),
    /// Done at once (its frame queued, or the connection gone): no slot was taken.
    Done(Outcome),
}

impl Made {
    /// The request handle for it.
    pub(super) fn into_request(self, worker: &Worker, what: Describe) -> Request {
        match self {
            Made::Pending(slot) => Request::new(worker, slot, what),
            Made::Done(outcome) => Request::done(outcome),
        }
    }
}
