//! A raw TCP peer: it speaks the TCP transport's setup with an rdmx handshake of its
//! choosing (altered as it likes) and then sends frames built by hand, reading the victim's
//! as they come.

use rdmx::proto::wire::Handshake;
use rdmx::{Ep, Listener};
use rdmx_tcp::Event;

use crate::{accept_one, RawWire, LONG};

/// A raw peer's TCP connection with a victim.
pub struct RawTcp {
    /// The connection (frames, READ requests and flushes by hand).
    pub link: rdmx_tcp::Link,
}

/// Connects to the victim's `listener` with the rdmx handshake `hs`: the raw peer and the
/// victim's endpoint for it.
pub fn connect(listener: &Listener, hs: &Handshake) -> (RawTcp, Ep) {
    let addr = listener.local_addr().expect("bound").to_string();
    let hs = hs.encode();
    let t = std::thread::spawn(move || rdmx_tcp::connect(&addr, &hs, LONG));
    let ep = accept_one(listener);
    let link = t.join().expect("connector").expect("the raw peer connects");
    (RawTcp { link }, ep)
}

impl RawWire for RawTcp {
    fn victim(&self) -> Handshake {
        Handshake::decode(self.link.peer_private_data()).expect("the victim's handshake")
    }

    fn send(&mut self, frame: &[u8]) {
        self.link.queue_frame(frame, &[]);
    }

    fn poll(&mut self, frames: &mut Vec<Vec<u8>>) -> bool {
        if self.link.flush().is_err() {
            return false;
        }
        let mut events = Vec::new();
        let mut open = self.link.poll(&mut events).is_ok();
        for e in events {
            match e {
                Event::Frame(bytes) => frames.push(bytes),
                Event::Closed { .. } => open = false,
                _ => {}
            }
        }
        open
    }
}
