//! The dispatch and combine protocol over host memory, one thread per rank, no barrier.
//!
//! Each rank owns a symmetric area ([`MoeWorld`]): two halves of dispatch staging rows
//! (`stage_rows` rows of `row_bytes`), two halves of dispatch header words (`world` senders of
//! `header_words` each), and the same for combine (f32 partial rows, one word per sender). Every
//! byte lives in an `AtomicU64` word accessed with relaxed loads and stores; the only ordering is
//! the header's: a sender stores its header words with [`HEADER_PUBLISH`] after its rows, and a
//! receiver loads them with [`HEADER_OBSERVE`] before it reads the rows.
//!
//! A [`MoeRank`] counts its dispatch and combine calls (epochs from 1); call `e` writes half
//! `e % 2` and tags every header word with `e` (`symm_core::moe::tag`). Dispatch: write the
//! token rows into every destination's staging half, store the tagged counts to every rank
//! (itself and zero counts included), wait until every sender's words in my half carry my
//! epoch, then place each received entry at its `expert_row`. Combine: turn each received row
//! into an f32 partial, write it to the sender's combine half at `stage_row(me, slot)`, store a
//! tagged count to every rank, wait for every rank's count, then sum my tokens' partials in
//! ascending rank order. Why no barrier is needed between calls is in `symm_core::moe`'s doc:
//! a half is written again two calls later, and the call between needed every peer's header,
//! which the peer stored only after it had read the half.
//!
//! Under `cfg(loom)` the atomics are loom's (`crate::sync`) and a waiting rank yields to loom, so
//! `driver/tests/loom.rs` model-checks this very code.

use super::{routing, MoeDtype, MoeRankDispatch, MoeRankInput};
use crate::sync::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use symm_core::moe::{
    dest_mask, expert_row, expert_span, tag, untag, MoeConfig, MoeError, ROW_ENTRY_BYTES,
};

/// The store of a header word, after the rows it announces.
const HEADER_PUBLISH: Ordering = Ordering::Release;
/// The load of a header word, before the rows it announces are read.
const HEADER_OBSERVE: Ordering = Ordering::Acquire;

mod errors;
pub use errors::{MoePhase, MoeThreadError};

/// Two halves of words.
type Halves = [Vec<AtomicU64>; 2];

fn halves(words: u64) -> Halves {
    let make = || (0..words).map(|_| AtomicU64::new(0)).collect();
    [make(), make()]
}

/// One rank's symmetric area.
struct Area {
    stage: Halves,
    head: Halves,
    partial: Halves,
    chead: Halves,
}

/// The symmetric areas of every rank, shared by the rank threads.
///
/// A world serves any number of [`run_moe_threads`] runs, one at a time: each run's calls go
/// on from the epochs the last one reached, so its headers are never mistaken for an earlier
/// run's. A run that fails leaves a call half done on some rank, and the world refuses every
/// later run ([`MoeThreadError::WorldFailed`]).
pub struct MoeWorld {
    cfg: MoeConfig,
    dtype: MoeDtype,
    areas: Vec<Area>,
    deadline: Duration,
    abort: AtomicBool,
    /// The next run's first (dispatch, combine) epochs, held for the whole of a run; `None`
    /// once a run failed.
    next: std::sync::Mutex<Option<(u32, u32)>>,
}

impl MoeWorld {
    /// Areas for `cfg`'s shape; a wait that passes `deadline` fails the call.
    pub fn new(cfg: MoeConfig, dtype: MoeDtype, deadline: Duration) -> Result<MoeWorld, MoeError> {
        let cfg = cfg.checked()?;
        let e = dtype.bytes() as u64;
        let (rows, w) = (cfg.stage_rows(), u64::from(cfg.world));
        let areas = (0..cfg.world)
            .map(|_| Area {
                stage: halves(rows * cfg.row_bytes(e) / 8),
                head: halves(w * u64::from(cfg.header_words())),
                partial: halves(rows * cfg.partial_bytes() / 8),
                chead: halves(w),
            })
            .collect();
        Ok(MoeWorld {
            cfg,
            dtype,
            areas,
            deadline,
            abort: AtomicBool::new(false),
            next: std::sync::Mutex::new(Some((1, 1))),
        })
    }

    /// The shape.
    pub fn config(&self) -> &MoeConfig {
        &self.cfg
    }

    /// Makes every waiting rank give up (a peer failed).
    pub fn abort(&self) {
        self.abort.store(true, Ordering::Relaxed);
    }

    fn words(&self, e: u64) -> (usize, usize, usize) {
        let c = &self.cfg;
        (
            (c.row_bytes(e) / 8) as usize,
            (c.data_bytes(e) / 8) as usize,
            (c.partial_bytes() / 8) as usize,
        )
    }
}

/// Stores `bytes` into the first words of `words` (the last one zero-padded), relaxed.
fn store_bytes(words: &[AtomicU64], bytes: &[u8]) {
    for (w, c) in words.iter().zip(bytes.chunks(8)) {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        w.store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
}

/// Loads `out.len()` bytes from the first words of `words`, relaxed.
fn load_bytes(words: &[AtomicU64], out: &mut [u8]) {
    for (w, c) in words.iter().zip(out.chunks_mut(8)) {
        c.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes()[..c.len()]);
    }
}

/// A staged row this rank received: the sender, its slot, and the entries local here that got
/// a row, in ascending `k`: (expert row, weight).
#[derive(Clone, Debug)]
struct Received {
    sender: u16,
    slot: u32,
    entries: Vec<(u32, f32)>,
}

/// What a dispatch leaves for the combine after it.
#[derive(Clone, Debug)]
struct Last {
    /// My tokens' slots per destination and destination masks (as sender).
    slots: Vec<u32>,
    masks: Vec<u64>,
    counts: Vec<u32>,
    /// The rows I received (as receiver), and how many from each sender.
    received: Vec<Received>,
    from: Vec<u32>,
}

/// One rank's side of the protocol: its epochs and what its last dispatch received.
#[derive(Debug)]
pub struct MoeRank {
    rank: u16,
    epoch: u32,
    cepoch: u32,
    last: Option<Last>,
}

impl MoeRank {
    /// Rank `rank`, before its first call (both epochs 1).
    pub fn new(rank: u16) -> MoeRank {
        MoeRank::resume(rank, (1, 1))
    }

    /// Rank `rank` going on from the (dispatch, combine) epochs `(epoch, cepoch)`: what every
    /// rank of a world reached in its earlier calls.
    pub fn resume(rank: u16, (epoch, cepoch): (u32, u32)) -> MoeRank {
        MoeRank {
            rank,
            epoch,
            cepoch,
            last: None,
        }
    }

    /// Waits until word `i` of `words` carries `epoch` for every `i`; returns the values.
    fn wait(
        &self,
        world: &MoeWorld,
        phase: MoePhase,
        epoch: u32,
        words: &[AtomicU64],
        per_sender: usize,
    ) -> Result<Vec<u32>, MoeThreadError> {
        let mut out = vec![0u32; words.len()];
        let mut since: Option<Instant> = None;
        let mut next = 0;
        let mut spins = 0u32;
        while next < words.len() {
            let found = words[next].load(HEADER_OBSERVE);
            if let Some(v) = untag(found, epoch) {
                out[next] = v;
                next += 1;
                continue;
            }
            let timed_out = since.get_or_insert_with(Instant::now).elapsed() > world.deadline;
            if timed_out || world.abort.load(Ordering::Relaxed) {
                return Err(MoeThreadError::Timeout {
                    rank: self.rank,
                    phase,
                    epoch,
                    sender: (next / per_sender) as u16,
                    word: (next % per_sender) as u32,
                    found,
                });
            }
            pause(&mut spins);
        }
        Ok(out)
    }

    /// Dispatches this rank's `input`; returns what it received as a receiver.
    pub fn dispatch(
        &mut self,
        world: &MoeWorld,
        input: &MoeRankInput,
    ) -> Result<MoeRankDispatch, MoeThreadError> {
        let (cfg, dtype, me) = (&world.cfg, world.dtype, self.rank);
        let shape = |error| MoeThreadError::Shape { rank: me, error };
        let routed = routing(cfg, dtype, input).map_err(shape)?;
        let (w, k, l) = (
            usize::from(cfg.world),
            usize::from(cfg.topk),
            cfg.local_experts() as usize,
        );
        let (eb, tb) = (dtype.bytes() as u64, cfg.hidden as usize * dtype.bytes());
        let (row_words, data_words, _) = world.words(eb);
        let (epoch, half) = (self.epoch, (self.epoch % 2) as usize);
        let hw = cfg.header_words() as usize;

        // Rows first: each token once to each destination, at its fixed slot.
        let mut masks = Vec::with_capacity(routed.tokens);
        let mut meta = vec![0u8; k * ROW_ENTRY_BYTES as usize];
        for t in 0..routed.tokens {
            let idx = &input.topk_idx[t * k..][..k];
            let mask = dest_mask(cfg, idx);
            masks.push(mask);
            for q in (0..w).filter(|&q| mask >> q & 1 == 1) {
                for (kk, m) in meta.chunks_exact_mut(ROW_ENTRY_BYTES as usize).enumerate() {
                    let local = match cfg.owner(idx[kk]) {
                        Some((o, j)) if usize::from(o) == q => j as i32,
                        _ => -1,
                    };
                    m[..4].copy_from_slice(&local.to_le_bytes());
                    m[4..8].copy_from_slice(&routed.eslots[t * k + kk].to_le_bytes());
                    m[8..].copy_from_slice(&input.topk_weights[t * k + kk].to_le_bytes());
                }
                let row = cfg.stage_row(me, routed.slots[t * w + q]) as usize;
                let words = &world.areas[q].stage[half][row * row_words..][..row_words];
                store_bytes(words, &input.x[t * tb..][..tb]);
                store_bytes(&words[data_words..], &meta);
            }
        }
        // Then the header, to every rank: my count for it and my count of each of its experts.
        // The count word publishes the rows: its release store comes after every row, and the
        // receiver acquires every word before it reads a row, so that one release suffices. The
        // expert counts are data the receiver reads from the words themselves: relaxed, on
        // purpose (the loom models fail when the count word's store is weakened).
        for q in 0..w {
            let words = &world.areas[q].head[half][usize::from(me) * hw..][..hw];
            words[0].store(tag(epoch, routed.counts[q]), HEADER_PUBLISH);
            for (j, word) in words[1..].iter().enumerate() {
                word.store(tag(epoch, routed.ecounts[q * l + j]), Ordering::Relaxed);
            }
        }
        let mine = &world.areas[usize::from(me)];
        let head = self.wait(world, MoePhase::Dispatch, epoch, &mine.head[half], hw)?;
        let from: Vec<u32> = head.chunks_exact(hw).map(|h| h[0]).collect();
        let ecol: Vec<u32> = head
            .chunks_exact(hw)
            .flat_map(|h| h[1..].to_vec())
            .collect();

        let mut out = MoeRankDispatch {
            expert_x: vec![0; cfg.rows_max as usize * tb],
            spans: (0..l as u32).map(|j| expert_span(cfg, &ecol, j)).collect(),
            dropped: 0,
            invalid: routed.invalid,
        };
        let mut received = Vec::new();
        let mut data = vec![0u8; tb];
        for (p, &n) in from.iter().enumerate() {
            for slot in 0..n {
                let row = cfg.stage_row(p as u16, slot) as usize;
                let Some(words) = mine.stage[half].get(row * row_words..(row + 1) * row_words)
                else {
                    return Err(MoeThreadError::BadCount {
                        rank: me,
                        phase: MoePhase::Dispatch,
                        sender: p as u16,
                        count: n,
                    });
                };
                load_bytes(words, &mut data);
                load_bytes(&words[data_words..], &mut meta);
                let mut entries = Vec::new();
                for (kk, m) in meta.chunks_exact(ROW_ENTRY_BYTES as usize).enumerate() {
                    let local = i32::from_le_bytes([m[0], m[1], m[2], m[3]]);
                    if local < 0 {
                        continue;
                    }
                    if local as usize >= l {
                        return Err(MoeThreadError::BadEntry {
                            rank: me,
                            sender: p as u16,
                            slot,
                            k: kk as u16,
                            expert: local,
                        });
                    }
                    let eslot = u32::from_le_bytes([m[4], m[5], m[6], m[7]]);
                    let weight = f32::from_le_bytes([m[8], m[9], m[10], m[11]]);
                    match expert_row(cfg, &ecol, p as u16, local as u32, eslot) {
                        Some(r) => {
                            out.expert_x[r as usize * tb..][..tb].copy_from_slice(&data);
                            entries.push((r, weight));
                        }
                        None => out.dropped += 1,
                    }
                }
                received.push(Received {
                    sender: p as u16,
                    slot,
                    entries,
                });
            }
        }
        self.epoch += 1;
        self.last = Some(Last {
            slots: routed.slots,
            masks,
            counts: routed.counts,
            received,
            from,
        });
        Ok(out)
    }

    /// Combines `expert_out` (`rows_max * hidden` elements, this rank's expert outputs) after
    /// the last dispatch; returns this rank's tokens' outputs, `[tokens, hidden]`.
    pub fn combine(
        &mut self,
        world: &MoeWorld,
        expert_out: &[u8],
    ) -> Result<Vec<u8>, MoeThreadError> {
        let (cfg, dtype, me) = (&world.cfg, world.dtype, self.rank);
        let last = self
            .last
            .as_ref()
            .ok_or(MoeThreadError::NoDispatch { rank: me })?;
        let (w, h) = (usize::from(cfg.world), cfg.hidden as usize);
        let want = cfg.rows_max as usize * h * dtype.bytes();
        if expert_out.len() != want {
            return Err(MoeThreadError::Shape {
                rank: me,
                error: MoeError::BadLength {
                    what: "expert_out",
                    len: expert_out.len(),
                    want,
                },
            });
        }
        let (_, _, pw) = world.words(dtype.bytes() as u64);
        let (epoch, half) = (self.cepoch, (self.cepoch % 2) as usize);

        // A partial per received row, into the sender's combine half.
        let mut partial = vec![0f32; h];
        let mut bytes = vec![0u8; h * 4];
        for rx in &last.received {
            partial.fill(0.0);
            for &(row, weight) in &rx.entries {
                for (c, p) in partial.iter_mut().enumerate() {
                    *p = weight.mul_add(dtype.get(expert_out, row as usize * h + c), *p);
                }
            }
            for (c, p) in partial.iter().enumerate() {
                bytes[4 * c..4 * c + 4].copy_from_slice(&p.to_le_bytes());
            }
            let row = cfg.stage_row(me, rx.slot) as usize;
            let area = &world.areas[usize::from(rx.sender)];
            store_bytes(&area.partial[half][row * pw..][..pw], &bytes);
        }
        for (p, &n) in last.from.iter().enumerate() {
            world.areas[p].chead[half][usize::from(me)].store(tag(epoch, n), HEADER_PUBLISH);
        }
        let mine = &world.areas[usize::from(me)];
        let counts = self.wait(world, MoePhase::Combine, epoch, &mine.chead[half], 1)?;
        for (q, (&found, &sent)) in counts.iter().zip(&last.counts).enumerate() {
            if found != sent {
                return Err(MoeThreadError::CountMismatch {
                    rank: me,
                    sender: q as u16,
                    expected: sent,
                    found,
                });
            }
        }
        let mut out = vec![0u8; last.masks.len() * h * dtype.bytes()];
        let mut acc = vec![0f32; h];
        for (t, &mask) in last.masks.iter().enumerate() {
            acc.fill(0.0);
            for q in (0..w).filter(|&q| mask >> q & 1 == 1) {
                let row = cfg.stage_row(q as u16, last.slots[t * w + q]) as usize;
                load_bytes(&mine.partial[half][row * pw..][..pw], &mut bytes);
                for (c, a) in acc.iter_mut().enumerate() {
                    *a += f32::from_le_bytes([
                        bytes[4 * c],
                        bytes[4 * c + 1],
                        bytes[4 * c + 2],
                        bytes[4 * c + 3],
                    ]);
                }
            }
            for (c, &a) in acc.iter().enumerate() {
                dtype.put(&mut out, t * h + c, a);
            }
        }
        self.cepoch += 1;
        Ok(out)
    }
}

/// Spins a little, then yields (to loom under `cfg(loom)`).
fn pause(spins: &mut u32) {
    *spins += 1;
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// One call of a sequence: every rank's input.
pub type MoeCall = Vec<MoeRankInput>;

/// Runs `calls` back to back on one OS thread per rank, each a dispatch and then a combine of
/// the expert outputs `expert(rank, &dispatch)` gives, with no barrier anywhere, going on from
/// the world's earlier runs. Returns, per call, every rank's dispatch result and combined
/// output. A world whose earlier run failed is refused ([`MoeThreadError::WorldFailed`]). (Under `cfg(loom)` the atomics are
/// loom's and only a loom model may run it.)
#[allow(clippy::type_complexity)]
pub fn run_moe_threads<F>(
    world: &MoeWorld,
    calls: &[MoeCall],
    expert: F,
) -> Result<Vec<(Vec<MoeRankDispatch>, Vec<Vec<u8>>)>, MoeThreadError>
where
    F: Fn(u16, &MoeRankDispatch) -> Vec<u8> + Sync,
{
    let ranks = world.cfg.world;
    // One run at a time, going on from the epochs the last one reached.
    let mut next = world.next.lock().unwrap_or_else(|e| e.into_inner());
    let Some(start) = *next else {
        return Err(MoeThreadError::WorldFailed);
    };
    let per_rank: Vec<Result<Vec<(MoeRankDispatch, Vec<u8>)>, MoeThreadError>> =
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..ranks)
                .map(|r| {
                    let expert = &expert;
                    s.spawn(move || {
                        let mut rank = MoeRank::resume(r, start);
                        let run = calls
                            .iter()
                            .map(|call| {
                                let input =
                                    call.get(usize::from(r)).ok_or(MoeThreadError::Shape {
                                        rank: r,
                                        error: MoeError::BadLength {
                                            what: "inputs",
                                            len: call.len(),
                                            want: usize::from(ranks),
                                        },
                                    })?;
                                let d = rank.dispatch(world, input)?;
                                let y = expert(r, &d);
                                let c = rank.combine(world, &y)?;
                                Ok((d, c))
                            })
                            .collect::<Result<Vec<_>, _>>();
                        if run.is_err() {
                            world.abort();
                        }
                        run
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(Err(MoeThreadError::ThreadPanicked)))
                .collect()
        });
    // The first failure that is not a rank giving up because another failed.
    let mut results = Vec::with_capacity(per_rank.len());
    let mut first = None;
    for r in per_rank {
        match r {
            Ok(v) => results.push(v),
            Err(e) => {
                let aborted = matches!(e, MoeThreadError::Timeout { .. });
                if first.as_ref().is_none_or(|(a, _)| *a && !aborted) {
                    first = Some((aborted, e));
                }
            }
        }
    }
    if let Some((_, e)) = first {
        *next = None;
        return Err(e);
    }
    let n = u32::try_from(calls.len()).unwrap_or(u32::MAX);
    *next = Some((start.0.wrapping_add(n), start.1.wrapping_add(n)));
    Ok((0..calls.len())
        .map(|c| results.iter().map(|r| r[c].clone()).unzip())
        .collect())
}
