// The plan interpreter: one kernel that runs any symm plan (symm_core::plan encoding).
//
// Grid: one thread block per channel. Block c runs ops chan_start[c] .. chan_start[c+1] of the
// rank's plan, in order, exactly as the schedule yielded them:
//   COPY    every thread copies a share of the bytes (16-byte vectors when aligned)
//   REDUCE  every thread combines a share of the elements (16-byte vectors when aligned),
//           bit for bit as symm_core::dtype::combine (halves rounded to nearest even per step)
//   SIGNAL  the block synchronises, then thread 0 does fence.acq_rel.sys + a release atomic
//   WAIT    thread 0 spins with ld.acquire.sys until pad[slot] >= expected[slot] + count, then
//           advances expected[slot] (device memory, so a replayed CUDA graph keeps counting)
// Every wait has a %globaltimer deadline. On expiry the block writes a timeout record (rank, peer,
// slot, expected, found, op index) to host-mapped memory, raises the shared abort word so that
// every other block of every rank stops at its next wait, and returns.
//
// Variants (preprocessor): SYMM_TRACE=1 appends begin/end events stamped with %globaltimer to a
// device buffer (the off variant has no tracing code at all); SYMM_MULTIMEM=1 adds the NVLink
// multicast ops (multimem.*), compiled for checking but never launched on shared machines.
#include "symm/plan.cuh"
#include "symm/device.cuh"

#ifndef SYMM_TRACE
#define SYMM_TRACE 0
#endif
#ifndef SYMM_MULTIMEM
#define SYMM_MULTIMEM 0
#endif
#ifndef SYMM_THREADS
#define SYMM_THREADS 512
#endif

// The parameter block, the timeout record and the trace event (and SYMM_STOP_*, SYMM_EV_*) are
// generated into symm/plan.cuh from symm_kernels::abi, the one definition the host also uses.

// ---------------------------------------------------------------------------------------------
// Element semantics (symm_core::dtype::combine).
// ---------------------------------------------------------------------------------------------

// Not inlined: the subnormal paths are long and inlining them into every unrolled lane
// multiplies compile time.
static __device__ __noinline__ float symm_f16_to_f32(unsigned short h) {
  unsigned sign = ((unsigned)(h >> 15)) << 31;
  unsigned exp = (h >> 10) & 0x1f;
  unsigned man = h & 0x3ff;
  unsigned bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {
      int e = 127 - 15 + 1;
      unsigned m = man;
      while ((m & 0x400) == 0) {
        m <<= 1;
        e -= 1;
      }
      bits = sign | ((unsigned)e << 23) | ((m & 0x3ff) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return __uint_as_float(bits);
}

static __device__ __noinline__ unsigned short symm_f32_to_f16(float f) {
  unsigned x = __float_as_uint(f);
  unsigned short sign = (unsigned short)((x >> 16) & 0x8000);
  int exp = (int)((x >> 23) & 0xff);
  unsigned man = x & 0x7fffff;
  if (exp == 0xff) {
    unsigned short nan = man != 0 ? 0x200 : 0;
    return sign | 0x7c00 | nan;
  }
  int e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    unsigned m = man | 0x800000;
    unsigned shift = (unsigned)(14 - e);
    unsigned half = 1u << (shift - 1);
    unsigned rest = m & ((1u << shift) - 1);
    unsigned r = m >> shift;
    if (rest > half || (rest == half && (r & 1) == 1)) r += 1;
    return sign | (unsigned short)r;
  }
  unsigned r = ((unsigned)e << 10) | (man >> 13);
  unsigned rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (r & 1) == 1)) r += 1;
  return sign | (unsigned short)r;
}

static __device__ __forceinline__ float symm_bf16_to_f32(unsigned short h) {
  return __uint_as_float(((unsigned)h) << 16);
}

static __device__ __forceinline__ unsigned short symm_f32_to_bf16(float f) {
  unsigned x = __float_as_uint(f);
  if (f != f) return (unsigned short)((x >> 16) | 0x40);
  unsigned round = 0x7fff + ((x >> 16) & 1);
  return (unsigned short)((x + round) >> 16);
}

template <class T>
static __device__ __forceinline__ T symm_float_op(T a, T b, int op) {
  switch (op) {
    case SYMM_REDOP_PROD: return a * b;
    case SYMM_REDOP_MIN: return b < a ? b : a;
    case SYMM_REDOP_MAX: return b > a ? b : a;
    default: return a + b;  // SUM, AVG
  }
}

// Integers wrap: arithmetic in the unsigned type U, comparisons in the type T.
template <class T, class U>
static __device__ __forceinline__ T symm_int_op(T a, T b, int op) {
  switch (op) {
    case SYMM_REDOP_PROD: return (T)(U)((U)a * (U)b);
    case SYMM_REDOP_MIN: return b < a ? b : a;
    case SYMM_REDOP_MAX: return b > a ? b : a;
    default: return (T)(U)((U)a + (U)b);
  }
}

template <int DT, class S>
struct symm_elem;

template <>
struct symm_elem<SYMM_DTYPE_F32, float> {
  static __device__ __forceinline__ float combine(float a, float b, int op, unsigned d) {
    float r = symm_float_op<float>(a, b, op);
    return d > 1 ? r / (float)d : r;
  }
};
template <>
struct symm_elem<SYMM_DTYPE_F64, double> {
  static __device__ __forceinline__ double combine(double a, double b, int op, unsigned d) {
    double r = symm_float_op<double>(a, b, op);
    return d > 1 ? r / (double)d : r;
  }
};
template <>
struct symm_elem<SYMM_DTYPE_F16, unsigned short> {
  static __device__ __forceinline__ unsigned short combine(unsigned short a, unsigned short b, int op, unsigned d) {
    float r = symm_float_op<float>(symm_f16_to_f32(a), symm_f16_to_f32(b), op);
    if (d > 1) r = r / (float)d;
    return symm_f32_to_f16(r);
  }
};
template <>
struct symm_elem<SYMM_DTYPE_BF16, unsigned short> {
  static __device__ __forceinline__ unsigned short combine(unsigned short a, unsigned short b, int op, unsigned d) {
    float r = symm_float_op<float>(symm_bf16_to_f32(a), symm_bf16_to_f32(b), op);
    if (d > 1) r = r / (float)d;
    return symm_f32_to_bf16(r);
  }
};
template <>
struct symm_elem<SYMM_DTYPE_I32, int> {
  static __device__ __forceinline__ int combine(int a, int b, int op, unsigned d) {
    int r = symm_int_op<int, unsigned>(a, b, op);
    return d > 1 ? r / (int)d : r;
  }
};
template <>
struct symm_elem<SYMM_DTYPE_U32, unsigned> {
  static __device__ __forceinline__ unsigned combine(unsigned a, unsigned b, int op, unsigned d) {
    unsigned r = symm_int_op<unsigned, unsigned>(a, b, op);
    return d > 1 ? r / d : r;
  }
};
template <>
struct symm_elem<SYMM_DTYPE_I64, long long> {
  static __device__ __forceinline__ long long combine(long long a, long long b, int op, unsigned d) {
    long long r = symm_int_op<long long, unsigned long long>(a, b, op);
    return d > 1 ? r / (long long)d : r;
  }
};
template <>
struct symm_elem<SYMM_DTYPE_U64, unsigned long long> {
  static __device__ __forceinline__ unsigned long long combine(unsigned long long a, unsigned long long b, int op,
                                                               unsigned d) {
    unsigned long long r = symm_int_op<unsigned long long, unsigned long long>(a, b, op);
    return d > 1 ? r / (unsigned long long)d : r;
  }
};
template <>
struct symm_elem<SYMM_DTYPE_U8, unsigned char> {
  static __device__ __forceinline__ unsigned char combine(unsigned char a, unsigned char b, int op, unsigned d) {
    unsigned char r = symm_int_op<unsigned char, unsigned char>(a, b, op);
    return d > 1 ? (unsigned char)((unsigned)r / d) : r;
  }
};

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

template <int DT, class S>
static __device__ void symm_reduce_block(char* dst, const char* a, const char* b, symm_u64 n, int op, unsigned d) {
  const symm_u32 t = threadIdx.x, lanes = blockDim.x;
  const symm_u64 K = 16 / sizeof(S);
  const bool vec = (((symm_u64)dst | (symm_u64)a | (symm_u64)b) & 15) == 0;
  const symm_u64 nv = vec ? n / K : 0;
  const uint4* va4 = (const uint4*)a;
  const uint4* vb4 = (const uint4*)b;
  uint4* vd4 = (uint4*)dst;
  symm_u64 i = t;
  // U vectors in flight per thread: all loads first (remote loads have microsecond latency),
  // then the arithmetic and the stores. Bytes (16 lanes a vector) stay at one to keep the
  // unrolled code, and NVRTC's compile time, small.
  constexpr int U = sizeof(S) == 1 ? 1 : 4;
  for (; i + (U - 1) * (symm_u64)lanes < nv; i += U * (symm_u64)lanes) {
    uint4 va[U], vb[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      va[u] = va4[i + u * lanes];
      vb[u] = vb4[i + u * lanes];
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      uint4 vo;
      const S* xa = (const S*)&va[u];
      const S* xb = (const S*)&vb[u];
      S* xo = (S*)&vo;
#pragma unroll
      for (int k = 0; k < (int)(16 / sizeof(S)); k++) xo[k] = symm_elem<DT, S>::combine(xa[k], xb[k], op, d);
      vd4[i + u * lanes] = vo;
    }
  }
  for (; i < nv; i += lanes) {
    uint4 va = va4[i];
    uint4 vb = vb4[i];
    uint4 vo;
    const S* xa = (const S*)&va;
    const S* xb = (const S*)&vb;
    S* xo = (S*)&vo;
#pragma unroll
    for (int k = 0; k < (int)(16 / sizeof(S)); k++) xo[k] = symm_elem<DT, S>::combine(xa[k], xb[k], op, d);
    vd4[i] = vo;
  }
  const S* sa = (const S*)a;
  const S* sb = (const S*)b;
  S* so = (S*)dst;
  for (symm_u64 i = nv * K + t; i < n; i += lanes) so[i] = symm_elem<DT, S>::combine(sa[i], sb[i], op, d);
}

// Returns false for an unknown dtype.
static __device__ bool symm_reduce_any(int dtype, char* dst, const char* a, const char* b, symm_u64 n, int op,
                                       unsigned d) {
  switch (dtype) {
    case SYMM_DTYPE_F32: symm_reduce_block<SYMM_DTYPE_F32, float>(dst, a, b, n, op, d); return true;
    case SYMM_DTYPE_F16: symm_reduce_block<SYMM_DTYPE_F16, unsigned short>(dst, a, b, n, op, d); return true;
    case SYMM_DTYPE_BF16: symm_reduce_block<SYMM_DTYPE_BF16, unsigned short>(dst, a, b, n, op, d); return true;
    case SYMM_DTYPE_F64: symm_reduce_block<SYMM_DTYPE_F64, double>(dst, a, b, n, op, d); return true;
    case SYMM_DTYPE_I32: symm_reduce_block<SYMM_DTYPE_I32, int>(dst, a, b, n, op, d); return true;
    case SYMM_DTYPE_U32: symm_reduce_block<SYMM_DTYPE_U32, unsigned>(dst, a, b, n, op, d); return true;
    case SYMM_DTYPE_I64: symm_reduce_block<SYMM_DTYPE_I64, long long>(dst, a, b, n, op, d); return true;
    case SYMM_DTYPE_U64: symm_reduce_block<SYMM_DTYPE_U64, unsigned long long>(dst, a, b, n, op, d); return true;
    case SYMM_DTYPE_U8: symm_reduce_block<SYMM_DTYPE_U8, unsigned char>(dst, a, b, n, op, d); return true;
    default: return false;
  }
}

// ---------------------------------------------------------------------------------------------
// The k-way reduce (SYMM_OP_REDUCE_N): core's dtype::fold. 16-bit floats are widened to f32,
// folded in source order with one accumulator, divided and rounded once; the other types fold
// with the binary operator and divide at the end. Each thread loads the same 16-byte vector of
// every source before any arithmetic, so k remote loads are in flight together.
// ---------------------------------------------------------------------------------------------

template <class S>
static __device__ __forceinline__ S symm_div(S x, unsigned d) {
  return x / (S)d;
}
template <>
__device__ __forceinline__ unsigned char symm_div<unsigned char>(unsigned char x, unsigned d) {
  return (unsigned char)((unsigned)x / d);
}

template <int DT, class S>
struct symm_fold {
  typedef S acc;
  static __device__ __forceinline__ acc widen(S x) { return x; }
  static __device__ __forceinline__ acc step(acc a, S b, int op) { return symm_elem<DT, S>::combine(a, b, op, 1); }
  static __device__ __forceinline__ S finish(acc a, unsigned d) { return d > 1 ? symm_div<S>(a, d) : a; }
};
template <>
struct symm_fold<SYMM_DTYPE_F16, unsigned short> {
  typedef float acc;
  static __device__ __forceinline__ acc widen(unsigned short x) { return symm_f16_to_f32(x); }
  static __device__ __forceinline__ acc step(acc a, unsigned short b, int op) {
    return symm_float_op<float>(a, symm_f16_to_f32(b), op);
  }
  static __device__ __forceinline__ unsigned short finish(acc a, unsigned d) {
    return symm_f32_to_f16(d > 1 ? a / (float)d : a);
  }
};
template <>
struct symm_fold<SYMM_DTYPE_BF16, unsigned short> {
  typedef float acc;
  static __device__ __forceinline__ acc widen(unsigned short x) { return symm_bf16_to_f32(x); }
  static __device__ __forceinline__ acc step(acc a, unsigned short b, int op) {
    return symm_float_op<float>(a, symm_bf16_to_f32(b), op);
  }
  static __device__ __forceinline__ unsigned short finish(acc a, unsigned d) {
    return symm_f32_to_bf16(d > 1 ? a / (float)d : a);
  }
};

// One 16-byte vector of the result from the same vector of k sources (k <= KMAX).
template <int DT, class S, int KMAX>
static __device__ __forceinline__ uint4 symm_fold_vec(const uint4* v, int k, int op, unsigned d) {
  typedef symm_fold<DT, S> F;
  constexpr int E = 16 / sizeof(S);
  typename F::acc a[E];
  const S* x0 = (const S*)&v[0];
#pragma unroll
  for (int e = 0; e < E; e++) a[e] = F::widen(x0[e]);
#pragma unroll
  for (int s = 1; s < KMAX; s++) {
    if (s < k) {
      const S* xs = (const S*)&v[s];
#pragma unroll
      for (int e = 0; e < E; e++) a[e] = F::step(a[e], xs[e], op);
    }
  }
  uint4 o;
  S* xo = (S*)&o;
#pragma unroll
  for (int e = 0; e < E; e++) xo[e] = F::finish(a[e], d);
  return o;
}

// U vectors of every source in flight per thread; KMAX * U is 8.
template <int DT, class S, int U, int KMAX>
static __device__ void symm_reduce_n_block(char* dst, const char* const* src, int k, symm_u64 n, int op,
                                           unsigned d) {
  typedef symm_fold<DT, S> F;
  const symm_u32 t = threadIdx.x, lanes = blockDim.x;
  constexpr symm_u64 E = 16 / sizeof(S);
  symm_u64 bits = (symm_u64)dst;
  for (int s = 0; s < k; s++) bits |= (symm_u64)src[s];
  const symm_u64 nv = (bits & 15) == 0 ? n / E : 0;
  uint4* vd = (uint4*)dst;
  symm_u64 i = t;
  for (; i + (U - 1) * (symm_u64)lanes < nv; i += U * (symm_u64)lanes) {
    uint4 v[U][KMAX];
#pragma unroll
    for (int s = 0; s < KMAX; s++) {
      if (s < k) {
#pragma unroll
        for (int u = 0; u < U; u++) v[u][s] = ((const uint4*)src[s])[i + u * lanes];
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) vd[i + u * lanes] = symm_fold_vec<DT, S, KMAX>(v[u], k, op, d);
  }
  for (; i < nv; i += lanes) {
    uint4 v[KMAX];
#pragma unroll
    for (int s = 0; s < KMAX; s++) {
      if (s < k) v[s] = ((const uint4*)src[s])[i];
    }
    vd[i] = symm_fold_vec<DT, S, KMAX>(v, k, op, d);
  }
  S* so = (S*)dst;
  for (symm_u64 j = nv * E + t; j < n; j += lanes) {
    typename F::acc a = F::widen(((const S*)src[0])[j]);
    for (int s = 1; s < k; s++) a = F::step(a, ((const S*)src[s])[j], op);
    so[j] = F::finish(a, d);
  }
}

// Element by element, for the types the collectives of small models rarely reduce (keeps the
// number of unrolled instantiations, and NVRTC's compile time, small).
template <int DT, class S>
static __device__ void symm_reduce_n_scalar(char* dst, const char* const* src, int k, symm_u64 n, int op,
                                            unsigned d) {
  typedef symm_fold<DT, S> F;
  S* so = (S*)dst;
  for (symm_u64 j = threadIdx.x; j < n; j += blockDim.x) {
    typename F::acc a = F::widen(((const S*)src[0])[j]);
    for (int s = 1; s < k; s++) a = F::step(a, ((const S*)src[s])[j], op);
    so[j] = F::finish(a, d);
  }
}

template <int DT, class S>
static __device__ void symm_reduce_n_wide(char* dst, const char* const* src, int k, symm_u64 n, int op, unsigned d) {
  if (k <= 2) {
    symm_reduce_n_block<DT, S, 4, 2>(dst, src, k, n, op, d);
  } else {
    symm_reduce_n_block<DT, S, 1, 8>(dst, src, k, n, op, d);
  }
}

// Returns false for an unknown dtype or a source count outside 1..=8.
static __device__ bool symm_reduce_n_any(int dtype, char* dst, const char* const* src, int k, symm_u64 n, int op,
                                         unsigned d) {
  if (k < 1 || k > 8) return false;
  switch (dtype) {
    case SYMM_DTYPE_F32: symm_reduce_n_wide<SYMM_DTYPE_F32, float>(dst, src, k, n, op, d); return true;
    case SYMM_DTYPE_F16: symm_reduce_n_wide<SYMM_DTYPE_F16, unsigned short>(dst, src, k, n, op, d); return true;
    case SYMM_DTYPE_BF16: symm_reduce_n_wide<SYMM_DTYPE_BF16, unsigned short>(dst, src, k, n, op, d); return true;
    case SYMM_DTYPE_F64: symm_reduce_n_scalar<SYMM_DTYPE_F64, double>(dst, src, k, n, op, d); return true;
    case SYMM_DTYPE_I32: symm_reduce_n_scalar<SYMM_DTYPE_I32, int>(dst, src, k, n, op, d); return true;
    case SYMM_DTYPE_U32: symm_reduce_n_scalar<SYMM_DTYPE_U32, unsigned>(dst, src, k, n, op, d); return true;
    case SYMM_DTYPE_I64: symm_reduce_n_scalar<SYMM_DTYPE_I64, long long>(dst, src, k, n, op, d); return true;
    case SYMM_DTYPE_U64: symm_reduce_n_scalar<SYMM_DTYPE_U64, unsigned long long>(dst, src, k, n, op, d); return true;
    case SYMM_DTYPE_U8: symm_reduce_n_scalar<SYMM_DTYPE_U8, unsigned char>(dst, src, k, n, op, d); return true;
    default: return false;
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

static __device__ __forceinline__ char* symm_loc(const symm_interp_params& p, symm_u32 rank, symm_u32 buf,
                                                 symm_u64 off) {
  return p.base + (symm_u64)rank * p.stride + p.buf_off[buf < SYMM_BUFS ? buf : 0] + off;
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

extern "C" __global__ void __launch_bounds__(SYMM_THREADS) symm_interp(const symm_interp_params p) {
  const symm_u32 ch = blockIdx.x;
  const symm_u32 begin = p.chan_start[ch];
  const symm_u32 end = p.chan_start[ch + 1];
  __shared__ int stop;
#if SYMM_TRACE
  symm_u32 trace_len = 0;
#endif
  if (threadIdx.x == 0) stop = 0;
  __syncthreads();
  for (symm_u32 i = begin; i < end && !stop; i++) {
    const symm_u32 index = i - begin;
    const symm_plan_op op = p.plan[i];
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
        bool ok = symm_reduce_n_any(op.dtype, symm_loc(p, op.dst_rank, op.dst_buf, op.dst_off), src, k, op.count,
                                    op.redop, op.div);
        if (!ok && threadIdx.x == 0) {
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
          symm_fence();
          if (op.sigop == SYMM_SIGNAL_SET) {
            symm_st_signal(slot, op.count);
          } else {
            symm_red_signal(slot, op.count);
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
#if SYMM_TRACE
  if (threadIdx.x == 0 && p.trace_len) p.trace_len[ch] = trace_len;
#endif
}
