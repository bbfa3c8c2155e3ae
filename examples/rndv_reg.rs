//! Benchmark: per-operation registration vs the registration cache on the rendezvous path.
//!
//! Two workers in one process on the device of IP exchange messages above the eager
//! threshold, one at a time (receive posted, send, both completed), first with
//! `RDMX_RNDV_REG=per-op` (the user's buffer registered and deregistered on each side, for
//! each message), then with `cache` (regions registered once, one copy on each side).
//! Alongside, the raw cost of one `ibv_reg_mr` + `ibv_dereg_mr` of a user buffer, of one
//! memcpy, the two things the modes trade, and of one memory window's allocation +
//! deallocation, what each send pays on devices with windows (a send is exposed through a
//! window bound to the peer's QP; the bind itself is one more work request, not timed
//! separately).
//!
//! `cargo run --release --example rndv_reg -- IP [MAX_SIZE, default 4 MiB]` (in the Soft-RoCE guest:
//! `scripts/softroce -- target/release/examples/rndv_reg 192.0.2.1`). Timings in the guest
//! are emulated: compare the columns of one run, not absolute values across machines.

use std::time::{Duration, Instant};

use rdmx::conn::{Access, Device, MemoryWindow, ProtectionDomain};
use rdmx::{Context, RndvRegistration, TAG_MASK_ALL};

fn main() -> rdmx::Result<()> {
    env_logger::init();
    let mut args = std::env::args().skip(1);
    let ip = args.next().unwrap_or_else(|| "192.0.2.1".into());
    let max: usize = args
        .next()
        .map(|s| s.parse().expect("MAX_SIZE in bytes"))
        .unwrap_or(4 << 20);
    let sizes: Vec<usize> = std::iter::successors(Some(16 << 10), |&s| Some(s * 4))
        .take_while(|&s| s <= max)
        .collect();
    // The guest's timings are noisy: alternate the modes and keep each size's best round.
    let (mut per_op, mut cache) = (vec![f64::MAX; sizes.len()], vec![f64::MAX; sizes.len()]);
    for _ in 0..ROUNDS {
        let p = run(&ip, RndvRegistration::PerOperation, &sizes)?;
        let c = run(&ip, RndvRegistration::Cache, &sizes)?;
        for i in 0..sizes.len() {
            per_op[i] = per_op[i].min(p[i]);
            cache[i] = cache[i].min(c[i]);
        }
    }
    let device = Device::for_local_addr(ip.parse().expect("an IP address"))?;
    let pd = ProtectionDomain::new(&device)?;
    println!(
        "rendezvous message, one at a time, on {} (µs per message, best of {ROUNDS} rounds)",
        device.name()
    );
    println!(
        "{:>10} {:>10} {:>10} {:>8} {:>12} {:>10} {:>10}",
        "bytes", "per-op", "cache", "cache/op", "reg+dereg", "memcpy", "window"
    );
    for (i, &size) in sizes.iter().enumerate() {
        let (reg, copy, window) = raw_costs(&pd, size);
        println!(
            "{:>10} {:>10.1} {:>10.1} {:>8.2} {:>12.1} {:>10.1} {:>10}",
            size,
            per_op[i],
            cache[i],
            cache[i] / per_op[i],
            reg,
            copy,
            window.map_or("-".to_string(), |w| format!("{w:.1}"))
        );
    }
    Ok(())
}

const ROUNDS: usize = 3;

fn iterations(size: usize) -> usize {
    ((256 << 20) / size).clamp(20, 400)
}

/// µs per rendezvous message for each size, in `mode`.
fn run(ip: &str, mode: RndvRegistration, sizes: &[usize]) -> rdmx::Result<Vec<f64>> {
    let ctx = Context::builder().rndv_registration(mode).build()?;
    let server = ctx.worker()?;
    let listener = server.listen(&format!("{ip}:0"))?;
    let addr = listener.local_addr().expect("bound").to_string();
    let client = ctx.worker()?;
    let connecting = std::thread::spawn(move || client.connect(&addr));
    let _sep = listener.accept()?;
    let cep = connecting.join().expect("connect thread")?;
    let mut out = Vec::new();
    for &size in sizes {
        let (mut rbuf, mut sbuf) = (vec![0u8; size], vec![1u8; size]);
        let n = iterations(size);
        let mut start = Instant::now();
        for i in 0..n + 5 {
            if i == 5 {
                start = Instant::now(); // after warm-up
            }
            let r = server.tag_recv(1, TAG_MASK_ALL, rbuf);
            let s = cep.tag_send(1, sbuf);
            rbuf = r.wait()?.buf;
            sbuf = s.wait()?.buf;
        }
        out.push(start.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    Ok(out)
}

/// µs for one registration + deregistration of a user buffer, for one memcpy, and for one
/// memory window's allocation + deallocation (`None` when the device has no windows).
fn raw_costs(pd: &ProtectionDomain, size: usize) -> (f64, f64, Option<f64>) {
    let n = iterations(size);
    let mut buf = vec![1u8; size];
    let start = Instant::now();
    for _ in 0..n {
        let reg = pd
            .register_vec(buf, Access::REMOTE_READ)
            .map_err(|(e, _)| e)
            .expect("register");
        buf = reg.into_vec().expect("sole owner");
    }
    let reg = per(start.elapsed(), n);
    let mut dst = vec![0u8; size];
    let start = Instant::now();
    for i in 0..n {
        buf[0] = i as u8;
        dst.copy_from_slice(&buf);
        std::hint::black_box(&mut dst);
    }
    let copy = per(start.elapsed(), n);
    let window = pd
        .device()
        .limits()
        .is_ok_and(|l| l.memory_windows)
        .then(|| {
            let region = pd
                .register(size, Access::WINDOW_READ)
                .expect("register for windows");
            let start = Instant::now();
            for _ in 0..n {
                drop(MemoryWindow::new(&region, size).expect("allocate a window"));
            }
            per(start.elapsed(), n)
        });
    (reg, copy, window)
}

fn per(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e6 / n as f64
}
