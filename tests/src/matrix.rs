//! The one conformance matrix: every collective x algorithm x size x dtype x operator on any
//! [`Backend`], against the one sequential reference.
//!
//! `tests/tests/conformance.rs` runs it on the simulator and on real threads; `cargo xtask hw`
//! runs it on the CUDA world. A case fails when the backend errs or when an output differs from
//! `host::reference`: bit for bit with [`Compare::Exact`] (the GPU check), or within the stated
//! float tolerance with [`Compare::Tolerant`].

use symm_core::dtype::{decode_f64, DType, ReduceOp};
use symm_core::sched::{algorithms, collectives, Algorithm, Request};
use symm_driver::backend::Backend;
use symm_driver::host;

/// How outputs are compared with the reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compare {
    /// Every byte equal.
    Exact,
    /// Integers equal, floats within `host::compare`'s relative tolerance.
    Tolerant,
}

/// What the matrix covers.
#[derive(Clone, Debug)]
pub struct Matrix {
    /// World sizes (a backend with a fixed world runs only its own).
    pub worlds: Vec<u16>,
    /// Byte sizes (rounded up to whole elements).
    pub sizes: Vec<u64>,
    /// Element types.
    pub dtypes: Vec<DType>,
    /// Operators of the reducing collectives (the others run with the first).
    pub ops: Vec<ReduceOp>,
    /// Multicast algorithms too (the host model runs them; GPUs here never do).
    pub multicast: bool,
    /// Sets channels and pipelining of a request before it runs.
    pub shape: fn(Request) -> Request,
    /// Skips cases the caller leaves out (returns false to skip); asked of each algorithm's
    /// request.
    pub keep: fn(&Request) -> bool,
    /// Inputs for a request from a seed (one buffer per rank).
    pub inputs: fn(&Request, u64) -> Vec<Vec<u8>>,
    /// How outputs are compared.
    pub compare: Compare,
}

/// What a run of the matrix found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Cases run.
    pub cases: usize,
    /// One line per failed case.
    pub failures: Vec<String>,
    /// Why the matrix stopped early (the backend became unusable), if it did.
    pub stopped: Option<String>,
}

/// The first element that differs, as text.
pub fn exact(req: &Request, found: &[Vec<u8>], want: &[Vec<u8>]) -> Result<(), String> {
    if found.len() != want.len() {
        return Err(format!("{} outputs, want {}", found.len(), want.len()));
    }
    for (rank, (f, w)) in found.iter().zip(want).enumerate() {
        exact_rank(req, rank, f, w)?;
    }
    Ok(())
}

/// The first element of rank `rank`'s output `f` that differs from `w`, as text.
pub fn exact_rank(req: &Request, rank: usize, f: &[u8], w: &[u8]) -> Result<(), String> {
    let es = req.dtype.size() as usize;
    if f.len() != w.len() {
        return Err(format!("rank {rank}: {} bytes, want {}", f.len(), w.len()));
    }
    if f == w {
        return Ok(());
    }
    for (i, (x, y)) in f.chunks(es).zip(w.chunks(es)).enumerate() {
        if x != y {
            let undefined = if y.iter().all(|&c| c == host::POISON) {
                " (undefined output)"
            } else {
                ""
            };
            return Err(format!(
                "rank {rank} element {i}: found {} want {}{undefined}",
                decode_f64(req.dtype, x),
                decode_f64(req.dtype, y)
            ));
        }
    }
    Ok(())
}

/// Rank `rank`'s output `f` against `w` within `host::compare`'s tolerance, as text.
fn tolerant_rank(req: &Request, rank: usize, f: &[u8], w: &[u8]) -> Result<(), String> {
    host::compare(req, &[f], &[w]).map_err(|m| {
        format!(
            "rank {rank} element {}: found {} want {}",
            m.elem, m.found, m.want
        )
    })
}

/// The matrix's cases at `world`, grouped by input set: the group's base request (whose inputs
/// and reference every case of it shares) and its cases, one per algorithm kept.
pub fn groups(m: &Matrix, world: u16) -> Vec<(Request, Vec<Request>)> {
    let mut out = Vec::new();
    for c in collectives(world) {
        let algos: Vec<Algorithm> = algorithms(c)
            .iter()
            .copied()
            .filter(|&a| m.multicast || a != Algorithm::Multicast)
            .collect();
        for &dt in &m.dtypes {
            let ops: &[ReduceOp] = if c.reduces() { &m.ops } else { &m.ops[..1] };
            for &op in ops {
                for &size in &m.sizes {
                    let bytes = size.div_ceil(dt.size()) * dt.size();
                    let base = (m.shape)(Request::new(c, algos[0], world, bytes, dt, op));
                    let kept: Vec<Request> = algos
                        .iter()
                        .map(|&a| Request {
                            algorithm: a,
                            ..base
                        })
                        .filter(|r| (m.keep)(r))
                        .collect();
                    if kept.is_empty() {
                        continue;
                    }
                    // Sizes past an algorithm's bound (the low-latency protocol's) are not its
                    // cases; the refusal itself is tested where it is defined.
                    let cases = kept
                        .into_iter()
                        .filter(|r| r.algorithm.takes_on(bytes, r.channels))
                        .collect();
                    out.push((base, cases));
                }
            }
        }
    }
    out
}

/// Runs `m` on `backend`; `seed` picks the inputs (advanced once per input set).
pub fn run<B: Backend + ?Sized>(backend: &mut B, m: &Matrix, seed: &mut u64) -> Report {
    let mut rep = Report::default();
    let worlds: Vec<u16> = match backend.fixed_world() {
        Some(w) => vec![w],
        None => m.worlds.clone(),
    };
    for world in worlds {
        for (base, cases) in groups(m, world) {
            *seed += 1;
            let inputs = (m.inputs)(&base, *seed);
            let want = host::reference(&base, &inputs);
            for req in cases {
                rep.cases += 1;
                let name = format!(
                    "{} {} w{world} {} B {} {} ({} ch)",
                    req.collective.name(),
                    req.algorithm.name(),
                    req.bytes,
                    req.dtype.name(),
                    req.op.name(),
                    req.channels
                );
                let check = |rank: usize, f: &[u8], w: &[u8]| match m.compare {
                    Compare::Exact => exact_rank(&req, rank, f, w),
                    Compare::Tolerant => tolerant_rank(&req, rank, f, w),
                };
                match backend.run_checked(&req, &inputs, &want, &check) {
                    Ok(verdict) => {
                        if let Err(e) = verdict {
                            rep.failures.push(format!("{name}: {e}"));
                        }
                    }
                    Err(e) => {
                        rep.failures.push(format!("{name}: {e}"));
                        if e.is_fatal() {
                            rep.stopped = Some(format!("{name}: {e}"));
                            return rep;
                        }
                    }
                }
            }
        }
    }
    rep
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::sched::Collective;
    use symm_driver::backend::{BackendError, Outcome};

    /// A backend that adds one to the first output byte of the last rank's every all-reduce.
    struct OffByOne;

    impl Backend for OffByOne {
        fn name(&self) -> String {
            "off by one".into()
        }
        fn run(
            &mut self,
            req: &Request,
            inputs: &[Vec<u8>],
            _trace: bool,
        ) -> Result<Outcome, BackendError> {
            let mut outputs = host::reference(req, inputs);
            if req.collective == Collective::AllReduce {
                if let Some(b) = outputs.last_mut().and_then(|o| o.first_mut()) {
                    *b = b.wrapping_add(1);
                }
            }
            Ok(Outcome {
                outputs,
                trace: None,
            })
        }
    }

    #[test]
    fn a_backend_that_disagrees_with_the_reference_fails_the_matrix() {
        let m = Matrix {
            worlds: vec![2, 3],
            sizes: vec![16],
            dtypes: vec![DType::I32],
            ops: vec![ReduceOp::Sum],
            multicast: true,
            shape: |r| r,
            keep: |_| true,
            inputs: host::random_inputs,
            compare: Compare::Exact,
        };
        for compare in [Compare::Exact, Compare::Tolerant] {
            let rep = run(
                &mut OffByOne,
                &Matrix {
                    compare,
                    ..m.clone()
                },
                &mut 0,
            );
            // Every all-reduce algorithm at both worlds fails; nothing else does.
            let all_reduce = algorithms(Collective::AllReduce).len() * 2;
            assert_eq!(rep.failures.len(), all_reduce, "{:#?}", rep.failures);
            assert!(rep.failures.iter().all(|f| f.starts_with("all_reduce")));
            assert!(rep.cases > all_reduce);
            // The verdict names the rank whose output differs, and where.
            for f in &rep.failures {
                let last = if f.contains(" w2 ") { 1 } else { 2 };
                assert!(
                    f.contains(&format!(": rank {last} element 0: found ")),
                    "{f}"
                );
            }
        }
    }
}
