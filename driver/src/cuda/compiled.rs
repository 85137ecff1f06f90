//! Compiled plans: one rank's plan as straight-line CUDA.
//!
//! The interpreter (`symm/interp.cu`) reads each op from memory and dispatches on its kind.
//! A compiled plan is a kernel generated for one validated [`RankPlan`]. Its channels are
//! grouped by shape: two channels have the same shape when their ops do the same things to the
//! same ranks (kind, dtype, operator, buffers, line format, ranks, divisor; `shape`), and
//! differ at most in offsets, counts and slots, as the channels of a direct algorithm do. Each
//! shape is one function (not inlined: NVRTC then optimises each on its own, and its time grows
//! with the ops instead of faster; but a one-channel plan's, called once, is), which runs the
//! ops in order, each a call of the interpreter's own `symm_run_op` (`symm/ops.cuh`) with the
//! shape's words as constants, so NVRTC folds the dispatch, the peers and the reduction's loop
//! away; the offsets, counts and slots it reads from the uploaded plan. Block `c` calls its
//! channel's shape with channel `c`'s ops. So a two-shot of 64 channels compiles one channel's
//! ops, and every size of it is one source and one cached cubin. The kernel takes the
//! interpreter's parameter block (heap, buffers, counters, records, trace), so the same buffer
//! checks, timeouts, records and trace events apply, and a traced compiled plan emits the
//! interpreter's trace.
//!
//! Only plans that passed [`RankPlan::validate`] are compiled and launched with their own
//! uploaded ops; the generator writes nothing but numbers from their encoded ops: a hostile
//! plan is refused by the validation (ranks, ranges, slots) or by [`MAX_COMPILED_OPS`], never
//! turned into a kernel. Cubins are cached by the hash of their source, headers, options and
//! compiler ([`crate::kernel_cache`]).

use std::fmt::Write as _;

use super::compile::{self, Compiler};
use super::device::{self, Device};
use super::error::{CudaError, Result};
use super::launch::Kernel;
use super::plan::RankPlan;
use symm_core::ll::Format;
use symm_core::plan::{self as plan_code, PlanOp};

/// The compiled kernel's entry point.
pub const COMPILED_ENTRY: &str = "symm_compiled";
/// Most ops a compiled kernel may hold ([`compiled_ops`]); longer plans are interpreted.
pub const MAX_COMPILED_OPS: usize = 4096;

/// Which kernel runs a plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PlanPath {
    /// Compiled plans whose kernel holds at most [`AUTO_COMPILED_OPS`] ops ([`compiled_ops`]),
    /// at every size, else the interpreter. Compiled plans ran 1.3 to 1.8 times faster than
    /// interpreted ones from 1 KiB to 1 MiB, and, since channels of one shape share their code,
    /// led from 4 MiB to 64 MiB at world 4 too (docs/perf.md).
    #[default]
    Auto,
    /// Always the interpreter.
    Interpreted,
    /// Compiled whenever the plan is short enough ([`MAX_COMPILED_OPS`]).
    Compiled,
}

/// The most ops ([`compiled_ops`]: one channel of each shape) a kernel that `PlanPath::Auto`
/// compiles holds. NVRTC takes 20 to 90 ms per op on one core (the low-latency ops the most),
/// so a kernel of this many ops compiles in seconds. Channels of one shape count once: a 1 MiB
/// two-shot of 64 channels at world 4 holds 1024 ops but compiles 16.
pub const AUTO_COMPILED_OPS: usize = 128;

impl PlanPath {
    /// Every plan path.
    pub const ALL: [PlanPath; 3] = [PlanPath::Auto, PlanPath::Interpreted, PlanPath::Compiled];

    /// Its name: `auto`, `interpreted` or `compiled` (what `SYMM_PLANS` takes).
    pub fn name(self) -> &'static str {
        match self {
            PlanPath::Auto => "auto",
            PlanPath::Interpreted => "interpreted",
            PlanPath::Compiled => "compiled",
        }
    }

    /// The plan path named `s` ([`PlanPath::name`]; what `SYMM_PLANS` takes), the one parser
    /// of the name ([`crate::cuda::CommOptions::from_env`] and the bindings call it).
    pub fn parse(s: &str) -> Option<PlanPath> {
        PlanPath::ALL.into_iter().find(|p| p.name() == s)
    }

    /// Whether a plan whose kernel holds `ops` ops ([`compiled_ops`]) runs compiled.
    pub fn compiles(self, ops: usize) -> bool {
        ops <= MAX_COMPILED_OPS
            && match self {
                PlanPath::Auto => ops <= AUTO_COMPILED_OPS,
                PlanPath::Interpreted => false,
                PlanPath::Compiled => true,
            }
    }
}

/// The CUDA source of `plan` (validated by the caller), or [`CudaError::TooLarge`] when it
/// would hold more than [`MAX_COMPILED_OPS`] ops ([`compiled_ops`]).
///
/// Channels whose ops have the same shape (`shape`: what each op does and to whom) share one
/// function. A field that every channel of the shape holds alike is a constant in it; one that
/// differs between them (offsets, slots) it reads from the uploaded plan, which the block first
/// stages in shared memory (one round trip; shapes of more than [`MAX_STAGED_OPS`] ops read
/// it in place). So a 64-channel two-shot compiles one channel's ops, and a one-channel plan is
/// constants only.
pub fn source(plan: &RankPlan) -> Result<String> {
    let groups = Groups::of(plan);
    if groups.ops() > MAX_COMPILED_OPS {
        return Err(CudaError::TooLarge {
            what: "compiled plan ops",
            size: groups.ops() as u64,
            limit: MAX_COMPILED_OPS as u64,
        });
    }
    let mut s = String::with_capacity(1024 + groups.ops() * 300);
    s.push_str("// Generated by symm_driver::cuda::compiled from one rank's validated plan.\n");
    // Only the reductions of the dtypes the plan reduces are instantiated (compile time).
    let _ = writeln!(s, "#define SYMM_DTYPE_MASK 0x{:x}u", dtype_mask(plan));
    s.push_str(
        "#include \"symm/fused.cuh\"\n\
         #define SYMM_MK(o, w0, w1, dv, sl, ao, bo, dso, ct, rs) { const symm_u64 h_[2] = {w0, w1}; \
         memcpy(&(o), h_, 16); (o).slot = sl; (o).div = dv; (o).a_off = ao; (o).b_off = bo; \
         (o).dst_off = dso; (o).count = ct; (o).reserved = rs; }\n\
         #define SYMM_OP(i, ...) { symm_plan_op op_; SYMM_MK(op_, __VA_ARGS__); \
         symm_run_op(p, op_, i, stop, trace_len); if (stop) return; }\n",
    );
    // One function per shape, not inlined into the kernel: NVRTC optimises each on its own, so
    // the compile time grows with the ops, not faster. A one-channel plan's only shape is
    // inlined: called once, it costs no more to compile, and the kernel reads its parameters
    // from the constant bank and `stop` from shared memory instead of through the stack.
    let qualifier = if groups.of_channel.len() == 1 {
        "__forceinline__"
    } else {
        "__noinline__"
    };
    for (g, shape) in groups.shapes.iter().enumerate() {
        let ops = channel(plan, shape.members[0]);
        let _ = writeln!(
            s,
            "static __device__ {qualifier} void symm_shape_{g}(const symm_interp_params& p, \
             const symm_plan_op* __restrict__ ops, int& stop, symm_u32& trace_len) {{\n\
             \x20 (void)ops;\n#if SYMM_TRACE"
        );
        for (i, op) in ops.iter().enumerate() {
            op_line(&mut s, i, op, shape.varying[i]);
        }
        s.push_str("#else\n");
        fused_lines(&mut s, ops, shape);
        s.push_str("#endif\n}\n");
    }
    s.push_str(
        "extern \"C\" __global__ void __launch_bounds__(SYMM_THREADS) symm_compiled(const symm_interp_params p) {\n\
         \x20 __shared__ int stop;\n\
         \x20 symm_u32 trace_len = 0;\n\
         \x20 if (blockIdx.x >= p.channels || blockIdx.x >= SYMM_MAX_CHANNELS) return;\n\
         \x20 if (threadIdx.x == 0) stop = 0;\n\
         \x20 symm_sig_begin();\n\
         \x20 __syncthreads();\n\
         \x20 const symm_u64 sig_calls = symm_sig_publish(p);\n",
    );
    let staged = groups
        .shapes
        .iter()
        .filter(|g| g.reads() && g.len <= MAX_STAGED_OPS)
        .map(|g| g.len)
        .max();
    if let Some(n) = staged {
        let _ = writeln!(s, "  __shared__ symm_plan_op staged[{n}];");
    }
    s.push_str("  switch (blockIdx.x) {\n");
    for (c, g) in groups.of_channel.iter().enumerate() {
        let shape = &groups.shapes[*g];
        let at = plan.chan_start[c];
        let ops = if !shape.reads() {
            "nullptr".to_string()
        } else if shape.len <= MAX_STAGED_OPS {
            let _ = write!(
                s,
                "  case {c}: symm_stage_ops(p.plan + {at}u, staged, {});",
                shape.len
            );
            s.push_str(&format!(
                " symm_shape_{g}(p, staged, stop, trace_len); break;\n"
            ));
            continue;
        } else {
            format!("p.plan + {at}u")
        };
        let _ = writeln!(
            s,
            "  case {c}: symm_shape_{g}(p, {ops}, stop, trace_len); break;"
        );
    }
    s.push_str(
        "  default: break;\n  }\n\
         \x20 symm_sig_finish(p, stop, sig_calls);\n\
         #if SYMM_TRACE\n\
         \x20 if (threadIdx.x == 0 && p.trace_len) p.trace_len[blockIdx.x] = trace_len;\n\
         #endif\n}\n",
    );
    Ok(s)
}

/// Most ops of a shape whose differing fields a block stages in shared memory (64 bytes an op)
/// before it runs them; a longer shape reads them from the plan in global memory.
pub const MAX_STAGED_OPS: usize = 64;

/// Channel `c`'s ops.
fn channel(plan: &RankPlan, c: usize) -> &[PlanOp] {
    let (a, b) = (plan.chan_start[c] as usize, plan.chan_start[c + 1] as usize);
    plan.ops.get(a..b).unwrap_or(&[])
}

/// Ops a compiled kernel of `plan` holds: those of one channel of each shape (what NVRTC's
/// time grows with, and what [`PlanPath::compiles`] limits).
pub fn compiled_ops(plan: &RankPlan) -> usize {
    Groups::of(plan).ops()
}

/// What a compiled kernel holds of an op as constants: the words that fix what it does and to
/// whom (kind, dtype, operator, buffers, line format, ranks, divisor, and a k-way reduce's
/// packed source ranks). The rest (offsets, counts, slots, a low-latency op's region stride
/// and half offset) the kernel reads from the uploaded plan, so channels and sizes that differ
/// only there share the code.
fn shape(op: &PlanOp) -> [u64; 5] {
    let b = op.to_bytes();
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let ranks = op.kind == plan_code::REDUCE_N;
    [
        word(0),
        word(8),
        u64::from(op.div),
        if ranks { op.b_off } else { 0 },
        if ranks { op.reserved } else { 0 },
    ]
}

/// How an untraced kernel runs one channel's ops: one op, or a fused step of `k` ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Step {
    /// One op (`symm_run_op`).
    Op,
    /// A signal to this rank's own slot and the wait for it (`symm_local_epoch`).
    Epoch,
    /// `k` low-latency puts of one source (`symm_ll_put_n`).
    Puts(usize),
    /// `k` signals behind one fence (`symm_signal_n`).
    Signals(usize),
    /// `k` waits on different slots, polled at once (`symm_wait_n`).
    Waits(usize),
    /// `k` copies of one source, loaded once (`symm_copy_n`).
    Copies(usize),
}

/// The fields of an op besides its shape, in `SYMM_MK`'s order.
const FIELDS: [&str; 6] = ["slot", "a_off", "b_off", "dst_off", "count", "reserved"];

/// `op`'s [`FIELDS`].
fn fields(op: &PlanOp) -> [u64; 6] {
    [
        u64::from(op.slot),
        op.a_off,
        op.b_off,
        op.dst_off,
        op.count,
        op.reserved,
    ]
}

/// The channels of one shape.
struct Shape {
    /// Its channels, the first one's ops written out.
    members: Vec<usize>,
    /// The steps of its untraced body.
    steps: Vec<Step>,
    /// Ops per channel.
    len: usize,
    /// Per op, per field of [`FIELDS`]: whether the channels differ there (read from the plan).
    varying: Vec<[bool; 6]>,
}

impl Shape {
    /// Whether the kernel reads any field of this shape from the plan.
    fn reads(&self) -> bool {
        self.varying.iter().flatten().any(|v| *v)
    }
}

/// A plan's channels grouped by shape: the ops' shapes and the untraced kernel's steps.
struct Groups {
    shapes: Vec<Shape>,
    /// Per channel: its shape.
    of_channel: Vec<usize>,
}

impl Groups {
    fn of(plan: &RankPlan) -> Groups {
        let mut keys: std::collections::HashMap<(Vec<[u64; 5]>, Vec<Step>), usize> =
            std::collections::HashMap::new();
        let mut g = Groups {
            shapes: Vec::new(),
            of_channel: Vec::with_capacity(plan.channels()),
        };
        for c in 0..plan.channels() {
            let ops = channel(plan, c);
            let steps = steps(ops);
            let key = (ops.iter().map(shape).collect::<Vec<_>>(), steps.clone());
            let next = g.shapes.len();
            let id = *keys.entry(key).or_insert(next);
            if id == next {
                g.shapes.push(Shape {
                    members: vec![c],
                    steps,
                    len: ops.len(),
                    varying: vec![[false; 6]; ops.len()],
                });
            } else {
                let first = channel(plan, g.shapes[id].members[0]);
                for (i, (a, b)) in first.iter().zip(ops).enumerate() {
                    let (fa, fb) = (fields(a), fields(b));
                    for f in 0..6 {
                        g.shapes[id].varying[i][f] |= fa[f] != fb[f];
                    }
                }
                g.shapes[id].members.push(c);
            }
            g.of_channel.push(id);
        }
        g
    }

    fn ops(&self) -> usize {
        self.shapes.iter().map(|s| s.len).sum()
    }
}

/// The bits (`1 << dtype`) of the dtypes that `plan`'s unicast reducing ops use (the
/// multicast load-reduce's dispatch is not masked).
fn dtype_mask(plan: &RankPlan) -> u32 {
    plan.ops
        .iter()
        .filter(|o| {
            symm_core::op::OpKind::from_code(o.kind)
                .is_some_and(|k| k.reduces() && !k.is_multicast())
        })
        .filter(|o| o.dtype < 32)
        .fold(0, |m, o| m | 1 << o.dtype)
}

/// Appends op `i` as one `SYMM_OP` line: its index and its arguments ([`args`]).
fn op_line(s: &mut String, i: usize, op: &PlanOp, varying: [bool; 6]) {
    let _ = write!(s, "    SYMM_OP({i}");
    args(s, i, op, varying);
    s.push_str(")\n");
}

/// Appends op `i`'s arguments of `SYMM_MK` after its target: the shape's words (`shape`) as
/// constants, then each of [`FIELDS`] as a constant, or where the shape's channels differ
/// (`varying`) as a read of the plan (`ops[i].field`).
fn args(s: &mut String, i: usize, op: &PlanOp, varying: [bool; 6]) {
    let [w0, w1, div, ..] = shape(op);
    let _ = write!(s, ", 0x{w0:x}ull, 0x{w1:x}ull, 0x{div:x}u");
    for ((name, value), vary) in FIELDS.iter().zip(fields(op)).zip(varying) {
        if vary {
            let _ = write!(s, ", ops[{i}].{name}");
        } else {
            let _ = write!(s, ", 0x{value:x}ull");
        }
    }
}

/// Most low-latency puts one fused step of an untraced compiled kernel stores.
pub const MAX_FUSED_PUTS: usize = 8;

/// Most copies one fused step stores (`symm_copy_n`: a destination pointer each).
pub const MAX_FUSED_COPIES: usize = 8;

/// Most signals or waits one fused step holds (`symm_wait_n`: a thread of one warp each).
pub const MAX_FUSED_SIGNALS: usize = 32;

/// One channel's steps for the untraced kernel: runs of ops that have the shape of a fused step
/// of `symm/fused.cuh` become that step:
/// * a signal that adds to a slot followed by the wait for the same count on it
///   (`symm_local_epoch`, which checks on the device that the signal goes to the rank's own pad
///   and otherwise runs both ops);
/// * 2 to [`MAX_FUSED_PUTS`] low-latency puts of one source, size, slot and half offset
///   (`symm_ll_put_n`);
/// * 2 to [`MAX_FUSED_SIGNALS`] signals (`symm_signal_n`: one fence; one to the rank's own pad
///   runs them one by one);
/// * 2 to [`MAX_FUSED_SIGNALS`] waits on different slots (`symm_wait_n`);
/// * 2 to [`MAX_FUSED_COPIES`] copies of one source and size (`symm_copy_n`).
///
/// Everything else is an op.
fn steps(ops: &[PlanOp]) -> Vec<Step> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < ops.len() {
        let op = &ops[i];
        if ops.get(i + 1).is_some_and(|w| epoch_pair(op, w)) {
            out.push(Step::Epoch);
            i += 2;
            continue;
        }
        let rest = &ops[i..];
        let run = |max: usize, same: &dyn Fn(&[PlanOp], &PlanOp) -> bool| {
            let mut n = 0;
            while n < rest.len().min(max) && same(&rest[..n], &rest[n]) {
                n += 1;
            }
            n
        };
        let (puts, signals, waits, copies) = (
            run(MAX_FUSED_PUTS, &|_, q| same_put(op, q)),
            run(MAX_FUSED_SIGNALS, &|_, q| q.kind == plan_code::SIGNAL),
            run(MAX_FUSED_SIGNALS, &|seen, q| {
                q.kind == plan_code::WAIT && seen.iter().all(|w| w.slot != q.slot)
            }),
            run(MAX_FUSED_COPIES, &|_, q| same_copy(op, q)),
        );
        let step = if puts >= 2 {
            Step::Puts(puts)
        } else if signals >= 2 {
            Step::Signals(signals)
        } else if waits >= 2 {
            Step::Waits(waits)
        } else if copies >= 2 {
            Step::Copies(copies)
        } else {
            Step::Op
        };
        i += match step {
            Step::Puts(k) | Step::Signals(k) | Step::Waits(k) | Step::Copies(k) => k,
            Step::Op | Step::Epoch => 1,
        };
        out.push(step);
    }
    out
}

/// Whether `q` is a copy that one fused step can store with `first`: both copies, of the same
/// source and size.
fn same_copy(first: &PlanOp, q: &PlanOp) -> bool {
    first.kind == plan_code::COPY
        && q.kind == plan_code::COPY
        && (q.a_rank, q.a_buf, q.a_off, q.count)
            == (first.a_rank, first.a_buf, first.a_off, first.count)
}

/// Appends one channel's ops for the untraced kernel as its shape's steps ([`steps`] of these
/// ops, and of every channel of the shape): a fused step builds its ops with `SYMM_MK` and
/// calls it.
fn fused_lines(s: &mut String, ops: &[PlanOp], shape: &Shape) {
    let mut i = 0;
    for step in &shape.steps {
        let (k, call) = match step {
            Step::Op => {
                op_line(s, i, &ops[i], shape.varying[i]);
                i += 1;
                continue;
            }
            Step::Epoch => (
                2,
                format!("symm_local_epoch(p, o_[0], o_[1], {i}, stop, trace_len)"),
            ),
            Step::Puts(k) => (*k, format!("symm_ll_put_n<{k}>(p, o_)")),
            Step::Signals(k) => (
                *k,
                format!("symm_signal_n<{k}>(p, o_, {i}, stop, trace_len)"),
            ),
            Step::Waits(k) => (*k, format!("symm_wait_n<{k}>(p, o_, {i}, stop)")),
            Step::Copies(k) => (*k, format!("symm_copy_n<{k}>(p, o_)")),
        };
        let _ = write!(s, "    {{ symm_plan_op o_[{k}];");
        for (j, op) in ops[i..i + k].iter().enumerate() {
            let _ = write!(s, " SYMM_MK(o_[{j}]");
            args(s, i + j, op, shape.varying[i + j]);
            s.push(')');
        }
        let _ = writeln!(s, " {call}; if (stop) return; }}");
        i += k;
    }
}

/// Whether `sig` then `wait` have the shape of a low-latency epoch step.
fn epoch_pair(sig: &PlanOp, wait: &PlanOp) -> bool {
    sig.kind == plan_code::SIGNAL
        && sig.sigop == symm_core::op::SignalOp::Add as u8
        && wait.kind == plan_code::WAIT
        && wait.slot == sig.slot
        && wait.count == sig.count
}

/// Whether `q` is a low-latency put that one fused step can store with `first` (both in
/// 16-byte lines: `symm_ll_put_n` stores those).
fn same_put(first: &PlanOp, q: &PlanOp) -> bool {
    let ll16 = |o: &PlanOp| o.kind == plan_code::LL_PUT && o.format == Format::Ll as u8;
    ll16(first)
        && ll16(q)
        && (q.a_rank, q.a_buf, q.a_off) == (first.a_rank, first.a_buf, first.a_off)
        && (q.count, q.slot, q.reserved) == (first.count, first.slot, first.reserved)
}

/// The source of `plan` after [`RankPlan::validate`] for `rank` of `world` with buffers of
/// `sizes` and a pad of `pad_slots`: a hostile plan (a peer outside the world, a range outside
/// its buffer, a slot outside the pad, too many ops) is a typed error and no source.
pub fn checked_source(
    plan: &RankPlan,
    rank: u16,
    world: u16,
    sizes: &symm_core::sched::BufferSizes,
    pad_slots: u32,
) -> Result<String> {
    plan.validate(rank, world, sizes, pad_slots, false)?;
    source(plan)
}

/// Compiles `plan` (validated by its `DevicePlan`) for `dev` and loads it; traced when `trace`.
/// The cubin comes from the kernel cache when it holds it.
pub(crate) fn load(
    compiler: &Compiler,
    dev: &Device,
    plan: &RankPlan,
    trace: bool,
) -> Result<Kernel> {
    let cubin = cubin(compiler, dev.arch(), plan, trace)?;
    Kernel::load(dev, &cubin, COMPILED_ENTRY)
}

/// The cubin of `plan` (validated by the caller) for `arch`, through the kernel cache: what
/// [`load`] loads. Threads may call it at once (warming the cache for many plans).
pub(crate) fn cubin(
    compiler: &Compiler,
    arch: u32,
    plan: &RankPlan,
    trace: bool,
) -> Result<Vec<u8>> {
    let src = source(plan)?;
    let drv = device::driver_version()?;
    let defines: &[&str] = if trace {
        &["SYMM_TRACE=1", "SYMM_MULTIMEM=0"]
    } else {
        &["SYMM_TRACE=0", "SYMM_MULTIMEM=0"]
    };
    let (cubin, _) = compile::cubin_of_source(
        compiler,
        if trace { "plan_traced" } else { "plan" },
        &src,
        defines,
        arch,
        drv,
    )?;
    Ok(cubin)
}

#[cfg(test)]
mod tests;
