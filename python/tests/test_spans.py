"""Calls whose tensors do not cover the spans the kernel would read and write are refused
before anything is enqueued, and a stream must be torch's: checked on a stand-in job (no GPU;
skipped without torch).
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import types  # noqa: E402

import pytest  # noqa: E402

torch = pytest.importorskip("torch")

from symm import _gpu  # noqa: E402
from symm.distributed._local import SymmLocal  # noqa: E402

W = 2


class Comm:
    """What the collectives ask of the runtime: a request per call shape."""

    def request(self, *args):
        return ("request",) + args


class Job:
    """A job of two ranks whose "GPU" is the CPU: it records what would be enqueued."""

    def __init__(self):
        self.comm = Comm()
        self.torch = torch
        self.device = torch.device("cpu")
        self.tensor = torch.Tensor
        self.index = -1  # a CPU tensor's get_device()
        self.rank = 0
        self.world = W
        self.requests = {}
        self.enqueued = []

    def collective(self, *args):
        self.enqueued.append(args)

    def current_stream(self):
        return 0


@pytest.fixture
def job(monkeypatch):
    monkeypatch.setattr(_gpu, "_DTYPES", {torch.float32: "f32", torch.bfloat16: "bf16"})
    return Job()


def test_matching_tensors_enqueue_their_spans(job):
    local = SymmLocal(job)
    out, inp = torch.zeros(8 * W), torch.zeros(8)
    local.all_gather(out, inp)
    local.reduce_scatter(inp, out, "sum")
    assert [(a[2], a[4]) for a in job.enqueued] == [(32, 32 * W), (32 * W, 32)]


@pytest.mark.parametrize("call,error", [
    # The output of another dtype: half the bytes the gather writes.
    (lambda s: s.all_gather(torch.zeros(8 * W, dtype=torch.bfloat16), torch.zeros(8)),
     TypeError),
    # The input of a narrower dtype: half the bytes the reduction reads.
    (lambda s: s.reduce_scatter(torch.zeros(8), torch.zeros(8 * W, dtype=torch.bfloat16),
                                "sum"), TypeError),
    # Fewer elements than the world's blocks.
    (lambda s: s.reduce_scatter(torch.zeros(8), torch.zeros(8 * W - 1), "sum"), ValueError),
    (lambda s: s.all_gather(torch.zeros(8 * W - 2), torch.zeros(8)), ValueError),
    (lambda s: s.all_to_all(torch.zeros(4 * W - 1), torch.zeros(4 * W)), ValueError),
    (lambda s: s.scatter(torch.zeros(8), torch.zeros(8 * W - 1), 0), ValueError),
    (lambda s: s.gather(torch.zeros(8 * W + 1), torch.zeros(8), 0), ValueError),
])
def test_tensors_short_of_their_spans_are_refused_before_any_launch(job, call, error):
    with pytest.raises(error, match="must match|bytes where the call needs"):
        call(SymmLocal(job))
    assert job.enqueued == []


def test_a_stream_must_be_torchs(job):
    for fake in (types.SimpleNamespace(cuda_stream=0xDEAD), 7, "stream"):
        with pytest.raises(ValueError, match="torch.cuda.Stream"):
            _gpu._stream(job, fake)
    assert _gpu._stream(job, None) == 0


def test_all_to_all_splits_are_checked_whole_on_every_rank(job, monkeypatch):
    from symm import _alltoall

    monkeypatch.setattr(_gpu, "_job", job)
    # Rank 0 sends 1 row to itself and 2 to rank 1, and receives 1 and 3.
    inp, out = torch.zeros(3, 4), torch.zeros(4, 4)

    def run(theirs):
        job.comm.exchange = lambda m: [m, theirs]
        return _alltoall.all_to_all_single(out, inp, [1, 3], [1, 2])

    # Rank 1 expects 5 rows from rank 0, which sends 2: named here too, not only on rank 1.
    with pytest.raises(ValueError, match="rank 0 sends 2 rows to rank 1, which expects 5"):
        run(b"3,1;5,1")
    for bad in (b"3,1", b"3;1", b"x,1;2,1", b"3,-1;2,1", b"\xff;\xff", b"3,1,0;2,1"):
        with pytest.raises(ValueError, match="not 2 non-negative counts"):
            run(bad)
    assert job.enqueued == []
    run(b"3,1;2,1")
    assert len(job.enqueued) == 1
