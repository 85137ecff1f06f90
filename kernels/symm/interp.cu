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
// A call of the job carries its signature (symm_sig_*, signature.cuh): pushed to every peer by
// the last warp after the first barrier, its peers' read beside the low-latency lines, while a
// wait spins and, where not read yet, after the last barrier; a call that differs named at once.
// Every wait has a %globaltimer deadline. On expiry the block writes a timeout record (rank, peer,
// slot, expected, found, op index) to host-mapped memory, raises the shared abort word so that
// every other block of every rank stops at its next wait, and returns.
//
// Variants (preprocessor): SYMM_TRACE=1 appends begin/end events stamped with %globaltimer to a
// device buffer (the off variant has no tracing code at all); SYMM_MULTIMEM=1 adds the NVLink
// multicast ops (multimem.*), compiled for checking but never launched on shared machines.
#include "symm/ops.cuh"

extern "C" __global__ void __launch_bounds__(SYMM_THREADS) symm_interp(const symm_interp_params p) {
  const symm_u32 ch = blockIdx.x;
  // A block past the plan's channels (or the records table, SYMM_MAX_CHANNELS per rank) has
  // nothing to run and nowhere to report: the host never launches one, and it does nothing.
  if (ch >= p.channels || ch >= SYMM_MAX_CHANNELS) return;
  const symm_u32 begin = p.chan_start[ch];
  const symm_u32 end = p.chan_start[ch + 1];
  __shared__ int stop;
  symm_u32 trace_len = 0;
  // The channel's first SYMM_PLAN_CACHE ops are copied to shared memory at once (one round trip
  // to global memory for the whole plan of a small collective, instead of one per op).
  __shared__ symm_plan_op cache[SYMM_PLAN_CACHE];
  const symm_u32 cached = end - begin < SYMM_PLAN_CACHE ? end - begin : SYMM_PLAN_CACHE;
  for (symm_u32 j = threadIdx.x; j < cached * (SYMM_OP_BYTES / 16); j += blockDim.x) {
    ((uint4*)cache)[j] = ((const uint4*)(p.plan + begin))[j];
  }
  if (threadIdx.x == 0) stop = 0;
  symm_sig_begin();
  __syncthreads();
  const symm_u64 sig_calls = symm_sig_publish(p);
  // `stop` is read only after an op's closing barrier, where every thread sees the same value:
  // the last warp reaches the first op later than the others (symm_sig_publish), so a read
  // before the op could see a stop set inside it and skip it.
  for (symm_u32 i = begin; i < end; i++) {
    const symm_u32 index = i - begin;
    const symm_plan_op op = index < cached ? cache[index] : p.plan[i];
    symm_run_op(p, op, index, stop, trace_len);
    if (stop) break;
  }
  symm_sig_finish(p, stop, sig_calls);
#if SYMM_TRACE
  if (threadIdx.x == 0 && p.trace_len) p.trace_len[ch] = trace_len;
#endif
}
