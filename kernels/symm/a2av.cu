// The all-to-allv whose counts stay on the device (Comm::all_to_allv_device). Its header and
// done words follow the MoE layers' rules (moe.cuh): tagged with the call's epoch, in two halves
// picked by its parity.
#include "symm/moe.cuh"

// ---------------------------------------------------------------------------------------------
// All-to-allv with device counts.
//
// `send_counts[q]` (elements, written on the device) says how much of the input, packed by
// destination, goes to rank q. Block 0 sends its row of counts to every rank, tagged with the
// epoch; every block waits for the whole world x world matrix (a rank's row also says it has
// entered the call, so its output may be written), computes the prefix sums and copies its
// share of every pair straight into the peer's output at sum_{p < me} c[p][q]. Elements past
// the input or the output bound are dropped and counted. The last block to finish sends a
// tagged done word to every rank and waits for everyone's before the kernel ends.
// ---------------------------------------------------------------------------------------------

// `symm_a2av_params` is generated into symm/plan.cuh from symm_kernels::abi::A2avParams.

static __device__ bool symm_a2av_wait(const symm_a2av_params& a, symm_u64 off, symm_u32 epoch, symm_u32 peer,
                                      symm_u32* value) {
  symm_moe_params p;
  p.w = a.w;
  p.deadline_ns = a.deadline_ns;
  p.record = a.record;
  return symm_moe_wait_tag(p, off, epoch, peer, (symm_u32)(off / 8), value);
}

extern "C" __global__ void __launch_bounds__(512, 2) symm_all_to_allv(symm_a2av_params a) {
  extern __shared__ symm_u32 smem[];  // world x world counts
  const symm_u32 W = a.w.world, me = a.w.rank;
  if (W > SYMM_MOE_MAX_WORLD) return;
  symm_u32* state = (symm_u32*)symm_local(a.w, a.state);
  const symm_u32 epoch = state[SYMM_MOE_EPOCH_A] + 1;
  const symm_u64 half = (symm_u64)(epoch & 1);
  if (blockIdx.x == 0) {
    // My row: negative counts are 0, and the row stops where the input ends.
    __shared__ symm_u32 row[SYMM_MOE_MAX_WORLD];
    if (threadIdx.x == 0) {
      symm_u64 used = 0;
      for (symm_u32 q = 0; q < W; q++) {
        long long c = a.send_counts[q];
        symm_u64 n = c < 0 ? 0 : (symm_u64)c;
        if (n > a.in_max - used) n = a.in_max - used;
        if (n > 0xffffffffull) n = 0xffffffffull;
        row[q] = (symm_u32)n;
        used += n;
      }
    }
    __syncthreads();
    for (symm_u32 i = threadIdx.x; i < W * W; i += blockDim.x) {
      const symm_u32 q = i / W, j = i % W;
      symm_u64* word = (symm_u64*)symm_ptr(a.w, q, a.hdr + 8 * ((half * W + me) * W + j));
      symm_st_signal(word, symm_moe_tag(epoch, row[j]));
    }
  }
  __shared__ int late;
  if (threadIdx.x == 0) late = 0;
  __syncthreads();
  for (symm_u32 i = threadIdx.x; i < W * W; i += blockDim.x) {
    symm_u32 v = 0;
    if (!symm_a2av_wait(a, a.hdr + 8 * (half * W * W + i), epoch, i / W, &v)) late = 1;
    smem[i] = v;
  }
  __syncthreads();
  if (late) return;
  // Every pair's elements split evenly over the blocks; a warp copies a block's share.
  const symm_u32 warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (symm_u32 q = warp; q < W; q += warps) {
    symm_u64 send_off = 0, recv_off = 0;
    for (symm_u32 j = 0; j < q; j++) send_off += smem[me * W + j];
    for (symm_u32 pp = 0; pp < me; pp++) recv_off += smem[pp * W + q];
    symm_u64 n = smem[me * W + q];
    if (recv_off >= a.out_max) n = 0;
    else if (n > a.out_max - recv_off) n = a.out_max - recv_off;
    const symm_u64 per = n / gridDim.x, extra = n % gridDim.x;
    const symm_u64 start = blockIdx.x * per + (blockIdx.x < extra ? blockIdx.x : extra);
    const symm_u64 len = per + (blockIdx.x < extra ? 1 : 0);
    const char* src = (const char*)a.input + (send_off + start) * a.elem;
    char* dst = (char*)symm_ptr(a.w, q, a.out + (recv_off + start) * a.elem);
    symm_moe_copy_warp(dst, src, len * a.elem);
    __syncwarp();
  }
  if (!symm_moe_last_block(&state[SYMM_MOE_FIN_A])) return;
  for (symm_u32 q = threadIdx.x; q < W; q += blockDim.x) {
    symm_u64* word = (symm_u64*)symm_ptr(a.w, q, a.done + 8 * (half * W + me));
    symm_st_signal(word, symm_moe_tag(epoch, 1));
  }
  __syncthreads();
  symm_u64 dropped = 0;
  for (symm_u32 pp = threadIdx.x; pp < W; pp += blockDim.x) {
    symm_u32 v = 0;
    if (!symm_a2av_wait(a, a.done + 8 * (half * W + pp), epoch, pp, &v)) late = 1;
    symm_u64 off = 0;
    for (symm_u32 k = 0; k < pp; k++) off += smem[k * W + me];
    const symm_u64 c = smem[pp * W + me];
    const symm_u64 kept = off >= a.out_max ? 0 : (c < a.out_max - off ? c : a.out_max - off);
    dropped += c - kept;
    if (a.recv_counts) a.recv_counts[pp] = (long long)kept;
  }
  if (dropped) atomicAdd(&state[SYMM_MOE_DROPPED], (symm_u32)(dropped > 0xffffffffull ? 0xffffffffull : dropped));
  __syncthreads();
  if (threadIdx.x == 0 && !late) state[SYMM_MOE_EPOCH_A] = epoch;
}
