//! A raw shared-memory peer: it speaks the setup by hand (an offer in its TCP handshake, its
//! own Unix socket the victim hands the segment over on) and then holds the connection's
//! rings, to write what it likes into the victim's, and to read its own only when it
//! likes ([`RawWire::poll`]).

use std::collections::VecDeque;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdmx::proto::wire::Handshake;
use rdmx::proto::MAX_HANDSHAKE_LEN;
use rdmx::{Ep, Listener};
use rdmx_shm::channel::{self, Side};
use rdmx_shm::{fdpass, Consumer, Doorbell, HostIdentity, Producer, Segment, IDENTITY_LEN};

use crate::{accept_one, RawWire, LONG};

/// A ring record holding an rdmx frame (the transport's private numbering of kinds, as a
/// peer sees it).
pub const KIND_FRAME: u8 = 0;
/// A ring record holding a GET of rendezvous data copied through the rings.
pub const KIND_GET: u8 = 1;

const OFFER_MAGIC: &[u8; 4] = b"RXSO";
const OFFER_VERSION: u8 = 2;

/// The bytes of an offer of shared memory under `token`, naming the socket `name`, with the
/// probe word at `probe`.
pub fn offer(token: u64, probe: &u64, name: &str) -> Vec<u8> {
    let mut b = OFFER_MAGIC.to_vec();
    b.extend_from_slice(&[OFFER_VERSION, 0, 0, 0]);
    b.extend_from_slice(&HostIdentity::this().expect("identity").encode());
    b.extend_from_slice(&token.to_le_bytes());
    b.extend_from_slice(&(probe as *const u64 as u64).to_le_bytes());
    b.extend_from_slice(&probe.to_le_bytes());
    b.push(name.len() as u8);
    b.extend_from_slice(name.as_bytes());
    b
}

/// The name of the hand-over socket a connector's TCP handshake (`private`) offers.
pub fn offered_socket(private: &[u8]) -> String {
    let ext = &private[MAX_HANDSHAKE_LEN..];
    assert_eq!(&ext[..4], OFFER_MAGIC, "an offer of shared memory");
    let at = 8 + IDENTITY_LEN + 24;
    let len = ext[at] as usize;
    String::from_utf8(ext[at + 1..at + 1 + len].to_vec()).expect("a name")
}

/// The hand-over socket of a raw peer: in a directory of its own, named as rdmx names them
/// (removed when dropped).
pub struct RawSocket {
    pub listener: UnixListener,
    dir: PathBuf,
    pub name: String,
}

/// What a victim handed over on a raw peer's socket, and the doorbell the peer answered
/// with.
pub struct HandedOver {
    sock: UnixStream,
    seg: Arc<Segment>,
    tx: Producer,
    rx: Consumer,
    bell: Doorbell,
}

impl RawSocket {
    pub fn new() -> RawSocket {
        let dir = std::env::temp_dir().join(format!("rdmx-shm-raw-{:016x}", rand::random::<u64>()));
        std::fs::create_dir(&dir).expect("the raw peer's directory");
        let path = dir.join("s");
        let listener = UnixListener::bind(&path).expect("the raw peer's socket");
        listener
            .set_nonblocking(true)
            .expect("a nonblocking socket");
        let name = path.to_str().expect("a path").to_string();
        RawSocket {
            listener,
            dir,
            name,
        }
    }

    /// The victim's connection, waited for at most [`LONG`].
    fn accept(&self) -> UnixStream {
        let deadline = Instant::now() + LONG;
        loop {
            match self.listener.accept() {
                Ok((sock, _)) => {
                    sock.set_nonblocking(false).expect("a blocking stream");
                    return sock;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline, "the victim never handed over");
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("the hand-over: {e}"),
            }
        }
    }

    /// Takes the segment the victim hands over (each step waited for at most [`LONG`]),
    /// maps its rings, and answers with a doorbell of its own: the victim's accept then
    /// completes.
    pub fn take_hand_over(&self) -> HandedOver {
        let sock = self.accept();
        sock.set_read_timeout(Some(LONG)).expect("a read timeout");
        let mut buf = [0u8; 64];
        let (n, mut fds) = fdpass::recv_with_fds(&sock, &mut buf).expect("the segment");
        assert_eq!(
            (n, fds.len()),
            (32, 2),
            "a hand-over with a segment and a doorbell"
        );
        let capacity = u32::from_le_bytes(buf[8..12].try_into().unwrap()) as usize;
        let _victims_bell = fds.pop();
        let seg = Arc::new(
            Segment::open(fds.pop().expect("segment"), channel::channel_len(capacity))
                .expect("map"),
        );
        let (tx, rx) = channel::ends(&seg, capacity, Side::Opener).expect("rings");
        let bell = Doorbell::new().expect("doorbell");
        fdpass::send_with_fds(&sock, b"RXSD", &[bell.fd().as_fd()]).expect("reply");
        HandedOver {
            sock,
            seg,
            tx,
            rx,
            bell,
        }
    }
}

impl Drop for RawSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The private data of a TCP HELLO with the rdmx handshake `hs` offering shared memory, and
/// the raw peer's hand-over socket it names (the victim connects to it while it accepts:
/// keep it until then).
pub fn offering(hs: &Handshake) -> (Vec<u8>, RawSocket) {
    let unix = RawSocket::new();
    (hello_offering(hs, &unix.name), unix)
}

/// The private data of a TCP HELLO with the rdmx handshake `hs` offering shared memory over
/// the socket `name` (under a random token).
pub fn hello_offering(hs: &Handshake, name: &str) -> Vec<u8> {
    // (Leaked: the victim reads it by CMA during the setup.)
    let probe: &'static u64 = Box::leak(Box::new(0x5eed_u64));
    let mut private = hs.encode().to_vec();
    private.resize(MAX_HANDSHAKE_LEN, 0);
    private.extend_from_slice(&offer(rand::random(), probe, name));
    private
}

/// A connection to the socket `name` (a path, or an abstract name) made without waiting: a
/// full backlog is an error (`WouldBlock`), not a wait.
pub fn connect_now(name: &str) -> std::io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?;
    let addr = if name.starts_with('/') {
        SocketAddrUnix::new(name)?
    } else {
        SocketAddrUnix::new_abstract_name(name.as_bytes())?
    };
    rustix::net::connect(&fd, &addr)?;
    Ok(fd)
}

/// A raw peer's end of a shared-memory connection with a victim, and the victim's endpoint.
pub struct RawShm {
    /// The victim's endpoint of the connection.
    pub ep: Ep,
    /// Writes into the victim's receive ring.
    pub tx: Producer,
    /// The ring the victim writes into (read by [`RawWire::poll`] only).
    rx: Consumer,
    /// Frames [`RawWire::send`] queued while the victim's ring was full.
    waiting: VecDeque<Vec<u8>>,
    /// The victim's TCP ACCEPT (its rdmx handshake, then its answer to the offer).
    tcp: rdmx_tcp::Link,
    /// The hand-over stream: its hang-up says the victim closed the connection.
    sock: UnixStream,
    _seg: Arc<Segment>,
    _bell: Doorbell,
}

/// Connects to the victim's `listener` (accepted on a thread of its own, the victim's
/// progress being its accept) with the rdmx handshake `hs`, over shared memory.
pub fn connect(listener: &Listener, hs: &Handshake) -> RawShm {
    let addr = listener.local_addr().expect("bound").to_string();
    let (private, unix) = offering(hs);
    std::thread::scope(|scope| {
        let accepting = scope.spawn(|| accept_one(listener));
        let tcp = rdmx_tcp::connect(&addr, &private, Duration::from_secs(10)).expect("tcp");
        let HandedOver {
            sock,
            seg,
            tx,
            rx,
            bell,
        } = unix.take_hand_over();
        sock.set_nonblocking(true).expect("a nonblocking stream");
        let ep = accepting.join().expect("acceptor");
        assert_eq!(ep.transport(), rdmx::Transport::Shm);
        RawShm {
            ep,
            tx,
            rx,
            waiting: VecDeque::new(),
            tcp,
            sock,
            _seg: seg,
            _bell: bell,
        }
    })
}

impl RawWire for RawShm {
    fn victim(&self) -> Handshake {
        let private = self.tcp.peer_private_data();
        Handshake::decode(&private[..MAX_HANDSHAKE_LEN.min(private.len())])
            .expect("the victim's handshake")
    }

    fn send(&mut self, frame: &[u8]) {
        self.waiting.push_back(frame.to_vec());
    }

    fn poll(&mut self, frames: &mut Vec<Vec<u8>>) -> bool {
        while let Some(f) = self.waiting.front() {
            match self.tx.push_kind(KIND_FRAME, &[f]) {
                Ok(true) => {
                    self.waiting.pop_front();
                }
                Ok(false) => break,
                Err(_) => return false,
            }
        }
        let mut record = Vec::new();
        loop {
            match self.rx.pop_kind(&mut record) {
                Ok(Some(KIND_FRAME)) => frames.push(std::mem::take(&mut record)),
                Ok(Some(kind)) => panic!("the victim wrote a record of kind {kind}"),
                Ok(None) => break,
                Err(_) => return false,
            }
        }
        // (The victim shuts the stream down when it closes the connection.)
        !matches!((&self.sock).read(&mut [0u8; 8]), Ok(0))
    }
}

/// A GET record: `len` bytes at `addr` of the buffer exposed under `rkey`, for the READ the
/// asker calls `key`.
pub fn get_record(key: u64, rkey: u32, addr: u64, len: u64) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[0..8].copy_from_slice(&key.to_le_bytes());
    b[8..12].copy_from_slice(&rkey.to_le_bytes());
    b[16..24].copy_from_slice(&addr.to_le_bytes());
    b[24..32].copy_from_slice(&len.to_le_bytes());
    b
}
