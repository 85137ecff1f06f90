"""A one-shot all-reduce written as a Triton kernel over symm's peer memory.

Every rank's kernel reads every peer's copy of a symmetric tensor through
``SymmHandle.buffer_ptrs`` and writes the sum into its own output; the handle's stream barrier
orders the reads after every rank's writes, and the next writes after every rank's reads.
Checked against ``symm.all_reduce``. Run it with::

    torchrun --nproc-per-node 2 python/examples/triton_one_shot.py
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import symm  # noqa: E402


@triton.jit
def _one_shot_sum(ptrs, out, n, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for r in tl.static_range(WORLD):
        peer = tl.load(ptrs + r).to(tl.pointer_type(tl.float32))
        acc += tl.load(peer + i, mask=mask, other=0.0, volatile=True)
    tl.store(out + i, acc, mask=mask)


def one_shot_all_reduce(h: "symm.SymmHandle", n: int, out: torch.Tensor) -> torch.Tensor:
    """Sum of every rank's first ``n`` float32 elements of the handle's tensor into ``out``."""
    ptrs = torch.tensor(h.buffer_ptrs, dtype=torch.int64, device=out.device)
    h.barrier()
    grid = (triton.cdiv(n, 1024),)
    _one_shot_sum[grid](ptrs, out, n, WORLD=h.world_size, BLOCK=1024)
    h.barrier()
    return out


def main() -> None:
    """Run the kernel on a symmetric tensor and compare it with symm.all_reduce."""
    torch.distributed.init_process_group("gloo")
    symm.init()
    torch.cuda.set_device(symm.device())
    n = 1 << 16
    t = symm.empty(n, dtype=torch.float32)
    h = symm.rendezvous(t)
    t.copy_(torch.arange(n, device=t.device, dtype=torch.float32) * (symm.rank() + 1))
    mine = one_shot_all_reduce(h, n, torch.empty(n, device=t.device))
    ref = symm.all_reduce(t.clone())
    torch.cuda.synchronize()
    symm.check()
    assert torch.equal(mine, ref), (mine[:4], ref[:4])
    if symm.rank() == 0:
        print(f"triton one-shot all-reduce over {symm.world_size()} ranks matches symm.all_reduce")
    symm.finalize()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
