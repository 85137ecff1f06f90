//! The symmetric heap: collective, deterministic allocation over offsets.
//!
//! Every rank calls [`Heap::alloc`] and [`Heap::free`] in the same order with the same arguments
//! and therefore gets the same offsets, so one offset names "the same" buffer on every rank. The
//! allocator is first-fit over an address-ordered block list with bounded metadata
//! ([`MAX_BLOCKS`]); freeing coalesces neighbours.
//!
//! Each rank keeps a running hash (FNV-1a, 64 bit) of its call sequence and the last
//! [`HISTORY`] calls with the hash after each. Comparing two ranks' heaps with [`divergence`] names
//! the first call where they differ, which is the usual bug (one rank allocated conditionally).
//!
//! The peer layout is uniform: rank r's heap is mapped at `base + r * stride` in one virtual range,
//! so a peer pointer is arithmetic ([`Layout::ptr`], what `nvshmem_ptr` returns).

use heapless::{Deque, Vec};

/// Most blocks (free and live) the heap tracks.
pub const MAX_BLOCKS: usize = 256;
/// Calls remembered for naming a divergence.
pub const HISTORY: usize = 64;

/// Errors of the symmetric heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeapError {
    /// No free block can hold the request.
    OutOfMemory {
        /// Bytes asked for.
        size: u64,
        /// Largest free block.
        largest_free: u64,
    },
    /// The alignment is zero or not a power of two.
    BadAlignment {
        /// The alignment asked for.
        align: u64,
    },
    /// A zero-byte allocation.
    ZeroSize,
    /// The offset was already freed.
    DoubleFree {
        /// The offset.
        offset: u64,
    },
    /// The offset is not the start of a block this heap returned.
    UnknownBlock {
        /// The offset.
        offset: u64,
    },
    /// The block list is full ([`MAX_BLOCKS`]).
    TooManyBlocks,
    /// Two ranks' call sequences differ.
    Divergence(Divergence),
    /// A layout whose ranges overflow or overlap.
    BadLayout,
}

impl core::fmt::Display for HeapError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            HeapError::OutOfMemory { size, largest_free } => write!(
                f,
                "no free block holds {size} bytes (the largest free block has {largest_free})"
            ),
            HeapError::BadAlignment { align } => {
                write!(f, "alignment {align} is not a power of two")
            }
            HeapError::ZeroSize => write!(f, "a zero-byte allocation"),
            HeapError::DoubleFree { offset } => write!(f, "offset {offset} was already freed"),
            HeapError::UnknownBlock { offset } => {
                write!(f, "offset {offset} is not the start of an allocated block")
            }
            HeapError::TooManyBlocks => {
                write!(f, "the heap tracks at most {MAX_BLOCKS} blocks")
            }
            HeapError::Divergence(d) => write!(f, "{d}"),
            HeapError::BadLayout => write!(f, "a layout whose ranges overflow or overlap"),
        }
    }
}

impl core::error::Error for HeapError {}

/// One allocator call as remembered for divergence reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// Position in the call sequence (0-based).
    pub seq: u64,
    /// `true` for alloc, `false` for free.
    pub alloc: bool,
    /// Size (alloc) or 0 (free).
    pub size: u64,
    /// Alignment (alloc) or 0 (free).
    pub align: u64,
    /// Offset returned (alloc) or freed.
    pub offset: u64,
    /// Running hash after this call.
    pub hash: u64,
}

/// Where two ranks' call sequences first differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// The first differing call's position.
    pub seq: u64,
    /// This rank's call there, if remembered.
    pub mine: Option<Call>,
    /// The other rank's call there, if remembered.
    pub theirs: Option<Call>,
}

impl core::fmt::Display for Call {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.alloc {
            write!(
                f,
                "alloc({} B, align {}) -> {}",
                self.size, self.align, self.offset
            )
        } else {
            write!(f, "free({})", self.offset)
        }
    }
}

impl core::fmt::Display for Divergence {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "allocator calls diverge at call {}: ", self.seq)?;
        match self.mine {
            Some(c) => write!(f, "this rank {c}")?,
            None => write!(f, "this rank's call is not remembered")?,
        }
        match self.theirs {
            Some(c) => write!(f, ", the other {c}"),
            None => write!(f, ", the other's is not remembered"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Block {
    offset: u64,
    size: u64,
    live: bool,
}

/// A rank's symmetric-heap allocator.
#[derive(Clone, Debug)]
pub struct Heap {
    capacity: u64,
    blocks: Vec<Block, MAX_BLOCKS>,
    calls: u64,
    hash: u64,
    history: Deque<Call, HISTORY>,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(mut h: u64, words: &[u64]) -> u64 {
    for w in words {
        for b in w.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(FNV_PRIME);
        }
    }
    h
}

impl Heap {
    /// An empty heap of `capacity` bytes.
    pub fn new(capacity: u64) -> Heap {
        let mut blocks = Vec::new();
        if capacity > 0 {
            let _ = blocks.push(Block {
                offset: 0,
                size: capacity,
                live: false,
            });
        }
        Heap {
            capacity,
            blocks,
            calls: 0,
            hash: FNV_OFFSET,
            history: Deque::new(),
        }
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes in live blocks.
    pub fn used(&self) -> u64 {
        self.blocks.iter().filter(|b| b.live).map(|b| b.size).sum()
    }

    /// Number of live blocks.
    pub fn live(&self) -> usize {
        self.blocks.iter().filter(|b| b.live).count()
    }

    /// The running hash of the call sequence.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// Number of calls made.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    fn record(&mut self, alloc: bool, size: u64, align: u64, offset: u64) {
        self.hash = fnv(self.hash, &[alloc as u64, size, align, offset]);
        let call = Call {
            seq: self.calls,
            alloc,
            size,
            align,
            offset,
            hash: self.hash,
        };
        if self.history.is_full() {
            self.history.pop_front();
        }
        let _ = self.history.push_back(call);
        self.calls += 1;
    }

    /// Allocates `size` bytes aligned to `align` (a power of two); returns the offset.
    pub fn alloc(&mut self, size: u64, align: u64) -> Result<u64, HeapError> {
        if align == 0 || !align.is_power_of_two() {
            return Err(HeapError::BadAlignment { align });
        }
        if size == 0 {
            return Err(HeapError::ZeroSize);
        }
        let mut largest = 0;
        let mut found = None;
        for (i, b) in self.blocks.iter().enumerate() {
            if b.live {
                continue;
            }
            largest = largest.max(b.size);
            let start = b.offset.checked_add(align - 1).map(|x| x & !(align - 1));
            let Some(start) = start else { continue };
            let pad = start - b.offset;
            if pad.checked_add(size).is_some_and(|need| need <= b.size) {
                found = Some((i, start, pad));
                break;
            }
        }
        let Some((i, start, pad)) = found else {
            return Err(HeapError::OutOfMemory {
                size,
                largest_free: largest,
            });
        };
        let b = self.blocks[i];
        let tail = b.size - pad - size;
        let extra = (pad > 0) as usize + (tail > 0) as usize;
        if self.blocks.len() + extra > MAX_BLOCKS {
            return Err(HeapError::TooManyBlocks);
        }
        let mut at = i;
        self.blocks[i] = Block {
            offset: start,
            size,
            live: true,
        };
        if pad > 0 {
            let _ = self.blocks.insert(
                i,
                Block {
                    offset: b.offset,
                    size: pad,
                    live: false,
                },
            );
            at += 1;
        }
        if tail > 0 {
            let _ = self.blocks.insert(
                at + 1,
                Block {
                    offset: start + size,
                    size: tail,
                    live: false,
                },
            );
        }
        self.record(true, size, align, start);
        Ok(start)
    }

    /// Whether a live block starts at `offset` (what [`Heap::free`] would accept).
    pub fn is_live(&self, offset: u64) -> bool {
        self.blocks.iter().any(|b| b.offset == offset && b.live)
    }

    /// Frees the block at `offset`.
    pub fn free(&mut self, offset: u64) -> Result<(), HeapError> {
        let i = self
            .blocks
            .iter()
            .position(|b| b.offset == offset && (b.live || b.size > 0))
            .ok_or(HeapError::UnknownBlock { offset })?;
        if !self.blocks[i].live {
            // A free block starting here: either a double free or an offset never returned.
            let returned = self.history.iter().any(|c| c.alloc && c.offset == offset);
            return Err(if returned {
                HeapError::DoubleFree { offset }
            } else {
                HeapError::UnknownBlock { offset }
            });
        }
        self.blocks[i].live = false;
        if i + 1 < self.blocks.len() && !self.blocks[i + 1].live {
            self.blocks[i].size += self.blocks[i + 1].size;
            self.blocks.remove(i + 1);
        }
        if i > 0 && !self.blocks[i - 1].live {
            self.blocks[i - 1].size += self.blocks[i].size;
            self.blocks.remove(i);
        }
        self.record(false, 0, 0, offset);
        Ok(())
    }

    /// Checks the allocator's invariants: blocks tile `[0, capacity)` in order, no two free
    /// blocks are adjacent. Returns `false` if any is broken (used by tests and the fuzzer).
    pub fn invariants_hold(&self) -> bool {
        let mut next = 0;
        let mut prev_free = false;
        for b in &self.blocks {
            if b.offset != next || b.size == 0 || (prev_free && !b.live) {
                return false;
            }
            prev_free = !b.live;
            next = b.offset + b.size;
        }
        next == self.capacity
    }

    /// Remembered calls, oldest first.
    pub fn history(&self) -> impl Iterator<Item = &Call> {
        self.history.iter()
    }
}

/// Compares two ranks' heaps; `None` when their call sequences agree.
pub fn divergence(mine: &Heap, theirs: &Heap) -> Option<Divergence> {
    if mine.hash == theirs.hash && mine.calls == theirs.calls {
        return None;
    }
    let find = |h: &Heap, seq: u64| h.history.iter().find(|c| c.seq == seq).copied();
    let oldest = |h: &Heap| h.history.front().map(|c| c.seq).unwrap_or(h.calls);
    let start = oldest(mine).max(oldest(theirs));
    let end = mine.calls.max(theirs.calls);
    for seq in start..end {
        let (a, b) = (find(mine, seq), find(theirs, seq));
        if a.map(|c| c.hash) != b.map(|c| c.hash) {
            return Some(Divergence {
                seq,
                mine: a,
                theirs: b,
            });
        }
    }
    Some(Divergence {
        seq: start,
        mine: find(mine, start),
        theirs: find(theirs, start),
    })
}

/// Checks that two ranks' heaps agree, as a typed error.
pub fn check(mine: &Heap, theirs: &Heap) -> Result<(), HeapError> {
    match divergence(mine, theirs) {
        None => Ok(()),
        Some(d) => Err(HeapError::Divergence(d)),
    }
}

/// The uniform peer layout: rank r's heap at `base + r * stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Start of rank 0's heap.
    pub base: u64,
    /// Distance between consecutive ranks' heaps (at least the heap size).
    pub stride: u64,
    /// Bytes of each rank's heap.
    pub size: u64,
    /// Ranks.
    pub world: u16,
}

impl Layout {
    /// A checked layout: the whole range fits in `u64` and heaps do not overlap.
    pub fn new(base: u64, stride: u64, size: u64, world: u16) -> Result<Layout, HeapError> {
        if size > stride || world == 0 {
            return Err(HeapError::BadLayout);
        }
        (world as u64)
            .checked_mul(stride)
            .and_then(|t| t.checked_add(base))
            .ok_or(HeapError::BadLayout)?;
        Ok(Layout {
            base,
            stride,
            size,
            world,
        })
    }

    /// Address of `offset` in `peer`'s heap, or `None` when out of range.
    pub fn ptr(&self, peer: u16, offset: u64) -> Option<u64> {
        if peer >= self.world || offset >= self.size {
            return None;
        }
        Some(self.base + peer as u64 * self.stride + offset)
    }

    /// Total bytes of the reserved range.
    pub fn span(&self) -> u64 {
        self.world as u64 * self.stride
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_live_names_exactly_the_live_blocks() {
        let mut h = Heap::new(1 << 20);
        let x = h.alloc(1000, 256).unwrap();
        assert!(h.is_live(x));
        assert!(!h.is_live(x + 1) && !h.is_live(1 << 19) && !h.is_live(u64::MAX));
        h.free(x).unwrap();
        assert!(!h.is_live(x));
    }

    #[test]
    fn same_calls_same_offsets_and_coalescing() {
        let mut a = Heap::new(1 << 20);
        let mut b = Heap::new(1 << 20);
        let x = a.alloc(1000, 256).unwrap();
        let y = a.alloc(5000, 4096).unwrap();
        assert_eq!(b.alloc(1000, 256).unwrap(), x);
        assert_eq!(b.alloc(5000, 4096).unwrap(), y);
        assert_eq!(y % 4096, 0);
        assert!(a.invariants_hold());
        a.free(x).unwrap();
        a.free(y).unwrap();
        assert_eq!(a.live(), 0);
        assert!(a.invariants_hold());
        assert_eq!(a.blocks.len(), 1);
        assert_eq!(a.free(x), Err(HeapError::DoubleFree { offset: x }));
        assert_eq!(
            a.free(12345),
            Err(HeapError::UnknownBlock { offset: 12345 })
        );
        assert_eq!(a.alloc(8, 3), Err(HeapError::BadAlignment { align: 3 }));
        assert!(matches!(
            a.alloc(2 << 20, 1),
            Err(HeapError::OutOfMemory { .. })
        ));
    }

    #[test]
    fn divergence_names_the_first_differing_call() {
        let mut a = Heap::new(1 << 20);
        let mut b = Heap::new(1 << 20);
        for h in [&mut a, &mut b] {
            h.alloc(64, 64).unwrap();
            h.alloc(128, 64).unwrap();
        }
        assert_eq!(check(&a, &b), Ok(()));
        a.alloc(256, 64).unwrap();
        b.alloc(512, 64).unwrap();
        a.alloc(8, 8).unwrap();
        b.alloc(8, 8).unwrap();
        let d = divergence(&a, &b).unwrap();
        assert_eq!(d.seq, 2);
        assert_eq!(d.mine.unwrap().size, 256);
        assert_eq!(d.theirs.unwrap().size, 512);
    }

    #[test]
    fn layout_is_arithmetic() {
        let l = Layout::new(1 << 40, 1 << 30, 1 << 29, 4).unwrap();
        assert_eq!(l.ptr(3, 16), Some((1 << 40) + 3 * (1 << 30) + 16));
        assert_eq!(l.ptr(4, 0), None);
        assert_eq!(l.ptr(0, 1 << 29), None);
        assert_eq!(Layout::new(0, 10, 11, 2), Err(HeapError::BadLayout));
    }
}
