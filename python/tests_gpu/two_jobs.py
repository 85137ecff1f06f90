"""Two jobs of one user on one host at once, sharing the GPUs: each completes, with no
cross-talk. Run two torchruns side by side, each with its own ``--master-port`` and a salt as
the first argument (``python two_jobs.py SALT``); each job's ranks sum values that depend on the
salt, in symmetric and plain tensors and across sizes, and check every result exactly. Exits 0
when every call of this job was right.
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

salt = int(sys.argv[1])
dist.init_process_group("gloo")
symm.init(timeout=20.0)
w, r = symm.world_size(), symm.rank()
calls, t0 = 0, time.monotonic()
for i in range(300):
    n = 256 + 97 * (i % 41)
    v = float(salt * 1000 + i % 7 + r)
    t = symm.empty(n, dtype=torch.float32) if i % 2 else torch.empty(n, device="cuda")
    t.fill_(v)
    symm.all_reduce(t)
    symm.synchronize()
    want = float(w * (salt * 1000 + i % 7) + w * (w - 1) // 2)
    if not torch.equal(t, torch.full_like(t, want)):
        print(f"job {salt} rank {r}: call {i} gave {t[0].item()}, want {want}", flush=True)
        sys.exit(1)
    calls += 1
print(f"job {salt} rank {r}: {calls} calls exact in {time.monotonic() - t0:.1f} s", flush=True)
symm.finalize()
dist.destroy_process_group()
