//! Two-sided tests for rdmx's test suites: a test with a server side and a client side is
//! written once, as one function of the [`Peer`] it is, and run two ways:
//!
//! - [`Sides::Threads`]: both sides in one process, a thread each (the host's suites, and the
//!   one Soft-RoCE guest, where rxe takes its loopback path);
//! - [`Sides::Nodes`]: this process is one side and the other runs on the other node of
//!   `scripts/softroce-twonode` (node A the server, node B the client), so everything between
//!   the sides crosses a wire from one kernel to the other.
//!
//! The sides meet only at [`Peer::barrier`]s and through the server's listening address
//! ([`Peer::listening`], [`Peer::server_addr`]); whatever else passes between them passes
//! through the transport under test. It knows nothing of rdmx: each suite binds its own
//! endpoints on top (`tests/api`, `crates/conn/tests/device`).

use std::cell::Cell;
use std::fmt::Display;
use std::process::Command;
use std::sync::{Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Which half of a two-sided test a process or thread plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Listens and accepts.
    Server,
    /// Connects.
    Client,
}

/// Where the two sides of a test run.
#[derive(Clone, Debug)]
pub enum Sides {
    /// Both in this process, a thread each.
    Threads,
    /// This process is one side; the other runs on the other node, met through the runner's
    /// `twonode barrier`.
    Nodes {
        /// This node's side.
        me: Side,
        /// The server node's address.
        server_ip: String,
    },
}

impl Sides {
    /// A side per node, from the environment `scripts/softroce-twonode` gives each node
    /// (node A is the server).
    ///
    /// # Panics
    /// When not run by it.
    pub fn from_twonode_env() -> Sides {
        let env = |name: &str| {
            std::env::var(name).unwrap_or_else(|_| {
                panic!("{name} is not set: run these tests through scripts/softroce-twonode (scripts/test does)")
            })
        };
        if env("RDMX_NODE") == "A" {
            Sides::Nodes {
                me: Side::Server,
                server_ip: env("RDMX_NODE_ADDR"),
            }
        } else {
            Sides::Nodes {
                me: Side::Client,
                server_ip: env("RDMX_PEER_ADDR"),
            }
        }
    }
}

/// One side of a running two-sided test.
pub struct Peer<'a> {
    side: Side,
    test: &'static str,
    meet: Meet<'a>,
    /// The bound of every wait for the other side.
    bound: Duration,
    /// Barriers and listeners of this side so far (both sides count alike).
    barriers: Cell<u32>,
    listeners: Cell<u16>,
}

enum Meet<'a> {
    Threads(&'a Shared),
    Nodes {
        server_ip: String,
        /// The runner's helper command.
        helper: String,
    },
}

/// What the two threads of a test share: the server's listening addresses, barrier counts,
/// and whether a side failed (so that the other stops waiting for it).
#[derive(Default)]
struct Shared {
    state: Mutex<SharedState>,
    changed: Condvar,
}

#[derive(Default)]
struct SharedState {
    addrs: Vec<String>,
    arrived: [u32; 2],
    failed: bool,
}

impl Shared {
    /// Waits until `ready` holds, failing if the other side failed or after `bound`.
    fn wait_until(&self, what: &str, bound: Duration, mut ready: impl FnMut(&SharedState) -> bool) {
        let deadline = Instant::now() + bound;
        let mut st = self.state.lock().unwrap();
        while !ready(&st) {
            assert!(!st.failed, "{what}: the other side failed");
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{what}: the other side did not come within {bound:?}"
            );
            st = self.changed.wait_timeout(st, left).unwrap().0;
        }
    }

    fn update(&self, f: impl FnOnce(&mut SharedState)) {
        f(&mut self.state.lock().unwrap());
        self.changed.notify_all();
    }
}

/// Runs the two-sided test `test` where `sides` says: `body` once per side. Every wait for
/// the other side fails after `bound`.
pub fn two_sided(test: &'static str, sides: Sides, bound: Duration, body: impl Fn(&Peer) + Sync) {
    match sides {
        Sides::Nodes { me, server_ip } => {
            let meet = Meet::Nodes {
                server_ip,
                helper: HELPER.into(),
            };
            on_node(&Peer::new(me, test, meet, bound), body)
        }
        Sides::Threads => {
            let shared = Shared::default();
            let run = |side: Side| {
                let peer = Peer::new(side, test, Meet::Threads(&shared), bound);
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&peer)));
                if r.is_err() {
                    shared.update(|st| st.failed = true);
                }
                r
            };
            let (server, client) = thread::scope(|s| {
                let client = thread::Builder::new()
                    .name(format!("{test}: client"))
                    .spawn_scoped(s, || run(Side::Client))
                    .expect("the client's thread");
                (run(Side::Server), client.join().expect("client thread"))
            });
            if let Err(panic) = server.and(client) {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

/// Runs this node's side of a test across nodes.
fn on_node(peer: &Peer, body: impl Fn(&Peer)) {
    // Both nodes start the test together: a node whose last test failed early waits here for
    // the other to finish that one, instead of failing this one while waiting for it.
    let start = format!("{}-start", peer.test);
    peer.meet_node(&start, START_BOUND, &format!("{}: start", peer.test));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(peer)));
    if let Err(panic) = r {
        // The other node's barriers stop waiting for this one.
        peer.twonode(&["signal", &peer.failed_signal(0)]);
        std::panic::resume_unwind(panic);
    }
}

impl<'a> Peer<'a> {
    fn new(side: Side, test: &'static str, meet: Meet<'a>, bound: Duration) -> Peer<'a> {
        Peer {
            side,
            test,
            meet,
            bound,
            barriers: 0.into(),
            listeners: 0.into(),
        }
    }

    /// Whether this side is the server.
    pub fn is_server(&self) -> bool {
        self.side == Side::Server
    }

    /// The test's name.
    pub fn test(&self) -> &'static str {
        self.test
    }

    /// Waits until the other side reached its barrier of the same number.
    pub fn barrier(&self) {
        let n = self.barriers.get() + 1;
        self.barriers.set(n);
        let what = format!("{}: barrier {n}", self.test);
        match &self.meet {
            Meet::Threads(shared) => {
                let me = self.side as usize;
                shared.update(|st| st.arrived[me] = n);
                shared.wait_until(&what, self.bound, |st| st.arrived[1 - me] >= n);
            }
            Meet::Nodes { .. } => {
                self.meet_node(&format!("{}-{n}", self.test), self.bound, &what);
            }
        }
    }

    /// The address the server's next listener binds (server side only): `local_ip` and a
    /// port the system picks in one process; across nodes the server node's address and a
    /// port of this test's own, which the client's next [`Peer::server_addr`] names. Once
    /// bound, the server says where with [`Peer::listening`].
    pub fn listen_addr(&self, local_ip: &str) -> String {
        assert!(self.is_server(), "only the server listens");
        let k = self.next_listener();
        match &self.meet {
            Meet::Threads(_) => format!("{local_ip}:0"),
            Meet::Nodes { server_ip, .. } => format!("{server_ip}:{}", self.port(k)),
        }
    }

    /// The server's listener of the last [`Peer::listen_addr`] is bound at `addr`.
    pub fn listening(&self, addr: impl Display) {
        if let Meet::Threads(shared) = &self.meet {
            let addr = addr.to_string();
            shared.update(|st| st.addrs.push(addr));
        }
    }

    /// The address of the server's next listener (client side only).
    pub fn server_addr(&self) -> String {
        assert!(!self.is_server(), "the client connects");
        let k = self.next_listener();
        match &self.meet {
            Meet::Threads(shared) => {
                let what = format!("{}: listener {k}", self.test);
                shared.wait_until(&what, self.bound, |st| st.addrs.len() > usize::from(k));
                shared.state.lock().unwrap().addrs[usize::from(k)].clone()
            }
            Meet::Nodes { server_ip, .. } => format!("{server_ip}:{}", self.port(k)),
        }
    }

    /// Retries `connect` within the bound while it fails (across nodes nothing tells the
    /// client when the server listens), returning its first success.
    pub fn retry<T, E: Display>(&self, what: &str, connect: impl FnMut() -> Result<T, E>) -> T {
        retry(what, self.bound, connect)
    }

    /// The signal a node raises when its side of the test failed: this side's (`0`) or the
    /// other's (`1`).
    fn failed_signal(&self, whose: usize) -> String {
        let side = match (self.side, whose) {
            (Side::Server, 0) | (Side::Client, 1) => "server",
            _ => "client",
        };
        format!("{}-failed-{side}", self.test)
    }

    /// Waits at the runner's barrier `name` for the other node, at most `bound`; fails as
    /// `what` at once when the other node's side failed first.
    fn meet_node(&self, name: &str, bound: Duration, what: &str) {
        let secs = bound.as_secs().max(1).to_string();
        match self.twonode(&["barrier", name, &secs, &self.failed_signal(1)]) {
            Some(0) => {}
            Some(ABORTED) => panic!("{what}: the other node failed"),
            _ => panic!("{what}: the other node did not come within {bound:?}"),
        }
    }

    /// Runs the runner's helper (across nodes only): its exit status.
    fn twonode(&self, args: &[&str]) -> Option<i32> {
        let Meet::Nodes { helper, .. } = &self.meet else {
            unreachable!("one process has no other node");
        };
        Command::new(helper)
            .args(args)
            .status()
            .unwrap_or_else(|e| {
                panic!("the helper {helper} (on PATH under scripts/softroce-twonode): {e}")
            })
            .code()
    }

    fn next_listener(&self) -> u16 {
        let k = self.listeners.get();
        self.listeners.set(k + 1);
        k
    }

    /// The port of this test's listener `k` across nodes: its own for every test and
    /// listener (a client retrying to connect must never reach another test's listener).
    fn port(&self, k: u16) -> u16 {
        let hash = self.test.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        20_000 + (hash % 4_000) as u16 * 8 + k
    }
}

/// How long a node waits for the other to start a test: the other may still be in its last
/// test until nextest's slow-timeout ends it (`.config/nextest.toml`: 120 s x 5).
const START_BOUND: Duration = Duration::from_secs(660);

/// The runner's helper command, on PATH under `scripts/softroce-twonode`.
const HELPER: &str = "twonode";

/// The helper's exit status for a barrier the other node's failure signal ended.
const ABORTED: i32 = 3;

/// Retries `connect` within `bound` while it fails, returning its first success.
///
/// # Panics
/// When it still fails at the bound.
pub fn retry<T, E: Display>(
    what: &str,
    bound: Duration,
    mut connect: impl FnMut() -> Result<T, E>,
) -> T {
    let deadline = Instant::now() + bound;
    loop {
        match connect() {
            Ok(v) => return v,
            Err(e) if Instant::now() < deadline => {
                log::debug!("{what}: {e}; retrying");
                thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    const BOUND: Duration = Duration::from_secs(10);

    #[test]
    fn both_sides_run_and_meet_at_barriers_in_order() {
        let step = AtomicU32::new(0);
        two_sided("meet", Sides::Threads, BOUND, |p| {
            if p.is_server() {
                step.store(1, Ordering::SeqCst);
                p.barrier();
                p.barrier();
                assert_eq!(step.load(Ordering::SeqCst), 2, "the client ran between");
            } else {
                p.barrier();
                assert_eq!(step.load(Ordering::SeqCst), 1, "the server ran first");
                step.store(2, Ordering::SeqCst);
                p.barrier();
            }
        });
    }

    #[test]
    fn the_client_learns_each_listener_of_the_server_in_turn() {
        two_sided("addrs", Sides::Threads, BOUND, |p| {
            if p.is_server() {
                for port in [7, 8] {
                    assert_eq!(p.listen_addr("127.0.0.1"), "127.0.0.1:0");
                    p.listening(format!("127.0.0.1:{port}"));
                }
            } else {
                assert_eq!(p.server_addr(), "127.0.0.1:7");
                assert_eq!(p.server_addr(), "127.0.0.1:8");
            }
        });
    }

    #[test]
    fn a_failing_side_fails_the_test_and_releases_the_other() {
        let r = std::panic::catch_unwind(|| {
            two_sided("fail", Sides::Threads, Duration::from_secs(60), |p| {
                if p.is_server() {
                    panic!("the server fails");
                }
                // Would wait a minute for the server, which is gone.
                p.barrier();
            })
        });
        assert!(r.is_err());
    }

    #[test]
    fn ports_differ_by_test_and_listener() {
        let meet = |test| {
            Peer::new(
                Side::Client,
                test,
                Meet::Nodes {
                    server_ip: "x".into(),
                    helper: HELPER.into(),
                },
                BOUND,
            )
        };
        let (a, b) = (meet("one_test"), meet("another_test"));
        assert_ne!(a.server_addr(), b.server_addr());
        assert_ne!(a.server_addr(), a.server_addr());
    }

    /// Two nodes in one process: each side's thread runs the runner's own `twonode` helper
    /// (taken from `scripts/softroce-twonode`) as its node, through a job directory of its own.
    fn on_two_nodes(
        test: &'static str,
        body: impl Fn(&Peer) + Sync,
    ) -> [std::thread::Result<()>; 2] {
        use std::os::unix::fs::PermissionsExt;
        let runner = include_str!("../../../scripts/softroce-twonode");
        let helper = runner
            .split("<<'HELPER'\n")
            .nth(1)
            .and_then(|rest| rest.split("\nHELPER\n").next())
            .expect("the helper in scripts/softroce-twonode");
        let job = std::env::temp_dir().join(format!("two-sided-{}-{test}", std::process::id()));
        std::fs::create_dir_all(job.join("sync")).unwrap();
        let write_exec = |name: &str, text: String| {
            let path = job.join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            path.to_str().unwrap().to_string()
        };
        let real = write_exec("twonode", format!("{helper}\n"));
        let node = |me: &str, peer: &str| {
            let wrapper = format!(
                "#!/bin/sh\nRDMX_NODE={me} RDMX_PEER_NODE={peer} RDMX_NODE_JOB={} exec {real} \"$@\"\n",
                job.display()
            );
            write_exec(&format!("node-{me}"), wrapper)
        };
        let (a, b) = (node("A", "B"), node("B", "A"));
        let run = |side, helper: String| {
            let meet = Meet::Nodes {
                server_ip: "127.0.0.1".into(),
                helper,
            };
            let peer = Peer::new(side, test, meet, Duration::from_secs(60));
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| on_node(&peer, &body)))
        };
        let results = thread::scope(|s| {
            let client = s.spawn(|| run(Side::Client, b));
            [run(Side::Server, a), client.join().unwrap()]
        });
        std::fs::remove_dir_all(&job).unwrap();
        results
    }

    #[test]
    fn nodes_meet_at_barriers_through_the_runners_helper() {
        let step = AtomicU32::new(0);
        let [server, client] = on_two_nodes("meet", |p| {
            if p.is_server() {
                step.store(1, Ordering::SeqCst);
            }
            p.barrier();
            assert_eq!(step.load(Ordering::SeqCst), 1, "the server ran first");
        });
        assert!(server.is_ok() && client.is_ok());
    }

    #[test]
    fn a_failing_node_releases_the_other_at_once() {
        let [server, client] = on_two_nodes("release", |p| {
            if p.is_server() {
                panic!("the server fails");
            }
            // Would wait a minute (the bound) for a server that is gone.
            p.barrier();
        });
        assert!(server.is_err());
        let client = client.expect_err("the client's barrier fails");
        let why = client.downcast_ref::<String>().expect("a panic message");
        assert!(why.ends_with("the other node failed"), "{why}");
    }

    #[test]
    fn retry_returns_the_first_success() {
        let mut tries = 0;
        let v = retry("connect", BOUND, || {
            tries += 1;
            if tries < 3 {
                Err("not yet")
            } else {
                Ok(tries)
            }
        });
        assert_eq!(v, 3);
    }
}
