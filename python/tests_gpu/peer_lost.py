"""A killed rank: the last rank exits without finalizing; the others must raise
symm.PeerLostError within 2 seconds. Run under torchrun; exits 0 on the survivors when they saw
the error in time.
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import symm  # noqa: E402

dist.init_process_group("gloo")
symm.init(timeout=30.0)
torch.cuda.set_device(symm.device())
w, r = symm.world_size(), symm.rank()
t = symm.zeros(1 << 16)
symm.all_reduce(t)
symm.synchronize()
dist.barrier()
KILL_AFTER = 0.5
t0 = time.monotonic() + KILL_AFTER  # when the last rank dies (the barrier ends about together)
if r == w - 1:
    time.sleep(KILL_AFTER)
    os._exit(0)  # killed: no finalize, no goodbye
try:
    while True:
        symm.all_reduce(t)
        symm.synchronize()
        if time.monotonic() - t0 > 10:
            print(f"rank {r}: no error after 10 s", flush=True)
            sys.exit(1)
except symm.PeerLostError as e:
    dt = time.monotonic() - t0
    print(f"rank {r}: PeerLostError(rank={e.rank}) {dt:.3f} s after the kill", flush=True)
    os._exit(0 if dt < 2.0 and e.rank == w - 1 else 1)
