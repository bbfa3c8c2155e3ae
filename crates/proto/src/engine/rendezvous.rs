//! The receiver's side of a rendezvous: READs of the sender's exposed buffer, in chunks,
//! and the ATS that ends it.
//!
//! Each receive keeps at most `Config::max_reads_in_flight` READs in flight, and each
//! connection at most [`MAX_READS_PER_CONN`] (or that, if more) over all its receives:
//! a receive that finds its connection's READs all in flight waits, in order, for one of
//! them to complete. So what a receiver makes its sender hold for it — the READ requests
//! a sender without RDMA answers from its own queue — has a bound, whatever the number
//! of messages: a sender can tell a peer that asks for more from a legitimate one.

use super::*;

/// Emptied lists of outstanding READs kept for reuse, at most.
const MAX_SPARE_READ_LISTS: usize = 64;

/// The most rendezvous READs an engine keeps in flight on one connection, over all its
/// receives (unless `Config::max_reads_in_flight`, per receive, is more): as many as the
/// largest window rdmx configures per message (`RDMX_RNDV_CHUNK` of 4 KiB), 16 MiB in
/// flight at its default 256 KiB — far past what one connection's bandwidth needs — and a
/// bound a peer's sender can rely on (an RDMA NIC bounds a queue pair's READs the same
/// way, `max_rd_atomic`).
pub const MAX_READS_PER_CONN: u32 = 64;

impl Engine {
    pub(super) fn start_rndv(
        &mut self,
        p: Posted,
        conn: ConnId,
        tag: Tag,
        sreq: u64,
        body: RtsBody,
    ) {
        // (The connection's chunk; a connection already gone fails its READs as they are
        // made, in the configuration's.)
        let chunk = self
            .conns
            .get(&conn)
            .map_or(self.cfg.rndv_chunk_size, |c| c.rndv_chunk);
        let req = p.req;
        let r = self.recvs.entry(req).or_insert(RecvReq {
            buf: p.buf,
            tag,
            reading: None,
        });
        if body.len > p.cap || body.len == 0 {
            let (status, wst) = if body.len > p.cap {
                (Status::Truncated, WireStatus::Truncated)
            } else {
                (Status::Ok, WireStatus::Ok)
            };
            let done = Completion {
                request: req,
                kind: RequestKind::Recv,
                status,
                length: body.len,
                tag,
                conn: Some(conn),
                // (Filled in as it is reported.)
                buf: None,
            };
            self.complete_after_ats(conn, sreq, wst, done);
            return;
        }
        r.reading = Some(Reading {
            conn,
            remote: RemoteBuf {
                addr: body.addr,
                rkey: body.rkey,
            },
            sreq,
            total: body.len,
            chunk,
            next_offset: 0,
            done: 0,
            outstanding: self.spare_reads.pop().unwrap_or_default(),
            failed: None,
            conn_dead: false,
            waiting: false,
        });
        self.issue_reads(req);
    }

    /// The most READs in flight on one connection: [`MAX_READS_PER_CONN`], or one
    /// receive's most if that is more.
    pub(super) fn reads_per_conn(&self) -> u32 {
        MAX_READS_PER_CONN.max(self.cfg.max_reads_in_flight)
    }

    /// Issues the READs receive `req` may have in flight now: up to its own most, as far
    /// as its connection's allow; if they do not, it waits in the connection's queue.
    pub(super) fn issue_reads(&mut self, req: RequestId) {
        let max = self.cfg.max_reads_in_flight as usize;
        let per_conn = self.reads_per_conn();
        let Some(r) = self.recvs.get_mut(&req) else {
            return;
        };
        let buf = r.buf;
        let Some(rd) = r.reading.as_mut() else { return };
        // (A connection already gone fails its READs as they are made.)
        let mut conn = self.conns.get_mut(&rd.conn);
        while rd.failed.is_none() && rd.outstanding.len() < max && rd.next_offset < rd.total {
            if let Some(c) = conn.as_mut() {
                if c.reads_out >= per_conn {
                    if !rd.waiting {
                        rd.waiting = true;
                        c.reads_waiting.push_back(req);
                    }
                    break;
                }
                c.reads_out += 1;
            }
            let off = rd.next_offset;
            let len = rd.chunk.min(rd.total - off);
            rd.next_offset += len;
            rd.outstanding.push((off, len));
            self.actions.push_back(Action::RdmaRead {
                conn: rd.conn,
                request: req,
                remote: RemoteBuf {
                    addr: rd.remote.addr.wrapping_add(off),
                    rkey: rd.remote.rkey,
                },
                len,
                dst: buf,
                dst_offset: off,
            });
        }
    }

    /// An RDMA READ issued by [`Action::RdmaRead`] finished (`ok == false`: it failed,
    /// including flush errors).
    pub fn handle_read_complete(&mut self, request: RequestId, dst_offset: u64, ok: bool) {
        let Some(r) = self.recvs.get_mut(&request) else {
            debug!("read completion for unknown request {request:?}");
            return;
        };
        let tag = r.tag;
        let Some(rd) = r.reading.as_mut() else { return };
        let Some(pos) = rd.outstanding.iter().position(|o| o.0 == dst_offset) else {
            debug!("read completion for unknown offset {dst_offset} of {request:?}");
            return;
        };
        let (_, len) = rd.outstanding.swap_remove(pos);
        if ok {
            rd.done += len;
        } else if rd.failed.is_none() {
            rd.failed = Some(Status::ReadFailed);
        }
        let conn = rd.conn;
        if let Some(c) = self.conns.get_mut(&conn) {
            c.reads_out = c.reads_out.saturating_sub(1);
        }
        if !rd.outstanding.is_empty() || (rd.failed.is_none() && rd.done < rd.total) {
            self.issue_reads(request);
            self.issue_waiting(conn);
            return;
        }
        let (sreq, total, failed, dead) = (rd.sreq, rd.total, rd.failed, rd.conn_dead);
        // The list's memory serves the next rendezvous (no allocation per message).
        if self.spare_reads.len() < MAX_SPARE_READ_LISTS {
            self.spare_reads.push(std::mem::take(&mut rd.outstanding));
        }
        let status = failed.unwrap_or(Status::Ok);
        self.draining.retain(|d| d.1 != request);
        let length = if status == Status::Ok { total } else { 0 };
        if dead {
            self.complete(request, RequestKind::Recv, status, length, tag, Some(conn));
            return;
        }
        // Its last READ's place goes to the next receive waiting for one.
        self.issue_waiting(conn);
        let wst = if status == Status::Ok {
            WireStatus::Ok
        } else {
            WireStatus::ReadFailed
        };
        let done = Completion {
            request,
            kind: RequestKind::Recv,
            status,
            length,
            tag,
            conn: Some(conn),
            // (Filled in as it is reported.)
            buf: None,
        };
        self.complete_after_ats(conn, sreq, wst, done);
    }

    /// Issues the READs of receives waiting for `conn`'s, in order, while it has room for
    /// more in flight.
    fn issue_waiting(&mut self, conn: ConnId) {
        let per_conn = self.reads_per_conn();
        loop {
            let Some(c) = self.conns.get_mut(&conn) else {
                return;
            };
            if c.reads_out >= per_conn {
                return;
            }
            let Some(req) = c.reads_waiting.pop_front() else {
                return;
            };
            if let Some(rd) = self.recvs.get_mut(&req).and_then(|r| r.reading.as_mut()) {
                rd.waiting = false;
            }
            // (Back in the queue if the connection's READs fill up again.)
            self.issue_reads(req);
        }
    }

    /// Queues the ATS for the sender's request `sreq` on `conn`, and the receive's completion
    /// `done` to be reported once the ATS has left (at once when credits allow). Without the
    /// connection, the receive completes now.
    fn complete_after_ats(
        &mut self,
        conn: ConnId,
        sreq: u64,
        status: WireStatus,
        done: Completion,
    ) {
        // The receive stays (matched, so not cancellable, and no longer reading) until the
        // ATS leaves: it is pending until its completion is reported.
        if let Some(r) = self.recvs.get_mut(&done.request) {
            r.reading = None;
        }
        match self.conns.get_mut(&conn) {
            Some(c) => {
                c.ctrl_q.push_back(Ctrl::Ats {
                    sreq,
                    rreq: done.request.0,
                    status,
                    then: Some(done),
                });
                self.flush(conn);
            }
            None => report(&mut self.reqs, &mut self.recvs, &mut self.actions, done),
        }
    }
}
