//! Command-line parsing and dispatch (hand-written: the crate has no CLI dependency).

use std::io::Write;
use std::path::PathBuf;

use crate::atomics;
use crate::report::{self, ReportOptions};
use crate::sizes::parse_sizes;
use crate::socket::{self, ClientOptions, DEFAULT_SIZES, DEFAULT_WINDOW};
use crate::{Error, Result};

/// The `--help` text.
pub const USAGE: &str = "\
rdmx-bench — rdmx benchmark tools

USAGE:
  rdmx-bench socket-pingpong --server ADDR
  rdmx-bench socket-pingpong --client HOST:PORT [--sizes LIST] [-n ITERS] [--warmup N]
                                                [--bw] [--window W] [--json]
  rdmx-bench report DIR [--out FILE] [--svg-dir DIR2]
  rdmx-bench atomics PROGRAM SHORT LONG --trips N
  rdmx-bench --help

socket-pingpong: raw TCP ping-pong (TCP_NODELAY, polled), the no-middleware baseline.
  --server ADDR     serve one client session on ADDR (e.g. 127.0.0.1:13400; port 0 = any),
                    print `listening on HOST:PORT` on stderr, then exit
  --client H:P      run against a server
  --sizes LIST      comma list of byte counts (suffix K, KiB, M, MiB = 1024-based) or
                    ranges MIN:MAX = powers of two from MIN to MAX (MIN, its doublings
                    below MAX, then MAX when the bounds are not powers of two)
                                                                          [default 1:16M]
  -n ITERS          measured iterations per size    [default clamp(32 MiB / size, 5, 1000)]
  --warmup N        warm-up iterations per size     [default max(1, iterations / 10)]
  --bw              bandwidth mode: messages streamed client -> server, one 1-byte ack at
                    the end of the warm-up and of the timed run
  --window W        counts are rounded up to multiples of W (as rdmx's)  [default 16]
  --json            print the pingpong JSON schema instead of a table
  Latency times are one-way (half round trip); MB = 2^20 bytes.

report: write the Markdown report and SVG plots from the raw results in DIR
  (meta.env, guest/*, host/* as left by scripts/bench).
  --out FILE        Markdown file to write                     [default ./BENCHMARKS.md]
  --svg-dir DIR2    where bench-rdma.svg and bench-tcp.svg go  [default ./docs]

atomics: atomic read-modify-write instructions (lock-prefixed, xchg with memory) executed
  per round trip, from two callgrind runs of PROGRAM (SHORT and LONG, recorded with
  --dump-instr=yes --compress-pos=no --compress-strings=no) that differ by N round trips.
  Prints `TOTAL PROGRAM`: all objects, and PROGRAM's own code (without shared libraries).
";

/// Runs the command line `args` (without the program name).
pub fn run(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        None => Err(Error::Usage("missing subcommand".into())),
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            Ok(())
        }
        Some("socket-pingpong") => socket_pingpong(&args[1..]),
        Some("report") => report_cmd(&args[1..]),
        Some("atomics") => atomics_cmd(&args[1..]),
        Some(other) => Err(Error::Usage(format!("unknown subcommand `{other}`"))),
    }
}

/// Splits `--flag=value` into two arguments; leaves everything else alone.
fn normalize(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    for a in args {
        match a.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                out.push(flag.to_string());
                out.push(value.to_string());
            }
            _ => out.push(a.clone()),
        }
    }
    out
}

/// A cursor over arguments that hands out flag values with good errors.
struct Args {
    items: Vec<String>,
    pos: usize,
}

impl Args {
    fn new(args: &[String]) -> Self {
        Args {
            items: normalize(args),
            pos: 0,
        }
    }

    fn next(&mut self) -> Option<String> {
        let a = self.items.get(self.pos).cloned();
        self.pos += 1;
        a
    }

    fn value(&mut self, flag: &str) -> Result<String> {
        match self.next() {
            Some(v) if !v.starts_with('-') || v.len() == 1 => Ok(v),
            _ => Err(Error::Usage(format!("{flag} needs a value"))),
        }
    }
}

fn set_once<T>(slot: &mut Option<T>, flag: &str, v: T) -> Result<()> {
    if slot.is_some() {
        return Err(Error::Usage(format!("{flag} given twice")));
    }
    *slot = Some(v);
    Ok(())
}

fn count(flag: &str, v: &str) -> Result<u64> {
    v.parse::<u64>()
        .map_err(|_| Error::Usage(format!("{flag}: `{v}` is not a whole number")))
}

/// Parsed `socket-pingpong` command line.
#[derive(Debug, Clone, PartialEq)]
pub enum SocketCommand {
    /// `--server ADDR`.
    Server(String),
    /// `--client HOST:PORT ...`.
    Client {
        /// `HOST:PORT`.
        addr: String,
        /// What to measure.
        opts: ClientOptions,
        /// `--json`.
        json: bool,
    },
}

/// Parses the arguments after `socket-pingpong`.
pub fn parse_socket_args(args: &[String]) -> Result<SocketCommand> {
    let mut a = Args::new(args);
    let (mut server, mut client, mut sizes, mut iters, mut warmup, mut window) =
        (None, None, None, None, None, None);
    let (mut bw, mut json) = (false, false);
    while let Some(arg) = a.next() {
        match arg.as_str() {
            "--server" => set_once(&mut server, "--server", a.value("--server")?)?,
            "--client" => set_once(&mut client, "--client", a.value("--client")?)?,
            "--sizes" => {
                let v = a.value("--sizes")?;
                let list = parse_sizes(&v).map_err(|e| Error::Usage(format!("--sizes: {e}")))?;
                set_once(&mut sizes, "--sizes", list)?;
            }
            "-n" | "--iters" | "--iterations" => {
                let v = a.value("-n")?;
                set_once(&mut iters, "-n", count("-n", &v)?)?;
            }
            "--warmup" => {
                let v = a.value("--warmup")?;
                set_once(&mut warmup, "--warmup", count("--warmup", &v)?)?;
            }
            "--window" | "-w" => {
                let v = a.value("--window")?;
                let w = u32::try_from(count("--window", &v)?)
                    .map_err(|_| Error::Usage(format!("--window: `{v}` is too large")))?;
                set_once(&mut window, "--window", w)?;
            }
            "--bw" => bw = true,
            "--json" => json = true,
            other => {
                return Err(Error::Usage(format!(
                    "socket-pingpong: unexpected argument `{other}`"
                )))
            }
        }
    }
    match (server, client) {
        (Some(_), Some(_)) => Err(Error::Usage(
            "socket-pingpong: --server and --client exclude each other".into(),
        )),
        (None, None) => Err(Error::Usage(
            "socket-pingpong: --server ADDR or --client HOST:PORT is required".into(),
        )),
        (Some(addr), None) => {
            if sizes.is_some()
                || iters.is_some()
                || warmup.is_some()
                || window.is_some()
                || bw
                || json
            {
                return Err(Error::Usage(
                    "socket-pingpong --server takes no other options (the client sends the plan)"
                        .into(),
                ));
            }
            Ok(SocketCommand::Server(addr))
        }
        (None, Some(addr)) => {
            if window.is_some() && !bw {
                return Err(Error::Usage("--window only applies with --bw".into()));
            }
            let sizes = match sizes {
                Some(s) => s,
                None => parse_sizes(DEFAULT_SIZES).map_err(Error::Usage)?,
            };
            let opts = ClientOptions {
                sizes,
                iterations: iters,
                warmup,
                bandwidth: bw,
                window: window.unwrap_or(DEFAULT_WINDOW),
            };
            Ok(SocketCommand::Client { addr, opts, json })
        }
    }
}

fn socket_pingpong(args: &[String]) -> Result<()> {
    match parse_socket_args(args)? {
        SocketCommand::Server(addr) => {
            let l = socket::bind(&addr)?;
            let local = l
                .local_addr()
                .map_err(|e| Error::net("reading the bound address", e))?;
            eprintln!("rdmx-bench socket-pingpong: listening on {local}");
            socket::serve_one(&l)
        }
        SocketCommand::Client { addr, opts, json } => {
            let doc = socket::run_client(&addr, &opts)?;
            let text = if json {
                let mut s = serde_json::to_string_pretty(&doc)
                    .map_err(|e| Error::Protocol(format!("encoding JSON: {e}")))?;
                s.push('\n');
                s
            } else {
                socket::format_table(&doc)
            };
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .map_err(|e| Error::Io {
                    file: PathBuf::from("<stdout>"),
                    source: e,
                })
        }
    }
}

/// Parses the arguments after `report`.
pub fn parse_report_args(args: &[String]) -> Result<ReportOptions> {
    let mut a = Args::new(args);
    let (mut dir, mut out, mut svg_dir) = (None, None, None);
    while let Some(arg) = a.next() {
        match arg.as_str() {
            "--out" | "-o" => set_once(&mut out, "--out", PathBuf::from(a.value("--out")?))?,
            "--svg-dir" => set_once(
                &mut svg_dir,
                "--svg-dir",
                PathBuf::from(a.value("--svg-dir")?),
            )?,
            s if s.starts_with('-') && s.len() > 1 => {
                return Err(Error::Usage(format!("report: unknown option `{s}`")))
            }
            _ => set_once(&mut dir, "DIR", PathBuf::from(arg))?,
        }
    }
    let dir = dir.ok_or_else(|| Error::Usage("report: DIR is required".into()))?;
    Ok(ReportOptions {
        dir,
        out: out.unwrap_or_else(|| PathBuf::from("BENCHMARKS.md")),
        svg_dir: svg_dir.unwrap_or_else(|| PathBuf::from("docs")),
    })
}

/// What `atomics` was asked: the program and its two callgrind runs.
#[derive(Debug, PartialEq)]
pub struct AtomicsOptions {
    /// The program both runs recorded.
    pub program: PathBuf,
    /// The run with fewer round trips.
    pub short: PathBuf,
    /// The run with more.
    pub long: PathBuf,
    /// How many more.
    pub trips: u64,
}

/// Parses the arguments after `atomics`.
pub fn parse_atomics_args(args: &[String]) -> Result<AtomicsOptions> {
    let mut a = Args::new(args);
    let (mut trips, mut files) = (None, Vec::new());
    while let Some(arg) = a.next() {
        match arg.as_str() {
            "--trips" => set_once(
                &mut trips,
                "--trips",
                count("--trips", &a.value("--trips")?)?,
            )?,
            s if s.starts_with('-') && s.len() > 1 => {
                return Err(Error::Usage(format!("atomics: unknown option `{s}`")))
            }
            _ => files.push(PathBuf::from(arg)),
        }
    }
    let trips = trips.ok_or_else(|| Error::Usage("atomics: --trips is required".into()))?;
    let [program, short, long]: [PathBuf; 3] = files.try_into().map_err(|f: Vec<PathBuf>| {
        Error::Usage(format!(
            "atomics: PROGRAM SHORT LONG expected, {} paths given",
            f.len()
        ))
    })?;
    Ok(AtomicsOptions {
        program,
        short,
        long,
        trips,
    })
}

fn atomics_cmd(args: &[String]) -> Result<()> {
    let o = parse_atomics_args(args)?;
    let short = atomics::read_callgrind(&o.short)?;
    let long = atomics::read_callgrind(&o.long)?;
    let per = atomics::per_trip(&o.program, &short, &long, o.trips)?;
    println!("{:.1} {:.1}", per.total, per.program);
    Ok(())
}

fn report_cmd(args: &[String]) -> Result<()> {
    let opts = parse_report_args(args)?;
    let written = report::generate(&opts)?;
    for f in written {
        eprintln!("rdmx-bench report: wrote {}", f.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn socket_args() {
        assert_eq!(
            parse_socket_args(&s(&["--server", "127.0.0.1:0"])).unwrap(),
            SocketCommand::Server("127.0.0.1:0".into())
        );
        let SocketCommand::Client { addr, opts, json } = parse_socket_args(&s(&[
            "--client",
            "h:1",
            "--sizes=1,4K",
            "-n",
            "7",
            "--bw",
            "--window",
            "8",
            "--json",
        ]))
        .unwrap() else {
            panic!("not a client")
        };
        assert_eq!(addr, "h:1");
        assert!(json);
        assert_eq!(opts.sizes, vec![1, 4096]);
        assert_eq!(opts.iterations, Some(7));
        assert_eq!(opts.warmup, None);
        assert!(opts.bandwidth);
        assert_eq!(opts.window, 8);
        let SocketCommand::Client { opts, json, .. } =
            parse_socket_args(&s(&["--client", "h:1"])).unwrap()
        else {
            panic!("not a client")
        };
        assert!(!json);
        assert_eq!(opts.sizes.len(), 25);
        assert_eq!(opts.window, DEFAULT_WINDOW);
    }

    #[test]
    fn bad_socket_args_are_usage_errors() {
        for bad in [
            &[][..],
            &["--server"],
            &["--server", "a:1", "--client", "b:1"],
            &["--server", "a:1", "--bw"],
            &["--client", "a:1", "--sizes", "0"],
            &["--client", "a:1", "--sizes", "1,x"],
            &["--client", "a:1", "-n", "many"],
            &["--client", "a:1", "-n", "-5"],
            &["--client", "a:1", "--window", "4"],
            &["--client", "a:1", "--bw", "--window", "99999999999"],
            &["--client", "a:1", "--frobnicate"],
            &["--client", "a:1", "-n", "1", "-n", "2"],
        ] {
            let e = parse_socket_args(&s(bad)).unwrap_err();
            assert!(matches!(e, Error::Usage(_)), "{bad:?}: {e}");
        }
    }

    #[test]
    fn atomics_args() {
        let o = parse_atomics_args(&s(&["prog", "a.cg", "b.cg", "--trips", "2000"])).unwrap();
        assert_eq!(
            o,
            AtomicsOptions {
                program: "prog".into(),
                short: "a.cg".into(),
                long: "b.cg".into(),
                trips: 2000
            }
        );
        for bad in [
            &["prog", "a.cg", "b.cg"][..],
            &["prog", "a.cg", "--trips", "5"],
            &["prog", "a.cg", "b.cg", "c.cg", "--trips", "5"],
            &["prog", "a.cg", "b.cg", "--trips", "x"],
            &["prog", "a.cg", "b.cg", "--trips", "5", "--bogus"],
        ] {
            assert!(
                matches!(parse_atomics_args(&s(bad)), Err(Error::Usage(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn report_args() {
        let o = parse_report_args(&s(&["results"])).unwrap();
        assert_eq!(o.dir, PathBuf::from("results"));
        assert_eq!(o.out, PathBuf::from("BENCHMARKS.md"));
        assert_eq!(o.svg_dir, PathBuf::from("docs"));
        let o = parse_report_args(&s(&["--out", "x/B.md", "r", "--svg-dir=img"])).unwrap();
        assert_eq!(
            (o.out, o.svg_dir),
            (PathBuf::from("x/B.md"), PathBuf::from("img"))
        );
        for bad in [&[][..], &["a", "b"], &["a", "--out"], &["a", "--pdf"]] {
            assert!(
                matches!(parse_report_args(&s(bad)), Err(Error::Usage(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(run(&s(&["plot"])), Err(Error::Usage(_))));
        assert!(matches!(run(&[]), Err(Error::Usage(_))));
    }
}
