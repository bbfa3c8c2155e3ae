//! A listener in a process out of file descriptors. A test binary of its own (so a process
//! of its own): it lowers the process's descriptor limit, which no other test may share.

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rdmx_tcp::{connect, Listener};

/// A hang guard (nothing is timed against it).
const LONG: Duration = Duration::from_secs(60);

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
    use rustix::process::{getrlimit, setrlimit, Resource};
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
