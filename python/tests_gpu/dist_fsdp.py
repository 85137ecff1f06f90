"""An FSDP2 (``fully_shard``) training step of a small model on a torch.distributed backend,
unmodified, against the same model trained unsharded on every rank:

    torchrun --nproc-per-node N python/tests_gpu/dist_fsdp.py [BACKEND] [SAVE]

``BACKEND`` defaults to ``cuda:symm,cpu:gloo``; ``nccl`` runs the same steps on NCCL. With
``SAVE``, rank 0 writes every step's loss and the last step's gathered gradients and parameters
there, so ``compare_backends.py`` can set two backends' runs side by side. Each rank trains on
its own slice of a global batch; the unsharded model trains on the whole batch, so FSDP's
averaged gradients are its gradients. Three SGD steps in float32, then three with bfloat16
parameters and float32 reductions (``MixedPrecisionPolicy``): every step's loss, every gathered
gradient and the parameters after the steps are compared. Prints one line per precision on
rank 0 and exits non-zero on a difference past tolerance, or when symm's backend sent a call
anywhere but symm.
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import copy  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402

import symm.distributed  # noqa: E402

STEPS = 3
DIM, HIDDEN, LAYERS, ROWS = 256, 1024, 4, 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def model():
    torch.manual_seed(0)
    # An odd-sized head, so FSDP pads a shard.
    return nn.Sequential(*[Block() for _ in range(LAYERS)], nn.Linear(DIM, 7)).cuda()


def batch(w):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(w * ROWS, DIM, generator=g)
    y = torch.randint(0, 7, (w * ROWS,), generator=g)
    return x.cuda(), y.cuda()


def step(m, opt, x, y, dtype):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(m(x.to(dtype)).float(), y)
    loss.backward()
    return loss


def compare(mixed, w, r):
    """The largest relative differences of loss, gradients and parameters over the steps."""
    dtype = torch.bfloat16 if mixed else torch.float32
    ref = model()
    sharded = copy.deepcopy(ref)
    if mixed:
        ref = ref.to(torch.bfloat16)
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for block in sharded[:-1]:
        fully_shard(block, mp_policy=policy)
    fully_shard(sharded, mp_policy=policy)
    opt = torch.optim.SGD(sharded.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x, y = batch(w)
    mine = slice(r * ROWS, (r + 1) * ROWS)
    worst = {"loss": 0.0, "grad": 0.0, "param": 0.0}
    kept = {"loss": [], "grad": [], "param": []}

    def rel(a, b):
        return float((a.float() - b.float()).abs().max() / (b.float().abs().max() + 1e-12))

    for _ in range(STEPS):
        loss = step(sharded, opt, x[mine], y[mine], dtype).detach()
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        want = step(ref, ref_opt, x, y, dtype)
        worst["loss"] = max(worst["loss"], rel(loss, want))
        kept["loss"].append(loss.float().cpu())
        kept["grad"] = []
        for p, q in zip(sharded.parameters(), ref.parameters()):
            g = p.grad.full_tensor()
            worst["grad"] = max(worst["grad"], rel(g, q.grad))
            kept["grad"].append(g.float().cpu())
        opt.step()
        ref_opt.step()
    for p, q in zip(sharded.parameters(), ref.parameters()):
        full = p.full_tensor()
        worst["param"] = max(worst["param"], rel(full, q))
        kept["param"].append(full.float().cpu())
    return worst, kept


def main():
    backend = sys.argv[1] if len(sys.argv) > 1 else "cuda:symm,cpu:gloo"
    save = sys.argv[2] if len(sys.argv) > 2 else None
    local = int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
    torch.cuda.set_device(local)
    dist.init_process_group(backend, device_id=torch.device("cuda", local))
    w, r = dist.get_world_size(), dist.get_rank()
    ok = True
    record = {"kind": "fsdp", "backend": backend, "world": w}
    for mixed, tol in ((False, 1e-4), (True, 6e-2)):
        worst, kept = compare(mixed, w, r)
        record["bf16" if mixed else "f32"] = kept
        good = all(v <= tol for v in worst.values())
        ok = ok and good
        if r == 0 or not good:
            name = "bf16 params, f32 reduce" if mixed else "f32"
            diffs = ", ".join(f"{k} {v:.2e}" for k, v in worst.items())
            print(f"rank {r}: world {w}, {backend}, {name}: max relative diff {diffs} "
                  f"(tolerance {tol:.0e}); {'ok' if good else 'FAIL'}", flush=True)
    if "symm" in backend:
        paths = symm.distributed.paths()
        served = all("nccl" not in v for v in paths.values())
        ok = ok and served
        if r == 0 or not served:
            print(f"rank {r}: paths {paths}", flush=True)
    if save and r == 0:
        torch.save(record, save)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
