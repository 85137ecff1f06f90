//! The one-process CUDA world (as `&World`) as a [`Backend`](crate::backend::Backend): fresh buffers per run,
//! inputs written, outputs and scratch poisoned with `host::POISON` (as the host backends start),
//! the plan run to completion, outputs (and optionally the trace) read back, buffers freed.

use super::{trace, CudaError, World};
use crate::host::POISON;
use symm_core::sched::Request;
use symm_driver::backend::{check_inputs, Backend, BackendError, Outcome};

impl World {
    fn run_fresh(
        &self,
        req: &Request,
        inputs: &[Vec<u8>],
        traced: bool,
    ) -> Result<Outcome, CudaError> {
        let b = self.alloc(req)?;
        let r = (|| {
            for (r, inp) in inputs.iter().enumerate() {
                let r = r as u16;
                self.write(r, b.input, inp)?;
                self.fill(r, b.output, b.sizes.output, POISON)?;
                self.fill(r, b.scratch, b.sizes.scratch.max(16), POISON)?;
            }
            self.run(req, &b, traced)?;
            let outputs = (0..req.world)
                .map(|r| self.read(r, b.output, b.sizes.output))
                .collect::<Result<Vec<_>, _>>()?;
            let trace = if traced {
                Some(trace::read(self, req, &self.plans(req)?)?)
            } else {
                None
            };
            Ok(Outcome { outputs, trace })
        })();
        self.free(&b)?;
        r
    }
}

impl Backend for &World {
    fn name(&self) -> String {
        format!("cuda w{}", self.world())
    }

    fn fixed_world(&self) -> Option<u16> {
        Some(self.world())
    }

    fn run(
        &mut self,
        req: &Request,
        inputs: &[Vec<u8>],
        trace: bool,
    ) -> Result<Outcome, BackendError> {
        check_inputs(Some(self.world()), req, inputs)?;
        self.run_fresh(req, inputs, trace)
            .map_err(BackendError::Cuda)
    }
}
