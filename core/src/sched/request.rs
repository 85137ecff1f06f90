//! What a collective asks for: the collective, the algorithm and the request's parameters,
//! their validation, the buffer sizes they imply, and the typed scheduling errors.

use super::{algorithms, Algorithm, DEFAULT_CHUNK, DEFAULT_SLOTS, MAX_CHANNELS, MAX_WORLD};
use crate::dtype::{DType, ReduceOp};
use crate::signal::SlotLayout;
use serde::{Deserialize, Serialize};

/// A collective operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Collective {
    /// Every rank ends with the reduction of every rank's input (`bytes` per rank).
    AllReduce,
    /// Rank r ends with block r of the reduction (`bytes` is the block size; input is world blocks).
    ReduceScatter,
    /// Every rank ends with every rank's input block (`bytes` per block; output is world blocks).
    AllGather,
    /// Every rank ends with the root's input.
    Broadcast {
        /// The rank whose input is broadcast.
        root: u16,
    },
    /// The root ends with the reduction of every rank's input.
    Reduce {
        /// The rank that receives the result.
        root: u16,
    },
    /// Rank r ends with block r of the root's input (`bytes` per block).
    Scatter {
        /// The rank that owns the data.
        root: u16,
    },
    /// The root ends with every rank's input, block r from rank r (`bytes` per block).
    Gather {
        /// The rank that receives the data.
        root: u16,
    },
    /// Rank r's input block q ends in rank q's output block r (`bytes` per block).
    AllToAll,
    /// All-to-all with per-pair element counts given to
    /// [`alltoallv()`](crate::sched::alltoallv()); `bytes` is the size of every rank's (symmetric)
    /// input and output buffer.
    AllToAllV,
    /// `src`'s input ends in `dst`'s output; other ranks do nothing.
    SendRecv {
        /// Sender.
        src: u16,
        /// Receiver.
        dst: u16,
    },
}

impl Collective {
    /// Every collective, rooted ones with root 0 and send-receive from 0 to 0: the one list
    /// of collectives, in the order of the C ABI's codes (a code is an index here).
    pub const ALL: [Collective; 10] = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast { root: 0 },
        Collective::Reduce { root: 0 },
        Collective::Scatter { root: 0 },
        Collective::Gather { root: 0 },
        Collective::AllToAll,
        Collective::AllToAllV,
        Collective::SendRecv { src: 0, dst: 0 },
    ];

    /// The collective with its root set to `root` when it has one (broadcast, reduce, scatter,
    /// gather); any other collective unchanged.
    pub fn with_root(self, root: u16) -> Collective {
        match self {
            Collective::Broadcast { .. } => Collective::Broadcast { root },
            Collective::Reduce { .. } => Collective::Reduce { root },
            Collective::Scatter { .. } => Collective::Scatter { root },
            Collective::Gather { .. } => Collective::Gather { root },
            other => other,
        }
    }

    /// Short name.
    pub fn name(&self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllGather => "all_gather",
            Collective::Broadcast { .. } => "broadcast",
            Collective::Reduce { .. } => "reduce",
            Collective::Scatter { .. } => "scatter",
            Collective::Gather { .. } => "gather",
            Collective::AllToAll => "all_to_all",
            Collective::AllToAllV => "all_to_allv",
            Collective::SendRecv { .. } => "send_recv",
        }
    }

    /// Whether the collective combines data with a reduction operator.
    pub fn reduces(&self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce { .. }
        )
    }

    /// Whether `rank`'s output is defined afterwards: a rooted reduce or gather writes only the
    /// root's, a send-recv only the receiver's. A runtime that stages an output copies it back
    /// only where it is, so an in-place call leaves the other ranks' buffers as they were.
    pub fn delivers_to(&self, rank: u16) -> bool {
        match *self {
            Collective::Reduce { root } | Collective::Gather { root } => rank == root,
            Collective::SendRecv { dst, .. } => rank == dst,
            Collective::AllReduce
            | Collective::ReduceScatter
            | Collective::AllGather
            | Collective::Broadcast { .. }
            | Collective::Scatter { .. }
            | Collective::AllToAll
            | Collective::AllToAllV => true,
        }
    }
}

/// Every collective a request can name at world `world` (all-to-allv aside, which needs its
/// counts), with roots and peers spread over the world: the one list that conformance checks
/// on every backend walk. `world` 0 is treated as 1.
pub fn collectives(world: u16) -> [Collective; 9] {
    let last = world.max(1) - 1;
    [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast { root: last / 2 },
        Collective::Reduce { root: last },
        Collective::Scatter { root: last / 2 },
        Collective::Gather { root: last },
        Collective::AllToAll,
        Collective::SendRecv { src: last, dst: 0 },
    ]
}

/// Every (collective, algorithm) pair of [`collectives`] at `world`.
pub fn pairs(world: u16) -> impl Iterator<Item = (Collective, Algorithm)> {
    collectives(world)
        .into_iter()
        .flat_map(|c| algorithms(c).iter().map(move |&a| (c, a)))
}

/// A collective request: everything a schedule depends on.
///
/// ```
/// use symm_core::dtype::{DType, ReduceOp};
/// use symm_core::sched::{Algorithm, Collective, Request, SchedError};
///
/// // 1 MiB of bf16 summed over 8 ranks by a ring, on two channels.
/// let (c, a) = (Collective::AllReduce, Algorithm::Ring);
/// let req = Request::new(c, a, 8, 1 << 20, DType::Bf16, ReduceOp::Sum).with_channels(2);
/// assert_eq!(req.validate(), Ok(()));
///
/// // Each rank provides its 1 MiB input and output; the ring stages chunks in scratch: one
/// // stream of 2 slots of 128 KiB per channel.
/// let sz = req.buffer_sizes();
/// assert_eq!((sz.input, sz.output), (1 << 20, 1 << 20));
/// assert_eq!(sz.scratch, 2 * 2 * (128 << 10));
///
/// // What a schedule cannot run is refused with the reason.
/// let odd = Request { bytes: 1001, ..req };
/// assert_eq!(odd.validate(), Err(SchedError::UnalignedBytes { bytes: 1001, elem: 2 }));
/// let one_slot = req.with_pipeline(0, 1);
/// assert_eq!(one_slot.validate(), Err(SchedError::TooFewSlots { slots: 1, min: 2 }));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Request {
    /// The collective.
    pub collective: Collective,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Ranks in the world.
    pub world: u16,
    /// Channels (independent lanes; a GPU runs one thread block per channel).
    pub channels: u16,
    /// Byte count (see [`Collective`] for what it counts).
    pub bytes: u64,
    /// Element type.
    pub dtype: DType,
    /// Reduction operator (ignored by collectives that do not reduce).
    pub op: ReduceOp,
    /// Pipelining chunk in bytes (0: [`DEFAULT_CHUNK`]).
    pub chunk_bytes: u64,
    /// Scratch slots per stream (0: [`DEFAULT_SLOTS`]).
    pub slots: u8,
}

impl Request {
    /// A request with one channel and default pipelining.
    pub fn new(
        collective: Collective,
        algorithm: Algorithm,
        world: u16,
        bytes: u64,
        dtype: DType,
        op: ReduceOp,
    ) -> Request {
        Request {
            collective,
            algorithm,
            world,
            channels: 1,
            bytes,
            dtype,
            op,
            chunk_bytes: 0,
            slots: 0,
        }
    }

    /// With `channels` channels.
    pub fn with_channels(mut self, channels: u16) -> Request {
        self.channels = channels;
        self
    }

    /// With a pipelining chunk and slot count.
    pub fn with_pipeline(mut self, chunk_bytes: u64, slots: u8) -> Request {
        self.chunk_bytes = chunk_bytes;
        self.slots = slots;
        self
    }

    /// Elements per rank-level unit (`bytes / dtype size`).
    pub fn elems(&self) -> u64 {
        self.bytes / self.dtype.size()
    }

    /// The pipelining chunk in elements: at least one, and at most the whole buffer (a chunk
    /// larger than the data is the data, so scratch never grows past it).
    pub fn chunk_elems(&self) -> u64 {
        let b = if self.chunk_bytes == 0 {
            DEFAULT_CHUNK
        } else {
            self.chunk_bytes
        };
        (b / self.dtype.size()).min(self.elems()).max(1)
    }

    /// The fewest scratch slots per stream the request's schedule can run with (the
    /// algorithm's description says; ring reduce-scatter and all-reduce need two from three
    /// ranks, see `sched/ring.rs`).
    pub fn min_slots(&self) -> u8 {
        (self.algorithm.desc().min_slots)(self)
    }

    /// Scratch slots per stream.
    pub fn slot_count(&self) -> u64 {
        if self.slots == 0 {
            DEFAULT_SLOTS as u64
        } else {
            self.slots as u64
        }
    }

    /// The signal-pad layout the schedule uses (one team).
    pub fn layout(&self) -> SlotLayout {
        SlotLayout {
            teams: 1,
            channels: self.channels,
            world: self.world,
        }
    }

    /// Checks the request; every schedule constructor calls this first.
    pub fn validate(&self) -> Result<(), SchedError> {
        if self.world == 0 || self.world > MAX_WORLD {
            return Err(SchedError::BadWorld { world: self.world });
        }
        if self.channels == 0 || self.channels > MAX_CHANNELS {
            return Err(SchedError::BadChannels {
                channels: self.channels,
            });
        }
        if !self.bytes.is_multiple_of(self.dtype.size()) {
            return Err(SchedError::UnalignedBytes {
                bytes: self.bytes,
                elem: self.dtype.size(),
            });
        }
        if self.bytes > (1u64 << 48) {
            return Err(SchedError::TooLarge { bytes: self.bytes });
        }
        let bad = match self.collective {
            Collective::Broadcast { root }
            | Collective::Reduce { root }
            | Collective::Scatter { root }
            | Collective::Gather { root } => [root, 0],
            Collective::SendRecv { src, dst } => [src, dst],
            _ => [0, 0],
        };
        if let Some(&rank) = bad.iter().find(|&&r| r >= self.world) {
            return Err(SchedError::BadRank { rank });
        }
        if !algorithms(self.collective).contains(&self.algorithm) {
            return Err(SchedError::Unsupported {
                collective: self.collective,
                algorithm: self.algorithm,
            });
        }
        let max = (self.algorithm.desc().max_bytes)(self.channels);
        if self.bytes > max {
            return Err(SchedError::AboveLimit {
                algorithm: self.algorithm,
                bytes: self.bytes,
                max,
            });
        }
        let sz = self.buffer_sizes();
        let largest = sz.input.max(sz.output).max(sz.scratch);
        if largest > MAX_BUFFER {
            return Err(SchedError::TooLarge { bytes: largest });
        }
        let min = self.min_slots();
        if self.slot_count() < min as u64 {
            return Err(SchedError::TooFewSlots {
                slots: self.slots,
                min,
            });
        }
        Ok(())
    }

    /// Whether each rank's output may be its input, byte for byte (an in-place all-reduce):
    /// the algorithm reads a place of a rank's input only before anything writes that place of
    /// its output. Two-shot (a rank reduces and writes back only its own segment), the one-shot
    /// low-latency all-reduces (peers read the lines in their own scratch, never the input) and
    /// the multicast model; not one-shot (peers read the whole input while it writes its
    /// output), ring, tree or recursive halving. The host's `run_threads_in_place` checks it.
    pub fn runs_in_place(&self) -> bool {
        self.algorithm.desc().in_place & self.collective.bit() != 0
    }

    /// Whether only each rank itself touches its input (`[0]`) and its output (`[1]`): no op of
    /// any rank's schedule names another rank's input (or output). Such a side need not be
    /// symmetric memory: the runtime runs it on any device memory of the rank, with no staging
    /// copy. The low-latency algorithms own both sides (peers write lines into the scratch
    /// only); ring, tree, recursive halving, pairwise and the pushing direct collectives own
    /// their input; one-shot and the pulling direct reduce-scatter and reduce own their output;
    /// two-shot owns neither. A test scans every schedule against this column.
    pub fn owns(&self) -> [bool; 2] {
        let d = self.algorithm.desc();
        let bit = self.collective.bit();
        [d.own[0] & bit != 0, d.own[1] & bit != 0]
    }

    /// Input, output and scratch bytes each rank needs.
    pub fn buffer_sizes(&self) -> BufferSizes {
        // Saturating: a request whose buffers do not fit in u64 is refused by `validate`
        // (`TooLarge`), and saturated sizes can never be allocated.
        let b = self.bytes;
        let bw = b.saturating_mul(self.world as u64);
        let (input, output) = match self.collective {
            Collective::AllReduce | Collective::Broadcast { .. } | Collective::Reduce { .. } => {
                (b, b)
            }
            Collective::ReduceScatter => (bw, b),
            Collective::AllGather => (b, bw),
            Collective::Scatter { .. } => (bw, b),
            Collective::Gather { .. } => (b, bw),
            Collective::AllToAll => (bw, bw),
            Collective::SendRecv { .. } | Collective::AllToAllV => (b, b),
        };
        let per_stream = self
            .slot_count()
            .saturating_mul(self.chunk_elems())
            .saturating_mul(self.dtype.size());
        let streams = (self.algorithm.desc().streams)(self);
        BufferSizes {
            input,
            output,
            scratch: per_stream
                .saturating_mul(streams)
                .saturating_mul(self.channels as u64)
                .saturating_add((self.algorithm.desc().scratch)(self)),
        }
    }
}

/// What each rank must provide for a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferSizes {
    /// Input bytes.
    pub input: u64,
    /// Output bytes.
    pub output: u64,
    /// Scratch bytes.
    pub scratch: u64,
}

/// Largest input, output or scratch buffer a valid request needs per rank (2^56 bytes).
pub const MAX_BUFFER: u64 = 1 << 56;

/// Why a request cannot be scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchedError {
    /// The world size is 0 or above [`MAX_WORLD`].
    BadWorld {
        /// The world size asked for.
        world: u16,
    },
    /// The channel count is 0 or above [`MAX_CHANNELS`].
    BadChannels {
        /// The channel count asked for.
        channels: u16,
    },
    /// A rank (the caller, a root, a sender or receiver) is not in the world.
    BadRank {
        /// The rank.
        rank: u16,
    },
    /// The channel index is not below the request's channel count.
    BadChannel {
        /// The channel.
        channel: u16,
    },
    /// The byte count is not a multiple of the element size.
    UnalignedBytes {
        /// Bytes asked for.
        bytes: u64,
        /// Element size.
        elem: u64,
    },
    /// The byte count exceeds 2^48, or a buffer the request needs (input, output or scratch)
    /// exceeds 2^56 bytes.
    TooLarge {
        /// The byte count, or the size of the buffer that is too large.
        bytes: u64,
    },
    /// An all-to-allv needs its counts: build it with [`alltoallv()`](crate::sched::alltoallv()).
    NeedsCounts,
    /// The counts of an all-to-allv are not `world * world` long.
    BadCounts {
        /// Length given.
        len: u64,
    },
    /// A rank's send or receive total of an all-to-allv exceeds the buffer.
    CountsExceedBuffer {
        /// The rank.
        rank: u16,
    },
    /// The pipeline has fewer scratch slots per stream than the schedule needs to make
    /// progress (see [`Request::min_slots`]): it would deadlock.
    TooFewSlots {
        /// Slots asked for.
        slots: u8,
        /// Slots the schedule needs.
        min: u8,
    },
    /// The message is larger than the algorithm takes (the low-latency protocol's bound).
    AboveLimit {
        /// The algorithm.
        algorithm: Algorithm,
        /// Bytes asked for.
        bytes: u64,
        /// The most it takes.
        max: u64,
    },
    /// The algorithm does not implement the collective.
    Unsupported {
        /// The collective.
        collective: Collective,
        /// The algorithm.
        algorithm: Algorithm,
    },
    /// Deterministic mode was asked for, and the algorithm combines the ranks' contributions
    /// in an order that depends on the element or the world, or rounds per step
    /// ([`Request::is_deterministic`]).
    NotDeterministic {
        /// The collective.
        collective: Collective,
        /// The algorithm (for an automatic request: symm's own choice, when no algorithm
        /// honours the mode).
        algorithm: Algorithm,
    },
}

impl core::fmt::Display for SchedError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SchedError::BadWorld { world } => {
                write!(f, "world size {world} is not in 1..={MAX_WORLD}")
            }
            SchedError::BadChannels { channels } => {
                write!(f, "channel count {channels} is not in 1..={MAX_CHANNELS}")
            }
            SchedError::BadRank { rank } => write!(f, "rank {rank} is not in the world"),
            SchedError::BadChannel { channel } => {
                write!(f, "channel {channel} is not in the request")
            }
            SchedError::UnalignedBytes { bytes, elem } => {
                write!(
                    f,
                    "{bytes} bytes is not a multiple of the element size {elem}"
                )
            }
            SchedError::TooLarge { bytes } => {
                write!(f, "{bytes} bytes is above what a request may use")
            }
            SchedError::NeedsCounts => {
                write!(f, "all_to_allv needs per-pair counts (sched::alltoallv)")
            }
            SchedError::BadCounts { len } => {
                write!(f, "all_to_allv counts have {len} entries, not world^2")
            }
            SchedError::CountsExceedBuffer { rank } => {
                write!(f, "rank {rank}'s all_to_allv total exceeds the buffer")
            }
            SchedError::TooFewSlots { slots, min } => write!(
                f,
                "{slots} scratch slot(s) per stream deadlock this schedule; it needs at least {min}"
            ),
            SchedError::AboveLimit {
                algorithm,
                bytes,
                max,
            } => write!(
                f,
                "{} takes at most {max} bytes, not {bytes}",
                algorithm.name()
            ),
            SchedError::Unsupported {
                collective,
                algorithm,
            } => write!(
                f,
                "{} has no {} algorithm",
                collective.name(),
                algorithm.name()
            ),
            SchedError::NotDeterministic {
                collective,
                algorithm,
            } => write!(
                f,
                "{} with {} cannot run in deterministic mode at this world and type (its sums \
                 do not run in rank order with one rounding)",
                collective.name(),
                algorithm.name()
            ),
        }
    }
}

impl core::error::Error for SchedError {}
