//! The receiver's side of a rendezvous: READs of the sender's exposed buffer, in chunks,
//! and the ATS that ends it.

use super::*;

/// Emptied lists of outstanding READs kept for reuse, at most.
const MAX_SPARE_READ_LISTS: usize = 64;

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
        });
        self.issue_reads(req);
    }

    pub(super) fn issue_reads(&mut self, req: RequestId) {
        let max = self.cfg.max_reads_in_flight as usize;
        let Some(r) = self.recvs.get_mut(&req) else {
            return;
        };
        let buf = r.buf;
        let Some(rd) = r.reading.as_mut() else { return };
        while rd.failed.is_none() && rd.outstanding.len() < max && rd.next_offset < rd.total {
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
        if !rd.outstanding.is_empty() || (rd.failed.is_none() && rd.done < rd.total) {
            self.issue_reads(request);
            return;
        }
        let (conn, sreq, total, failed, dead) =
            (rd.conn, rd.sreq, rd.total, rd.failed, rd.conn_dead);
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
