// Examples of the device API (symm/device.cuh) in a user's own kernel; compiled by CI with the
// other variants and run by `cargo xtask hw` as a check of the API itself.
#include "symm/plan.cuh"
#include "symm/device.cuh"

// Ring pass: every rank puts `bytes` from heap offset `src_off` into the next rank's heap at
// `dst_off` with a signal (ADD 1 on the user slot keyed by the sender), waits for the same from
// the previous rank, then all ranks meet at a whole barrier. One block per rank.
// `generation` is how many times the caller ran this kernel before (the counters are monotone).
// Returns 0 in *status on success, 1 when a wait passed its deadline.
extern "C" __global__ void symm_example_ring_pass(symm_world w, symm_u64 pad, symm_u64 src_off, symm_u64 dst_off,
                                                  symm_u64 bytes, symm_u64 generation, symm_u64 deadline_ns,
                                                  int* status) {
  const symm_u32 next = (w.rank + 1) % w.world;
  const symm_u32 prev = (w.rank + w.world - 1) % w.world;
  const symm_u32 user_slot = symm_slot_index(0, 1, 0, SYMM_SLOT_USER, w.world, 0);
  const symm_u32 barrier_slot = symm_slot_index(0, 1, 0, SYMM_SLOT_BARRIER, w.world, 0);
  symm_put_signal_block(w, next, dst_off, symm_local(w, src_off), bytes, pad, user_slot + w.rank, SYMM_SIGNAL_ADD, 1);
  bool late = false;
  symm_wait_until_block(w, pad, user_slot + prev, SYMM_CMP_GE, generation + 1, deadline_ns, &late);
  bool ok = !late && symm_barrier_block(w, pad, barrier_slot, generation + 1, deadline_ns);
  if (threadIdx.x == 0) *status = ok ? 0 : 1;
}

// Put bandwidth: the grid puts `bytes` from this rank's `src_off` to the next rank's `dst_off`,
// each block a 16-byte-aligned share with symm_put_block. No signal: the caller times the kernel.
extern "C" __global__ void symm_example_put_bw(symm_world w, symm_u64 src_off, symm_u64 dst_off, symm_u64 bytes) {
  const symm_u32 next = (w.rank + 1) % w.world;
  const symm_u64 share = ((bytes + gridDim.x - 1) / gridDim.x + 15) & ~15ull;
  const symm_u64 start = share * blockIdx.x;
  if (start >= bytes) return;
  const symm_u64 n = bytes - start < share ? bytes - start : share;
  symm_put_block(w, next, dst_off + start, symm_local(w, src_off + start), n);
}

// Signal latency: ranks 0 and 1 bounce a signal `iters` times (thread 0 of one block; other
// ranks return). Rank 0 signals, then waits for the answer; rank 1 waits, then answers. The
// slots are the user slots keyed by the sender; `base` is how many bounces ran before (the
// counters are monotone). *status is 0, or 1 when a wait passed `deadline_ns`.
extern "C" __global__ void symm_example_ping_pong(symm_world w, symm_u64 pad, symm_u64 base, symm_u64 iters,
                                                  symm_u64 deadline_ns, int* status) {
  if (threadIdx.x != 0 || w.rank > 1 || w.world < 2) return;
  const symm_u32 peer = 1 - w.rank;
  const symm_u32 user = symm_slot_index(0, 1, 0, SYMM_SLOT_USER, w.world, 0);
  bool late = false;
  for (symm_u64 i = 0; i < iters && !late; ++i) {
    if (w.rank == 0) symm_signal(w, pad, user + w.rank, peer, SYMM_SIGNAL_ADD, 1);
    symm_wait_until(w, pad, user + peer, SYMM_CMP_GE, base + i + 1, deadline_ns, &late);
    if (w.rank == 1 && !late) symm_signal(w, pad, user + w.rank, peer, SYMM_SIGNAL_ADD, 1);
  }
  *status = late ? 1 : 0;
}

// Warp and thread variants, for the compile check: one warp gets, one thread puts with a SET.
extern "C" __global__ void symm_example_variants(symm_world w, symm_u64 pad, symm_u64 off, symm_u64 bytes,
                                                 char* local) {
  const symm_u32 peer = (w.rank + 1) % w.world;
  if (threadIdx.x < 32) symm_get_warp(w, local, peer, off, bytes);
  if (threadIdx.x == 0) {
    symm_put_signal_thread(w, peer, off, local, bytes, pad, SYMM_SLOT_USER, SYMM_SIGNAL_SET, 7);
    symm_quiet();
    (void)symm_atom_add_release((symm_u64*)symm_local(w, pad), 0);
  }
  if (threadIdx.x >= 32 && threadIdx.x < 64) {
    symm_put_signal_warp(w, peer, off, local, bytes, pad, SYMM_SLOT_USER, SYMM_SIGNAL_ADD, 1);
  }
  symm_get_block(w, local, peer, off, bytes);
}
