//! `rdmx-bench`: the socket-pingpong baseline, the benchmark report and the scripts' helpers.
//! See `rdmx-bench --help` and the `rdmx_bench` library docs.

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use rdmx_bench::inputs::{figure, Figure};
use rdmx_bench::plan::{default_warmup, iterations, SizeList, SweepArgs};
use rdmx_bench::report::{self, ReportOptions};
use rdmx_bench::schema::{table_columns, table_row, table_title};
use rdmx_bench::sizes::{parse_size, parse_sizes};
use rdmx_bench::{atomics, cli, line_rtt, socket, Error, Result};

/// rdmx benchmark tools.
#[derive(Parser)]
#[command(
    name = "rdmx-bench",
    subcommand_required = true,
    arg_required_else_help = false
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Raw TCP ping-pong (TCP_NODELAY, polled): the no-middleware baseline. Latency times are
    /// one-way (half the round trip); MB = 2^20 bytes
    SocketPingpong(SocketArgs),
    /// Write BENCHMARKS.md and the SVG plots from the raw results in DIR (meta.env, guest/*,
    /// host/*, as scripts/bench leaves them)
    Report(ReportOptions),
    /// Atomic read-modify-write instructions per round trip from two callgrind runs; prints
    /// `TOTAL PROGRAM` (all objects, and PROGRAM's own code)
    Atomics(atomics::AtomicsOptions),
    /// Print the round trip of a cache line between two threads, in ns: the host's
    /// core-to-core latency, which every shared-memory figure moves with
    LineRtt {
        /// Round trips to time
        #[arg(long, default_value_t = 2_000_000)]
        trips: u64,
    },
    /// Print the sizes of a size list (e.g. 1:16M or 1,4K,64K), one byte count per line
    Sizes {
        /// The size list
        #[arg(value_parser = parse_sizes)]
        list: SizeList,
    },
    /// Print the default `ITERATIONS WARMUP` for a message size (about 32 MiB, 5 to 1000; a
    /// tenth as warm-up)
    Iters {
        /// The message size (K, M suffixes allowed)
        #[arg(value_parser = parse_size)]
        size: u64,
        /// A run on one host's counts instead (about 256 MiB, 100 to 100 000): the
        /// sweeps' `--host-iters`
        #[arg(long)]
        host: bool,
    },
    /// Print one figure of a tool's output FILE (nothing when it holds none): the number the
    /// scripts compare across runs
    Figure {
        /// Which figure
        #[arg(value_enum)]
        which: Figure,
        /// The tool's output
        file: PathBuf,
        /// The message size whose row to take [default: the last row]
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
    },
}

#[derive(clap::Args)]
struct SocketArgs {
    /// Serve one client session on ADDR (port 0 = any), print `listening on HOST:PORT` on
    /// stderr, then exit
    #[arg(long, value_name = "ADDR", required_unless_present = "client",
          conflicts_with_all = ["client", "sizes", "iters", "warmup", "bw", "window", "json"])]
    server: Option<String>,
    /// Run the sweep against the server at HOST:PORT
    #[arg(long, value_name = "HOST:PORT")]
    client: Option<String>,
    #[command(flatten)]
    sweep: SweepArgs,
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Cli = cli::parse_or_exit("rdmx-bench");
    if let Err(e) = run(args.command) {
        eprintln!("rdmx-bench: {e}");
        std::process::exit(e.exit_code());
    }
}

fn run(command: Command) -> Result<()> {
    let mut out = String::new();
    match command {
        Command::SocketPingpong(a) => match (a.server, a.client) {
            (Some(addr), _) => {
                let l = socket::bind(&addr)?;
                let local = l
                    .local_addr()
                    .map_err(|e| Error::net("reading the bound address", e))?;
                eprintln!("rdmx-bench socket-pingpong: listening on {local}");
                return socket::serve_one(&l);
            }
            (None, client) => {
                let plan = a.sweep.plan().map_err(Error::Usage)?;
                let doc = socket::run_client(&client.unwrap_or_default(), &plan)?;
                if a.sweep.json {
                    out = doc.to_json();
                } else {
                    out = format!(
                        "{}\n# transport tcp, server {}\n# times in µs; MB = 2^20 bytes\n{}\n",
                        table_title("socket-pingpong", doc.window, doc.results.len()),
                        doc.peer.as_deref().unwrap_or("?"),
                        table_columns()
                    );
                    for r in &doc.results {
                        out += &table_row(r);
                        out.push('\n');
                    }
                }
            }
        },
        Command::Report(opts) => {
            for f in report::generate(&opts)? {
                eprintln!("rdmx-bench report: wrote {}", f.display());
            }
        }
        Command::Atomics(o) => {
            let short = atomics::read_callgrind(&o.short)?;
            let long = atomics::read_callgrind(&o.long)?;
            let per = atomics::per_trip(&o.program, &short, &long, o.trips)?;
            out = format!("{:.1} {:.1}\n", per.total, per.program);
        }
        Command::LineRtt { trips } => {
            let r = line_rtt::measure(trips);
            out = format!("{:.1}\n", r.per_trip.as_secs_f64() * 1e9);
        }
        Command::Sizes { list } => list.iter().for_each(|s| out += &format!("{s}\n")),
        Command::Iters { size, host } => {
            let n = iterations(size, host);
            out = format!("{n} {}\n", default_warmup(n));
        }
        Command::Figure { which, file, size } => {
            let text = std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?;
            if let Some(v) = figure(which, &text, &file, size)? {
                out = format!("{v}\n");
            }
        }
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| Error::io("<stdout>", e))
}
