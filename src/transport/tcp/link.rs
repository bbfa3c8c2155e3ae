//! A TCP connection of a worker: `rdmx-tcp`'s link, and what the worker asks of it
//! ([`TransportLink`]). READ requests from the peer are answered here, from the exposure
//! table, as the link's input is read.

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use parking_lot::Mutex;
use rdmx_proto::{ConnId, RemoteBuf, UserBufId};
use rdmx_tcp::Event;

use super::{Answer, Exposures};
use crate::transport::{
    Deferred, LinkEvent, LockedIfaces, PollScratch, Queued, ReadOp, RecvFrame, Transport,
    TransportLink,
};
use crate::usermem::UserMem;

/// A TCP connection of a worker.
pub(crate) struct TcpLink {
    id: ConnId,
    link: rdmx_tcp::Link,
    /// The worker's exposure table (shared by its TCP links).
    exposures: Arc<Mutex<Exposures>>,
}

impl TcpLink {
    pub(super) fn new(id: ConnId, link: rdmx_tcp::Link, exposures: Arc<Mutex<Exposures>>) -> Self {
        TcpLink {
            id,
            link,
            exposures,
        }
    }

    /// Answers the peer's READ request `read_id` for `len` bytes at `addr` under `rkey` by
    /// queueing the data (streamed straight from the exposed buffer) or a failure. A request
    /// for a buffer exposed to another connection is a protocol error: the link goes down.
    fn answer_read(
        &self,
        read_id: u64,
        (addr, rkey, len): (u64, u32, u64),
        out: &mut Vec<LinkEvent>,
    ) {
        let answer = self.exposures.lock().answer(self.id, addr, rkey, len);
        match answer {
            Answer::Data { data, offset, len } => {
                self.link
                    .queue_read_data(read_id, true, Some((data, offset, len)))
            }
            Answer::Refused => {
                log::debug!("{:?}: READ request for bytes not exposed", self.id);
                self.link.queue_read_data(read_id, false, None);
            }
            Answer::OtherEndpoint => {
                log::warn!(
                    "{:?}: {:?} asked to READ a buffer exposed to another endpoint",
                    self.id,
                    self.link.peer_addr()
                );
                self.link.queue_read_data(read_id, false, None);
                out.push(super::foreign_read_down(self.id));
            }
        }
    }
}

impl TransportLink for TcpLink {
    fn transport(&self) -> Transport {
        Transport::Tcp
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.link.peer_addr()
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.link.local_addr()
    }

    fn peer_private_data(&self) -> &[u8] {
        self.link.peer_private_data()
    }

    fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.link.fd())
    }

    fn queue_frame(
        &self,
        _: &mut LockedIfaces,
        frame: &rdmx_proto::wire::FrameBuf,
        payload: &[u8],
    ) -> Result<Queued, String> {
        self.link.queue_frame(frame.as_bytes(), payload);
        Ok(Queued::ForFlush)
    }

    /// The destination is lent to the link, which writes the READ data straight into it,
    /// and a READ request goes to the peer.
    fn start_read(
        &self,
        _: &mut LockedIfaces,
        read: ReadOp,
        mem: &mut UserMem,
    ) -> Result<(), String> {
        let key = read.buf.0;
        if let UserMem::Plain(vec) = std::mem::replace(mem, UserMem::Lent) {
            self.link.lend(key, vec);
        }
        if let Err(e) =
            self.link
                .expect_read(read.key, key, read.offset as usize, read.len as usize)
        {
            if let Some(vec) = self.link.reclaim(key) {
                *mem = UserMem::Plain(vec);
            }
            return Err(e.to_string());
        }
        self.link
            .queue_read_request(read.key, read.remote.addr, read.remote.rkey, read.len);
        Ok(())
    }

    /// Under a fresh random key, bound to this connection; addresses are offsets into the
    /// buffer.
    fn expose(
        &self,
        _: &mut LockedIfaces,
        _: UserBufId,
        mem: &mut UserMem,
        _: u64,
    ) -> Result<RemoteBuf, String> {
        self.exposures.lock().expose(self.id, mem)
    }

    /// The link hands the destination back once no READ into it is left.
    fn read_finished(&self, buf: UserBufId, mem: Option<&mut UserMem>) {
        if let (Some(vec), Some(mem)) = (self.link.reclaim(buf.0), mem) {
            *mem = UserMem::Plain(vec);
        }
    }

    fn give_back(&self, frame: RecvFrame, deferred: &mut Deferred) {
        match frame {
            RecvFrame::Owned(bytes) => self.link.recycle(bytes),
            #[allow(unreachable_patterns)]
            other => deferred.return_frame(other),
        }
    }

    fn reclaim_lent(&self) -> Vec<(UserBufId, Vec<u8>)> {
        self.link
            .reclaim_all()
            .into_iter()
            .map(|(key, vec)| (UserBufId(key), vec))
            .collect()
    }

    /// Nothing to queue: the socket is shut down once everything is written (see
    /// [`TransportLink::flush`]).
    fn close(&self) {}

    fn flush(&self, closing: bool) -> bool {
        match self.link.flush() {
            Ok(all_written) => {
                // A closing connection is shut down once everything is written.
                if all_written && closing {
                    self.link.shutdown();
                }
                false
            }
            Err(e) => {
                if !closing {
                    log::warn!("writing to {:?}: {e}", self.link.peer_addr());
                }
                true
            }
        }
    }

    fn wants_write(&self) -> bool {
        self.link.wants_write()
    }

    fn held_recv_bytes(&self) -> u64 {
        self.link.input_bytes() as u64
    }

    fn idle(&self) -> bool {
        !self.link.wants_write()
    }

    fn poll(&self, _: bool, scratch: &mut PollScratch, out: &mut Vec<LinkEvent>) -> usize {
        let PollScratch {
            tcp: events,
            tcp_rbuf: rbuf,
            ..
        } = scratch;
        events.clear();
        if let Err(e) = self.link.poll_with(events, rbuf) {
            events.push(Event::Closed {
                reason: e.to_string(),
            });
        }
        let mut answered = 0;
        for ev in events.drain(..) {
            match ev {
                Event::Frame(bytes) => out.push(LinkEvent::Frame {
                    conn: self.id,
                    len: bytes.len(),
                    frame: RecvFrame::Owned(bytes),
                }),
                Event::ReadRequest {
                    read_id,
                    addr,
                    rkey,
                    len,
                } => {
                    self.answer_read(read_id, (addr, rkey, len), out);
                    answered += 1;
                }
                Event::ReadDone { read_id, ok } => out.push(LinkEvent::ReadDone {
                    key: read_id,
                    piece: None,
                    ok,
                    refused: false,
                    value: 0,
                    posted: true,
                }),
                Event::Closed { reason } => out.push(LinkEvent::Down {
                    conn: self.id,
                    reason: format!("connection lost: {reason}"),
                    reads_lost: true,
                }),
            }
        }
        answered
    }
}
