// Mixture-of-experts dispatch and combine (Comm::moe_dispatch, Comm::moe_combine).
//
// The layout and the protocol are symm_core::moe's (core/src/moe/mod.rs): tokens go once per
// destination rank into fixed staging slots (sender * tokens_max + slot), header words tagged
// with the call's epoch follow the rows, staging and headers live in two halves picked by the
// epoch's parity, and the receiver places entries into expert rows by prefix sums over the
// world x L matrix of expert counts. Every sum runs in the order core's reference uses, so the
// results are the host reference's bit for bit.
//
// Epochs live in the layer's own state words, so a CUDA graph replays the kernels unchanged:
// every block of a send part reads the epoch at its start, and the block that finishes last
// (a counter of finished blocks) publishes the headers and stores the new epoch.
//
// Every index read from memory another party wrote (expert indices from the user, counts and
// entries from peers) is checked against the layer's bounds before it addresses anything:
// invalid experts are skipped and counted, rows past the bounds are dropped and counted.
#include "symm/moe.cuh"

// ---------------------------------------------------------------------------------------------
// Dispatch.
// ---------------------------------------------------------------------------------------------

// Shared memory of the send part: per-rank and per-expert running counts, then the chunk's
// slots and eslots.
struct symm_moe_route_smem {
  symm_u32* pre_q;   // world
  symm_u32* pre_e;   // experts
  symm_u32* slot;    // SYMM_MOE_CHUNK x world
  symm_u32* eslot;   // SYMM_MOE_CHUNK x topk
};

// With `fresh`, counts tokens [0, t0) into pre_q (once per destination) and pre_e (every valid
// entry); otherwise pre_q / pre_e already hold those counts (the previous chunk's totals).
// Then assigns slots and eslots to tokens [t0, t1) in order with one warp, leaving totals over
// [0, t1) in pre_q / pre_e. Returns the invalid entries of [t0, t1).
static __device__ symm_u32 symm_moe_route(const symm_moe_params& p, symm_moe_route_smem s, symm_u32 t0,
                                          symm_u32 t1, bool fresh) {
  const symm_u32 W = p.w.world, K = p.topk;
  if (fresh) {
    for (symm_u32 i = threadIdx.x; i < W; i += blockDim.x) s.pre_q[i] = 0;
    for (symm_u32 i = threadIdx.x; i < p.experts; i += blockDim.x) s.pre_e[i] = 0;
  }
  __syncthreads();
  const symm_u32 lane = threadIdx.x & 31u;
  // Counting pass, entries flattened, warp-aggregated so one hot expert costs little.
  const symm_u64 entries = fresh ? (symm_u64)t0 * K : 0;
  for (symm_u64 base = (threadIdx.x & ~31u); base < entries; base += blockDim.x) {
    const symm_u64 i = base + lane;
    long long e = i < entries ? p.idx[i] : -1;
    if (e >= (long long)p.experts) e = -1;
    const unsigned m = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && lane == (symm_u32)(__ffs(m) - 1)) atomicAdd(&s.pre_e[e], (symm_u32)__popc(m));
  }
  for (symm_u32 base = (threadIdx.x & ~31u); fresh && base < t0; base += blockDim.x) {
    const symm_u32 t = base + lane;
    const unsigned long long mask = t < t0 ? symm_moe_mask(p, t) : 0;
    for (symm_u32 q = 0; q < W; q++) {
      const unsigned b = __ballot_sync(0xffffffffu, (mask >> q) & 1);
      if (lane == 0 && b) atomicAdd(&s.pre_q[q], (symm_u32)__popc(b));
    }
  }
  __syncthreads();
  symm_u32 invalid = 0;
  if (threadIdx.x < 32) {
    const unsigned lt = (1u << lane) - 1;
    for (symm_u32 base = t0; base < t1; base += 32) {
      const symm_u32 t = base + lane;
      const unsigned long long mask = t < t1 ? symm_moe_mask(p, t) : 0;
      for (symm_u32 q = 0; q < W; q++) {
        const bool has = (mask >> q) & 1;
        const unsigned b = __ballot_sync(0xffffffffu, has);
        if (t < t1) s.slot[(t - t0) * W + q] = has ? s.pre_q[q] + __popc(b & lt) : SYMM_MOE_NONE;
        __syncwarp();
        if (lane == 0) s.pre_q[q] += __popc(b);
        __syncwarp();
      }
    }
    const symm_u64 e0 = (symm_u64)t0 * K, e1 = (symm_u64)t1 * K;
    for (symm_u64 base = e0; base < e1; base += 32) {
      const symm_u64 i = base + lane;
      long long e = i < e1 ? p.idx[i] : -1;
      if (i < e1 && e >= (long long)p.experts) invalid++;
      if (e >= (long long)p.experts) e = -1;
      const unsigned m = __match_any_sync(0xffffffffu, e);
      const symm_u32 before = e >= 0 ? s.pre_e[e] : 0;
      if (i < e1) s.eslot[i - e0] = e >= 0 ? before + __popc(m & lt) : SYMM_MOE_NONE;
      __syncwarp();
      if (e >= 0 && lane == (symm_u32)(__ffs(m) - 1)) s.pre_e[e] = before + __popc(m);
      __syncwarp();
    }
  }
  __syncthreads();
  return invalid;
}

// The send part of a dispatch: rows, then (last block) the headers.
static __device__ void symm_moe_dispatch_send(const symm_moe_params& p, symm_u32 epoch, symm_moe_route_smem s) {
  const symm_u32 W = p.w.world, K = p.topk, me = p.w.rank;
  const symm_u32 per = (p.tokens + gridDim.x - 1) / gridDim.x;
  symm_u32* state = symm_moe_u32(p, p.state);
  symm_u32* slots = symm_moe_u32(p, p.slots);
  // Block b owns tokens [b0, b1), routed a chunk at a time (at least once: the block whose
  // range ends the tokens leaves the totals, even when its range is empty).
  const symm_u32 b0 = min(p.tokens, blockIdx.x * per), b1 = min(p.tokens, b0 + per);
  symm_u32 lo = b0;
  do {
    const symm_u32 hi = min(b1, lo + SYMM_MOE_CHUNK);
    const symm_u32 invalid = symm_moe_route(p, s, lo, hi, lo == b0);
    if (threadIdx.x < 32) {
      const symm_u32 all = __reduce_add_sync(0xffffffffu, invalid);
      if (threadIdx.x == 0 && all) atomicAdd(&state[SYMM_MOE_INVALID], all);
    }
    for (symm_u32 i = threadIdx.x; i < (hi - lo) * W; i += blockDim.x) slots[(symm_u64)lo * W + i] = s.slot[i];
    // The block whose range ends the tokens leaves the totals for the last block.
    if (blockIdx.x == gridDim.x - 1 && hi == p.tokens) {
      symm_u32* totals = symm_moe_u32(p, p.totals);
      for (symm_u32 i = threadIdx.x; i < W; i += blockDim.x) totals[i] = s.pre_q[i];
      for (symm_u32 i = threadIdx.x; i < p.experts; i += blockDim.x) totals[W + i] = s.pre_e[i];
    }
    // One warp per (token, destination) pair: the data, then the entries.
    const symm_u32 warp = threadIdx.x >> 5, warps = blockDim.x >> 5, lane = threadIdx.x & 31u;
    const symm_u64 half = (symm_u64)(epoch & 1) * (symm_u64)W * p.tokens_max;
    for (symm_u32 pair = warp; pair < (hi - lo) * W; pair += warps) {
      const symm_u32 t = lo + pair / W, q = pair % W;
      const symm_u32 slot = s.slot[pair];
      if (slot == SYMM_MOE_NONE || slot >= p.tokens_max) continue;
      const symm_u64 row = half + (symm_u64)me * p.tokens_max + slot;
      char* dst = (char*)symm_ptr(p.w, q, p.stage + row * p.row_bytes);
      const symm_u64 bytes = (symm_u64)p.hidden * p.elem;
      const char* src = (const char*)p.x + (symm_u64)t * bytes;
      symm_moe_copy_warp(dst, src, bytes);
      symm_u32* ent = (symm_u32*)(dst + p.data_bytes);
      for (symm_u32 k = lane; k < K; k += 32) {
        const long long e = p.idx[(symm_u64)t * K + k];
        const bool here = symm_moe_owner(p, e) == (int)q;
        ent[3 * k] = here ? (symm_u32)e % p.local : SYMM_MOE_NONE;
        ent[3 * k + 1] = here ? s.eslot[(t - lo) * K + k] : SYMM_MOE_NONE;
        ent[3 * k + 2] = __float_as_uint(p.weights[(symm_u64)t * K + k]);
      }
      __syncwarp();
    }
    __syncthreads();
    lo = hi;
  } while (lo < b1);
  if (!symm_moe_last_block(&state[SYMM_MOE_FIN_D])) return;
  const symm_u32* totals = symm_moe_u32(p, p.totals);
  const symm_u32 hw = 1 + p.local;
  for (symm_u32 i = threadIdx.x; i < W * hw; i += blockDim.x) {
    const symm_u32 q = i / hw, j = i % hw;
    const symm_u32 v = j == 0 ? totals[q] : totals[W + q * p.local + j - 1];
    symm_u64* word = (symm_u64*)symm_ptr(p.w, q, p.hdr + 8 * (((symm_u64)(epoch & 1) * W + me) * hw + j));
    symm_st_signal(word, symm_moe_tag(epoch, v));
  }
  __syncthreads();
  if (threadIdx.x == 0) state[SYMM_MOE_EPOCH_D] = epoch;
}

// The receive part: every header, the expert rows' prefix sums, then the fan-out.
static __device__ void symm_moe_dispatch_recv(const symm_moe_params& p, symm_u32 epoch, symm_u32* sm) {
  const symm_u32 W = p.w.world, K = p.topk, L = p.local;
  const symm_u32 hw = 1 + L;
  symm_u32* cin = sm;            // W
  symm_u32* ec = sm + W;         // W x L
  symm_u32* rowbase = ec + W * L;  // W x L
  __shared__ int late;
  if (threadIdx.x == 0) late = 0;
  __syncthreads();
  for (symm_u32 i = threadIdx.x; i < W * hw; i += blockDim.x) {
    const symm_u32 src = i / hw, j = i % hw;
    symm_u32 v = 0;
    const symm_u64 off = p.hdr + 8 * (((symm_u64)(epoch & 1) * W + src) * hw + j);
    if (!symm_moe_wait_tag(p, off, epoch, src, (symm_u32)(off / 8), &v)) {
      late = 1;
      v = 0;
    }
    if (j == 0) cin[src] = min(v, p.tokens_max);
    else ec[src * L + j - 1] = v;
  }
  __syncthreads();
  if (late) return;
  // rowbase[src][j] = sum over experts j' < j of every sender's count + senders before src.
  for (symm_u32 i = threadIdx.x; i < W * L; i += blockDim.x) {
    const symm_u32 src = i / L, j = i % L;
    symm_u64 b = 0;
    for (symm_u32 jj = 0; jj < j; jj++)
      for (symm_u32 pp = 0; pp < W; pp++) b += ec[pp * L + jj];
    for (symm_u32 pp = 0; pp < src; pp++) b += ec[pp * L + j];
    rowbase[i] = b > 0xffffffffull ? 0xffffffffu : (symm_u32)b;
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    symm_u32* cin_out = symm_moe_u32(p, p.cin);
    for (symm_u32 i = threadIdx.x; i < W; i += blockDim.x) cin_out[i] = cin[i];
    symm_u32* spans = symm_moe_u32(p, p.spans);
    for (symm_u32 j = threadIdx.x; j < L; j += blockDim.x) {
      symm_u64 base = 0, n = 0;
      for (symm_u32 jj = 0; jj < j; jj++)
        for (symm_u32 pp = 0; pp < W; pp++) base += ec[pp * L + jj];
      for (symm_u32 pp = 0; pp < W; pp++) n += ec[pp * L + j];
      const symm_u64 lo = base < p.rows_max ? base : p.rows_max;
      const symm_u64 hi = base + n < p.rows_max ? base + n : p.rows_max;
      spans[2 * j] = (symm_u32)lo;
      spans[2 * j + 1] = (symm_u32)(hi - lo);
    }
  }
  // The entries: each (staging row, k) gets its expert row (or none) and weight for combine.
  const symm_u64 gt = (symm_u64)blockIdx.x * blockDim.x + threadIdx.x;
  const symm_u64 gstride = (symm_u64)gridDim.x * blockDim.x;
  const symm_u64 half = (symm_u64)(epoch & 1) * (symm_u64)W * p.tokens_max;
  const symm_u64 rows = (symm_u64)W * p.tokens_max;
  const symm_u64 bytes = (symm_u64)p.hidden * p.elem;
  symm_u32* cmeta = symm_moe_u32(p, p.cmeta);
  symm_u32 dropped = 0;
  for (symm_u64 u = gt; u < rows * K; u += gstride) {
    const symm_u64 r = u / K;
    const symm_u32 k = (symm_u32)(u % K);
    const symm_u32 src = (symm_u32)(r / p.tokens_max), s = (symm_u32)(r % p.tokens_max);
    if (s >= cin[src]) continue;
    const symm_u32* ent = (const symm_u32*)((const char*)symm_local(p.w, p.stage + (half + r) * p.row_bytes) + p.data_bytes);
    const symm_u32 j = ent[3 * k], es = ent[3 * k + 1];
    symm_u32 at = SYMM_MOE_NONE;
    if (j < L && es != SYMM_MOE_NONE) {
      const symm_u64 x = (symm_u64)rowbase[src * L + j] + es;
      if (x < p.rows_max) at = (symm_u32)x;
      else dropped++;
    }
    cmeta[2 * u] = at;
    cmeta[2 * u + 1] = ent[3 * k + 2];
  }
  if (dropped) atomicAdd(&symm_moe_u32(p, p.state)[SYMM_MOE_DROPPED], dropped);
  // The data: a thread takes 16 bytes of a staging row and stores them into every expert row
  // of the row's entries here (one warp per row when rows are not whole 16-byte vectors).
  if ((bytes & 15) == 0) {
    const symm_u64 nvec = bytes >> 4;
    for (symm_u64 u = gt; u < rows * nvec; u += gstride) {
      const symm_u64 r = u / nvec, v = u % nvec;
      const symm_u32 src = (symm_u32)(r / p.tokens_max), s = (symm_u32)(r % p.tokens_max);
      if (s >= cin[src]) continue;
      const char* row = (const char*)symm_local(p.w, p.stage + (half + r) * p.row_bytes);
      const symm_u32* ent = (const symm_u32*)(row + p.data_bytes);
      const uint4 d = ((const uint4*)row)[v];
      for (symm_u32 k = 0; k < K; k++) {
        const symm_u32 j = ent[3 * k], es = ent[3 * k + 1];
        if (j >= L || es == SYMM_MOE_NONE) continue;
        const symm_u64 x = (symm_u64)rowbase[src * L + j] + es;
        if (x < p.rows_max) ((uint4*)symm_local(p.w, p.xout + x * bytes))[v] = d;
      }
    }
    return;
  }
  const symm_u32 warp = (symm_u32)(gt >> 5), warps = (symm_u32)(gstride >> 5);
  for (symm_u64 r = warp; r < rows; r += warps) {
    const symm_u32 src = (symm_u32)(r / p.tokens_max), s = (symm_u32)(r % p.tokens_max);
    if (s >= cin[src]) continue;
    const char* row = (const char*)symm_local(p.w, p.stage + (half + r) * p.row_bytes);
    const symm_u32* ent = (const symm_u32*)(row + p.data_bytes);
    for (symm_u32 k = 0; k < K; k++) {
      const symm_u32 j = ent[3 * k], es = ent[3 * k + 1];
      if (j >= L || es == SYMM_MOE_NONE) continue;
      const symm_u64 x = (symm_u64)rowbase[src * L + j] + es;
      if (x < p.rows_max) symm_moe_copy_warp((char*)symm_local(p.w, p.xout + x * bytes), row, bytes);
    }
    __syncwarp();
  }
}

extern "C" __global__ void __launch_bounds__(512, 2) symm_moe_dispatch(symm_moe_params p) {
  extern __shared__ symm_u32 smem[];
  if (p.w.world > SYMM_MOE_MAX_WORLD) return;
  symm_u32* state = symm_moe_u32(p, p.state);
  symm_u32 epoch;
  if (p.phase & SYMM_MOE_SEND) {
    epoch = state[SYMM_MOE_EPOCH_D] + 1;
    symm_moe_route_smem s;
    s.pre_q = smem;
    s.pre_e = smem + p.w.world;
    s.slot = s.pre_e + p.experts;
    s.eslot = s.slot + SYMM_MOE_CHUNK * p.w.world;
    symm_moe_dispatch_send(p, epoch, s);
  } else {
    epoch = state[SYMM_MOE_EPOCH_D];
  }
  if (p.phase & SYMM_MOE_RECV) symm_moe_dispatch_recv(p, epoch, smem);
}

// ---------------------------------------------------------------------------------------------
// Combine.
// ---------------------------------------------------------------------------------------------

static __device__ __forceinline__ float symm_moe_load(const void* base, symm_u32 elem, symm_u64 i) {
  if (elem == 2) return symm_bf16_to_f32(((const unsigned short*)base)[i]);
  return ((const float*)base)[i];
}

// Eight elements of `row` from element `i` (16 bytes of bf16, or two 16-byte f32 loads),
// widened to f32.
static __device__ __forceinline__ void symm_moe_load8(const char* row, symm_u32 elem, symm_u64 i, float* v) {
  if (elem == 2) {
    const uint4 u = *(const uint4*)(row + i * 2);
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
    for (int j = 0; j < 4; j++) {
      v[2 * j] = symm_bf16_to_f32((unsigned short)(w[j] & 0xffffu));
      v[2 * j + 1] = symm_bf16_to_f32((unsigned short)(w[j] >> 16));
    }
  } else {
    const float4 a = *(const float4*)(row + i * 4), b = *(const float4*)(row + i * 4 + 16);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
}

// Send part: one f32 partial per staging row to its sender, then (last block) the headers.
// Fused multiply-adds in ascending k, from 0.
static __device__ void symm_moe_combine_send(const symm_moe_params& p, symm_u32 epoch) {
  const symm_u32 W = p.w.world, K = p.topk, me = p.w.rank;
  const symm_u32* cin = symm_moe_u32(p, p.cin);
  const symm_u32* cmeta = symm_moe_u32(p, p.cmeta);
  symm_u32* state = symm_moe_u32(p, p.state);
  const symm_u32 warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const symm_u32 warps = gridDim.x * (blockDim.x >> 5), lane = threadIdx.x & 31u;
  const symm_u64 half = (symm_u64)(epoch & 1) * (symm_u64)W * p.tokens_max;
  const symm_u64 rowb = (symm_u64)p.hidden * p.elem;
  const bool wide = (p.hidden % 8) == 0 && (((symm_u64)p.expert_out) & 15) == 0;
  if (wide) {
    // A thread takes eight elements of a row: K loads in flight across threads, not a chain
    // per warp.
    const symm_u64 nvec = p.hidden / 8, rows = (symm_u64)W * p.tokens_max;
    for (symm_u64 u = (symm_u64)blockIdx.x * blockDim.x + threadIdx.x; u < rows * nvec;
         u += (symm_u64)gridDim.x * blockDim.x) {
      const symm_u64 r = u / nvec, h = (u % nvec) * 8;
      const symm_u32 src = (symm_u32)(r / p.tokens_max), s = (symm_u32)(r % p.tokens_max);
      if (s >= min(cin[src], p.tokens_max)) continue;
      float* dst = (float*)symm_ptr(p.w, src, p.cstage + (half + (symm_u64)me * p.tokens_max + s) * p.pbytes);
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (symm_u32 k = 0; k < K; k++) {
        const symm_u32 at = cmeta[2 * (r * K + k)];
        if (at >= p.rows_max) continue;
        const float wt = __uint_as_float(cmeta[2 * (r * K + k) + 1]);
        float v[8];
        symm_moe_load8((const char*)p.expert_out + (symm_u64)at * rowb, p.elem, h, v);
        for (int j = 0; j < 8; j++) acc[j] = fmaf(wt, v[j], acc[j]);
      }
      *(float4*)(dst + h) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      *(float4*)(dst + h + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
  }
  for (symm_u64 r = warp; r < (symm_u64)W * p.tokens_max && !wide; r += warps) {
    const symm_u32 src = (symm_u32)(r / p.tokens_max), s = (symm_u32)(r % p.tokens_max);
    if (s >= min(cin[src], p.tokens_max)) continue;
    float* dst = (float*)symm_ptr(p.w, src, p.cstage + (half + (symm_u64)me * p.tokens_max + s) * p.pbytes);
    for (symm_u32 h = lane; h < p.hidden; h += 32) {
      float acc = 0.0f;
      for (symm_u32 k = 0; k < K; k++) {
        const symm_u32 at = cmeta[2 * (r * K + k)];
        if (at >= p.rows_max) continue;
        const float wt = __uint_as_float(cmeta[2 * (r * K + k) + 1]);
        acc = fmaf(wt, symm_moe_load(p.expert_out, p.elem, (symm_u64)at * p.hidden + h), acc);
      }
      dst[h] = acc;
    }
  }
  if (!symm_moe_last_block(&state[SYMM_MOE_FIN_C])) return;
  for (symm_u32 q = threadIdx.x; q < W; q += blockDim.x) {
    symm_u64* word = (symm_u64*)symm_ptr(p.w, q, p.chdr + 8 * ((symm_u64)(epoch & 1) * W + me));
    symm_st_signal(word, symm_moe_tag(epoch, min(cin[q], p.tokens_max)));
  }
  __syncthreads();
  if (threadIdx.x == 0) state[SYMM_MOE_EPOCH_C] = epoch;
}

// Receive part: every header, then each token's partials summed in ascending rank order.
static __device__ void symm_moe_combine_recv(const symm_moe_params& p, symm_u32 epoch) {
  const symm_u32 W = p.w.world;
  __shared__ int late;
  if (threadIdx.x == 0) late = 0;
  __syncthreads();
  for (symm_u32 q = threadIdx.x; q < W; q += blockDim.x) {
    symm_u32 v = 0;
    const symm_u64 off = p.chdr + 8 * ((symm_u64)(epoch & 1) * W + q);
    if (!symm_moe_wait_tag(p, off, epoch, q, (symm_u32)(off / 8), &v)) late = 1;
  }
  __syncthreads();
  if (late) return;
  const symm_u32* slots = symm_moe_u32(p, p.slots);
  const symm_u64 half = (symm_u64)(epoch & 1) * (symm_u64)W * p.tokens_max;
  // Eight elements per thread when rows allow (a token's partials as float4 pairs).
  const symm_u32 per = (p.hidden % 8) == 0 && (((symm_u64)p.out) & 15) == 0 ? 8 : 1;
  const symm_u64 n = (symm_u64)p.tokens * p.hidden / per;
  for (symm_u64 i = (symm_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (symm_u64)gridDim.x * blockDim.x) {
    const symm_u64 t = i * per / p.hidden, h = i * per % p.hidden;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (symm_u32 q = 0; q < W; q++) {
      const symm_u32 s = slots[t * W + q];
      if (s >= p.tokens_max) continue;
      const float* row = (const float*)symm_local(p.w, p.cstage + (half + (symm_u64)q * p.tokens_max + s) * p.pbytes);
      if (per == 8) {
        const float4 a = *(const float4*)(row + h), b = *(const float4*)(row + h + 4);
        acc[0] = acc[0] + a.x, acc[1] = acc[1] + a.y, acc[2] = acc[2] + a.z, acc[3] = acc[3] + a.w;
        acc[4] = acc[4] + b.x, acc[5] = acc[5] + b.y, acc[6] = acc[6] + b.z, acc[7] = acc[7] + b.w;
      } else {
        acc[0] = acc[0] + row[h];
      }
    }
    for (symm_u32 j = 0; j < per; j++) {
      if (p.elem == 2) ((unsigned short*)p.out)[t * p.hidden + h + j] = symm_f32_to_bf16(acc[j]);
      else ((float*)p.out)[t * p.hidden + h + j] = acc[j];
    }
  }
}

extern "C" __global__ void __launch_bounds__(512, 2) symm_moe_combine(symm_moe_params p) {
  if (p.w.world > SYMM_MOE_MAX_WORLD) return;
  symm_u32* state = symm_moe_u32(p, p.state);
  symm_u32 epoch;
  if (p.phase & SYMM_MOE_SEND) {
    epoch = state[SYMM_MOE_EPOCH_C] + 1;
    symm_moe_combine_send(p, epoch);
  } else {
    epoch = state[SYMM_MOE_EPOCH_C];
  }
  if (p.phase & SYMM_MOE_RECV) symm_moe_combine_recv(p, epoch);
}
