//! The algorithm table: every algorithm described once.
//!
//! Each algorithm lives in one file (`ring.rs`, `tree.rs`, ...) that holds its program (the
//! phases of units that [`Schedule`](super::Schedule) walks) and its [`Desc`]: the collectives
//! it serves, the scratch streams and minimum slots a request needs, and its cost on the
//! critical path. The one table (the `algorithms!` invocation in `sched/mod.rs`) names each
//! file and, per algorithm, its short name, program type and description; from it the macro
//! here writes the files' `mod` lines, the [`Algorithm`](super::Algorithm) enum,
//! `Algorithm::ALL`, names, the per-collective lists of [`algorithms`](super::algorithms), and
//! the program dispatch, all with exhaustive matches: an algorithm added to the table is
//! served, sized, scheduled and priced from its own file, or the crate does not compile.
//!
//! Adding an algorithm: write `sched/<file>.rs` with a type implementing `Program` and a
//! `pub(crate) const DESC: Desc`, then add one row to the table. (The enum's variant order is
//! part of the trace format: new rows go at the end.)

use super::{Collective, Request};
use crate::cost::{Path, Shape};

/// Bits of [`Desc::serves`], one per collective.
pub(crate) mod serves {
    /// All-reduce.
    pub const ALL_REDUCE: u16 = 1 << 0;
    /// Reduce-scatter.
    pub const REDUCE_SCATTER: u16 = 1 << 1;
    /// All-gather.
    pub const ALL_GATHER: u16 = 1 << 2;
    /// Broadcast.
    pub const BROADCAST: u16 = 1 << 3;
    /// Reduce.
    pub const REDUCE: u16 = 1 << 4;
    /// Scatter.
    pub const SCATTER: u16 = 1 << 5;
    /// Gather.
    pub const GATHER: u16 = 1 << 6;
    /// All-to-all.
    pub const ALL_TO_ALL: u16 = 1 << 7;
    /// All-to-allv.
    pub const ALL_TO_ALLV: u16 = 1 << 8;
    /// Send-receive.
    pub const SEND_RECV: u16 = 1 << 9;
}

/// Number of collective kinds ([`Collective::bit`]).
pub(crate) const KINDS: usize = 10;

impl Collective {
    /// This collective's bit of [`Desc::serves`].
    pub(crate) const fn bit(&self) -> u16 {
        match self {
            Collective::AllReduce => serves::ALL_REDUCE,
            Collective::ReduceScatter => serves::REDUCE_SCATTER,
            Collective::AllGather => serves::ALL_GATHER,
            Collective::Broadcast { .. } => serves::BROADCAST,
            Collective::Reduce { .. } => serves::REDUCE,
            Collective::Scatter { .. } => serves::SCATTER,
            Collective::Gather { .. } => serves::GATHER,
            Collective::AllToAll => serves::ALL_TO_ALL,
            Collective::AllToAllV => serves::ALL_TO_ALLV,
            Collective::SendRecv { .. } => serves::SEND_RECV,
        }
    }
}

/// What an algorithm is, besides its program.
#[derive(Clone, Copy)]
pub struct Desc {
    /// The collectives it serves (bits of `serves`).
    pub(crate) serves: u16,
    /// Scratch streams per channel a request needs (each `slots` chunks).
    pub(crate) streams: fn(&Request) -> u64,
    /// Fewest scratch slots per stream that cannot deadlock.
    pub(crate) min_slots: fn(&Request) -> u8,
    /// Hops and bytes of the critical path on one channel (worlds of 2 and more).
    pub(crate) cost: fn(&Request, &Shape) -> Path,
    /// Scratch bytes per rank besides the streams (the low-latency regions).
    pub(crate) scratch: fn(&Request) -> u64,
    /// Largest `Request::bytes` the algorithm takes on a number of channels.
    pub(crate) max_bytes: fn(u16) -> u64,
    /// The collectives (bits of `serves`) whose output may be the input, byte for byte: the
    /// schedule reads a place of a rank's input only before anything writes that place of its
    /// output ([`Request::runs_in_place`](super::Request::runs_in_place)).
    pub(crate) in_place: u16,
    /// The collectives (bits of `serves`) in which only a rank itself reads its input (`[0]`)
    /// or writes its output (`[1]`): no peer's op names them, so a binding may hand the kernel
    /// any device memory of the rank for that side, unstaged
    /// ([`Request::owns`](super::Request::owns)).
    pub(crate) own: [u16; 2],
    /// How it combines the ranks' contributions to one element of a reduction: what
    /// deterministic mode reads ([`Request::is_deterministic`](super::Request::is_deterministic)).
    pub(crate) combines: super::Combines,
}

impl core::fmt::Debug for Desc {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Desc")
            .field("serves", &self.serves)
            .finish()
    }
}

/// No scratch besides the streams.
pub(crate) fn no_scratch(_: &Request) -> u64 {
    0
}

/// No scratch streams.
pub(crate) fn no_streams(_: &Request) -> u64 {
    0
}

/// No bound on the message.
pub(crate) fn unbounded(_channels: u16) -> u64 {
    u64::MAX
}

/// One slot is enough.
pub(crate) fn one_slot(_: &Request) -> u8 {
    1
}

/// Writes the algorithm table's items from its rows (see the module documentation): a
/// `mod` per file, and per row the [`Algorithm`] variant, its name, its description and its
/// program; every match it writes is exhaustive.
macro_rules! algorithms {
    ($( $file:ident { $( $(#[$doc:meta])* $v:ident = $name:literal, $prog:ident, $desc:ident; )* } )*) => {
        $( mod $file; )*

        /// An algorithm.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        #[non_exhaustive]
        pub enum Algorithm {
            $( $( $(#[$doc])* $v, )* )*
        }

        const COUNT: usize = [$( $(stringify!($v),)* )*].len();
        const DESCS: [&table::Desc; COUNT] = [$( $(&$file::$desc,)* )*];

        impl Algorithm {
            /// Every algorithm, in table order.
            pub const ALL: [Algorithm; COUNT] = [$( $(Algorithm::$v,)* )*];

            /// Short name.
            pub fn name(&self) -> &'static str {
                match self {
                    $( $( Algorithm::$v => $name, )* )*
                }
            }

            /// Whether the algorithm takes a message of `bytes` (`Request::bytes`) on one
            /// channel: every algorithm but the low-latency ones, which stop at
            /// `ll::MAX_BYTES` per channel.
            pub fn takes(&self, bytes: u64) -> bool {
                self.takes_on(bytes, 1)
            }

            /// Whether the algorithm takes a message of `bytes` on `channels` channels (the
            /// low-latency ones split it over up to `ll::MAX_CHANNELS` of them).
            pub fn takes_on(&self, bytes: u64, channels: u16) -> bool {
                bytes <= (self.desc().max_bytes)(channels)
            }

            /// The algorithm's description (from its own file).
            pub(crate) fn desc(&self) -> &'static table::Desc {
                match self {
                    $( $( Algorithm::$v => &$file::$desc, )* )*
                }
            }
        }

        /// An algorithm's program for one (rank, channel), or nothing to do.
        #[derive(Clone, Copy, Debug)]
        #[allow(clippy::large_enum_variant)]
        pub(crate) enum Algo {
            $( $( $v($file::$prog), )* )*
            Empty,
        }

        impl Algo {
            /// The program of the context's request (validated by `Ctx::new`).
            pub(crate) fn new(ctx: &Ctx) -> Algo {
                match ctx.req.algorithm {
                    $( $( Algorithm::$v => Algo::$v(<$file::$prog as Program>::new(ctx)), )* )*
                }
            }

            pub(crate) fn phases(&self) -> u8 {
                match self {
                    $( $( Algo::$v(_) => <$file::$prog as Program>::PHASES, )* )*
                    Algo::Empty => 0,
                }
            }

            pub(crate) fn units(&self, c: &Ctx, p: u8) -> u64 {
                match self {
                    $( $( Algo::$v(a) => a.units(c, p), )* )*
                    Algo::Empty => 0,
                }
            }

            pub(crate) fn emit(&self, c: &Ctx, p: u8, u: u64, out: &mut Batch) {
                match self {
                    $( $( Algo::$v(a) => a.emit(c, p, u, out), )* )*
                    Algo::Empty => {}
                }
            }
        }

        /// For each collective bit, the algorithms serving it, in table order, and how many.
        const BY_KIND: [([Algorithm; COUNT], usize); table::KINDS] = {
            let mut out = [([Algorithm::ALL[0]; COUNT], 0); table::KINDS];
            let mut k = 0;
            while k < table::KINDS {
                let mut i = 0;
                while i < COUNT {
                    if DESCS[i].serves & (1 << k) != 0 {
                        out[k].0[out[k].1] = Algorithm::ALL[i];
                        out[k].1 += 1;
                    }
                    i += 1;
                }
                k += 1;
            }
            out
        };

        /// Which algorithms each collective supports (the table's order).
        pub fn algorithms(c: Collective) -> &'static [Algorithm] {
            let (list, n) = &BY_KIND[c.bit().trailing_zeros() as usize];
            &list[..*n]
        }
    };
}

#[cfg(test)]
mod tests {
    use super::super::{algorithms, Algorithm};
    use super::*;

    /// Every collective is served, every algorithm serves something, and the lists agree with
    /// the descriptions.
    #[test]
    fn the_table_is_consistent() {
        for c in super::super::collectives(5)
            .into_iter()
            .chain([Collective::AllToAllV])
        {
            let list = algorithms(c);
            assert!(!list.is_empty(), "{c:?}");
            for a in Algorithm::ALL {
                assert_eq!(
                    list.contains(&a),
                    a.desc().serves & c.bit() != 0,
                    "{c:?} {a:?}"
                );
            }
        }
        for a in Algorithm::ALL {
            assert_ne!(a.desc().serves, 0, "{a:?}");
        }
    }
}
