// The call signature on the device: each launch of a job's call publishes its word to its
// peers and checks theirs. Included by ops.cuh after symm_record; symm_sig_await, which waits
// with the low-latency polls, is in ll.cuh beside them.
#pragma once

// ---------------------------------------------------------------------------------------------
// The call signature (symm_core::sched::signature). A call of the job carries its signature
// with sequence number 0 in p.sig; the sequence number is this rank's call counter of the
// channel (p.calls, device memory, so graph replays count too). After the block's first
// barrier, its last warp reads the counter once, writes it back plus one at once (the call is
// counted whether it finishes or stops: a failed job resets the counters; the store's trip is
// off the call's end), leaves the value it read in shared memory for the block's spinning
// checks, and pushes the call's word into every peer's signature words, row (channel, parity
// of the sequence), column this rank. That warp does so before it reaches any later barrier,
// and every signal of a plan is a barrier then a release by thread 0, so the word is published
// before any signal of the call; the other warps start the call's ops meanwhile, and the
// counter's read is off their path. 16-byte low-latency lines carry no release: the word is
// stored before them (every low-latency plan opens with the epoch pair and its barrier) but is
// not ordered with them, so a call that differs and still completes is named only if the word
// has arrived by the time it is read (128-byte lines' flags are released: seen, they order
// it). The block reads the words its peers pushed to it, in its own memory, whenever a wait
// spins past its fast path (once the counter's value is in shared memory). In a low-latency
// reduce, each lane of the last warp owns one peer's word: where the warp holds lines, the
// lane loads the word beside its loads of lines (symm_sig_watch: a peer pushes its word before
// its first line, so it arrives with them, and the load's trip hides under theirs); where the
// reduce is so small that the warp holds none, it waits for the word meanwhile
// (symm_sig_await). At the block's end, where every lane of the last warp
// checked its words inside the call, nothing is left to do (no barrier, no read); else, after
// a barrier, each lane reads the words it has not checked. A word that carries this call's
// sequence number and is not this call's word names a call that differs
// (SYMM_STOP_SIGNATURE, the abort word raised); any other word (none yet, an older call's, a
// newer one's: the peer ran ahead) says nothing, so agreeing calls never fire. p.sig 0: no
// check (a team's call, the one-process backend).
// ---------------------------------------------------------------------------------------------

// The counter's value this call read (SYMM_SIG_UNREAD until the last warp has it).
#define SYMM_SIG_UNREAD (~0ull)
static __shared__ symm_u64 symm_sig_seq;
// The last warp's lanes whose peers' words of this call were all checked inside the call
// (bit: the lane, thread symm_sig_warp() + lane): the end reads none for them.
static __shared__ unsigned symm_sig_seen;

// Before the block's first barrier, one thread: no counter read yet, no word checked.
static __device__ __forceinline__ void symm_sig_begin() {
  if (threadIdx.x == 0) {
    symm_sig_seq = SYMM_SIG_UNREAD;
    symm_sig_seen = 0;
  }
}

// The first thread of the block's last warp (whole or not): the warp that publishes and
// finishes, each of its threads taking every (blockDim.x - that)th peer.
static __device__ __forceinline__ symm_u32 symm_sig_warp() { return (blockDim.x - 1) & ~31u; }

static __device__ __forceinline__ symm_u64 symm_sig_word(const symm_interp_params& p, symm_u64 calls) {
  return p.sig | (calls & 0xfffull);
}

// This call's word, from a spinning check; false while the last warp has not read the counter.
static __device__ __forceinline__ bool symm_sig_mine(const symm_interp_params& p, symm_u64& mine) {
  const symm_u64 seq = *(volatile symm_u64*)&symm_sig_seq;
  if (seq == SYMM_SIG_UNREAD) return false;
  mine = symm_sig_word(p, seq);
  return true;
}

// Rank `owner`'s word from `sender` for the call whose word is `mine`.
static __device__ __forceinline__ volatile symm_u64* symm_sig_at(const symm_interp_params& p, symm_u32 owner,
                                                                 symm_u64 mine, symm_u32 sender) {
  return (volatile symm_u64*)(p.base + (symm_u64)owner * p.stride + p.sig_off +
                              (((symm_u64)blockIdx.x * 2 + (mine & 1)) * p.world + sender) * 8);
}

// Whether `theirs` carries the sequence number of the call whose word is `mine`.
static __device__ __forceinline__ bool symm_sig_same_seq(symm_u64 mine, symm_u64 theirs) {
  return theirs != 0 && ((theirs ^ mine) & 0xfffull) == 0;
}

// Peer q's word `theirs` names a call other than `mine`: the first thread of the block to see
// one (`stop` from 0 to 1) records it and raises the abort word.
static __device__ void symm_sig_fire(const symm_interp_params& p, symm_u32 q, symm_u64 mine, symm_u64 theirs,
                                     volatile int* stop) {
  if (atomicExch((int*)stop, 1) == 0) {
    symm_record(p, SYMM_STOP_SIGNATURE, q, mine, theirs, 0);
    *p.abort_word = 1;
    __threadfence_system();
  }
}

// After the block's first barrier, the last warp: this call's word into every peer's row.
// Returns the channel's call counter to that warp (0 to the others), for symm_sig_finish.
static __device__ __forceinline__ symm_u64 symm_sig_publish(const symm_interp_params& p) {
  const symm_u32 w = symm_sig_warp();
  if (!p.sig || threadIdx.x < w) return 0;
  const symm_u64 calls = p.calls[blockIdx.x];
  if (threadIdx.x == w) {
    p.calls[blockIdx.x] = calls + 1;
    *(volatile symm_u64*)&symm_sig_seq = calls;
  }
  const symm_u64 mine = symm_sig_word(p, calls);
  for (symm_u32 q = threadIdx.x - w; q < p.world; q += blockDim.x - w) {
    if (q != p.rank) *symm_sig_at(p, q, mine, p.rank) = mine;
  }
  return calls;
}

// Whether a peer's word names a call other than `mine`; the first thread of the block to see
// one (`stop` from 0 to 1) records it and raises the abort word. Peers from `first`, by `step`.
static __device__ bool symm_sig_differs_from(const symm_interp_params& p, symm_u64 mine, symm_u32 first,
                                             symm_u32 step, volatile int* stop) {
  for (symm_u32 q = first; q < p.world; q += step) {
    if (q == p.rank) continue;
    const symm_u64 theirs = *symm_sig_at(p, p.rank, mine, q);
    if (symm_sig_same_seq(mine, theirs) && theirs != mine) {
      symm_sig_fire(p, q, mine, theirs, stop);
      return true;
    }
  }
  return false;
}

// The same from a spinning wait, any thread: the counter's value the last warp left in shared
// memory (none yet: nothing to check this time).
static __device__ bool symm_sig_differs(const symm_interp_params& p, symm_u32 first, symm_u32 step,
                                        volatile int* stop) {
  symm_u64 mine;
  if (!p.sig || !symm_sig_mine(p, mine)) return false;
  return symm_sig_differs_from(p, mine, first, step, stop);
}

// The last warp's lanes, as symm_sig_seen's bits.
static __device__ __forceinline__ unsigned symm_sig_lanes() {
  const symm_u32 n = blockDim.x - symm_sig_warp();
  return n >= 32 ? ~0u : (1u << n) - 1u;
}

// Block end, every thread. Where every lane of the last warp checked its peers' words inside
// the call, nothing: the bits were set before the closing barrier of the op that set them, so
// every thread reads the same and the block leaves together. Else, after a barrier (every op
// and every spinning check done), each lane whose bit is not set reads its peers' words.
// `calls`: what symm_sig_publish returned to this thread.
static __device__ __forceinline__ void symm_sig_finish(const symm_interp_params& p, int& stop, symm_u64 calls) {
  if (!p.sig) return;
  const unsigned lanes = symm_sig_lanes();
  if ((*(volatile unsigned*)&symm_sig_seen & lanes) == lanes) return;
  __syncthreads();
  const symm_u32 w = symm_sig_warp();
  if (threadIdx.x < w || ((symm_sig_seen >> (threadIdx.x - w)) & 1u)) return;
  if (!stop) symm_sig_differs_from(p, symm_sig_word(p, calls), threadIdx.x - w, blockDim.x - w, (volatile int*)&stop);
}

// A thread's watch of one peer's word inside a low-latency reduce: a lane of the last warp
// that owns exactly one peer (lane q owns peer q when the world fits the warp) loads that
// peer's word beside its own loads of lines, where they wait anyway; once a load shows the
// word of this call's sequence, the lane checks it and sets its bit of symm_sig_seen. A lane
// that owns no peer sets its bit at once. A word not there yet settles nothing (the end reads
// it instead), so a watch only ever removes a read, never a check.
struct symm_sig_watch {
  volatile symm_u64* at;  // nullptr: nothing to watch (another warp, no peer, or settled)
  symm_u64 mine;
  symm_u64 theirs;
};

static __device__ __forceinline__ symm_sig_watch symm_sig_watch_start(const symm_interp_params& p) {
  symm_sig_watch s;
  s.at = nullptr;
  s.mine = 0;
  s.theirs = 0;
  const symm_u32 w = symm_sig_warp();
  if (!p.sig || threadIdx.x < w) return s;
  const symm_u32 q = threadIdx.x - w, n = blockDim.x - w;
  if ((*(volatile unsigned*)&symm_sig_seen >> q) & 1u) return s;
  if (q >= p.world || (q == p.rank && q + n >= p.world)) {
    atomicOr(&symm_sig_seen, 1u << q);
    return s;
  }
  if (q == p.rank || q + n < p.world || !symm_sig_mine(p, s.mine)) return s;
  s.at = symm_sig_at(p, p.rank, s.mine, q);
  return s;
}

// Issues the word's load (its value is looked at only in symm_sig_watch_settle).
static __device__ __forceinline__ void symm_sig_watch_load(symm_sig_watch& s) {
  if (s.at) s.theirs = *s.at;
}

// After the lines the loads went beside, before the stores: where the last load did not show
// this call's word yet, one more load, which the stores hide.
static __device__ __forceinline__ void symm_sig_watch_again(symm_sig_watch& s) {
  if (s.at && !symm_sig_same_seq(s.mine, s.theirs)) s.theirs = *s.at;
}

// After the stores: a word of this call's sequence is checked (one that differs stops the
// launch: true) and settles the watch; any other word settles nothing.
static __device__ __forceinline__ bool symm_sig_watch_settle(const symm_interp_params& p, symm_sig_watch& s,
                                                             volatile int* stop) {
  if (!s.at || !symm_sig_same_seq(s.mine, s.theirs)) return false;
  const symm_u32 q = threadIdx.x - symm_sig_warp();
  s.at = nullptr;
  atomicOr(&symm_sig_seen, 1u << q);
  if (s.theirs == s.mine) return false;
  symm_sig_fire(p, q, s.mine, s.theirs, stop);
  return true;
}
