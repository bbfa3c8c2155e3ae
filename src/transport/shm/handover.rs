//! The Unix socket a connecting worker is handed its shared segments over on, and the
//! streams that arrive on it.
//!
//! The socket is a file in a directory of its own that only this process's user may enter
//! (mode 0700, under `$XDG_RUNTIME_DIR`, else the temporary directory or `/dev/shm`), not an abstract socket:
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
    /// A socket in a new directory of this user's only, in the first of [`base_dirs`]
    /// that holds one (`$XDG_RUNTIME_DIR`'s among them).
    fn bind() -> Result<Socket> {
        Socket::bind_first(base_dirs(std::env::var_os("XDG_RUNTIME_DIR")))
    }

    /// A socket in a new directory of this user's only, under the first of `bases` that
    /// holds one.
    fn bind_first(bases: Vec<PathBuf>) -> Result<Socket> {
        let mut failed = Vec::new();
        for base in bases {
            match Socket::bind_in(&base) {
                Ok(socket) => return Ok(socket),
                Err(e) => failed.push(e),
            }
        }
        let said = failed
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; ");
        let kind = failed.first().map_or(ErrorKind::NotFound, |e| e.kind());
        Err(Error::os(
            "binding the shared-memory socket",
            std::io::Error::new(
                kind,
                format!(
                    "{said} (no directory held a socket: set XDG_RUNTIME_DIR or TMPDIR to a \
                     local one)"
                ),
            ),
        ))
    }

    /// A socket in a new directory of this user's only, under `base`.
    fn bind_in(base: &Path) -> std::io::Result<Socket> {
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
                    return Err(std::io::Error::new(
                        e.kind(),
                        format!("making {}: {e}", dir.display()),
                    ))
                }
            }
        };
        // (The umask may have taken bits away; never adds any: 0700 exactly.)
        let path = dir.join(SOCKET_FILE);
        let bound = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .and_then(|()| {
                let l = UnixListener::bind(&path)?;
                l.set_nonblocking(true)?;
                Ok(l)
            });
        match bound {
            Ok(listener) => Ok(Socket {
                listener,
                path: path.to_string_lossy().into_owned(),
                dir,
            }),
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                // A file system that holds no sockets (9p, some network file systems) says
                // ENXIO or EOPNOTSUPP here.
                Err(std::io::Error::new(
                    e.kind(),
                    format!("binding {}: {e}", path.display()),
                ))
            }
        }
    }
}

/// Where the socket's directory may go, in order: `$XDG_RUNTIME_DIR` if it is this user's
/// (as the XDG specification has it: a process run as another user may inherit the
/// variable), the temporary directory (`$TMPDIR`, else `/tmp`), and `/dev/shm` (tmpfs,
/// which holds sockets where `/tmp` may be a network or 9p file system that does not);
/// each only if it is a directory whose path leaves room for a socket's address.
fn base_dirs(runtime: Option<std::ffi::OsString>) -> Vec<PathBuf> {
    // The directory's name and the socket's: the prefix, a pid, a dash, 16 digits, "/s".
    let room = MAX_PATH - (DIR_PREFIX.len() + 10 + 1 + 16 + 1 + SOCKET_FILE.len()) - 1;
    let fits = |p: &Path| p.is_absolute() && p.as_os_str().len() <= room && p.is_dir();
    let mine = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).is_ok_and(|m| m.uid() == rustix::process::geteuid().as_raw())
    };
    let runtime = runtime.map(PathBuf::from).filter(|p| mine(p));
    let mut dirs: Vec<PathBuf> = Vec::new();
    let others = [
        std::env::temp_dir(),
        PathBuf::from("/tmp"),
        PathBuf::from("/dev/shm"),
    ];
    for dir in runtime.into_iter().chain(others) {
        if fits(&dir) && !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    if dirs.is_empty() {
        dirs.push(PathBuf::from("/tmp"));
    }
    dirs
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

    /// `$XDG_RUNTIME_DIR` is taken only if it is this user's (a process run as another
    /// user, e.g. by `sudo -u`, may inherit it), and `/dev/shm` is always among the places
    /// tried: the guests' `/tmp` is 9p, which holds no sockets.
    #[test]
    fn the_runtime_directory_is_taken_only_if_it_is_this_user_s() {
        let mine = std::env::temp_dir().join(format!("rdmx-rt-{:016x}", rand::random::<u64>()));
        std::fs::create_dir(&mine).unwrap();
        let dirs = base_dirs(Some(mine.clone().into_os_string()));
        assert_eq!(dirs.first(), Some(&mine));
        assert!(dirs.contains(&PathBuf::from("/dev/shm")), "{dirs:?}");
        assert!(!base_dirs(Some("/no/such/dir".into())).contains(&"/no/such/dir".into()));
        // Another user's: `/` is root's; as root, a directory given to nobody.
        let theirs = match rustix::process::geteuid().is_root() {
            false => PathBuf::from("/"),
            true => {
                let d = mine.join("nobody");
                std::fs::create_dir(&d).unwrap();
                std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
                d
            }
        };
        let dirs = base_dirs(Some(theirs.clone().into_os_string()));
        assert!(!dirs.contains(&theirs), "{dirs:?}");
        std::fs::remove_dir_all(&mine).unwrap();
    }

    /// A place that cannot hold the socket is passed over for the next; where none can,
    /// the error names each failure.
    #[test]
    fn a_directory_that_holds_no_socket_is_passed_over() {
        let file = std::env::temp_dir().join(format!("rdmx-nodir-{:016x}", rand::random::<u64>()));
        std::fs::write(&file, b"").unwrap();
        let socket = Socket::bind_first(vec![file.clone(), std::env::temp_dir()]).unwrap();
        assert!(socket
            .path
            .starts_with(&*std::env::temp_dir().to_string_lossy()));
        let e = Socket::bind_first(vec![file.clone()])
            .err()
            .expect("no place")
            .to_string();
        assert!(
            e.contains(&*file.to_string_lossy()) && e.contains("TMPDIR"),
            "{e}"
        );
        std::fs::remove_file(&file).unwrap();
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
