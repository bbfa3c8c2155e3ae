//! The unexpected-message budget: what the engine holds for messages no receive matched yet
//! (an eager message's payload, copied out of its receive buffer, and an entry per message),
//! and the credits it withholds from their senders past `Config::max_unexpected`.
//!
//! A frame's receive buffer is never kept: an unexpected eager payload is copied into the
//! engine and the buffer goes back to the driver (reposted to the SRQ, or the shared-memory
//! ring's record consumed). What bounds the copies is the sender's credit: past the budget,
//! the credit of each frame that arrives unexpected (an EAGER or an RTS no posted receive
//! matched) is withheld — still granted to the peer, but neither returned nor counted in
//! the window its frames are checked against (`Conn::window`) — if that peer holds more
//! than its share of the budget (an equal part per connection of what messages of
//! connections gone leave of it), so a peer whose messages fill the queue runs out of
//! credit and waits; the engine never refuses or drops a frame. A peer whose messages match posted receives has its credits returned
//! as always, whatever the queue holds, and so does one that holds no more than its share.
//! When receives (or matched probes and their `msg_recv`) bring a peer back within its share
//! its withheld credits go back; when they bring the total back within the budget, every
//! peer's do.
//!
//! Withholding never stops what could drain the queue, nor what another peer needs:
//! - A message frame (EAGER, RTS) needs two credits, a control frame (ATS, RMA reply) or a
//!   one-sided request one, and a CREDIT frame none (see `send::CTRL_CREDITS`). The engine
//!   withholds no credit that would leave a peer less than one of its window: a peer whose
//!   credits are all withheld sends no more messages, but still sends the ATS that ends one of
//!   this side's rendezvous sends, its RMA replies and requests, and its credit updates (the
//!   credits owed to it come back as soon as it holds fewer than a message needs: see
//!   `Conn::credit_due`); this side's own frames to it go on as before.
//! - No window is grown for a peer while its credits are withheld, and the pool reclaims
//!   credits only from the part of a window not withheld, keeping the initial grant of it.
//! - The shares keep one peer's flood from stopping another: a receiver that takes its
//!   peers' messages one peer after the other (a gather) drains the peer it waits for below
//!   its share, whose credits then come back, however much the others hold.
//!
//! A peer that keeps sending while the application posts no receive waits for ever: that is
//! the intended back-pressure (an MPI sender waits the same way once its library stops
//! buffering). So does an application that receives a peer's later message before earlier
//! ones from it that fill that peer's share: those must fit in the budget, as they would in
//! an MPI library's eager buffers.
//!
//! What the queue may hold: the budget, then what peers below their share add until they
//! reach it (at most the budget again), and what each peer's window held in flight once its
//! credits were withheld (at most a window of eager frames per peer): twice the budget and a
//! window of eager frames per peer, whatever the peers declare. Messages of a connection
//! gone stay queued until received and count against the shares of those that remain, so a
//! peer that reconnects gets no fresh share: each connection it makes adds at most what its
//! window carries before its credits are withheld (a window is granted at connect, before
//! anything is known of the peer). A peer that sends past the
//! credits it holds, or sends a message holding fewer than two while its credits are
//! withheld (spending the one left for its control frames), is a protocol error, and only
//! its connection closes.
//!
//! The bound holds on every link: frames come in through a pooled window (RDMA's SRQ, TCP)
//! or a fixed one (shared memory's ring), and the credit is the engine's in both.

use super::*;

impl Unexpected {
    /// What the message costs against the budget: its entry, and an eager message's copy (the
    /// allocation: a recycled one may be larger than the payload).
    pub(super) fn cost(&self) -> u64 {
        UNEXPECTED_ENTRY_COST
            + match &self.kind {
                UnexpKind::Eager(d) => d.capacity() as u64,
                UnexpKind::Rts { .. } => 0,
            }
    }
}

impl Engine {
    /// An unexpected message that cost `cost` arrived on `conn` in the frame just counted:
    /// past the budget, that frame's credit is withheld if the peer holds more than its
    /// share. A peer that sent it without the credits a message needs while its credits were
    /// withheld is a protocol error.
    #[inline]
    pub(super) fn hold_unexpected(&mut self, conn: ConnId, cost: u64) -> Result<(), CloseReason> {
        self.unexpected_bytes += cost;
        let over = self.unexpected_bytes > self.cfg.max_unexpected;
        let Some(c) = self.conns.get_mut(&conn) else {
            return Ok(());
        };
        c.unexpected += cost;
        if over {
            return self.withhold(conn);
        }
        Ok(())
    }

    /// An unexpected message of `conn` that cost `cost` left the engine (a receive took it):
    /// back within its share of the budget, that peer's withheld credits go back; back
    /// within the budget, every peer's do.
    #[inline]
    pub(super) fn unhold_unexpected(&mut self, conn: ConnId, cost: u64) {
        self.unexpected_bytes = self.unexpected_bytes.saturating_sub(cost);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.unexpected = c.unexpected.saturating_sub(cost);
            if c.withheld != 0 {
                self.release_within_share(conn);
            }
        } else {
            self.orphaned_bytes = self.orphaned_bytes.saturating_sub(cost);
        }
        if !self.withholding.is_empty() && self.unexpected_bytes <= self.cfg.max_unexpected {
            self.release_withheld();
        }
    }

    /// A peer's share of the budget: an equal part per connection of what messages of
    /// connections gone leave of it (they stay queued until received: a peer that reconnects
    /// gets no fresh share).
    fn share(&self) -> u64 {
        let left = self.cfg.max_unexpected.saturating_sub(self.orphaned_bytes);
        left / self.conns.len().max(1) as u64
    }

    /// A connection gone left messages that cost `bytes` queued.
    pub(super) fn orphan_unexpected(&mut self, bytes: u64) {
        self.orphaned_bytes += bytes;
    }

    /// Withholds the credit of the message frame that just arrived on `conn_id` if its peer
    /// holds more than its share, unless that would leave it less than one credit of its
    /// window (what control frames need, not messages: see `send::DATA_CREDITS`).
    #[cold]
    #[inline(never)]
    fn withhold(&mut self, conn_id: ConnId) -> Result<(), CloseReason> {
        let share = self.share();
        let Some(c) = self.conns.get_mut(&conn_id) else {
            return Ok(());
        };
        // A message takes two credits: a peer that held fewer (all it could hold is what its
        // window, less what is owed for its earlier frames, left it) spent one meant for a
        // control frame, which would let it trickle messages past its withheld credits.
        if c.withheld != 0 && c.rx_unreturned + send::DATA_CREDITS - 1 > c.window {
            return Err(CloseReason::ProtocolError(format!(
                "peer sent a message holding fewer than the {} credits a message needs, while \
                 all but {} of its credits were withheld",
                send::DATA_CREDITS,
                c.window
            )));
        }
        if c.unexpected <= share || c.rx_unreturned == 0 || c.window < send::DATA_CREDITS {
            return Ok(());
        }
        c.rx_unreturned -= 1;
        c.window -= 1;
        c.withheld += 1;
        if c.withheld == 1 {
            debug!(
                "{conn_id:?}: {} bytes held for its unexpected messages, {} in all, over the \
                 budget of {}: its credits are withheld",
                c.unexpected, self.unexpected_bytes, self.cfg.max_unexpected
            );
            // (A connection gone with credits withheld may have left its id in the list.)
            if !self.withholding.contains(&conn_id) {
                self.withholding.push(conn_id);
            }
        }
        Ok(())
    }

    /// Gives `conn_id`'s withheld credits back if its peer holds no more than its share.
    #[cold]
    #[inline(never)]
    fn release_within_share(&mut self, conn_id: ConnId) {
        let share = self.share();
        if self
            .conns
            .get(&conn_id)
            .is_some_and(|c| c.unexpected <= share)
        {
            self.release(conn_id);
        }
    }

    /// Gives every withheld credit back.
    #[cold]
    #[inline(never)]
    fn release_withheld(&mut self) {
        let list = std::mem::take(&mut self.withholding);
        for &conn_id in &list {
            self.release(conn_id);
        }
        // (The list's memory serves the next time.)
        self.withholding = list;
        self.withholding.clear();
    }

    /// Gives `conn_id`'s withheld credits back at once: the peer may be waiting for them
    /// with nothing more to say (it stays in the list of connections withholding, to be
    /// skipped).
    fn release(&mut self, conn_id: ConnId) {
        let Some(c) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let n = std::mem::take(&mut c.withheld);
        if n == 0 {
            return;
        }
        c.window += n;
        c.rx_unreturned += n;
        self.flush(conn_id);
        if let Some(c) = self.conns.get_mut(&conn_id) {
            if c.rx_unreturned > 0 {
                // (No frame carried them, and none was due.)
                c.emit_credit(conn_id, &mut self.actions, &mut self.credits);
            }
        }
    }

    /// Bytes held for unexpected messages: eager payloads and an entry of
    /// [`UNEXPECTED_ENTRY_COST`] bytes per message, of
    /// those queued and those a matched probe took out of matching
    /// ([`Engine::probe_remove`]) and not yet received. Past `Config::max_unexpected`,
    /// credits are withheld ([`Engine::withheld_credits`]).
    pub fn unexpected_bytes(&self) -> u64 {
        self.unexpected_bytes
    }

    /// Credits withheld from peers now, over all connections (see
    /// [`ConnStats::withheld`]).
    pub fn withheld_credits(&self) -> u64 {
        self.withholding
            .iter()
            .filter_map(|id| self.conns.get(id))
            .map(|c| u64::from(c.withheld))
            .sum()
    }
}
