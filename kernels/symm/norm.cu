// The fused all-reduce, residual add and RMSNorm (Rust: symm_driver::cuda::FusedNorm). The
// arithmetic is symm_core::norm's, bit for bit: rank-ordered f32 sums, every operation rounded
// on its own (the _rn intrinsics: nothing is contracted into a fused multiply-add), a square
// root and divisions correctly rounded, the squares summed in the order norm::sum_squares
// fixes for SYMM_NORM_THREADS threads.
//
// One call, one barrier. Every rank launches the same grid for the same rows, and block b
// handles rows b, b + G, ... everywhere. The call's epoch e (this rank's state word; every rank
// runs the same calls, so it is the same everywhere) picks a staging half, e & 1.
//  1. Block b copies its rows of this rank's input into this rank's staging half.
//  2. It writes e << 20 | rows into word (b, me) of every rank's flags (release at system
//     scope, after the block's copies), then waits until word (b, r) of its own flags holds at
//     least e << 20, for every rank r (acquire; the deadline and the abort word bound the
//     wait). A word of this call whose rows differ from this rank's names the divergence
//     (SYMM_STOP_DIFFER, the abort word raised) instead of letting blocks wait for rows a
//     peer does not have.
//  3. For each of its rows it reads every rank's staged row, sums in rank order, adds the
//     residual, writes the new residual, forms the row's sum of squares, then writes the output.
//  4. The last block to finish advances the epoch.
// A half is written again two calls later, after the next call's barrier: by then every rank
// has started the next kernel, so it has finished this one (one stream, kernels in order) and
// reads nothing of this half any more. Flag words only grow, so a graph replays the kernel.
#include "symm/reduce.cuh"

// SYMM_NORM_THREADS (threads of a block) and SYMM_NORM_ROW_BITS (bits of a flag word below the
// epoch: the call's rows) come from the Rust side (symm_kernels::NORM's defines).
#if !defined(SYMM_NORM_THREADS) || !defined(SYMM_NORM_ROW_BITS)
#error "norm.cu is compiled with SYMM_NORM_THREADS and SYMM_NORM_ROW_BITS defined"
#endif
// Ranks whose copies of a vector a thread loads at once.
#define SYMM_NORM_RANKS 8

// `symm_norm_params` is generated into symm/plan.cuh from symm_kernels::abi::NormParams.

// Waits until word `word` of this rank's flags holds call `epoch`'s signal (or a later one);
// false, with the record written and the abort word raised, when the deadline passes, the
// abort word is raised, or the word is this call's with rows other than this rank's.
static __device__ bool symm_norm_wait(const symm_norm_params& p, symm_u32 word, symm_u64 epoch, symm_u32 peer) {
  bool late = false;
  const symm_u64 target = epoch << SYMM_NORM_ROW_BITS;
  const symm_u64 seen = symm_wait_until(p.w, p.flags, word, SYMM_CMP_GE, target, p.deadline_ns, &late);
  const symm_u64 rows = seen & ((1ull << SYMM_NORM_ROW_BITS) - 1);
  const bool differs = !late && (seen >> SYMM_NORM_ROW_BITS) == epoch && rows != p.rows;
  if (!late && !differs) return true;
  const bool aborted = p.w.abort && *p.w.abort;
  symm_timeout_record* rec = p.record;
  if (rec->reason == 0) {
    rec->rank = p.w.rank;
    rec->peer = peer;
    rec->slot = word;
    rec->expected = differs ? p.rows : target;
    rec->found = differs ? rows : seen;
    rec->op_index = 0;
    rec->channel = SYMM_MAX_CHANNELS - 1;
    __threadfence_system();
    rec->reason = differs ? SYMM_STOP_DIFFER : aborted ? SYMM_STOP_ABORTED : SYMM_STOP_TIMEOUT;
    __threadfence_system();
  }
  if (p.w.abort) *(volatile symm_u32*)p.w.abort = 1;
  return false;
}

// A launch this kernel cannot run (a block size or parameters the host never makes): one
// thread records it (SYMM_STOP_BAD_OP) and raises the abort word, so the call fails loudly.
static __device__ void symm_norm_refuse(const symm_norm_params& p) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  symm_timeout_record* rec = p.record;
  if (rec->reason == 0) {
    rec->rank = p.w.rank;
    rec->peer = p.w.rank;
    rec->slot = 0;
    rec->expected = p.max_rows;
    rec->found = p.rows;
    rec->op_index = 0;
    rec->channel = SYMM_MAX_CHANNELS - 1;
    __threadfence_system();
    rec->reason = SYMM_STOP_BAD_OP;
    __threadfence_system();
  }
  if (p.w.abort) *(volatile symm_u32*)p.w.abort = 1;
}

// A value rounded as symm_core::norm::round rounds it: nearest even, every NaN as 0x7fc0.
static __device__ __forceinline__ unsigned short symm_norm_round(float v) {
  return v != v ? (unsigned short)0x7fc0 : symm_f32_to_bf16(v);
}

// a[k] for a k known only at run time, without indexing the register array (no local memory).
template <int N>
static __device__ __forceinline__ uint4 symm_norm_pick(const uint4 (&a)[N], int k) {
  uint4 v = a[0];
#pragma unroll
  for (int i = 1; i < N; i++) {
    if (k == i) v = a[i];
  }
  return v;
}

static __device__ __forceinline__ void symm_norm_unpack(const uint4& v, float* f) {
  const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    f[2 * i] = symm_bf16_to_f32((unsigned short)(u[i] & 0xffff));
    f[2 * i + 1] = symm_bf16_to_f32((unsigned short)(u[i] >> 16));
  }
}

static __device__ __forceinline__ uint4 symm_norm_pack(const unsigned short* h) {
  uint4 v;
  v.x = (unsigned)h[0] | ((unsigned)h[1] << 16);
  v.y = (unsigned)h[2] | ((unsigned)h[3] << 16);
  v.z = (unsigned)h[4] | ((unsigned)h[5] << 16);
  v.w = (unsigned)h[6] | ((unsigned)h[7] << 16);
  return v;
}

// The new residual of one vector (the ranks' sum `s` plus the residual `r`, rounded once),
// stored at `dst`; its squares added to `acc` in element order.
static __device__ __forceinline__ void symm_norm_residual(const float* s, const uint4& r, uint4* dst, float& acc) {
  float b[8];
  symm_norm_unpack(r, b);
  unsigned short h[8];
#pragma unroll
  for (int i = 0; i < 8; i++) {
    h[i] = symm_norm_round(__fadd_rn(s[i], b[i]));
    const float hf = symm_bf16_to_f32(h[i]);
    acc = __fadd_rn(acc, __fmul_rn(hf, hf));
  }
  *dst = symm_norm_pack(h);
}

extern "C" __global__ void __launch_bounds__(SYMM_NORM_THREADS) symm_all_reduce_rmsnorm(symm_norm_params p) {
  const symm_u32 W = p.w.world, me = p.w.rank, t = threadIdx.x;
  const symm_u32 H = p.hidden, vecs = H / 8;
  if (blockDim.x != SYMM_NORM_THREADS || W == 0 || (H & 7) != 0 || p.rows > p.max_rows ||
      p.rows >> SYMM_NORM_ROW_BITS) {
    symm_norm_refuse(p);
    return;
  }
  symm_u64* state = (symm_u64*)symm_local(p.w, p.state);
  const symm_u64 epoch = state[0] + 1;
  const symm_u64 row_bytes = (symm_u64)H * 2;
  const symm_u64 stage = p.stage + (epoch & 1) * (symm_u64)p.max_rows * row_bytes;
  __shared__ int late;
  __shared__ float part[SYMM_NORM_THREADS];
  if (t == 0) late = 0;

  // 1. This rank's rows into its staging half.
  for (symm_u32 r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const uint4* src = (const uint4*)(p.x + (symm_u64)r * H);
    uint4* dst = (uint4*)symm_local(p.w, stage + (symm_u64)r * row_bytes);
    for (symm_u32 v = t; v < vecs; v += SYMM_NORM_THREADS) dst[v] = src[v];
  }
  __syncthreads();

  // 2. The barrier of block b: its flag word in every rank's flags, then everyone's in its own.
  if (t < W) {
    const symm_u64 sig = (epoch << SYMM_NORM_ROW_BITS) | p.rows;
    symm_signal(p.w, p.flags, blockIdx.x * W + me, t, SYMM_SIGNAL_SET, sig);
  }
  if (t < W && !symm_norm_wait(p, blockIdx.x * W + t, epoch, t)) late = 1;
  __syncthreads();
  if (late) return;

  // 3. Sum in rank order, add the residual, normalise.
  for (symm_u32 r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const symm_u64 at = stage + (symm_u64)r * row_bytes;
    const uint4* res = (const uint4*)(p.residual + (symm_u64)r * H);
    uint4* res_out = (uint4*)(p.residual_out + (symm_u64)r * H);
    float acc = 0.0f;
    // Two vectors of the thread at a time (v0, then v0 + THREADS: the order the partial sum
    // takes them), every rank's copy of both loaded before any is added, so a thread has up to
    // 2 x SYMM_NORM_RANKS loads in flight; then summed in rank order.
    for (symm_u32 v0 = t; v0 < vecs; v0 += 2 * SYMM_NORM_THREADS) {
      const symm_u32 v1 = v0 + SYMM_NORM_THREADS;
      const bool two = v1 < vecs;
      float s0[8], s1[8];
      const uint4 r0 = res[v0];
      const uint4 r1 = two ? res[v1] : r0;
      for (symm_u32 q0 = 0; q0 < W; q0 += SYMM_NORM_RANKS) {
        // Ranks q0 .. q0 + n - 1; load i goes to rank q0 + (i + me) % n, so the ranks do not
        // all read the same peer first. The sum still takes them in rank order.
        const symm_u32 n = W - q0 < SYMM_NORM_RANKS ? W - q0 : SYMM_NORM_RANKS;
        const symm_u32 rot = me % n;
        uint4 a[SYMM_NORM_RANKS], b[SYMM_NORM_RANKS];
#pragma unroll
        for (int i = 0; i < SYMM_NORM_RANKS; i++) {
          if ((symm_u32)i < n) {
            const symm_u32 q = q0 + ((symm_u32)i + rot) % n;
            const uint4* src = (const uint4*)symm_ptr(p.w, q, at);
            a[i] = __ldcg(src + v0);
            if (two) b[i] = __ldcg(src + v1);
          }
        }
#pragma unroll
        for (int k = 0; k < SYMM_NORM_RANKS; k++) {
          if ((symm_u32)k < n) {
            const int slot = (int)(((symm_u32)k + n - rot) % n);  // where rank q0 + k's load went
            float f[8];
            symm_norm_unpack(symm_norm_pick(a, slot), f);
#pragma unroll
            for (int e = 0; e < 8; e++) s0[e] = (q0 + k == 0) ? f[e] : __fadd_rn(s0[e], f[e]);
            if (two) {
              symm_norm_unpack(symm_norm_pick(b, slot), f);
#pragma unroll
              for (int e = 0; e < 8; e++) s1[e] = (q0 + k == 0) ? f[e] : __fadd_rn(s1[e], f[e]);
            }
          }
        }
      }
      symm_norm_residual(s0, r0, res_out + v0, acc);
      if (two) symm_norm_residual(s1, r1, res_out + v1, acc);
    }
    part[t] = acc;
    __syncthreads();
    for (symm_u32 s = SYMM_NORM_THREADS / 2; s > 0; s >>= 1) {
      if (t < s) part[t] = __fadd_rn(part[t], part[t + s]);
      __syncthreads();
    }
    const float mean = __fdiv_rn(part[0], (float)H);
    const float rstd = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, p.eps)));
    __syncthreads();  // everyone has read part[0] before the next row writes it
    const uint4* wt = (const uint4*)p.weight;
    uint4* out = (uint4*)(p.out + (symm_u64)r * H);
    for (symm_u32 v = t; v < vecs; v += SYMM_NORM_THREADS) {
      float h[8], w[8];
      symm_norm_unpack(res_out[v], h);  // what this thread wrote above
      symm_norm_unpack(wt[v], w);
      unsigned short o[8];
#pragma unroll
      for (int i = 0; i < 8; i++) {
        const float n = symm_bf16_to_f32(symm_norm_round(__fmul_rn(h[i], rstd)));
        o[i] = symm_norm_round(__fmul_rn(n, w[i]));
      }
      out[v] = symm_norm_pack(o);
    }
  }

  // 4. The last block to finish advances the epoch (no block of this call reads it after).
  __syncthreads();
  if (t == 0) {
    __threadfence();
    symm_u32* finished = (symm_u32*)(state + 1);
    if (atomicAdd(finished, 1u) == gridDim.x - 1) {
      *finished = 0;
      state[0] = epoch;
      __threadfence();
    }
  }
}
