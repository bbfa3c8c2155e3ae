//! One-sided operations whose futures are dropped mid-transfer.

use super::*;
use rdmx::RemoteAccess;

/// A get and a put of 16 MiB whose futures are dropped while the data moves go on
/// detached: their buffers stay with the worker until the transfer is done, the next
/// operations on the endpoint (a get, a flush, a tag message) work, the dropped put's
/// bytes all land, and nothing is left behind (no request, no user buffer).
pub fn dropped_rma_futures_leave_no_trap() {
    init_log();
    run(async move {
        let p = pair(&context(WaitMode::Event), 1).await;
        let (cep, sep) = (&p.ceps[0], p.seps.values().next().unwrap());
        let big = 16 << 20;
        let base: Vec<u8> = (0..big).map(|i| (i % 251) as u8).collect();
        let region = p.server.mem_map_from(&base, RemoteAccess::ALL).unwrap();
        sep.tag_send(1, region.pack_rkey()).await.unwrap();
        let packed = p
            .client
            .tag_recv(1, TAG_MASK_ALL, vec![0; 256])
            .await
            .unwrap();
        let key = cep.unpack_rkey(&packed.buf[..packed.length]).unwrap();

        // A get dropped after its first poll.
        let get = tokio::spawn(cep.get(&key, 0, vec![0; big]).unwrap());
        tokio::task::yield_now().await;
        println!("get dropped mid-transfer: {}", !get.is_finished());
        get.abort();
        let _ = get.await;
        let small = cep.get(&key, 1000, vec![0; 8]).unwrap().await.unwrap();
        assert_eq!(small.buf, base[1000..1008]);

        // A put dropped after its first poll: its bytes still all land.
        let data = vec![0xa5u8; big];
        let put = tokio::spawn(cep.put(&key, 0, data).unwrap());
        tokio::task::yield_now().await;
        println!("put dropped mid-transfer: {}", !put.is_finished());
        put.abort();
        let _ = put.await;
        cep.rma_flush()
            .await
            .expect("the flush after a dropped put");
        assert!(
            region.to_vec().iter().all(|&b| b == 0xa5),
            "the dropped put's bytes"
        );

        cep.tag_send(2, b"next".to_vec()).await.unwrap();
        let got = p
            .server
            .tag_recv(2, TAG_MASK_ALL, vec![0; 8])
            .await
            .unwrap();
        assert_eq!(&got.buf[..got.length], b"next");
        let deadline = tokio::time::Instant::now() + long();
        loop {
            let s = p.client.stats();
            if s.user_buffers == 0 && s.pending_requests == 0 && s.reads_in_flight == 0 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "left behind: {s:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
}
