//! A [`Comm`] as a [`Backend`](crate::backend::Backend): every process of the job runs the same
//! requests with the same inputs (each writes its own rank's), and every process gets every
//! rank's output back through the bootstrap, so the shared conformance matrix checks the whole
//! job from each rank. Traces are not recorded on this path.

use super::Comm;
use crate::backend::{check_inputs, Backend, BackendError, Outcome};
use crate::cuda::device::Stream;
use crate::cuda::error::CudaError;
use crate::cuda::rendezvous::Bootstrap;
use crate::host::POISON;
use symm_core::sched::Request;

/// Bytes of output each rank contributes per bootstrap round (under the frame limit).
const PIECE: usize = 60 << 10;

impl Comm {
    fn run_gathered(&self, req: &Request, input: &[u8]) -> Result<Vec<Vec<u8>>, CudaError> {
        let stream = Stream::new(&self.dev)?;
        let b = self.alloc(req)?;
        let run = (|| {
            self.write(b.input, input)?;
            self.fill(b.output, b.sizes.output, POISON)?;
            self.fill(b.scratch, b.sizes.scratch.max(16), POISON)?;
            self.run(req, &b, &stream)?;
            self.read(b.output, b.sizes.output)
        })();
        self.free(&b)?;
        let mine = run?;
        // Every rank's output, piece by piece (every rank's output has the same size).
        let mut all = vec![Vec::with_capacity(mine.len()); self.world as usize];
        let pieces = mine.len().div_ceil(PIECE).max(1);
        for i in 0..pieces {
            let piece = &mine[(i * PIECE).min(mine.len())..((i + 1) * PIECE).min(mine.len())];
            let got = self.boot.all_gather(self.rank, piece)?;
            for (o, p) in all.iter_mut().zip(got.iter()) {
                o.extend_from_slice(p);
            }
        }
        Ok(all)
    }
}

impl Backend for Comm {
    fn name(&self) -> String {
        format!("comm rank {} of {}", self.rank, self.world)
    }

    fn fixed_world(&self) -> Option<u16> {
        Some(self.world)
    }

    /// Collective: every rank calls it with the same request and all ranks' `inputs`.
    fn run(
        &mut self,
        req: &Request,
        inputs: &[Vec<u8>],
        _trace: bool,
    ) -> Result<Outcome, BackendError> {
        check_inputs(Some(self.world), req, inputs)?;
        let mine = &inputs[self.rank as usize];
        let outputs = self.run_gathered(req, mine).map_err(BackendError::Cuda)?;
        Ok(Outcome {
            outputs,
            trace: None,
        })
    }
}
