//! A TCP connection of a worker: `rdmx-tcp`'s link, and what the worker asks of it
//! ([`TransportLink`]). READ requests from the peer are answered here, from the exposure
//! table, as the link's input is read.
//!
//! The link's output queue has a limit (see [`super::output_limit`]): once what the peer
//! asked for and has not read takes it past the limit, the link's input pauses, and what
//! it had read but not yet delivered — READ requests not answered, frames the worker gave
//! back ([`TransportLink::hold_input`]) — waits here, in order, until the peer has read
//! enough. At most one poll's worth: a paused link reads nothing more.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rdmx_proto::{ConnId, RemoteBuf, UserBufId};
use rdmx_tcp::Event;

use super::{Answer, Exposures};
use crate::readiness::Interest;
use crate::transport::{
    Deferred, InputFlags, LinkEvent, LockedIfaces, PollScratch, Queued, ReadOp, RecvFrame,
    Transport, TransportLink, Watch,
};
use crate::usermem::UserMem;

/// A TCP connection of a worker.
pub(crate) struct TcpLink {
    id: ConnId,
    link: rdmx_tcp::Link,
    /// The worker's exposure table (shared by its TCP links).
    exposures: Arc<Mutex<Exposures>>,
    /// Input read but not delivered, held while the link's input was paused: reported by
    /// the next polls, before anything new is read.
    held: Mutex<VecDeque<Held>>,
    /// Whether `held` has anything (read without its lock, also by the worker: see
    /// [`TransportLink::input_flags`]).
    holding: Arc<AtomicBool>,
}

/// Input a paused link holds back.
enum Held {
    /// As the link read it (a READ request is answered when it is reported).
    Read(Event),
    /// As the link reported it, given back by the worker.
    Reported(LinkEvent),
}

impl TcpLink {
    pub(super) fn new(id: ConnId, link: rdmx_tcp::Link, exposures: Arc<Mutex<Exposures>>) -> Self {
        TcpLink {
            id,
            link,
            exposures,
            held: Mutex::new(VecDeque::new()),
            holding: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Turns one event the link read into what the worker gets (appended to `out`), or
    /// answers it here (a READ request: returns true).
    #[inline]
    fn take(&self, ev: Event, out: &mut Vec<LinkEvent>) -> bool {
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
                return true;
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
        false
    }

    /// Reports what the link held back while its input was paused, in order (READ requests
    /// answered as they come), until it pauses again; returns how many READ requests it
    /// answered, and whether everything held was reported.
    #[cold]
    #[inline(never)]
    fn take_held(&self, out: &mut Vec<LinkEvent>) -> (usize, bool) {
        let mut held = self.held.lock();
        let mut answered = 0;
        while !self.link.input_paused() {
            match held.pop_front() {
                Some(Held::Reported(ev)) => out.push(ev),
                Some(Held::Read(ev)) => answered += usize::from(self.take(ev, out)),
                None => {
                    self.holding.store(false, Ordering::SeqCst);
                    return (answered, true);
                }
            }
        }
        (answered, false)
    }

    /// [`TransportLink::watch`] of a link whose input is paused or holds events back, were
    /// it watched for `interest` otherwise.
    #[cold]
    #[inline(never)]
    fn watch_paused(&self, interest: Interest) -> Watch {
        if self.link.input_paused() {
            return Watch {
                interest: Interest::Write,
                held_ready: false,
            };
        }
        Watch {
            interest,
            held_ready: self.holding.load(Ordering::SeqCst),
        }
    }

    /// The link's input paused as a READ request was answered: the rest of what its poll
    /// read (`rest`) waits, in order.
    #[cold]
    #[inline(never)]
    fn hold_read(&self, rest: impl Iterator<Item = Event>) {
        let mut held = self.held.lock();
        held.extend(rest.map(Held::Read));
        if !held.is_empty() {
            self.holding.store(true, Ordering::SeqCst);
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

    /// Write interest alone while the input is paused (the socket stays readable with the
    /// peer's input the link does not read).
    fn watch(&self) -> Watch {
        let interest = if self.link.wants_write() {
            Interest::ReadWrite
        } else {
            Interest::Read
        };
        if !(self.link.input_paused() || self.holding.load(Ordering::SeqCst)) {
            return Watch {
                interest,
                held_ready: false,
            };
        }
        self.watch_paused(interest)
    }

    fn input_paused(&self) -> bool {
        self.link.input_paused()
    }

    fn input_flags(&self) -> Option<InputFlags> {
        Some(InputFlags {
            paused: self.link.input_paused_flag(),
            holding: self.holding.clone(),
        })
    }

    fn hold_input(&self, events: Vec<LinkEvent>) {
        let mut held = self.held.lock();
        for ev in events.into_iter().rev() {
            held.push_front(Held::Reported(ev));
        }
        if !held.is_empty() {
            self.holding.store(true, Ordering::SeqCst);
        }
    }

    fn queued_bytes(&self) -> u64 {
        self.link.queued_bytes() as u64
    }

    /// What the link holds for its input, and the frames it held back while paused.
    fn held_recv_bytes(&self) -> u64 {
        let held: usize = self
            .held
            .lock()
            .iter()
            .map(|h| match h {
                Held::Read(Event::Frame(bytes)) => bytes.capacity(),
                Held::Reported(LinkEvent::Frame { frame, .. }) => frame.len(),
                _ => 0,
            } + std::mem::size_of::<Held>())
            .sum();
        (self.link.input_bytes() + held) as u64
    }

    fn idle(&self) -> bool {
        !self.link.wants_write()
    }

    /// What the link held back while its input was paused comes first (and nothing new is
    /// read until all of it is reported); a READ request whose answer pauses the input
    /// leaves the rest of what was read held.
    fn poll(&self, _: bool, scratch: &mut PollScratch, out: &mut Vec<LinkEvent>) -> usize {
        if self.holding.load(Ordering::Acquire) {
            let (answered, all) = self.take_held(out);
            if !all {
                return answered;
            }
        }
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
        let mut read = events.drain(..);
        while let Some(ev) = read.next() {
            if self.take(ev, out) {
                answered += 1;
                if self.link.input_paused() {
                    self.hold_read(read);
                    break;
                }
            }
        }
        answered
    }
}
