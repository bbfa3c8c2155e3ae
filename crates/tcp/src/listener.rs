//! The listening side: connections taken from the listening socket wait in a bounded table
//! of pending handshakes, each with a deadline, until their HELLO has arrived.
//!
//! No connection can hold the listener up. Every connection taken is nonblocking and read
//! only when epoll says it has input, so a thousand idle ones cost nothing per call; one
//! whose HELLO is not complete by its deadline is closed; a malformed one is closed at once;
//! and when the table is full (or the process is out of descriptors) the oldest pending one
//! is closed to make room. A connector that fails its handshake never reaches the caller:
//! it is logged and dropped, and [`Listener::get_request`] goes on to the next.
//!
//! Out of descriptors with no pending handshake to close (or out of kernel memory), the
//! listener backs off as libuv, Go and nginx do: the listening socket, which stays
//! readable while connections wait in its backlog, is out of the epoll set for a delay
//! that grows from 1 ms to 100 ms, then tried again; the connections wait in the backlog
//! meanwhile and are taken once a descriptor is free. Nothing spins, and the listener is
//! never failed.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustix::event::epoll;
use rustix::io::Errno;
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};

use crate::handshake::{check_body, check_header, ConnectionRequest};
use crate::wire::{self, HANDSHAKE_PREFIX, HEADER_LEN};
use crate::{Error, Result, MAX_PRIVATE_DATA};

/// The epoll token of the listening socket.
const LISTENING: u64 = u64::MAX;
/// The epoll token of the deadline timer.
const TIMER: u64 = u64::MAX - 1;
/// Connections taken from the listening socket per readiness report, so that a flood of
/// connections does not starve the handshakes already pending.
const ACCEPT_BATCH: usize = 64;
/// Readiness reports handled per `epoll_wait`.
const WAIT_BATCH: usize = 64;
/// The longest HELLO: header, magic and version, private data.
const MAX_HELLO: usize = HEADER_LEN + HANDSHAKE_PREFIX + MAX_PRIVATE_DATA;
/// What a failed handshake is reported as.
const READ_HELLO: &str = "read HELLO";
/// The first back-off of the listening socket when `accept` runs out of descriptors (or
/// memory) with no pending handshake to close; each failed retry doubles it.
const MIN_BACKOFF: Duration = Duration::from_millis(1);
/// The longest back-off: a descriptor freed is noticed within this.
const MAX_BACKOFF: Duration = Duration::from_millis(100);

/// A listening TCP socket on which peers [`connect`](crate::connect), with the connections
/// whose HELLO is still arriving (see [`Listener::get_request`]).
pub struct Listener {
    socket: TcpListener,
    local: Option<SocketAddr>,
    /// Watches the listening socket, every pending connection and `timer`.
    poll: OwnedFd,
    /// Readable once the earliest pending deadline has passed.
    timer: OwnedFd,
    handshake_timeout: Duration,
    max_pending: usize,
    table: Mutex<Table>,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("local_addr", &self.local)
            .field("pending_handshakes", &self.pending_handshakes())
            .finish_non_exhaustive()
    }
}

/// The pending handshakes, by the order they were taken in (their epoll token).
#[derive(Default)]
struct Table {
    pending: BTreeMap<u64, Pending>,
    next_id: u64,
    /// The deadline the timer is armed for.
    armed: Option<Instant>,
    /// The listening socket's back-off while `accept` finds no descriptor (or memory).
    backoff: Option<Backoff>,
}

/// An episode of `accept` failing for want of descriptors or memory (see the module docs).
struct Backoff {
    /// What `accept` said last.
    errno: Errno,
    /// When the episode began.
    since: Instant,
    /// The current delay (doubled at each failed retry, up to [`MAX_BACKOFF`]).
    delay: Duration,
    /// When the listening socket is watched and tried again; `None` while it is watched
    /// again (the retry is under way).
    until: Option<Instant>,
}

/// A connection taken from the listening socket whose HELLO has not all arrived.
struct Pending {
    stream: TcpStream,
    peer: Option<SocketAddr>,
    deadline: Instant,
    buf: [u8; MAX_HELLO],
    got: usize,
    /// The HELLO's body length, once its header has arrived.
    body: Option<usize>,
}

/// What reading a pending connection came to.
enum Step {
    /// Nothing more to read for now.
    Waiting,
    /// Its HELLO arrived: the private data.
    Hello(Vec<u8>),
    /// It failed its handshake.
    Failed(Error),
}

impl Pending {
    /// Reads what has arrived of the HELLO, exactly its bytes and nothing more.
    fn read(&mut self) -> Step {
        loop {
            let want = HEADER_LEN + self.body.unwrap_or(0);
            match (&self.stream).read(&mut self.buf[self.got..want]) {
                Ok(0) => {
                    return Step::Failed(Error::io(
                        READ_HELLO,
                        self.peer,
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the peer closed the connection during the handshake",
                        ),
                    ))
                }
                Ok(n) => self.got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Waiting,
                Err(e) => return Step::Failed(Error::io(READ_HELLO, self.peer, e)),
            }
            if self.got < want {
                continue;
            }
            match self.body {
                None => {
                    let mut hdr = [0u8; HEADER_LEN];
                    hdr.copy_from_slice(&self.buf[..HEADER_LEN]);
                    match check_header(READ_HELLO, self.peer, &hdr) {
                        Ok((wire::KIND_HELLO, len)) => self.body = Some(len),
                        Ok((kind, _)) => {
                            return Step::Failed(Error::protocol(
                                READ_HELLO,
                                self.peer,
                                format!("expected HELLO, got {}", wire::kind_name(kind)),
                            ))
                        }
                        Err(e) => return Step::Failed(e),
                    }
                }
                Some(_) => {
                    let body = self.buf[HEADER_LEN..want].to_vec();
                    return match check_body(READ_HELLO, self.peer, body) {
                        Ok(data) => Step::Hello(data),
                        Err(e) => Step::Failed(e),
                    };
                }
            }
        }
    }
}

impl Listener {
    /// How long a connection taken has for its HELLO to arrive, unless
    /// [`Listener::set_handshake_timeout`] says otherwise: 10 s.
    pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

    /// How many connections may wait for their HELLO at once, unless
    /// [`Listener::set_max_pending`] says otherwise: 4096 (each holds a descriptor and
    /// under 1 KiB).
    pub const DEFAULT_MAX_PENDING: usize = 4096;

    /// Binds `addr` (`"host:port"`; port 0 picks a free port, see [`Listener::local_addr`])
    /// and listens, with std's default socket options, the
    /// [`DEFAULT_HANDSHAKE_TIMEOUT`](Listener::DEFAULT_HANDSHAKE_TIMEOUT) and the
    /// [`DEFAULT_MAX_PENDING`](Listener::DEFAULT_MAX_PENDING).
    ///
    /// # Errors
    ///
    /// Binding failed (the address is in use or not this host's), or creating the listener's
    /// epoll set or timer did.
    pub fn bind(addr: &str) -> Result<Listener> {
        let socket =
            TcpListener::bind(addr).map_err(|e| Error::io(format!("bind {addr}"), None, e))?;
        socket
            .set_nonblocking(true)
            .map_err(|e| Error::io(format!("set {addr} nonblocking"), None, e))?;
        // std listens with a backlog of 128; the kernel's limit (`net.core.somaxconn`,
        // 4096 by default) lets a burst of connectors wait in the kernel instead of having
        // their SYNs dropped and retried a second later.
        rustix::net::listen(&socket, i32::MAX)
            .map_err(|e| Error::io(format!("listen at {addr}"), None, e.into()))?;
        let local = socket.local_addr().ok();
        let os = |call: &'static str| move |e: Errno| Error::io(call, local, e.into());
        let poll = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(os("epoll_create1"))?;
        let timer = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )
        .map_err(os("timerfd_create"))?;
        for (fd, token) in [(socket.as_fd(), LISTENING), (timer.as_fd(), TIMER)] {
            epoll::add(
                &poll,
                fd,
                epoll::EventData::new_u64(token),
                epoll::EventFlags::IN,
            )
            .map_err(os("epoll_ctl"))?;
        }
        Ok(Listener {
            socket,
            local,
            poll,
            timer,
            handshake_timeout: Self::DEFAULT_HANDSHAKE_TIMEOUT,
            max_pending: Self::DEFAULT_MAX_PENDING,
            table: Mutex::default(),
        })
    }

    /// Sets how long each connection taken from now on has for its HELLO to arrive, counted
    /// from when it is taken; one that is not complete by then is closed.
    pub fn set_handshake_timeout(&mut self, timeout: Duration) {
        self.handshake_timeout = timeout;
    }

    /// Sets how many connections may wait for their HELLO at once (at least 1). A
    /// connection taken is read at once; if its HELLO is not complete and the table is
    /// past the bound, the oldest pending one is closed (a descriptor more for that
    /// moment). A peer that holds many connections open without sending a HELLO then only
    /// delays its own, and a client whose HELLO follows its connect (as
    /// [`connect`](crate::connect)'s does) is read as soon as it is taken.
    pub fn set_max_pending(&mut self, max: usize) {
        self.max_pending = max.max(1);
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    /// How many connections are waiting for their HELLO.
    pub fn pending_handshakes(&self) -> usize {
        self.table.lock().pending.len()
    }

    /// A descriptor that polls readable when [`Listener::get_request`] has something to do:
    /// a connection waits to be taken, a pending connection sent something (or closed), or
    /// a pending deadline passed. It is an epoll set: poll it level-triggered, and call
    /// `get_request(Some(Duration::ZERO))` when it is readable.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.poll.as_fd()
    }

    /// The next connection whose HELLO has arrived.
    ///
    /// Takes the connections waiting on the listening socket (nonblocking; each gets the
    /// [handshake timeout](Listener::set_handshake_timeout) for its HELLO to arrive), reads
    /// what has arrived on the pending ones, closes those past their deadline, and returns
    /// the first complete and valid HELLO as a [`ConnectionRequest`] to
    /// [`accept`](ConnectionRequest::accept) or [`reject`](ConnectionRequest::reject).
    /// Waits up to `timeout` (`None`: until a HELLO arrives; `Some(Duration::ZERO)`: only
    /// looks) and returns `Ok(None)` when none did. The wait sleeps in `epoll_wait`; no
    /// one connection can make it longer: pending connections are never waited on
    /// one at a time.
    ///
    /// A connector that fails its handshake — it closes, sends something other than a valid
    /// HELLO, or its deadline passes — is closed and logged (`log`, info level; a close before
    /// any byte at debug level) and never reported: the call goes on to the next.
    /// [`Listener::set_max_pending`] bounds how many wait at once.
    ///
    /// Several threads may call this at once; each request is returned to one of them.
    ///
    /// Out of descriptors (`EMFILE`, `ENFILE`) with no pending handshake to close for room,
    /// or out of kernel memory (`ENOBUFS`, `ENOMEM`), the listener backs off (logged once
    /// per episode, at warning level, with the error naming the limit): it stops watching
    /// the listening socket for a delay growing from 1 ms to 100 ms, then tries again,
    /// while the connections wait in the kernel's backlog, so neither this call nor a
    /// poller of [`Listener::fd`] spins; the first one is taken as soon as a descriptor is
    /// free. A call whose `timeout` passes during such an episode returns that error
    /// rather than `Ok(None)`, so that its caller learns why no request came (the listener
    /// is not failed: call again); with `None` the call goes on waiting.
    ///
    /// # Errors
    ///
    /// Only conditions of the listener itself: `epoll_wait` failing; `accept` failing for
    /// a reason other than the connection taken; and, as above, the process out of
    /// descriptors or memory when `timeout` passes ([`Error::is_out_of_resources`]). The
    /// listener stays usable.
    pub fn get_request(&self, timeout: Option<Duration>) -> Result<Option<ConnectionRequest>> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut events = [const { MaybeUninit::<epoll::Event>::uninit() }; WAIT_BATCH];
        // The first look does not sleep: what waits already is handled before any wait.
        let mut wait = Some(Duration::ZERO);
        loop {
            let ready = match epoll::wait(&self.poll, &mut events, timespec(wait).as_ref()) {
                Ok((ready, _)) => &*ready,
                Err(Errno::INTR) => &[],
                Err(e) => return Err(Error::io("epoll_wait", self.local, e.into())),
            };
            {
                let mut table = self.table.lock();
                let mut found = self.handle(&mut table, ready);
                if matches!(found, Ok(None)) {
                    found = self.retry_accept(&mut table);
                }
                self.expire(&mut table);
                if let Some(found) = found? {
                    return Ok(Some(found));
                }
            }
            // (A timeout too large to add to now is no limit.)
            wait = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return self.backing_off().map_or(Ok(None), Err),
                },
            };
        }
    }

    /// Handles what one `epoll_wait` reported, up to the first complete HELLO.
    fn handle(&self, t: &mut Table, ready: &[epoll::Event]) -> Result<Option<ConnectionRequest>> {
        for event in ready {
            let found = match event.data.u64() {
                TIMER => {
                    // (Expiry follows the handling; the timer is armed again then.)
                    let _ = rustix::io::read(&self.timer, &mut [0u8; 8]);
                    t.armed = None;
                    None
                }
                // (A report from before a back-off began waits for its end.)
                LISTENING if t.backoff.as_ref().is_some_and(|b| b.until.is_some()) => None,
                LISTENING => self.take_waiting(t)?,
                id => self.advance(t, id),
            };
            if found.is_some() {
                // What else was reported stays readable (level-triggered) for the next call.
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// Takes up to [`ACCEPT_BATCH`] connections from the listening socket into the table,
    /// reading each at once (a connector's HELLO usually came with its connect).
    fn take_waiting(&self, t: &mut Table) -> Result<Option<ConnectionRequest>> {
        for _ in 0..ACCEPT_BATCH {
            let (stream, peer) = match self.socket.accept() {
                Ok(taken) => {
                    self.end_backoff(t);
                    taken
                }
                Err(e) => match Errno::from_io_error(&e) {
                    Some(Errno::AGAIN) => {
                        self.end_backoff(t);
                        return Ok(None);
                    }
                    // Out of descriptors: the oldest pending handshake makes room.
                    Some(Errno::MFILE | Errno::NFILE)
                        if self.drop_oldest(t, "the process is out of file descriptors") =>
                    {
                        continue
                    }
                    Some(errno @ (Errno::MFILE | Errno::NFILE | Errno::NOBUFS | Errno::NOMEM)) => {
                        self.back_off(t, errno);
                        return Ok(None);
                    }
                    None => return Err(Error::io("accept", self.local, e)),
                    // A connection aborted before it was taken, an interrupted call, or an
                    // error of that connection's network (accept(2) says to retry those).
                    Some(_) => {
                        log::debug!("listener {:?}: accept: {e}", self.local);
                        continue;
                    }
                },
            };
            let peer = Some(peer);
            if let Err(e) = self.watch(&stream, t.next_id) {
                log::info!("dropping the connection from {peer:?}: {e}");
                continue;
            }
            let id = t.next_id;
            t.next_id += 1;
            let deadline = Instant::now()
                .checked_add(self.handshake_timeout)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(1 << 32));
            t.pending.insert(
                id,
                Pending {
                    stream,
                    peer,
                    deadline,
                    buf: [0; MAX_HELLO],
                    got: 0,
                    body: None,
                },
            );
            if let Some(found) = self.advance(t, id) {
                return Ok(Some(found));
            }
            // Still pending (not complete nor failed): past the bound, the oldest goes.
            if t.pending.len() > self.max_pending {
                let why = format!("the listener holds {} pending handshakes", self.max_pending);
                self.drop_oldest(t, &why);
            }
        }
        Ok(None)
    }

    /// Makes a connection taken nonblocking and watches it for input under `id`.
    fn watch(&self, stream: &TcpStream, id: u64) -> Result<()> {
        let peer = stream.peer_addr().ok();
        let setup = |e| Error::io("configure accepted socket", peer, e);
        stream.set_nonblocking(true).map_err(setup)?;
        stream.set_nodelay(true).map_err(setup)?;
        epoll::add(
            &self.poll,
            stream,
            epoll::EventData::new_u64(id),
            epoll::EventFlags::IN,
        )
        .map_err(|e| setup(e.into()))
    }

    /// Reads what has arrived on pending connection `id`: its request once the HELLO is
    /// complete; a connection that failed is closed.
    fn advance(&self, t: &mut Table, id: u64) -> Option<ConnectionRequest> {
        // (A report for a connection closed since it was made finds nothing.)
        let step = t.pending.get_mut(&id)?.read();
        match step {
            Step::Waiting => None,
            Step::Hello(data) => {
                let p = self.forget(t, id)?;
                Some(ConnectionRequest::new(p.stream, p.peer, data))
            }
            Step::Failed(e) => {
                let p = self.forget(t, id);
                match p {
                    Some(p) if p.got == 0 => {
                        log::debug!("dropping the connection from {:?}: {e}", p.peer)
                    }
                    _ => log::info!("dropping a connection that failed its handshake: {e}"),
                }
                None
            }
        }
    }

    /// `accept` found no descriptor (or memory): stops watching the listening socket for
    /// the episode's next delay (the first: [`MIN_BACKOFF`], logged; then doubled, up to
    /// [`MAX_BACKOFF`]). The timer is armed for its end by [`Listener::expire`].
    fn back_off(&self, t: &mut Table, errno: Errno) {
        let now = Instant::now();
        let (since, delay) = match &t.backoff {
            Some(b) => (b.since, (b.delay * 2).min(MAX_BACKOFF)),
            None => {
                let e = self.accept_error(errno);
                log::warn!(
                    "listener {:?}: {e}; backing off (up to {MAX_BACKOFF:?} between tries) \
                     until a connection can be taken: connections wait in the backlog",
                    self.local
                );
                (now, MIN_BACKOFF)
            }
        };
        let watched = t.backoff.as_ref().map_or(true, |b| b.until.is_none());
        if watched {
            if let Err(e) = epoll::delete(&self.poll, &self.socket) {
                log::debug!("listener {:?}: epoll_ctl(DEL): {e}", self.local);
            }
        }
        t.backoff = Some(Backoff {
            errno,
            since,
            delay,
            until: Some(now + delay),
        });
    }

    /// At the end of a back-off's delay: watches the listening socket again and tries to
    /// take what waits there (a failure backs off longer).
    fn retry_accept(&self, t: &mut Table) -> Result<Option<ConnectionRequest>> {
        let Some(b) = t.backoff.as_mut() else {
            return Ok(None);
        };
        if b.until.map_or(true, |until| until > Instant::now()) {
            return Ok(None);
        }
        b.until = None;
        let errno = b.errno;
        if let Err(e) = epoll::add(
            &self.poll,
            &self.socket,
            epoll::EventData::new_u64(LISTENING),
            epoll::EventFlags::IN,
        ) {
            log::debug!("listener {:?}: epoll_ctl(ADD): {e}", self.local);
            self.back_off(t, errno);
            return Ok(None);
        }
        self.take_waiting(t)
    }

    /// `accept` took a connection, or found none waiting: a back-off episode is over.
    fn end_backoff(&self, t: &mut Table) {
        if let Some(b) = t.backoff.take() {
            log::info!(
                "listener {:?}: accepting again after {:?} out of descriptors or memory",
                self.local,
                b.since.elapsed()
            );
        }
    }

    /// The error of the back-off episode under way, if there is one.
    fn backing_off(&self) -> Option<Error> {
        let t = self.table.lock();
        t.backoff.as_ref().map(|b| self.accept_error(b.errno))
    }

    /// What `accept` failing with `errno` means for this listener.
    fn accept_error(&self, errno: Errno) -> Error {
        Error::io(
            "accept (no pending handshake to close for room: the connections wait in the \
             listening socket's backlog)",
            self.local,
            errno.into(),
        )
    }

    /// Closes the handshakes whose deadline has passed and arms the timer for the next
    /// deadline or the end of a back-off, whichever comes first.
    fn expire(&self, t: &mut Table) {
        let now = Instant::now();
        while let Some(entry) = t.pending.first_entry() {
            if entry.get().deadline > now {
                break;
            }
            let p = entry.remove();
            self.unwatch(&p.stream);
            log::info!(
                "dropping the connection from {:?}: its HELLO did not arrive within {:?} \
                 ({} bytes came)",
                p.peer,
                self.handshake_timeout,
                p.got
            );
        }
        let retry = t.backoff.as_ref().and_then(|b| b.until);
        let next = match (t.pending.first_key_value().map(|(_, p)| p.deadline), retry) {
            (Some(d), Some(r)) => Some(d.min(r)),
            (d, r) => d.or(r),
        };
        if next != t.armed {
            // A zero value disarms the timer: a deadline due now is armed a nanosecond on.
            let value = match next {
                None => Duration::ZERO,
                Some(d) => d
                    .saturating_duration_since(now)
                    .max(Duration::from_nanos(1)),
            };
            let spec = Itimerspec {
                it_interval: Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                },
                it_value: timespec(Some(value)).expect("a value"),
            };
            match timerfd_settime(&self.timer, TimerfdTimerFlags::empty(), &spec) {
                Ok(_) => t.armed = next,
                // (Unarmed, the next call's expiry catches up; a poller of `fd` waits for
                // the next connection or input instead.)
                Err(e) => log::warn!("listener {:?}: timerfd_settime: {e}", self.local),
            }
        }
    }

    /// Closes the oldest pending handshake, if there is one, saying why.
    fn drop_oldest(&self, t: &mut Table, why: &str) -> bool {
        let Some((_, p)) = t.pending.pop_first() else {
            return false;
        };
        self.unwatch(&p.stream);
        log::info!(
            "dropping the connection from {:?} ({} bytes of its HELLO came): {why}",
            p.peer,
            p.got
        );
        true
    }

    /// Removes pending connection `id` from the table and the epoll set.
    fn forget(&self, t: &mut Table, id: u64) -> Option<Pending> {
        let p = t.pending.remove(&id)?;
        self.unwatch(&p.stream);
        Some(p)
    }

    fn unwatch(&self, stream: &TcpStream) {
        if let Err(e) = epoll::delete(&self.poll, stream) {
            log::debug!("listener {:?}: epoll_ctl(DEL): {e}", self.local);
        }
    }
}

/// `d` as a timespec (saturating).
fn timespec(d: Option<Duration>) -> Option<Timespec> {
    d.map(|d| Timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: d.subsec_nanos().into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the docs say a pending connection costs besides its descriptor: under 1 KiB.
    /// Its entry (key and value) sits in a B-tree node of 11 entries, each node but the
    /// root at least 5 full.
    #[test]
    fn a_pending_handshake_costs_under_1_kib() {
        let entry = std::mem::size_of::<(u64, Pending)>();
        let node = 11 * entry + 16;
        assert!(node / 5 < 1024, "{entry} bytes an entry");
    }
}
