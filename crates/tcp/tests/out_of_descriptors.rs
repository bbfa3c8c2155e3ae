//! A listener in a process out of file descriptors. A test binary of its own (so a process
//! of its own): it lowers the process's descriptor limit, which no other test may share
//! (its tests take turns: [`LIMIT`]).

use std::fs::File;
use std::io::Read;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdmx_tcp::{connect, Listener};
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// A hang guard (nothing is timed against it).
const LONG: Duration = Duration::from_secs(60);

/// Held by each test while it changes the process's descriptor limit.
static LIMIT: Mutex<()> = Mutex::new(());

/// The descriptor numbers this process has open.
fn open_fds() -> Vec<u64> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Out of descriptors (`EMFILE` on accept), the oldest pending handshake is closed to make
/// room: 40 idle connectors against room for 10 more descriptors are all taken, in turn,
/// without an error, the oldest closed; then a legitimate connector gets through.
#[test]
fn out_of_descriptors_the_oldest_pending_makes_room() {
    let _turn = LIMIT.lock().unwrap_or_else(|e| e.into_inner());
    let listener = Listener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().unwrap().to_string();
    // In the kernel's backlog, none taken yet.
    let mut idle: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let saved = getrlimit(Resource::Nofile);
    // Room for exactly 10 more: every free number below the highest open one filled.
    let highest = *open_fds().iter().max().unwrap();
    let mut fillers = Vec::new();
    loop {
        let f = std::fs::File::open("/dev/null").unwrap();
        let n = std::os::fd::AsRawFd::as_raw_fd(&f) as u64;
        fillers.push(f);
        if n >= highest {
            break;
        }
    }
    let room = 10;
    let mut lim = saved;
    lim.current = Some(open_fds().iter().max().unwrap() + 1 + room as u64);
    setrlimit(Resource::Nofile, lim).expect("lower the descriptor limit");

    let start = Instant::now();
    let mut emfile_seen = false;
    loop {
        assert!(
            start.elapsed() < LONG,
            "the idle connectors were not all taken"
        );
        let got = listener
            .get_request(Some(Duration::ZERO))
            .expect("out of descriptors with pending handshakes to close is no error");
        assert!(got.is_none());
        assert!(listener.pending_handshakes() <= room, "room for {room}");
        // The first 30 closed for room: their side reads EOF.
        let closed = idle[..30]
            .iter()
            .filter(|s| {
                s.set_nonblocking(true).unwrap();
                let mut s: &TcpStream = s;
                matches!(s.read(&mut [0u8; 8]), Ok(0))
            })
            .count();
        emfile_seen |= closed > 0;
        if closed == 30 {
            break;
        }
    }
    assert!(emfile_seen);
    for s in &mut idle[30..] {
        s.set_nonblocking(true).unwrap();
        let e = s.read(&mut [0u8; 8]).expect_err("the newest still pending");
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    }
    // (The connector needs a descriptor of its own: the closed ones' go.)
    idle.drain(..30);
    let client = std::thread::spawn(move || connect(&addr, b"room", LONG));
    let request = listener
        .get_request(Some(LONG))
        .expect("get_request")
        .expect("the legitimate connector");
    assert_eq!(request.private_data(), b"room");
    request.accept(b"").expect("accept");
    client.join().unwrap().expect("connect");
    setrlimit(Resource::Nofile, saved).expect("restore the limit");
    drop(fillers);
}

/// Fills every free descriptor number up to the highest one open, and lowers the soft
/// limit so that `room` more can be opened (none: `EMFILE` at the next open): the files
/// holding the numbers, and the limit to restore.
fn leave_room(room: u64) -> (Vec<File>, Rlimit) {
    let saved = getrlimit(Resource::Nofile);
    let highest = *open_fds().iter().max().unwrap();
    let mut fillers = Vec::new();
    // (Each filler takes the lowest free number: every number up to the last one is open.)
    let top = loop {
        let f = File::open("/dev/null").unwrap();
        let n = f.as_raw_fd() as u64;
        fillers.push(f);
        if n >= highest {
            break n;
        }
    };
    let mut lim = saved;
    lim.current = Some(top + 1 + room);
    setrlimit(Resource::Nofile, lim).expect("lower the descriptor limit");
    (fillers, saved)
}

/// Whether the listener's descriptor polls readable within `timeout`.
fn readable(listener: &Listener, timeout: Duration) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    let fd = listener.fd();
    let t = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: timeout.subsec_nanos().into(),
    };
    poll(&mut [PollFd::new(&fd, PollFlags::IN)], Some(&t)).is_ok_and(|n| n > 0)
}

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Out of descriptors with no pending handshake to close, the listener backs off instead
/// of spinning: a connection waits in the listening socket's backlog, and a thread calling
/// `get_request` in a loop for a second — with a deadline each time, or polling the
/// listener's descriptor and only looking — sleeps most of that time (its CPU time under a
/// fifth of the wall time: a spinning loop uses all of it). `get_request` says why when its
/// deadline passes (the `EMFILE` error), and the listener is never failed: once descriptors
/// are freed, the waiting connection is accepted.
#[test]
fn out_of_descriptors_with_nothing_pending_the_listener_backs_off() {
    let _turn = LIMIT.lock().unwrap_or_else(|e| e.into_inner());
    let listener = Listener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().unwrap().to_string();
    // A connector whose connection waits in the backlog (its socket made before the limit).
    let client = {
        let addr = addr.clone();
        std::thread::spawn(move || connect(&addr, b"patient", LONG))
    };
    let start = Instant::now();
    while !readable(&listener, Duration::from_millis(10)) {
        assert!(
            start.elapsed() < LONG,
            "the connector never reached the backlog"
        );
    }
    let (fillers, saved) = leave_room(0);

    const WALL: Duration = Duration::from_secs(1);
    let polling_fd = |use_fd: bool| {
        let listener = &listener;
        std::thread::scope(|s| {
            s.spawn(move || {
                let (wall, cpu) = (Instant::now(), thread_cpu());
                let (mut calls, mut errors) = (0u64, 0u64);
                while wall.elapsed() < WALL {
                    let got = if use_fd {
                        readable(listener, Duration::from_millis(100));
                        listener.get_request(Some(Duration::ZERO))
                    } else {
                        listener.get_request(Some(Duration::from_millis(100)))
                    };
                    calls += 1;
                    match got {
                        Ok(None) => {}
                        Ok(Some(_)) => panic!("no descriptor to take the connection with"),
                        Err(e) => {
                            assert!(e.is_out_of_descriptors(), "{e}");
                            assert!(e.to_string().contains("EMFILE"), "{e}");
                            errors += 1;
                        }
                    }
                }
                let (wall, cpu) = (wall.elapsed(), thread_cpu() - cpu);
                println!(
                    "out of descriptors, {}: {calls} calls ({errors} said EMFILE), {cpu:?} of \
                     CPU in {wall:?}",
                    if use_fd {
                        "polling the fd"
                    } else {
                        "with a deadline"
                    }
                );
                assert!(
                    cpu < wall / 5,
                    "the caller spun: {cpu:?} of CPU in {wall:?} ({calls} calls)"
                );
                assert!(errors > 0, "the deadline passed without saying why");
            })
            .join()
            .unwrap();
        });
    };
    polling_fd(false);
    polling_fd(true);

    // Descriptors freed: the connection waiting in the backlog is taken.
    drop(fillers);
    setrlimit(Resource::Nofile, saved).expect("restore the limit");
    let request = listener
        .get_request(Some(LONG))
        .expect("the listener is usable")
        .expect("the waiting connector");
    assert_eq!(request.private_data(), b"patient");
    request.accept(b"").expect("accept");
    client.join().unwrap().expect("connect");
}
