// symm device API: symmetric memory and signals from inside users' own kernels.
//
// Self-contained (NVRTC has no standard headers). Include "symm/plan.cuh" first for the
// constants (SYMM_SIGNAL_*, SYMM_CMP_*, SYMM_SLOT_*).
//
// The symmetric heap of a world is one virtual range per rank: peer p's heap is mapped at
// `base + p * stride` of every rank's range, so a peer pointer is arithmetic (what nvshmem_ptr
// returns), no table is loaded. A signal pad is an array of u64 slots in the heap.
//
// Memory ordering (all at system scope, so it also holds across NVLink and for host-mapped memory):
// * put_signal / signal: the data writes of the caller, then `fence.acq_rel.sys` and a release
//   atomic on the peer's slot (`red.release.sys` for ADD, `st.release.sys` for SET).
// * wait_until: acquire loads (`ld.acquire.sys`) until the comparison holds; everything written
//   before the matching signal is visible afterwards.
// * Block and warp variants synchronise the group first (so every thread's writes precede the
//   release done by one thread) and after (so every thread sees what the acquire made visible).
// * Counters are monotone: waits compare wrap-safely, `a > b` iff (long long)(a - b) > 0.
#pragma once

typedef unsigned long long symm_u64;
typedef unsigned int symm_u32;

// ---------------------------------------------------------------------------------------------
// The world as a kernel sees it.
// ---------------------------------------------------------------------------------------------

// `symm_world` (symm/plan.cuh, generated from symm_kernels::abi::SymmWorld, which the host
// fills): `base`, this rank's view of the heap range, peer p at base + p * stride; `stride`;
// `rank`; `world`; `abort`, this rank's abort word (host-mapped): symm raises it when a peer's
// process is lost or a collective timed out, and every wait below stops when it is set. Null:
// deadlines only.

// Every wait is bounded: a deadline of 0 means this default, and none is longer than the
// maximum (the same bounds as the host side's options).
#define SYMM_WAIT_DEFAULT_NS 10000000000ull
#define SYMM_WAIT_MAX_NS 3600000000000ull

// Pointer to `offset` bytes into peer `peer`'s heap (nvshmem_ptr).
static __device__ __forceinline__ void* symm_ptr(const symm_world& w, symm_u32 peer, symm_u64 offset) {
  return (void*)(w.base + (symm_u64)peer * w.stride + offset);
}

// Pointer to this rank's own copy.
static __device__ __forceinline__ void* symm_local(const symm_world& w, symm_u64 offset) {
  return symm_ptr(w, w.rank, offset);
}

// ---------------------------------------------------------------------------------------------
// Ordering primitives.
// ---------------------------------------------------------------------------------------------

static __device__ __forceinline__ symm_u64 symm_globaltimer() {
  symm_u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Orders this thread's earlier memory operations before its later ones, system wide.
static __device__ __forceinline__ void symm_fence() {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
}

// Waits until this thread's earlier puts are complete and visible system wide (stores to peers
// are posted; a system fence is the completion point on NVLink).
static __device__ __forceinline__ void symm_quiet() {
  asm volatile("fence.sc.sys;" ::: "memory");
}

// The three accesses of the signal protocol. Their orderings (SYMM_SEM_*, "release" for
// signals and "acquire" for waits) come from symm_core::signal::order through plan.cuh, the
// same definition the host backend and its loom models use.
static __device__ __forceinline__ symm_u64 symm_ld_wait(const symm_u64* p) {
  symm_u64 v;
  asm volatile("ld." SYMM_SEM_WAIT ".sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

static __device__ __forceinline__ void symm_st_signal(symm_u64* p, symm_u64 v) {
  asm volatile("st." SYMM_SEM_SIGNAL_SET ".sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

static __device__ __forceinline__ void symm_red_signal(symm_u64* p, symm_u64 v) {
  asm volatile("red." SYMM_SEM_SIGNAL_ADD ".sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

static __device__ __forceinline__ symm_u64 symm_atom_add_release(symm_u64* p, symm_u64 v) {
  symm_u64 old;
  asm volatile("atom.add.release.sys.global.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}

// Wrap-safe comparison of a slot value with a target (symm_core::signal::Cmp).
static __device__ __forceinline__ bool symm_cmp_holds(int cmp, symm_u64 value, symm_u64 target) {
  long long d = (long long)(value - target);
  switch (cmp) {
    case SYMM_CMP_EQ: return d == 0;
    case SYMM_CMP_NE: return d != 0;
    case SYMM_CMP_GT: return d > 0;
    case SYMM_CMP_GE: return d >= 0;
    case SYMM_CMP_LT: return d < 0;
    case SYMM_CMP_LE: return d <= 0;
    default: return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Signals.
// ---------------------------------------------------------------------------------------------

// Whether a PTX semantics string is "release".
static __device__ constexpr bool symm_sem_is_release(const char* s) {
  return s[0] == 'r' && s[1] == 'e' && s[2] == 'l' && s[3] == 'e' && s[4] == 'a' && s[5] == 's' &&
         s[6] == 'e' && s[7] == 0;
}

// The store or add of a signal to `p` at system scope. With the release qualifier
// (SYMM_SEM_SIGNAL_*, from symm_core::signal::order) the write is itself a release, which PTX
// defines as a fence.acq_rel followed by the strong write: every earlier write of this thread,
// and of the threads a barrier ordered before it, is visible before the signal, and a fence of
// its own in front would only add a second system fence. Any weaker qualifier gets the fence.
static __device__ __forceinline__ void symm_signal_word(symm_u64* p, int sigop, symm_u64 value) {
  if (sigop == SYMM_SIGNAL_SET) {
    if constexpr (!symm_sem_is_release(SYMM_SEM_SIGNAL_SET)) symm_fence();
    symm_st_signal(p, value);
  } else {
    if constexpr (!symm_sem_is_release(SYMM_SEM_SIGNAL_ADD)) symm_fence();
    symm_red_signal(p, value);
  }
}

// Updates `peer`'s slot at heap offset `pad + slot * 8` with SET or ADD, release at system scope.
static __device__ __forceinline__ void symm_signal(const symm_world& w, symm_u64 pad, symm_u32 slot,
                                                   symm_u32 peer, int sigop, symm_u64 value) {
  symm_signal_word((symm_u64*)symm_ptr(w, peer, pad + (symm_u64)slot * 8), sigop, value);
}

// The deadline a wait uses: `deadline_ns`, or the default for 0, never past the maximum.
static __device__ __forceinline__ symm_u64 symm_wait_bound(symm_u64 deadline_ns) {
  if (deadline_ns == 0) return SYMM_WAIT_DEFAULT_NS;
  return deadline_ns < SYMM_WAIT_MAX_NS ? deadline_ns : SYMM_WAIT_MAX_NS;
}

// Spins until own slot `slot` (value) compares true against `target`; returns the value seen.
// The wait stops early, with *timed_out = true, when its deadline passes on %globaltimer
// (`symm_wait_bound(deadline_ns)`) or the world's abort word is raised.
static __device__ __forceinline__ symm_u64 symm_wait_until(const symm_world& w, symm_u64 pad, symm_u32 slot,
                                                           int cmp, symm_u64 target, symm_u64 deadline_ns,
                                                           bool* timed_out) {
  const symm_u64* p = (const symm_u64*)symm_local(w, pad + (symm_u64)slot * 8);
  const symm_u64 bound = symm_wait_bound(deadline_ns);
  const symm_u64 start = symm_globaltimer();
  unsigned spins = 0;
  for (;;) {
    symm_u64 v = symm_ld_wait(p);
    if (symm_cmp_holds(cmp, v, target)) {
      if (timed_out) *timed_out = false;
      return v;
    }
    if (((++spins & 255u) == 0) &&
        ((w.abort && *w.abort) || symm_globaltimer() - start > bound)) {
      if (timed_out) *timed_out = true;
      return v;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// put / get: thread, warp and block variants. Bytes are copied with 16-byte vectors when source,
// destination and length allow, otherwise byte by byte.
// ---------------------------------------------------------------------------------------------

static __device__ __forceinline__ void symm_copy_strided(char* dst, const char* src, symm_u64 bytes,
                                                         symm_u32 lane, symm_u32 lanes) {
  symm_u64 mis = ((symm_u64)dst | (symm_u64)src) & 15;
  if (mis == 0) {
    symm_u64 vecs = bytes >> 4;
    uint4* d = (uint4*)dst;
    const uint4* s = (const uint4*)src;
    symm_u64 i = lane;
    // Four loads in flight per thread before their stores: a copy between GPUs is latency
    // bound with one.
    for (; i + 3 * (symm_u64)lanes < vecs; i += 4 * (symm_u64)lanes) {
      uint4 a = s[i], b = s[i + lanes], c = s[i + 2 * (symm_u64)lanes], e = s[i + 3 * (symm_u64)lanes];
      d[i] = a;
      d[i + lanes] = b;
      d[i + 2 * (symm_u64)lanes] = c;
      d[i + 3 * (symm_u64)lanes] = e;
    }
    for (; i < vecs; i += lanes) d[i] = s[i];
    for (symm_u64 i = (vecs << 4) + lane; i < bytes; i += lanes) dst[i] = src[i];
  } else {
    for (symm_u64 i = lane; i < bytes; i += lanes) dst[i] = src[i];
  }
}

// One thread copies `bytes` from this rank's `src` to `peer`'s heap offset `dst_off`.
static __device__ __forceinline__ void symm_put_thread(const symm_world& w, symm_u32 peer, symm_u64 dst_off,
                                                       const void* src, symm_u64 bytes) {
  symm_copy_strided((char*)symm_ptr(w, peer, dst_off), (const char*)src, bytes, 0, 1);
}

// The calling warp copies together (every lane calls it with the same arguments).
static __device__ __forceinline__ void symm_put_warp(const symm_world& w, symm_u32 peer, symm_u64 dst_off,
                                                     const void* src, symm_u64 bytes) {
  symm_copy_strided((char*)symm_ptr(w, peer, dst_off), (const char*)src, bytes, threadIdx.x & 31u, 32);
  __syncwarp();
}

// The calling block copies together (every thread calls it with the same arguments).
static __device__ __forceinline__ void symm_put_block(const symm_world& w, symm_u32 peer, symm_u64 dst_off,
                                                      const void* src, symm_u64 bytes) {
  symm_copy_strided((char*)symm_ptr(w, peer, dst_off), (const char*)src, bytes, threadIdx.x, blockDim.x);
  __syncthreads();
}

static __device__ __forceinline__ void symm_get_thread(const symm_world& w, void* dst, symm_u32 peer,
                                                       symm_u64 src_off, symm_u64 bytes) {
  symm_copy_strided((char*)dst, (const char*)symm_ptr(w, peer, src_off), bytes, 0, 1);
}

static __device__ __forceinline__ void symm_get_warp(const symm_world& w, void* dst, symm_u32 peer,
                                                     symm_u64 src_off, symm_u64 bytes) {
  symm_copy_strided((char*)dst, (const char*)symm_ptr(w, peer, src_off), bytes, threadIdx.x & 31u, 32);
  __syncwarp();
}

static __device__ __forceinline__ void symm_get_block(const symm_world& w, void* dst, symm_u32 peer,
                                                      symm_u64 src_off, symm_u64 bytes) {
  symm_copy_strided((char*)dst, (const char*)symm_ptr(w, peer, src_off), bytes, threadIdx.x, blockDim.x);
  __syncthreads();
}

// put then signal: the peer that observes the slot update also sees the data.
static __device__ __forceinline__ void symm_put_signal_thread(const symm_world& w, symm_u32 peer, symm_u64 dst_off,
                                                              const void* src, symm_u64 bytes, symm_u64 pad,
                                                              symm_u32 slot, int sigop, symm_u64 value) {
  symm_put_thread(w, peer, dst_off, src, bytes);
  symm_signal(w, pad, slot, peer, sigop, value);
}

static __device__ __forceinline__ void symm_put_signal_warp(const symm_world& w, symm_u32 peer, symm_u64 dst_off,
                                                            const void* src, symm_u64 bytes, symm_u64 pad,
                                                            symm_u32 slot, int sigop, symm_u64 value) {
  symm_put_warp(w, peer, dst_off, src, bytes);
  if ((threadIdx.x & 31u) == 0) symm_signal(w, pad, slot, peer, sigop, value);
  __syncwarp();
}

static __device__ __forceinline__ void symm_put_signal_block(const symm_world& w, symm_u32 peer, symm_u64 dst_off,
                                                             const void* src, symm_u64 bytes, symm_u64 pad,
                                                             symm_u32 slot, int sigop, symm_u64 value) {
  symm_put_block(w, peer, dst_off, src, bytes);
  if (threadIdx.x == 0) symm_signal(w, pad, slot, peer, sigop, value);
  __syncthreads();
}

// Block variant of wait_until: thread 0 waits, then the block synchronises.
static __device__ __forceinline__ symm_u64 symm_wait_until_block(const symm_world& w, symm_u64 pad, symm_u32 slot,
                                                                 int cmp, symm_u64 target, symm_u64 deadline_ns,
                                                                 bool* timed_out) {
  __shared__ symm_u64 seen;
  __shared__ bool late;
  if (threadIdx.x == 0) seen = symm_wait_until(w, pad, slot, cmp, target, deadline_ns, &late);
  __syncthreads();
  if (timed_out) *timed_out = late;
  return seen;
}

// ---------------------------------------------------------------------------------------------
// Barriers over every rank (one block per rank calls them): per-peer monotone counters, so
// generation g waits for exactly the g-th arrival of every peer (symm_core::signal::Barrier).
// `slot_base` is the barrier slot of peer 0 for this (team, channel): the slot for peer p is
// slot_base + p. `generation` is the caller's count of completed barriers (it owns it).
// ---------------------------------------------------------------------------------------------

// Arrive half: one release ADD to every peer's barrier slot keyed by this rank.
static __device__ __forceinline__ void symm_barrier_arrive_block(const symm_world& w, symm_u64 pad,
                                                                 symm_u32 slot_base) {
  __syncthreads();
  for (symm_u32 p = threadIdx.x; p < w.world; p += blockDim.x) {
    if (p != w.rank) symm_signal(w, pad, slot_base + w.rank, p, SYMM_SIGNAL_ADD, 1);
  }
  __syncthreads();
}

// Wait half: every peer's `generation`-th arrival; returns false when the deadline expired.
static __device__ __forceinline__ bool symm_barrier_wait_block(const symm_world& w, symm_u64 pad, symm_u32 slot_base,
                                                               symm_u64 generation, symm_u64 deadline_ns) {
  __shared__ int late_any;
  if (threadIdx.x == 0) late_any = 0;
  __syncthreads();
  for (symm_u32 p = threadIdx.x; p < w.world; p += blockDim.x) {
    if (p == w.rank) continue;
    bool late = false;
    symm_wait_until(w, pad, slot_base + p, SYMM_CMP_GE, generation, deadline_ns, &late);
    if (late) atomicOr(&late_any, 1);
  }
  __syncthreads();
  return late_any == 0;
}

// Whole barrier.
static __device__ __forceinline__ bool symm_barrier_block(const symm_world& w, symm_u64 pad, symm_u32 slot_base,
                                                          symm_u64 generation, symm_u64 deadline_ns) {
  symm_barrier_arrive_block(w, pad, slot_base);
  return symm_barrier_wait_block(w, pad, slot_base, generation, deadline_ns);
}
