//! Memory of a host world and the semantics of every op on it.
//!
//! Each rank has three buffers (input, output, scratch) of bytes held in `AtomicU8`s and a
//! signal pad of `AtomicU64`s. Data ops read their operands into temporaries with relaxed
//! loads, combine them with `symm_core::dtype::combine` and store the result with relaxed stores,
//! so aliasing operands (`dst == a`) behave as on a GPU that loads before it stores. Signals and
//! slot loads go through [`Pad`], with the protocol's orderings (`symm_core::signal::order`).
//!
//! Low-latency lines ([`symm_core::ll`]) live beside the scratch bytes, in `AtomicU64` words
//! (one per 8 bytes of scratch): each half of a line is one relaxed store and one relaxed load,
//! which is all the protocol asks of the memory (the flag and the data it guards share a word).
//!
//! [`RankFabric`] is one rank's view of a [`WorldMem`] as an [`exec::Fabric`](Fabric): the
//! simulator, the thread backend and the loom models all run the generic executor over it.

use super::pad::Pad;
use super::sim::check_inputs;
use super::HostError;
use crate::sync::{AtomicU64, AtomicU8, Ordering};
use symm_core::dtype::{combine, fold};
use symm_core::exec::{Fabric, LlPoll};
use symm_core::ll::{self, Format};
use symm_core::op::{Buf, Loc, Op};
use symm_core::sched::Request;
use symm_core::signal::order;

/// One rank's memory.
struct RankMem {
    bufs: [Vec<AtomicU8>; 3],
    pad: Pad,
    /// Low-latency words over the scratch buffer (word i: scratch bytes 8i..8i+8).
    ll: Vec<AtomicU64>,
}

/// Most bytes the memory of one host run may take: every rank's input, output and scratch, the
/// low-latency words over its scratch and its signal pad. A request over it is refused with
/// [`HostError::TooLarge`] before anything is allocated.
pub const MAX_HOST_BYTES: u64 = 4 << 30;

/// Bytes a host run's memory takes for `world` ranks with buffers of `sizes` (input, output,
/// scratch) and pads of `slots` slots, saturating (`data`: false counts the pads only).
pub fn footprint(world: u16, sizes: [u64; 3], slots: u64, data: bool) -> u64 {
    let [input, output, scratch] = sizes;
    let per_rank = if data {
        // Bytes, then one 8-byte low-latency word per 8 scratch bytes.
        input
            .saturating_add(output)
            .saturating_add(scratch.saturating_mul(2))
    } else {
        0
    }
    .saturating_add(slots.saturating_mul(8));
    per_rank.saturating_mul(u64::from(world))
}

/// [`footprint`] of `req`'s memory, refused over [`MAX_HOST_BYTES`].
pub fn check_footprint(req: &Request, data: bool) -> Result<u64, HostError> {
    let sz = req.buffer_sizes();
    let slots = req.layout().slots();
    bounded(footprint(
        req.world,
        [sz.input, sz.output, sz.scratch],
        u64::from(slots),
        data,
    ))
}

fn bounded(bytes: u64) -> Result<u64, HostError> {
    if bytes > MAX_HOST_BYTES {
        Err(HostError::TooLarge {
            bytes,
            limit: MAX_HOST_BYTES,
        })
    } else {
        Ok(bytes)
    }
}

fn ll_words(scratch: u64) -> Vec<AtomicU64> {
    (0..scratch / 8).map(|_| AtomicU64::new(0)).collect()
}

/// All ranks' memory: each rank's input, output and scratch bytes and its signal pad.
pub struct WorldMem {
    ranks: Vec<RankMem>,
    /// Whether data ops move bytes (false: signal pads only, for timing-only simulation).
    data: bool,
    /// Whether each rank's output is its input (an in-place collective): `Buf::Output` names
    /// the input's bytes.
    in_place: bool,
}

/// One rank's view of a [`WorldMem`]: the fabric its executors run on.
pub struct RankFabric<'a> {
    mem: &'a WorldMem,
    rank: u16,
    temps: &'a mut Temps,
}

impl<'a> RankFabric<'a> {
    /// Rank `rank`'s view, with reusable temporaries.
    pub fn new(mem: &'a WorldMem, rank: u16, temps: &'a mut Temps) -> Self {
        RankFabric { mem, rank, temps }
    }
}

impl Fabric for RankFabric<'_> {
    type Error = Oob;
    fn execute(&mut self, op: &Op) -> Result<(), Oob> {
        self.mem.apply(op, self.temps)
    }
    fn load_slot(&mut self, slot: u32) -> Result<u64, Oob> {
        self.mem.load_slot(self.rank, slot)
    }
    fn ll(&mut self, op: &Op, epoch: u64) -> Result<LlPoll, Oob> {
        self.mem.ll(op, epoch, self.temps)
    }
}

/// Appends the data of one line of `format` carrying `flag` to `v`, or returns the flag found
/// (the first that differs). A 128-byte line's flag word is loaded first, with acquire, and
/// only the data words that hold the `need` bytes wanted, after it matched ([`symm_core::ll`]).
fn take_line(
    format: Format,
    line: &[AtomicU64],
    flag: u32,
    need: usize,
    v: &mut Vec<u8>,
) -> Result<(), u32> {
    match format {
        Format::Ll => {
            let h = [
                line[0].load(Ordering::Relaxed),
                line[1].load(Ordering::Relaxed),
            ];
            match ll::unpack(h, flag) {
                Some(d) => {
                    v.extend_from_slice(&d);
                    Ok(())
                }
                None => Err((if (h[0] >> 32) as u32 != flag {
                    h[0]
                } else {
                    h[1]
                } >> 32) as u32),
            }
        }
        Format::Ll128 => {
            let f = line[ll::LINE128_DATA_WORDS].load(order::LL128_OBSERVE);
            let mut data = [0u64; ll::LINE128_DATA_WORDS];
            if f == ll::flag128(flag) {
                for (d, w) in data.iter_mut().zip(line).take(need.div_ceil(8)) {
                    *d = w.load(Ordering::Relaxed);
                }
            }
            match ll::unpack128(f, &data, flag) {
                Some(d) => {
                    v.extend_from_slice(&d);
                    Ok(())
                }
                None => Err(f as u32),
            }
        }
    }
}

fn bytes(n: u64, fill: u8) -> Vec<AtomicU8> {
    (0..n).map(|_| AtomicU8::new(fill)).collect()
}

/// Why an op could not be applied: it names a location (or, for `None`, a rank or slot) outside
/// the world's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Oob(pub Option<Loc>);

impl WorldMem {
    /// Memory for `req` with the given inputs and poisoned outputs and scratch; the request
    /// must validate, there must be one input of the request's size per rank, and the whole
    /// must fit [`MAX_HOST_BYTES`] ([`HostError::TooLarge`] before anything is allocated).
    pub fn new(req: &Request, inputs: &[Vec<u8>], poison: u8) -> Result<WorldMem, HostError> {
        WorldMem::with_inputs(req, inputs, poison, false)
    }

    /// Memory for `req` whose outputs are its inputs (an in-place collective: the request's
    /// input and output sizes must be equal, else [`HostError::NotInPlace`]).
    pub fn in_place(req: &Request, inputs: &[Vec<u8>]) -> Result<WorldMem, HostError> {
        let sz = req.buffer_sizes();
        if sz.input != sz.output {
            return Err(HostError::NotInPlace {
                collective: req.collective.name(),
                algorithm: req.algorithm.name(),
            });
        }
        WorldMem::with_inputs(req, inputs, 0, true)
    }

    /// [`WorldMem::new`]; with `in_place`, no output buffer (the output is the input).
    fn with_inputs(
        req: &Request,
        inputs: &[Vec<u8>],
        poison: u8,
        in_place: bool,
    ) -> Result<WorldMem, HostError> {
        check_inputs(req, inputs)?;
        let sz = req.buffer_sizes();
        let slots = req.layout().slots() as usize;
        let output = if in_place { 0 } else { sz.output };
        let ranks = inputs
            .iter()
            .map(|inp| RankMem {
                bufs: [
                    inp.iter().map(|&b| AtomicU8::new(b)).collect(),
                    bytes(output, poison),
                    bytes(sz.scratch, poison),
                ],
                pad: Pad::new(slots),
                ll: ll_words(sz.scratch),
            })
            .collect();
        Ok(WorldMem {
            ranks,
            data: true,
            in_place,
        })
    }

    /// Memory of `world` ranks with buffers of `sizes` (input, output, scratch) poisoned, and
    /// pads of `slots` slots: what several teams' collectives share (their inputs are written
    /// with [`WorldMem::write_at`]). Refused over [`MAX_HOST_BYTES`].
    pub fn blank(
        world: u16,
        sizes: [u64; 3],
        slots: u32,
        poison: u8,
    ) -> Result<WorldMem, HostError> {
        bounded(footprint(world, sizes, u64::from(slots), true))?;
        let ranks = (0..world)
            .map(|_| RankMem {
                bufs: sizes.map(|n| bytes(n, poison)),
                pad: Pad::new(slots as usize),
                ll: ll_words(sizes[2]),
            })
            .collect();
        Ok(WorldMem {
            ranks,
            data: true,
            in_place: false,
        })
    }

    /// Writes `data` at `l` (host side, before any executor runs).
    pub fn write_at(&self, l: Loc, data: &[u8]) -> Result<(), Oob> {
        self.write(l, data)
    }

    /// Signal pads only, no buffers: data ops are accepted and move nothing. What a timing-only
    /// simulation of a request too large to hold in memory runs on.
    pub fn pads_only(req: &Request) -> Result<WorldMem, HostError> {
        req.validate().map_err(HostError::Sched)?;
        check_footprint(req, false)?;
        let slots = req.layout().slots() as usize;
        let ranks = (0..req.world)
            .map(|_| RankMem {
                bufs: [Vec::new(), Vec::new(), Vec::new()],
                pad: Pad::new(slots),
                ll: Vec::new(),
            })
            .collect();
        Ok(WorldMem {
            ranks,
            data: false,
            in_place: false,
        })
    }

    /// Where buffer `b`'s bytes are: the input's for the output of an in-place memory.
    fn index(&self, b: Buf) -> usize {
        if self.in_place && b == Buf::Output {
            Buf::Input as usize
        } else {
            b as usize
        }
    }

    fn span(&self, l: Loc, len: u64) -> Result<&[AtomicU8], Oob> {
        let i = self.index(l.buf);
        let buf = &self.ranks.get(l.rank as usize).ok_or(Oob(Some(l)))?.bufs[i];
        let end = l.offset.checked_add(len).ok_or(Oob(Some(l)))?;
        buf.get(l.offset as usize..end as usize).ok_or(Oob(Some(l)))
    }

    fn read(&self, l: Loc, len: u64, out: &mut Vec<u8>) -> Result<(), Oob> {
        out.clear();
        out.extend(self.span(l, len)?.iter().map(|b| b.load(Ordering::Relaxed)));
        Ok(())
    }

    fn write(&self, l: Loc, data: &[u8]) -> Result<(), Oob> {
        for (d, &s) in self.span(l, data.len() as u64)?.iter().zip(data) {
            d.store(s, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The low-latency words of `len` bytes of lines at `l` (scratch only, 8-byte aligned).
    fn ll_span(&self, l: Loc, len: u64) -> Result<&[AtomicU64], Oob> {
        let r = self.ranks.get(l.rank as usize).ok_or(Oob(Some(l)))?;
        let end = l.offset.checked_add(len).ok_or(Oob(Some(l)))?;
        if l.buf != Buf::Scratch || !l.offset.is_multiple_of(8) {
            return Err(Oob(Some(l)));
        }
        r.ll.get((l.offset / 8) as usize..end.div_ceil(8) as usize)
            .ok_or(Oob(Some(l)))
    }

    /// A low-latency op ([`symm_core::ll`]) of the call whose epoch is `epoch` (see
    /// [`Fabric::ll`]).
    pub fn ll(&self, op: &Op, epoch: u64, t: &mut Temps) -> Result<LlPoll, Oob> {
        if !self.data {
            return Ok(LlPoll::Done);
        }
        let flag = ll::flag(epoch);
        match *op {
            Op::LlPut {
                format,
                src,
                dst,
                bytes,
                flip,
                ..
            } => {
                self.read(src, bytes, &mut t.a)?;
                let at = ll::at(dst, flip, epoch).ok_or(Oob(Some(dst)))?;
                let words = self.ll_span(at, format.line_bytes(bytes))?;
                let per = (format.line() / 8) as usize;
                for (line, data) in words
                    .chunks_exact(per)
                    .zip(t.a.chunks(format.data() as usize))
                {
                    match format {
                        Format::Ll => {
                            let [h0, h1] = ll::pack(data, flag);
                            line[0].store(h0, Ordering::Relaxed);
                            line[1].store(h1, Ordering::Relaxed);
                        }
                        Format::Ll128 => {
                            // The words that carry data (a short last line leaves the rest,
                            // which no reader takes for data), then the flag word.
                            let used = data.len().div_ceil(8);
                            for (w, v) in line.iter().zip(ll::pack128(data)).take(used) {
                                w.store(v, Ordering::Relaxed);
                            }
                            line[ll::LINE128_DATA_WORDS]
                                .store(ll::flag128(flag), order::LL128_PUBLISH);
                        }
                    }
                }
                Ok(LlPoll::Done)
            }
            Op::LlReduce {
                format,
                src,
                stride,
                sources,
                dst,
                elems,
                dtype,
                op,
                div,
                flip,
                ..
            } => {
                let n = elems.checked_mul(dtype.size()).ok_or(Oob(Some(dst)))?;
                let k = sources as usize;
                let per = (format.line() / 8) as usize;
                t.srcs.resize_with(k, Vec::new);
                for (s, v) in t.srcs.iter_mut().enumerate() {
                    let region =
                        ll::region(src, stride, s as u64, flip, epoch).ok_or(Oob(Some(src)))?;
                    let words = self.ll_span(region, format.line_bytes(n))?;
                    v.clear();
                    for (i, line) in words.chunks_exact(per).enumerate() {
                        // Data bytes of this line that the op needs.
                        let need = (n - (i as u64 * format.data()).min(n)).min(format.data());
                        if let Err(found) = take_line(format, line, flag, need as usize, v) {
                            return Ok(LlPoll::Waiting(found));
                        }
                    }
                    v.truncate(n as usize);
                }
                fold_into(&mut t.a, &t.srcs[..k], dtype, op, div, n as usize);
                self.write(dst, &t.a)?;
                Ok(LlPoll::Done)
            }
            Op::Copy { .. }
            | Op::Reduce { .. }
            | Op::Signal { .. }
            | Op::Wait { .. }
            | Op::ReduceN { .. }
            | Op::McReduce { .. }
            | Op::McStore { .. } => Err(Oob(None)),
        }
    }

    /// A copy of `rank`'s buffer `buf` (empty when the rank does not exist).
    pub fn buffer(&self, rank: usize, buf: Buf) -> Vec<u8> {
        let i = self.index(buf);
        self.ranks.get(rank).map_or_else(Vec::new, |r| {
            r.bufs[i]
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect()
        })
    }

    /// A copy of `rank`'s output buffer.
    pub fn output(&self, rank: usize) -> Vec<u8> {
        self.buffer(rank, Buf::Output)
    }

    /// Raises flag `slot` of `rank` ([`symm_core::flag`]; release).
    pub fn raise(&self, rank: u16, slot: u32) -> Result<(), Oob> {
        self.ranks
            .get(rank as usize)
            .and_then(|r| r.pad.raise(slot))
            .ok_or(Oob(None))
    }

    /// Lowers flag `slot` of `rank` if it is raised (acquire): whether it was.
    pub fn lower(&self, rank: u16, slot: u32) -> Result<bool, Oob> {
        self.ranks
            .get(rank as usize)
            .and_then(|r| r.pad.lower(slot))
            .ok_or(Oob(None))
    }

    /// Loads a slot of `rank`'s pad (acquire).
    pub fn load_slot(&self, rank: u16, slot: u32) -> Result<u64, Oob> {
        self.ranks
            .get(rank as usize)
            .and_then(|r| r.pad.load(slot))
            .ok_or(Oob(None))
    }

    /// Applies a data op or a signal; `scratch` holds reusable temporaries.
    pub fn apply(&self, op: &Op, t: &mut Temps) -> Result<(), Oob> {
        if !self.data && !matches!(op, Op::Signal { .. } | Op::Wait { .. }) {
            return Ok(());
        }
        match *op {
            Op::Copy { src, dst, bytes } => {
                self.read(src, bytes, &mut t.a)?;
                self.write(dst, &t.a)
            }
            Op::Reduce {
                a,
                b,
                dst,
                elems,
                dtype,
                op,
                div,
            } => {
                let n = elems.checked_mul(dtype.size()).ok_or(Oob(Some(dst)))?;
                self.read(a, n, &mut t.a)?;
                self.read(b, n, &mut t.b)?;
                reduce_into(&mut t.a, &t.b, dtype, op, div);
                self.write(dst, &t.a)
            }
            Op::ReduceN {
                buf,
                offset,
                ranks,
                dst,
                elems,
                dtype,
                op,
                div,
            } => {
                let n = elems.checked_mul(dtype.size()).ok_or(Oob(Some(dst)))?;
                let list = ranks.as_slice();
                t.srcs.resize_with(list.len(), Vec::new);
                for (v, &r) in t.srcs.iter_mut().zip(list) {
                    self.read(Loc::new(r, buf, offset), n, v)?;
                }
                fold_into(&mut t.a, &t.srcs[..list.len()], dtype, op, div, n as usize);
                self.write(dst, &t.a)
            }
            Op::McReduce {
                src,
                dst,
                elems,
                dtype,
                op,
                div,
            } => {
                let n = elems.checked_mul(dtype.size()).ok_or(Oob(Some(dst)))?;
                let world = self.ranks.len() as u16;
                self.read(Loc::new(0, src.buf, src.offset), n, &mut t.a)?;
                for r in 1..world {
                    self.read(Loc::new(r, src.buf, src.offset), n, &mut t.b)?;
                    let last = if r + 1 == world { div } else { 1 };
                    reduce_into(&mut t.a, &t.b, dtype, op, last);
                }
                self.write(dst, &t.a)
            }
            Op::McStore { src, dst, bytes } => {
                self.read(src, bytes, &mut t.a)?;
                for r in 0..self.ranks.len() as u16 {
                    self.write(Loc::new(r, dst.buf, dst.offset), &t.a)?;
                }
                Ok(())
            }
            Op::Signal {
                peer,
                slot,
                op,
                value,
            } => self
                .ranks
                .get(peer as usize)
                .and_then(|r| r.pad.signal(slot, op, value))
                .ok_or(Oob(None)),
            Op::Wait { .. } => Ok(()),
            // They need the call's epoch: `WorldMem::ll`.
            Op::LlPut { .. } | Op::LlReduce { .. } => Err(Oob(None)),
        }
    }
}

/// `a[i] = a[i] (op) b[i]` over whole elements, dividing by `div` at the end.
fn reduce_into(
    a: &mut [u8],
    b: &[u8],
    dtype: symm_core::dtype::DType,
    op: symm_core::dtype::ReduceOp,
    div: u32,
) {
    let es = dtype.size() as usize;
    let mut out = [0u8; 8];
    for (x, y) in a.chunks_exact_mut(es).zip(b.chunks_exact(es)) {
        combine(dtype, op, div, x, y, &mut out[..es]);
        x.copy_from_slice(&out[..es]);
    }
}

/// `out` = the k-way fold ([`symm_core::dtype::fold`]) of `srcs`, `bytes` long.
fn fold_into(
    out: &mut Vec<u8>,
    srcs: &[Vec<u8>],
    dtype: symm_core::dtype::DType,
    op: symm_core::dtype::ReduceOp,
    div: u32,
    bytes: usize,
) {
    let es = dtype.size() as usize;
    out.clear();
    out.resize(bytes, 0);
    let mut at: Vec<&[u8]> = Vec::with_capacity(srcs.len());
    for (i, o) in out.chunks_exact_mut(es).enumerate() {
        at.clear();
        at.extend(
            srcs.iter()
                .map(|s| s.get(i * es..(i + 1) * es).unwrap_or(&[])),
        );
        fold(dtype, op, div, &at, o);
    }
}

/// Reusable temporaries of one executor thread.
#[derive(Default)]
pub struct Temps {
    a: Vec<u8>,
    b: Vec<u8>,
    srcs: Vec<Vec<u8>>,
}

#[cfg(test)]
mod tests;
