//! A [`Comm`] as a [`Backend`](crate::backend::Backend): every process of the job runs the same
//! requests with the same inputs (each writes its own rank's). `run` gives every process every
//! rank's output through the bootstrap, so the shared conformance matrix checks the whole job
//! from each rank; `run_checked` (what the matrix calls) checks each rank's output in its own
//! process against the reference and gathers only the verdicts, so large cases move no output
//! between processes. With a trace asked for, the run uses the traced interpreter and every
//! process gets the ranks' parts merged into one trace ([`trace::merge`]).

use super::{Comm, CommTeam, Tracer};
use crate::backend::{check_inputs, Backend, BackendError, Outcome, RankCheck, Verdict};
use crate::cuda::device::Stream;
use crate::cuda::error::{CudaError, Result};
use crate::cuda::rendezvous::Bootstrap;
use crate::cuda::trace;
use crate::host::POISON;
use symm_core::sched::Request;

/// Every rank's output, and the merged trace when one was asked for.
type Gathered = (Vec<Vec<u8>>, Option<Vec<u8>>);

/// Bytes each rank contributes per bootstrap round (under the frame limit).
const PIECE: usize = 60 << 10;

/// Most bytes one rank may contribute to a [`Comm::gather`] (a peer announcing more is refused
/// before anything is allocated for it).
pub const MAX_GATHER: usize = 1 << 30;

/// The lengths the ranks announced for a gather (8 bytes each, little endian), refused when
/// malformed or over [`MAX_GATHER`].
pub(crate) fn announced(msgs: &[Vec<u8>]) -> Result<Vec<usize>> {
    msgs.iter()
        .enumerate()
        .map(|(r, l)| {
            let n = l
                .as_slice()
                .try_into()
                .map(u64::from_le_bytes)
                .map_err(|_| CudaError::Malformed {
                    rank: u16::try_from(r).unwrap_or(u16::MAX),
                    what: "length",
                })?;
            usize::try_from(n)
                .ok()
                .filter(|&n| n <= MAX_GATHER)
                .ok_or_else(|| CudaError::LengthMismatch {
                    rank: Some(u16::try_from(r).unwrap_or(u16::MAX)),
                    what: "announced bytes (at most)",
                    sent: n,
                    expected: MAX_GATHER as u64,
                })
        })
        .collect()
}

impl Comm {
    /// Collective: every rank's `mine`, in rank order, up to [`MAX_GATHER`] bytes each (sent in
    /// pieces under the bootstrap's frame limit; the sizes may differ between ranks). Memory
    /// grows with what actually arrives, not with what a peer announces.
    pub fn gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        if mine.len() > MAX_GATHER {
            return Err(CudaError::TooLarge {
                what: "gather bytes",
                size: mine.len() as u64,
                limit: MAX_GATHER as u64,
            });
        }
        let lens = announced(
            &self
                .job
                .boot
                .all_gather(self.job.rank, &(mine.len() as u64).to_le_bytes())?,
        )?;
        let most = lens.iter().copied().max().unwrap_or(0);
        let mut all: Vec<Vec<u8>> = lens
            .iter()
            .map(|&n| Vec::with_capacity(n.min(PIECE)))
            .collect();
        for i in 0..most.div_ceil(PIECE) {
            let piece = &mine[(i * PIECE).min(mine.len())..((i + 1) * PIECE).min(mine.len())];
            let got = self.job.boot.all_gather(self.job.rank, piece)?;
            for (r, (o, p)) in all.iter_mut().zip(got.iter()).enumerate() {
                if o.len() + p.len() > lens[r] {
                    return Err(CudaError::LengthMismatch {
                        rank: Some(u16::try_from(r).unwrap_or(u16::MAX)),
                        what: "bytes",
                        sent: (o.len() + p.len()) as u64,
                        expected: lens[r] as u64,
                    });
                }
                o.extend_from_slice(p);
            }
        }
        if let Some(r) = (0..all.len()).find(|&r| all[r].len() != lens[r]) {
            return Err(CudaError::LengthMismatch {
                rank: Some(u16::try_from(r).unwrap_or(u16::MAX)),
                what: "bytes",
                sent: all[r].len() as u64,
                expected: lens[r] as u64,
            });
        }
        Ok(all)
    }

    /// Runs `req` on this rank's `input` (traced when asked) and returns its output and trace
    /// part. On a failure this rank still joins one gather, as the others do after their run,
    /// so the job stays in step.
    fn run_mine(
        &self,
        req: &Request,
        input: &[u8],
        traced: bool,
    ) -> Result<(Vec<u8>, Option<Vec<u8>>)> {
        let stream = Stream::new(&self.dev)?;
        let b = self.alloc(req)?;
        let mem = self.memory();
        let run = (|| -> Result<(Vec<u8>, Option<Vec<u8>>)> {
            mem.write(b.input, input)?;
            mem.fill(b.output, b.sizes.output, POISON)?;
            // Scratch is not filled: a peer's low-latency lines may land in it as soon as the
            // peer's kernel runs, before this rank's fill would (symm_core::ll).
            let part = if traced {
                // A tracer of its own per traced run: tracing is for tests and the viz, and the
                // kernel cache makes loading it cheap.
                Some(Tracer::load(self)?.run(self, req, &b, &stream)?)
            } else {
                self.enqueue(req, &b, &stream)?;
                self.synchronize(&stream)?;
                None
            };
            Ok((mem.read(b.output, b.sizes.output)?, part))
        })();
        let freed = self.free(&b);
        run.and_then(|x| freed.map(|_| x)).inspect_err(|_| {
            let _ = self.gather(&[]);
        })
    }

    fn run_gathered(&self, req: &Request, input: &[u8], traced: bool) -> Result<Gathered> {
        let (mine, part) = self.run_mine(req, input, traced)?;
        let outputs = self.gather(&mine)?;
        let trace = match part {
            Some(p) => Some(trace::merge(&self.gather(&p)?)?),
            None => None,
        };
        Ok((outputs, trace))
    }
}

/// Most bytes of one rank's verdict text that reach the other ranks.
const MAX_VERDICT: usize = 1024;

/// What a rank sends of its verdict: nothing when it passed, else the first [`MAX_VERDICT`]
/// bytes of the difference (never empty).
fn verdict_text(v: &Verdict) -> Vec<u8> {
    match v {
        Ok(()) => Vec::new(),
        Err(m) if m.is_empty() => b"?".to_vec(),
        Err(m) => m.as_bytes()[..m.len().min(MAX_VERDICT)].to_vec(),
    }
}

/// Whether there is one reference output per rank of a world of `n`.
fn reference_count(want: &[Vec<u8>], n: u16) -> Verdict {
    match want.len() == usize::from(n) {
        true => Ok(()),
        false => Err(format!("{} reference outputs, want {n}", want.len())),
    }
}

/// The verdict rank `me` reports from the gathered verdict texts `all`: the first refused one
/// among `ranks` (indices into `all`, in the order `me` counts them), `mine` when that one is
/// `me`'s own, else the other's text as `who` `me` saw it.
fn first_refused(
    all: &[Vec<u8>],
    ranks: impl IntoIterator<Item = usize>,
    me: usize,
    mine: Verdict,
    who: &str,
) -> Verdict {
    let first = ranks
        .into_iter()
        .enumerate()
        .find(|&(_, r)| all.get(r).is_some_and(|t| !t.is_empty()));
    match first {
        None => Ok(()),
        Some((local, _)) if local == me => mine,
        Some((_, r)) => Err(format!(
            "(seen from {who} {me}) {}",
            String::from_utf8_lossy(&all[r][..all[r].len().min(MAX_VERDICT)])
        )),
    }
}

impl Comm {
    /// Runs `req` on this rank's `input` and checks the output here with `check` against
    /// `want`; every rank then gathers the verdicts (empty: passed).
    fn run_verdict(
        &self,
        req: &Request,
        input: &[u8],
        want: &[u8],
        check: &RankCheck<'_>,
    ) -> Result<Verdict> {
        let me = self.job.rank as usize;
        let (found, _) = self.run_mine(req, input, false)?;
        let mine = check(me, &found, want);
        let all = self.gather(&verdict_text(&mine))?;
        Ok(first_refused(&all, 0..all.len(), me, mine, "rank"))
    }
}

impl Backend for Comm {
    fn name(&self) -> String {
        format!("comm rank {} of {}", self.job.rank, self.job.world)
    }

    fn fixed_world(&self) -> Option<u16> {
        Some(self.job.world)
    }

    /// Collective: every rank calls it with the same request, all ranks' `inputs` and the same
    /// `trace` flag.
    fn run(
        &mut self,
        req: &Request,
        inputs: &[Vec<u8>],
        trace: bool,
    ) -> std::result::Result<Outcome, BackendError> {
        check_inputs(Some(self.job.world), req, inputs)?;
        let mine = &inputs[self.job.rank as usize];
        let (outputs, trace) = self
            .run_gathered(req, mine, trace)
            .map_err(BackendError::Cuda)?;
        Ok(Outcome { outputs, trace })
    }

    /// Collective, as `run`: each rank checks its own output and only the verdicts are
    /// gathered.
    fn run_checked(
        &mut self,
        req: &Request,
        inputs: &[Vec<u8>],
        want: &[Vec<u8>],
        check: &RankCheck<'_>,
    ) -> std::result::Result<Verdict, BackendError> {
        check_inputs(Some(self.job.world), req, inputs)?;
        if let Err(e) = reference_count(want, self.job.world) {
            return Ok(Err(e));
        }
        let me = self.job.rank as usize;
        self.run_verdict(req, &inputs[me], &want[me], check)
            .map_err(BackendError::Cuda)
    }
}

/// Runs `req` on this rank's `input` in `team` and returns its output (buffers freed).
fn team_run_mine(team: &CommTeam<'_>, req: &Request, input: &[u8]) -> Result<Vec<u8>> {
    let comm = team.comm();
    let stream = Stream::new(comm.device())?;
    let b = team.alloc(req)?;
    let mem = comm.memory();
    let run = (|| {
        mem.write(b.input, input)?;
        mem.fill(b.output, b.sizes.output, POISON)?;
        // No scratch fill: a peer's low-latency lines may already be there.
        CommTeam::run(team, req, &b, &stream)?;
        mem.read(b.output, b.sizes.output)
    })();
    team.free(&b)?;
    run
}

impl Backend for CommTeam<'_> {
    fn name(&self) -> String {
        format!(
            "comm team {:?} (id {}), local rank {}",
            self.team().members(),
            self.team().id(),
            self.rank()
        )
    }

    fn fixed_world(&self) -> Option<u16> {
        Some(self.size())
    }

    /// Collective over the whole job (outputs are gathered through the job's bootstrap): every
    /// rank of the Comm calls it at the same point, each on its own team, with that team's
    /// inputs in local-rank order.
    fn run(
        &mut self,
        req: &Request,
        inputs: &[Vec<u8>],
        _trace: bool,
    ) -> std::result::Result<Outcome, BackendError> {
        check_inputs(Some(self.size()), req, inputs)?;
        let comm = self.comm();
        let mine = team_run_mine(self, req, &inputs[self.rank() as usize]);
        // Every rank gathers, also after a failure, so the job stays in step.
        let all = comm.gather(mine.as_deref().unwrap_or(&[]));
        let mine = mine.map_err(BackendError::Cuda)?;
        let all = all.map_err(BackendError::Cuda)?;
        let outputs = self
            .team()
            .members()
            .iter()
            .map(|&r| all.get(r as usize).cloned().unwrap_or_default())
            .collect::<Vec<_>>();
        debug_assert_eq!(outputs.get(self.rank() as usize), Some(&mine));
        Ok(Outcome {
            outputs,
            trace: None,
        })
    }

    /// Collective over the whole job, as `run`: each rank checks its own output here and the
    /// job gathers only the verdicts; a rank reports the first refused output of its team.
    fn run_checked(
        &mut self,
        req: &Request,
        inputs: &[Vec<u8>],
        want: &[Vec<u8>],
        check: &RankCheck<'_>,
    ) -> std::result::Result<Verdict, BackendError> {
        check_inputs(Some(self.size()), req, inputs)?;
        if let Err(e) = reference_count(want, self.size()) {
            return Ok(Err(e));
        }
        let me = self.rank() as usize;
        let comm = self.comm();
        let mine = team_run_mine(self, req, &inputs[me]);
        let verdict: Verdict = match &mine {
            Ok(found) => check(me, found, &want[me]),
            Err(_) => Ok(()),
        };
        // Every rank gathers, also after a failure, so the job stays in step.
        let all = comm.gather(&verdict_text(&verdict));
        mine.map_err(BackendError::Cuda)?;
        let all = all.map_err(BackendError::Cuda)?;
        let members = self.team().members().iter().map(|&r| r as usize);
        Ok(first_refused(&all, members, me, verdict, "local rank"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_reports_the_first_refused_verdict_of_its_ranks() {
        let all = vec![Vec::new(), b"rank 1 element 3".to_vec(), vec![b'x'; 5000]];
        // Rank 1 refused: rank 0 reports its text, rank 1 its own verdict.
        let seen = first_refused(&all, 0..3, 0, Ok(()), "rank").unwrap_err();
        assert_eq!(seen, "(seen from rank 0) rank 1 element 3");
        let own = first_refused(&all, 0..3, 1, Err("mine".into()), "rank");
        assert_eq!(own, Err("mine".into()));
        // A team of global ranks [2, 0]: rank 2's refusal, bounded; none among [0] passes.
        let long = first_refused(&all, [2, 0], 1, Ok(()), "local rank").unwrap_err();
        assert!(long.starts_with("(seen from local rank 1) xxx"));
        assert_eq!(long.len(), "(seen from local rank 1) ".len() + MAX_VERDICT);
        assert_eq!(first_refused(&all, [0], 0, Ok(()), "local rank"), Ok(()));
        // Hostile: a rank index past the gathered texts counts as passed.
        assert_eq!(first_refused(&all, [7], 0, Ok(()), "rank"), Ok(()));
    }

    #[test]
    fn a_verdict_crosses_as_empty_when_passed_and_bounded_text_when_not() {
        assert!(verdict_text(&Ok(())).is_empty());
        assert_eq!(verdict_text(&Err(String::new())), b"?");
        assert_eq!(
            verdict_text(&Err("rank 3 element 7".into())),
            b"rank 3 element 7"
        );
        assert_eq!(verdict_text(&Err("x".repeat(5000))).len(), MAX_VERDICT);
    }

    #[test]
    fn hostile_gather_lengths_are_refused_before_allocation() {
        let ok = announced(&[8u64.to_le_bytes().to_vec(), 0u64.to_le_bytes().to_vec()]);
        assert_eq!(ok.unwrap(), vec![8, 0]);
        for bad in [
            vec![1, 2, 3],
            vec![],
            ((MAX_GATHER as u64) + 1).to_le_bytes().to_vec(),
            u64::MAX.to_le_bytes().to_vec(),
        ] {
            let r = announced(&[0u64.to_le_bytes().to_vec(), bad.clone()]);
            assert!(
                matches!(
                    &r,
                    Err(CudaError::Malformed {
                        rank: 1,
                        what: "length"
                    }) | Err(CudaError::LengthMismatch { rank: Some(1), .. })
                ),
                "{bad:?}: {r:?}"
            );
        }
    }
}
