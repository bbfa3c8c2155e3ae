//! One-sided operations' bookkeeping at the target: the memory regions mapped for remote
//! access ([`Regions`]), the packed remote keys peers name them by ([`PackedKey`]), and the
//! check every remote access passes before any byte of a region is touched
//! ([`Regions::check`]).
//!
//! ## Where this sits
//!
//! UCP's `ucp_mem_map` / `ucp_rkey_pack` / `ucp_ep_rkey_unpack`, and the put, get and atomic
//! operations on an rkey, map onto transports in two ways:
//! - over RDMA the NIC performs them (WRITE, READ, FETCH_AND_ADD, CMP_AND_SWP on the region's
//!   memory region; its rkey and address travel in the packed key's RDMA part), and the
//!   target's software is not involved: the NIC checks bounds and access rights against the
//!   registration, and an access it refuses breaks the initiator's queue pair;
//! - over TCP and shared memory the operation travels as a message that the target's
//!   progress engine executes (as UCX does over its tcp transport): the target checks it here
//!   first, by region, generation, secret, bounds and the access the region was mapped with,
//!   and answers a refusal with a status naming what was wrong ([`Refusal`]). The
//!   connection stays up: a refused access is the initiator's error, not a broken link.
//!
//! This module is the part of that which is pure bookkeeping: which regions exist, with what
//! access and length, and whether a key still names one. The memory itself is the driver's
//! (the engine owns no IO memory).
//!
//! ## Keys
//!
//! A region's key is its slot, the slot's generation (bumped at every unmap, so a key packed
//! before an unmap never names the region mapped in the slot later) and a 64-bit secret the
//! driver draws from a CSPRNG at map time. A key names a region only while the slot holds one
//! of the key's generation and secret; every other key — of a slot never used, of a region
//! unmapped since (a stale key), with a guessed or forged secret — is refused as
//! [`Refusal::BadKey`], one answer for all. The target keeps no secret of an unmapped region,
//! so it could not tell a stale key from a forged one anyway; and were a stale key answered
//! apart, a peer could learn from keys with made-up secrets which slots were mapped and
//! unmapped, and when (the generation it named before the answer changed). Only the
//! checks after it — bounds, alignment, access — answer what was wrong, to a key that named
//! a mapped region. The packed form ([`PackedKey::encode`]) is what an application
//! sends its peers however it likes; decoding never panics and rejects anything malformed
//! ([`KeyDecodeError`]).
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0  | 2 | magic `b"RK"` |
//! | 2  | 1 | version (1) |
//! | 3  | 1 | access: 1 remote read, 2 remote write, 4 remote atomic (other bits 0) |
//! | 4  | 1 | parts: 1 = an RDMA part follows (other bits 0) |
//! | 5  | 3 | reserved (0) |
//! | 8  | 4 | region slot |
//! | 12 | 4 | generation |
//! | 16 | 8 | secret |
//! | 24 | 8 | length in bytes |
//! | 32 | 8 | RDMA part: the region's virtual address (if parts & 1) |
//! | 40 | 4 | RDMA part: the memory region's rkey |
//! | 44 | 4 | RDMA part: reserved (0) |

use std::fmt;

use crate::wire::{u32_at, u64_at, WireStatus};

/// The remote access a region is mapped with: none by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RemoteAccess {
    /// Peers may read it (get).
    pub read: bool,
    /// Peers may write it (put).
    pub write: bool,
    /// Peers may apply atomic operations to its aligned 8-byte words.
    pub atomic: bool,
}

impl RemoteAccess {
    /// No remote access.
    pub const NONE: RemoteAccess = RemoteAccess {
        read: false,
        write: false,
        atomic: false,
    };
    /// Remote read only.
    pub const READ: RemoteAccess = RemoteAccess {
        read: true,
        ..RemoteAccess::NONE
    };
    /// Remote write only.
    pub const WRITE: RemoteAccess = RemoteAccess {
        write: true,
        ..RemoteAccess::NONE
    };
    /// Remote atomics only.
    pub const ATOMIC: RemoteAccess = RemoteAccess {
        atomic: true,
        ..RemoteAccess::NONE
    };
    /// Everything: read, write and atomics.
    pub const ALL: RemoteAccess = RemoteAccess {
        read: true,
        write: true,
        atomic: true,
    };

    /// Whether this grants every access `other` does.
    pub fn covers(self, other: RemoteAccess) -> bool {
        (self.read || !other.read) && (self.write || !other.write) && (self.atomic || !other.atomic)
    }

    /// Whether a peer may change the region's bytes (write or atomics): then no plain
    /// reference to them may exist locally.
    pub fn peer_may_modify(self) -> bool {
        self.write || self.atomic
    }

    fn bits(self) -> u8 {
        u8::from(self.read) | u8::from(self.write) << 1 | u8::from(self.atomic) << 2
    }

    fn from_bits(b: u8) -> Option<Self> {
        (b & !7 == 0).then_some(RemoteAccess {
            read: b & 1 != 0,
            write: b & 2 != 0,
            atomic: b & 4 != 0,
        })
    }
}

/// The union of two accesses: `RemoteAccess::READ | RemoteAccess::WRITE`.
impl std::ops::BitOr for RemoteAccess {
    type Output = RemoteAccess;

    fn bitor(self, other: RemoteAccess) -> RemoteAccess {
        RemoteAccess {
            read: self.read || other.read,
            write: self.write || other.write,
            atomic: self.atomic || other.atomic,
        }
    }
}

impl fmt::Display for RemoteAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = [
            (self.read, "read"),
            (self.write, "write"),
            (self.atomic, "atomic"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect();
        if names.is_empty() {
            f.write_str("no remote access")
        } else {
            write!(f, "remote {}", names.join("+"))
        }
    }
}

/// A one-sided operation, as far as the checks are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RmaOp {
    /// Write bytes into the region (put).
    Put,
    /// Read bytes of the region (get).
    Get,
    /// An atomic operation on one aligned 8-byte word (fetch-and-add, compare-and-swap).
    Atomic,
}

impl RmaOp {
    /// The access the operation needs.
    pub fn needs(self) -> RemoteAccess {
        match self {
            RmaOp::Put => RemoteAccess::WRITE,
            RmaOp::Get => RemoteAccess::READ,
            RmaOp::Atomic => RemoteAccess::ATOMIC,
        }
    }
}

/// A region's slot in [`Regions`], named by the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(pub u32);

/// What names a region in a remote access: the fields of a key the target checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyRef {
    /// The region's slot.
    pub region: u32,
    /// The slot's generation when the key was packed.
    pub generation: u32,
    /// The region's secret.
    pub secret: u64,
}

/// The RDMA part of a packed key: where the NIC finds the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RdmaPart {
    /// The region's virtual address at the target.
    pub addr: u64,
    /// The memory region's rkey.
    pub rkey: u32,
}

/// A remote key as packed for peers ([`PackedKey::encode`]) and unpacked by them
/// ([`PackedKey::decode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PackedKey {
    /// What names the region.
    pub key: KeyRef,
    /// The region's length in bytes.
    pub len: u64,
    /// The access it was mapped with.
    pub access: RemoteAccess,
    /// Where the NIC finds it, for a region registered for RDMA.
    pub rdma: Option<RdmaPart>,
}

/// Magic number at offset 0 of a packed key (`b"RK"` little-endian).
pub const KEY_MAGIC: u16 = u16::from_le_bytes(*b"RK");
/// Version of the packed key format.
pub const KEY_VERSION: u8 = 1;
/// Bytes of a packed key without an RDMA part.
pub const KEY_LEN: usize = 32;
/// Bytes of a packed key with an RDMA part.
pub const KEY_LEN_RDMA: usize = 48;

/// Why bytes are not a packed key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyDecodeError {
    /// Not the length of a packed key with or without an RDMA part.
    #[error("a packed remote key is {KEY_LEN} or {KEY_LEN_RDMA} bytes, not {0}")]
    Length(usize),
    /// Wrong magic number: not a packed key.
    #[error("bad magic {0:#06x}: not a packed remote key")]
    BadMagic(u16),
    /// A version this side does not know.
    #[error("unsupported packed remote key version {0}")]
    BadVersion(u8),
    /// Unknown access bits.
    #[error("unknown access bits {0:#04x}")]
    BadAccess(u8),
    /// Unknown parts bits, or a length that disagrees with them.
    #[error("parts {parts:#04x} disagree with a {len}-byte key")]
    BadParts {
        /// The parts byte.
        parts: u8,
        /// The key's length.
        len: usize,
    },
    /// A reserved field was not zero.
    #[error("reserved field not zero")]
    Reserved,
}

impl PackedKey {
    /// The packed bytes ([`KEY_LEN`], or [`KEY_LEN_RDMA`] with an RDMA part).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(KEY_LEN_RDMA);
        out.extend_from_slice(&KEY_MAGIC.to_le_bytes());
        out.push(KEY_VERSION);
        out.push(self.access.bits());
        out.push(u8::from(self.rdma.is_some()));
        out.extend_from_slice(&[0; 3]);
        out.extend_from_slice(&self.key.region.to_le_bytes());
        out.extend_from_slice(&self.key.generation.to_le_bytes());
        out.extend_from_slice(&self.key.secret.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        if let Some(r) = self.rdma {
            out.extend_from_slice(&r.addr.to_le_bytes());
            out.extend_from_slice(&r.rkey.to_le_bytes());
            out.extend_from_slice(&[0; 4]);
        }
        out
    }

    /// Decodes untrusted bytes. Never panics.
    pub fn decode(b: &[u8]) -> Result<Self, KeyDecodeError> {
        if b.len() != KEY_LEN && b.len() != KEY_LEN_RDMA {
            return Err(KeyDecodeError::Length(b.len()));
        }
        let magic = u16::from_le_bytes([b[0], b[1]]);
        if magic != KEY_MAGIC {
            return Err(KeyDecodeError::BadMagic(magic));
        }
        if b[2] != KEY_VERSION {
            return Err(KeyDecodeError::BadVersion(b[2]));
        }
        let access = RemoteAccess::from_bits(b[3]).ok_or(KeyDecodeError::BadAccess(b[3]))?;
        let has_rdma = match b[4] {
            0 => false,
            1 => true,
            parts => {
                return Err(KeyDecodeError::BadParts {
                    parts,
                    len: b.len(),
                })
            }
        };
        if has_rdma != (b.len() == KEY_LEN_RDMA) {
            return Err(KeyDecodeError::BadParts {
                parts: b[4],
                len: b.len(),
            });
        }
        if b[5..8] != [0; 3] {
            return Err(KeyDecodeError::Reserved);
        }
        let rdma = if has_rdma {
            if u32_at(b, 44) != 0 {
                return Err(KeyDecodeError::Reserved);
            }
            Some(RdmaPart {
                addr: u64_at(b, 32),
                rkey: u32_at(b, 40),
            })
        } else {
            None
        };
        Ok(PackedKey {
            key: KeyRef {
                region: u32_at(b, 8),
                generation: u32_at(b, 12),
                secret: u64_at(b, 16),
            },
            len: u64_at(b, 24),
            access,
            rdma,
        })
    }

    /// Checks, at the initiator, that an operation is within what the key allows: the same
    /// bounds and access checks the target makes ([`Regions::check`]), so a request that
    /// would certainly be refused fails before anything is sent.
    pub fn allows(&self, op: RmaOp, offset: u64, len: u64) -> Result<(), Refusal> {
        within(self.len, self.access, op, offset, len)
    }
}

/// Why the target refuses a remote access (and the initiator's request fails with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Refusal {
    /// The key names no region mapped now: none was ever mapped in its slot, the region it
    /// named was unmapped since (a stale key), or its generation or secret is wrong (a
    /// forged or corrupted key). One refusal for all of them: a peer cannot tell from it
    /// which (see the module's Keys).
    #[error("the remote key names no mapped region (never mapped, unmapped since, or forged)")]
    BadKey,
    /// The access reaches past the region's end.
    #[error("{len} bytes at offset {offset} are outside the {region_len}-byte region")]
    OutOfBounds {
        /// Offset of the access in the region.
        offset: u64,
        /// Bytes accessed.
        len: u64,
        /// The region's length.
        region_len: u64,
    },
    /// An atomic operation on a word that is not 8-byte aligned.
    #[error("atomic operation at offset {0}, not a multiple of 8")]
    Unaligned(u64),
    /// The region was not mapped with the access the operation needs.
    #[error("{op:?} needs {}, the region was mapped with {granted}", op.needs())]
    NotPermitted {
        /// The operation.
        op: RmaOp,
        /// The access the region was mapped with.
        granted: RemoteAccess,
    },
}

/// Bounds, alignment and access checks of one operation on a region of `region_len` bytes
/// mapped with `granted`.
fn within(
    region_len: u64,
    granted: RemoteAccess,
    op: RmaOp,
    offset: u64,
    len: u64,
) -> Result<(), Refusal> {
    if !granted.covers(op.needs()) {
        return Err(Refusal::NotPermitted { op, granted });
    }
    let len = if op == RmaOp::Atomic { 8 } else { len };
    if offset.checked_add(len).map_or(true, |end| end > region_len) {
        return Err(Refusal::OutOfBounds {
            offset,
            len,
            region_len,
        });
    }
    if op == RmaOp::Atomic && offset % 8 != 0 {
        return Err(Refusal::Unaligned(offset));
    }
    Ok(())
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    /// `None` while the slot is free.
    region: Option<Mapped>,
}

#[derive(Debug)]
struct Mapped {
    secret: u64,
    len: u64,
    access: RemoteAccess,
}

/// The regions of one worker mapped for remote access, by slot.
///
/// A slot freed by [`Regions::unmap`] is reused by a later map under the next generation, so
/// a key of the old region is refused ([`Refusal::BadKey`]), never taken for the new one.
#[derive(Debug, Default)]
pub struct Regions {
    slots: Vec<Slot>,
    free: Vec<u32>,
    mapped: usize,
}

impl Regions {
    /// Maps a region of `len` bytes with `access`, named by the `secret` the driver drew
    /// (from a CSPRNG): its key. `None` when every one of the 2^32 slots is taken.
    pub fn map(&mut self, len: u64, access: RemoteAccess, secret: u64) -> Option<KeyRef> {
        let region = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.slots.len()).ok()?;
                self.slots.push(Slot {
                    generation: 0,
                    region: None,
                });
                i
            }
        };
        let slot = &mut self.slots[region as usize];
        slot.region = Some(Mapped {
            secret,
            len,
            access,
        });
        self.mapped += 1;
        Some(KeyRef {
            region,
            generation: slot.generation,
            secret,
        })
    }

    /// Unmaps the region `key` names: every later access with the key is refused
    /// ([`Refusal::BadKey`], as a forged key is). A refusal when `key` names no mapped
    /// region.
    pub fn unmap(&mut self, key: &KeyRef) -> Result<(), Refusal> {
        self.find(key)?;
        let slot = &mut self.slots[key.region as usize];
        slot.region = None;
        // (A slot whose generations ran out is never reused: a key of any of its regions
        // stays refused.)
        if let Some(next) = slot.generation.checked_add(1) {
            slot.generation = next;
            self.free.push(key.region);
        }
        self.mapped -= 1;
        Ok(())
    }

    /// How many regions are mapped.
    pub fn len(&self) -> usize {
        self.mapped
    }

    /// Whether no region is mapped.
    pub fn is_empty(&self) -> bool {
        self.mapped == 0
    }

    /// Checks a remote access: `op` on `len` bytes at `offset` of the region `key` names
    /// (an atomic operation's length is its word's 8 bytes, whatever `len` says). The
    /// region's id when the access may go ahead.
    pub fn check(
        &self,
        key: &KeyRef,
        op: RmaOp,
        offset: u64,
        len: u64,
    ) -> Result<RegionId, Refusal> {
        let m = self.find(key)?;
        within(m.len, m.access, op, offset, len)?;
        Ok(RegionId(key.region))
    }

    /// The region `key` names: the one its slot holds, if the key is of its generation and
    /// has its secret. Any other key — of a slot never used, an earlier or later
    /// generation, or another secret — is [`Refusal::BadKey`], one answer for all: the
    /// generation is compared only together with the secret, so a key with a made-up secret
    /// learns nothing of the slot's history.
    fn find(&self, key: &KeyRef) -> Result<&Mapped, Refusal> {
        match self.slots.get(key.region as usize) {
            Some(Slot {
                generation,
                region: Some(m),
            }) if m.secret == key.secret && *generation == key.generation => Ok(m),
            _ => Err(Refusal::BadKey),
        }
    }
}

/// What kind of [`Refusal`] a target answered with: all a reply carries of it (the
/// target's log has the rest), and what a request that was refused completes with
/// ([`crate::Status::Refused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusalKind {
    /// [`Refusal::BadKey`]: the key names no mapped region (never mapped, unmapped since —
    /// a stale key —, or forged; a target answers them alike).
    BadKey,
    /// [`Refusal::OutOfBounds`].
    OutOfBounds,
    /// [`Refusal::Unaligned`].
    Unaligned,
    /// [`Refusal::NotPermitted`].
    NotPermitted,
    /// Over RDMA: the target's NIC refused the access — a stale key, an access outside the
    /// region or one it does not grant (the verbs do not tell which). The queue pair is
    /// broken by it: the connection closes.
    RemoteAccess,
}

impl fmt::Display for RefusalKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

impl RefusalKind {
    /// What it means, in words.
    pub fn describe(self) -> &'static str {
        match self {
            RefusalKind::BadKey => {
                "the remote key names no mapped region (never mapped, unmapped since, or forged)"
            }
            RefusalKind::OutOfBounds => "the access reaches outside the remote region",
            RefusalKind::Unaligned => "the atomic word is not 8-byte aligned",
            RefusalKind::NotPermitted => {
                "the remote region was not mapped with the access the operation needs"
            }
            RefusalKind::RemoteAccess => {
                "the target's NIC refused the access (a stale key, outside the region, or not \
                 granted), which broke the connection"
            }
        }
    }
}

impl Refusal {
    /// Its kind.
    pub fn kind(&self) -> RefusalKind {
        match self {
            Refusal::BadKey => RefusalKind::BadKey,
            Refusal::OutOfBounds { .. } => RefusalKind::OutOfBounds,
            Refusal::Unaligned(_) => RefusalKind::Unaligned,
            Refusal::NotPermitted { .. } => RefusalKind::NotPermitted,
        }
    }
}

impl RefusalKind {
    /// The status byte of a reply refusing with it.
    pub(crate) fn wire(self) -> WireStatus {
        match self {
            RefusalKind::BadKey => WireStatus::BadKey,
            RefusalKind::OutOfBounds => WireStatus::OutOfBounds,
            RefusalKind::Unaligned => WireStatus::Unaligned,
            // (Never on the wire: only a NIC refuses so; a target's checks never do.)
            RefusalKind::NotPermitted | RefusalKind::RemoteAccess => WireStatus::NotPermitted,
        }
    }

    /// The refusal a reply's status byte names; `None` for success (or a status no reply
    /// carries, which decoding rules out).
    pub(crate) fn from_wire(s: WireStatus) -> Option<Self> {
        Some(match s {
            // (A target no longer answers "stale key", which it cannot tell from a forged
            // one; a reply that still does means the same as "bad key".)
            WireStatus::BadKey | WireStatus::StaleKey => RefusalKind::BadKey,
            WireStatus::OutOfBounds => RefusalKind::OutOfBounds,
            WireStatus::Unaligned => RefusalKind::Unaligned,
            WireStatus::NotPermitted => RefusalKind::NotPermitted,
            _ => return None,
        })
    }
}

/// An atomic operation on one 8-byte word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// Adds the value (wrapping).
    FetchAdd(u64),
    /// Replaces the word with `new` if it holds `expected`.
    CompareSwap {
        /// The value the word must hold.
        expected: u64,
        /// Its replacement.
        new: u64,
    },
}

/// The target's regions as the engine reaches them when it executes a peer's put, get or
/// atomic operation: implemented by the driver, which owns the memory (the engine owns
/// none), over its own table of regions ([`Regions`] for the keys). Each call checks the
/// key and the access ([`Regions::check`]) and either performs the whole access or none
/// of it. Called in the order the operations arrived on each connection.
pub trait RmaMemory: Send + Sync {
    /// Writes `data` at `offset` of the region `key` names.
    fn put(&self, key: &KeyRef, offset: u64, data: &[u8]) -> Result<(), Refusal>;
    /// Reads `len` bytes at `offset` of the region `key` names into `out`, which then holds
    /// exactly them (what it held before is dropped; its allocation is reused). The access
    /// is checked before `out` is touched: a refused one leaves it as it was, so that a
    /// peer's get with a key that names nothing costs no allocation of the length it asked
    /// for.
    fn get(&self, key: &KeyRef, offset: u64, len: usize, out: &mut Vec<u8>) -> Result<(), Refusal>;
    /// Applies `op` to the 8-byte word at `offset` of the region `key` names; the word's
    /// old value.
    fn atomic(&self, key: &KeyRef, offset: u64, op: AtomicOp) -> Result<u64, Refusal>;
}
