//! The endpoint API in brief: two workers exchange a typed message, 16 MiB by rendezvous
//! and a reply. Run with an address of an RDMA device: `cargo run --example hello -- IP`.
use rdmx::{Context, TAG_MASK_ALL};

fn main() -> rdmx::Result<()> {
    env_logger::init();
    let ip = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "192.0.2.1".into());
    let ctx = Context::new()?;
    let server = ctx.worker()?;
    let listener = server.listen(&format!("{ip}:0"))?;
    let addr = listener.local_addr().expect("bound").to_string();
    let client = ctx.worker()?;
    let peer = std::thread::spawn(move || -> rdmx::Result<()> {
        let ep = client.connect(&addr)?;
        ep.send_obj(1, &("hello", 42u32))?; // small: eager
        let big = ep.tag_send(2, vec![7u8; 16 << 20]); // large: the server reads it
        let (reply, _) = client.recv_vec(3, TAG_MASK_ALL)?;
        big.wait()?;
        println!("client: {}", String::from_utf8_lossy(&reply));
        ep.close()
    });
    let ep = listener.accept()?;
    let ((word, n), info): ((String, u32), _) = server.recv_obj(1, TAG_MASK_ALL)?;
    let big = server.tag_recv(2, TAG_MASK_ALL, vec![0; 16 << 20]).wait()?;
    assert!(big.buf.iter().all(|&b| b == 7));
    println!(
        "server: {word} {n} (tag {}), then {} bytes",
        info.tag, big.length
    );
    ep.send(3, b"thanks")?;
    peer.join().expect("client thread")
}
