// Shared by moe.cu and a2av.cu: the layer's parameter block and state words, tagged header
// words, bounded waits that record a timeout, the last-block counter and warp copies.
#pragma once
#include "symm/plan.cuh"
#include "symm/device.cuh"
#include "symm/reduce.cuh"

#define SYMM_MOE_NONE 0xffffffffu
#define SYMM_MOE_SEND 1u
#define SYMM_MOE_RECV 2u
#define SYMM_MOE_MAX_WORLD 64
#define SYMM_MOE_CHUNK 32

// Local state words of a layer (u32).
#define SYMM_MOE_EPOCH_D 0
#define SYMM_MOE_EPOCH_C 1
#define SYMM_MOE_FIN_D 2
#define SYMM_MOE_FIN_C 3
#define SYMM_MOE_INVALID 4
#define SYMM_MOE_DROPPED 5
#define SYMM_MOE_FIN_A 6
#define SYMM_MOE_EPOCH_A 7
#define SYMM_MOE_STATE_WORDS 16

// `symm_moe_params` is generated into symm/plan.cuh from symm_kernels::abi::MoeParams.

static __device__ __forceinline__ symm_u32* symm_moe_u32(const symm_moe_params& p, symm_u64 off) {
  return (symm_u32*)symm_local(p.w, off);
}

static __device__ __forceinline__ symm_u64 symm_moe_tag(symm_u32 epoch, symm_u32 v) {
  return ((symm_u64)epoch << 32) | v;
}

// The owner rank of expert index `e`, or -1 (negative, or at or past `experts`).
static __device__ __forceinline__ int symm_moe_owner(const symm_moe_params& p, long long e) {
  if (e < 0 || e >= (long long)p.experts) return -1;
  return (int)((symm_u32)e / p.local);
}

static __device__ __forceinline__ unsigned long long symm_moe_mask(const symm_moe_params& p, symm_u32 t) {
  unsigned long long m = 0;
  for (symm_u32 k = 0; k < p.topk; k++) {
    int q = symm_moe_owner(p, p.idx[(symm_u64)t * p.topk + k]);
    if (q >= 0) m |= 1ull << q;
  }
  return m;
}

// Records a timeout (or an abort) once and raises the abort word, as the interpreter does.
static __device__ void symm_moe_late(const symm_moe_params& p, symm_u32 peer, symm_u32 word, symm_u64 want,
                                     symm_u64 seen) {
  const bool aborted = p.w.abort && *p.w.abort;
  if (p.record && p.record->reason == 0) {
    p.record->rank = p.w.rank;
    p.record->peer = peer;
    p.record->slot = word;
    p.record->expected = want;
    p.record->found = seen;
    p.record->op_index = 0;
    p.record->channel = SYMM_MAX_CHANNELS - 1;
    __threadfence_system();
    p.record->reason = aborted ? SYMM_STOP_ABORTED : SYMM_STOP_TIMEOUT;
    __threadfence_system();
  }
  if (p.w.abort) *(volatile symm_u32*)p.w.abort = 1;
}

// Waits until the local word at heap offset `off` carries `epoch`; false past the deadline.
static __device__ bool symm_moe_wait_tag(const symm_moe_params& p, symm_u64 off, symm_u32 epoch, symm_u32 peer,
                                         symm_u32 word, symm_u32* value) {
  const symm_u64* q = (const symm_u64*)symm_local(p.w, off);
  const symm_u64 bound = symm_wait_bound(p.deadline_ns);
  const symm_u64 start = symm_globaltimer();
  unsigned spins = 0;
  for (;;) {
    symm_u64 v = symm_ld_wait(q);
    if ((symm_u32)(v >> 32) == epoch) {
      *value = (symm_u32)v;
      return true;
    }
    if (((++spins & 255u) == 0) && ((p.w.abort && *p.w.abort) || symm_globaltimer() - start > bound)) {
      symm_moe_late(p, peer, word, symm_moe_tag(epoch, 0), v);
      return false;
    }
  }
}

// The block that finishes last among `gridDim.x` (counter `fin`) returns true, after an
// acquire that makes every block's writes, fenced at system scope before their arrival,
// visible to it; it resets the counter for the next launch.
static __device__ bool symm_moe_last_block(symm_u32* fin) {
  __shared__ int last;
  symm_fence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(fin, 1u) == gridDim.x - 1;
    if (last) *fin = 0;
  }
  __syncthreads();
  symm_fence();
  return last != 0;
}

// Copies `bytes` with the lanes of one warp (16-byte vectors where both ends allow).
static __device__ __forceinline__ void symm_moe_copy_warp(char* dst, const char* src, symm_u64 bytes) {
  symm_copy_strided(dst, src, bytes, threadIdx.x & 31u, 32);
}

