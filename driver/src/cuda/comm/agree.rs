//! Symmetric allocation agrees across ranks: after every alloc and free, each rank compares its
//! allocator with the others', and a divergence names the first differing call on both sides.
//!
//! What is compared ([`heap_words`]): the allocator's call count and running hash (symm-core's
//! `Heap`), then its last three calls as (seq, alloc, size, align, offset).
//!
//! * **The job** ([`Comm::agree`]): every rank's words through the bootstrap's all-gather.
//! * **A team** ([`Comm::agree_team`]): only the team's members allocate in its region, and the
//!   bootstrap's collectives span the whole job, so the members meet in the region itself. Its
//!   first [`MAILBOX`] bytes on every member's heap hold two records (by the parity of the
//!   agreement's sequence number): each member writes its record into its own heap, then reads
//!   every other member's from theirs through its mapping of the symmetric heap, until each
//!   carries this sequence number and a valid checksum (a record read while half written fails
//!   the checksum and is read again). A member can be at most one agreement ahead of another
//!   (it cannot finish agreement k before everyone wrote record k), so the record of the other
//!   parity is never overwritten while someone still reads it. Reads poll with the job's
//!   bootstrap deadline and stop when a peer is lost. The region starts zeroed, so no stale
//!   record carries a sequence number.

use std::time::{Duration, Instant};

use symm_core::heap::Heap;
use symm_core::team::Team;

use super::Comm;
use crate::cuda::error::{CudaError, HeapCall, Result};
use crate::cuda::rendezvous::Bootstrap;

/// Bytes at the start of a team's region reserved for its agreement records.
pub(super) const MAILBOX: u64 = 4096;
/// Bytes of one record slot (two per member heap).
const SLOT: u64 = 256;
/// Most heap words: call count, hash, three calls of five words.
const HEAP_WORDS: usize = 2 + 3 * 5;
/// Words of a record: seq, the number of heap words, the heap words (zero padded), checksum.
const RECORD_WORDS: usize = 2 + HEAP_WORDS + 1;

/// The words every rank compares: call count, hash, then the last (at most three) calls.
pub(super) fn heap_words(h: &Heap) -> Vec<u64> {
    let mut v: Vec<u64> = vec![h.calls(), h.hash()];
    let all: Vec<_> = h.history().collect();
    for c in &all[all.len().saturating_sub(3)..] {
        v.extend([c.seq, c.alloc as u64, c.size, c.align, c.offset]);
    }
    v
}

/// The error when rank `them`'s words differ from rank `me`'s, naming the first of the recent
/// calls whose arguments differ (else the last).
pub(super) fn diverged(
    what: &'static str,
    me: u16,
    mine: &[u64],
    them: u16,
    theirs: &[u64],
) -> Option<CudaError> {
    if theirs.get(..2) == mine.get(..2) {
        return None;
    }
    let describe = |c: &[u64]| match c {
        [_, 1, size, align, _] => HeapCall::Alloc {
            size: *size,
            align: *align,
        },
        [_, _, _, _, offset] => HeapCall::Free { offset: *offset },
        _ => HeapCall::Nothing,
    };
    let (a, b) = (
        mine.get(2..).unwrap_or(&[]).chunks(5),
        theirs.get(2..).unwrap_or(&[]).chunks(5),
    );
    let pairs: Vec<_> = a.zip(b).collect();
    let (m, t) = pairs
        .iter()
        .find(|(m, t)| m.get(1..4) != t.get(1..4))
        .or(pairs.last())
        .copied()
        .unwrap_or((&[], &[]));
    Some(CudaError::Diverged {
        what,
        seq: m.first().copied().or(mine.first().copied()).unwrap_or(0),
        rank: me,
        mine: describe(m),
        peer: them,
        theirs: describe(t),
    })
}

fn words(v: &[u8]) -> Vec<u64> {
    v.chunks_exact(8)
        .filter_map(|b| b.try_into().ok().map(u64::from_le_bytes))
        .collect()
}

/// A record's checksum over its other words (never 0 for a written record).
fn checksum(w: &[u64]) -> u64 {
    w.iter().fold(0x9e37_79b9_7f4a_7c15u64, |h, &x| {
        (h ^ x).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(17)
    }) | 1
}

/// Encodes record `seq` of `heap` words: seq, word count, words (zero padded), checksum.
pub(super) fn record(seq: u64, heap: &[u64]) -> Vec<u8> {
    let mut w = [0u64; RECORD_WORDS];
    w[0] = seq;
    w[1] = heap.len().min(HEAP_WORDS) as u64;
    for (d, s) in w[2..RECORD_WORDS - 1].iter_mut().zip(heap) {
        *d = *s;
    }
    w[RECORD_WORDS - 1] = checksum(&w[..RECORD_WORDS - 1]);
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The heap words of record `seq` in `bytes`, when it is that record and whole.
pub(super) fn parse(bytes: &[u8], seq: u64) -> Option<Vec<u64>> {
    let w = words(bytes);
    if w.len() != RECORD_WORDS
        || w[0] != seq
        || w[RECORD_WORDS - 1] != checksum(&w[..RECORD_WORDS - 1])
    {
        return None;
    }
    let n = usize::try_from(w[1]).ok().filter(|&n| n <= HEAP_WORDS)?;
    Some(w[2..2 + n].to_vec())
}

impl Comm {
    /// Compares the allocators of every rank of the job.
    pub(super) fn agree(&self) -> Result<()> {
        let mine = heap_words(&self.alloc_lock()?.heap);
        let bytes: Vec<u8> = mine.iter().flat_map(|x| x.to_le_bytes()).collect();
        let all = self.job.boot.all_gather(self.job.rank, &bytes)?;
        for (r, theirs) in all.iter().enumerate() {
            if let Some(e) = diverged(
                "symmetric allocation",
                self.job.rank,
                &mine,
                r as u16,
                &words(theirs),
            ) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Team-collective: compares the team allocator `heap` of every member of `team` through
    /// the mailbox at heap offset `mailbox` (agreement number `seq`, from 1).
    pub(super) fn agree_team(
        &self,
        team: &Team,
        mailbox: u64,
        seq: u64,
        heap: &Heap,
    ) -> Result<()> {
        let mine = heap_words(heap);
        let at = mailbox + (seq % 2) * SLOT;
        self.heap_write(at, &record(seq, &mine))?;
        let deadline = Instant::now() + self.opts.bootstrap_timeout;
        for m in 0..team.size() {
            let Some(peer) = team.global(m) else {
                continue;
            };
            if peer == self.job.rank {
                continue;
            }
            let theirs = loop {
                let bytes = self.peer_read(peer, at, RECORD_WORDS as u64 * 8)?;
                if let Some(w) = parse(&bytes, seq) {
                    break w;
                }
                if let Some(rank) = self.job.boot.bootstrap().lost() {
                    return Err(CudaError::PeerLost { rank });
                }
                if Instant::now() > deadline {
                    return Err(CudaError::TeamTimeout {
                        team: team.id(),
                        peer,
                        seq,
                        waited_ms: u64::try_from(self.opts.bootstrap_timeout.as_millis())
                            .unwrap_or(u64::MAX),
                    });
                }
                std::thread::sleep(Duration::from_micros(50));
            };
            if let Some(e) = diverged("team allocation", self.job.rank, &mine, peer, &theirs) {
                return Err(e);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_torn_or_stale_ones_are_refused() {
        let mut h = Heap::new(1 << 20);
        let a = h.alloc(4096, 4096).unwrap();
        h.alloc(100, 16).unwrap();
        h.free(a).unwrap();
        h.alloc(64, 64).unwrap();
        let w = heap_words(&h);
        assert_eq!(w.len(), 2 + 15);
        let rec = record(7, &w);
        assert_eq!(parse(&rec, 7), Some(w.clone()));
        // Another agreement's record, or the zeroed mailbox, is not this one.
        assert_eq!(parse(&rec, 8), None);
        assert_eq!(parse(&vec![0u8; rec.len()], 1), None);
        // A record half written (any word still old) fails its checksum.
        for i in 0..RECORD_WORDS {
            let mut torn = rec.clone();
            torn[i * 8] ^= 0x40;
            assert_eq!(parse(&torn, 7), None, "word {i}");
        }
        // Fewer calls than three: the padding is no call.
        let mut h = Heap::new(1 << 20);
        h.alloc(16, 16).unwrap();
        let w = heap_words(&h);
        assert_eq!(parse(&record(1, &w), 1), Some(w));
    }

    #[test]
    fn a_divergence_names_both_calls() {
        let (mut a, mut b) = (Heap::new(1 << 20), Heap::new(1 << 20));
        a.alloc(4096, 4096).unwrap();
        b.alloc(8192, 4096).unwrap();
        let e = diverged("team allocation", 0, &heap_words(&a), 3, &heap_words(&b)).unwrap();
        assert_eq!(
            e,
            CudaError::Diverged {
                what: "team allocation",
                seq: 0,
                rank: 0,
                mine: HeapCall::Alloc {
                    size: 4096,
                    align: 4096
                },
                peer: 3,
                theirs: HeapCall::Alloc {
                    size: 8192,
                    align: 4096
                },
            }
        );
        // The text a person reads names both calls.
        let m = e.to_string();
        assert!(
            m.contains("rank 0 called alloc(size 4096")
                && m.contains("rank 3 called alloc(size 8192"),
            "{m}"
        );
        assert!(diverged("x", 0, &heap_words(&a), 1, &heap_words(&a)).is_none());
    }
}
