//! The cost of one small-message round trip in user-space instructions: one thread drives a
//! client and a server worker over the transport `RDMX_TRANSPORT` names (`tcp`: loopback;
//! on `auto`, shared memory, both workers being on this host),
//! posting the receive, sending 8 bytes, and progressing both workers until both requests
//! completed, then the same back. Nothing spins on an empty socket for long: loopback TCP
//! delivers within the send call. Run it under callgrind twice with different counts; the
//! difference divided by the difference in round trips is the instructions per round trip
//! (setup cancels out), deterministic on a noisy machine:
//!
//! `valgrind --tool=callgrind target/release/examples/roundtrip_cost N [SIZE [LISTEN_ADDR]]`
//! (scripts/bench does this and prints the figure).

use rdmx::{Context, Ep, Request, Worker, TAG_MASK_ALL};

fn main() -> rdmx::Result<()> {
    env_logger::init();
    let n: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("a round-trip count"))
        .unwrap_or(1000);
    let size: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().expect("a message size"))
        .unwrap_or(8);
    // Over RDMA, an address of an RDMA device (e.g. a Soft-RoCE guest's SOFTROCE_ADDR_A).
    let listen = std::env::args()
        .nth(3)
        .unwrap_or_else(|| "127.0.0.1:0".into());
    let ctx = Context::new()?;
    let server = ctx.worker()?;
    let listener = server.listen(&listen)?;
    let addr = listener.local_addr().expect("bound").to_string();
    let client = ctx.worker()?;
    let c = client.clone();
    let connecting = std::thread::spawn(move || c.connect(&addr));
    let sep = listener.accept()?;
    let cep = connecting.join().expect("connect thread")?;
    let (mut a, mut b) = (vec![1u8; size], vec![0u8; size]);
    for _ in 0..n {
        (a, b) = one_way(&client, &cep, &server, a, b)?;
        (a, b) = one_way(&server, &sep, &client, a, b)?;
    }
    println!("{n} round trips of {size} B");
    // RDMX_IDLE_POLLS=N: then N progress calls with nothing to do (what a busy-polling
    // waiter spins on), timed: a completion is seen half such a call late on average.
    if let Some(polls) = std::env::var("RDMX_IDLE_POLLS")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        let t = std::time::Instant::now();
        for _ in 0..polls {
            client.progress();
        }
        println!(
            "idle progress call: {:.0} ns",
            t.elapsed().as_nanos() as f64 / f64::from(polls.max(1))
        );
    }
    Ok(())
}

/// `from` sends `msg` on `ep` to `to`, which receives it into `into`; returns both buffers.
fn one_way(
    from: &Worker,
    ep: &Ep,
    to: &Worker,
    msg: Vec<u8>,
    into: Vec<u8>,
) -> rdmx::Result<(Vec<u8>, Vec<u8>)> {
    let r = to.tag_recv(1, TAG_MASK_ALL, into);
    let s = ep.tag_send(1, msg);
    until_done(&[&r, &s], &[from, to]);
    Ok((s.wait()?.buf, r.wait()?.buf))
}

fn until_done(reqs: &[&Request], workers: &[&Worker]) {
    while !reqs.iter().all(|r| r.is_done()) {
        for w in workers {
            w.progress();
        }
    }
}
