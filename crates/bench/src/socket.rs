//! `rdmx-bench socket-pingpong`: a raw-socket TCP ping-pong, the baseline of what the kernel
//! gives without any middleware — the best plain sockets can do: `TCP_NODELAY`, one write per
//! message, and, once the session header is exchanged, nonblocking sockets polled by spinning
//! (as ucx_perftest and rdmx poll). A thread blocked in `read` waits for the scheduler to
//! wake it, which costs tens of µs per message on VMs (about 60 µs here, against 8–10 µs at
//! best), so a blocking baseline would flatter whoever polls.
//!
//! Wire protocol (all integers little-endian), client first:
//!
//! ```text
//! header:  "RDMXSPP1"  mode:u8 (0 latency, 1 bandwidth)  window:u32  count:u32
//!          count x { size:u64  iterations:u64  warmup:u64 }
//! reply:   status:u8 (0 = accepted; otherwise len:u16 + UTF-8 reason, then close)
//! ```
//!
//! Then, size by size in header order:
//! * latency: `warmup + iterations` round trips of `size` bytes each way (one write of the
//!   whole message, reads until it is complete);
//! * bandwidth: `ceil(warmup / window) * window` warm-up messages of `size` bytes client →
//!   server, a 1-byte ack from the server once all have arrived, then
//!   `ceil(iterations / window) * window` timed messages and another ack. A byte stream has
//!   no outstanding messages to bound, so the client streams without waiting between
//!   messages (the best plain sockets can do; `window` only rounds the counts as rdmx's
//!   windows do).
//!
//! The server serves exactly one client session and returns.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::schema::{PingpongDoc, PingpongRow, MODE_BANDWIDTH, MODE_LATENCY};
use crate::sizes::{format_size, MAX_SIZE};
use crate::stats::summarize;
use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"RDMXSPP1";
/// Most sizes one session may carry.
pub const MAX_SIZES: u32 = 4096;
/// Most iterations (or warm-up messages) per size.
pub const MAX_ITERS: u64 = 100_000_000;
/// Largest bandwidth window.
pub const MAX_WINDOW: u32 = 65_536;
/// Default bandwidth window (messages outstanding before the server's ack).
pub const DEFAULT_WINDOW: u32 = 16;
/// The default size list: powers of two from 1 B to 16 MiB.
pub const DEFAULT_SIZES: &str = "1:16M";
const ACK: u8 = 0xA5;
/// How long the client keeps retrying a refused connection (the server may still be starting).
const CONNECT_RETRY: Duration = Duration::from_secs(5);

/// Default measured iterations for `size`: `clamp(32 MiB / size, 5, 1000)`.
pub fn default_iterations(size: u64) -> u64 {
    ((32u64 << 20) / size.max(1)).clamp(5, 1000)
}

/// Default warm-up for `iterations`: `max(1, iterations / 10)`.
pub fn default_warmup(iterations: u64) -> u64 {
    (iterations / 10).max(1)
}

/// What the client asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientOptions {
    /// Message sizes in bytes, in order.
    pub sizes: Vec<u64>,
    /// `-n`: measured iterations for every size (default: [`default_iterations`]).
    pub iterations: Option<u64>,
    /// `--warmup`: warm-up iterations for every size (default: [`default_warmup`]).
    pub warmup: Option<u64>,
    /// `--bw`: bandwidth mode instead of latency.
    pub bandwidth: bool,
    /// `--window`: messages per window in bandwidth mode.
    pub window: u32,
}

/// One size's plan, as carried in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    size: u64,
    iterations: u64,
    warmup: u64,
}

/// Windows needed for `messages` messages.
fn windows(messages: u64, window: u32) -> u64 {
    messages.div_ceil(u64::from(window.max(1)))
}

impl ClientOptions {
    fn plans(&self) -> Vec<Plan> {
        self.sizes
            .iter()
            .map(|&size| {
                let iterations = self.iterations.unwrap_or_else(|| default_iterations(size));
                let warmup = self.warmup.unwrap_or_else(|| default_warmup(iterations));
                Plan {
                    size,
                    iterations,
                    warmup,
                }
            })
            .collect()
    }

    fn check(&self) -> Result<()> {
        let usage = |m: String| Err(Error::Usage(m));
        if self.sizes.is_empty() {
            return usage("no message sizes".into());
        }
        if self.sizes.len() > MAX_SIZES as usize {
            return usage(format!("more than {MAX_SIZES} message sizes"));
        }
        if let Some(&s) = self.sizes.iter().find(|&&s| s == 0 || s > MAX_SIZE) {
            return usage(format!("message size {s} is outside 1 B ..= 1 GiB"));
        }
        if self.iterations.is_some_and(|n| n == 0 || n > MAX_ITERS) {
            return usage(format!("-n must be between 1 and {MAX_ITERS}"));
        }
        if self.warmup.is_some_and(|n| n > MAX_ITERS) {
            return usage(format!("--warmup must be at most {MAX_ITERS}"));
        }
        if self.window == 0 || self.window > MAX_WINDOW {
            return usage(format!("--window must be between 1 and {MAX_WINDOW}"));
        }
        Ok(())
    }
}

/// Binds `addr` (port 0 picks a free port).
pub fn bind(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).map_err(|e| Error::net(format!("cannot listen on {addr}"), e))
}

/// Accepts one client on `listener` and serves its whole session.
pub fn serve_one(listener: &TcpListener) -> Result<()> {
    let (mut s, peer) = listener
        .accept()
        .map_err(|e| Error::net("accept failed", e))?;
    log::info!("socket-pingpong: client {peer}");
    s.set_nodelay(true)
        .map_err(|e| Error::net("setting TCP_NODELAY", e))?;
    serve_session(&mut s)
}

/// A nonblocking stream read and written by polling: `WouldBlock` is spun on, never slept on.
struct Polled<'a>(&'a mut TcpStream);

impl<'a> Polled<'a> {
    fn new(s: &'a mut TcpStream) -> io::Result<Self> {
        s.set_nonblocking(true)?;
        Ok(Polled(s))
    }
}

impl Read for Polled<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.0.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                r => return r,
            }
        }
    }
}

impl Write for Polled<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            match self.0.write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                r => return r,
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn read_u8(s: &mut impl Read) -> io::Result<u8> {
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    Ok(b[0])
}
fn read_u32(s: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}
fn read_u64(s: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn header_io(e: io::Error) -> Error {
    Error::net("reading the session header", e)
}

fn serve_session(s: &mut TcpStream) -> Result<()> {
    let mut magic = [0u8; 8];
    s.read_exact(&mut magic).map_err(header_io)?;
    if &magic != MAGIC {
        return reject(s, "not a socket-pingpong client (bad magic)".into());
    }
    let mode = read_u8(s).map_err(header_io)?;
    let window = read_u32(s).map_err(header_io)?;
    let count = read_u32(s).map_err(header_io)?;
    if mode > 1 {
        return reject(s, format!("unknown mode {mode}"));
    }
    let bandwidth = mode == 1;
    if bandwidth && (window == 0 || window > MAX_WINDOW) {
        return reject(s, format!("window {window} outside 1..={MAX_WINDOW}"));
    }
    if count == 0 || count > MAX_SIZES {
        return reject(s, format!("size count {count} outside 1..={MAX_SIZES}"));
    }
    let mut plans = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let plan = Plan {
            size: read_u64(s).map_err(header_io)?,
            iterations: read_u64(s).map_err(header_io)?,
            warmup: read_u64(s).map_err(header_io)?,
        };
        plans.push(plan);
    }
    for p in &plans {
        if p.size == 0 || p.size > MAX_SIZE {
            return reject(s, format!("message size {} outside 1..=1 GiB", p.size));
        }
        if p.iterations == 0 || p.iterations > MAX_ITERS || p.warmup > MAX_ITERS {
            return reject(
                s,
                format!("iteration counts for size {} out of range", p.size),
            );
        }
    }
    s.write_all(&[0])
        .map_err(|e| Error::net("accepting the header", e))?;
    let s = &mut Polled::new(s).map_err(|e| Error::net("making the socket nonblocking", e))?;
    for p in &plans {
        let mut buf = vec![0u8; p.size as usize];
        let io = |e| Error::net(format!("size {}", p.size), e);
        if bandwidth {
            for phase in [p.warmup, p.iterations] {
                let count = windows(phase, window) * u64::from(window);
                if count == 0 {
                    continue;
                }
                for _ in 0..count {
                    s.read_exact(&mut buf).map_err(io)?;
                }
                s.write_all(&[ACK]).map_err(io)?;
            }
        } else {
            for _ in 0..p.warmup + p.iterations {
                s.read_exact(&mut buf).map_err(io)?;
                s.write_all(&buf).map_err(io)?;
            }
        }
    }
    log::info!("socket-pingpong: session done");
    Ok(())
}

fn reject(s: &mut TcpStream, reason: String) -> Result<()> {
    let msg = reason.as_bytes();
    let len = msg.len().min(u16::MAX as usize);
    let mut out = vec![1u8];
    out.extend_from_slice(&(len as u16).to_le_bytes());
    out.extend_from_slice(&msg[..len]);
    // Best effort: the client may already be gone. Close our side, then drain what the
    // client already sent (briefly), so that closing does not reset the connection and
    // discard the reason before the client has read it.
    let _ = s.write_all(&out);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let _ = io::copy(&mut s.take(1 << 20), &mut io::sink());
    Err(Error::Protocol(format!("rejected the client: {reason}")))
}

fn connect(addr: &str) -> Result<TcpStream> {
    let targets: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| Error::net(format!("cannot resolve {addr}"), e))?
        .collect();
    if targets.is_empty() {
        return Err(Error::Usage(format!("{addr} resolves to no address")));
    }
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
pub fn run_client(addr: &str, opts: &ClientOptions) -> Result<PingpongDoc> {
    opts.check()?;
    let plans = opts.plans();
    let mut s = connect(addr)?;
    s.set_nodelay(true)
        .map_err(|e| Error::net("setting TCP_NODELAY", e))?;
    let mut hdr = Vec::with_capacity(17 + 24 * plans.len());
    hdr.extend_from_slice(MAGIC);
    hdr.push(u8::from(opts.bandwidth));
    hdr.extend_from_slice(&opts.window.to_le_bytes());
    hdr.extend_from_slice(&(plans.len() as u32).to_le_bytes());
    for p in &plans {
        hdr.extend_from_slice(&p.size.to_le_bytes());
        hdr.extend_from_slice(&p.iterations.to_le_bytes());
        hdr.extend_from_slice(&p.warmup.to_le_bytes());
    }
    s.write_all(&hdr)
        .map_err(|e| Error::net("sending the session header", e))?;
    let status = read_u8(&mut s).map_err(|e| Error::net("reading the server's reply", e))?;
    if status != 0 {
        let mut len = [0u8; 2];
        let mut reason = String::from("(no reason given)");
        if s.read_exact(&mut len).is_ok() {
            let mut msg = vec![0u8; u16::from_le_bytes(len) as usize];
            if s.read_exact(&mut msg).is_ok() {
                reason = String::from_utf8_lossy(&msg).into_owned();
            }
        }
        return Err(Error::Protocol(format!(
            "the server rejected the session: {reason}"
        )));
    }
    let mut polled =
        Polled::new(&mut s).map_err(|e| Error::net("making the socket nonblocking", e))?;
    let mut results = Vec::with_capacity(plans.len());
    for p in &plans {
        log::info!(
            "socket-pingpong: {} x {} (+{} warm-up)",
            format_size(p.size),
            p.iterations,
            p.warmup
        );
        let row = if opts.bandwidth {
            bandwidth_size(&mut polled, p, opts.window)?
        } else {
            latency_size(&mut polled, p)?
        };
        results.push(row);
    }
    Ok(PingpongDoc {
        tool: "socket-pingpong".into(),
        transport: "tcp".into(),
        device: None,
        eager_threshold: None,
        eager_limit: None,
        mode: if opts.bandwidth {
            MODE_BANDWIDTH
        } else {
            MODE_LATENCY
        }
        .into(),
        window: opts.bandwidth.then_some(u64::from(opts.window)),
        results,
    })
}

fn latency_size(s: &mut Polled<'_>, p: &Plan) -> Result<PingpongRow> {
    let io = |e| Error::net(format!("latency, size {}", p.size), e);
    let mut buf = vec![0x5Au8; p.size as usize];
    let mut samples = Vec::with_capacity(p.iterations as usize);
    for i in 0..p.warmup + p.iterations {
        let t = Instant::now();
        s.write_all(&buf).map_err(io)?;
        s.read_exact(&mut buf).map_err(io)?;
        if i >= p.warmup {
            samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    }
    let sum = summarize(&mut samples).ok_or_else(|| Error::Protocol("no samples".into()))?;
    let mean_s = sum.mean / 1e6;
    Ok(PingpongRow {
        size: p.size,
        protocol: "stream".into(),
        iterations: p.iterations,
        warmup: p.warmup,
        p50_us: sum.p50,
        p99_us: sum.p99,
        mean_us: sum.mean,
        min_us: sum.min,
        bytes_per_s: rate(p.size as f64, mean_s),
        msgs_per_s: rate(1.0, mean_s),
    })
}

fn bandwidth_size(s: &mut Polled<'_>, p: &Plan, window: u32) -> Result<PingpongRow> {
    let io = |e| Error::net(format!("bandwidth, size {}", p.size), e);
    let buf = vec![0x5Au8; p.size as usize];
    let warm = windows(p.warmup, window) * u64::from(window);
    let messages = windows(p.iterations, window) * u64::from(window);
    let ack = |s: &mut Polled<'_>| -> Result<()> {
        if read_u8(s).map_err(io)? != ACK {
            return Err(Error::Protocol("bad acknowledgement".into()));
        }
        Ok(())
    };
    if warm > 0 {
        for _ in 0..warm {
            s.write_all(&buf).map_err(io)?;
        }
        ack(s)?;
    }
    let mut samples = Vec::with_capacity(messages as usize);
    let start = Instant::now();
    let mut last = start;
    for _ in 0..messages {
        s.write_all(&buf).map_err(io)?;
        let now = Instant::now();
        samples.push((now - last).as_secs_f64() * 1e6);
        last = now;
    }
    ack(s)?;
    let total = start.elapsed();
    let sum = summarize(&mut samples).ok_or_else(|| Error::Protocol("no samples".into()))?;
    let secs = total.as_secs_f64();
    Ok(PingpongRow {
        size: p.size,
        protocol: "stream".into(),
        iterations: messages,
        warmup: warm,
        p50_us: sum.p50,
        p99_us: sum.p99,
        mean_us: sum.mean,
        min_us: sum.min,
        bytes_per_s: rate((messages * p.size) as f64, secs),
        msgs_per_s: rate(messages as f64, secs),
    })
}

/// `amount / secs`, 0 when no time elapsed (a clock that did not tick must not give inf).
fn rate(amount: f64, secs: f64) -> f64 {
    if secs > 0.0 {
        amount / secs
    } else {
        0.0
    }
}

/// The human-readable table printed without `--json`.
pub fn format_table(doc: &PingpongDoc) -> String {
    let mut out = String::new();
    let what = if doc.is_bandwidth() {
        format!(
            "bandwidth, window {}; *_us per message",
            doc.window.unwrap_or(0)
        )
    } else {
        "latency; *_us one-way (half round trip)".to_string()
    };
    out.push_str(&format!("# {} over {}: {what}\n", doc.tool, doc.transport));
    out.push_str(&format!(
        "{:>10} {:>8} {:>7} {:>11} {:>11} {:>11} {:>11} {:>11} {:>12}\n",
        "size", "iters", "warmup", "p50_us", "p99_us", "mean_us", "min_us", "MB/s", "msgs/s"
    ));
    for r in &doc.results {
        out.push_str(&format!(
            "{:>10} {:>8} {:>7} {:>11.2} {:>11.2} {:>11.2} {:>11.2} {:>11.2} {:>12.0}\n",
            format_size(r.size),
            r.iterations,
            r.warmup,
            r.p50_us,
            r.p99_us,
            r.mean_us,
            r.min_us,
            r.bytes_per_s / f64::from(1u32 << 20),
            r.msgs_per_s
        ));
    }
    out.push_str("(MB = 2^20 bytes)\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        assert_eq!(default_iterations(1), 1000);
        assert_eq!(default_iterations(64 << 10), 512);
        assert_eq!(default_iterations(16 << 20), 5);
        assert_eq!(default_warmup(1000), 100);
        assert_eq!(default_warmup(5), 1);
        assert_eq!(windows(10, 4), 3);
        assert_eq!(windows(0, 4), 0);
    }

    fn session(opts: ClientOptions) -> PingpongDoc {
        let l = bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || serve_one(&l));
        let doc = run_client(&addr, &opts).unwrap();
        server.join().unwrap().unwrap();
        doc
    }

    #[test]
    fn loopback_latency() {
        let doc = session(ClientOptions {
            sizes: vec![1, 4096, 1 << 20],
            iterations: Some(20),
            warmup: None,
            bandwidth: false,
            window: DEFAULT_WINDOW,
        });
        assert_eq!(doc.mode, "latency");
        assert_eq!(doc.window, None);
        assert_eq!(doc.results.len(), 3);
        for r in &doc.results {
            assert_eq!(r.protocol, "stream");
            assert_eq!((r.iterations, r.warmup), (20, 2));
            assert!(r.min_us > 0.0 && r.min_us <= r.p50_us && r.p50_us <= r.p99_us);
            let mean_s = r.mean_us / 1e6;
            assert!((r.msgs_per_s * mean_s - 1.0).abs() < 1e-9);
            assert!((r.bytes_per_s * mean_s - r.size as f64).abs() < 1e-6 * r.size as f64);
        }
    }

    #[test]
    fn loopback_bandwidth_rounds_to_windows() {
        let doc = session(ClientOptions {
            sizes: vec![64, 65536],
            iterations: Some(10),
            warmup: Some(3),
            bandwidth: true,
            window: 4,
        });
        assert_eq!(doc.mode, "bandwidth");
        assert_eq!(doc.window, Some(4));
        for r in &doc.results {
            assert_eq!((r.iterations, r.warmup), (12, 4));
            assert!(r.bytes_per_s > 0.0);
            assert!((r.bytes_per_s / r.msgs_per_s - r.size as f64).abs() < 1e-6 * r.size as f64);
        }
    }

    #[test]
    fn server_rejects_garbage_without_panicking() {
        let l = bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || serve_one(&l));
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut reply = Vec::new();
        c.read_to_end(&mut reply).unwrap();
        assert_eq!(reply[0], 1);
        let e = server.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("bad magic"), "{e}");

        // A header that promises a 2 GiB message.
        let l = bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || serve_one(&l));
        let mut c = TcpStream::connect(addr).unwrap();
        let mut h = MAGIC.to_vec();
        h.push(0);
        h.extend_from_slice(&1u32.to_le_bytes());
        h.extend_from_slice(&1u32.to_le_bytes());
        for v in [2u64 << 30, 10, 1] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        c.write_all(&h).unwrap();
        let e = server.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("outside 1..=1 GiB"), "{e}");

        // A client that hangs up mid-header.
        let l = bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || serve_one(&l));
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(&MAGIC[..4]).unwrap();
        drop(c);
        assert!(server.join().unwrap().is_err());
    }

    #[test]
    fn client_checks_options_before_connecting() {
        let base = ClientOptions {
            sizes: vec![8],
            iterations: None,
            warmup: None,
            bandwidth: false,
            window: 16,
        };
        // Port 9 on localhost is never contacted: the options fail first.
        for bad in [
            ClientOptions {
                sizes: vec![],
                ..base.clone()
            },
            ClientOptions {
                iterations: Some(0),
                ..base.clone()
            },
            ClientOptions {
                window: 0,
                ..base.clone()
            },
        ] {
            let e = run_client("127.0.0.1:9", &bad).unwrap_err();
            assert!(matches!(e, Error::Usage(_)), "{e}");
        }
    }
}
