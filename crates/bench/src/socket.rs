//! `rdmx-bench socket-pingpong`: a raw-socket TCP ping-pong, the baseline of what the kernel
//! gives without any middleware — the best plain sockets can do: `TCP_NODELAY`, one write per
//! message, and, once the plan is exchanged, nonblocking sockets polled by spinning (as
//! ucx_perftest and rdmx poll). A thread blocked in `read` waits for the scheduler to wake
//! it, which costs tens of µs per message on VMs, so a blocking baseline would flatter
//! whoever polls.
//!
//! Session, client first: one line `RDMXSPP2 <plan as JSON>\n` (a [`Plan`]), answered by
//! `ok\n` or `error: <reason>\n` (then the server closes). Then, size by size:
//! * latency: `warmup + iterations` round trips of `size` bytes each way;
//! * bandwidth: the warm-up messages client → server, a 1-byte ack from the server once all
//!   have arrived, then the measured messages and another ack (counts rounded up to whole
//!   windows, as rdmx's). A byte stream has no outstanding messages to bound: the client
//!   streams without waiting between messages.
//!
//! The server serves exactly one client session and returns.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::plan::Plan;
use crate::schema::{histogram, record, PingpongDoc, PingpongRow, MODE_BANDWIDTH, MODE_LATENCY};
use crate::sizes::format_size;
use crate::{Error, Result};

const MAGIC: &str = "RDMXSPP2 ";
const ACK: u8 = 0xA5;
/// How long the client keeps retrying a refused connection (the server may still be starting).
const CONNECT_RETRY: Duration = Duration::from_secs(5);

/// Binds `addr` (port 0 picks a free port).
pub fn bind(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).map_err(|e| Error::net(format!("cannot listen on {addr}"), e))
}

/// A nonblocking stream read and written by polling: `WouldBlock` is spun on, never slept on.
struct Polled<'a>(&'a mut TcpStream);

impl Polled<'_> {
    fn spin<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
        loop {
            match f() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                r => return r,
            }
        }
    }
}

impl Read for Polled<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Self::spin(|| self.0.read(buf))
    }
}

impl Write for Polled<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Self::spin(|| self.0.write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn polled(s: &mut TcpStream) -> Result<Polled<'_>> {
    s.set_nonblocking(true)
        .map_err(|e| Error::net("making the socket nonblocking", e))?;
    Ok(Polled(s))
}

/// Checks a plan for a byte stream: the shared limits, and no empty messages.
fn check(plan: &Plan) -> std::result::Result<(), String> {
    plan.validate()?;
    if plan.sizes.contains(&0) {
        return Err("message size 0 is not allowed over a byte stream".into());
    }
    Ok(())
}

/// Accepts one client on `listener` and serves its whole session.
pub fn serve_one(listener: &TcpListener) -> Result<()> {
    let (mut s, peer) = listener
        .accept()
        .map_err(|e| Error::net("accept failed", e))?;
    log::info!("socket-pingpong: client {peer}");
    s.set_nodelay(true)
        .map_err(|e| Error::net("setting TCP_NODELAY", e))?;
    let mut line = String::new();
    BufReader::new(&mut s)
        .take(1 << 20)
        .read_line(&mut line)
        .map_err(|e| Error::net("reading the session header", e))?;
    let plan = match line.strip_prefix(MAGIC) {
        None => Err("not a socket-pingpong client (bad magic)".to_string()),
        Some(json) => serde_json::from_str::<Plan>(json)
            .map_err(|e| format!("bad plan: {e}"))
            .and_then(|p| check(&p).map(|()| p)),
    };
    let plan = match plan {
        Ok(p) => p,
        Err(reason) => {
            // Best effort: the client may be gone already.
            let _ = writeln!(s, "error: {reason}");
            return Err(Error::Protocol(format!("rejected the client: {reason}")));
        }
    };
    s.write_all(b"ok\n")
        .map_err(|e| Error::net("accepting the plan", e))?;
    let s = &mut polled(&mut s)?;
    for &size in &plan.sizes {
        let mut buf = vec![0u8; size as usize];
        let io = |e| Error::net(format!("size {size}"), e);
        let (warm, timed) = plan.counts_for(size);
        if plan.window.is_some() {
            for count in [warm, timed].into_iter().filter(|&c| c > 0) {
                for _ in 0..count {
                    s.read_exact(&mut buf).map_err(io)?;
                }
                s.write_all(&[ACK]).map_err(io)?;
            }
        } else {
            for _ in 0..warm + timed {
                s.read_exact(&mut buf).map_err(io)?;
                s.write_all(&buf).map_err(io)?;
            }
        }
    }
    log::info!("socket-pingpong: session done");
    Ok(())
}

fn connect(addr: &str) -> Result<TcpStream> {
    let targets: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| Error::net(format!("cannot resolve {addr}"), e))?
        .collect();
    let deadline = Instant::now() + CONNECT_RETRY;
    loop {
        match TcpStream::connect(&targets[..]) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(Error::net(format!("cannot connect to {addr}"), e)),
        }
    }
}

/// Runs a whole client session against the server at `addr` (`HOST:PORT`) and returns the
/// results in the pingpong JSON schema.
pub fn run_client(addr: &str, plan: &Plan) -> Result<PingpongDoc> {
    check(plan).map_err(Error::Usage)?;
    let mut s = connect(addr)?;
    s.set_nodelay(true)
        .map_err(|e| Error::net("setting TCP_NODELAY", e))?;
    let json = serde_json::to_string(plan).expect("a plan always serialises");
    writeln!(s, "{MAGIC}{json}").map_err(|e| Error::net("sending the plan", e))?;
    let mut reply = String::new();
    BufReader::new(&mut s)
        .take(1 << 16)
        .read_line(&mut reply)
        .map_err(|e| Error::net("reading the server's reply", e))?;
    if reply != "ok\n" {
        return Err(Error::Protocol(format!(
            "the server rejected the session: {}",
            reply
                .trim()
                .strip_prefix("error: ")
                .unwrap_or("(no reason given)")
        )));
    }
    let mut s = polled(&mut s)?;
    let mut results = Vec::with_capacity(plan.sizes.len());
    // (The clock rdmx's pingpong reads, read as often.)
    let clock = Clock::new();
    for &size in &plan.sizes {
        let counts = plan.counts_for(size);
        log::info!("socket-pingpong: {} x {counts:?}", format_size(size));
        let io = |e| Error::net(format!("size {size}"), e);
        let mut buf = vec![0x5Au8; size as usize];
        let mut h = histogram();
        if plan.window.is_some() {
            let ack = |s: &mut Polled<'_>| -> Result<()> {
                let mut b = [0u8];
                s.read_exact(&mut b).map_err(io)?;
                (b[0] == ACK)
                    .then_some(())
                    .ok_or_else(|| Error::Protocol("bad acknowledgement".into()))
            };
            if counts.0 > 0 {
                for _ in 0..counts.0 {
                    s.write_all(&buf).map_err(io)?;
                }
                ack(&mut s)?;
            }
            let start = clock.now();
            let mut last = start;
            for _ in 0..counts.1 {
                s.write_all(&buf).map_err(io)?;
                let now = clock.now();
                record(&mut h, clock.between(last, now));
                last = now;
            }
            ack(&mut s)?;
            results.push(PingpongRow::bandwidth(
                size,
                "stream",
                counts,
                &h,
                clock.since(start),
            ));
        } else {
            for i in 0..counts.0 + counts.1 {
                let t = clock.now();
                s.write_all(&buf).map_err(io)?;
                s.read_exact(&mut buf).map_err(io)?;
                if i >= counts.0 {
                    record(&mut h, clock.since(t));
                }
            }
            results.push(PingpongRow::latency(size, "stream", counts, &h));
        }
    }
    Ok(PingpongDoc {
        tool: "socket-pingpong".into(),
        transport: "tcp".into(),
        device: None,
        peer: Some(addr.to_string()),
        eager_threshold: None,
        eager_limit: None,
        mode: if plan.window.is_some() {
            MODE_BANDWIDTH
        } else {
            MODE_LATENCY
        }
        .into(),
        window: plan.window.map(u64::from),
        results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves one connection that sends `header` and returns the server's error and reply.
    fn reject(header: &[u8]) -> (String, String) {
        let l = bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || serve_one(&l));
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(header).unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut reply = String::new();
        let _ = c.read_to_string(&mut reply);
        (server.join().unwrap().unwrap_err().to_string(), reply)
    }

    #[test]
    fn server_rejects_garbage_without_panicking() {
        let (e, reply) = reject(b"GET / HTTP/1.0\r\n\r\n");
        assert!(
            e.contains("bad magic") && reply.starts_with("error: "),
            "{e} {reply}"
        );
        let (e, _) = reject(
            b"RDMXSPP2 {\"sizes\":[2147483648],\"iters\":10,\"warmup\":1,\"window\":null}\n",
        );
        assert!(e.contains("larger than the limit of 1 GiB"), "{e}");
        let (e, _) = reject(b"RDMXSPP2 {\"sizes\": [1,\n");
        assert!(e.contains("bad plan"), "{e}");
        // A client that hangs up mid-header.
        let (e, _) = reject(b"RDMX");
        assert!(e.contains("bad magic"), "{e}");
    }

    #[test]
    fn client_checks_the_plan_before_connecting() {
        // Port 9 on localhost is never contacted: the plan fails first.
        for sizes in [vec![], vec![0]] {
            let plan = Plan {
                sizes,
                iters: None,
                warmup: None,
                window: None,
                recv_window: None,
                host_iters: false,
            };
            let e = run_client("127.0.0.1:9", &plan).unwrap_err();
            assert!(matches!(e, Error::Usage(_)), "{e}");
        }
    }
}
