// Element semantics and the reductions of the plan interpreter: a binary reduce
// (SYMM_OP_REDUCE, symm_core::dtype::combine) and the fused k-way reduce (SYMM_OP_REDUCE_N,
// symm_core::dtype::fold), both over whole blocks with 16-byte vectors. Included by interp.cu
// (NVRTC is given it as the header "symm/reduce.cuh").
#pragma once

#include "symm/plan.cuh"
#include "symm/device.cuh"

// The dtypes whose reductions a kernel instantiates: every one by default; a compiled plan
// (driver/src/cuda/compiled.rs) defines SYMM_DTYPE_MASK to the bits of the dtypes its ops
// reduce, so NVRTC compiles only those. A dtype outside the mask is an op the kernel cannot
// run: the dispatch returns as for an unknown dtype (SYMM_STOP_BAD_OP).
#ifndef SYMM_DTYPE_MASK
#define SYMM_DTYPE_MASK 0xFFFFFFFFu
#endif
#define SYMM_DTYPE_ON(DT) ((((unsigned)(SYMM_DTYPE_MASK)) >> (DT)) & 1u)

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
    case SYMM_DTYPE_F32:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_F32)) {
        symm_reduce_block<SYMM_DTYPE_F32, float>(dst, a, b, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_F16:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_F16)) {
        symm_reduce_block<SYMM_DTYPE_F16, unsigned short>(dst, a, b, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_BF16:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_BF16)) {
        symm_reduce_block<SYMM_DTYPE_BF16, unsigned short>(dst, a, b, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_F64:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_F64)) {
        symm_reduce_block<SYMM_DTYPE_F64, double>(dst, a, b, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_I32:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_I32)) {
        symm_reduce_block<SYMM_DTYPE_I32, int>(dst, a, b, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_U32:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_U32)) {
        symm_reduce_block<SYMM_DTYPE_U32, unsigned>(dst, a, b, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_I64:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_I64)) {
        symm_reduce_block<SYMM_DTYPE_I64, long long>(dst, a, b, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_U64:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_U64)) {
        symm_reduce_block<SYMM_DTYPE_U64, unsigned long long>(dst, a, b, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_U8:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_U8)) {
        symm_reduce_block<SYMM_DTYPE_U8, unsigned char>(dst, a, b, n, op, d);
        return true;
      }
      return false;
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
  } else if (k <= 4) {
    // Two vectors of each of up to four sources in flight per thread.
    symm_reduce_n_block<DT, S, 2, 4>(dst, src, k, n, op, d);
  } else {
    symm_reduce_n_block<DT, S, 1, 8>(dst, src, k, n, op, d);
  }
}

// Returns false for an unknown dtype or a source count outside 1..=8.
static __device__ bool symm_reduce_n_any(int dtype, char* dst, const char* const* src, int k, symm_u64 n, int op,
                                         unsigned d) {
  if (k < 1 || k > 8) return false;
  switch (dtype) {
    case SYMM_DTYPE_F32:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_F32)) {
        symm_reduce_n_wide<SYMM_DTYPE_F32, float>(dst, src, k, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_F16:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_F16)) {
        symm_reduce_n_wide<SYMM_DTYPE_F16, unsigned short>(dst, src, k, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_BF16:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_BF16)) {
        symm_reduce_n_wide<SYMM_DTYPE_BF16, unsigned short>(dst, src, k, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_F64:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_F64)) {
        symm_reduce_n_scalar<SYMM_DTYPE_F64, double>(dst, src, k, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_I32:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_I32)) {
        symm_reduce_n_scalar<SYMM_DTYPE_I32, int>(dst, src, k, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_U32:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_U32)) {
        symm_reduce_n_scalar<SYMM_DTYPE_U32, unsigned>(dst, src, k, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_I64:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_I64)) {
        symm_reduce_n_scalar<SYMM_DTYPE_I64, long long>(dst, src, k, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_U64:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_U64)) {
        symm_reduce_n_scalar<SYMM_DTYPE_U64, unsigned long long>(dst, src, k, n, op, d);
        return true;
      }
      return false;
    case SYMM_DTYPE_U8:
      if constexpr (SYMM_DTYPE_ON(SYMM_DTYPE_U8)) {
        symm_reduce_n_scalar<SYMM_DTYPE_U8, unsigned char>(dst, src, k, n, op, d);
        return true;
      }
      return false;
    default: return false;
  }
}
