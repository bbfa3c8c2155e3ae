//! `rdmx-bench atomics`: how many atomic read-modify-write instructions (x86 `lock`-prefixed
//! instructions and `xchg` with memory) a program executes per round trip — the cost a
//! single-threaded mode would remove (each is a full barrier, some 2–3 ns uncontended on
//! today's cores, and far more when another core owns the line).
//!
//! Deterministic, like callgrind's instruction count: two callgrind runs of the same program
//! with different round-trip counts, recorded per instruction
//! (`valgrind --tool=callgrind --dump-instr=yes --compress-pos=no --compress-strings=no`),
//! and `objdump -d` of each object to find which of the executed instructions are atomic.
//! The difference of the two runs divided by the difference in round trips cancels setup.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Error, Result};

/// Executions per instruction address, per object file.
pub type Counts = HashMap<(String, u64), u64>;

/// Reads a callgrind output written with `--dump-instr=yes --compress-pos=no
/// --compress-strings=no`: each cost line is `0xADDR LINE IR` under an `ob=` object; the
/// line after `calls=` is the inclusive cost of a call and is not the instruction's own.
pub fn parse_callgrind(file: &Path, text: &str) -> Result<Counts> {
    let mut counts = Counts::new();
    let mut object = String::new();
    let mut after_calls = false;
    for (i, line) in text.lines().enumerate() {
        if let Some(ob) = line.strip_prefix("ob=") {
            object = ob.trim().to_string();
        } else if line.starts_with("calls=") {
            after_calls = true;
            continue;
        } else if let Some(rest) = line.strip_prefix("0x") {
            if !after_calls {
                let mut fields = rest.split_whitespace();
                let addr = fields
                    .next()
                    .and_then(|a| u64::from_str_radix(a, 16).ok())
                    .ok_or_else(|| Error::parse(file, i + 1, "bad instruction address"))?;
                let ir = fields
                    .last()
                    .and_then(|n| n.parse::<u64>().ok())
                    .ok_or_else(|| Error::parse(file, i + 1, "bad instruction count"))?;
                *counts.entry((object.clone(), addr)).or_default() += ir;
            }
        } else if line.starts_with("fl=") && line.contains('(') {
            return Err(Error::parse(
                file,
                i + 1,
                "compressed names: record with --compress-strings=no --compress-pos=no",
            ));
        }
        after_calls = false;
    }
    if counts.is_empty() {
        return Err(Error::File {
            file: file.to_path_buf(),
            msg: "no per-instruction costs: record with --dump-instr=yes".into(),
        });
    }
    Ok(counts)
}

/// The addresses of atomic read-modify-write instructions in `objdump -d` output, with
/// their text.
pub fn atomic_instructions(disassembly: &str) -> BTreeMap<u64, String> {
    let mut found = BTreeMap::new();
    for line in disassembly.lines() {
        let Some((addr, insn)) = line.trim_start().split_once(':') else {
            continue;
        };
        let Ok(addr) = u64::from_str_radix(addr, 16) else {
            continue;
        };
        let insn = insn.trim();
        // `xchg` with a memory operand is locked implicitly.
        if insn.starts_with("lock ") || (insn.starts_with("xchg") && insn.contains('(')) {
            found.insert(addr, insn.to_string());
        }
    }
    found
}

/// What `atomics` is asked: the program and its two callgrind runs.
#[derive(Debug, PartialEq, clap::Args)]
pub struct AtomicsOptions {
    /// The program both runs recorded
    pub program: PathBuf,
    /// The callgrind output of the run with fewer round trips (recorded with
    /// --dump-instr=yes --compress-pos=no --compress-strings=no)
    pub short: PathBuf,
    /// The run with more
    pub long: PathBuf,
    /// How many more round trips the long run made
    #[arg(long, value_name = "N")]
    pub trips: u64,
}

/// Atomic instructions executed per round trip: the whole program and the part in `main`
/// (the program's own object, as opposed to shared libraries).
#[derive(Debug, Clone, PartialEq)]
pub struct PerTrip {
    /// All objects.
    pub total: f64,
    /// The program itself (statically linked Rust code).
    pub program: f64,
}

/// Compares the short and long runs of `program` (see the module docs).
pub fn per_trip(program: &Path, short: &Counts, long: &Counts, trips: u64) -> Result<PerTrip> {
    if trips == 0 {
        return Err(Error::Usage(
            "atomics: the runs must differ in round trips".into(),
        ));
    }
    // Callgrind names objects by absolute path.
    let program = std::fs::canonicalize(program).map_err(|source| Error::Io {
        file: program.to_path_buf(),
        source,
    })?;
    let objects: Vec<&String> = {
        let mut o: Vec<&String> = long.keys().map(|(ob, _)| ob).collect();
        o.sort();
        o.dedup();
        o
    };
    let (mut total, mut own) = (0i128, 0i128);
    for object in objects {
        if !Path::new(object).is_file() {
            continue;
        }
        let out = Command::new("objdump")
            .args(["-d", "--no-show-raw-insn"])
            .arg(object)
            .output()
            .map_err(|source| Error::Io {
                file: PathBuf::from("objdump"),
                source,
            })?;
        let text = String::from_utf8_lossy(&out.stdout);
        for addr in atomic_instructions(&text).keys() {
            let key = (object.clone(), *addr);
            let d = i128::from(long.get(&key).copied().unwrap_or(0))
                - i128::from(short.get(&key).copied().unwrap_or(0));
            total += d;
            if Path::new(object) == program {
                own += d;
            }
        }
    }
    Ok(PerTrip {
        total: total as f64 / trips as f64,
        program: own as f64 / trips as f64,
    })
}

/// Reads and parses a callgrind output file.
pub fn read_callgrind(file: &Path) -> Result<Counts> {
    let text = std::fs::read_to_string(file).map_err(|source| Error::Io {
        file: file.to_path_buf(),
        source,
    })?;
    parse_callgrind(file, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
version: 1
positions: instr line
events: Ir
ob=/bin/prog
fl=/src/a.rs
fn=f
0x1000 3 5
0x1004 3 5
calls=5 0x2000 9
0x1008 4 700
0x1008 4 5
ob=/lib/libc.so
fn=g
0x10 1 2
";

    #[test]
    fn call_costs_are_not_counted_as_the_instruction_s_own() {
        let c = parse_callgrind(Path::new("x"), SAMPLE).unwrap();
        assert_eq!(c[&("/bin/prog".to_string(), 0x1000)], 5);
        assert_eq!(c[&("/bin/prog".to_string(), 0x1008)], 5);
        assert_eq!(c[&("/lib/libc.so".to_string(), 0x10)], 2);
    }

    #[test]
    fn bad_lines_are_errors_naming_the_line() {
        let e = parse_callgrind(Path::new("cg"), "ob=/x\n0xzz 1 2\n").unwrap_err();
        assert_eq!(e.to_string(), "cg:2: bad instruction address");
        let e = parse_callgrind(Path::new("cg"), "ob=/x\n0x10 1 many\n").unwrap_err();
        assert_eq!(e.to_string(), "cg:2: bad instruction count");
        assert!(parse_callgrind(Path::new("cg"), "events: Ir\n").is_err());
        assert!(parse_callgrind(Path::new("cg"), "fl=(1) /a.rs\n").is_err());
    }

    #[test]
    fn locked_and_memory_xchg_instructions_are_atomic() {
        let dis = "\
0000000000001000 <f>:
    1000:\tlock cmpxchg %cl,(%rdi)
    1005:\txchg   %rcx,0x10(%rax)
    100a:\txchg   %ax,%ax
    100c:\tmov    (%rdi),%rax
    1010:\tlock xadd %rax,(%rdi)
";
        let found = atomic_instructions(dis);
        assert_eq!(
            found.keys().copied().collect::<Vec<_>>(),
            [0x1000, 0x1005, 0x1010]
        );
    }
}
