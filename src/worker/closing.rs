//! Closing connections, reaping them once drained, and the transports' periodic care.

use super::*;

impl Protocol {
    pub(super) fn start_closing(&mut self, cs: &Arc<Conn>, reason: String, out: &mut AfterUnlock) {
        cs.close_reason.lock().get_or_insert(reason);
        if !cs.closing.swap(true, Ordering::AcqRel) {
            out.news = true;
            // RDMA disconnects after what is queued is posted; TCP shuts the socket down
            // once everything is written (TransportLink::flush).
            cs.link.close();
            out.flush(cs);
            self.closing.push((cs.id, crate::clock::coarse_now_ns()));
        }
    }

    /// Destroys drained closing connections; lets the transports look after what waits
    /// (frames parked too long, failed reposts).
    pub(super) fn housekeeping(&mut self, out: &mut AfterUnlock) {
        let now = crate::clock::coarse_now_ns();
        // Endpoints whose last handle was dropped with sends in flight: closed once those
        // completed, or at their deadline (the engine fails what is still pending).
        let mut lingering = std::mem::take(&mut self.lingering);
        lingering.retain(|(cs, deadline)| {
            if cs.is_closing() {
                return false;
            }
            let drained = cs.flushed();
            if drained || now >= *deadline {
                if !drained {
                    log::warn!(
                        "{:?}: dropped endpoint still had sends pending at its deadline; \
                         closing it",
                        cs.id
                    );
                }
                self.engine.close(cs.id);
                return false;
            }
            true
        });
        self.lingering = lingering;
        let after =
            |since: u64, limit: Duration| now.saturating_sub(since) > limit.as_nanos() as u64;
        let mut keep = Vec::new();
        for (id, since) in std::mem::take(&mut self.closing) {
            let Some(cs) = self.conns.get(&id).cloned() else {
                continue;
            };
            if cs.idle() || after(since, REAP_TIMEOUT) {
                if !cs.idle() {
                    log::debug!("{id:?}: destroying with work still posted or unwritten");
                }
                self.reclaim_lent(&cs);
                self.conns.remove(&id);
                self.kept.retain(|(conn, _)| *conn != id);
                cs.link.reaped(&mut self.ifaces);
                self.reads_lost_with(id, out);
                out.reaped.push(cs);
            } else {
                keep.push((id, since));
            }
        }
        self.closing = keep;
        for cs in self.conns.values() {
            if !cs.is_closing() && cs.link.keepalive(now) {
                out.flush(cs);
            }
        }
        self.ifaces.housekeeping(now, &mut out.deferred);
        // A destroyed QP dropped the binds still posted on it.
        self.release_held(out);
    }
}
