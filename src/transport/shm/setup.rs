//! Setting a shared-memory connection up inside a TCP connection's handshake.
//!
//! 1. The connector's HELLO carries its rdmx handshake (padded to
//!    [`MAX_HANDSHAKE_LEN`] bytes) and then an [`Offer`]: its [`HostIdentity`], a token, the
//!    address and value of a word the acceptor may read by CMA, and the path of its worker's
//!    hand-over socket, in a directory only its user may enter ([`super::handover`]).
//! 2. An acceptor that takes shared memory checks the identity, connects to that socket
//!    (without waiting: one that takes no connection now is a reason to decline), checks
//!    the kernel's word for who is there (pid and uid), reads the probe word by CMA,
//!    creates the connection's segment and hands it over with its worker's doorbell, under
//!    the token, with its own probe word ([`HandOver`]). Then it ACCEPTs over TCP with an
//!    [`Answer`], and waits for the connector's doorbell on the Unix socket.
//! 3. The connector takes the hand-over by its token, checks the peer the same way, maps the
//!    segment and sends its doorbell.
//!
//! An acceptor that cannot or will not use shared memory answers [`Answer::Declined`] with
//! its reason, and the connection stays TCP (if the connector allows TCP). Everything read
//! from the peer is validated; any failure is an error naming what was wrong.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

use rdmx_proto::MAX_HANDSHAKE_LEN;
use rdmx_shm::channel::{self, Side};
use rdmx_shm::{cma, fdpass, Consumer, Doorbell, HostIdentity, Producer, Segment, IDENTITY_LEN};

use super::handover::{self, Expected};
use super::iface::Shared;
use super::RING_CAPACITY;

const OFFER_MAGIC: &[u8; 4] = b"RXSO";
const ANSWER_MAGIC: &[u8; 4] = b"RXSA";
/// 2: the offer names a socket by its path (1 named an abstract socket).
const VERSION: u8 = 2;
/// The longest reason a declining answer carries.
const MAX_REASON: usize = 120;
/// The largest ring a peer may ask us to map.
const MAX_CAPACITY: u32 = 64 << 20;
const HAND_OVER_LEN: usize = 32;
const REPLY: &[u8; 4] = b"RXSD";

/// The connector's offer of shared memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Offer {
    pub(crate) identity: HostIdentity,
    pub(crate) token: u64,
    /// Address and value of the connector's probe word.
    pub(crate) probe: (u64, u64),
    /// The path of its worker's hand-over socket.
    pub(crate) name: String,
}

/// The acceptor's answer to an [`Offer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The segment was handed over, with rings of `capacity` bytes.
    Accepted { capacity: u32 },
    /// Not over shared memory, and why.
    Declined(String),
}

/// The rdmx handshake padded to its full room, then `ext`.
pub(crate) fn with_ext(handshake: &[u8], ext: &[u8]) -> Vec<u8> {
    let mut v = handshake.to_vec();
    v.resize(MAX_HANDSHAKE_LEN.max(handshake.len()), 0);
    v.extend_from_slice(ext);
    v
}

/// A handshake's rdmx part and what follows it.
pub(crate) fn split(private: &[u8]) -> (&[u8], &[u8]) {
    private.split_at(private.len().min(MAX_HANDSHAKE_LEN))
}

fn malformed(what: &str) -> String {
    format!("a malformed shared-memory {what}")
}

impl Offer {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(96 + self.name.len());
        b.extend_from_slice(OFFER_MAGIC);
        b.extend_from_slice(&[VERSION, 0, 0, 0]);
        b.extend_from_slice(&self.identity.encode());
        b.extend_from_slice(&self.token.to_le_bytes());
        b.extend_from_slice(&self.probe.0.to_le_bytes());
        b.extend_from_slice(&self.probe.1.to_le_bytes());
        b.push(self.name.len() as u8);
        b.extend_from_slice(self.name.as_bytes());
        b
    }

    /// The offer in `ext`, `Ok(None)` when there is none (a plain TCP connect).
    pub(crate) fn decode(ext: &[u8]) -> Result<Option<Offer>, String> {
        if ext.is_empty() || ext.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        let fixed = 8 + IDENTITY_LEN + 24 + 1;
        if ext.len() < fixed || &ext[..4] != OFFER_MAGIC || ext[5..8] != [0, 0, 0] {
            return Err(malformed("offer"));
        }
        if ext[4] != VERSION {
            return Err(format!(
                "a shared-memory offer of version {}; this build speaks {VERSION}",
                ext[4]
            ));
        }
        let identity =
            HostIdentity::decode(&ext[8..8 + IDENTITY_LEN]).map_err(|e| e.to_string())?;
        let at = 8 + IDENTITY_LEN;
        let word = |i: usize| u64::from_le_bytes(ext[i..i + 8].try_into().expect("8 bytes"));
        let name_len = ext[at + 24] as usize;
        let name = &ext[fixed..];
        if name.len() != name_len {
            return Err(malformed("offer (its socket name)"));
        }
        let name = std::str::from_utf8(name)
            .ok()
            .filter(|n| handover::is_socket_path(n))
            .ok_or_else(|| malformed("offer (its socket name)"))?;
        Ok(Some(Offer {
            identity,
            token: word(at),
            probe: (word(at + 8), word(at + 16)),
            name: name.to_string(),
        }))
    }
}

impl Answer {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = ANSWER_MAGIC.to_vec();
        match self {
            Answer::Accepted { capacity } => {
                b.extend_from_slice(&[VERSION, 1, 0, 0]);
                b.extend_from_slice(&capacity.to_le_bytes());
            }
            Answer::Declined(why) => {
                let why = &why.as_bytes()[..why.len().min(MAX_REASON)];
                b.extend_from_slice(&[VERSION, 2, 0, why.len() as u8]);
                b.extend_from_slice(why);
            }
        }
        b
    }

    /// The answer in `ext`, `Ok(None)` when there is none (a peer that did not look at the
    /// offer).
    pub(crate) fn decode(ext: &[u8]) -> Result<Option<Answer>, String> {
        if ext.is_empty() || ext.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        if ext.len() < 8 || &ext[..4] != ANSWER_MAGIC || ext[4] != VERSION || ext[6] != 0 {
            return Err(malformed("answer"));
        }
        match ext[5] {
            1 if ext.len() == 12 && ext[7] == 0 => Ok(Some(Answer::Accepted {
                capacity: u32::from_le_bytes(ext[8..12].try_into().expect("4 bytes")),
            })),
            2 if ext.len() == 8 + ext[7] as usize => Ok(Some(Answer::Declined(
                String::from_utf8_lossy(&ext[8..]).into_owned(),
            ))),
            _ => Err(malformed("answer")),
        }
    }
}

/// What the acceptor hands over on the Unix socket with the segment and its doorbell.
struct HandOver {
    token: u64,
    capacity: u32,
    probe: (u64, u64),
}

impl HandOver {
    fn encode(&self) -> [u8; HAND_OVER_LEN] {
        let mut b = [0u8; HAND_OVER_LEN];
        b[..8].copy_from_slice(&self.token.to_le_bytes());
        b[8..12].copy_from_slice(&self.capacity.to_le_bytes());
        b[16..24].copy_from_slice(&self.probe.0.to_le_bytes());
        b[24..32].copy_from_slice(&self.probe.1.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<HandOver, String> {
        if b.len() != HAND_OVER_LEN || b[12..16] != [0; 4] {
            return Err(malformed("hand-over"));
        }
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(HandOver {
            token: word(0),
            capacity: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            probe: (word(16), word(24)),
        })
    }
}

/// A connection's data path, set up.
pub(crate) struct DataPath {
    pub(crate) tx: Producer,
    pub(crate) rx: Consumer,
    pub(crate) peer_bell: Doorbell,
    pub(crate) sock: UnixStream,
    pub(crate) peer_pid: i32,
    /// `Ok`: this side reads the peer by CMA; `Err`: why not (READs go by copy).
    pub(crate) cma: Result<(), String>,
}

/// Whether this side may read the peer `pid` by CMA: `use_cma` (`RDMX_SHM_CMA`) and the
/// kernel allowing it (reading the peer's probe word `probe` gives its value).
fn cma_to(pid: i32, probe: (u64, u64), use_cma: bool) -> Result<(), String> {
    if !use_cma {
        return Err("RDMX_SHM_CMA=0".into());
    }
    cma::probe(pid, probe.0, probe.1).map_err(|e| {
        log::info!("cannot read process {pid} by CMA ({e}): rendezvous data is copied");
        format!("CMA refused: {e}")
    })
}

/// The peer of `sock` as the kernel saw it: its pid, checked to be visible and of our user.
fn peer_of(sock: &UnixStream, identity: &HostIdentity) -> Result<i32, String> {
    let (pid, uid) = fdpass::peer_credentials(sock).map_err(|e| e.to_string())?;
    if pid <= 0 || uid != identity.uid {
        return Err(format!(
            "the peer on the shared-memory socket is process {pid} of user {uid}, not one of \
             user {} in this pid namespace",
            identity.uid
        ));
    }
    Ok(pid)
}

/// The acceptor's side, before its TCP ACCEPT: checks the offer and hands the segment over.
/// An `Err` is the reason to decline.
pub(crate) struct Accepting {
    seg: Arc<Segment>,
    sock: UnixStream,
    peer_pid: i32,
    cma: Result<(), String>,
}

impl Accepting {
    pub(crate) fn start(
        shared: &Shared,
        offer: &Offer,
        timeout: Duration,
        use_cma: bool,
    ) -> Result<Accepting, String> {
        let diff = shared.identity.differences(&offer.identity);
        if !diff.is_empty() {
            return Err(format!("the peer runs on {}", diff.join(", ")));
        }
        let sock = connect_now(&offer.name, timeout)?;
        let peer_pid = peer_of(&sock, &shared.identity)?;
        let cma = cma_to(peer_pid, offer.probe, use_cma);
        let mut seg = channel::create("rdmx-shm", RING_CAPACITY).map_err(|e| e.to_string())?;
        let hand_over = HandOver {
            token: offer.token,
            capacity: RING_CAPACITY as u32,
            probe: shared.probe(),
        };
        let memfd = seg.fd().ok_or("the segment's memfd is closed")?;
        fdpass::send_with_fds(&sock, &hand_over.encode(), &[memfd, shared.bell_fd()])
            .map_err(|e| e.to_string())?;
        // Handed over: the mapping is all this side needs (no descriptor per connection).
        if let Some(seg) = Arc::get_mut(&mut seg) {
            seg.close_fd();
        }
        Ok(Accepting {
            seg,
            sock,
            peer_pid,
            cma,
        })
    }

    /// Bytes of each ring of the segment handed over.
    pub(crate) fn capacity(&self) -> u32 {
        RING_CAPACITY as u32
    }

    /// The hand-over socket: readable once the connector's doorbell (or its hang-up) came.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Whether the connector answered (its doorbell, or a hang-up, is there to read): then
    /// [`Accepting::finish`] does not wait.
    pub(crate) fn answered(&self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags};
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        poll(&mut [PollFd::new(&self.sock, PollFlags::IN)], Some(&zero)).is_ok_and(|n| n > 0)
    }

    /// After the TCP ACCEPT: the connector's doorbell, and the data path. The doorbell is
    /// waited for up to the connect timeout (the socket's read timeout, set in
    /// [`Accepting::start`]), not at all once [`Accepting::answered`] said it came: a
    /// listener keeps the accepts waiting for it among others (see `crate::listener`), so
    /// that only an application accepting one chosen request waits on its one peer (a
    /// process of this user on this host: `start` checked the socket's peer).
    pub(crate) fn finish(self) -> Result<DataPath, String> {
        let mut buf = [0u8; 8];
        let (n, mut fds) = fdpass::recv_with_fds(&self.sock, &mut buf)
            .map_err(|e| format!("waiting for the peer's doorbell: {e}"))?;
        if &buf[..n] != REPLY || fds.len() != 1 {
            return Err(format!(
                "the peer answered the hand-over with {n} bytes and {} descriptors",
                fds.len()
            ));
        }
        let peer_bell = Doorbell::from_fd(fds.pop().expect("one")).map_err(|e| e.to_string())?;
        let (tx, rx) =
            channel::ends(&self.seg, RING_CAPACITY, Side::Creator).map_err(|e| e.to_string())?;
        Ok(DataPath {
            tx,
            rx,
            peer_bell,
            sock: self.sock,
            peer_pid: self.peer_pid,
            cma: self.cma,
        })
    }
}

/// Connects to the hand-over socket at `path` without waiting: a socket whose backlog is
/// full (a peer that named a socket nobody accepts on) is an error at once, where a
/// blocking connect would wait for room for as long as that socket's owner likes, holding
/// up the acceptor. (A stream connect on a Unix socket never completes later: it is made,
/// or refused with `EAGAIN`.) The stream returned is blocking, each read and write bounded
/// by `timeout`.
fn connect_now(path: &str, timeout: Duration) -> Result<UnixStream, String> {
    let what = |e: rustix::io::Errno| match e {
        rustix::io::Errno::AGAIN => format!(
            "the peer's shared-memory socket {path} takes no connection now (its backlog is full)"
        ),
        e => format!("connecting to the peer's shared-memory socket {path}: {e}"),
    };
    let addr = SocketAddrUnix::new(path).map_err(what)?;
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
    .map_err(what)?;
    rustix::net::connect(&fd, &addr).map_err(what)?;
    let sock = UnixStream::from(fd);
    sock.set_nonblocking(false)
        .and_then(|()| sock.set_read_timeout(Some(timeout)))
        .and_then(|()| sock.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    Ok(sock)
}

/// The connector's side, after an ACCEPT that took the offer: takes the hand-over made
/// under `expected`'s token, checks it, and sends the worker's doorbell; waits at most
/// `timeout` for each step.
pub(crate) fn connected(
    shared: &Shared,
    expected: Expected<'_>,
    capacity: u32,
    timeout: Duration,
    use_cma: bool,
) -> Result<DataPath, String> {
    let token = expected.token();
    let sock = expected.claim().map_err(|e| e.to_string())?;
    sock.set_nonblocking(false)
        .and_then(|()| sock.set_read_timeout(Some(timeout)))
        .and_then(|()| sock.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    let peer_pid = peer_of(&sock, &shared.identity)?;
    let mut buf = [0u8; HAND_OVER_LEN + 1];
    let (n, fds) = fdpass::recv_with_fds(&sock, &mut buf).map_err(|e| e.to_string())?;
    let hand_over = HandOver::decode(&buf[..n])?;
    let [seg, bell]: [OwnedFd; 2] = fds.try_into().map_err(|f: Vec<OwnedFd>| {
        format!("the hand-over came with {} descriptors, not 2", f.len())
    })?;
    if hand_over.token != token || hand_over.capacity != capacity || capacity > MAX_CAPACITY {
        return Err(format!(
            "the hand-over names token {:#x} and rings of {} bytes; the answer said {capacity}",
            hand_over.token, hand_over.capacity
        ));
    }
    let cma = cma_to(peer_pid, hand_over.probe, use_cma);
    let mut seg =
        Segment::open(seg, channel::channel_len(capacity as usize)).map_err(|e| e.to_string())?;
    // Mapped: the mapping is all this side needs (no descriptor per connection).
    seg.close_fd();
    let seg = Arc::new(seg);
    let peer_bell = Doorbell::from_fd(bell).map_err(|e| e.to_string())?;
    let (tx, rx) =
        channel::ends(&seg, capacity as usize, Side::Opener).map_err(|e| e.to_string())?;
    fdpass::send_with_fds(&sock, REPLY, &[shared.bell_fd()]).map_err(|e| e.to_string())?;
    Ok(DataPath {
        tx,
        rx,
        peer_bell,
        sock,
        peer_pid,
        cma,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer() -> Offer {
        Offer {
            identity: HostIdentity::this().expect("identity"),
            token: 0x1122_3344_5566_7788,
            probe: (0x7fff_0000_1000, 42),
            name: "/tmp/rdmx-shm-1234-00000000deadbeef/s".into(),
        }
    }

    #[test]
    fn offers_and_answers_survive_encoding() {
        let o = offer();
        assert_eq!(Offer::decode(&o.encode()), Ok(Some(o.clone())));
        assert_eq!(Offer::decode(&[]), Ok(None));
        assert_eq!(Offer::decode(&[0; 40]), Ok(None));
        for a in [
            Answer::Accepted { capacity: 1 << 18 },
            Answer::Declined("another user".into()),
        ] {
            assert_eq!(Answer::decode(&a.encode()), Ok(Some(a.clone())));
        }
        // A handshake with an offer fits TCP's private data.
        assert!(with_ext(&[1; 14], &o.encode()).len() <= rdmx_tcp::MAX_PRIVATE_DATA);
        let private = with_ext(&[1; 14], &o.encode());
        let (hs, ext) = split(&private);
        assert_eq!(hs.len(), MAX_HANDSHAKE_LEN);
        assert_eq!(Offer::decode(ext), Ok(Some(o)));
    }

    #[test]
    fn connecting_to_a_socket_with_a_full_backlog_fails_at_once() {
        let dir = std::env::temp_dir().join(format!("rdmx-shm-t-{:016x}", rand::random::<u64>()));
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("s").to_str().unwrap().to_string();
        // A listener that never accepts, with room for one connection waiting.
        let l = rustix::net::socket(AddressFamily::UNIX, SocketType::STREAM, None).unwrap();
        rustix::net::bind(&l, &SocketAddrUnix::new(path.as_str()).unwrap()).unwrap();
        rustix::net::listen(&l, 0).unwrap();
        let _first = connect_now(&path, Duration::from_secs(10)).expect("room for one");
        let (done, gave_up) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || done.send(connect_now(&p, Duration::from_secs(10))));
        // (A hang guard: a blocking connect waits for as long as nobody accepts.)
        let second = gave_up.recv_timeout(Duration::from_secs(30));
        std::fs::remove_dir_all(&dir).unwrap();
        let e = second.expect("the connect gave up").expect_err("no room");
        assert!(e.contains("backlog is full"), "{e}");
    }

    #[test]
    fn malformed_offers_and_answers_are_refused() {
        let good = offer().encode();
        for i in [0, 4, 5, 8] {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            assert!(Offer::decode(&bad).is_err(), "byte {i}");
        }
        assert!(Offer::decode(&good[..good.len() - 1]).is_err());
        let mut long = good.clone();
        long.push(b'x');
        assert!(Offer::decode(&long).is_err());
        for name in [
            "/tmp/socket",
            "rdmx-shm-1234-00000000deadbeef",
            "/tmp/rdmx-shm-1/../s",
        ] {
            let mut other_name = offer();
            other_name.name = name.into();
            assert!(Offer::decode(&other_name.encode()).is_err(), "{name}");
        }
        let mut old = good.clone();
        old[4] = 1;
        assert_eq!(
            Offer::decode(&old),
            Err("a shared-memory offer of version 1; this build speaks 2".into())
        );
        assert!(Answer::decode(b"RXSA\x01\x01\x00\x00\x00").is_err());
        assert!(Answer::decode(b"RXSA\x01\x02\x00\x05abc").is_err());
        assert!(Answer::decode(b"XXXX\x01\x01\x00\x00\x00\x00\x00\x00").is_err());
        assert!(HandOver::decode(&[0; 31]).is_err());
        let mut h = [0u8; 32];
        h[12] = 1;
        assert!(HandOver::decode(&h).is_err());
    }
}
