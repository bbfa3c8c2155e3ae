//! rdmx-info: what rdmx sees on this machine, like `ucx_info` / `ibv_devinfo`: the RDMA
//! devices and their ports, which transports are usable and why not, and the effective
//! configuration with each value's source.
//!
//! `rdmx-info [-D VAR=VALUE]...` — each `-D` overrides a variable as a builder setting.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

#[cfg(feature = "rdma")]
use rdmx::conn::Device;
use rdmx::Context;

fn main() -> ExitCode {
    let mut builder = Context::builder();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let setting = match arg.as_str() {
            "-D" => args.next(),
            "-h" | "--help" => {
                println!("usage: rdmx-info [-D VAR=VALUE]...");
                return ExitCode::SUCCESS;
            }
            other => other.strip_prefix("-D").map(str::to_string),
        };
        match setting.as_deref().and_then(|s| s.split_once('=')) {
            Some((var, value)) => builder = builder.set(var, value),
            None => {
                eprintln!("rdmx-info: bad argument {arg:?}; usage: rdmx-info [-D VAR=VALUE]...");
                return ExitCode::from(2);
            }
        }
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        "rdmx {} (librdmacm {}, libibverbs {})",
        env!("CARGO_PKG_VERSION"),
        rdmx::RDMACM_VERSION,
        rdmx::IBVERBS_VERSION
    );
    let _ = writeln!(o, "\n# RDMA devices");
    let rdma_usable = rdma_devices(&mut o);
    let _ = writeln!(o, "\n# Transports");
    match &rdma_usable {
        Ok(()) => {
            let _ = writeln!(o, "  rdma: usable");
        }
        Err(why) => {
            let _ = writeln!(o, "  rdma: not usable: {why}");
        }
    }
    let _ = writeln!(o, "  shm:  {}", shm_status());
    let _ = writeln!(o, "  tcp:  usable (always)");
    let ctx = match builder.build() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("rdmx-info: {e}");
            return ExitCode::FAILURE;
        }
    };
    let _ = writeln!(
        o,
        "  selected: {} (RDMX_TRANSPORT={}; each connection takes the first that reaches its \
         peer)",
        ctx.transports()
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", then "),
        ctx.config()
            .transports()
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let _ = writeln!(o, "\n# Configuration (value, source, meaning)");
    for line in ctx.config().to_string().lines() {
        let _ = writeln!(o, "  {line}");
    }
    // A closed pipe (`rdmx-info | head`) is not an error worth a panic.
    let _ = std::io::stdout().write_all(o.as_bytes());
    ExitCode::SUCCESS
}

/// Whether shared memory is usable for peers on this host — a sealed segment and a doorbell
/// can be made — and how its rendezvous will move data: by CMA, unless Yama's ptrace policy
/// (`/proc/sys/kernel/yama/ptrace_scope`) refuses it, then by copy through the segment.
fn shm_status() -> String {
    if let Err(e) = rdmx_shm::channel::create("rdmx-info", 4096) {
        return format!("not usable: cannot make a shared segment: {e}");
    }
    if let Err(e) = rdmx_shm::Doorbell::new() {
        return format!("not usable: cannot make a doorbell: {e}");
    }
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok());
    let rendezvous = match scope {
        None | Some(0) => "rendezvous by CMA (process_vm_readv)".to_string(),
        Some(1) => "rendezvous by CMA where the kernel allows it (yama ptrace_scope 1: only \
                    into descendants), otherwise by copy through the segment"
            .to_string(),
        Some(n) => {
            format!("rendezvous by copy through the segment (yama ptrace_scope {n} refuses CMA)")
        }
    };
    format!("usable for peers on this host (same boot, user and namespaces); {rendezvous}")
}

/// Lists the RDMA devices and their ports; says whether RDMA is usable, or why not.
#[cfg(feature = "rdma")]
fn rdma_devices(o: &mut String) -> Result<(), String> {
    match &Device::list() {
        Err(e) => {
            let _ = writeln!(o, "  cannot list devices: {e}");
            Err(format!("cannot list devices: {e}"))
        }
        Ok(list) if list.is_empty() => {
            let _ = writeln!(
                o,
                "  none (no RDMA hardware, or no rdma_cm support in this kernel)"
            );
            Err("rdmacm lists no RDMA device".to_string())
        }
        Ok(list) => {
            let mut active = 0;
            for d in list {
                let limits = d
                    .limits()
                    .map(|l| {
                        format!(
                            "max_qp_wr {}, max_cqe {}, max_srq_wr {}",
                            l.max_qp_wr, l.max_cqe, l.max_srq_wr
                        )
                    })
                    .unwrap_or_else(|e| format!("limits unknown: {e}"));
                let _ = writeln!(o, "  {}: {limits}", d.name());
                let addrs = d.ip_addrs().unwrap_or_default();
                match d.ports() {
                    Ok(ports) => {
                        for p in ports {
                            active += usize::from(p.state == "ACTIVE");
                            let on_port: Vec<String> = addrs
                                .iter()
                                .filter(|(port, _)| *port == p.port)
                                .map(|(_, a)| a.to_string())
                                .collect();
                            let _ = writeln!(
                                o,
                                "    port {}: {} ({}, MTU {}){}",
                                p.port,
                                p.state,
                                p.link_layer,
                                p.active_mtu,
                                if on_port.is_empty() {
                                    String::new()
                                } else {
                                    format!(", addresses {}", on_port.join(" "))
                                }
                            );
                        }
                    }
                    Err(e) => {
                        let _ = writeln!(o, "    ports unknown: {e}");
                    }
                }
            }
            if active > 0 {
                Ok(())
            } else {
                Err("no port is ACTIVE".to_string())
            }
        }
    }
}

#[cfg(not(feature = "rdma"))]
fn rdma_devices(o: &mut String) -> Result<(), String> {
    let why = "this build of rdmx has no RDMA support (built without the `rdma` feature)";
    let _ = writeln!(o, "  none: {why}");
    Err(why.to_string())
}
