//! A student's schedule on a real GPU (`cargo xtask lab run N --gpu`).
//!
//! The ops the checker built for the lab's showcase case (the one whose traces `lab view`
//! shows) run through symm's plan interpreter, every rank in this one process on the machine's
//! GPUs (ranks share a GPU when there are fewer GPUs than ranks), with the traced interpreter.
//! The outputs go through the checker's own comparison (a failure reads like the simulator's,
//! naming the backend "GPU"), and the GPU trace is compared op by op with the simulator's
//! trace of the same ops: the first (rank, channel, op) that differs is named. Both traces are
//! written beside the checker's (`gpu.trace`, `simulated.trace`) for the viz to show side by
//! side. Multicast ops never run here: they are verified on the simulator only.

use std::path::Path;
use std::time::Duration;

use symm_driver::cuda::plan::RankPlan;
use symm_driver::cuda::{self, CudaError};
use symm_driver::host;
use symm_harness::{Options, World};

use crate::run::{self, Case, Plan};

/// The GPUs this machine has, or why there are none (one line).
pub fn gpus() -> Result<i32, String> {
    match cuda::device::device_count() {
        Ok(n) if n > 0 => Ok(n),
        Ok(_) => Err("no GPU is visible".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Runs `plan` on `case` on the GPU and writes the traces to `out`; the summary line, or what
/// went wrong.
pub fn run_case(case: &Case, plan: Plan, out: &Path) -> Result<String, String> {
    let gpus = gpus().map_err(|e| format!("no GPU here ({e})"))?;
    let req = &case.req;
    let streams = run::build(case, plan).map_err(|p| p.words(req).to_string())?;
    run::lint(req, &streams).map_err(|p| p.words(req).to_string())?;
    if streams.iter().flatten().any(|op| op.is_multicast()) {
        return Err(
            "the schedule uses NVLink multicast ops, which symm never runs on shared \
                    machines: they are verified on the simulator only (cargo xtask lab check)"
                .into(),
        );
    }
    let inputs = host::random_inputs(req, 11);
    let want = match &case.reference {
        Some(f) => f(req, &inputs),
        None => host::reference(req, &inputs),
    };
    let e = |e: CudaError| e.to_string();
    let devices: Vec<i32> = (0..i32::from(req.world)).map(|r| r % gpus).collect();
    let sizes = req.buffer_sizes();
    let need = sizes.input + sizes.output + sizes.scratch.max(16) + 3 * 4096;
    let opts = Options {
        heap_bytes: need.max(1 << 20).next_power_of_two(),
        timeout: Duration::from_secs(10),
        ..Options::default()
    };
    let world = World::open(&devices, opts).map_err(e)?;
    let b = world.alloc_sizes(sizes).map_err(e)?;
    for (r, inp) in inputs.iter().enumerate() {
        let r = r as u16;
        world.write(r, b.input, inp).map_err(e)?;
        world
            .fill(r, b.output, sizes.output, host::POISON)
            .map_err(e)?;
        world
            .fill(r, b.scratch, sizes.scratch.max(16), 0)
            .map_err(e)?;
    }
    let ch = usize::from(req.channels.max(1));
    let plans: Vec<RankPlan> = streams
        .chunks(ch)
        .map(RankPlan::from_channels)
        .collect::<Result<_, _>>()
        .map_err(e)?;
    let plans = world.user_plans(plans, &sizes).map_err(e)?;
    world.launch(&plans, &b, true).map_err(e)?;
    world
        .wait()
        .map_err(|err| format!("the schedule did not finish on the GPU: {err}"))?;
    let gpu = symm_harness::trace::read(&world, req, &plans).map_err(e)?;
    let outputs: Vec<Vec<u8>> = (0..req.world)
        .map(|r| world.read(r, b.output, sizes.output))
        .collect::<Result<_, _>>()
        .map_err(e)?;
    let sim = run::simulate(req, &streams, &inputs, true).map_err(|err| err.to_string())?;
    std::fs::create_dir_all(out).map_err(|err| format!("{}: {err}", out.display()))?;
    for (name, bytes) in [("gpu.trace", &gpu), ("simulated.trace", &sim.trace)] {
        let p = out.join(name);
        std::fs::write(&p, bytes).map_err(|err| format!("{}: {err}", p.display()))?;
    }
    host::compare(req, &outputs, &want)
        .map_err(|m| run::numbers("GPU", req, &outputs, m).words(req).to_string())?;
    let ops = symm_driver::trace_diff::first_difference(&gpu, &sim.trace).map_err(|d| {
        format!("the outputs match, but the GPU ran another op sequence than the simulator: {d}")
    })?;
    let names = world.device_names();
    Ok(format!(
        "{}: the outputs match the reference on the GPU ({} rank(s) on {} x {}), and the GPU \
         trace runs the simulator's {ops} ops in the same order on every (rank, channel)",
        case.label,
        req.world,
        gpus.min(i32::from(req.world)),
        names.first().map_or("GPU", String::as_str),
    ))
}
