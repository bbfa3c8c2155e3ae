//! RDMA READs of registered regions and of vectors registered in place.

use super::*;

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn rdma_read_between_vecs_registered_in_place() {
    let Pair {
        server,
        client,
        server_conn: _server_conn,
        client_conn: conn,
        ..
    } = connected_pair(addr_b(), 8, false, false);

    // An empty Vec cannot be a region; it comes back with the error.
    let (err, empty) = server
        .pd
        .register_vec(Vec::with_capacity(16), Access::REMOTE_READ)
        .unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL, "{err}");
    assert!(err.message().contains("empty"), "{err}");
    assert_eq!(empty.capacity(), 16, "the same Vec is given back");

    // The server exposes a Vec in place: the region is the Vec's own heap buffer.
    const LEN: usize = (1 << 20) + 3;
    let source: Vec<u8> = (0..LEN).map(|i| (i * 31 + i / 1000) as u8).collect();
    let exposed_vec = source.clone();
    let exposed_ptr = exposed_vec.as_ptr() as u64;
    let exposed = server
        .pd
        .register_vec(exposed_vec, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(exposed.len(), LEN);
    assert_eq!(
        exposed.addr(),
        exposed_ptr,
        "registered in place, not copied"
    );
    let remote = exposed.remote().expect("registered for remote read");
    assert_eq!(remote.len as usize, LEN);
    assert_eq!(remote.addr, exposed_ptr);

    // The client reads it into its own Vec, registered in place too, in two uneven pieces.
    let target_vec = vec![0u8; LEN];
    let target_ptr = target_vec.as_ptr() as u64;
    let mut head = client
        .pd
        .register_vec(target_vec, Access::LOCAL_WRITE)
        .unwrap();
    assert_eq!(head.addr(), target_ptr, "registered in place, not copied");
    let split = LEN / 2 + 1;
    let tail = head.split_off(split);
    // A split buffer is not the whole region: into_vec gives it back.
    let mut head = head.into_vec().expect_err("only part of the region");
    assert_eq!((head.addr(), head.len()), (target_ptr, split));
    let tail = tail.into_vec().expect_err("only part of the region");
    assert_eq!(tail.len(), LEN - split);
    // Neither is a buffer of a region that was not made from a Vec.
    let allocated = client.pd.register(64, Access::LOCAL_WRITE).unwrap();
    assert_eq!(
        allocated.into_vec().expect_err("not a Vec region").len(),
        64
    );

    let mut read = read_pieces(&conn, &client.cq, remote, vec![(0, head), (split, tail)]);
    let tail = read.pop().unwrap();
    head = read.pop().unwrap();
    // While the tail is still out, the head alone cannot become the Vec.
    head = head
        .into_vec()
        .expect_err("the tail still holds the region");
    head.unsplit(tail).expect("adjacent pieces of one region");
    assert_eq!(head.len(), LEN);

    let read = head
        .into_vec()
        .expect("the whole region, and the last buffer of it");
    assert_eq!(read.len(), LEN);
    assert_eq!(
        read.as_ptr() as u64,
        target_ptr,
        "the very same Vec is given back"
    );
    assert!(read == source, "the READ copied the exposed bytes exactly");

    let exposed = exposed.into_vec().expect("the whole exposed region");
    assert_eq!(exposed.as_ptr() as u64, exposed_ptr);
    assert!(exposed == source, "the exposed bytes are unchanged");
}
