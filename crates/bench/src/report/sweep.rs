//! The eager-threshold sweep: where rendezvous overtakes eager, and the verdict on the
//! default threshold.

use super::*;

/// The crossover between the rendezvous-only run (threshold 0) and the largest-threshold run.
#[derive(Debug, Clone, PartialEq)]
pub enum Crossover {
    /// Rendezvous has the lower p50 from this size on (and at the next measured size).
    At {
        /// The crossover size.
        size: u64,
        /// The next measured size, where rendezvous also wins.
        next: u64,
        /// Largest compared size below the crossover, if any.
        below: Option<u64>,
    },
    /// Rendezvous never wins (confirmed) at any compared size up to `up_to`.
    NoneBelow {
        /// Largest compared size (the largest-threshold run still eager there).
        up_to: u64,
        /// Rendezvous won at this last size alone, with no larger eager size to confirm it.
        unconfirmed: Option<u64>,
    },
    /// Cannot be computed from the data.
    Unknown(String),
}

/// Computes the crossover from a threshold sweep (threshold → latency document).
pub fn crossover(sweep: &BTreeMap<u64, PingpongDoc>) -> Crossover {
    let Some(rndv) = sweep.get(&0) else {
        return Crossover::Unknown("no threshold-0 (all rendezvous) run".into());
    };
    let Some((&tmax, eager)) = sweep.iter().next_back().filter(|(&t, _)| t > 0) else {
        return Crossover::Unknown("no run with a threshold above 0".into());
    };
    let sizes: Vec<(u64, f64, f64)> = eager
        .results
        .iter()
        .filter(|r| r.protocol == "eager")
        .filter_map(|e| rndv.row(e.size).map(|r| (e.size, (r.p50_us, e.p50_us))))
        .collect::<BTreeMap<_, _>>()
        .into_iter()
        .map(|(s, (r, e))| (s, r, e))
        .collect();
    let Some(&(last, r_last, e_last)) = sizes.last() else {
        return Crossover::Unknown(format!(
            "the threshold-{tmax} run has no eager size that the threshold-0 run also measured"
        ));
    };
    for (i, w) in sizes.windows(2).enumerate() {
        let ((s, r, e), (n, rn, en)) = (w[0], w[1]);
        if r < e && rn < en {
            return Crossover::At {
                size: s,
                next: n,
                below: i.checked_sub(1).map(|j| sizes[j].0),
            };
        }
    }
    Crossover::NoneBelow {
        up_to: last,
        unconfirmed: (r_last < e_last).then_some(last),
    }
}

/// What a crossover says about the default threshold.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The data supports the default.
    Supports,
    /// The data suggests a higher threshold (at least this many bytes).
    Raise(u64),
    /// The data suggests a lower threshold (below this size).
    Lower(u64),
    /// The data does not decide.
    Inconclusive,
}

/// Judges `default` (bytes) against a crossover.
pub fn verdict(c: &Crossover, default: u64) -> Verdict {
    match *c {
        Crossover::At { size, below, .. } => {
            if size <= default {
                Verdict::Lower(size)
            } else {
                match below {
                    Some(b) if b > default => Verdict::Raise(b),
                    _ => Verdict::Supports,
                }
            }
        }
        Crossover::NoneBelow { up_to, .. } => {
            if up_to > default {
                Verdict::Raise(up_to)
            } else {
                Verdict::Inconclusive
            }
        }
        Crossover::Unknown(_) => Verdict::Inconclusive,
    }
}

pub(super) fn mem(threshold: u64) -> String {
    fmt_bytes(SRQ_DEPTH * (threshold + HEADER_BYTES))
}

pub(super) fn sweep_section(out: &mut String, data: &RunData) {
    let _ = writeln!(out, "## Eager threshold sweep\n");
    let _ = writeln!(
        out,
        "rdmx p50 one-way latency (µs) with `RDMX_EAGER_THRESHOLD=T`; the letter is the \
         protocol each message used (e = eager, r = rendezvous, s = stream). T = 0 sends \
         everything by rendezvous.\n"
    );
    let mut results = Vec::new();
    for t in [&data.rdma, &data.tcp, &data.shm] {
        let _ = writeln!(out, "### {}\n", t.title);
        if t.thresholds.is_empty() {
            let _ = writeln!(out, "Not measured (no `{}/threshold-<T>.json`).\n", t.sub);
            continue;
        }
        let sizes: BTreeSet<u64> = t
            .thresholds
            .values()
            .flat_map(|d| d.results.iter().map(|r| r.size))
            .collect();
        let mut header = vec!["size".to_string()];
        header.extend(
            t.thresholds
                .keys()
                .map(|&th| format!("T = {}", fmt_bytes(th))),
        );
        let rows: Vec<Vec<String>> = sizes
            .iter()
            .map(|&s| {
                let mut cells = vec![format_size(s)];
                for d in t.thresholds.values() {
                    cells.push(d.row(s).map_or(DASH.to_string(), |r| {
                        let p = r.protocol.chars().next().unwrap_or('?');
                        format!("{} {p}", fmt_num(r.p50_us))
                    }));
                }
                cells
            })
            .collect();
        md_table(out, &header, &rows, &[]);
        let c = crossover(&t.thresholds);
        let tmax = t.thresholds.keys().next_back().copied().unwrap_or(0);
        let line = match &c {
            Crossover::At { size, next, .. } => {
                let (r, e) = (&t.thresholds[&0], &t.thresholds[&tmax]);
                let at = |d: &PingpongDoc, s: u64| d.row(s).map_or(0.0, |x| x.p50_us);
                format!(
                    "crossover at **{}**: rendezvous (T = 0) p50 {} µs vs eager (T = {}) {} µs, \
                     and rendezvous stays faster at {} ({} vs {} µs).",
                    format_size(*size),
                    fmt_num(at(r, *size)),
                    fmt_bytes(tmax),
                    fmt_num(at(e, *size)),
                    format_size(*next),
                    fmt_num(at(r, *next)),
                    fmt_num(at(e, *next)),
                )
            }
            Crossover::NoneBelow { up_to, unconfirmed } => {
                let mut s = format!(
                    "no crossover below {}: eager (T = {}) is as fast as or faster than \
                     rendezvous at every compared size.",
                    format_size(*up_to),
                    fmt_bytes(tmax)
                );
                if let Some(u) = unconfirmed {
                    let _ = write!(
                        s,
                        " (Rendezvous was faster at {} alone, the largest eager size measured, \
                         so no larger size confirms it.)",
                        format_size(*u)
                    );
                }
                s
            }
            Crossover::Unknown(why) => format!("crossover not computable: {why}."),
        };
        let _ = writeln!(out, "{}: {line}\n", t.title);
        results.push((t, c));
    }
    if results.is_empty() {
        return;
    }

    // The defaults and the memory argument, per transport.
    let default_of = |t: &Transport| {
        let tcp = t.name == "tcp";
        let file = format!("{}/rdmx-lat.json", t.sub);
        match t
            .lat
            .doc
            .as_ref()
            .and_then(|d| d.eager_threshold.or(d.eager_limit))
        {
            Some(d) => (d, format!("as `{file}` reports it")),
            None if tcp => (
                TCP_EAGER_THRESHOLD,
                format!("rdmx's built-in TCP default; `{file}` does not report one"),
            ),
            None => (
                DEFAULT_EAGER_THRESHOLD,
                format!("rdmx's built-in default; `{file}` does not report one"),
            ),
        }
    };
    let mut p = String::from("**Default vs data.** ");
    let mut verdicts = Vec::new();
    for (t, c) in &results {
        let (tcp, shm) = (t.name == "tcp", t.name == "shm");
        let (default, source) = default_of(t);
        let mut intro = format!(
            "{}: the eager threshold was {default} B ({source})",
            t.title
        );
        if shm {
            intro.push_str(
                ". Over shared memory an eager frame goes through the connection's ring, whose \
                 memory is fixed (256 KiB each way), so a larger threshold costs no receive \
                 memory; an eager message is copied twice (into the ring and out of it), a \
                 rendezvous once (by CMA, straight into the receive buffer). ",
            );
        } else if tcp {
            intro.push_str(
                ". A TCP receiver allocates each frame as it arrives, so a larger threshold \
                 costs no pre-posted memory (at most credits × frame size per connection while \
                 messages are in flight), and rdmx's TCP default is 64 KiB − 40 B = \
                 65496 B. ",
            );
        } else {
            if default == DEFAULT_EAGER_THRESHOLD {
                intro.push_str(": the 8 KiB receive buffer minus the 40 B message header");
            }
            let _ = write!(
                intro,
                ". Eager messages land in buffers pre-posted on the SRQ, so receive memory per \
                 worker is SRQ depth × buffer size = {SRQ_DEPTH} × {} = {}; a threshold T \
                 needs buffers of T + {HEADER_BYTES} B, i.e. {SRQ_DEPTH} × (T + {HEADER_BYTES}) \
                 B per worker. ",
                fmt_bytes(default + HEADER_BYTES),
                mem(default)
            );
        }
        let v = verdict(c, default);
        let s = match (&v, c) {
            (Verdict::Lower(s), _) => format!(
                "Rendezvous already wins at {} ≤ {default} B, so the data suggests a \
                 threshold below {} (which would also shrink receive buffers).",
                format_size(*s),
                format_size(*s)
            ),
            (Verdict::Raise(t), Crossover::At { size, .. }) if shm => format!(
                "Eager stays faster up to {} and loses from {}, so the data suggests \
                 raising the threshold to about {} (the ring's memory stays as it is).",
                format_size(*t),
                format_size(*size),
                format_size(*t),
            ),
            (Verdict::Raise(t), Crossover::At { size, .. }) => format!(
                "Eager stays faster up to {} and loses from {}, so the data suggests \
                 raising the threshold to about {}, at {} of receive memory per worker instead \
                 of {}.",
                format_size(*t),
                format_size(*size),
                format_size(*t),
                mem(*t),
                mem(default)
            ),
            (Verdict::Raise(t), _) if tcp || shm => format!(
                "Eager is not slower than rendezvous up to {} (above that threshold), and over \
                 {} that costs no memory up front: the data supports a threshold of at least {}.",
                format_size(*t),
                if tcp { "TCP" } else { "shared memory" },
                format_size(*t),
            ),
            (Verdict::Raise(t), _) => format!(
                "Eager is not slower than rendezvous up to {} (above that threshold), so a \
                 threshold of at least {} would not cost latency; it would cost {} of receive \
                 memory per worker instead of {} — the data suggests raising it only where that \
                 memory is affordable.",
                format_size(*t),
                format_size(*t),
                mem(*t),
                mem(default)
            ),
            (Verdict::Supports, Crossover::At { size, below, .. }) => format!(
                "The crossover lies between {} and {}, bracketing the default: the \
                 data supports it.",
                below.map_or("the smallest size".to_string(), format_size),
                format_size(*size)
            ),
            (Verdict::Supports, _) => "The data supports that threshold.".to_string(),
            (Verdict::Inconclusive, _) => "The sweep does not reach past the default or lacks \
                                           the runs needed, so it neither supports nor \
                                           contradicts it."
                .to_string(),
        };
        verdicts.push(format!("{intro}{s}"));
    }
    p.push_str(&verdicts.join("\n\n"));
    let _ = writeln!(out, "{p}\n");
}
