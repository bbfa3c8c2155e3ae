//! What the RDMA transport's work completions mean, as [`LinkEvent`]s: frames received on
//! the SRQ (kept aside while their QP is not known yet), sends, memory window binds and READs
//! finished.

use rdmx_conn::{Completion, WcStatus, WorkKind};
use rdmx_proto::ConnId;

use super::iface::Parked;
use super::{RdmaLockedIface, COOKIE_KIND, COOKIE_READ, COOKIE_SEND};
use crate::transport::{Deferred, LinkEvent, RecvFrame};

impl RdmaLockedIface {
    /// What the work completion `wc` means, if anything yet (a frame from a QP not known yet
    /// is kept aside). `recv_buf_size` names the receive buffers' size in errors; a failed
    /// receive's buffer is reposted through `deferred`.
    pub(crate) fn completion(
        &mut self,
        wc: Completion,
        recv_buf_size: u32,
        deferred: &mut Deferred,
    ) -> Option<LinkEvent> {
        let ok = wc.status.is_success();
        let conn = ConnId(wc.cookie & !COOKIE_KIND);
        match (wc.kind, wc.cookie & COOKIE_KIND) {
            (WorkKind::Recv, _) => {
                let buf = wc.buffer?;
                let index = wc.cookie;
                if !ok {
                    if wc.status == WcStatus::FLUSHED {
                        return None;
                    }
                    deferred.reposts.push((buf, index));
                    // The QP is in the error state now: the connection is lost, typically
                    // because the peer sent more than a receive buffer holds.
                    let why = format!(
                        "a receive failed ({}): the peer sent a frame larger than the \
                         {recv_buf_size}-byte receive buffer, or the connection broke",
                        wc.status.description(),
                    );
                    log::warn!("{why}");
                    let &conn = self.qp_map.get(&wc.qp_num)?;
                    return Some(LinkEvent::Down {
                        conn,
                        reason: why,
                        reads_lost: false,
                    });
                }
                let len = wc.byte_len as usize;
                match self.qp_map.get(&wc.qp_num) {
                    Some(&conn) => Some(LinkEvent::Frame {
                        conn,
                        frame: RecvFrame::Srq { buf, index },
                        len,
                    }),
                    None => {
                        self.parked.push(Parked {
                            qp: wc.qp_num,
                            index,
                            buf,
                            len,
                            since: crate::clock::coarse_now_ns(),
                        });
                        None
                    }
                }
            }
            // A keepalive probe (the only RDMA WRITE rdmx posts): the peer did not
            // acknowledge it, so it is dead or out of reach.
            (WorkKind::Write, COOKIE_SEND) if !ok && wc.status != WcStatus::FLUSHED => {
                Some(LinkEvent::Down {
                    conn,
                    reason: format!(
                        "the peer did not answer a keepalive probe ({}): it is dead or out \
                         of reach",
                        wc.status.description()
                    ),
                    reads_lost: false,
                })
            }
            (_, COOKIE_SEND) => {
                if let Some(buf) = wc.buffer {
                    self.send_pool.give(buf);
                }
                Some(LinkEvent::SendDone {
                    conn,
                    error: (!ok).then(|| wc.status.description()),
                })
            }
            (WorkKind::Bind, _) => Some(LinkEvent::Bound {
                conn,
                error: (!ok).then(|| {
                    format!(
                        "binding a memory window failed: {}",
                        wc.status.description()
                    )
                }),
            }),
            (kind, COOKIE_READ) => {
                if !ok {
                    log::debug!("RDMA {kind:?} failed: {}", wc.status.description());
                }
                let (piece, value) = match (kind, wc.buffer) {
                    // An atomic operation's result buffer goes back to its pool.
                    (WorkKind::Atomic, Some(result)) => {
                        let mut word = [0u8; 8];
                        word.copy_from_slice(&result[..8]);
                        self.atomic_results.push(result);
                        (None, u64::from_ne_bytes(word))
                    }
                    (_, piece) => (piece, 0),
                };
                Some(LinkEvent::ReadDone {
                    key: wc.cookie & !COOKIE_KIND,
                    piece,
                    ok,
                    refused: wc.status == WcStatus::REMOTE_ACCESS,
                    value,
                    posted: true,
                })
            }
            _ => {
                log::debug!("completion with unknown cookie {:#x}", wc.cookie);
                None
            }
        }
    }

    /// The QP `qp` is `conn`'s from now on: the frames that arrived on it before are
    /// delivered.
    pub(super) fn adopt(&mut self, qp: u32, conn: ConnId, out: &mut Vec<LinkEvent>) {
        self.qp_map.insert(qp, conn);
        if self.parked.is_empty() {
            return;
        }
        let (mine, rest): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| p.qp == qp);
        self.parked = rest;
        out.extend(mine.into_iter().map(|p| LinkEvent::Frame {
            conn,
            frame: RecvFrame::Srq {
                buf: p.buf,
                index: p.index,
            },
            len: p.len,
        }));
    }

    /// `conn` is gone: its QP is forgotten.
    pub(super) fn forget(&mut self, conn: ConnId) {
        self.qp_map.retain(|_, c| *c != conn);
    }
}
