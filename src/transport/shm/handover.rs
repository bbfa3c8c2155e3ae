//! The Unix socket a connecting worker is handed its shared segments over on, and the
//! streams that arrive on it.
//!
//! The socket is a file in a directory of its own that only this process's user may enter
//! (mode 0700, under `$XDG_RUNTIME_DIR` or the temporary directory), not an abstract socket:
//! the kernel checks no permission on an abstract name, so any process of any user in the
//! network namespace could connect to one — filling its backlog, which the worker drains
//! only while one of its connects waits for a hand-over, so that the acceptor's own connect
//! found no room. A directory stops other users at `connect` (root aside, who can do
//! anything to the process anyway). A peer process of this user is trusted as far as the
//! shared-memory setup already trusts it (it could read the process's memory by CMA), and
//! bounded all the same. An acceptor that cannot see the path (another mount namespace, a
//! private `/tmp`) fails to connect and declines shared memory with the reason: the
//! connection stays TCP where TCP is allowed. A process killed leaves its directory behind
//! (in `$XDG_RUNTIME_DIR`, cleaned at logout, or the temporary directory).
//!
//! A stream is looked at only while a connect of the worker waits for its hand-over
//! ([`Expected::claim`]), and never waited on:
//!
//! * its peer must be of this user (`SO_PEERCRED`), or it is closed at once;
//! * its first 8 bytes are the token of the connect it is for: a stream under a token no
//!   connect of the worker waits for is closed at once, one under a connect's token is kept
//!   for it until claimed;
//! * a stream whose token has not arrived is looked at again on the next look, at most
//!   [`MAX_UNREAD`] of them (past that the oldest is closed), each closed at the connect
//!   timeout.
//!
//! When no connect of the worker is in flight, the worker holds no stream of this socket.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdmx_shm::fdpass;

use crate::error::{Error, Result};

/// Streams accepted whose token has not arrived, kept at most: a hand-over's token comes
/// with its connect, so a stream waits here only for the instant between them, or because
/// its peer sends nothing.
pub(crate) const MAX_UNREAD: usize = 32;
/// Streams one look accepts at most (the rest wait in the backlog for the next).
const ACCEPTS_PER_LOOK: usize = 64;
/// The longest path of a hand-over socket (`sun_path` less its NUL).
pub(crate) const MAX_PATH: usize = 107;
/// The socket's file in its directory.
const SOCKET_FILE: &str = "s";
/// How the directories of hand-over sockets are named: this, the pid, a random number.
pub(crate) const DIR_PREFIX: &str = "rdmx-shm-";

/// The socket, made on the first offer, and the streams taken from it.
pub(crate) struct HandOvers {
    /// This process's user: the only one whose streams are kept.
    uid: u32,
    socket: OnceLock<Socket>,
    held: Mutex<Held>,
    init: Mutex<()>,
}

/// The listening socket and where it is; its file and directory are removed with it.
struct Socket {
    listener: UnixListener,
    dir: PathBuf,
    path: String,
}

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The streams a worker holds between looks.
#[derive(Default)]
struct Held {
    /// Tokens of the worker's connects in flight: offered and neither claimed nor given up.
    expected: HashSet<u64>,
    /// Streams handed over under one of those tokens, one each, until claimed.
    arrived: HashMap<u64, UnixStream>,
    /// Streams whose token has not arrived yet, oldest first, each with its deadline.
    unread: VecDeque<(UnixStream, Instant)>,
}

/// What a stream's first bytes say.
enum Peeked {
    Token(u64),
    NotYet,
    Gone,
}

/// A connect of the worker waiting for its hand-over, under its token (given up when
/// dropped: its stream, if it came, is closed).
pub(crate) struct Expected<'a> {
    hand_overs: &'a HandOvers,
    token: u64,
    timeout: Duration,
}

impl HandOvers {
    pub(crate) fn new(uid: u32) -> HandOvers {
        HandOvers {
            uid,
            socket: OnceLock::new(),
            held: Mutex::new(Held::default()),
            init: Mutex::new(()),
        }
    }

    /// The socket's path, to offer: made if there is none.
    pub(crate) fn name(&self) -> Result<&str> {
        if let Some(s) = self.socket.get() {
            return Ok(&s.path);
        }
        let _guard = self.init.lock();
        if let Some(s) = self.socket.get() {
            return Ok(&s.path);
        }
        let socket = Socket::bind()?;
        Ok(&self.socket.get_or_init(|| socket).path)
    }

    /// A connect of the worker waits for a hand-over from now on, for `timeout` at most
    /// once it claims it: under a new token.
    pub(crate) fn expect(&self, timeout: Duration) -> Expected<'_> {
        let mut held = self.held.lock();
        let token = loop {
            let t = rand::random::<u64>();
            if held.expected.insert(t) {
                break t;
            }
        };
        Expected {
            hand_overs: self,
            token,
            timeout,
        }
    }

    /// Streams this worker holds (arrived and unread), for tests.
    #[cfg(test)]
    fn held(&self) -> usize {
        let held = self.held.lock();
        held.arrived.len() + held.unread.len()
    }

    /// Looks at the streams whose token had not arrived, then takes the new ones in (see the
    /// module docs); a stream whose token has not arrived is kept for `timeout`.
    fn look(&self, held: &mut Held, timeout: Duration) -> Result<()> {
        let Some(socket) = self.socket.get() else {
            return Err(Error::Invalid(
                "no shared-memory socket to be handed a segment on".into(),
            ));
        };
        let now = Instant::now();
        for _ in 0..held.unread.len() {
            let Some((stream, deadline)) = held.unread.pop_front() else {
                break;
            };
            match peek(&stream) {
                Peeked::Token(t) => held.arrived_under(t, stream),
                Peeked::NotYet if now < deadline => held.unread.push_back((stream, deadline)),
                Peeked::NotYet => {
                    log::debug!(
                        "a shared-memory hand-over without its token in {timeout:?}: closed"
                    )
                }
                Peeked::Gone => {}
            }
        }
        for _ in 0..ACCEPTS_PER_LOOK {
            let stream = match socket.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::ConnectionAborted | ErrorKind::Interrupted
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(Error::os("accepting a shared-memory hand-over", e)),
            };
            match fdpass::peer_credentials(&stream) {
                Ok((_, uid)) if uid == self.uid => {}
                Ok((pid, uid)) => {
                    log::warn!(
                        "process {pid} of user {uid} connected to the shared-memory socket of \
                         user {}: closed",
                        self.uid
                    );
                    continue;
                }
                Err(e) => {
                    log::debug!("a shared-memory hand-over's peer: {e}: closed");
                    continue;
                }
            }
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            match peek(&stream) {
                Peeked::Token(t) => held.arrived_under(t, stream),
                Peeked::NotYet => {
                    held.unread.push_back((stream, now + timeout));
                    if held.unread.len() > MAX_UNREAD {
                        held.unread.pop_front();
                        log::debug!(
                            "more than {MAX_UNREAD} shared-memory hand-overs without their \
                             token: the oldest closed"
                        );
                    }
                }
                Peeked::Gone => {}
            }
        }
        Ok(())
    }
}

impl Held {
    /// `stream` came under `token`: kept for the connect that waits for it, else closed.
    fn arrived_under(&mut self, token: u64, stream: UnixStream) {
        if self.expected.contains(&token) && !self.arrived.contains_key(&token) {
            self.arrived.insert(token, stream);
        } else {
            log::debug!("a shared-memory hand-over under a token no connect waits for: closed");
        }
    }
}

impl Expected<'_> {
    /// The token to offer.
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    /// The stream the peer handed the segment over on, waiting up to the timeout for it.
    /// Streams for the worker's other connects are kept for them.
    pub(crate) fn claim(self) -> Result<UnixStream> {
        let deadline = Instant::now() + self.timeout;
        loop {
            {
                let mut held = self.hand_overs.held.lock();
                self.hand_overs.look(&mut held, self.timeout)?;
                if let Some(s) = held.arrived.remove(&self.token) {
                    return Ok(s);
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout(
                    self.timeout,
                    "waiting for the peer to hand the shared segment over".into(),
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Drop for Expected<'_> {
    fn drop(&mut self) {
        let mut held = self.hand_overs.held.lock();
        held.expected.remove(&self.token);
        held.arrived.remove(&self.token);
        if held.expected.is_empty() {
            // No connect waits for a stream: none is kept.
            held.arrived.clear();
            held.unread.clear();
        }
    }
}

/// The token at the head of `stream`, without taking it (the hand-over that follows it is
/// read with its descriptors) and without waiting.
fn peek(stream: &UnixStream) -> Peeked {
    let mut t = [0u8; 8];
    let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
    match rustix::net::recv(stream, &mut t, flags) {
        Ok((8, _)) => Peeked::Token(u64::from_le_bytes(t)),
        Ok((0, _)) => Peeked::Gone,
        Ok(_) => Peeked::NotYet,
        Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::INTR => Peeked::NotYet,
        Err(_) => Peeked::Gone,
    }
}

impl Socket {
    /// A socket in a new directory of this user's only.
    fn bind() -> Result<Socket> {
        let base = base_dir();
        let mut tries = 0;
        let dir = loop {
            let dir = base.join(format!(
                "{DIR_PREFIX}{}-{:016x}",
                std::process::id(),
                rand::random::<u64>()
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => break dir,
                Err(e) if e.kind() == ErrorKind::AlreadyExists && tries < 8 => tries += 1,
                Err(e) => {
                    return Err(Error::os(
                        "making the shared-memory socket's directory",
                        std::io::Error::new(e.kind(), format!("{}: {e}", dir.display())),
                    ))
                }
            }
        };
        // (The umask may have taken bits away; never adds any: 0700 exactly.)
        let bound = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .and_then(|()| {
                let path = dir.join(SOCKET_FILE);
                let l = UnixListener::bind(&path).map_err(|e| {
                    // A file system that holds no sockets (9p, some network file systems)
                    // says ENXIO or EOPNOTSUPP here: say where, and what to change.
                    std::io::Error::new(
                        e.kind(),
                        format!(
                            "{}: {e} (set XDG_RUNTIME_DIR or TMPDIR to a local directory)",
                            path.display()
                        ),
                    )
                })?;
                l.set_nonblocking(true)?;
                Ok((l, path))
            });
        match bound {
            Ok((listener, path)) => Ok(Socket {
                listener,
                path: path.to_string_lossy().into_owned(),
                dir,
            }),
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                Err(Error::os("binding the shared-memory socket", e))
            }
        }
    }
}

/// Where the socket's directory goes: `$XDG_RUNTIME_DIR` (this user's, cleaned at logout)
/// or the temporary directory, whichever leaves a path that fits a socket address; `/tmp`
/// otherwise.
fn base_dir() -> PathBuf {
    // The directory's name and the socket's: the prefix, a pid, a dash, 16 digits, "/s".
    let room = MAX_PATH - (DIR_PREFIX.len() + 10 + 1 + 16 + 1 + SOCKET_FILE.len()) - 1;
    let fits = |p: &Path| p.is_absolute() && p.as_os_str().len() <= room && p.is_dir();
    std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| fits(p))
        .or_else(|| Some(std::env::temp_dir()).filter(|p| fits(p)))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

/// Whether `name` (from a peer's offer) names a hand-over socket: an absolute path without
/// `.` or `..` whose file is `s` in a directory named as [`Socket::bind`] names them.
pub(crate) fn is_socket_path(name: &str) -> bool {
    let path = Path::new(name);
    let mut parts = name.split('/').skip(1).collect::<Vec<_>>();
    let (Some(file), Some(dir)) = (parts.pop(), parts.pop()) else {
        return false;
    };
    name.len() <= MAX_PATH
        && path.is_absolute()
        && file == SOCKET_FILE
        && dir.starts_with(DIR_PREFIX)
        && !name.contains('\0')
        && parts
            .iter()
            .all(|p| !p.is_empty() && *p != "." && *p != "..")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn connect(h: &HandOvers) -> UnixStream {
        UnixStream::connect(h.name().unwrap()).expect("connect")
    }

    #[test]
    fn the_socket_is_in_a_private_directory_removed_with_it() {
        let h = HandOvers::new(rustix::process::getuid().as_raw());
        let name = h.name().unwrap().to_string();
        assert!(is_socket_path(&name), "{name}");
        let dir = Path::new(&name).parent().unwrap().to_path_buf();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
        drop(h);
        assert!(!dir.exists(), "{} left behind", dir.display());
    }

    #[test]
    fn streams_are_claimed_by_token_and_the_rest_closed() {
        let h = HandOvers::new(rustix::process::getuid().as_raw());
        let timeout = Duration::from_secs(5);
        let (mine, other) = (h.expect(timeout), h.expect(timeout));
        // Idle, garbage (a token nobody waits for), the other connect's, then mine.
        let idle: Vec<UnixStream> = (0..MAX_UNREAD + 8).map(|_| connect(&h)).collect();
        let mut garbage = connect(&h);
        garbage.write_all(&0x0bad_u64.to_le_bytes()).unwrap();
        let mut theirs = connect(&h);
        theirs.write_all(&other.token().to_le_bytes()).unwrap();
        let mut ours = connect(&h);
        ours.write_all(&mine.token().to_le_bytes()).unwrap();
        let token = mine.token();
        let got = mine.claim().expect("claimed");
        assert_eq!(peek(&got).token(), Some(token));
        // The other connect's stream, and the idle ones up to the bound, wait for it.
        assert_eq!(h.held(), 1 + MAX_UNREAD);
        let t = other.token();
        let got = other.claim().expect("theirs, kept for it");
        assert_eq!(peek(&got).token(), Some(t));
        // No connect in flight: nothing held, the idle streams still open.
        assert_eq!(h.held(), 0);
        drop(idle);
    }

    #[test]
    fn streams_without_a_token_close_at_their_deadline() {
        let h = HandOvers::new(rustix::process::getuid().as_raw());
        let waiting = h.expect(Duration::from_secs(60));
        let look = |timeout| {
            let mut held = h.held.lock();
            h.look(&mut held, timeout).unwrap();
            held.unread.len()
        };
        // Taken in by a look with a timeout of 50 ms: closed by a look past it.
        let _idle = connect(&h);
        assert_eq!(look(Duration::from_millis(50)), 1);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(look(Duration::from_secs(60)), 0, "closed at its deadline");
        // Taken in with 60 s: kept while a connect waits, through another's timing out.
        let _idle = connect(&h);
        assert_eq!(look(Duration::from_secs(60)), 1);
        let e = h.expect(Duration::from_millis(50)).claim().unwrap_err();
        assert!(matches!(e, Error::Timeout(..)), "{e}");
        assert_eq!(h.held(), 1);
        drop(waiting);
        assert_eq!(h.held(), 0, "no connect waits: nothing held");
    }

    #[test]
    fn streams_of_other_users_are_closed_at_once() {
        // This process connects to a worker that takes itself for another user.
        let h = HandOvers::new(rustix::process::getuid().as_raw() ^ 1);
        let mine = h.expect(Duration::from_millis(100));
        let mut s = connect(&h);
        s.write_all(&mine.token().to_le_bytes()).unwrap();
        assert!(matches!(mine.claim(), Err(Error::Timeout(..))));
        let mut b = [0u8; 1];
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // (Closed with our token unread in it: a reset.)
        match std::io::Read::read(&mut s, &mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
            other => panic!("the stream is still open: {other:?}"),
        }
        assert_eq!(h.held(), 0);
    }

    #[test]
    fn offered_names_must_be_hand_over_sockets() {
        for good in ["/tmp/rdmx-shm-1-00/s", "/run/user/1000/rdmx-shm-9-ab/s"] {
            assert!(is_socket_path(good), "{good}");
        }
        for bad in [
            "rdmx-shm-1-00/s",
            "/tmp/rdmx-shm-1-00/t",
            "/tmp/other/s",
            "/tmp/../rdmx-shm-1-00/s",
            "/tmp//rdmx-shm-1-00/s",
            "/s",
            "/var/run/docker.sock",
        ] {
            assert!(!is_socket_path(bad), "{bad}");
        }
        assert!(!is_socket_path(&format!(
            "/{}/rdmx-shm-1/s",
            "x".repeat(100)
        )));
    }

    impl Peeked {
        fn token(&self) -> Option<u64> {
            match self {
                Peeked::Token(t) => Some(*t),
                _ => None,
            }
        }
    }
}
