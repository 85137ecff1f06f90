//! The alpha-beta cost model and algorithm selection.
//!
//! Every prediction has the published Hockney form, `launch + hops * alpha + bytes * beta`
//! (Hockney, "The communication challenge for MPP", Parallel Computing 20, 1994), with the terms
//! the host simulator charges (`host/src/sim.rs`): `alpha` is one hop (a signal landing,
//! a read's loads coming back, a put landing), a signal costs its sender only its issue
//! ([`Link::issue_us`]), puts are posted (the stream goes on when the bytes left), `1/beta` is
//! the bandwidth of one rank's link port and local passes run at [`Link::memory_bytes_per_us`].
//! The channels of a rank share its ports, so their bytes add up while their latencies overlap.
//! Each algorithm's `cost` (in `sched/<algorithm>.rs`) derives its critical path from those
//! rules and says how in its comment (`p` ranks, `n` bytes, `k` chunks of `c`):
//!
//! | algorithm | classic cost | here (issues `ι`, local bytes `μ`) |
//! |---|---|---|
//! | ring all-reduce | `2(p-1)α + 2(p-1)/p·nβ` (Patarasuk and Yuan, JPDC 69, 2009; Thakur, Rabenseifner and Gropp, IJHPCA 19, 2005) | `2(p-1)(n/p)β + k(2(p-1)α + 3(p-1)ι)`: the loop is chunk-major, so each step's hop is exposed once per chunk |
//! | ring reduce-scatter / all-gather | `(p-1)α + (p-1)/p·nβ` per block of `n/p` (Thakur et al.) | `(p-1)bβ + k((p-1)α + 2(p-1)ι)` / `(p-1)bβ + k(p-1)(α + ι)` for a block `b` |
//! | recursive halving-doubling | `2 lg p·α + 2(p-1)/p·nβ`, plus a fold and unfold when `p` is not a power of two (Rabenseifner, ICCS 2004; Thakur et al.) | halving `α + 2ι + cβ + cμ` a chunk, doubling a put a step, the fold at the pace of its slot loop |
//! | one-shot all-reduce | `α + (p-1)nβ` (each rank reads every peer) | `2(p-1)ι + 3α + (p-1)nβ`; past 8 ranks a chain of reads, `(p-1)α + (2p-3)nβ` |
//! | two-shot all-reduce | reduce-scatter + all-gather, direct: `2α + 2(p-1)/p·nβ` | `2(p-1)ι + 3α + 2(p-1)/p·nβ` |
//! | direct reduce-scatter, all-gather, all-to-all | `α + (p-1)bβ` (Thakur et al., pairwise exchange) | `2(p-1)ι + 2α + (p-1)bβ` |
//! | double binary tree all-reduce | `2 lg p·α + 2nβ` pipelined (Sanders, Speck and Träff, Parallel Computing 35, 2009) | the reduce's up pass per tree, then the broadcast's down pass of both |
//! | binary tree broadcast / reduce | `(k + lg p - 1)(α + cβ)` pipelined (Thakur et al.) | the root's pace (`2cβ + 2ι` a chunk) and a fill of `d` levels / the slower of the busiest ingress and the slot loop |
//! | chain ("ring") broadcast | `(k + p - 2)(α + cβ)` | `nβ + nμ + kι + (p-2)(α + ι + cβ)` |
//! | direct broadcast, reduce, scatter, gather | `(p-1)(α + nβ)` at the root | `(p-1)(nβ + ι)` after one handshake, and the like |
//! | multicast | one switch reduction and one switch store of `n/p` (NVLS) | `2(p-1)ι + 4α + 2(n/p)/multicast` |
//! | low-latency one-shot / exchange | one trip of lines | `ι + 2α + 2(p-1)nβ + 3nμ` |
//!
//! A test compares [`select`]'s pick against the simulator's fastest algorithm over worlds
//! 2..72 and 1 KiB..1 GiB; `cargo xtask hw` measures the truth on GPUs and fits the link to it.

use crate::sched::{algorithms, Algorithm, Request};

/// Link and launch parameters of a machine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Fixed cost of launching a collective, in microseconds.
    pub launch_us: f64,
    /// Latency of one signalled hop, in microseconds.
    pub alpha_us: f64,
    /// Bandwidth of one rank's link per direction, in bytes per microsecond.
    pub beta_bytes_per_us: f64,
    /// Multicast (switch reduction) bandwidth in bytes per microsecond; 0 when unavailable.
    pub multicast_bytes_per_us: f64,
}

impl Link {
    /// NVLink 4 through NVSwitch (H100/H200): about 370 GB/s achievable per direction, 0.6 us per
    /// hop and 4.5 us launch (NCCL's own model for Hopper), multicast near 480 GB/s.
    pub const NVLINK4: Link = Link {
        launch_us: 4.5,
        alpha_us: 0.6,
        beta_bytes_per_us: 370_000.0,
        multicast_bytes_per_us: 480_000.0,
    };

    /// Ranks that share one GPU (MPS): no NVLink between them, data moves through the device's
    /// L2 and HBM, and a signal crosses between processes in about 0.8 us (measured on H100
    /// under MPS). One device's memory bandwidth (about 3 TB/s) is split among its ranks; this
    /// charges each rank 1 TB/s.
    pub const SHARED_DEVICE: Link = Link {
        launch_us: 4.5,
        alpha_us: 0.9,
        beta_bytes_per_us: 1_000_000.0,
        multicast_bytes_per_us: 0.0,
    };

    /// Host threads over shared memory (what the simulator stamps traces with).
    pub const HOST: Link = Link {
        launch_us: 1.0,
        alpha_us: 0.2,
        beta_bytes_per_us: 10_000.0,
        multicast_bytes_per_us: 10_000.0,
    };

    /// What issuing a signal costs its sender, as a fraction of a hop: the store is posted, so
    /// the sender pays its issue and fence while the hop's latency (`alpha`) is paid by the
    /// arrival. An eighth of NVLink 4's 0.6 us hop is 75 ns.
    pub const ISSUE_PER_HOP: f64 = 0.125;

    /// A rank's own memory bandwidth (a local copy or reduction) over its link's: HBM3's
    /// 3.35 TB/s read and write in one pass is about 1.6 TB/s of copy, four NVLink 4 ports
    /// (370 GB/s each way). A ratio rather than a field keeps [`Link`] the three numbers the
    /// bench fits (launch, alpha, beta).
    pub const MEMORY_PER_LINK: f64 = 4.0;

    /// The sender's cost of one signal, in microseconds ([`Link::ISSUE_PER_HOP`] of a hop).
    pub fn issue_us(&self) -> f64 {
        self.alpha_us * Link::ISSUE_PER_HOP
    }

    /// A rank's local memory bandwidth in bytes per microsecond ([`Link::MEMORY_PER_LINK`]
    /// times the link's).
    pub fn memory_bytes_per_us(&self) -> f64 {
        self.beta_bytes_per_us * Link::MEMORY_PER_LINK
    }
}

/// Depth of a heap-ordered binary tree of `p` nodes.
pub(crate) fn depth(p: u64) -> u64 {
    if p <= 1 {
        0
    } else {
        63 - p.leading_zeros() as u64
    }
}

pub(crate) fn div_ceil(a: u64, b: u64) -> u64 {
    if b == 0 {
        0
    } else {
        a.div_ceil(b)
    }
}

/// An algorithm's critical path on one channel, in the simulator's units: hops (`alpha`), signal
/// issues ([`Link::issue_us`]), and bytes through the rank's link ports (`beta`), its memory
/// port ([`Link::memory_bytes_per_us`]) and the multicast switch.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Path {
    pub hops: f64,
    pub bytes: f64,
    pub mc_bytes: f64,
    /// Signals issued on the critical path: the sender pays only the issue; the hop is paid
    /// where a wait on it is (`hops`).
    pub issues: f64,
    /// Bytes of passes that stay on the rank (a local copy or combine).
    pub mem_bytes: f64,
}

impl Path {
    pub(crate) fn new(hops: f64, bytes: f64) -> Path {
        Path {
            hops,
            bytes,
            ..Path::default()
        }
    }

    /// `n` hops.
    pub(crate) fn hops(n: f64) -> Path {
        Path::new(n, 0.0)
    }

    /// `b` bytes through a link port.
    pub(crate) fn link(b: f64) -> Path {
        Path::new(0.0, b)
    }

    /// `n` signal issues.
    pub(crate) fn issues(n: f64) -> Path {
        Path {
            issues: n,
            ..Path::default()
        }
    }

    /// `b` bytes through the rank's memory port.
    pub(crate) fn mem(b: f64) -> Path {
        Path {
            mem_bytes: b,
            ..Path::default()
        }
    }

    /// `b` bytes through the multicast switch.
    pub(crate) fn mc(b: f64) -> Path {
        Path {
            mc_bytes: b,
            ..Path::default()
        }
    }

    /// Microseconds on `link` with `ch` channels sharing the rank's ports: latencies and issues
    /// overlap across channels (each has its own stream), bytes do not (every port carries at
    /// most its bandwidth).
    pub(crate) fn us(&self, link: &Link, ch: f64) -> f64 {
        let mc = if link.multicast_bytes_per_us > 0.0 {
            link.multicast_bytes_per_us
        } else {
            link.beta_bytes_per_us
        };
        self.hops * link.alpha_us
            + self.issues * link.issue_us()
            + ch * (self.bytes / link.beta_bytes_per_us
                + self.mem_bytes / link.memory_bytes_per_us()
                + self.mc_bytes / mc)
    }
}

impl core::ops::Add for Path {
    type Output = Path;
    fn add(self, o: Path) -> Path {
        Path {
            hops: self.hops + o.hops,
            bytes: self.bytes + o.bytes,
            mc_bytes: self.mc_bytes + o.mc_bytes,
            issues: self.issues + o.issues,
            mem_bytes: self.mem_bytes + o.mem_bytes,
        }
    }
}

impl core::ops::Mul<f64> for Path {
    type Output = Path;
    fn mul(self, k: f64) -> Path {
        Path {
            hops: self.hops * k,
            bytes: self.bytes * k,
            mc_bytes: self.mc_bytes * k,
            issues: self.issues * k,
            mem_bytes: self.mem_bytes * k,
        }
    }
}

/// What every algorithm's cost reads of a request, per channel, and the link it is priced on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// Ranks.
    pub p: u64,
    /// Ranks, as a real.
    pub pf: f64,
    /// Element size.
    pub e: u64,
    /// Bytes of the whole buffer on one channel.
    pub n: u64,
    /// Pipelining chunk in bytes.
    pub chunk: u64,
    /// Depth of a binary tree of `p` nodes.
    pub d: f64,
    /// Scratch slots per stream.
    pub slots: f64,
    /// Channels (they share the rank's ports).
    pub ch: f64,
    /// The machine the path is priced on (to choose between regimes).
    pub link: Link,
}

impl Shape {
    fn of(req: &Request, link: &Link) -> Shape {
        let p = req.world.max(1) as u64;
        let e = req.dtype.size();
        let ch = req.channels.max(1) as u64;
        Shape {
            p,
            pf: p as f64,
            e,
            n: div_ceil(req.elems(), ch) * e,
            chunk: req.chunk_elems() * e,
            d: depth(p) as f64,
            slots: req.slot_count().max(1) as f64,
            ch: ch as f64,
            link: *link,
        }
    }

    /// Chunks of `len` bytes, and the chunk size actually used for them.
    pub(crate) fn pipe(&self, len: u64) -> (f64, f64) {
        let c = self.chunk.min(len).max(1);
        (div_ceil(len, c) as f64, c as f64)
    }

    /// One block of the buffer (`n / p`, whole elements).
    pub(crate) fn block(&self) -> u64 {
        div_ceil(self.n, self.p * self.e) * self.e
    }

    /// A serial exchange with every peer: what a pair `validate` refuses is priced as.
    pub(crate) fn serial(&self) -> Path {
        Path::new(3.0 * (self.pf - 1.0), self.pf * self.n as f64)
    }

    /// The longer of two paths on this shape's link.
    pub(crate) fn max(&self, a: Path, b: Path) -> Path {
        if a.us(&self.link, self.ch) >= b.us(&self.link, self.ch) {
            a
        } else {
            b
        }
    }

    /// `k` chunks through a credited pipeline: each costs the busiest stream or port `stage`,
    /// unless the slot loop is slower: a slot is written again only after the credit of the
    /// chunk `slots` before it, so `slots` chunks take at least one `round` (the put, its
    /// signal landing, the consumer's pass, the credit landing back).
    pub(crate) fn steady(&self, k: f64, stage: Path, round: Path) -> Path {
        self.max(stage * k, round * (k / self.slots))
    }
}

/// The critical path of `req` on one channel: the algorithm's own cost
/// ([`crate::sched::Desc::cost`]).
fn path(req: &Request, link: &Link) -> Path {
    let s = Shape::of(req, link);
    if s.p == 1 {
        return Path::new(0.0, s.n as f64);
    }
    (req.algorithm.desc().cost)(req, &s)
}

/// Predicted time of a request in microseconds, launch included.
///
/// ```
/// use symm_core::cost::{predict, Link};
/// use symm_core::dtype::{DType, ReduceOp};
/// use symm_core::sched::{Algorithm, Collective, Request};
///
/// let at = |alg, bytes| {
///     let req = Request::new(Collective::AllReduce, alg, 8, bytes, DType::Bf16, ReduceOp::Sum);
///     predict(&req, &Link::NVLINK4)
/// };
/// // Small messages are latency bound: one-shot's few hops beat the ring's many.
/// assert!(at(Algorithm::OneShot, 1024) < at(Algorithm::Ring, 1024));
/// // Large ones are bandwidth bound: two-shot moves 2(p-1)/p of the data per rank, one-shot
/// // reads all p-1 peers' inputs whole.
/// assert!(at(Algorithm::TwoShot, 256 << 20) < at(Algorithm::OneShot, 256 << 20));
/// // Every prediction includes the launch.
/// assert!(at(Algorithm::Ring, 0) >= Link::NVLINK4.launch_us);
/// ```
pub fn predict(req: &Request, link: &Link) -> f64 {
    let ch = req.channels.max(1) as f64;
    link.launch_us + path(req, link).us(link, ch)
}

mod calibration;

/// One measured choice of the calibration table ([`tune`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calibrated {
    /// How the ranks were connected when it was measured.
    pub topology: Topology,
    /// [`crate::sched::Collective::name`] of the collective.
    pub collective: &'static str,
    /// Ranks.
    pub world: u16,
    /// `Request::bytes`.
    pub bytes: u64,
    /// The fastest algorithm measured.
    pub algorithm: Algorithm,
    /// With this many channels.
    pub channels: u16,
    /// Its time per op, microseconds.
    pub us: f64,
}

/// How a job's ranks reach each other: what a calibration entry was measured on, and what
/// [`tune_on`] chooses for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Topology {
    /// Every rank on its own GPU, GPUs joined by NVLink (through NVSwitch).
    Nvlink,
    /// Ranks share GPUs: their traffic moves through one device's L2 and HBM.
    SharedDevice,
}

impl Topology {
    /// Every topology.
    pub const ALL: [Topology; 2] = [Topology::Nvlink, Topology::SharedDevice];

    /// The model's link for this topology.
    pub fn link(self) -> Link {
        match self {
            Topology::Nvlink => Link::NVLINK4,
            Topology::SharedDevice => Link::SHARED_DEVICE,
        }
    }

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Topology::Nvlink => "nvlink",
            Topology::SharedDevice => "shared_device",
        }
    }
}

/// The calibration tables kept in the repository, one per (topology, world) measured: where
/// each was measured, and its entries.
pub fn calibration() -> &'static [(&'static str, &'static [Calibrated])] {
    calibration::TABLES
}

/// Every entry of every calibration table.
pub fn calibrated() -> impl Iterator<Item = &'static Calibrated> {
    calibration::TABLES.iter().flat_map(|(_, t)| t.iter())
}

/// Where [`tune`]'s choice came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The calibration table's entry for this collective and world, at the nearest size.
    Calibrated,
    /// The model ([`select`] on NVLink 4), with channels by size.
    Model,
}

/// Channels by size when nothing was measured: one block up to 16 KiB, then more as the
/// message grows (4 to 256 KiB, 16 to 4 MiB, 64 beyond).
pub fn default_channels(bytes: u64) -> u16 {
    match bytes {
        0..=16_384 => 1,
        16_385..=262_144 => 4,
        262_145..=4_194_304 => 16,
        _ => 64,
    }
}

/// [`tune_on`] for ranks on their own GPUs joined by NVLink.
pub fn tune(req: Request) -> (Request, Choice) {
    tune_on(req, Topology::Nvlink)
}

/// `req` with the algorithm and channels symm picks by default on `topology`: the calibration
/// table's entry for (topology, collective, world) at the size nearest `req.bytes` (in log
/// scale), else the model's pick with the topology's link. Entries measured on another
/// topology are never used. A request the caller builds with an explicit algorithm and
/// channels is run as given; this is the default for callers that do not choose.
pub fn tune_on(req: Request, topology: Topology) -> (Request, Choice) {
    let near = calibrated()
        .filter(|e| {
            e.topology == topology && e.collective == req.collective.name() && e.world == req.world
        })
        .min_by_key(|e| {
            let (a, b) = (e.bytes.max(1).ilog2(), req.bytes.max(1).ilog2());
            (a.abs_diff(b), e.bytes)
        });
    if let Some(e) = near {
        let r = Request {
            algorithm: e.algorithm,
            channels: e.channels,
            ..req
        };
        if r.validate().is_ok() {
            return (r, Choice::Calibrated);
        }
    }
    let r = Request {
        algorithm: select(&req, &topology.link(), false),
        channels: default_channels(req.bytes),
        ..req
    };
    (r, Choice::Model)
}

/// Algorithms the model never picks: only a calibration table (a measurement) or the user
/// chooses them. The 128-byte-line algorithms are bit exact on the GPU but ran about 2x slower
/// than 16-byte lines and 5x slower than two-shot at 1 MiB on an H200 shared by two ranks
/// (docs/perf.md), where the model, which does not charge their fences, predicts them faster.
pub const MEASURED_ONLY: [Algorithm; 2] = [Algorithm::OneShotLl128, Algorithm::DirectLl128];

/// Picks the algorithm with the lowest predicted time for a request (its `algorithm` field is
/// ignored). Multicast is considered only when `multicast` is true; [`MEASURED_ONLY`] never.
pub fn select(req: &Request, link: &Link, multicast: bool) -> Algorithm {
    select_where(req, link, multicast, |_| true).unwrap_or(Algorithm::Direct)
}

/// [`select`] among the algorithms whose request `keep` accepts (deterministic mode passes
/// `Request::is_deterministic`); `None` when no such algorithm takes the request.
pub fn select_where(
    req: &Request,
    link: &Link,
    multicast: bool,
    keep: impl Fn(&Request) -> bool,
) -> Option<Algorithm> {
    let mut best = None::<(f64, Algorithm)>;
    for &alg in algorithms(req.collective) {
        if (alg == Algorithm::Multicast && !multicast) || MEASURED_ONLY.contains(&alg) {
            continue;
        }
        let candidate = Request {
            algorithm: alg,
            ..*req
        };
        if !keep(&candidate) || candidate.validate().is_err() {
            continue;
        }
        let t = predict(&candidate, link);
        if best.is_none_or(|(bt, _)| t < bt) {
            best = Some((t, alg));
        }
    }
    best.map(|(_, a)| a)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod tune_tests;
