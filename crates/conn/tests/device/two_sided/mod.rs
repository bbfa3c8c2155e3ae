//! Device tests with two sides (`rdmx-two-sided`): the server's verbs objects on one side,
//! the client's on the other, meeting only through rdmacm, the wire and barriers. In the one
//! guest they run a thread each (rxe's loopback path); `scripts/test` also runs them across
//! the wire of `scripts/softroce-twonode`, a node each (nextest profiles `twonode-A` and
//! `twonode-B` take the tests of this module).

use rdmx_two_sided::{Peer, Sides};

use super::*;

mod connections;
mod reads;
mod windows;
mod word_regions;

/// Runs `body` once per side: a node each when `scripts/softroce-twonode` runs this binary,
/// a thread each otherwise.
fn two_sided(test: &'static str, body: impl Fn(&Peer) + Sync) {
    let sides = if std::env::var_os("RDMX_NODE").is_some() {
        Sides::from_twonode_env()
    } else {
        Sides::Threads
    };
    rdmx_two_sided::two_sided(test, sides, LONG, body);
}

/// This side's address: its node's across the wire, rxe0's in one guest.
fn local_ip() -> IpAddr {
    std::env::var("RDMX_NODE_ADDR").map_or_else(|_| addr_a(), |a| a.parse().expect("an IP"))
}

/// The other side's address.
fn peer_ip() -> IpAddr {
    std::env::var("RDMX_PEER_ADDR").map_or_else(|_| addr_a(), |a| a.parse().expect("an IP"))
}

/// The server's next listener (server side).
fn listener_of(p: &Peer) -> Listener {
    let addr: SocketAddr = p.listen_addr(&local_ip().to_string()).parse().unwrap();
    let listener = Listener::bind(
        &AddrInfo::from_socket_addr(addr, Side::Passive).unwrap(),
        16,
    )
    .expect("listen");
    p.listening(listener.local_addr().expect("bound"));
    listener
}

/// The server's next listener, as the client sees it.
fn server_addr(p: &Peer) -> SocketAddr {
    p.server_addr().parse().expect("a socket address")
}

/// Connects to `addr` with `data`, retrying while nobody listens there yet.
fn connect_to(p: &Peer, addr: SocketAddr, config: &QpConfig, data: &[u8]) -> Connection {
    p.retry(&format!("connect to {addr}"), || {
        connect(&dst(addr), config, data, LONG)
    })
}

/// The server's side of a connection it tells the client a remote buffer on.
fn accept_on(listener: Listener, server: &Verbs) -> (Listener, Connection) {
    let (listener, conn, _) = accept_one(listener, server.config(), b"").join().unwrap();
    (listener, conn)
}

/// SENDs `remote` (addr, len, rkey) to the peer of `conn`, which has a receive posted.
fn tell(conn: &Connection, server: &Verbs, remote: RemoteBuf) {
    let mut ad = [0u8; 16];
    ad[..8].copy_from_slice(&remote.addr.to_le_bytes());
    ad[8..12].copy_from_slice(&remote.len.to_le_bytes());
    ad[12..].copy_from_slice(&remote.rkey.to_le_bytes());
    conn.post_send_inline(&ad, 3).unwrap();
    let sent = collect(&server.cq, 1).pop().unwrap();
    assert!(sent.status.is_success(), "{sent:?}");
}

/// Connects a client connection with one receive posted, for [`tell`].
fn listening_conn(p: &Peer, addr: SocketAddr, client: &Verbs) -> Connection {
    let conn = connect_to(p, addr, &client.config(), b"");
    let buf = client.pd.register(64, Access::LOCAL_WRITE).unwrap();
    conn.post_recv(buf, 1).map_err(|(e, _)| e).unwrap();
    conn
}

/// The remote buffer the server told (the receive [`listening_conn`] posted).
fn heard(client: &Verbs) -> RemoteBuf {
    let got = collect(&client.cq, 1).pop().unwrap();
    assert!(got.status.is_success() && got.byte_len == 16, "{got:?}");
    let ad = &got.buffer.as_ref().unwrap()[..16];
    RemoteBuf {
        addr: u64::from_le_bytes(ad[..8].try_into().unwrap()),
        len: u32::from_le_bytes(ad[8..12].try_into().unwrap()),
        rkey: u32::from_le_bytes(ad[12..].try_into().unwrap()),
    }
}

/// READs `len` bytes of `remote` on `conn` and returns the completion status.
fn read_status(conn: &Connection, side: &Verbs, remote: RemoteBuf, len: usize) -> WcStatus {
    let target = side.pd.register(len, Access::LOCAL_WRITE).unwrap();
    conn.post_read(target, len, remote, 1)
        .map_err(|(e, _)| e)
        .unwrap();
    let c = collect(&side.cq, 1).pop().unwrap();
    assert_eq!(c.kind, WorkKind::Read);
    c.status
}
