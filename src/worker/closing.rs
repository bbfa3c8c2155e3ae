//! Closing connections, reaping them once drained, and dropping frames parked too long.

use super::*;

impl Protocol {
    pub(super) fn start_closing(&mut self, cs: &Arc<Conn>, reason: String, out: &mut AfterUnlock) {
        cs.close_reason.lock().get_or_insert(reason);
        if !cs.closing.swap(true, Ordering::AcqRel) {
            out.news = true;
            // RDMA disconnects after what is queued is posted; TCP shuts the socket down
            // once everything is written (Conn::flush).
            #[cfg(feature = "rdma")]
            if let Some(link) = cs.rdma() {
                link.push(Outgoing::Disconnect);
            }
            out.flush(cs);
            self.closing.push((cs.id, crate::clock::coarse_now_ns()));
        }
    }

    /// Destroys drained closing connections; reposts frames parked too long; retries
    /// failed reposts.
    pub(super) fn housekeeping(&mut self, out: &mut AfterUnlock) {
        let now = crate::clock::coarse_now_ns();
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
                #[cfg(feature = "rdma")]
                self.qp_map.retain(|_, c| *c != id);
                self.reads_lost_with(id, out);
                out.reaped.push(cs);
            } else {
                keep.push((id, since));
            }
        }
        self.closing = keep;
        #[cfg(feature = "rdma")]
        self.drop_stale_parked(now, out);
        // A destroyed QP dropped the binds still posted on it.
        self.release_held(out);
    }

    /// Reposts frames parked too long (from a QP never known), and failed reposts.
    #[cfg(feature = "rdma")]
    fn drop_stale_parked(&mut self, now: u64, out: &mut AfterUnlock) {
        let after =
            |since: u64, limit: Duration| now.saturating_sub(since) > limit.as_nanos() as u64;
        let (old, fresh): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| after(p.since, PARK_TIMEOUT));
        self.parked = fresh;
        for p in old {
            log::debug!("dropping a frame from unknown qp {}", p.qp);
            out.reposts.push((p.buf, p.id));
        }
        out.reposts.extend(self.spare_recv.drain(..));
    }
}
