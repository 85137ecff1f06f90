// The ops of symm plans on the GPU: block-wide data movement, reductions, the low-latency
// protocol, signals and waits, and `symm_run_op`, which runs one op with a whole block. The
// interpreter (symm/interp.cu) calls it for each op it reads from a plan; a compiled plan
// (symm_driver's plan compiler) calls it for each op of one rank's plan with the op's fields
// as constants, so the compiler folds the dispatch away. Both emit the same trace events.
#pragma once
#include "symm/plan.cuh"
#include "symm/device.cuh"

#ifndef SYMM_TRACE
#define SYMM_TRACE 0
#endif
#ifndef SYMM_MULTIMEM
#define SYMM_MULTIMEM 0
#endif
#ifndef SYMM_PLAN_CACHE
#define SYMM_PLAN_CACHE 64
#endif
#ifndef SYMM_THREADS
#define SYMM_THREADS 512
#endif

// The parameter block, the timeout record and the trace event (and SYMM_STOP_*, SYMM_EV_*) are
// generated into symm/plan.cuh from symm_kernels::abi, the one definition the host also uses.

#include "symm/reduce.cuh"

// ---------------------------------------------------------------------------------------------
// Block-wide data movement.
// ---------------------------------------------------------------------------------------------

// Copies with 16-byte vectors, four in flight per thread, when both ends are 16-byte aligned.
static __device__ __forceinline__ void symm_copy_block(char* dst, const char* src, symm_u64 bytes) {
  const symm_u32 t = threadIdx.x, n = blockDim.x;
  if ((((symm_u64)dst | (symm_u64)src) & 15) == 0) {
    const symm_u64 vecs = bytes >> 4;
    uint4* d = (uint4*)dst;
    const uint4* s = (const uint4*)src;
    symm_u64 i = t;
    for (; i + 3 * (symm_u64)n < vecs; i += 4 * (symm_u64)n) {
      uint4 v0 = s[i], v1 = s[i + n], v2 = s[i + 2 * n], v3 = s[i + 3 * n];
      d[i] = v0;
      d[i + n] = v1;
      d[i + 2 * n] = v2;
      d[i + 3 * n] = v3;
    }
    for (; i < vecs; i += n) d[i] = s[i];
    for (symm_u64 j = (vecs << 4) + t; j < bytes; j += n) dst[j] = src[j];
  } else {
    for (symm_u64 j = t; j < bytes; j += n) dst[j] = src[j];
  }
}

#if SYMM_MULTIMEM
// Multicast ops over the multicast view (mc_base): multimem.ld_reduce for f32 sum and for bf16
// sum/min/max (pairs, .bf16x2), 16-byte multimem.st. Other combinations are refused
// (reason SYMM_STOP_BAD_OP).
static __device__ bool symm_mc_reduce(int dtype, char* dst, const char* mc_src, symm_u64 n, int op) {
  if (dtype == SYMM_DTYPE_F32 && op == SYMM_REDOP_SUM) {
    for (symm_u64 i = threadIdx.x; i < n; i += blockDim.x) {
      float v;
      const float* p = (const float*)mc_src + i;
      asm volatile("multimem.ld_reduce.relaxed.sys.global.add.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
      ((float*)dst)[i] = v;
    }
    return true;
  }
  if (dtype == SYMM_DTYPE_BF16 && (n & 1) == 0) {
    for (symm_u64 i = threadIdx.x; i < n / 2; i += blockDim.x) {
      symm_u32 v;
      const symm_u32* p = (const symm_u32*)mc_src + i;
      switch (op) {
        case SYMM_REDOP_SUM:
          asm volatile("multimem.ld_reduce.relaxed.sys.global.add.bf16x2 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
          break;
        case SYMM_REDOP_MIN:
          asm volatile("multimem.ld_reduce.relaxed.sys.global.min.bf16x2 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
          break;
        case SYMM_REDOP_MAX:
          asm volatile("multimem.ld_reduce.relaxed.sys.global.max.bf16x2 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
          break;
        default:
          return false;
      }
      ((symm_u32*)dst)[i] = v;
    }
    return true;
  }
  return false;
}

static __device__ void symm_mc_store(char* mc_dst, const char* src, symm_u64 bytes) {
  const symm_u64 vecs = bytes >> 4;
  for (symm_u64 i = threadIdx.x; i < vecs; i += blockDim.x) {
    uint4 v = ((const uint4*)src)[i];
    const uint4* p = ((const uint4*)mc_dst) + i;
    asm volatile("multimem.st.relaxed.sys.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
  }
}
#endif

// ---------------------------------------------------------------------------------------------
// The interpreter.
// ---------------------------------------------------------------------------------------------

// The address of `off` bytes into buffer `buf` of `rank`. Computed on integers, which wrap: a
// side the request owns lies outside the heap, its `buf_off` being its address minus this rank's
// heap base (only this rank's own ops name it).
static __device__ __forceinline__ char* symm_loc(const symm_interp_params& p, symm_u32 rank, symm_u32 buf,
                                                 symm_u64 off) {
  return (char*)((symm_u64)p.base + (symm_u64)rank * p.stride + p.buf_off[buf < SYMM_BUFS ? buf : 0] + off);
}

// Bytes of one element of `dtype`; 0 for a value that names no dtype.
static __device__ __forceinline__ symm_u64 symm_dtype_bytes(int dtype) {
  switch (dtype) {
    case SYMM_DTYPE_F16:
    case SYMM_DTYPE_BF16: return 2;
    case SYMM_DTYPE_F32:
    case SYMM_DTYPE_I32:
    case SYMM_DTYPE_U32: return 4;
    case SYMM_DTYPE_F64:
    case SYMM_DTYPE_I64:
    case SYMM_DTYPE_U64: return 8;
    case SYMM_DTYPE_U8: return 1;
    default: return 0;
  }
}

static __device__ void symm_record(const symm_interp_params& p, symm_u32 reason, symm_u32 slot, symm_u64 expected,
                                   symm_u64 found, symm_u32 index) {
  symm_timeout_record* r = p.records + blockIdx.x;
  r->rank = p.rank;
  r->peer = p.world ? slot % p.world : 0;
  r->slot = slot;
  r->expected = expected;
  r->found = found;
  r->op_index = index;
  r->channel = blockIdx.x;
  __threadfence_system();
  r->reason = reason;
  __threadfence_system();
}

#include "symm/signature.cuh"

#include "symm/ll.cuh"

#if SYMM_TRACE
static __device__ __forceinline__ void symm_trace(const symm_interp_params& p, symm_u32& len, symm_u32 index,
                                                  symm_u32 kind) {
  if (threadIdx.x == 0 && p.trace) {
    if (len < p.trace_cap) {
      symm_trace_event* e = p.trace + (symm_u64)blockIdx.x * p.trace_cap + len;
      e->time = symm_globaltimer();
      e->index = index;
      e->kind = kind;
    }
    len++;
  }
}
#define SYMM_TRACE_EVENT(index, kind) symm_trace(p, trace_len, index, kind)
#else
#define SYMM_TRACE_EVENT(index, kind) \
  do {                                \
  } while (0)
#endif


// Runs `op`, the `index`-th op of this block's channel, with every thread of the block; sets
// `stop` (shared) when the block must stop (a timeout, the abort word, an op it cannot run).
// Traced variants append begin and end events (thread 0's count in `trace_len`).
static __device__ __forceinline__ void symm_run_op(const symm_interp_params& p, const symm_plan_op& op,
                                                   const symm_u32 index, int& stop, symm_u32& trace_len) {
  (void)trace_len;
  SYMM_TRACE_EVENT(index, SYMM_EV_BEGIN);
  switch (op.kind) {
    case SYMM_OP_COPY:
      symm_copy_block(symm_loc(p, op.dst_rank, op.dst_buf, op.dst_off), symm_loc(p, op.a_rank, op.a_buf, op.a_off),
                      op.count);
      __syncthreads();
      break;
    case SYMM_OP_REDUCE: {
      bool ok = symm_reduce_any(op.dtype, symm_loc(p, op.dst_rank, op.dst_buf, op.dst_off),
                                symm_loc(p, op.a_rank, op.a_buf, op.a_off), symm_loc(p, op.b_rank, op.b_buf, op.b_off),
                                op.count, op.redop, op.div);
      if (!ok && threadIdx.x == 0) {
        symm_record(p, SYMM_STOP_BAD_OP, 0, 0, 0, index);
        stop = 1;
      }
      __syncthreads();
      break;
    }
    case SYMM_OP_REDUCE_N: {
      // Sources: b_rank of them, their ranks packed four to a word in b_off and reserved.
      const int k = op.b_rank;
      const char* src[8];
#pragma unroll
      for (int s = 0; s < 8; s++) {
        const symm_u64 w = s < 4 ? op.b_off : op.reserved;
        src[s] = symm_loc(p, (symm_u32)((w >> (16 * (s & 3))) & 0xffffu), op.a_buf, op.a_off);
      }
      // One source and no division is a copy of the data's bits (symm_core::dtype::fold).
      const symm_u64 es = symm_dtype_bytes(op.dtype);
      bool ok;
      if (k == 1 && op.div <= 1 && es) {
        symm_copy_block(symm_loc(p, op.dst_rank, op.dst_buf, op.dst_off), src[0], op.count * es);
        ok = true;
      } else {
        ok = symm_reduce_n_any(op.dtype, symm_loc(p, op.dst_rank, op.dst_buf, op.dst_off), src, k, op.count,
                               op.redop, op.div);
      }
      if (!ok && threadIdx.x == 0) {
        symm_record(p, SYMM_STOP_BAD_OP, 0, 0, 0, index);
        stop = 1;
      }
      __syncthreads();
      break;
    }
    case SYMM_OP_LL_PUT:
    case SYMM_OP_LL_REDUCE: {
      // The format byte picks the family's instance (a constant in a compiled plan).
      volatile int* vstop = (volatile int*)&stop;
      if (op.kind == SYMM_OP_LL_REDUCE) symm_sig_await(p, op, index, vstop);
      const int bad = op.format == SYMM_LL_FORMAT_LL      ? symm_ll_op<symm_lines16>(p, op, index, vstop)
                      : op.format == SYMM_LL_FORMAT_LL128 ? symm_ll_op<symm_lines128>(p, op, index, vstop)
                                                          : 1;
      if (bad && threadIdx.x == 0) {
        symm_record(p, SYMM_STOP_BAD_OP, 0, 0, 0, index);
        stop = 1;
      }
      __syncthreads();
      break;
    }
    case SYMM_OP_SIGNAL:
      __syncthreads();
      if (threadIdx.x == 0) {
        symm_u64* slot = (symm_u64*)(p.base + (symm_u64)op.dst_rank * p.stride + p.pad_off + (symm_u64)op.slot * 8);
        if (op.dst_rank == p.rank) {
          // A signal to this rank's own pad (the low-latency epoch) is observed only by this
          // GPU: the same release at GPU scope, without draining NVLink traffic (a system
          // fence costs microseconds).
          __threadfence();
          if (op.sigop == SYMM_SIGNAL_SET) {
            asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(slot), "l"(op.count) : "memory");
          } else {
            asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(slot), "l"(op.count) : "memory");
          }
        } else {
          symm_signal_word(slot, op.sigop, op.count);
        }
      }
      break;
    case SYMM_OP_WAIT:
      if (threadIdx.x == 0) {
        const symm_u64* slot = (const symm_u64*)(p.base + (symm_u64)p.rank * p.stride + p.pad_off + (symm_u64)op.slot * 8);
        const symm_u64 target = p.expected[op.slot] + op.count;
        const symm_u64 start = symm_globaltimer();
        unsigned spins = 0;
        for (;;) {
          symm_u64 v = symm_ld_wait(slot);
          if ((long long)(v - target) >= 0) {
            p.expected[op.slot] = target;
            break;
          }
          if ((++spins & 1023u) == 0) {
            if (symm_sig_differs(p, 0, 1, (volatile int*)&stop)) break;
            if (*p.abort_word) {
              symm_record(p, SYMM_STOP_ABORTED, op.slot, target, v, index);
              stop = 1;
              break;
            }
            if (symm_globaltimer() - start > p.timeout_ns) {
              symm_record(p, SYMM_STOP_TIMEOUT, op.slot, target, v, index);
              *p.abort_word = 1;
              __threadfence_system();
              stop = 1;
#if SYMM_TRACE
              symm_trace(p, trace_len, index, SYMM_EV_STALL);
#endif
              break;
            }
          }
        }
      }
      __syncthreads();
      break;
#if SYMM_MULTIMEM
    case SYMM_OP_MC_REDUCE: {
      bool ok = op.div <= 1 &&
                symm_mc_reduce(op.dtype, symm_loc(p, op.dst_rank, op.dst_buf, op.dst_off),
                               p.mc_base + p.buf_off[op.a_buf < SYMM_BUFS ? op.a_buf : 0] + op.a_off, op.count,
                               op.redop);
      if (!ok && threadIdx.x == 0) {
        symm_record(p, SYMM_STOP_BAD_OP, 0, 0, 0, index);
        stop = 1;
      }
      __syncthreads();
      break;
    }
    case SYMM_OP_MC_STORE:
      symm_mc_store(p.mc_base + p.buf_off[op.dst_buf < SYMM_BUFS ? op.dst_buf : 0] + op.dst_off,
                    symm_loc(p, op.a_rank, op.a_buf, op.a_off), op.count);
      __syncthreads();
      break;
#endif
    default:
      if (threadIdx.x == 0) {
        symm_record(p, SYMM_STOP_BAD_OP, 0, 0, 0, index);
        stop = 1;
      }
      __syncthreads();
      break;
  }
  if (!stop) SYMM_TRACE_EVENT(index, SYMM_EV_END);
  __syncthreads();
}
