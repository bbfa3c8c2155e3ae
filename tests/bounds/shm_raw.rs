//! A raw shared-memory peer: it speaks the setup by hand (an offer in its TCP handshake, its
//! own Unix socket the victim hands the segment over on) and then holds the connection's
//! rings, to write what it likes into the victim's and never read its own.

use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rdmx::proto::wire::Handshake;
use rdmx::proto::MAX_HANDSHAKE_LEN;
use rdmx::{Ep, Listener};
use rdmx_shm::channel::{self, Side};
use rdmx_shm::{fdpass, Consumer, Doorbell, HostIdentity, Producer, Segment, IDENTITY_LEN};

/// Kinds of the records in a ring (the transport's private numbering, as a peer sees it).
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

impl RawSocket {
    pub fn new() -> RawSocket {
        let dir = std::env::temp_dir().join(format!("rdmx-shm-raw-{:016x}", rand::random::<u64>()));
        std::fs::create_dir(&dir).expect("the raw peer's directory");
        let path = dir.join("s");
        let listener = UnixListener::bind(&path).expect("the raw peer's socket");
        let name = path.to_str().expect("a path").to_string();
        RawSocket {
            listener,
            dir,
            name,
        }
    }
}

impl Drop for RawSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A raw peer's end of a shared-memory connection with a victim, and the victim's endpoint.
pub struct RawShm {
    /// The victim's endpoint of the connection.
    pub ep: Ep,
    /// Writes into the victim's receive ring.
    pub tx: Producer,
    /// The ring the victim writes into (the raw peer never reads it).
    _rx: Consumer,
    _seg: Arc<Segment>,
    _tcp: rdmx_tcp::Link,
    _sock: UnixStream,
    _bell: Doorbell,
}

/// Connects to the victim's `listener` (accepted on a thread of its own, the victim's
/// progress being its accept) with the rdmx handshake `hs`, over shared memory.
pub fn connect(listener: &Listener, hs: &Handshake) -> RawShm {
    let addr = listener.local_addr().expect("bound").to_string();
    let unix = RawSocket::new();
    // (Leaked: the victim reads it by CMA during the setup.)
    let probe: &'static u64 = Box::leak(Box::new(0x5eed_u64));
    let mut private = hs.encode().to_vec();
    private.resize(MAX_HANDSHAKE_LEN, 0);
    private.extend_from_slice(&offer(rand::random(), probe, &unix.name));
    std::thread::scope(|scope| {
        let accepting = scope.spawn(|| listener.accept().expect("the victim accepts"));
        let tcp = rdmx_tcp::connect(&addr, &private, Duration::from_secs(10)).expect("tcp");
        let (sock, _) = unix.listener.accept().expect("the hand-over");
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
        let ep = accepting.join().expect("acceptor");
        assert_eq!(ep.transport(), rdmx::Transport::Shm);
        RawShm {
            ep,
            tx,
            _rx: rx,
            _seg: seg,
            _tcp: tcp,
            _sock: sock,
            _bell: bell,
        }
    })
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
