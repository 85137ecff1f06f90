// Signals between ranks on the stream, for users' own kernels: what the Python package's
// rendezvous handle calls put_signal and wait_signal (and the C runtime may call alike).
//
// A handle's signal pad is a block of the symmetric heap at offset `pad`: `slots * world`
// 8-byte words per rank, word `slot * world + src` written by rank `src`. A put sets that word
// of the peer's pad to 1 after every earlier write of this rank (release at system scope); a
// wait spins on its own word until it holds 1, then sets it back to 0, so each put is consumed
// by one wait. A wait that passes its deadline, or sees the abort word (a lost peer, another
// collective's timeout), writes a timeout record the host turns into symm's timeout error
// (slot = the word's index, so slot % world names the peer, as the interpreter's records do)
// and raises the abort word.
#include "symm/plan.cuh"
#include "symm/device.cuh"

extern "C" __global__ void symm_user_signal(symm_world w, symm_u64 pad, symm_u32 peer, symm_u32 slot,
                                            symm_u32 wait, symm_u64 deadline_ns, symm_timeout_record* record) {
  if (threadIdx.x != 0 || blockIdx.x != 0 || peer >= w.world) return;
  if (!wait) {
    symm_signal(w, pad, slot * w.world + w.rank, peer, SYMM_SIGNAL_SET, 1);
    return;
  }
  const symm_u32 word = slot * w.world + peer;
  bool late = false;
  const symm_u64 seen = symm_wait_until(w, pad, word, SYMM_CMP_EQ, 1, deadline_ns, &late);
  if (!late) {
    symm_st_signal((symm_u64*)symm_local(w, pad + (symm_u64)word * 8), 0);
    return;
  }
  const bool aborted = w.abort && *w.abort;
  if (record->reason == 0) {
    record->rank = w.rank;
    record->peer = peer;
    record->slot = word;
    record->expected = 1;
    record->found = seen;
    record->op_index = 0;
    record->channel = SYMM_MAX_CHANNELS - 1;
    __threadfence_system();
    record->reason = aborted ? SYMM_STOP_ABORTED : SYMM_STOP_TIMEOUT;
    __threadfence_system();
  }
  if (w.abort) *(volatile symm_u32*)w.abort = 1;
}
