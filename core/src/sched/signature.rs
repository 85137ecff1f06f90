//! The signature of a call: one 64-bit word that says which call a rank is making, so that a
//! peer comparing it with its own names a call that differs across ranks at once instead of
//! waiting for a deadline.
//!
//! The word packs the call's sequence number and its request's fields, so that two signatures
//! say *what* differs, not only that something does ([`Signature::differs`]):
//!
//! | bits | field |
//! |---|---|
//! | 0..12 | sequence number of the call on its team (mod 2^12) |
//! | 12..16 | the plan's shape: channels, chunk and slots, folded to 4 bits |
//! | 16..20 | collective (its index in [`Collective::ALL`]) |
//! | 20..26 | algorithm (its index in [`Algorithm::ALL`]) |
//! | 26..30 | element type (index in [`DType::ALL`]) |
//! | 30..33 | reduction operator (index in [`ReduceOp::ALL`]) |
//! | 33..40 | root (or send-receive pair), folded to 7 bits |
//! | 40..46 | the byte count's power of two (its trailing zeros) |
//! | 46..64 | a hash of the byte count's odd part, 18 bits |
//!
//! Equal calls give equal words, always: the word is a function of the sequence number and the
//! request. Calls that differ in the collective, algorithm, type or operator give different
//! words, always; a root or size that differs gives a different word unless its fold collides
//! (roots whose 7-bit folds agree, sizes with the same power of two whose odd parts hash
//! alike, shapes whose 4-bit folds agree), and then the call
//! is still caught by what follows (the data's layout, the deadline). The sequence number
//! catches a rank that skipped a call or called twice, within 2^12 calls.
//!
//! **The check** ([`Signature::check`]) is what makes the word safe to compare without a
//! barrier between calls: a rank publishes its word for call `k` in its word `k mod 2` before
//! its first signal of the call, and a peer that has waited for one of those signals reads it.
//! By then the publisher may have gone on to call `k + 2` and overwritten that word (the reader
//! is slow): the sequence number says so, and the check stays silent. It names a difference
//! only when the word read carries the reader's own sequence number, that is, when it is the
//! peer's call `k`; so agreeing calls never fire, however far apart the ranks run.
//!
//! Where the word travels and when it is compared is the executors' business; this module is
//! its definition, shared by every one of them. The host's back-to-back calls
//! (`symm_host::run_calls`) publish it in the rank's own pad and peers read it. On the GPU
//! (`kernels/symm/signature.cuh`, `symm_sig_*`) a call's block pushes its word into every peer's
//! signature words before its first signal, and reads those its peers pushed to it, in its own
//! memory, beside its low-latency lines, while a wait spins, and at its end for a word not
//! checked yet: the sequence number is the rank's call counter of
//! the channel, in device memory, so graph replays count too (read and written back plus one
//! at the call's start, off its end); a team's calls carry no word.

use super::{Algorithm, Collective, Request};
use crate::dtype::{DType, ReduceOp};

/// A call's signature word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Signature(pub u64);

bitflags::bitflags! {
    /// What differs between two signatures.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct Differs: u8 {
        /// The sequence number: one rank skipped a call or made one more.
        const SEQUENCE = 1 << 0;
        /// The plan's shape: channels, chunk or slots.
        const SHAPE = 1 << 7;
        /// The collective.
        const COLLECTIVE = 1 << 1;
        /// The algorithm.
        const ALGORITHM = 1 << 2;
        /// The element type.
        const DTYPE = 1 << 3;
        /// The reduction operator.
        const OP = 1 << 4;
        /// The root (or send-receive pair).
        const ROOT = 1 << 5;
        /// The size.
        const SIZE = 1 << 6;
    }
}

/// (shift, width) of each field, in the order of [`Differs`]'s flags.
const FIELDS: [(u32, u32); 8] = [
    (0, 12),
    (16, 4),
    (20, 6),
    (26, 4),
    (30, 3),
    (33, 7),
    (40, 24),
    (12, 4),
];

// Every field's width holds its every value.
const _: () = assert!(
    Collective::ALL.len() < 1 << 4
        && Algorithm::ALL.len() < 1 << 6
        && DType::ALL.len() < 1 << 4
        && ReduceOp::ALL.len() < 1 << 3
);

fn index_of<T: PartialEq>(all: &[T], x: &T) -> u64 {
    all.iter().position(|y| y == x).unwrap_or(all.len()) as u64
}

/// The root, or the send-receive pair, of a collective (0 for the unrooted ones).
fn root_of(c: Collective) -> u64 {
    match c {
        Collective::Broadcast { root }
        | Collective::Reduce { root }
        | Collective::Scatter { root }
        | Collective::Gather { root } => root as u64,
        Collective::SendRecv { src, dst } => (src as u64).wrapping_mul(31) ^ dst as u64,
        Collective::AllReduce
        | Collective::ReduceScatter
        | Collective::AllGather
        | Collective::AllToAll
        | Collective::AllToAllV => 0,
    }
}

/// A byte count in 24 bits: its power of two exactly (6 bits: every power of two has its own),
/// and a multiplicative hash of its odd part (18 bits).
fn size_bits(bytes: u64) -> u64 {
    let zeros = bytes.trailing_zeros().min(63) as u64;
    let odd = bytes >> zeros;
    let hash = odd.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 46;
    zeros | hash << 6
}

/// `x` folded to `bits` bits by xor of its `bits`-wide pieces.
fn fold(mut x: u64, bits: u32) -> u64 {
    let mask = (1u64 << bits) - 1;
    let mut out = 0;
    while x != 0 {
        out ^= x & mask;
        x >>= bits;
    }
    out
}

impl Request {
    /// The signature of this request as call number `seq` of its team.
    ///
    /// ```
    /// use symm_core::dtype::{DType, ReduceOp};
    /// use symm_core::sched::{Algorithm, Collective, Differs, Request};
    ///
    /// let req = Request::new(Collective::AllReduce, Algorithm::OneShot, 4, 4096,
    ///                        DType::Bf16, ReduceOp::Sum);
    /// assert_eq!(req.signature(7), req.signature(7));
    /// let f32s = Request { dtype: DType::F32, ..req };
    /// assert_eq!(req.signature(7).differs(f32s.signature(7)), Differs::DTYPE);
    /// assert_eq!(req.signature(7).differs(req.signature(8)), Differs::SEQUENCE);
    /// ```
    pub fn signature(&self, seq: u64) -> Signature {
        let values = [
            seq,
            index_of(&Collective::ALL, &self.collective.with_root(0)),
            index_of(&Algorithm::ALL, &self.algorithm),
            index_of(&DType::ALL, &self.dtype),
            index_of(&ReduceOp::ALL, &self.op),
            fold(root_of(self.collective), 7),
            size_bits(self.bytes),
            fold(
                (self.channels as u64) ^ self.chunk_bytes.rotate_left(8) ^ (self.slots as u64) << 5,
                4,
            ),
        ];
        let mut word = 0u64;
        for (&(shift, width), v) in FIELDS.iter().zip(values) {
            word |= (v & ((1u64 << width) - 1)) << shift;
        }
        Signature(word)
    }
}

impl Signature {
    /// The fields in which `self` and `other` differ (empty: the same call).
    pub fn differs(self, other: Signature) -> Differs {
        let mut d = Differs::empty();
        for (i, &(shift, width)) in FIELDS.iter().enumerate() {
            let mask = ((1u64 << width) - 1) << shift;
            if self.0 & mask != other.0 & mask {
                d |= Differs::from_bits_truncate(1 << i);
            }
        }
        d
    }

    /// The sequence number it carries (mod 2^12).
    pub fn sequence(self) -> u16 {
        (self.0 & 0xfff) as u16
    }

    /// The check of a peer's word `theirs`, read by a rank making call `self` after it waited
    /// for one of the peer's signals of that call: what differs, when the word is the peer's
    /// call of the same sequence number and not the same call; `None` when it is the same call,
    /// or a later call of the peer (its sequence number says so).
    ///
    /// ```
    /// use symm_core::dtype::{DType, ReduceOp};
    /// use symm_core::sched::{Algorithm, Collective, Differs, Request};
    ///
    /// let ar = Request::new(Collective::AllReduce, Algorithm::OneShot, 2, 4096,
    ///                       DType::F32, ReduceOp::Sum);
    /// let ag = Request { collective: Collective::AllGather, ..ar };
    /// // The same call: silent. The peer already at its next call: silent.
    /// assert_eq!(ar.signature(4).check(ar.signature(4)), None);
    /// assert_eq!(ar.signature(4).check(ag.signature(6)), None);
    /// // The peer's call 4 is another collective: named.
    /// assert_eq!(ar.signature(4).check(ag.signature(4)), Some(Differs::COLLECTIVE));
    /// ```
    pub fn check(self, theirs: Signature) -> Option<Differs> {
        if self.sequence() != theirs.sequence() || self == theirs {
            return None;
        }
        Some(self.differs(theirs))
    }
}

impl Differs {
    /// What differs, in words ("the collective and the size"), for an error message.
    pub fn words(self) -> heapless::String<160> {
        const NAMES: [&str; 8] = [
            "the sequence (a rank skipped a call or made one more)",
            "the collective",
            "the algorithm",
            "the element type",
            "the reduction operator",
            "the root",
            "the size",
            "the channels or pipelining",
        ];
        let mut out = heapless::String::new();
        let named: heapless::Vec<&str, 8> = NAMES
            .iter()
            .enumerate()
            .filter(|&(i, _)| self.bits() & (1 << i) != 0)
            .map(|(_, n)| *n)
            .collect();
        for (i, n) in named.iter().enumerate() {
            let sep = match (i, named.len() - i) {
                (0, _) => "",
                (_, 1) => " and ",
                _ => ", ",
            };
            // Full: the words are cut, never the call refused.
            let _ = out.push_str(sep);
            let _ = out.push_str(n);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::collectives;

    fn base() -> Request {
        Request::new(
            Collective::AllReduce,
            Algorithm::TwoShot,
            8,
            1 << 20,
            DType::Bf16,
            ReduceOp::Sum,
        )
    }

    #[test]
    fn channels_and_pipelining_are_part_of_the_call() {
        // Ranks that run one call with other channels or pipelining run other schedules.
        let r = base();
        assert_eq!(
            r.signature(3).differs(r.with_channels(4).signature(3)),
            Differs::SHAPE
        );
        assert_eq!(
            r.signature(3)
                .differs(r.with_pipeline(4096, 3).signature(3)),
            Differs::SHAPE
        );
    }

    #[test]
    fn each_field_that_differs_is_named_alone() {
        let r = base();
        let s = r.signature(5);
        let cases: [(Request, Differs); 5] = [
            (
                Request {
                    collective: Collective::ReduceScatter,
                    ..r
                },
                Differs::COLLECTIVE,
            ),
            (
                Request {
                    algorithm: Algorithm::OneShot,
                    ..r
                },
                Differs::ALGORITHM,
            ),
            (
                Request {
                    dtype: DType::F16,
                    ..r
                },
                Differs::DTYPE,
            ),
            (
                Request {
                    op: ReduceOp::Max,
                    ..r
                },
                Differs::OP,
            ),
            (
                Request {
                    bytes: 2 << 20,
                    ..r
                },
                Differs::SIZE,
            ),
        ];
        for (other, d) in cases {
            assert_eq!(s.differs(other.signature(5)), d, "{other:?}");
        }
        let b = |root| Request {
            collective: Collective::Broadcast { root },
            ..r
        };
        assert_eq!(b(1).signature(5).differs(b(2).signature(5)), Differs::ROOT);
        assert_eq!(
            b(1).signature(5).differs(r.signature(5)),
            Differs::COLLECTIVE | Differs::ROOT
        );
        assert_eq!(s.differs(r.signature(6)), Differs::SEQUENCE);
    }

    #[test]
    fn every_pair_of_collectives_and_sizes_up_to_a_gib_is_told_apart() {
        let r = base();
        let colls = collectives(8);
        for (i, a) in colls.iter().enumerate() {
            for b in &colls[i + 1..] {
                let (x, y) = (
                    Request {
                        collective: *a,
                        ..r
                    },
                    Request {
                        collective: *b,
                        ..r
                    },
                );
                assert!(x
                    .signature(0)
                    .differs(y.signature(0))
                    .contains(Differs::COLLECTIVE));
            }
        }
        // Every power of two and its neighbours up to 1 GiB has its own 24 bits.
        let mut seen = alloc::collections::BTreeSet::new();
        for k in 0..=30u32 {
            for d in [0i64, 2, -2] {
                let bytes = ((1i64 << k) + d).max(1) as u64;
                seen.insert((size_bits(bytes), bytes));
            }
        }
        let folds: alloc::collections::BTreeSet<u64> = seen.iter().map(|&(f, _)| f).collect();
        let sizes: alloc::collections::BTreeSet<u64> = seen.iter().map(|&(_, b)| b).collect();
        assert_eq!(folds.len(), sizes.len());
    }

    #[test]
    fn the_words_name_what_differs() {
        assert_eq!(Differs::SIZE.words().as_str(), "the size");
        assert_eq!(
            (Differs::COLLECTIVE | Differs::ROOT | Differs::SIZE)
                .words()
                .as_str(),
            "the collective, the root and the size"
        );
        assert_eq!(Differs::empty().words().as_str(), "");
    }
}
