"""Faults a job survives (run under torchrun, every rank the same tests in the same order).

Each fault is injected on the last rank. Every rank records the error it got and how long after
its call it came (printed, and collected into ``docs/hw-results.md``); then ``symm.reset()`` on
every rank, 100 all-reduces bit exact, and the heap's blocks and the process's descriptors as
they were before the fault.

Calls that differ on first use are named by the runtime's agreement of first uses, on every
rank, at once. Calls that differ where every rank has used its shape before launch without
that agreement: the call's signature, pushed to every peer by the kernel, names them.
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import signal  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import symm  # noqa: E402

if "WORLD_SIZE" not in os.environ:
    pytest.skip("run under torchrun", allow_module_level=True)

DEADLINE = 2.0
N = 1000


@pytest.fixture(scope="module", autouse=True)
def job():
    symm.init(timeout=DEADLINE, bootstrap_timeout=30.0)
    yield
    symm.finalize()


def last():
    return symm.rank() == symm.world_size() - 1


def fds():
    return len(os.listdir("/proc/self/fd"))


def sums_are_right(calls=100):
    w = symm.world_size()
    for i in range(calls):
        t = torch.full((N + i % 17,), float(i % 5 + symm.rank()), device="cuda")
        symm.all_reduce(t)
        want = float(w * (i % 5) + w * (w - 1) // 2)
        symm.synchronize()
        assert torch.equal(t, torch.full_like(t, want)), i


_last_shape = [7000]


def fresh():
    """A size no earlier call used (the same on every rank: they run the same tests)."""
    _last_shape[0] += 24
    return _last_shape[0]


def collective(kind, variant, n):
    """One collective of `kind` over `n` elements, its tensor made now (so a fault's time is the
    collective's, not the allocation's); `variant` 1 is the last rank's differing version of
    it. Returns the call."""
    if kind == "size":
        t = torch.ones(n + 8 * variant, device="cuda")
        return lambda: symm.all_reduce(t)
    if kind == "dtype":
        # The same bytes in another type.
        t = torch.ones(2 * n, dtype=torch.bfloat16, device="cuda") if variant else \
            torch.ones(n, device="cuda")
        return lambda: symm.all_reduce(t)
    if kind == "op":
        t = torch.ones(n, device="cuda")
        return lambda: symm.all_reduce(t, op="max" if variant else "sum")
    if kind == "collective":
        t = torch.ones(n, device="cuda")
        return (lambda: symm.broadcast(t, src=0)) if variant else (lambda: symm.all_reduce(t))
    if kind == "root":
        t = torch.ones(n, device="cuda")
        return lambda: symm.broadcast(t, src=variant)
    raise AssertionError(kind)


def call(kind, variant, n):
    collective(kind, variant, n)()


def fault(run):
    """Runs `run` (this rank's part of a fault), then waits for the stream; returns the error
    and the seconds it took (None when this rank saw nothing wrong)."""
    t0 = time.monotonic()
    err = None
    try:
        run()
        symm.synchronize()
    except (symm.SymmError, ValueError) as e:
        err = e
    return err, time.monotonic() - t0


def survive(name, run):
    """The fault `run`, then the recovery every test needs whatever the fault did: reset, 100
    sums bit exact, the heap's blocks and the descriptors as before. Returns this rank's error,
    its time, and whether each rank saw an error."""
    before = (symm.heap_usage(), fds())
    try:
        err, took = fault(run)
    except RuntimeError as e:  # the application's own exception
        err, took = e, 0.0
    what = "nothing" if err is None else f"{type(err).__name__}: {str(err)[:100]}"
    r, w = symm.rank(), symm.world_size()
    print(f"\nfault {name} rank {r}/{w}: {what} after {took * 1e3:.1f} ms")
    seen = [None] * w
    dist.all_gather_object(seen, err is not None)
    symm.reset()
    sums_are_right()
    assert symm.heap_usage() == before[0]
    assert fds() == before[1]
    return err, took, seen


KINDS = ["size", "dtype", "op", "collective", "root"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_that_differs_on_first_use_is_named_within_10_ms_and_reset_recovers(kind):
    n = fresh()
    err, took, _ = survive(f"{kind} differs, first use", collective(kind, int(last()), n))
    assert isinstance(err, ValueError) and "different arguments" in str(err), err
    assert took < 0.01, took


def used_before(kind):
    # Every rank uses both versions first, so neither goes through the first-use agreement.
    n = fresh()
    for v in (0, 1):
        call(kind, v, n)
        call(kind, v, n)
    symm.synchronize()
    return n


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_that_differs_after_use_then_reset_recovers(kind):
    n = used_before(kind)
    survive(f"{kind} differs, used before", collective(kind, int(last()), n))


@pytest.mark.parametrize("kind", ["size", "dtype", "op", "collective"])
def test_a_call_that_differs_after_use_is_named_on_every_rank_within_10_ms(kind):
    # Every rank waits for a signal or a line of every other in these calls, so the peer's
    # signature has arrived by the end of the call, or while a wait spins.
    n = used_before(kind)
    err, took, _ = survive(f"{kind} differs, used before", collective(kind, int(last()), n))
    assert isinstance(err, ValueError) and "different arguments" in str(err), err
    assert took < 0.01, took


@pytest.mark.parametrize("twice", [False, True], ids=["skips", "calls twice"])
def test_a_rank_that_skips_a_call_or_calls_twice_is_named_on_every_rank_and_reset_recovers(twice):
    n = used_before("size")
    m = fresh()
    a, b = torch.ones(n, device="cuda"), torch.ones(m, device="cuda")

    def run():
        for _ in range(1 if not last() else 2 if twice else 0):
            symm.all_reduce(a)
        symm.all_reduce(b)

    # The next call is a first use on every rank, where the counts of calls before it differ:
    # every rank names it at once.
    err, took, seen = survive("a call twice" if twice else "a skipped call", run)
    assert all(seen), seen
    assert isinstance(err, ValueError) and "skipped a call or made one more" in str(err), err
    assert took < 0.01, took


def test_an_exception_between_two_collectives_then_reset_recovers():
    t = torch.ones(N, device="cuda")

    def run():
        symm.all_reduce(t)
        if last():
            raise RuntimeError("the model failed between two collectives")
        symm.all_reduce(t)

    _, _, seen = survive("an exception between collectives", run)
    assert all(seen), seen


def test_a_rank_stopped_past_the_deadline_then_continued_fails_typed_and_recovers():
    pids = [None] * symm.world_size()
    dist.all_gather_object(pids, os.getpid())
    t = torch.ones(N, device="cuda")
    symm.all_reduce(t)
    symm.synchronize()
    dist.barrier()

    def run():
        if last():
            # Rank 0 continues this process once its own call failed at its deadline.
            os.kill(os.getpid(), signal.SIGSTOP)
            symm.all_reduce(t)
            return
        try:
            symm.all_reduce(t)
            symm.synchronize()
        finally:
            if symm.rank() == 0:
                os.kill(pids[-1], signal.SIGCONT)

    err, took, _ = survive("a rank stopped past the deadline", run)
    # The stopped rank may still finish its call (its peers delivered before they gave up);
    # every other rank fails at its deadline, typed.
    if not last():
        assert isinstance(err, symm.TimeoutError), err
        assert DEADLINE <= took < 3 * DEADLINE, took
