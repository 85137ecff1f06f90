"""A transformers causal LM loaded with ``tp_plan="auto"`` on the torch.distributed backend
"symm", unmodified, against the same model unsharded on every rank:

    torchrun --nproc-per-node N python/tests_gpu/dist_transformers.py DIR [BACKEND [SAVE]]

A small Llama config with random weights (saved to ``DIR`` by rank 0): the forward's logits
and a greedy generation of 32 tokens. ``BACKEND`` defaults to ``cuda:symm,cpu:gloo``; ``nccl``
runs the same model on NCCL. With ``SAVE``, rank 0 writes the logits, the generated tokens and
the decode step's time there, for ``compare_backends.py``. Prints one summary line on rank 0;
exits non-zero when the logits are off by more than bf16's tolerance or a call went anywhere
but symm.
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

import symm.distributed  # noqa: E402

NEW = 32


def timed_generate(model, ids):
    """The greedy tokens, and microseconds per decode step of a second generation (the first
    warms up: the kernels a backend builds on first use are not a step's cost).
    """
    model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    torch.cuda.synchronize()
    return out, (time.perf_counter() - t0) / NEW * 1e6


def main():
    path = sys.argv[1]
    backend = sys.argv[2] if len(sys.argv) > 2 else "cuda:symm,cpu:gloo"
    save = sys.argv[3] if len(sys.argv) > 3 else None
    local = int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
    torch.cuda.set_device(local)
    dist.init_process_group(backend, device_id=torch.device("cuda", local))
    w, r = dist.get_world_size(), dist.get_rank()
    if r == 0:
        config = LlamaConfig(vocab_size=2048, hidden_size=512, intermediate_size=1024,
                             num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                             max_position_embeddings=512)
        torch.manual_seed(0)
        LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    dist.barrier()
    # The default group joins symm's job now (its placement: SYMM_DEVICES). transformers
    # places a rank on GPU LOCAL_RANK; where ranks share GPUs, tell it the one this rank uses.
    dist.all_reduce(torch.zeros(1, device="cuda"))
    os.environ["LOCAL_RANK"] = str(local)
    model = AutoModelForCausalLM.from_pretrained(path, tp_plan="auto", dtype=torch.bfloat16)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda()
    ids = torch.randint(0, 2048, (2, 24), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        logits = model(ids).logits.float()
        want = ref(ids).logits.float()
    err = float((logits - want).abs().max())
    scale = float(want.abs().max())
    gen, step_us = timed_generate(model, ids)
    ref_gen, ref_us = timed_generate(ref, ids)
    same = float((gen[:, -NEW:] == ref_gen[:, -NEW:]).float().mean())
    paths = symm.distributed.paths() if "symm" in backend else {}
    ok = err <= 0.02 * scale + 0.02 and all("nccl" not in v for v in paths.values())
    if save and r == 0:
        torch.save({"kind": "transformers", "backend": backend, "world": w,
                    "logits": logits.cpu(), "tokens": gen[:, -NEW:].cpu(), "step_us": step_us,
                    "unsharded_step_us": ref_us,
                    "deterministic": os.environ.get("SYMM_DETERMINISTIC") == "1",
                    "settings": {k: v for k, v in sorted(os.environ.items())
                                 if k in ("SYMM_DETERMINISTIC", "SYMM_PLANS", "SYMM_COPY_ENGINE")}},
                   save)
    if r == 0 or not ok:
        print(f"rank {r}: world {w}, transformers {transformers.__version__}: logits max |diff| "
              f"{err:.4f} (max |logit| {scale:.3f}), {backend}; greedy tokens equal to the "
              f"unsharded model's: {same:.3f}; decode step {step_us:.0f} us (unsharded "
              f"{ref_us:.0f} us); "
              f"paths {paths}; {'ok' if ok else 'FAIL'}", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
