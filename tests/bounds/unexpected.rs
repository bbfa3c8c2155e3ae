//! The unexpected-message budget (`RDMX_MAX_UNEXPECTED`): a sender floods a worker whose
//! application posts no receive with 20 000 eager messages of 16 KiB (312 MiB). Past the
//! budget the victim withholds the flooder's credits, so its sends wait instead of the
//! victim growing: its RSS and its own count of unexpected bytes stay within the budget's
//! bound while the flood runs, and a legitimate peer connects and exchanges messages
//! meanwhile. Then the victim receives, and every flooded message arrives, byte-exact and
//! in order. (Before the budget, the victim took all 312 MiB in.)

use std::sync::Arc;
use std::time::Instant;

use rdmx::{Request, Transport, WorkerStats, MAX_UNEXPECTED_VAR, TAG_MASK_ANY};

use crate::*;

/// Flooded messages, and their size: eager on TCP (64 KiB threshold) and shared memory
/// (16 KiB).
const N: usize = 20_000;
const LEN: usize = 16 << 10;
/// The victim's budget.
const BUDGET: usize = 4 * MIB;
/// Distinct payloads the flood cycles through (shared buffers: the sender holds 16 of them,
/// not 20 000).
const PATTERNS: usize = 16;

fn payload(k: usize) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i.wrapping_mul(7) ^ (k % PATTERNS).wrapping_mul(131)) as u8)
        .collect()
}

/// What the victim may hold for unexpected messages: twice the budget (the budget, then
/// what peers below their share add) and a window of eager frames from the flooder (64 over
/// TCP, the ring's 1024 over shared memory), each with its 64-byte entry.
fn bound(transport: Transport) -> usize {
    let window = match transport {
        Transport::Shm => 1024,
        _ => 64,
    };
    2 * BUDGET + window * (LEN + 64)
}

/// What the process may grow by beyond that: the flood's 20 000 pending requests (handles,
/// the sender's table and engine), the sender's queued frames and the allocator's slack.
/// (The counters are the sharper bound: the RSS check sees growth only where the heap had
/// not grown already, in an earlier test of this process, and kept the memory.)
const SLACK: usize = 16 * MIB;

fn flood_waits_on_credit(transport: Transport) {
    init_log();
    let _measuring = measuring();
    let ctx = context(transport, &[(MAX_UNEXPECTED_VAR, "4M")]);
    let (victim, listener, addr) = listening(&ctx);
    let (flooder, flood_ep, _flooded_ep) = connected(&ctx, &listener, &addr);
    assert_eq!(flood_ep.transport(), transport);
    let patterns: Vec<Arc<Vec<u8>>> = (0..PATTERNS).map(|k| Arc::new(payload(k))).collect();
    let base = rss();

    // The flood, made at once; both workers progress; the victim posts no receive.
    let sends: Vec<Request> = (0..N)
        .map(|k| flood_ep.tag_send_shared(k as u64, &patterns[k % PATTERNS]))
        .collect();
    let deadline = Instant::now() + LONG;
    let (mut most_rss, mut most_held) = (0usize, 0u64);
    let mut since_change = 0;
    let mut last_done = usize::MAX;
    for round in 0u64.. {
        assert!(
            Instant::now() < deadline,
            "the flood neither stalled nor ended"
        );
        flooder.progress();
        victim.progress();
        if round % 64 != 0 {
            continue;
        }
        most_rss = most_rss.max(rss().saturating_sub(base));
        let st: WorkerStats = victim.stats();
        most_held = most_held.max(st.unexpected_bytes);
        let done = sends.iter().filter(|s| s.is_done()).count();
        since_change = if done == last_done {
            since_change + 1
        } else {
            0
        };
        last_done = done;
        // Stalled: every credit the flooder could spend is spent, its sends wait.
        if done == N || (st.withheld_credits > 0 && since_change >= 50) {
            break;
        }
    }
    let st = victim.stats();
    println!(
        "{transport}: victim grew {} KiB, held {} KiB at most ({} messages, {} credits withheld); \
         {last_done} of {N} sends done",
        most_rss >> 10,
        most_held >> 10,
        st.unexpected_messages,
        st.withheld_credits
    );
    let bound = bound(transport);
    assert!(
        most_held as usize <= bound,
        "the victim held {most_held} bytes for unexpected messages, over {bound}"
    );
    assert!(
        most_rss <= bound + SLACK,
        "the victim's process grew by {most_rss} bytes, over {bound} + {SLACK}"
    );
    assert!(st.withheld_credits > 0, "{st:?}");
    assert!(
        last_done < N / 2,
        "the flooder's sends wait on credit: {last_done} of {N} done"
    );

    // A legitimate peer connects and exchanges messages meanwhile (its receives posted first:
    // its messages are expected, never held back).
    let (legit, legit_ep, victim_ep) = connected(&ctx, &listener, &addr);
    exchange(&legit, &legit_ep, &victim, &victim_ep);
    assert!(victim.stats().unexpected_bytes as usize <= bound);
    assert!(
        sends.iter().filter(|s| s.is_done()).count() < N / 2,
        "still waiting"
    );

    // The victim's application receives: every flooded message arrives, whole and in order.
    let mut growth = 0;
    for k in 0..N {
        let r = victim.tag_recv(0, TAG_MASK_ANY, vec![0; LEN]);
        while !r.is_done() {
            assert!(Instant::now() < deadline, "message {k} never came");
            flooder.progress();
            victim.progress();
        }
        let got = r.wait().expect("a flooded message");
        assert_eq!(got.tag, k as u64, "in order");
        assert!(
            got.buf == *patterns[k % PATTERNS],
            "message {k}'s bytes differ"
        );
        if k % 256 == 0 {
            growth = growth.max(rss().saturating_sub(base));
            assert!(victim.stats().unexpected_bytes as usize <= bound);
        }
    }
    for s in sends {
        wait_within(s, "a flooded send").expect("every flooded send completes");
    }
    let st = victim.stats();
    assert_eq!((st.unexpected_bytes, st.withheld_credits), (0, 0), "{st:?}");
    assert!(growth <= bound + SLACK, "grew by {growth} while draining");
}

#[test]
fn a_flood_of_unexpected_messages_waits_on_credit_over_tcp() {
    flood_waits_on_credit(Transport::Tcp);
}

#[test]
fn a_flood_of_unexpected_messages_waits_on_credit_over_shm() {
    flood_waits_on_credit(Transport::Shm);
}
