//! Command-line parsing for pingpong: every mistake is one clear message, never a panic.

use std::fmt;

/// The default port of `--server` and `--client HOST`.
pub const DEFAULT_PORT: u16 = 13337;
/// Largest message size accepted (per message).
pub const MAX_SIZE: usize = 1 << 30;
/// Largest number of timed iterations per size.
pub const MAX_ITERS: usize = 10_000_000;
/// Largest bandwidth window.
pub const MAX_WINDOW: usize = 4096;
/// Bytes a window may hold in memory at once.
pub const MAX_WINDOW_BYTES: usize = 1 << 30;

/// What the process does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Serve one client at this address, then exit.
    Server(String),
    /// Connect to this `host:port` and run the sweep.
    Client(String),
    /// Both sides in one process, over loopback on the auto transport.
    Loopback,
}

/// How the sweep runs, as the client tells the server.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    /// Message sizes, in order.
    pub sizes: Vec<usize>,
    /// Timed iterations per size (`None`: chosen per size, see [`Plan::iters_for`]).
    pub iters: Option<usize>,
    /// Untimed iterations before the timed ones (`None`: a tenth of the iterations).
    pub warmup: Option<usize>,
    /// Bandwidth mode: messages outstanding per window (`None`: latency mode).
    pub window: Option<usize>,
}

impl Plan {
    /// Timed iterations for `size`: `-n`, or enough to move about 32 MiB, within 5..=1000.
    pub fn iters_for(&self, size: usize) -> usize {
        self.iters
            .unwrap_or_else(|| ((32usize << 20) / size.max(1)).clamp(5, 1000))
    }

    /// Warm-up iterations for `size`.
    pub fn warmup_for(&self, size: usize) -> usize {
        self.warmup
            .unwrap_or_else(|| (self.iters_for(size) / 10).max(1))
    }

    /// Bandwidth mode: (warm-up windows, timed windows) for `size`, the iteration counts
    /// rounded up to whole windows.
    pub fn windows_for(&self, size: usize) -> (usize, usize) {
        let w = self.window.unwrap_or(1).max(1);
        (
            self.warmup_for(size).div_ceil(w),
            self.iters_for(size).div_ceil(w),
        )
    }

    /// Checks limits a peer could exceed (the server validates what the client sent).
    pub fn validate(&self) -> Result<(), String> {
        if self.sizes.is_empty() {
            return Err("no message sizes".into());
        }
        if let Some(&s) = self.sizes.iter().find(|&&s| s > MAX_SIZE) {
            return Err(format!("size {s} exceeds the {MAX_SIZE}-byte limit"));
        }
        if self.sizes.len() > 1024 {
            return Err(format!("{} sizes; at most 1024", self.sizes.len()));
        }
        match self.iters {
            Some(0) => return Err("iterations must be at least 1".into()),
            Some(n) if n > MAX_ITERS => return Err(format!("{n} iterations; at most {MAX_ITERS}")),
            _ => {}
        }
        if matches!(self.warmup, Some(n) if n > MAX_ITERS) {
            return Err(format!("warm-up above {MAX_ITERS}"));
        }
        if let Some(w) = self.window {
            if w == 0 || w > MAX_WINDOW {
                return Err(format!("window {w}; it must be 1..={MAX_WINDOW}"));
            }
            let max = self.sizes.iter().max().copied().unwrap_or(0);
            if max.saturating_mul(w) > MAX_WINDOW_BYTES {
                return Err(format!(
                    "a window of {w} messages of {max} bytes needs more than {} MiB",
                    MAX_WINDOW_BYTES >> 20
                ));
            }
        }
        Ok(())
    }
}

/// Parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// Server, client or both.
    pub role: Role,
    /// The sweep (used by the client side).
    pub plan: Plan,
    /// Print one JSON document instead of the table.
    pub json: bool,
    /// Progress lines on stderr: `Some(true)` forced on, `Some(false)` off, `None` when
    /// stderr is a terminal.
    pub progress: Option<bool>,
}

/// A command-line mistake.
#[derive(Debug, PartialEq, Eq)]
pub enum ArgError {
    /// `--help` was asked for.
    Help,
    /// Anything else, with the message to print.
    Bad(String),
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgError::Help => f.write_str("help requested"),
            ArgError::Bad(m) => f.write_str(m),
        }
    }
}

/// The usage text.
pub const USAGE: &str = "\
usage: pingpong [--server [ADDR] | --client HOST[:PORT]] [OPTIONS]

  (no role)            both sides in one process over loopback, auto transport
  --server [ADDR]      serve one client (default 0.0.0.0:13337), then exit
  --client HOST[:PORT] run the sweep against a server (default port 13337)

  -s, --sizes LIST     sizes: MIN:MAX (powers of 2) or a comma list; K/KiB/M/MiB suffixes
                       (default 1:16M)
  -n, --iters N        timed iterations per size (default: ~32 MiB per size, 5..1000)
  -w, --warmup N       untimed iterations first (default: a tenth of -n, at least 1)
      --bw             bandwidth mode: a sliding window of outstanding sends, one ack at the end
      --window N       sends outstanding at most in bandwidth mode (default 16)
      --json           one JSON document on stdout instead of the table
      --progress       progress lines on stderr even when it is not a terminal
      --no-progress    no progress lines
  -h, --help           this text

Environment: RDMX_TRANSPORT (auto|rdma|tcp), RDMX_EAGER_THRESHOLD and the other RDMX_*
settings (see rdmx-info). Latency is one-way: half the round trip. MB = 2^20 bytes.";

fn bad(m: impl Into<String>) -> ArgError {
    ArgError::Bad(m.into())
}

/// Parses a byte count with an optional K/KiB/M/MiB/G/GiB suffix (1024-based).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("`{s}` is not a size (e.g. 64, 8K, 1MiB)"));
    }
    let n: usize = num.parse().map_err(|_| format!("`{s}` is too large"))?;
    let mult: usize = match unit.trim() {
        "" | "B" | "b" => 1,
        "k" | "K" | "KiB" | "KB" | "kB" => 1 << 10,
        "m" | "M" | "MiB" | "MB" => 1 << 20,
        "g" | "G" | "GiB" | "GB" => 1 << 30,
        u => {
            return Err(format!(
                "`{s}`: unknown unit `{u}` (use K, KiB, M, MiB, G or GiB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// Parses a comma-separated list whose items are sizes or ranges `MIN:MAX` (powers of two
/// from MIN, then MAX), e.g. `1:1K,100K`.
pub fn parse_sizes(s: &str) -> Result<Vec<usize>, String> {
    let mut sizes = Vec::new();
    for item in s.split(',') {
        match item.split_once(':') {
            Some((lo, hi)) => sizes.extend(parse_range(item, lo, hi)?),
            None => sizes.push(parse_size(item)?),
        }
    }
    if let Some(&big) = sizes.iter().find(|&&n| n > MAX_SIZE) {
        return Err(format!("size {big} exceeds the {MAX_SIZE}-byte limit"));
    }
    Ok(sizes)
}

fn parse_range(item: &str, lo: &str, hi: &str) -> Result<Vec<usize>, String> {
    let (lo, hi) = (parse_size(lo)?, parse_size(hi)?);
    if lo > hi {
        return Err(format!("`{item}`: the range starts above its end"));
    }
    if hi > MAX_SIZE {
        return Err(format!("size {hi} exceeds the {MAX_SIZE}-byte limit"));
    }
    let mut v = vec![lo];
    let mut n = lo.max(1);
    while n < hi {
        if n > lo {
            v.push(n);
        }
        n *= 2;
    }
    if hi > lo {
        v.push(hi);
    }
    Ok(v)
}

fn parse_count(flag: &str, v: &str) -> Result<usize, ArgError> {
    v.trim()
        .parse()
        .map_err(|_| bad(format!("{flag}: `{v}` is not a whole number")))
}

/// Parses the arguments after the program name.
pub fn parse(argv: &[String]) -> Result<Args, ArgError> {
    let mut role = Role::Loopback;
    let mut role_seen = false;
    let mut plan = Plan {
        sizes: parse_sizes("1:16M").map_err(bad)?,
        iters: None,
        warmup: None,
        window: None,
    };
    let mut bw = false;
    let mut window = None;
    let mut json = false;
    let mut progress = None;
    let mut it = argv.iter().peekable();
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| bad(format!("{flag} needs a value (see --help)")))
        };
        match arg.as_str() {
            "-h" | "--help" => return Err(ArgError::Help),
            "--server" | "--client" if role_seen => {
                return Err(bad("give one of --server and --client, once"))
            }
            "--server" => {
                role_seen = true;
                let addr = match it.peek() {
                    Some(a) if !a.starts_with('-') => it.next().cloned().unwrap_or_default(),
                    _ => format!("0.0.0.0:{DEFAULT_PORT}"),
                };
                role = Role::Server(with_port(&addr)?);
            }
            "--client" => {
                role_seen = true;
                let host = value("--client")?;
                role = Role::Client(with_port(&host)?);
            }
            "-s" | "--sizes" => {
                let v = value(arg)?;
                plan.sizes = parse_sizes(&v).map_err(|e| bad(format!("{arg}: {e}")))?;
            }
            "-n" | "--iters" => plan.iters = Some(parse_count(arg, &value(arg)?)?),
            "-w" | "--warmup" => plan.warmup = Some(parse_count(arg, &value(arg)?)?),
            "--window" => window = Some(parse_count(arg, &value(arg)?)?),
            "--bw" => bw = true,
            "--json" => json = true,
            "--progress" => progress = Some(true),
            "--no-progress" => progress = Some(false),
            other => return Err(bad(format!("unknown argument `{other}` (see --help)"))),
        }
    }
    if window.is_some() && !bw {
        return Err(bad("--window applies to --bw only"));
    }
    if bw {
        plan.window = Some(window.unwrap_or(16));
    }
    plan.validate().map_err(bad)?;
    Ok(Args {
        role,
        plan,
        json,
        progress,
    })
}

/// `HOST` or `HOST:PORT` (IPv6 as `[::1]:PORT`) → `HOST:PORT`, checking the port.
fn with_port(addr: &str) -> Result<String, ArgError> {
    let addr = addr.trim();
    if addr.is_empty() {
        return Err(bad("empty address"));
    }
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let (h, tail) = rest
            .split_once(']')
            .ok_or_else(|| bad(format!("`{addr}`: missing `]`")))?;
        (format!("[{h}]"), tail.strip_prefix(':'))
    } else if addr.matches(':').count() > 1 {
        (format!("[{addr}]"), None)
    } else {
        match addr.split_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (addr.to_string(), None),
        }
    };
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| bad(format!("`{addr}`: `{p}` is not a port number")))?,
    };
    Ok(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, ArgError> {
        let v: Vec<String> = s.split_whitespace().map(String::from).collect();
        parse(&v)
    }

    #[test]
    fn defaults_are_a_loopback_sweep_from_1_byte_to_16_mib() {
        let a = args("").unwrap();
        assert_eq!(a.role, Role::Loopback);
        assert_eq!(a.plan.sizes.len(), 25);
        assert_eq!(a.plan.sizes[0], 1);
        assert_eq!(*a.plan.sizes.last().unwrap(), 16 << 20);
        assert_eq!(a.plan.window, None);
        assert_eq!(a.plan.iters_for(1), 1000);
        assert_eq!(a.plan.iters_for(16 << 20), 5);
        assert_eq!(a.plan.warmup_for(1), 100);
        assert_eq!(a.plan.warmup_for(16 << 20), 1);
    }

    #[test]
    fn roles_and_addresses() {
        assert_eq!(
            args("--server").unwrap().role,
            Role::Server("0.0.0.0:13337".into())
        );
        assert_eq!(
            args("--server 10.0.0.1:99 -n 3").unwrap().role,
            Role::Server("10.0.0.1:99".into())
        );
        assert_eq!(
            args("--client example -n 3").unwrap().role,
            Role::Client("example:13337".into())
        );
        assert_eq!(
            args("--client [::1]:5").unwrap().role,
            Role::Client("[::1]:5".into())
        );
        assert_eq!(
            args("--client ::1").unwrap().role,
            Role::Client("[::1]:13337".into())
        );
    }

    #[test]
    fn size_lists_and_ranges() {
        assert_eq!(parse_sizes("1,8K,1MiB").unwrap(), vec![1, 8192, 1 << 20]);
        assert_eq!(parse_sizes("0:4").unwrap(), vec![0, 1, 2, 4]);
        assert_eq!(parse_sizes("3:20").unwrap(), vec![3, 6, 12, 20]);
        assert_eq!(parse_sizes("64").unwrap(), vec![64]);
        assert_eq!(parse_sizes("4:4").unwrap(), vec![4]);
        assert_eq!(parse_sizes("1:4,100K").unwrap(), vec![1, 2, 4, 100 << 10]);
        assert!(parse_sizes("8:4").is_err());
        assert!(parse_sizes("2G").is_err());
        assert!(parse_sizes("1,x").unwrap_err().contains("`x`"));
        assert!(parse_sizes("5Q").unwrap_err().contains("unknown unit"));
        assert!(parse_sizes("99999999999999999999").is_err());
        assert!(parse_sizes("").is_err());
    }

    #[test]
    fn mistakes_are_one_clear_message() {
        let msg = |s| match args(s) {
            Err(ArgError::Bad(m)) => m,
            other => panic!("{s}: {other:?}"),
        };
        assert!(msg("--frobnicate").contains("unknown argument `--frobnicate`"));
        assert!(msg("-n").contains("-n needs a value"));
        assert!(msg("-n ten").contains("`ten` is not a whole number"));
        assert!(msg("-n 0").contains("at least 1"));
        assert!(msg("--window 4").contains("--bw only"));
        assert!(msg("--bw --window 0").contains("window 0"));
        assert!(msg("--bw --window 4096 -s 1M").contains("needs more than"));
        assert!(msg("--client").contains("--client needs a value"));
        assert!(msg("--client h:70000").contains("not a port number"));
        assert!(msg("--server --client x").contains("once"));
        assert!(msg("-s 1:2:3").contains("-s"));
        assert_eq!(args("--help").unwrap_err(), ArgError::Help);
    }

    #[test]
    fn bandwidth_mode() {
        let a = args("--bw -s 1M -n 64").unwrap();
        assert_eq!(a.plan.window, Some(16));
        assert_eq!(a.plan.iters_for(1 << 20), 64);
        assert_eq!(args("--bw --window 8").unwrap().plan.window, Some(8));
    }
}
