//! The ranks agree on a framework's call before its first use: the same arguments, and the
//! same number of calls before it.
//!
//! [`Tensors::enqueue`] counts the calls it launched since the job started or was last reset
//! (`Tensors::calls`). The first time a set of arguments is used (the request, and for each
//! side its heap offset or "staged"), every rank sends the others its count and its arguments
//! through the bootstrap ([`Call::bytes`]), and each compares ([`Call::agrees`]):
//!
//! * **Another count** means one rank skipped a call or made one more: the calls parted, and
//!   some rank's earlier launch waits on the device for a call that will not come (or was
//!   answered by another call's signals). Every rank fails with [`CudaError::RanksDiffer`]
//!   naming both counts, at once instead of at the deadline; the rank raises its own abort word,
//!   so its launches still waiting stop at their next poll, and stays poisoned until
//!   [`Tensors::reset`], which zeroes the count on every rank.
//! * **Other arguments** at the same count: [`CudaError::RanksDiffer`] naming both, on every
//!   rank. Nothing was launched that could wait, so the job stays usable.
//!
//! Later uses of agreed arguments cost nothing here; a call that differs then is named on the
//! device by its signature (`symm_core::sched::Signature`), which carries the kernel's own
//! count. A skipped or doubled call is thus named wherever it meets a first use, and where it
//! meets a launch of another shape.

use std::sync::atomic::Ordering;

use symm_core::sched::Request;

use super::{Comm, Tensors};
use crate::abort::Raise;
use crate::cuda::error::{CudaError, Result};
use crate::cuda::rendezvous::Bootstrap;

/// One rank's side of the agreement: its count of calls before this one, and its arguments
/// in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Call {
    /// Calls this rank launched before this one.
    pub(super) seq: u64,
    /// The arguments, in words (the request and where each side lies).
    pub(super) args: String,
}

/// Bytes of the words a peer may send (longer ones are cut, never trusted further).
const MAX_WORDS: usize = 512;

impl Call {
    /// Call `seq` of `req` over sides at heap offsets `input` and `output` (`None`: staged).
    pub(super) fn of(seq: u64, req: &Request, input: Option<u64>, output: Option<u64>) -> Call {
        let side = |o: Option<u64>| o.map_or("staged".to_string(), |o| format!("heap+{o:#x}"));
        let args = format!(
            "{} {} {} B {} {} ch{} input {} output {} {:?}",
            req.collective.name(),
            req.algorithm.name(),
            req.bytes,
            req.dtype.name(),
            req.op.name(),
            req.channels,
            side(input),
            side(output),
            req.collective
        );
        Call { seq, args }
    }

    /// What travels: the count, little endian, then the words.
    pub(super) fn bytes(&self) -> Vec<u8> {
        let mut v = self.seq.to_le_bytes().to_vec();
        v.extend_from_slice(self.args.as_bytes());
        v
    }

    /// A peer's bytes read back (`None` when shorter than a count).
    fn parse(bytes: &[u8]) -> Option<Call> {
        let (seq, args) = bytes.split_first_chunk::<8>()?;
        let args = &args[..args.len().min(MAX_WORDS)];
        Some(Call {
            seq: u64::from_le_bytes(*seq),
            args: String::from_utf8_lossy(args).into_owned(),
        })
    }

    /// The first rank whose side (`all`, by rank) differs from this one, as the error every
    /// rank gives, and whether the counts differ (the calls parted); `None` when all agree.
    pub(super) fn agrees(&self, all: &[Vec<u8>]) -> Option<(CudaError, bool)> {
        let mine = format!("made call {} ({})", self.seq, self.args);
        for (r, bytes) in all.iter().enumerate() {
            let (theirs, parted) = match Call::parse(bytes) {
                Some(t) if t == *self => continue,
                Some(t) if t.seq != self.seq => (
                    format!(
                        "call {} ({}): a rank skipped a call or made one more",
                        t.seq, t.args
                    ),
                    true,
                ),
                Some(t) => (format!("call {} ({})", t.seq, t.args), false),
                None => (format!("{} bytes, not a call", bytes.len()), true),
            };
            let e = CudaError::RanksDiffer {
                rank: r as u16,
                mine,
                theirs: theirs.chars().take(300).collect(),
            };
            return Some((e, parted));
        }
        None
    }
}

impl Tensors {
    /// The first time this set of arguments is used, checks with every rank that theirs is
    /// the same and that as many calls came before it (see the module doc).
    pub(super) fn agree_args(
        &self,
        comm: &Comm,
        req: &Request,
        input: Option<u64>,
        output: Option<u64>,
    ) -> Result<()> {
        let key = (*req, input, output);
        if self.spans_lock()?.agreed.contains(&key) {
            return Ok(());
        }
        let call = Call::of(self.calls.load(Ordering::Acquire), req, input, output);
        let all = comm.job.boot.all_gather(comm.job.rank, &call.bytes())?;
        if let Some((e, parted)) = call.agrees(&all) {
            if parted {
                // Launches of this rank that wait for a call the others will not make stop
                // at their next poll; the reset lowers the word again.
                comm.host.raise();
                comm.poison.raise(&e);
            }
            return Err(e);
        }
        self.spans_lock()?.remember_agreed(key);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::dtype::{DType, ReduceOp};
    use symm_core::sched::{Algorithm, Collective};

    fn req(bytes: u64) -> Request {
        Request::new(
            Collective::AllReduce,
            Algorithm::OneShot,
            4,
            bytes,
            DType::F32,
            ReduceOp::Sum,
        )
    }

    fn sides(calls: &[Call]) -> Vec<Vec<u8>> {
        calls.iter().map(Call::bytes).collect()
    }

    #[test]
    fn the_same_call_at_the_same_count_agrees() {
        let c = Call::of(7, &req(4096), Some(0x1000), None);
        assert_eq!(c.agrees(&sides(&[c.clone(), c.clone(), c.clone()])), None);
    }

    #[test]
    fn a_rank_at_another_count_is_a_skipped_or_doubled_call_and_parts_the_job() {
        // Rank 2 skipped a call: its next first use meets the others' one count later.
        let mine = Call::of(105, &req(4096), None, None);
        let skipper = Call::of(104, &req(4096), None, None);
        let all = sides(&[mine.clone(), mine.clone(), skipper.clone()]);
        let (e, parted) = mine.agrees(&all).expect("named");
        assert!(parted);
        let text = e.to_string();
        assert!(text.contains("made call 105"), "{text}");
        assert!(text.contains("rank 2 call 104"), "{text}");
        assert!(text.contains("skipped a call or made one more"), "{text}");
        assert_eq!(e.kind(), crate::cuda::ErrorKind::RanksDiffer);
        // The skipper names the first of the others.
        let (e, parted) = skipper.agrees(&all).expect("named");
        assert!(parted);
        assert!(e.to_string().contains("rank 0 call 105"), "{e}");
    }

    #[test]
    fn other_arguments_at_the_same_count_are_named_without_parting_the_job() {
        let mine = Call::of(3, &req(4096), None, None);
        let other = Call::of(3, &req(8192), None, None);
        let (e, parted) = mine.agrees(&sides(&[mine.clone(), other])).expect("named");
        assert!(!parted);
        let text = e.to_string();
        assert!(text.contains("rank 1 call 3 (all_reduce"), "{text}");
        assert!(text.contains("8192 B"), "{text}");
    }

    #[test]
    fn a_peer_that_sends_garbage_is_named_not_trusted() {
        let mine = Call::of(3, &req(4096), None, None);
        let long = [vec![3, 0, 0, 0, 0, 0, 0, 0], vec![b'x'; 1 << 20]].concat();
        for bad in [vec![1u8, 2, 3], long] {
            let (e, parted) = mine.agrees(&[mine.bytes(), bad.clone()]).expect("named");
            assert_eq!(e.kind(), crate::cuda::ErrorKind::RanksDiffer);
            assert!(e.to_string().len() < 1200, "{}", e.to_string().len());
            assert_eq!(parted, bad.len() < 8);
        }
    }
}
