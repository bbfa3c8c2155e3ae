//! Memory registered for peers' one-sided access as atomic words (`WordRegion`): the client
//! WRITEs, READs, fetch-and-adds and compare-and-swaps the server's words; once the server
//! deregisters them, the client's next access is refused by the server's NIC.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::*;

const WORDS: usize = 513;

/// The server registers 4 KiB + 8 of words for every access and tells the client where;
/// the client's WRITE lands byte-exact (read back by READ and by the server's atomic
/// loads), its fetch-and-adds return each old value and add up, a compare-and-swap swaps
/// only when it matches; after the server drops the region, a WRITE fails with a remote
/// access error and the registration is gone.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn one_sided_access_to_registered_words() {
    two_sided("conn_one_sided_access_to_registered_words", |p| {
        if p.is_server() {
            let server = Verbs::new(local_ip(), Some(8), false);
            server.fill_srq(8, 64);
            let words: Arc<[AtomicU64]> = (0..WORDS).map(|_| AtomicU64::new(0)).collect();
            let all = WordAccess {
                read: true,
                write: true,
                atomic: true,
            };
            assert!(server
                .pd
                .register_words(words.clone(), WORDS * 8 + 1, all)
                .is_err());
            let region = server
                .pd
                .register_words(words.clone(), WORDS * 8, all)
                .unwrap();
            let listener = listener_of(p);
            let (_listener, conn) = accept_on(listener, &server);
            p.barrier(); // the client's receive is posted
            let remote = RemoteBuf {
                addr: region.addr(),
                len: region.len() as u32,
                rkey: region.rkey(),
            };
            tell(&conn, &server, remote);
            p.barrier(); // the client wrote, read, added and swapped
            let pattern: Vec<u8> = (0..4096).map(|i| (i * 13 + 5) as u8).collect();
            let mut got = Vec::new();
            for w in &words[..512] {
                got.extend_from_slice(&w.load(Ordering::Acquire).to_ne_bytes());
            }
            assert!(got == pattern, "the WRITE's bytes, word by word");
            assert_eq!(words[512].load(Ordering::Acquire), 1000 + 100 * 3);
            // (The client waits at the barrier: only this side registers or deregisters.)
            let at = live_registrations();
            drop(region);
            let after = live_registrations();
            assert_eq!(
                (after.regions, after.bytes),
                (at.regions - 1, at.bytes - WORDS * 8)
            );
            p.barrier(); // deregistered
            p.barrier(); // the client was refused
            assert_eq!(
                words[0].load(Ordering::Acquire),
                u64::from_ne_bytes(pattern[..8].try_into().unwrap())
            );
            return;
        }
        let client = Verbs::new(local_ip(), None, false);
        let addr = server_addr(p);
        let conn = listening_conn(p, addr, &client);
        p.barrier();
        let remote = heard(&client);
        assert_eq!(remote.len as usize, WORDS * 8);
        // WRITE 4 KiB, READ it back.
        let pattern: Vec<u8> = (0..4096).map(|i| (i * 13 + 5) as u8).collect();
        let source = client.pd.register_from(&pattern, Access::SEND).unwrap();
        conn.post_write(source, 4096, remote, 1)
            .map_err(|(e, _)| e)
            .unwrap();
        let done = collect(&client.cq, 1).pop().unwrap();
        assert!(
            done.status.is_success() && done.kind == WorkKind::Write,
            "{done:?}"
        );
        let target = client.pd.register(4096, Access::LOCAL_WRITE).unwrap();
        conn.post_read(target, 4096, remote, 2)
            .map_err(|(e, _)| e)
            .unwrap();
        let done = collect(&client.cq, 1).pop().unwrap();
        assert!(done.status.is_success(), "{done:?}");
        assert!(
            done.buffer.unwrap()[..] == pattern[..],
            "read back byte-exact"
        );
        // Atomics on the last word: a compare-and-swap that fails, one that swaps, then
        // 100 fetch-and-adds of 3, each result checked.
        let word = remote.addr + 512 * 8;
        let result = || client.pd.register(8, Access::LOCAL_WRITE).unwrap();
        let atomic = |op| {
            conn.post_atomic(result(), word, remote.rkey, op, 3)
                .map_err(|(e, _)| e)
                .unwrap();
            let done = collect(&client.cq, 1).pop().unwrap();
            assert!(
                done.status.is_success() && done.kind == WorkKind::Atomic,
                "{done:?}"
            );
            u64::from_ne_bytes(done.buffer.unwrap()[..8].try_into().unwrap())
        };
        assert_eq!(
            atomic(AtomicOp::CompareSwap {
                expected: 7,
                new: 1000
            }),
            0
        );
        assert_eq!(
            atomic(AtomicOp::CompareSwap {
                expected: 0,
                new: 1000
            }),
            0
        );
        for i in 0..100 {
            assert_eq!(atomic(AtomicOp::FetchAdd(3)), 1000 + 3 * i);
        }
        // Unaligned: refused before posting.
        assert!(conn
            .post_atomic(result(), word + 4, remote.rkey, AtomicOp::FetchAdd(1), 4)
            .is_err());
        p.barrier();
        p.barrier(); // the server deregistered the words
        let source = client.pd.register_from(&[0xee; 64], Access::SEND).unwrap();
        conn.post_write(source, 64, remote, 5)
            .map_err(|(e, _)| e)
            .unwrap();
        let refused = collect(&client.cq, 1).pop().unwrap();
        assert_eq!(
            refused.status,
            WcStatus::REMOTE_ACCESS,
            "a stale rkey: {refused:?}"
        );
        p.barrier();
    });
}
