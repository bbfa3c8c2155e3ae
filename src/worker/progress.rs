//! Making progress (completions, readiness, connection events, timers) and waiting for it.

use super::*;

impl Driver {
    pub(super) fn cm_check_due(&self, now: u64) -> bool {
        let last = self.last_cm_check.load(Ordering::Relaxed);
        if self.cm_due.swap(false, Ordering::AcqRel)
            || now.saturating_sub(last) >= CM_CHECK_INTERVAL.as_nanos() as u64
        {
            self.last_cm_check.store(now, Ordering::Relaxed);
            return true;
        }
        false
    }

    pub(crate) fn progress(&self) -> usize {
        let Some(mut scratch) = self.progress_lock.try_lock() else {
            return 0;
        };
        let Scratch {
            #[cfg(feature = "rdma")]
            wcs,
            ready,
            tcp_events,
            events,
        } = &mut *scratch;
        let rdma = self.rdma_res();
        #[cfg(feature = "rdma")]
        {
            wcs.clear();
            if let Some(r) = rdma {
                if let Err(e) = r.cq.poll(wcs, 64) {
                    log::error!("{e}");
                }
            }
        }
        let now = self.now_ns();
        #[cfg(feature = "rdma")]
        let mut cm_events: Vec<(ConnId, CmEvent)> = Vec::new();
        let housekeeping = self.cm_check_due(now);
        let tcp = self.tcp_links.load(Ordering::Acquire) > 0;
        if tcp || (housekeeping && rdma.is_some()) {
            // One epoll_wait says which links have input (TCP data, rdmacm events) or room
            // for output they hold back: only those are read or written.
            if let Err(e) = self.registry.wait(ready, Some(Duration::ZERO)) {
                log::error!("checking the connections' readiness: {e}");
            }
            let conns = self.conn_list.read();
            for r in ready.iter().filter(|r| r.token >= TOKEN_CONN) {
                let Some(cs) = conns.get(&(r.token - TOKEN_CONN)) else {
                    continue;
                };
                match &cs.link {
                    #[cfg(feature = "rdma")]
                    Link::Rdma(link) if housekeeping && r.readable => loop {
                        match link.conn.next_event(Some(Duration::ZERO)) {
                            Ok(Some(ev)) => cm_events.push((cs.id, ev)),
                            Ok(None) => break,
                            Err(e) => {
                                log::debug!("events of {:?}: {e}", cs.id);
                                break;
                            }
                        }
                    },
                    #[cfg(feature = "rdma")]
                    Link::Rdma(_) => {}
                    Link::Tcp(link) => {
                        if r.writable {
                            self.flush_conn(cs);
                        }
                        if !r.readable {
                            continue;
                        }
                        events.clear();
                        if let Err(e) = link.poll(events) {
                            events.push(rdmx_tcp::Event::Closed {
                                reason: e.to_string(),
                            });
                        }
                        tcp_events.extend(events.drain(..).map(|ev| (cs.clone(), ev)));
                    }
                }
            }
        }
        let timer_due = now >= self.next_timer.load(Ordering::Acquire);
        let failures = self.failures_pending.swap(false, Ordering::AcqRel);
        #[cfg(feature = "rdma")]
        let rdma_work = wcs.len() + cm_events.len();
        #[cfg(not(feature = "rdma"))]
        let rdma_work = 0;
        if rdma_work == 0 && tcp_events.is_empty() && !timer_due && !failures && !housekeeping {
            return 0;
        }
        let work = rdma_work + tcp_events.len();
        let mut out = AfterUnlock::default();
        {
            let mut st = self.state.lock();
            #[cfg(feature = "rdma")]
            {
                for wc in wcs.drain(..) {
                    st.on_completion(wc, &mut out);
                }
                for (id, ev) in cm_events {
                    st.on_cm_event(id, ev, &mut out);
                }
            }
            for (cs, ev) in tcp_events.drain(..) {
                st.on_tcp_event(&cs, ev, &mut out);
            }
            #[cfg(feature = "rdma")]
            if failures {
                let list: Vec<Arc<Conn>> = st.conns.values().cloned().collect();
                for cs in list {
                    let Some(link) = cs.rdma() else { continue };
                    let items: Vec<Outgoing> = std::mem::take(&mut *link.failures.lock());
                    for item in items {
                        st.on_post_failure(&cs, item, &mut out);
                    }
                }
            }
            if timer_due {
                st.engine.handle_timeout(now);
            }
            if housekeeping {
                st.housekeeping(&mut out);
            }
            self.run(&mut st, &mut out);
        }
        drop(scratch);
        self.finish(out);
        work
    }

    /// Event-mode wait: arm, re-progress, sleep on every fd, take the events, progress.
    pub(crate) fn wait_events(&self, timeout: Option<Duration>) -> Result<usize> {
        let n = self.progress();
        if n > 0 {
            return Ok(n);
        }
        #[cfg(feature = "rdma")]
        if let Some(r) = self.rdma.get() {
            r.cq.request_notify()?;
        }
        let n = self.progress();
        if n > 0 {
            return Ok(n);
        }
        let mut sleep = timeout;
        let next = self.next_timer.load(Ordering::Acquire);
        if next != u64::MAX {
            let until = Duration::from_nanos(next.saturating_sub(self.now_ns()));
            sleep = Some(sleep.map_or(until, |s| s.min(until)));
        }
        if self.housekeeping_pending.load(Ordering::Acquire) {
            // Closing connections and parked frames are looked after periodically.
            let tick = Duration::from_millis(250);
            sleep = Some(sleep.map_or(tick, |s| s.min(tick)));
        }
        // Output a full socket buffer holds back is watched for room (write interest), so
        // nothing here needs a tick.
        let mut ready = Vec::new();
        self.registry
            .wait(&mut ready, sleep)
            .map_err(|e| Error::os("epoll_wait", e))?;
        log::trace!("woke after sleeping up to {sleep:?}: {ready:?}");
        for r in ready {
            match r.token {
                TOKEN_WAKER => self.waker.drain(),
                #[cfg(feature = "rdma")]
                TOKEN_CQ => {
                    if let Some(r) = self.rdma.get() {
                        r.cq.take_events()?;
                    }
                }
                _ => self.cm_due.store(true, Ordering::Release),
            }
        }
        Ok(self.progress())
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
                    .sleep(on, &mut done, slice(Duration::from_secs(1)));
                continue;
            }
            match self.mode {
                WaitMode::BusyPoll => {
                    if self.progress() == 0 {
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
                        self.sleepers
                            .sleep(on, &mut done, slice(Duration::from_millis(20)));
                    }
                }
            }
        }
    }
}
