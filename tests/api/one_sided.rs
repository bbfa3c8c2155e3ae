//! One-sided operations through remote keys (`Ep::put`, `Ep::get`, the atomic operations,
//! flush and fence), as applications use them: keys sent to peers in tag messages, several
//! client workers on their own threads against one server worker, regions unmapped while
//! peers' operations are in flight, and keys that are wrong in every way.

use std::collections::VecDeque;

use super::*;
use rdmx::{Error, MemHandle, RemoteAccess, RemoteKey};

/// Sends `m`'s key on `to` with `tag`.
fn send_key(m: &MemHandle, to: &Ep, tag: u64) {
    finish(to.tag_send(tag, m.pack_rkey())).expect("key sent");
}

/// Receives a key sent with `tag` on `w` and unpacks it on `ep`.
fn recv_key(w: &Worker, ep: &Ep, tag: u64) -> RemoteKey {
    let d = finish(w.tag_recv(tag, TAG_MASK_ALL, vec![0; 64])).expect("key");
    ep.unpack_rkey(&d.buf[..d.length]).expect("a packed key")
}

/// [`recv_key`] for a thread that only progresses its own worker.
fn recv_key_blocking(w: &Worker, ep: &Ep, tag: u64) -> RemoteKey {
    let (bytes, _) = w.recv_vec_timeout(tag, TAG_MASK_ALL, long()).expect("key");
    ep.unpack_rkey(&bytes).expect("a packed key")
}

fn word(bytes: &[u8]) -> u64 {
    u64::from_ne_bytes(bytes[..8].try_into().unwrap())
}

/// Puts and gets are byte-exact at 0 B, 1 B, 4 KiB, 1 MiB and 64 MiB, at the start of the
/// region, at an odd offset and against its end; the bytes around each are left alone.
pub fn puts_and_gets_are_byte_exact() {
    init_log();
    let ctx = builder().build().unwrap();
    let (sw, se, cw, ce) = pair(&ctx);
    // An odd length: the last word is partly the region's.
    let len = (64 << 20) + 3;
    let mut want = pattern(len, 7);
    let m = sw
        .mem_map_from(&want, RemoteAccess::READ | RemoteAccess::WRITE)
        .unwrap();
    send_key(&m, &se, 1);
    let key = recv_key(&cw, &ce, 1);
    assert_eq!(key.len(), len as u64);
    let mut cases = Vec::new();
    for size in [0, 1, 4096, 1 << 20] {
        cases.extend([(size, 0), (size, 3), (size, len - size)]);
    }
    cases.push((64 << 20, 3));
    for (i, &(size, offset)) in cases.iter().enumerate() {
        let data = pattern(size, 11 + i as u8);
        let d = finish(ce.put(&key, offset as u64, data.clone()).expect("put")).expect("put");
        assert_eq!((d.length, d.buf.len()), (size, size));
        want[offset..offset + size].copy_from_slice(&data);
        // At the target already (remote completion), the neighbours untouched.
        let lo = offset.saturating_sub(16);
        let hi = (offset + size + 16).min(len);
        let mut around = vec![0; hi - lo];
        m.read(lo, &mut around).unwrap();
        assert_eq!(around[..], want[lo..hi], "{size} bytes put at {offset}");
        let mut there = vec![0; size];
        m.read(offset, &mut there).unwrap();
        assert!(
            there == data,
            "{size} bytes put at {offset} differ at the target"
        );
        // Read back, byte-exact, into a buffer whose bytes were something else.
        let d = finish(ce.get(&key, offset as u64, vec![0xEE; size]).expect("get")).expect("get");
        assert_eq!(d.length, size);
        assert!(d.buf == data, "{size} bytes got at {offset} differ");
    }
    // A get of the whole region, from its first byte to its last.
    let d = finish(ce.get(&key, 0, vec![0; len]).expect("get")).expect("get");
    assert!(d.buf == want, "the whole region read back differs");
    assert!(m.unmap() == want);
}

/// Four client workers, each on its own thread, make 10 000 fetch-and-adds each on one
/// word of the server's (32 in flight each): the total is exact, and the old values they
/// got are each value from 0 to 39 999 once.
pub fn fetch_and_add_from_four_clients_is_exact() {
    init_log();
    const CLIENTS: usize = 4;
    const ADDS: usize = 10_000;
    let ctx = builder().build().unwrap();
    let server = new_worker(&ctx);
    server.start_progress_thread().unwrap();
    let listener = server.listen(&format!("{}:0", addr_a())).expect("listen");
    let addr = listener.local_addr().unwrap().to_string();
    let counter = server.mem_map(64, RemoteAccess::ATOMIC).unwrap();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (ctx, addr) = (ctx.clone(), addr.clone());
            thread::spawn(move || {
                let w = ctx.worker().expect("worker");
                let ep = w.connect(&addr).expect("connect");
                let key = recv_key_blocking(&w, &ep, 1);
                let mut window = VecDeque::new();
                let mut olds = Vec::with_capacity(ADDS);
                for _ in 0..ADDS {
                    if window.len() == 32 {
                        let r: Request = window.pop_front().unwrap();
                        olds.push(r.wait().expect("fetch-and-add").value);
                    }
                    window.push_back(ep.atomic_fetch_add(&key, 8, 1).expect("fetch-and-add"));
                }
                for r in window {
                    olds.push(r.wait().expect("fetch-and-add").value);
                }
                ep.close().expect("close");
                olds
            })
        })
        .collect();
    let eps: Vec<_> = (0..CLIENTS)
        .map(|_| listener.accept().expect("accept"))
        .collect();
    for ep in &eps {
        ep.send(1, &counter.pack_rkey()).expect("key sent");
    }
    let mut olds: Vec<u64> = clients
        .into_iter()
        .flat_map(|t| t.join().expect("client"))
        .collect();
    assert_eq!(counter.load(8).unwrap(), (CLIENTS * ADDS) as u64);
    olds.sort_unstable();
    assert!(
        olds.iter().copied().eq(0..(CLIENTS * ADDS) as u64),
        "each old value once"
    );
    // The words around it untouched.
    assert_eq!(
        (counter.load(0).unwrap(), counter.load(16).unwrap()),
        (0, 0)
    );
}

/// Four client workers use compare-and-swap on one word as a lock around a plain
/// read-modify-write of another (a get, then a put of the value plus one): the counter
/// ends exact, and every release finds the lock held by its client.
pub fn compare_and_swap_as_a_lock_keeps_a_counter_exact() {
    init_log();
    const CLIENTS: u64 = 4;
    const ROUNDS: u64 = 250;
    let ctx = builder().build().unwrap();
    let server = new_worker(&ctx);
    server.start_progress_thread().unwrap();
    let listener = server.listen(&format!("{}:0", addr_a())).expect("listen");
    let addr = listener.local_addr().unwrap().to_string();
    let region = server.mem_map(16, RemoteAccess::ALL).unwrap();
    let clients: Vec<_> = (1..=CLIENTS)
        .map(|me| {
            let (ctx, addr) = (ctx.clone(), addr.clone());
            thread::spawn(move || {
                let w = ctx.worker().expect("worker");
                let ep = w.connect(&addr).expect("connect");
                let key = recv_key_blocking(&w, &ep, 1);
                let cas = |expected, new| {
                    ep.atomic_compare_swap(&key, 0, expected, new)
                        .and_then(Request::wait)
                        .expect("compare-and-swap")
                        .value
                };
                let mut spins = 0u64;
                for _ in 0..ROUNDS {
                    while cas(0, me) != 0 {
                        spins += 1;
                    }
                    let d = ep
                        .get(&key, 8, vec![0; 8])
                        .and_then(Request::wait)
                        .expect("get");
                    let v = word(&d.buf) + 1;
                    ep.put(&key, 8, v.to_ne_bytes().to_vec())
                        .and_then(Request::wait)
                        .expect("put");
                    assert_eq!(
                        cas(me, 0),
                        me,
                        "client {me} released a lock it did not hold"
                    );
                }
                ep.close().expect("close");
                spins
            })
        })
        .collect();
    let eps: Vec<_> = (0..CLIENTS)
        .map(|_| listener.accept().expect("accept"))
        .collect();
    for ep in &eps {
        ep.send(1, &region.pack_rkey()).expect("key sent");
    }
    let spins: u64 = clients.into_iter().map(|t| t.join().expect("client")).sum();
    log::info!("{spins} failed acquisitions");
    assert_eq!(region.load(0).unwrap(), 0, "the lock is free");
    assert_eq!(region.load(8).unwrap(), CLIENTS * ROUNDS);
}

/// Accesses a key does not allow fail at once, naming what was wrong; accesses only the
/// target can refuse — a forged length, access or secret, a stale key — complete with
/// `Status::Refused`, perform nothing, and (over messages) leave the endpoint connected; a
/// key is only used on the endpoint it was unpacked on. Over RDMA see
/// [`forged_and_stale_keys_over_rdma`].
pub fn bad_one_sided_accesses_fail_cleanly() {
    init_log();
    let ctx = builder().build().unwrap();
    let (sw, se, cw, ce) = pair(&ctx);
    let (_, se2, _, ce2) = pair(&ctx);
    let ro = sw
        .mem_map_from(&pattern(100, 1), RemoteAccess::READ)
        .unwrap();
    let rw = sw
        .mem_map(64, RemoteAccess::READ | RemoteAccess::WRITE)
        .unwrap();
    send_key(&ro, &se, 1);
    send_key(&rw, &se, 2);
    let ro_key = recv_key(&cw, &ce, 1);
    let rw_key = recv_key(&cw, &ce, 2);
    let rma = |r: rdmx::Result<Request>| match r {
        Err(Error::Rma(refusal)) => refusal.to_string(),
        other => panic!("not refused at once: {other:?}"),
    };
    // Outside the region, by the key.
    let e = rma(ce.get(&ro_key, 99, vec![0; 2]));
    assert!(
        e.contains("2 bytes at offset 99 are outside the 100-byte region"),
        "{e}"
    );
    assert!(rma(ce.put(&rw_key, u64::MAX, vec![0; 1])).contains("outside"));
    // Without the access.
    let e = rma(ce.put(&ro_key, 0, vec![1; 8]));
    assert!(
        e.contains("Put needs remote write, the region was mapped with remote read"),
        "{e}"
    );
    assert!(rma(ce.atomic_fetch_add(&rw_key, 0, 1)).contains("atomic"));
    // On another endpoint.
    match ce2.get(&ro_key, 0, vec![0; 8]) {
        Err(Error::Invalid(e)) => assert!(e.contains("unpacked on endpoint"), "{e}"),
        other => panic!("a key used on another endpoint: {other:?}"),
    }
    drop((se2, ce2));

    if is_rdma() {
        forged_and_stale_keys_over_rdma(&sw, &cw, ro, rw);
        return;
    }
    // Forged keys: the target's checks refuse them, the initiator's cannot.
    let packed = ro.pack_rkey();
    let forge = |at: usize, bytes: &[u8]| {
        let mut k = packed.clone();
        k[at..at + bytes.len()].copy_from_slice(bytes);
        ce.unpack_rkey(&k).expect("a forged but well-formed key")
    };
    let longer = forge(24, &4096u64.to_le_bytes());
    // (Access bits: read 1, write 2, atomic 4.)
    let all = forge(3, &[7]);
    let wrong_secret = forge(16, &[0x5a; 8]);
    let refused = |r: rdmx::Result<Request>| match finish(r.expect("made")) {
        Err(Error::Request {
            status: Status::Refused(kind),
            what,
            ..
        }) => (kind, what),
        other => panic!("not refused by the target: {other:?}"),
    };
    use rdmx::proto::rma::RefusalKind;
    let (kind, what) = refused(ce.get(&longer, 96, vec![0; 64]));
    assert_eq!(kind, RefusalKind::OutOfBounds);
    assert!(
        what.contains("get (remote offset 0x60) on endpoint"),
        "{what}"
    );
    assert_eq!(
        refused(ce.put(&all, 0, vec![0xff; 8])).0,
        RefusalKind::NotPermitted
    );
    assert_eq!(
        refused(ce.atomic_add(&all, 0, 1)).0,
        RefusalKind::NotPermitted
    );
    assert_eq!(
        refused(ce.get(&wrong_secret, 0, vec![0; 8])).0,
        RefusalKind::BadKey
    );
    assert!(
        ro.to_vec() == pattern(100, 1),
        "a refused access changed the region"
    );

    // A stale key: refused once its region is unmapped, and once the slot is reused — as
    // a forged key is (`BadKey`): the target tells no peer which of its regions were
    // unmapped (issue 48: a stale key was answered `StaleKey` before its secret was
    // checked, so keys with made-up secrets told a peer which slots had been reused).
    let bytes = rw.unmap();
    assert_eq!(bytes, vec![0; 64]);
    let kind = refused(ce.get(&rw_key, 0, vec![0; 8])).0;
    assert_eq!(kind, RefusalKind::BadKey);
    // (Its words name a stale key among the causes, for the user who unmapped it.)
    assert!(kind.to_string().contains("unmapped since"), "{kind}");
    let again = sw.mem_map(64, RemoteAccess::ALL).unwrap();
    assert_eq!(
        refused(ce.put(&rw_key, 0, vec![1; 8])).0,
        RefusalKind::BadKey
    );
    assert_eq!(again.to_vec(), vec![0; 64]);

    // Through all of it the endpoint stayed up, and serves the next access.
    assert!(ce.is_connected() && se.is_connected());
    let d = finish(ce.get(&ro_key, 0, vec![0; 100]).unwrap()).unwrap();
    assert_eq!(d.buf, pattern(100, 1));
}

/// [`bad_one_sided_accesses_fail_cleanly`]'s forged and stale keys over RDMA, where the
/// target's NIC checks the accesses: the rkey, the range and the access it was registered
/// with — not the key's secret, as the verbs define (the rkey is the capability). A refused
/// access completes as `RefusalKind::RemoteAccess` and breaks the queue pair, so each runs
/// on an endpoint of its own; none changes the region.
fn forged_and_stale_keys_over_rdma(sw: &Worker, cw: &Worker, ro: MemHandle, rw: MemHandle) {
    use rdmx::proto::rma::RefusalKind;
    let listener = sw.listen(&format!("{}:0", addr_a())).expect("listen");
    let addr = listener.local_addr().unwrap().to_string();
    let fresh = || {
        thread::scope(|s| {
            let c = s.spawn(|| cw.connect(&addr).expect("connect"));
            let server_side = listener.accept().expect("accept");
            (server_side, c.join().unwrap())
        })
    };
    let refused_and_closed = |ce: &Ep, r: rdmx::Result<Request>| {
        match finish(r.expect("made")) {
            Err(Error::Request {
                status: Status::Refused(RefusalKind::RemoteAccess),
                ..
            }) => {}
            other => panic!("not refused by the target's NIC: {other:?}"),
        }
        let deadline = Instant::now() + long();
        while ce.is_connected() {
            assert!(Instant::now() < deadline, "the broken endpoint stayed up");
            cw.progress();
        }
        // Its next operation fails at once: the endpoint is closed.
        let next = finish(ce.rma_flush());
        assert!(matches!(
            next,
            Err(Error::Request {
                status: Status::ConnectionClosed,
                ..
            })
        ));
    };
    let forge = |ce: &Ep, packed: &[u8], at: usize, bytes: &[u8]| {
        let mut k = packed.to_vec();
        k[at..at + bytes.len()].copy_from_slice(bytes);
        ce.unpack_rkey(&k).expect("a forged but well-formed key")
    };
    let packed = ro.pack_rkey();
    assert_eq!(packed.len(), 48, "a key with an RDMA part");
    let (_s1, ce) = fresh();
    let longer = forge(&ce, &packed, 24, &4096u64.to_le_bytes());
    refused_and_closed(&ce, ce.get(&longer, 96, vec![0; 64]));
    let (_s2, ce) = fresh();
    let all = forge(&ce, &packed, 3, &[7]);
    refused_and_closed(&ce, ce.put(&all, 0, vec![0xff; 8]));
    let (_s3, ce) = fresh();
    let all = forge(&ce, &packed, 3, &[7]);
    refused_and_closed(&ce, ce.atomic_add(&all, 0, 1));
    // The secret is the messages' check; the NIC checks the rkey, which is right.
    let (_s4, ce) = fresh();
    let wrong_secret = forge(&ce, &packed, 16, &[0x5a; 8]);
    let d = finish(ce.get(&wrong_secret, 0, vec![0; 100]).unwrap()).unwrap();
    assert_eq!(d.buf, pattern(100, 1));
    assert!(
        ro.to_vec() == pattern(100, 1),
        "a refused access changed the region"
    );
    // A stale key: refused by the NIC once its region is unmapped (deregistered).
    let rw_packed = rw.pack_rkey();
    let (_s5, ce) = fresh();
    let rw_key = ce.unpack_rkey(&rw_packed).unwrap();
    finish(ce.put(&rw_key, 0, vec![3; 64]).unwrap()).expect("put while mapped");
    assert_eq!(rw.unmap(), vec![3; 64]);
    refused_and_closed(&ce, ce.get(&rw_key, 0, vec![0; 8]));
    // Other endpoints were not touched by the refusals.
    let (_s6, ce) = fresh();
    let ro_key = ce.unpack_rkey(&packed).unwrap();
    let d = finish(ce.get(&ro_key, 0, vec![0; 100]).unwrap()).unwrap();
    assert_eq!(d.buf, pattern(100, 1));
}

/// A put, then a flush, then a tag message: the target, once it has the message, reads
/// the put's bytes — with an endpoint's flush and with the worker's, over two endpoints.
/// A fenced get sees the put before it; a flush with nothing before it completes at once.
pub fn flush_makes_puts_visible_and_fence_orders() {
    init_log();
    let ctx = builder().build().unwrap();
    let (sw, ses, cw, ces) = connect_n(&ctx, &addr_a(), 2);
    let m = sw.mem_map(1 << 20, RemoteAccess::ALL).unwrap();
    for (i, se) in ses.iter().enumerate() {
        send_key(&m, se, i as u64);
    }
    let keys: Vec<_> = ces
        .iter()
        .enumerate()
        .map(|(i, ce)| recv_key(&cw, ce, i as u64))
        .collect();
    for round in 0..4u8 {
        // Several puts on both endpoints, none waited for.
        let puts: Vec<_> = (0..8)
            .map(|i| {
                let (ce, key) = (&ces[i % 2], &keys[i % 2]);
                let data = pattern(100_000, round * 8 + i as u8);
                ce.put(key, (i * 128 * 1024) as u64, data).expect("put")
            })
            .collect();
        let flushed = if round % 2 == 0 {
            // The worker's flush covers both endpoints.
            finish(cw.rma_flush()).expect("worker flush")
        } else {
            finish(ces[0].rma_flush()).expect("flush");
            finish(ces[1].rma_flush()).expect("flush")
        };
        assert_eq!(flushed.length, 0);
        // (The puts completed too, but only the message tells the target.)
        finish(ces[0].tag_send(50, vec![round])).expect("notice");
        let d = finish(sw.tag_recv(50, TAG_MASK_ALL, vec![0; 1])).expect("notice");
        assert_eq!(d.buf, vec![round]);
        for i in 0..8 {
            let mut got = vec![0; 100_000];
            m.read(i * 128 * 1024, &mut got).unwrap();
            assert!(
                got == pattern(100_000, round * 8 + i as u8),
                "put {i} of round {round}"
            );
        }
        for p in puts {
            assert!(p.is_done());
            p.wait().expect("put");
        }
    }
    // A fence: the get after it starts once the put before it completed.
    let put = ces[0].put(&keys[0], 0, vec![42; 4096]).unwrap();
    ces[0].fence();
    let get = ces[0].get(&keys[0], 0, vec![0; 4096]).unwrap();
    assert_eq!(finish(get).unwrap().buf, vec![42; 4096]);
    finish(put).unwrap();
    cw.fence();
    let add = ces[1].atomic_fetch_add(&keys[1], 8, 5).unwrap();
    assert_eq!(finish(add).unwrap().value, word(&[42; 8]));
    // Nothing outstanding: both flushes complete as soon as they are progressed.
    finish(cw.rma_flush()).expect("worker flush");
    finish(ces[1].rma_flush()).expect("flush");
    // A flush of a closed endpoint fails, naming the flush.
    ces[1].close().unwrap();
    match finish(ces[1].rma_flush()) {
        Err(Error::Request {
            status: Status::ConnectionClosed,
            what,
            ..
        }) => assert!(what.starts_with("flush"), "{what}"),
        other => panic!("flush of a closed endpoint: {other:?}"),
    }
}

/// A client keeps puts, gets and fetch-and-adds in flight on a region while the server
/// unmaps it: each completes done or refused as stale, none crashes, the endpoint stays
/// connected, and the server's resources come back. A region whose handle is forgotten
/// stays mapped: peers' operations on it keep working.
pub fn unmap_during_remote_traffic() {
    init_log();
    let ctx = builder().build().unwrap();
    let server = new_worker(&ctx);
    server.start_progress_thread().unwrap();
    let listener = server.listen(&format!("{}:0", addr_a())).expect("listen");
    let addr = listener.local_addr().unwrap().to_string();
    // Puts and gets on the first 64 KiB, fetch-and-adds on the word after them.
    let m = server.mem_map((1 << 16) + 8, RemoteAccess::ALL).unwrap();
    use rdmx::proto::rma::RefusalKind;
    let c = {
        let (ctx, addr) = (ctx.clone(), addr.clone());
        thread::spawn(move || {
            let w = ctx.worker().expect("worker");
            let ep = w.connect(&addr).expect("connect");
            let key = recv_key_blocking(&w, &ep, 1);
            // What an operation on the unmapped region ends with: refused by the target's
            // checks (messages: as a forged key is, `BadKey`), or by its NIC, which breaks
            // the connection and fails what followed (RDMA).
            let gone = |status: Status| match status {
                Status::Refused(RefusalKind::BadKey) => !is_rdma(),
                Status::Refused(RefusalKind::RemoteAccess) | Status::ConnectionClosed => is_rdma(),
                _ => false,
            };
            let (mut done, mut stale) = (0u64, 0u64);
            let mut window = VecDeque::new();
            let mut i = 0u64;
            // Until the region is gone, and a while after.
            while stale < 64 {
                if window.len() == 16 {
                    let r: Request = window.pop_front().unwrap();
                    match r.wait() {
                        Ok(_) => {
                            assert_eq!(stale, 0, "an access after a stale one was performed");
                            done += 1;
                        }
                        Err(Error::Request { status, .. }) if gone(status) => stale += 1,
                        Err(e) => panic!("neither done nor stale: {e}"),
                    }
                }
                let at = (i * 4096) % (1 << 16);
                let r = match i % 3 {
                    0 => ep.put(&key, at, pattern(4096, i as u8)),
                    1 => ep.get(&key, at, vec![0; 4096]),
                    _ => ep.atomic_fetch_add(&key, 1 << 16, 1),
                };
                window.push_back(r.expect("made"));
                i += 1;
            }
            for r in window {
                match r.wait() {
                    Err(Error::Request { status, .. }) if gone(status) => {}
                    other => panic!("after the unmap: {other:?}"),
                }
            }
            // Over messages the endpoint serves the next region; over RDMA the NIC's
            // refusal broke it, and a new one does.
            let ep = if is_rdma() {
                assert!(!ep.is_connected());
                w.connect(&addr).expect("connect again")
            } else {
                assert!(ep.is_connected());
                ep
            };
            let key = recv_key_blocking(&w, &ep, 2);
            for n in 1..=100 {
                let d = ep
                    .atomic_fetch_add(&key, 0, 1)
                    .and_then(Request::wait)
                    .unwrap();
                assert_eq!(d.value, n - 1);
            }
            ep.send(3, &[]).unwrap();
            ep.close().unwrap();
            done
        })
    };
    let ep = listener.accept().expect("accept");
    let base = resources(&server);
    ep.send(1, &m.pack_rkey()).unwrap();
    // Unmapped while the client's operations are in flight.
    let deadline = Instant::now() + long();
    while m.load(1 << 16).unwrap() < 300 {
        assert!(
            Instant::now() < deadline,
            "the client's operations did not arrive"
        );
        thread::yield_now();
    }
    let bytes = m.unmap();
    assert!(word(&bytes[1 << 16..]) >= 300);
    assert_eq!(server.stats().mapped_regions, 0);
    // A forgotten handle: its region stays mapped (leaked), never freed under a peer.
    let forgotten = server.mem_map(64, RemoteAccess::ATOMIC).unwrap();
    // (Over RDMA the client comes back on a new endpoint: see its side.)
    let ep2 = is_rdma().then(|| listener.accept().expect("accept again"));
    ep2.as_ref()
        .unwrap_or(&ep)
        .send(2, &forgotten.pack_rkey())
        .unwrap();
    std::mem::forget(forgotten);
    server
        .recv_vec_timeout(3, TAG_MASK_ALL, long())
        .expect("the client finished");
    let done = c.join().expect("client");
    assert!(done >= 300, "{done}");
    assert_eq!(server.stats().mapped_regions, 1);
    // Nothing else is held: no request or buffer left behind by the traffic, and once
    // both ends closed, no connection.
    drop((ep, ep2));
    let deadline = Instant::now() + long();
    let held = |r: &Resources| {
        (
            r.eps,
            r.connections,
            r.pending_requests,
            r.user_buffers,
            r.unexpected_messages,
        )
    };
    let gone = (
        base.eps - 1,
        base.connections - 1,
        base.pending_requests,
        base.user_buffers,
        0,
    );
    while held(&resources(&server)) != gone {
        assert!(
            Instant::now() < deadline,
            "resources did not return:\n before {base:?}\n after  {:?}",
            resources(&server)
        );
        thread::sleep(Duration::from_millis(5));
    }
}
