"""Two backends' runs of the same script set side by side, from the files their ``SAVE``
argument wrote (``dist_transformers.py`` or ``dist_fsdp.py``, same world, same model):

    python python/tests_gpu/compare_backends.py SYMM.pt NCCL.pt
    python python/tests_gpu/compare_backends.py --exact DET_A.pt DET_B.pt

For the transformers run: the largest logit difference against the largest logit, the share
of greedy tokens that agree, and both decode steps' times. For the FSDP2 run: the largest
relative difference of the losses, the last step's gradients and the parameters, per
precision. Prints one line per comparison and exits non-zero past the tolerance the scripts
use against the unsharded model (logits: 2% of the largest logit; f32 steps: 1e-4; bf16
parameters with f32 reductions: 6e-2).

``--exact`` compares two runs of symm's deterministic mode under other settings (say
``SYMM_PLANS=interpreted`` against the default): that mode promises the same bits whatever
the algorithm, channels or executor, so the logits must be equal bit for bit and the greedy
tokens identical. Against NCCL no such promise holds at world 3 and up: NCCL adds the ranks'
parts in another order, and a greedy choice between two logits within rounding of each
other may go the other way.
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import sys  # noqa: E402

import torch  # noqa: E402


def rel(a, b):
    """The largest difference of ``a`` and ``b`` over the largest magnitude of ``b``."""
    return float((a.float() - b.float()).abs().max() / (b.float().abs().max() + 1e-12))


def transformers(a, b):
    err = float((a["logits"] - b["logits"]).abs().max())
    scale = float(b["logits"].abs().max())
    same = float((a["tokens"] == b["tokens"]).float().mean())
    ok = err <= 0.02 * scale + 0.02
    print(f"transformers, world {a['world']}: {a['backend']} against {b['backend']}: logits max "
          f"|diff| {err:.4f} (max |logit| {scale:.3f}); greedy tokens equal: {same:.3f}; decode "
          f"step {a['step_us']:.0f} us against {b['step_us']:.0f} us "
          f"({b['step_us'] / a['step_us']:.2f}x); {'ok' if ok else 'FAIL'}")
    return ok


def exact(a, b):
    """Deterministic runs: the same bits, the same tokens."""
    same_logits = torch.equal(a["logits"], b["logits"])
    same_tokens = torch.equal(a["tokens"], b["tokens"])
    differ = int((a["logits"] != b["logits"]).sum())
    ok = same_logits and same_tokens and a.get("deterministic") and b.get("deterministic")
    print(f"transformers, world {a['world']}, deterministic: {a.get('settings')} against "
          f"{b.get('settings')}: logits equal bit for bit: {same_logits} ({differ} of "
          f"{a['logits'].numel()} differ); greedy tokens identical: {same_tokens}; "
          f"{'ok' if ok else 'FAIL'}")
    return ok


def fsdp(a, b):
    ok = True
    for name, tol in (("f32", 1e-4), ("bf16", 6e-2)):
        x, y = a[name], b[name]
        worst = {k: max(rel(p, q) for p, q in zip(x[k], y[k])) for k in ("loss", "grad", "param")}
        good = all(v <= tol for v in worst.values())
        ok = ok and good
        diffs = ", ".join(f"{k} {v:.2e}" for k, v in worst.items())
        print(f"fsdp2 {name}, world {a['world']}: {a['backend']} against {b['backend']}: max "
              f"relative diff {diffs} (tolerance {tol:.0e}); {'ok' if good else 'FAIL'}")
    return ok


def main():
    args = sys.argv[1:]
    strict = args[:1] == ["--exact"]
    a, b = (torch.load(p, weights_only=True) for p in args[strict:][:2])
    if a["kind"] != b["kind"] or a["world"] != b["world"]:
        raise SystemExit(f"not the same run: {a['kind']} w{a['world']}, {b['kind']} w{b['world']}")
    if strict:
        ok = a["kind"] == "transformers" and exact(a, b)
    else:
        ok = transformers(a, b) if a["kind"] == "transformers" else fsdp(a, b)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
