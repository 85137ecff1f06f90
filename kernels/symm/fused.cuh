// Fused steps of compiled plans (driver/src/cuda/compiled.rs, untraced variant only). Each one
// leaves memory, the pad and the expected counters exactly as the ops it stands for would, with
// fewer block barriers, fences and memory round trips; the generator emits one only where the
// ops have its shape (checked on the host from the plan, and where it matters again here), and
// the traced variant runs every op by itself, so traces stay the interpreter's.
#pragma once
#include "symm/ops.cuh"

// A signal that adds `c` to this rank's own slot, then the wait for `c` more on that slot (the
// low-latency epoch). The slot is keyed by its writer, this rank's block of this channel, so
// nothing else writes it: the wait is met by the signal alone, and no other thread or GPU reads
// the slot while the kernel runs. Pad and counter advance together, as the two ops leave them,
// without the release fence, the atomic's round trip and the poll. Any other pair runs as ops.
static __device__ __forceinline__ void symm_local_epoch(const symm_interp_params& p, const symm_plan_op& sig,
                                                        const symm_plan_op& wait, const symm_u32 index, int& stop,
                                                        symm_u32& trace_len) {
  if (sig.kind != SYMM_OP_SIGNAL || wait.kind != SYMM_OP_WAIT || sig.dst_rank != p.rank ||
      sig.sigop != SYMM_SIGNAL_ADD || wait.slot != sig.slot || wait.count != sig.count) {
    symm_run_op(p, sig, index, stop, trace_len);
    if (!stop) symm_run_op(p, wait, index + 1, stop, trace_len);
    return;
  }
  if (threadIdx.x == 0) {
    volatile symm_u64* slot =
        (volatile symm_u64*)(p.base + (symm_u64)p.rank * p.stride + p.pad_off + (symm_u64)sig.slot * 8);
    *slot = *slot + sig.count;
    p.expected[sig.slot] += sig.count;
  }
  __syncthreads();
}

// K low-latency puts of the same source, bytes, epoch slot and half offset to K destinations:
// each thread loads its lines' data once and stores the lines to every destination, the peers
// before this rank's own scratch (the link trip starts first). Same lines as K SYMM_OP_LL_PUTs.
template <int K>
static __device__ __forceinline__ void symm_ll_put_n(const symm_interp_params& p, const symm_plan_op (&ops)[K]) {
  const symm_plan_op& o = ops[0];
  const symm_u64 e = p.expected[o.slot];
  const symm_u64 half = (e & 1) * o.reserved;
  const symm_u64 f = (symm_u64)symm_ll_flag(e) << 32;
  char* dst[K];
#pragma unroll
  for (int j = 0; j < K; j++) dst[j] = symm_loc(p, ops[j].dst_rank, ops[j].dst_buf, ops[j].dst_off + half);
  const char* src = symm_loc(p, o.a_rank, o.a_buf, o.a_off);
  const symm_u64 bytes = o.count;
  const symm_u64 lines = (bytes + 7) / 8;
  const symm_u64 n = blockDim.x;
  for (symm_u64 i = threadIdx.x; i < lines; i += SYMM_LL_U * n) {
    symm_u64 v[SYMM_LL_U];
#pragma unroll
    for (int u = 0; u < SYMM_LL_U; u++) {
      if (i + u * n < lines) v[u] = symm_ll_data(src, bytes, i + u * n);
    }
#pragma unroll
    for (int pass = 0; pass < 2; pass++) {
#pragma unroll
      for (int j = 0; j < K; j++) {
        if ((ops[j].dst_rank == p.rank) != (pass == 1)) continue;
#pragma unroll
        for (int u = 0; u < SYMM_LL_U; u++) {
          if (i + u * n < lines)
            symm_ll_store(dst[j] + (i + u * n) * 16, (v[u] & 0xFFFFFFFFull) | f, (v[u] >> 32) | f);
        }
      }
    }
  }
  __syncthreads();
}

// K signals to peers (SYMM_OP_SIGNAL, none to this rank's own pad): thread 0 releases the
// block's writes with one system fence and then raises every slot with a relaxed system-scope
// write (a fence.acq_rel followed by a strong write is PTX's release pattern, so each signal
// is a release, as the op's own `red.release` is). The same pad values as K signal ops, with
// one fence instead of two per op. When one of them goes to this rank's own pad, the ops run
// one by one.
template <int K>
static __device__ __forceinline__ void symm_signal_n(const symm_interp_params& p, const symm_plan_op (&ops)[K],
                                                     const symm_u32 index, int& stop, symm_u32& trace_len) {
  bool own = false;
#pragma unroll
  for (int j = 0; j < K; j++) own |= ops[j].dst_rank == p.rank;
  if (own) {
#pragma unroll
    for (int j = 0; j < K; j++) {
      if (!stop) symm_run_op(p, ops[j], index + j, stop, trace_len);
    }
    return;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    symm_fence();
#pragma unroll
    for (int j = 0; j < K; j++) {
      symm_u64* slot =
          (symm_u64*)(p.base + (symm_u64)ops[j].dst_rank * p.stride + p.pad_off + (symm_u64)ops[j].slot * 8);
      if (ops[j].sigop == SYMM_SIGNAL_SET) {
        asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(slot), "l"(ops[j].count) : "memory");
      } else {
        asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(slot), "l"(ops[j].count) : "memory");
      }
    }
  }
  __syncthreads();
}

// K waits (SYMM_OP_WAIT) on K different slots (the generator checks): thread j of the first
// warp polls op j's slot, so the K peers' signals are awaited at once instead of one after
// another. Each counter advances as its op would; a timeout or the abort word stops the block,
// and the first thread to stop records it (the op's index), as the op would.
template <int K>
static __device__ __forceinline__ void symm_wait_n(const symm_interp_params& p, const symm_plan_op (&ops)[K],
                                                   const symm_u32 index, int& stop) {
  static_assert(K <= 32, "one warp polls");
  volatile int* vstop = (volatile int*)&stop;
#pragma unroll
  for (int j = 0; j < K; j++) {
    if (threadIdx.x != (unsigned)j) continue;
    const symm_plan_op& op = ops[j];
    const symm_u64* slot =
        (const symm_u64*)(p.base + (symm_u64)p.rank * p.stride + p.pad_off + (symm_u64)op.slot * 8);
    const symm_u64 target = p.expected[op.slot] + op.count;
    const symm_u64 start = symm_globaltimer();
    unsigned spins = 0;
    for (;;) {
      const symm_u64 v = symm_ld_wait(slot);
      if ((long long)(v - target) >= 0) {
        p.expected[op.slot] = target;
        break;
      }
      if ((++spins & 1023u) == 0) {
        if (*vstop) break;
        if (symm_sig_differs(p, 0, 1, vstop)) break;
        if (*p.abort_word) {
          if (atomicExch((int*)vstop, 1) == 0) symm_record(p, SYMM_STOP_ABORTED, op.slot, target, v, index + j);
          break;
        }
        if (symm_globaltimer() - start > p.timeout_ns) {
          if (atomicExch((int*)vstop, 1) == 0) {
            symm_record(p, SYMM_STOP_TIMEOUT, op.slot, target, v, index + j);
            *p.abort_word = 1;
            __threadfence_system();
          }
          break;
        }
      }
    }
  }
  __syncthreads();
}

// K copies (SYMM_OP_COPY) of one source and size to K destinations (the generator checks): each
// thread loads its 16-byte vectors once and stores them to every destination, so the K peers'
// writes are in flight together. The same bytes as K copy ops. Unaligned ends copy bytewise.
template <int K>
static __device__ __forceinline__ void symm_copy_n(const symm_interp_params& p, const symm_plan_op (&ops)[K]) {
  const char* src = symm_loc(p, ops[0].a_rank, ops[0].a_buf, ops[0].a_off);
  const symm_u64 bytes = ops[0].count;
  char* dst[K];
  symm_u64 bits = (symm_u64)src;
#pragma unroll
  for (int j = 0; j < K; j++) {
    dst[j] = symm_loc(p, ops[j].dst_rank, ops[j].dst_buf, ops[j].dst_off);
    bits |= (symm_u64)dst[j];
  }
  const symm_u32 t = threadIdx.x, n = blockDim.x;
  const symm_u64 vecs = (bits & 15) == 0 ? bytes >> 4 : 0;
  const uint4* s = (const uint4*)src;
  symm_u64 i = t;
  for (; i + 3 * (symm_u64)n < vecs; i += 4 * (symm_u64)n) {
    const uint4 v0 = s[i], v1 = s[i + n], v2 = s[i + 2 * n], v3 = s[i + 3 * n];
#pragma unroll
    for (int j = 0; j < K; j++) {
      uint4* d = (uint4*)dst[j];
      d[i] = v0;
      d[i + n] = v1;
      d[i + 2 * n] = v2;
      d[i + 3 * n] = v3;
    }
  }
  for (; i < vecs; i += n) {
    const uint4 v = s[i];
#pragma unroll
    for (int j = 0; j < K; j++) ((uint4*)dst[j])[i] = v;
  }
  for (symm_u64 b = (vecs << 4) + t; b < bytes; b += n) {
    const char c = src[b];
#pragma unroll
    for (int j = 0; j < K; j++) dst[j][b] = c;
  }
  __syncthreads();
}

// Stages `n` encoded ops at `src` (a channel's ops in the uploaded plan) in shared memory, every
// thread of the block a share of the 16-byte words, so the fields a compiled shape reads from the
// plan cost one round trip for the block instead of one per op.
static __device__ __forceinline__ void symm_stage_ops(const symm_plan_op* src, symm_plan_op* staged, symm_u32 n) {
  const uint4* s = (const uint4*)src;
  uint4* d = (uint4*)staged;
  for (symm_u32 i = threadIdx.x; i < n * (SYMM_OP_BYTES / 16); i += blockDim.x) d[i] = s[i];
  __syncthreads();
}
