// The low-latency protocol on the GPU (core's ll module): lines that carry their own flag, in
// 16-byte and 128-byte formats, their puts, polls and reduces, and one op family over both.
// Included by ops.cuh after symm_record and signature.cuh.
#pragma once

// ---------------------------------------------------------------------------------------------
// The low-latency protocol in 16-byte lines (SYMM_LL_FORMAT_LL): core's ll module. A line is
// 16 bytes [d0 flag d1 flag]; each 8-byte half is one store, so a reader that sees the flag in
// a half also sees that half's data. Lines are written with volatile stores and polled with
// volatile loads: no fence and no signal, the flags are the signal.
// ---------------------------------------------------------------------------------------------

static __device__ __forceinline__ unsigned symm_ll_flag(symm_u64 e) {
  return (unsigned)(e % 0xFFFFFFFFull) + 1u;
}

static __device__ __forceinline__ void symm_ll_store(char* line, symm_u64 h0, symm_u64 h1) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(line), "l"(h0), "l"(h1) : "memory");
}

static __device__ __forceinline__ void symm_ll_load(const char* line, symm_u64& h0, symm_u64& h1) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(h0), "=l"(h1) : "l"(line) : "memory");
}

// `bytes` of src as lines at dst (the last line padded with zero bytes). Each thread loads
// SYMM_LL_U lines' data before it stores any, so the loads overlap.
#define SYMM_LL_U 4
static __device__ __forceinline__ symm_u64 symm_ll_data(const char* src, symm_u64 bytes, symm_u64 i) {
  const symm_u64 at = i * 8;
  symm_u64 v = 0;
  if (at + 8 <= bytes && (((symm_u64)src + at) & 7) == 0) {
    v = *(const symm_u64*)(src + at);
  } else {
    for (int j = 0; j < 8 && at + j < bytes; j++) v |= (symm_u64)(unsigned char)src[at + j] << (8 * j);
  }
  return v;
}

static __device__ void symm_ll_put(char* dst, const char* src, symm_u64 bytes, unsigned flag) {
  const symm_u64 lines = (bytes + 7) / 8;
  const symm_u64 f = (symm_u64)flag << 32;
  const symm_u64 n = blockDim.x;
  for (symm_u64 i = threadIdx.x; i < lines; i += SYMM_LL_U * n) {
    symm_u64 v[SYMM_LL_U];
#pragma unroll
    for (int u = 0; u < SYMM_LL_U; u++) {
      if (i + u * n < lines) v[u] = symm_ll_data(src, bytes, i + u * n);
    }
#pragma unroll
    for (int u = 0; u < SYMM_LL_U; u++) {
      if (i + u * n < lines) symm_ll_store(dst + (i + u * n) * 16, (v[u] & 0xFFFFFFFFull) | f, (v[u] >> 32) | f);
    }
  }
}

// Every 1024th spin of a line poll: false when the launch must stop (another thread of the
// block stopped it, the abort word is up, or this poll passed the deadline: then the first
// thread to stop records it, naming the flag `found`).
static __device__ bool symm_ll_keep_polling(const symm_interp_params& p, unsigned& spins, symm_u64& start,
                                            unsigned flag, unsigned found, symm_u32 slot, symm_u32 index,
                                            volatile int* stop) {
  if ((++spins & 1023u) != 0) return true;
  const symm_u64 now = symm_globaltimer();
  if (start == 0) start = now;
  if (*stop) return false;
  if (symm_sig_differs(p, 0, 1, stop)) return false;
  if (*p.abort_word) {
    if (atomicExch((int*)stop, 1) == 0) symm_record(p, SYMM_STOP_ABORTED, slot, flag, found, index);
    return false;
  }
  if (now - start > p.timeout_ns) {
    if (atomicExch((int*)stop, 1) == 0) {
      symm_record(p, SYMM_STOP_TIMEOUT, slot, flag, found, index);
      *p.abort_word = 1;
      __threadfence_system();
    }
    return false;
  }
  return true;
}

// Waits until the line at `line` carries `flag` in both halves; false when the launch stops
// (this thread timed out or saw the abort word, or another thread of the block did). A watched
// word is loaded beside every poll of the line.
static __device__ __forceinline__ bool symm_ll_poll(const symm_interp_params& p, const char* line, unsigned flag,
                                                    symm_u64& h0, symm_u64& h1, symm_u32 slot, symm_u32 index,
                                                    volatile int* stop, symm_sig_watch& sw) {
  unsigned spins = 0;
  symm_u64 start = 0;
  for (;;) {
    symm_ll_load(line, h0, h1);
    symm_sig_watch_load(sw);
    if ((unsigned)(h0 >> 32) == flag && (unsigned)(h1 >> 32) == flag) return true;
    const unsigned found = (unsigned)(((unsigned)(h0 >> 32) != flag ? h0 : h1) >> 32);
    if (!symm_ll_keep_polling(p, spins, start, flag, found, slot, index, stop)) return false;
  }
}

// Folds the k regions' lines (region s at src + s * stride) into n elements at dst. Each
// thread takes SYMM_LL_U lines at once: one load of each per source is in flight before any
// line is waited for, and only lines without the flag yet are polled. The last warp's threads
// load their peer's signature word beside the lines (symm_sig_watch) until one shows it.
template <int DT, class S>
static __device__ void symm_ll_reduce_t(const symm_interp_params& p, char* dst, const char* src, symm_u64 stride,
                                        int k, symm_u64 n, int op, unsigned d, unsigned flag, symm_u32 slot,
                                        symm_u32 index, volatile int* stop) {
  typedef symm_fold<DT, S> F;
  constexpr int E = 8 / sizeof(S);
  const symm_u64 bytes = n * sizeof(S);
  const symm_u64 lines = (bytes + 7) / 8;
  const symm_u64 lanes = blockDim.x;
  // One source and no division is a copy of the data's bits (symm_core::dtype::fold).
  const bool copy = k == 1 && d <= 1;
  symm_sig_watch sw = symm_sig_watch_start(p);
  for (symm_u64 i = threadIdx.x; i < lines; i += SYMM_LL_U * lanes) {
    typename F::acc a[SYMM_LL_U][E];
    symm_u64 raw[SYMM_LL_U];
    for (int s = 0; s < k; s++) {
      const char* region = src + (symm_u64)s * stride;
      symm_u64 h[SYMM_LL_U][2];
#pragma unroll
      for (int u = 0; u < SYMM_LL_U; u++) {
        if (i + u * lanes < lines) symm_ll_load(region + (i + u * lanes) * 16, h[u][0], h[u][1]);
      }
      symm_sig_watch_load(sw);
#pragma unroll
      for (int u = 0; u < SYMM_LL_U; u++) {
        const symm_u64 line = i + u * lanes;
        if (line >= lines) continue;
        if ((unsigned)(h[u][0] >> 32) != flag || (unsigned)(h[u][1] >> 32) != flag) {
          if (!symm_ll_poll(p, region + line * 16, flag, h[u][0], h[u][1], slot, index, stop, sw)) return;
        }
        const symm_u64 v = (h[u][0] & 0xFFFFFFFFull) | (h[u][1] << 32);
        raw[u] = v;
        const S* x = (const S*)&v;
#pragma unroll
        for (int e = 0; e < E; e++) a[u][e] = s == 0 ? F::widen(x[e]) : F::step(a[u][e], x[e], op);
      }
    }
    symm_sig_watch_again(sw);
#pragma unroll
    for (int u = 0; u < SYMM_LL_U; u++) {
      const symm_u64 line = i + u * lanes;
      if (line >= lines) continue;
      S* o = (S*)dst + line * E;
      const S* x = (const S*)&raw[u];
#pragma unroll
      for (int e = 0; e < E; e++) {
        if (line * E + e < n) o[e] = copy ? x[e] : F::finish(a[u][e], d);
      }
    }
    if (symm_sig_watch_settle(p, sw, stop)) return;
  }
}

// ---------------------------------------------------------------------------------------------
// 128-byte lines (SYMM_LL_FORMAT_LL128): core's ll module, Format::Ll128.
// Words 0-14 of a line carry data word 15 * line + w, word 15 the call's flag. A warp takes two
// lines at a time, a word a lane (lanes 15 and 31 hold the flags). The writer stores its lines'
// data words, syncs the warp (bar.warp.sync orders the lanes' stores before what follows it),
// and its flag lanes release the flags: one system fence for the warp, then the flag stores
// (the PTX release pattern). The reader's flag lanes load the flags with acquire until they
// carry the call's flag, sync the warp, and only then do the lanes load the data words. Data
// words past the data are neither written nor read.
// ---------------------------------------------------------------------------------------------

#define SYMM_LL128_PUT_U 8
#define SYMM_LL128_RED_U 4

static __device__ void symm_ll128_put(char* dst, const char* src, symm_u64 bytes, unsigned flag) {
  const symm_u64 lines = (bytes + 119) / 120;
  const unsigned lane = threadIdx.x & 31u, w = lane & 15u;
  const symm_u64 warps = blockDim.x >> 5;
  for (symm_u64 base = (symm_u64)(threadIdx.x >> 5) * 2 * SYMM_LL128_PUT_U; base < lines;
       base += warps * 2 * SYMM_LL128_PUT_U) {
#pragma unroll
    for (int u = 0; u < SYMM_LL128_PUT_U; u++) {
      const symm_u64 line = base + 2 * u + (lane >> 4);
      const symm_u64 dw = line * 15 + w;
      if (w < 15 && line < lines && dw * 8 < bytes) {
        const symm_u64 v = symm_ll_data(src, bytes, dw);
        asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(dst + line * 128 + w * 8), "l"(v) : "memory");
      }
    }
    __syncwarp();
    if (w == 15 && base + (lane >> 4) < lines) {
      asm volatile("fence.acq_rel.sys;" ::: "memory");
#pragma unroll
      for (int u = 0; u < SYMM_LL128_PUT_U; u++) {
        const symm_u64 line = base + 2 * u + (lane >> 4);
        if (line < lines) {
          asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(dst + line * 128 + 120), "l"((symm_u64)flag)
                       : "memory");
        }
      }
    }
  }
}

// Waits until the flag word at `f` is `flag` (acquire loads); false when the launch stops.
static __device__ bool symm_ll128_wait(const symm_interp_params& p, const char* f, unsigned flag, symm_u32 slot,
                                       symm_u32 index, volatile int* stop) {
  unsigned spins = 0;
  symm_u64 start = 0;
  for (;;) {
    symm_u64 v;
    asm volatile("ld." SYMM_SEM_LL128_OBSERVE ".sys.global.u64 %0, [%1];" : "=l"(v) : "l"(f) : "memory");
    if (v == (symm_u64)flag) return true;
    if (!symm_ll_keep_polling(p, spins, start, flag, (unsigned)v, slot, index, stop)) return false;
  }
}

// Folds the k regions' 128-byte lines (region s at src + s * stride) into n elements at dst,
// as symm_ll_reduce_t does for 16-byte lines.
template <int DT, class S>
static __device__ void symm_ll128_reduce_t(const symm_interp_params& p, char* dst, const char* src, symm_u64 stride,
                                           int k, symm_u64 n, int op, unsigned d, unsigned flag, symm_u32 slot,
                                           symm_u32 index, volatile int* stop) {
  typedef symm_fold<DT, S> F;
  constexpr int E = 8 / sizeof(S);
  const symm_u64 bytes = n * sizeof(S);
  const symm_u64 lines = (bytes + 119) / 120;
  const unsigned lane = threadIdx.x & 31u, w = lane & 15u;
  const symm_u64 warps = blockDim.x >> 5;
  const bool copy = k == 1 && d <= 1;
  symm_sig_watch sw = symm_sig_watch_start(p);
  for (symm_u64 base = (symm_u64)(threadIdx.x >> 5) * 2 * SYMM_LL128_RED_U; base < lines;
       base += warps * 2 * SYMM_LL128_RED_U) {
    typename F::acc a[SYMM_LL128_RED_U][E];
    symm_u64 raw[SYMM_LL128_RED_U];
    for (int s = 0; s < k; s++) {
      const char* region = src + (symm_u64)s * stride;
      bool ok = true;
      if (w == 15) {
#pragma unroll
        for (int u = 0; u < SYMM_LL128_RED_U; u++) {
          const symm_u64 line = base + 2 * u + (lane >> 4);
          if (ok && line < lines) ok = symm_ll128_wait(p, region + line * 128 + 120, flag, slot, index, stop);
        }
      }
      // Every lane of the warp leaves together, so the warp's syncs stay matched.
      if (__any_sync(0xffffffffu, !ok)) return;
      __syncwarp();
      // Every region's flags seen (acquire): the word of a peer that wrote one of these
      // regions, stored before its first line, is visible; its load goes beside the data's.
      if (s == k - 1) symm_sig_watch_load(sw);
#pragma unroll
      for (int u = 0; u < SYMM_LL128_RED_U; u++) {
        const symm_u64 line = base + 2 * u + (lane >> 4);
        const symm_u64 dw = line * 15 + w;
        if (w < 15 && line < lines && dw * 8 < bytes) {
          symm_u64 v;
          asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(region + line * 128 + w * 8) : "memory");
          raw[u] = v;
          const S* x = (const S*)&v;
#pragma unroll
          for (int e = 0; e < E; e++) a[u][e] = s == 0 ? F::widen(x[e]) : F::step(a[u][e], x[e], op);
        }
      }
    }
    symm_sig_watch_again(sw);
#pragma unroll
    for (int u = 0; u < SYMM_LL128_RED_U; u++) {
      const symm_u64 line = base + 2 * u + (lane >> 4);
      const symm_u64 dw = line * 15 + w;
      if (w < 15 && line < lines && dw * 8 < bytes) {
        S* o = (S*)dst + dw * E;
        const S* x = (const S*)&raw[u];
#pragma unroll
        for (int e = 0; e < E; e++) {
          if (dw * E + e < n) o[e] = copy ? x[e] : F::finish(a[u][e], d);
        }
      }
    }
    // The warp leaves together (a differing word stops the launch; the others see it too).
    if (__any_sync(0xffffffffu, symm_sig_watch_settle(p, sw, stop))) return;
  }
}

// In a low-latency reduce so small that the block's last warp holds none of its lines (16-byte
// lines: a line per thread from thread 0; 128-byte lines: two lines a warp, SYMM_LL128_RED_U
// times, from warp 0), before the lines: each thread of that warp waits for its peers' words
// of this call (the slot holds that word or the peer's call two back: the peer cannot run
// ahead of a call this rank has not joined), names one that differs, and sets its bit of
// symm_sig_seen when it saw them all, so the end reads none. The word was pushed before the
// peer's first line, so the wait overlaps the other warps' polls; where the last warp holds
// lines, it watches the words beside them instead (symm_sig_watch). Nothing for a call that
// carries no word, or a thread whose words were checked already.
static __device__ void symm_sig_await(const symm_interp_params& p, const symm_plan_op& op, symm_u32 index,
                                      volatile int* stop) {
  const symm_u32 w = symm_sig_warp();
  if (!p.sig || threadIdx.x < w || ((*(volatile unsigned*)&symm_sig_seen >> (threadIdx.x - w)) & 1u)) return;
  const symm_u64 bytes = op.count * symm_dtype_bytes(op.dtype);
  if (op.format == SYMM_LL_FORMAT_LL) {
    if ((bytes + 7) / 8 > w) return;
  } else if (op.format == SYMM_LL_FORMAT_LL128) {
    if (blockDim.x & 31u || (bytes + 119) / 120 > (symm_u64)(w >> 5) * 2 * SYMM_LL128_RED_U) return;
  } else {
    return;
  }
  symm_u64 mine;
  if (!symm_sig_mine(p, mine)) return;
  const unsigned flag = symm_ll_flag(p.expected[op.slot]);
  for (symm_u32 q = threadIdx.x - w; q < p.world; q += blockDim.x - w) {
    if (q == p.rank) continue;
    volatile symm_u64* at = symm_sig_at(p, p.rank, mine, q);
    unsigned spins = 0;
    symm_u64 start = 0;
    for (;;) {
      const symm_u64 theirs = *at;
      if (symm_sig_same_seq(mine, theirs)) {
        if (theirs != mine) symm_sig_fire(p, q, mine, theirs, stop);
        break;
      }
      // Past the deadline it is the lines' wait that timed out: the peer sent neither.
      if (!symm_ll_keep_polling(p, spins, start, flag, 0, op.slot, index, stop)) return;
    }
  }
  atomicOr(&symm_sig_seen, 1u << (threadIdx.x - w));
}

// ---------------------------------------------------------------------------------------------
// One op family over both line formats (core's ll::Format, the op's `format` byte): the line
// format is a template parameter, a struct that stores a block's data as lines and folds the
// lines of k regions; the epoch, the half, the flag, the element types and the failure paths
// are the family's, written once.
// ---------------------------------------------------------------------------------------------

// 16-byte lines (SYMM_LL_FORMAT_LL).
struct symm_lines16 {
  static __device__ __forceinline__ void put(char* dst, const char* src, symm_u64 bytes, unsigned flag) {
    symm_ll_put(dst, src, bytes, flag);
  }
  template <int DT, class S>
  static __device__ __forceinline__ void reduce(const symm_interp_params& p, char* dst, const char* src,
                                                symm_u64 stride, int k, symm_u64 n, int op, unsigned d,
                                                unsigned flag, symm_u32 slot, symm_u32 index, volatile int* stop) {
    symm_ll_reduce_t<DT, S>(p, dst, src, stride, k, n, op, d, flag, slot, index, stop);
  }
};

// 128-byte lines (SYMM_LL_FORMAT_LL128).
struct symm_lines128 {
  static __device__ __forceinline__ void put(char* dst, const char* src, symm_u64 bytes, unsigned flag) {
    symm_ll128_put(dst, src, bytes, flag);
  }
  template <int DT, class S>
  static __device__ __forceinline__ void reduce(const symm_interp_params& p, char* dst, const char* src,
                                                symm_u64 stride, int k, symm_u64 n, int op, unsigned d,
                                                unsigned flag, symm_u32 slot, symm_u32 index, volatile int* stop) {
    symm_ll128_reduce_t<DT, S>(p, dst, src, stride, k, n, op, d, flag, slot, index, stop);
  }
};

// 0: ran (or stopped, recorded); 1: unknown dtype or no region.
template <class L>
static __device__ int symm_ll_reduce_any(const symm_interp_params& p, int dtype, char* dst, const char* src,
                                         symm_u64 stride, int k, symm_u64 n, int op, unsigned d, unsigned flag,
                                         symm_u32 slot, symm_u32 index, volatile int* stop) {
  if (k < 1) return 1;
#define SYMM_LL_CASE(DT, S)                                                                        \
  case DT:                                                                                         \
    if constexpr (SYMM_DTYPE_ON(DT)) {                                                             \
      L::template reduce<DT, S>(p, dst, src, stride, k, n, op, d, flag, slot, index, stop);        \
      return 0;                                                                                    \
    }                                                                                              \
    return 1;
  switch (dtype) {
    SYMM_LL_CASE(SYMM_DTYPE_F32, float)
    SYMM_LL_CASE(SYMM_DTYPE_F16, unsigned short)
    SYMM_LL_CASE(SYMM_DTYPE_BF16, unsigned short)
    SYMM_LL_CASE(SYMM_DTYPE_F64, double)
    SYMM_LL_CASE(SYMM_DTYPE_I32, int)
    SYMM_LL_CASE(SYMM_DTYPE_U32, unsigned)
    SYMM_LL_CASE(SYMM_DTYPE_I64, long long)
    SYMM_LL_CASE(SYMM_DTYPE_U64, unsigned long long)
    SYMM_LL_CASE(SYMM_DTYPE_U8, unsigned char)
    default: return 1;
  }
#undef SYMM_LL_CASE
}

// SYMM_OP_LL_PUT in lines of L: the call's epoch picks the half and the flag.
template <class L>
static __device__ __forceinline__ void symm_ll_put_op(const symm_interp_params& p, const symm_plan_op& op) {
  const symm_u64 e = p.expected[op.slot];
  const symm_u64 half = (e & 1) * op.reserved;
  L::put(symm_loc(p, op.dst_rank, op.dst_buf, op.dst_off + half), symm_loc(p, op.a_rank, op.a_buf, op.a_off),
         op.count, symm_ll_flag(e));
}

// SYMM_OP_LL_REDUCE in lines of L; 0: ran (or stopped, recorded); 1: it cannot run.
template <class L>
static __device__ __forceinline__ int symm_ll_reduce_op(const symm_interp_params& p, const symm_plan_op& op,
                                                        symm_u32 index, volatile int* stop) {
  const symm_u64 e = p.expected[op.slot];
  const symm_u64 half = (e & 1) * op.reserved;
  return symm_ll_reduce_any<L>(p, op.dtype, symm_loc(p, op.dst_rank, op.dst_buf, op.dst_off),
                               symm_loc(p, op.a_rank, op.a_buf, op.a_off + half), op.b_off, op.b_rank, op.count,
                               op.redop, op.div, symm_ll_flag(e), op.slot, index, stop);
}

// A low-latency op (SYMM_OP_LL_PUT or SYMM_OP_LL_REDUCE) in lines of L; 0: ran (or stopped,
// recorded); 1: it cannot run.
template <class L>
static __device__ __forceinline__ int symm_ll_op(const symm_interp_params& p, const symm_plan_op& op, symm_u32 index,
                                                 volatile int* stop) {
  if (op.kind == SYMM_OP_LL_PUT) {
    symm_ll_put_op<L>(p, op);
    return 0;
  }
  return symm_ll_reduce_op<L>(p, op, index, stop);
}
