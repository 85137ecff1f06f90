"""symm.moe without a GPU or torch: the import, and the argument checks that run before
anything reaches the GPU (on stand-in tensors carrying what the checks read).
"""

import subprocess
import sys

import pytest

import symm
from symm import moe


class DType:
    def __init__(self, name, size):
        self.name, self.size = name, size

    def __repr__(self):
        return f"torch.{self.name}"


BF16, F32, F16, I64, I32 = (DType("bfloat16", 2), DType("float32", 4), DType("float16", 2),
                            DType("int64", 8), DType("int32", 4))


class Tensor:
    """What the checks read of a torch.Tensor."""

    def __init__(self, shape, dtype, device=0, contiguous=True):
        self.shape = tuple(shape)
        self.dtype = dtype
        self._device = device
        self._contiguous = contiguous

    @property
    def device(self):
        return "cpu" if self._device < 0 else f"cuda:{self._device}"

    def dim(self):
        return len(self.shape)

    def get_device(self):
        return self._device

    def is_contiguous(self):
        return self._contiguous


def spec(hidden=16, topk=2, tokens_max=64, rows_max=256, dtype=BF16):
    return moe._Spec(Tensor, 0, dtype, I64, F32, hidden, topk, tokens_max, rows_max)


def args(tokens=8, hidden=16, topk=2, dtype=BF16):
    return (Tensor((tokens, hidden), dtype), Tensor((tokens, topk), I64),
            Tensor((tokens, topk), F32))


def test_moe_imports_without_torch():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import symm.moe\n"
        "import symm\n"
        "assert symm.moe is symm.moe\n"
        "assert 'torch' not in sys.modules\n"
        "print(symm.moe.MODES)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "('normal', 'low_latency')"


def test_moe_is_exported():
    assert "moe" in symm.__all__
    assert symm.moe is moe
    for name in moe.__all__:
        obj = getattr(moe, name)
        if callable(obj) or isinstance(obj, type):
            assert (obj.__doc__ or "").strip(), name


@pytest.mark.parametrize("make", [
    lambda: moe.Buffer(8, 2, 64, 16),
    lambda: moe.AllToAllv(16, None),
    lambda: moe.all_to_allv(None, None, 16),
])
def test_gpu_objects_need_init(make):
    with pytest.raises(symm.SymmError, match="not initialized"):
        make()


def test_shape_defaults_rows_max_to_every_entry():
    assert moe._shape(4, 8, 2, 64, 16, None) == (8, 2, 64, 16, 4 * 64 * 2)
    assert moe._shape(4, 8, 2, 64, 16, 100) == (8, 2, 64, 16, 100)
    assert moe._shape(1, 1, 1, 1, 1, None) == (1, 1, 1, 1, 1)


@pytest.mark.parametrize("world,experts,topk,tokens_max,hidden,rows_max,match", [
    (0, 8, 2, 64, 16, None, "1 to 64 ranks"),
    (65, 65, 2, 64, 16, None, "1 to 64 ranks"),
    (4, 6, 2, 64, 16, None, "multiple of the world size 4"),
    (4, 0, 2, 64, 16, None, "multiple of the world size"),
    (4, -4, 2, 64, 16, None, "multiple of the world size"),
    (4, 4100, 2, 64, 16, None, "at most 4096"),
    (4, 8, 0, 64, 16, None, "topk must be in 1..8"),
    (4, 8, 9, 64, 16, None, "topk must be in 1..8"),
    (4, 64, 33, 64, 16, None, "topk must be in 1..32"),
    (4, 8, 2, 0, 16, None, "tokens_max must be"),
    (4, 8, 2, 64, 0, None, "hidden must be"),
    (4, 8, 2, 64, 1 << 32, None, "hidden must be"),
    (4, 8, 2, 64, 16, 0, "rows_max must be"),
    (4, 8, 2, 64, 16, 1 << 31, "rows_max must be"),
    (64, 4096, 32, 1 << 20, 16, None, "give a smaller rows_max"),
])
def test_shape_errors(world, experts, topk, tokens_max, hidden, rows_max, match):
    with pytest.raises(ValueError, match=match):
        moe._shape(world, experts, topk, tokens_max, hidden, rows_max)


@pytest.mark.parametrize("bad", [2.0, "8", True, None])
def test_shape_wants_ints(bad):
    with pytest.raises(TypeError, match="experts must be an int"):
        moe._shape(4, bad, 2, 64, 16, None)
    with pytest.raises(TypeError, match="rows_max must be an int"):
        moe._shape(4, 8, 2, 64, 16, bad if bad is not None else 1.5)


def test_token_dtypes():
    assert moe._token_dtype(BF16, BF16, F32) == "bf16"
    assert moe._token_dtype(F32, BF16, F32) == "f32"
    with pytest.raises(TypeError, match="bfloat16 or torch.float32, not torch.float16"):
        moe._token_dtype(F16, BF16, F32)


def test_modes():
    assert moe._mode("normal") == "normal"
    assert moe._mode("low_latency") == "low_latency"
    with pytest.raises(ValueError, match="'normal' or 'low_latency', got 'fast'"):
        moe._mode("fast")
    with pytest.raises(TypeError, match="mode must be a str"):
        moe._mode(1)


def test_dispatch_accepts_good_arguments():
    assert moe._check_dispatch(spec(), *args(), "normal") == 8
    assert moe._check_dispatch(spec(), *args(tokens=0), "low_latency") == 0
    assert moe._check_dispatch(spec(tokens_max=200), *args(tokens=200), "normal") == 200
    assert moe._check_dispatch(spec(dtype=F32), *args(dtype=F32), "normal") == 8


def swap(i, t):
    a = list(args())
    a[i] = t
    return a


@pytest.mark.parametrize("a,err,match", [
    (swap(0, [[0.0] * 16] * 8), TypeError, "x must be a torch.Tensor, got list"),
    (swap(0, Tensor((8, 16), F32)), TypeError, "x must be torch.bfloat16, got torch.float32"),
    (swap(0, Tensor((8, 16), F16)), TypeError, "x must be torch.bfloat16"),
    (swap(1, Tensor((8, 2), I32)), TypeError, "topk_idx must be torch.int64, got torch.int32"),
    (swap(2, Tensor((8, 2), BF16)), TypeError, "topk_weights must be torch.float32"),
    (swap(0, Tensor((8 * 16,), BF16)), ValueError, "x must have 2 dimensions"),
    (swap(1, Tensor((16,), I64)), ValueError, "topk_idx must have 2 dimensions"),
    (swap(0, Tensor((8, 16), BF16, device=-1)), ValueError, "x is on cpu; this rank's GPU"),
    (swap(2, Tensor((8, 2), F32, device=1)), ValueError, "topk_weights is on cuda:1"),
    (swap(0, Tensor((8, 16), BF16, contiguous=False)), ValueError, "x must be contiguous"),
    (swap(1, Tensor((8, 2), I64, contiguous=False)), ValueError, "topk_idx must be contiguous"),
    (swap(0, Tensor((8, 32), BF16)), ValueError, "hidden size is 16"),
    (swap(1, Tensor((8, 3), I64)), ValueError, r"topk_idx has shape \(8, 3\)"),
    (swap(1, Tensor((7, 2), I64)), ValueError, r"\(8, 2\) is expected"),
    (swap(2, Tensor((8, 1), F32)), ValueError, r"topk_weights has shape \(8, 1\)"),
])
def test_dispatch_errors(a, err, match):
    with pytest.raises(err, match=match):
        moe._check_dispatch(spec(), *a, "normal")


def test_dispatch_token_bounds():
    with pytest.raises(ValueError, match="65 tokens: a normal dispatch .* at most 64"):
        moe._check_dispatch(spec(), *args(tokens=65), "normal")
    s = spec(tokens_max=1000)
    assert moe._check_dispatch(s, *args(tokens=128), "low_latency") == 128
    with pytest.raises(ValueError, match="129 tokens: a low_latency dispatch .* at most 128"):
        moe._check_dispatch(s, *args(tokens=129), "low_latency")
    with pytest.raises(ValueError, match="'normal' or 'low_latency'"):
        moe._check_dispatch(s, *args(), "ll")


def test_combine_checks():
    s = spec()
    moe._check_combine(s, Tensor((256, 16), BF16))
    with pytest.raises(ValueError, match=r"expert_out has shape \(8, 16\); .* \(256, 16\)"):
        moe._check_combine(s, Tensor((8, 16), BF16))
    with pytest.raises(TypeError, match="expert_out must be torch.bfloat16"):
        moe._check_combine(s, Tensor((256, 16), F32))
    with pytest.raises(ValueError, match="expert_out must be contiguous"):
        moe._check_combine(s, Tensor((256, 16), BF16, contiguous=False))
    with pytest.raises(ValueError, match="expert_out is on cpu"):
        moe._check_combine(s, Tensor((256, 16), BF16, device=-1))


def test_all_to_allv_checks():
    def check(inp, counts, world=4):
        moe._check_a2av(Tensor, 0, world, BF16, I64, inp, counts)

    check(Tensor((100,), BF16), Tensor((4,), I64))
    check(Tensor((10, 10), BF16), Tensor((4,), I64))
    check(Tensor((0,), BF16), Tensor((1,), I64), world=1)
    with pytest.raises(ValueError, match=r"send_counts has shape \(3,\); .* \(4,\)"):
        check(Tensor((100,), BF16), Tensor((3,), I64))
    with pytest.raises(TypeError, match="send_counts must be torch.int64, got torch.int32"):
        check(Tensor((100,), BF16), Tensor((4,), I32))
    with pytest.raises(ValueError, match="send_counts is on cpu"):
        check(Tensor((100,), BF16), Tensor((4,), I64, device=-1))
    with pytest.raises(TypeError, match="input must be torch.bfloat16, got torch.float32"):
        check(Tensor((100,), F32), Tensor((4,), I64))
    with pytest.raises(ValueError, match="input must be contiguous"):
        check(Tensor((100,), BF16, contiguous=False), Tensor((4,), I64))
    with pytest.raises(TypeError, match="input must be a torch.Tensor, got bytes"):
        check(b"", Tensor((4,), I64))
    assert moe._check_out_max(5) == 5
    with pytest.raises(ValueError, match="out_max must be at least 1"):
        moe._check_out_max(0)
    with pytest.raises(TypeError, match="out_max must be an int"):
        moe._check_out_max(1.0)
