//! Making progress (completions, readiness, connection events, timers) and waiting for it.

use super::*;

/// A full progress call, then at most this many minus one that only look whether anything
/// arrived (see [`Driver::progress_spinning`]).
const CLOCK_REUSE: u32 = 16;

/// A request whose outcome a progress call takes if it completed, and where it puts it.
type Take<'a> = Option<(&'a RequestKey, &'a mut Option<Outcome>)>;

impl Driver {
    pub(super) fn cm_check_due(&self, now: u64) -> bool {
        let last = self.last_cm_check.load(Ordering::Relaxed);
        // (Loaded before swapped: an idle busy poll makes no read-modify-write.)
        if (self.cm_due.load(Ordering::Acquire) && self.cm_due.swap(false, Ordering::AcqRel))
            || now.saturating_sub(last) >= CM_CHECK_INTERVAL.as_nanos() as u64
        {
            self.last_cm_check.store(now, Ordering::Relaxed);
            return true;
        }
        false
    }

    pub(crate) fn progress(&self) -> usize {
        self.progress_clocked(false, None)
    }

    /// [`Driver::progress`] for a loop that calls it back to back until something happens
    /// (a busy-polling wait, the progress thread). After a call that found nothing, the next
    /// ones, [`CLOCK_REUSE`] - 1 in a row at most, only look whether anything arrived or
    /// changed that a full call would act on ([`Driver::quiet`]): they neither read the
    /// clock nor look at timers or housekeeping, which wait for the next full call, at most
    /// that many idle calls later (a few microseconds). A full idle call cost 167
    /// user-space instructions (callgrind), 28 of them the clock (the vDSO's
    /// `clock_gettime`); and a busy-polling waiter sees an arrival half an idle call late
    /// on average.
    pub(crate) fn progress_spinning(&self) -> usize {
        self.progress_clocked(true, None)
    }

    /// Waits for the request in `slot` to complete, busy-polling (the worker's mode, with no
    /// progress thread), and takes its outcome: in the locked section of the progress call
    /// that completed it, when this thread's call did, rather than in one of its own after
    /// it (a lock fewer per message on the path from its arrival to its waiter). `None` when
    /// the outcome was taken already.
    // (Once per message: inlined, as `Request::wait` is.)
    #[inline(always)]
    pub(crate) fn wait_take(&self, slot: &RequestKey) -> Option<Outcome> {
        if !slot.is_done(&self.done_flags) {
            if self.mode != WaitMode::BusyPoll || self.progress_thread.load(Ordering::Acquire) {
                self.wait_until(
                    WaitFor::Request(slot.index),
                    || slot.is_done(&self.done_flags),
                    None,
                );
            } else {
                let mut taken = None;
                loop {
                    if self.progress_clocked(true, Some((slot, &mut taken))) == 0 {
                        std::hint::spin_loop();
                    }
                    if taken.is_some() {
                        return taken;
                    }
                    // (Completed by another thread's progress call.)
                    if slot.is_done(&self.done_flags) {
                        break;
                    }
                }
            }
        }
        self.take_outcome(slot)
    }

    /// Whether a progress call would find nothing to do, told without polling: nothing to
    /// read on a connection's fd, no RDMA, nothing in shared memory, no failures to take,
    /// no rdmacm event due, no receive buffers to repost (timers and housekeeping aside:
    /// see [`Driver::progress_spinning`]).
    #[inline(always)]
    fn quiet(&self, scratch: &Scratch) -> bool {
        self.fd_links.load(Ordering::Relaxed) == 0
            && !self.failures_pending.load(Ordering::Relaxed)
            && !self.cm_due.load(Ordering::Relaxed)
            && scratch.after.deferred.is_empty()
            && self.ifaces.quiet(&scratch.transport)
    }

    /// A progress call; with `take`, one that takes the outcome of the request in its slot
    /// into its place if the request completes (or had).
    fn progress_clocked(&self, spinning: bool, take: Take<'_>) -> usize {
        let Some(mut scratch) = self.progress_lock.try_lock() else {
            return 0;
        };
        if spinning && scratch.idle_calls % CLOCK_REUSE != 0 {
            if self.quiet(&scratch) {
                scratch.idle_calls = scratch.idle_calls.wrapping_add(1);
                return 0;
            }
            // Something arrived: taken at once, by the clock of the last full call (a few
            // idle calls old), not after a clock read of its own.
            let now = scratch.last_now;
            return self.progress_full(&mut scratch, now, take);
        }
        // (The clock first: read while nothing has arrived yet, it is off the path from an
        // arrival to its waiter.)
        let now = self.now_ns();
        scratch.last_now = now;
        self.progress_full(&mut scratch, now, take)
    }

    /// A progress call that looks at everything (see [`Driver::progress_spinning`]), at
    /// `now`. (Not inlined: the quiet calls before it would set up its frame.)
    #[inline(never)]
    fn progress_full(&self, scratch: &mut Scratch, now: u64, take: Take<'_>) -> usize {
        let Scratch {
            ready,
            failed_posts,
            events,
            holding,
            cm_ready,
            transport,
            after: out,
            idle_calls,
            ..
        } = scratch;
        let polled = self.ifaces.poll(transport);
        let housekeeping = self.cm_check_due(now);
        let srq_low = housekeeping && self.ifaces.srq_low();
        let fd_links = self.fd_links.load(Ordering::Acquire);
        // READ requests the links answered as they read (no event for them).
        let mut answered = 0;
        let links = self.links.load(Ordering::Acquire);
        if fd_links > 0 || (housekeeping && links > 0) {
            let conns = self.conn_list.read();
            let only_stream = !housekeeping && links == 1 && fd_links == 1;
            if !(only_stream && read_the_only_link(&conns, ready)) {
                // One epoll_wait says which links have input (TCP data, rdmacm events) or
                // room for output they hold back: only those are read or written.
                if let Err(e) = self.registry.wait(ready, Some(Duration::ZERO)) {
                    log::error!("checking the connections' readiness: {e}");
                }
            }
            for r in ready.iter().filter(|r| r.token >= TOKEN_CONN) {
                let Some(cs) = conns.get(&(r.token - TOKEN_CONN)) else {
                    continue;
                };
                if r.writable {
                    self.flush_conn(cs);
                }
                if !r.readable {
                    continue;
                }
                let queued = cs.link.poll(housekeeping, transport, events);
                if queued > 0 {
                    // It queued output while reading (answers to READ requests).
                    answered += queued;
                    self.flush_conn(cs);
                }
            }
            if housekeeping
                && self.held_due.load(Ordering::Acquire)
                && self.held_due.swap(false, Ordering::AcqRel)
            {
                // Links whose input resumed with events they held back while it was paused:
                // no readiness reports those (whoever saw one resume asked for this
                // housekeeping call, see `Driver::resume_held`).
                for cs in conns.values().filter(|cs| cs.watch().held_ready) {
                    let queued = cs.link.poll(housekeeping, transport, events);
                    if queued > 0 {
                        answered += queued;
                        self.flush_conn(cs);
                    }
                }
            }
        }
        if housekeeping {
            // Links whose events came through a worker-wide channel (RDMA's rdmacm channel;
            // they have no fd of their own) take theirs. (Read even with no link: what is
            // left unread there keeps the channel readable, which an event-mode wait would
            // take for news over and over.)
            self.ifaces.cm_ready(cm_ready);
            if !cm_ready.is_empty() {
                let conns = self.conn_list.read();
                for token in cm_ready.drain(..) {
                    if let Some(cs) = conns.get(&token) {
                        cs.link.poll(true, transport, events);
                    }
                }
            }
        }
        let timer_due = now >= self.next_timer.load(Ordering::Acquire);
        let failures = self.failures_pending.load(Ordering::Acquire)
            && self.failures_pending.swap(false, Ordering::AcqRel);
        let work = polled + events.len() + answered;
        if work == 0 && !timer_due && !failures && !housekeeping {
            // Receive buffers wait for a call that finds nothing to do: off the path from a
            // completion to its waiter.
            if !out.deferred.is_empty() {
                self.repost(&mut out.deferred);
            }
            *idle_calls = idle_calls.wrapping_add(1);
            return 0;
        }
        *idle_calls = 0;
        {
            let mut st = self.state.lock();
            // Shared memory's frames first, each straight from its ring: what else its
            // rings said (a ring found corrupt) comes after them, as it came after them in
            // the ring.
            self.ifaces
                .deliver_shm(transport, |conn, frame| st.deliver_bytes(conn, frame, out));
            let recv_buf_size = st.engine.config().recv_buf_size;
            while let Some(ev) =
                st.ifaces
                    .next_completion(transport, recv_buf_size, &mut out.deferred)
            {
                st.on_link_event(ev, out);
            }
            // (Draining an empty list is not free: each is checked first.)
            if !events.is_empty() {
                self.deliver_events(&mut st, events, holding, out);
            }
            if failures {
                let list: Vec<Arc<Conn>> = st.conns.values().cloned().collect();
                for cs in list {
                    cs.link.take_failures(&mut st.ifaces, failed_posts);
                    for ev in failed_posts.drain(..) {
                        st.on_link_event(ev, out);
                    }
                }
            }
            if timer_due {
                st.engine.handle_timeout(now);
            }
            if srq_low {
                st.engine.handle_receive_pressure();
            }
            if housekeeping {
                st.housekeeping(out);
            }
            self.run(&mut st, out);
            if let Some((slot, taken)) = take {
                if slot.is_done(&self.done_flags) {
                    *taken = st.requests.take(slot);
                }
            }
        }
        if out.deferred.len() >= REPOST_BATCH {
            self.repost(&mut out.deferred);
        }
        // (Under the progress lock: `out` is this lock's scratch, reused call after call. Its
        // receive buffers stay in it, for a call that finds nothing to do.)
        self.after_unlock(out);
        if housekeeping {
            // (After the protocol lock: a connection set up joins the worker, taking it.)
            self.sweep_accepts();
        }
        work
    }

    /// Delivers what the links' polls reported (`events`, left empty), in order. A link
    /// whose input pauses as its frames are delivered (their answers took its output queue
    /// past its limit: see [`TransportLink::input_paused`]) gets the rest of its events
    /// back, to report again once its peer has read enough; the other links' go on.
    ///
    /// [`TransportLink::input_paused`]: crate::transport::TransportLink::input_paused
    #[inline]
    fn deliver_events(
        &self,
        st: &mut Protocol,
        events: &mut Vec<LinkEvent>,
        holding: &mut Vec<(ConnId, Vec<LinkEvent>)>,
        out: &mut AfterUnlock,
    ) {
        for ev in events.drain(..) {
            if !holding.is_empty() {
                if let Some(ev) = hold(holding, ev) {
                    if let Some(paused) = st.on_link_event(ev, out) {
                        holding.push((paused, Vec::new()));
                    }
                }
                continue;
            }
            if let Some(paused) = st.on_link_event(ev, out) {
                holding.push((paused, Vec::new()));
            }
        }
        if !holding.is_empty() {
            self.hold_back(st, holding);
        }
    }

    /// Gives the links in `holding` the events [`Driver::deliver_events`] held back for
    /// them.
    #[cold]
    #[inline(never)]
    fn hold_back(&self, st: &mut Protocol, holding: &mut Vec<(ConnId, Vec<LinkEvent>)>) {
        for (conn, held) in holding.drain(..) {
            let Some(cs) = st.conns.get(&conn) else {
                continue;
            };
            log::debug!(
                "{conn:?}: input paused with {} events undelivered: held until its peer reads",
                held.len()
            );
            if !held.is_empty() {
                cs.link.hold_input(held);
            }
            // (Another thread's flush may have resumed it before it held them.)
            if !cs.link.input_paused() {
                self.resume_held();
            }
        }
    }

    /// Reposts the receive buffers in `reposts` (left empty).
    pub(super) fn repost(&self, reposts: &mut Deferred) {
        // (Drained in place: a batch of reposts allocates nothing once the first spilled.)
        let failed = self.ifaces.run_deferred(reposts);
        if !failed.is_empty() {
            self.state.lock().ifaces.retry(failed);
        }
    }

    /// Event-mode wait: arm, re-progress, sleep on every fd, take the events, progress.
    pub(crate) fn wait_events(&self, timeout: Option<Duration>) -> Result<usize> {
        let n = self.progress();
        if n > 0 {
            return Ok(n);
        }
        self.arm()?;
        let n = self.progress();
        if n > 0 {
            self.disarm();
            return Ok(n);
        }
        let sleep = match (timeout, self.next_timeout()) {
            (Some(t), Some(n)) => Some(t.min(n)),
            (t, n) => t.or(n),
        };
        self.take_ready(sleep)?;
        self.disarm();
        Ok(self.progress())
    }

    /// How long the worker may sleep before its timers or its housekeeping are due (`None`:
    /// for ever, as far as they go). Output a full socket buffer holds back is watched for
    /// room (write interest), so it needs no tick.
    pub(crate) fn next_timeout(&self) -> Option<Duration> {
        let mut sleep = None;
        let next = self.next_timer.load(Ordering::Acquire);
        if next != u64::MAX {
            sleep = Some(Duration::from_nanos(next.saturating_sub(self.now_ns())));
        }
        if self.housekeeping_pending.load(Ordering::Acquire) {
            // Closing connections and parked frames are looked after periodically.
            let tick = Duration::from_millis(250);
            sleep = Some(sleep.map_or(tick, |s: Duration| s.min(tick)));
        }
        sleep
    }

    /// Waits up to `timeout` (`None`: for ever) for the worker's fds, and takes what they
    /// reported: the wake-up fd drained, the transports' worker-wide fds read (RDMA's
    /// completion channel), connection events marked due. Returns how many were ready.
    pub(crate) fn take_ready(&self, timeout: Option<Duration>) -> Result<usize> {
        let mut ready = Vec::new();
        self.registry
            .wait(&mut ready, timeout)
            .map_err(|e| Error::os("epoll_wait", e))?;
        log::trace!("woke after sleeping up to {timeout:?}: {ready:?}");
        for r in &ready {
            match r.token {
                TOKEN_WAKER => self.waker.drain(),
                token if token < TOKEN_CONN => {
                    if self.ifaces.ready(token)? {
                        self.cm_due.store(true, Ordering::Release);
                    }
                }
                _ => self.cm_due.store(true, Ordering::Release),
            }
        }
        Ok(ready.len())
    }

    /// Asks the transports for a wake-up on what comes next (before sleeping). Takes the
    /// progress lock, whose scratch holds the shared-memory rings: waits for a progress call
    /// under way to end.
    pub(super) fn arm(&self) -> Result<()> {
        self.ifaces.arm(&mut self.progress_lock.lock().transport)
    }

    /// Awake again after [`Driver::arm`].
    pub(super) fn disarm(&self) {
        self.ifaces.disarm(&mut self.progress_lock.lock().transport);
    }

    /// Blocks until `done()` (true) or the deadline (false), progressing in the worker's
    /// wait mode — or sleeping on completions when a progress thread does the progress.
    pub(crate) fn wait_until(
        &self,
        on: WaitFor,
        mut done: impl FnMut() -> bool,
        deadline: Option<Instant>,
    ) -> bool {
        let slice = |max: Duration| -> Duration {
            deadline.map_or(max, |d| {
                d.saturating_duration_since(Instant::now()).min(max)
            })
        };
        loop {
            if done() {
                return true;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            if self.progress_thread.load(Ordering::Acquire) {
                // Whatever a waiter waits for wakes it (see `AfterUnlock::wake`); the slice only
                // bounds a wait nothing would end.
                self.sleepers
                    .sleep(on, &mut done, slice(Duration::from_secs(1)), || {
                        self.state.lock()
                    });
                continue;
            }
            match self.mode {
                WaitMode::BusyPoll => {
                    if self.progress_spinning() == 0 {
                        std::hint::spin_loop();
                    }
                }
                WaitMode::Event => {
                    if self.progress() > 0 {
                        continue;
                    }
                    if let Some(guard) = self.waiter.try_lock() {
                        if done() {
                            return true;
                        }
                        if let Err(e) = self.wait_events(Some(slice(Duration::from_secs(1)))) {
                            log::error!("waiting for events: {e}");
                        }
                        drop(guard);
                        // Hand the waiting over to another blocked thread, if any.
                        self.sleepers.wake_all();
                    } else {
                        self.sleepers.sleep(
                            on,
                            &mut done,
                            slice(Duration::from_millis(20)),
                            || self.state.lock(),
                        );
                    }
                }
            }
        }
    }
}

/// Keeps `ev` in `holding` if it is in the stream of a connection held there (see
/// [`Driver::deliver_events`]); otherwise gives it back.
#[cold]
#[inline(never)]
fn hold(holding: &mut [(ConnId, Vec<LinkEvent>)], ev: LinkEvent) -> Option<LinkEvent> {
    match ev
        .stream_conn()
        .and_then(|c| holding.iter_mut().find(|h| h.0 == c))
    {
        Some(held) => {
            held.1.push(ev);
            None
        }
        None => Some(ev),
    }
}

/// The worker's only link (`conns` holds one), a stream (TCP) with no output held back (nor
/// its input paused):
/// marks it readable in `ready` without asking epoll, and returns true. Its read is then the
/// readiness check — one system call per idle poll either way, and one instead of two
/// (epoll_wait, then recv) per arriving batch: 8 B TCP one-way 3.36 -> 3.06-3.14 µs,
/// pinned (ucx_perftest 3.22 in the same runs). With more links, reading each on every poll
/// would cost a call per link: epoll says which. Outside the housekeeping tick only: its
/// epoll_wait still sees what a read cannot (rdmacm events, room to write).
fn read_the_only_link(conns: &HashMap<u64, Arc<Conn>>, ready: &mut Vec<Ready>) -> bool {
    // (The counts the caller checked move apart from the list for a moment as links come
    // and go: look again.)
    let Some(cs) = conns.values().next() else {
        return false;
    };
    if conns.len() != 1 || !cs.link.frames_on_event_fd() || !cs.is_watched(Interest::Read) {
        return false;
    }
    ready.clear();
    ready.push(Ready {
        token: TOKEN_CONN + cs.id.0,
        readable: true,
        writable: false,
    });
    true
}
