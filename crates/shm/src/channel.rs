//! A connection's pair of rings in one segment: one each way.

use std::sync::Arc;

use crate::ring::{ring_len, Consumer, Producer};
use crate::{Result, Segment};

/// Which side of a channel this process is: the side that created the segment sends on the
/// first ring and receives on the second; the side that opened it, the other way round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Created the segment (and handed it over).
    Creator,
    /// Opened the segment handed over.
    Opener,
}

/// Bytes a channel with rings of `capacity` bytes takes (its segment's size).
pub const fn channel_len(capacity: usize) -> usize {
    2 * ring_len(capacity)
}

/// Creates the segment of a channel with rings of `capacity` bytes each way.
pub fn create(name: &str, capacity: usize) -> Result<Arc<Segment>> {
    Ok(Arc::new(Segment::create(name, channel_len(capacity))?))
}

/// This side's ends of the channel in `seg` with rings of `capacity` bytes: the producer it
/// sends with and the consumer it receives with.
pub fn ends(seg: &Arc<Segment>, capacity: usize, side: Side) -> Result<(Producer, Consumer)> {
    let (tx, rx) = match side {
        Side::Creator => (0, ring_len(capacity)),
        Side::Opener => (ring_len(capacity), 0),
    };
    Ok((
        Producer::new(seg.clone(), tx, capacity)?,
        Consumer::new(seg.clone(), rx, capacity)?,
    ))
}
