"""Host-side tests of the symm Python package: no GPU, no torch."""

import os
import random
import subprocess
import sys

import pytest

import symm

CASES = [
    ("all_reduce", "ring", 4, 4096, "f32", "sum"),
    ("all_reduce", "tree", 3, 1024, "bf16", "max"),
    ("all_reduce", "one_shot", 2, 256, "i32", "sum"),
    ("all_reduce", "two_shot", 8, 8192, "f16", "sum"),
    ("reduce_scatter", "ring", 4, 1024, "f64", "min"),
    ("all_gather", "direct", 5, 512, "u8", "sum"),
    ("broadcast", "ring", 3, 2048, "u32", "sum"),
    ("all_to_all", "pairwise", 4, 256, "i64", "sum"),
    ("gather", "direct", 4, 128, "f32", "sum"),
]


def raw(b):
    return bytes(memoryview(b).cast("B")) if not isinstance(b, bytes) else b


def test_import_needs_no_torch():
    code = "import sys, symm; assert 'torch' not in sys.modules; print(symm.names()['dtypes'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "f32" in out.stdout


def test_import_needs_no_numpy():
    code = (
        "import sys; sys.modules['numpy'] = None\n"
        "import symm\n"
        "r = symm.simulate('all_reduce', 'ring', 2, 64)\n"
        "assert isinstance(r.outputs[0], bytes) and r.matches\n"
        "t = symm.Trace(r.trace)\n"
        "assert isinstance(t.rank, list) and len(t.rank) == len(t)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_simulate_equals_reference(case):
    coll, alg, world, nbytes, dtype, op = case
    r = symm.simulate(coll, alg, world, nbytes, dtype=dtype, op=op, seed=7)
    assert r.matches
    assert len(r.outputs) == world == len(r.inputs)
    want = symm.reference(coll, alg, world, nbytes, r.inputs, dtype=dtype, op=op)
    assert [raw(x) for x in want] == [raw(x) for x in r.reference]
    if dtype in ("f16", "bf16", "f32", "f64") and op == "sum" and world > 2:
        # Float sums may round differently by order; the simulator's check covers them.
        return
    assert [raw(x) for x in r.outputs] == [raw(x) for x in want]
    assert r.time_us > 0


def test_reference_detects_a_wrong_output():
    r = symm.simulate("all_reduce", "ring", 2, 64, dtype="i32")
    inputs = [raw(x) for x in r.inputs]
    inputs[0] = bytes([inputs[0][0] ^ 1]) + inputs[0][1:]
    want = symm.reference("all_reduce", "ring", 2, 64, inputs, dtype="i32")
    assert [raw(x) for x in want] != [raw(x) for x in r.outputs]


def test_trace_reads_back_with_its_header(tmp_path):
    r = symm.simulate("all_reduce", "ring", 4, 4096, dtype="bf16", channels=2)
    path = tmp_path / "run.symmtrace"
    path.write_bytes(r.trace)
    for t in (symm.Trace(r.trace), symm.Trace(path), symm.Trace(str(path))):
        h = t.header
        assert (h["collective"], h["algorithm"], h["world"], h["channels"], h["bytes"]) == (
            "all_reduce", "ring", 4, 2, 4096)
        assert h["dtype"] == "bf16" and h["source"] == "simulator"
        assert len(t) == 2 * r.ops and t.warning is None
        assert set(int(x) for x in t.rank) == {0, 1, 2, 3}
        assert set(int(x) for x in t.channel) == {0, 1}
        assert set(int(x) for x in t.kind) == {0, 1}
        assert all(t.op_names[int(o)] for o in t.op)
        assert len(t.events["time_ns"]) == len(t)


def test_cut_trace_reads_with_a_warning():
    r = symm.simulate("all_gather", "ring", 3, 192)
    t = symm.Trace(r.trace[:-20])
    assert t.warning and 0 < len(t) < 2 * r.ops


@pytest.mark.parametrize("cut", [0, 1, 8, 13, 16, 20])
def test_truncated_header_is_a_trace_error(cut):
    r = symm.simulate("all_reduce", "ring", 2, 64)
    with pytest.raises(symm.TraceError) as e:
        symm.Trace(r.trace[:cut])
    assert isinstance(e.value, ValueError) and isinstance(e.value, symm.SymmError)


def test_hostile_bytes_raise_trace_errors_only():
    r = symm.simulate("all_reduce", "tree", 4, 1024)
    good = r.trace
    rng = random.Random(1)
    inputs = [bytes(rng.getrandbits(8) for _ in range(n)) for n in (0, 5, 64, 4096)]
    # Huge length fields: the header length, then every u32 position overwritten with 2^32-1.
    for pos in range(8, min(len(good), 200), 7):
        inputs.append(good[:pos] + b"\xff\xff\xff\xff" + good[pos + 4:])
    for _ in range(300):
        b = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.getrandbits(8)
        inputs.append(bytes(b))
    failed = 0
    for data in inputs:
        try:
            symm.Trace(data)
        except symm.TraceError as e:
            failed += 1
            assert e.offset is None or 0 <= e.offset <= len(data)
    assert failed > len(inputs) // 2


def test_bad_magic_names_offset_zero():
    with pytest.raises(symm.TraceError) as e:
        symm.Trace(b"NOTATRACE" * 4)
    assert e.value.offset == 0


def test_trace_size_cap():
    with pytest.raises(symm.TraceError):
        symm.Trace(b"SYMMTRCE" + bytes(100), max_bytes=64)
    with pytest.raises(TypeError):
        symm.Trace(12)


def test_cost_select_returns_a_valid_algorithm():
    algs = symm.names()["algorithms"]
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        for nbytes in (1024, 1 << 20, 1 << 28):
            a = symm.cost.select(coll, 8, nbytes, dtype="bf16")
            assert a in algs
            assert symm.cost.predict(coll, a, 8, nbytes, dtype="bf16") > 0
    small = symm.cost.predict("all_reduce", "one_shot", 8, 1024)
    assert small < symm.cost.predict("all_reduce", "ring", 8, 1024)
    alg, channels, source = symm.cost.tune("all_reduce", 8, 1 << 20)
    assert alg in algs and channels >= 1 and source in ("calibrated", "model")


@pytest.mark.parametrize(
    "call",
    [
        lambda: symm.simulate("all_reduc", "ring", 4, 64),
        lambda: symm.simulate("all_reduce", "rink", 4, 64),
        lambda: symm.simulate("all_reduce", "ring", 4, 64, dtype="float33"),
        lambda: symm.simulate("all_reduce", "ring", 4, 64, op="plus"),
        lambda: symm.simulate("all_reduce", "ring", 0, 64),
        lambda: symm.simulate("all_reduce", "ring", 1 << 20, 64),
        lambda: symm.simulate("all_reduce", "ring", 4, -4),
        lambda: symm.simulate("all_reduce", "ring", 4, 63),
        lambda: symm.simulate("all_reduce", "ring", 4, 1 << 40),
        lambda: symm.simulate("all_reduce", "ring", 4, 64, channels=0),
        lambda: symm.simulate("broadcast", "ring", 4, 64, root=4),
        lambda: symm.simulate("all_to_all", "one_shot_ll", 4, 64),
        lambda: symm.reference("all_reduce", "ring", 2, 64, [b"", b""]),
        lambda: symm.cost.select("nope", 8, 64),
        lambda: symm.cost.predict("all_reduce", "ring", 8, 64, topology="pcie"),
    ],
)
def test_bad_arguments_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_bad_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="one_shot"):
        symm.simulate("all_reduce", "rink", 4, 64)


def test_error_classes():
    e = symm.TimeoutError("late", rank=1, peer=2, slot=3, expected=4, found=5)
    assert (e.rank, e.peer, e.slot, e.expected, e.found) == (1, 2, 3, 4, 5)
    assert symm.PeerLostError("gone", rank=3).rank == 3
    assert issubclass(symm.PoisonedError, symm.SymmError)
    assert not issubclass(symm.TimeoutError, ValueError)


def test_timeout_fields_are_optional_for_host_deadlines():
    e = symm.TimeoutError("an exchange passed its deadline")
    assert (e.rank, e.peer, e.slot, e.expected, e.found) == (None,) * 5
    assert symm.PeerLostError("gone").rank is None


def test_version_is_the_package_version():
    import re
    from pathlib import Path

    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", symm.__version__), symm.__version__
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    if pyproject.exists():
        assert f'version = "{symm.__version__}"' in pyproject.read_text()


@pytest.mark.parametrize("topology", ["nvlink", "shared_device"])
@pytest.mark.parametrize("nbytes", [1024, 1 << 16, 1 << 20, 1 << 28])
def test_a_request_is_symms_automatic_choice(topology, nbytes):
    r = symm.Request("all_reduce", 4, nbytes, "bf16", topology=topology)
    alg, channels, _ = symm.cost.tune("all_reduce", 4, nbytes, "bf16", topology=topology)
    assert (r.algorithm, r.channels) == (alg, channels)
    assert (r.collective, r.world, r.nbytes, r.dtype, r.op) == ("all_reduce", 4, nbytes,
                                                                 "bf16", "sum")
    assert r.root is None
    assert r.buffer_sizes()[:2] == (nbytes, nbytes)
    assert r == symm.Request("all_reduce", 4, nbytes, "bf16", topology=topology)
    assert hash(r) == hash(symm.Request("all_reduce", 4, nbytes, "bf16", topology=topology))


def test_a_request_keeps_what_the_caller_forces():
    r = symm.Request("broadcast", 8, 1 << 20, "f32", algorithm="ring", root=3)
    assert (r.algorithm, r.root) == ("ring", 3)
    assert r.channels == symm.Request("all_reduce", 8, 1 << 20, algorithm="ring").channels
    assert symm.Request("all_reduce", 8, 4096, channels=2).channels == 2
    assert repr(r) == ("Request('broadcast', world=8, nbytes=1048576, dtype='f32', op='sum', "
                       f"algorithm='ring', channels={r.channels}, root=3)")


@pytest.mark.parametrize("nbytes", [1024, 1 << 20, 1 << 28])
def test_a_deterministic_request_gives_the_rank_order_bits(nbytes):
    # symm's choice honours the mode at every size; the default may not.
    r = symm.Request("all_reduce", 4, nbytes, "bf16", deterministic=True)
    assert r.deterministic and r.nbytes == nbytes
    assert symm.Request("all_reduce", 4, nbytes, "i32", algorithm="ring").deterministic
    assert not symm.Request("all_reduce", 4, nbytes, "bf16", algorithm="ring").deterministic
    with pytest.raises(ValueError, match="deterministic"):
        symm.Request("all_reduce", 4, nbytes, "bf16", algorithm="ring", deterministic=True)


def test_the_rank_order_reference_is_what_deterministic_algorithms_compute():
    import struct
    # Rank order, f32: (1e8 + 1) - 1e8 = 0, as 1e8 + 1 rounds to 1e8 at the first step;
    # the order 1e8 - 1e8 + 1 would give 1. Every rank gets it, whatever the algorithm named.
    vals = [1e8, 1.0, -1e8, 0.0]
    inputs = [struct.pack("<4f", v, v, v, v) for v in vals]
    for alg in ("one_shot", "ring"):
        want = symm.reference("all_reduce", alg, 4, 16, inputs, "f32", rank_order=True)
        assert [bytes(w) for w in want] == [struct.pack("<4f", 0.0, 0.0, 0.0, 0.0)] * 4
    with pytest.raises(TypeError, match="rank_order"):
        symm.reference("all_reduce", "ring", 4, 16, inputs, "f32", rank_order=1)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"collective": "all_reduc"}, "unknown collective"),
        ({"dtype": "float33"}, "unknown dtype"),
        ({"op": "plus"}, "unknown op"),
        ({"algorithm": "rink"}, "unknown algorithm"),
        ({"topology": "pcie"}, "unknown topology"),
        ({"world": 0}, "world 0"),
        ({"nbytes": -4}, "negative"),
        ({"nbytes": 63}, "does not schedule"),
        ({"channels": 0}, "channels 0"),
        ({"algorithm": "one_shot_ll", "nbytes": 1 << 30}, "does not schedule"),
        ({"collective": "broadcast", "root": 4}, "root 4"),
    ],
)
def test_bad_requests_raise_value_error(kwargs, match):
    args = {"collective": "all_reduce", "world": 4, "nbytes": 64, **kwargs}
    with pytest.raises(ValueError, match=match):
        symm.Request(**args)


def test_names_come_from_the_one_list():
    n = symm.names()
    assert "all_to_allv" in n["collectives"] and "send_recv" in n["collectives"]
    assert n["topologies"] == ["nvlink", "shared_device"]


def test_low_latency_scratch_is_sized_by_the_message():
    # Four bytes over 1024 ranks and 16 channels at world 72 run, in the memory their messages
    # need, and match the reference.
    for alg in ("one_shot_ll", "one_shot_ll128"):
        assert symm.simulate("all_reduce", alg, world=1024, nbytes=4).matches
    assert symm.simulate("all_reduce", "one_shot_ll", world=72, nbytes=4096, channels=16).matches


def test_a_run_over_the_host_memory_bound_is_a_value_error_not_an_abort():
    # 64 KiB over 1024 ranks: 256 MiB of low-latency regions per rank, over the bound.
    for alg in ("one_shot_ll", "one_shot_ll128"):
        with pytest.raises(ValueError, match="host backend takes at most") as e:
            symm.simulate("all_reduce", alg, world=1024, nbytes=64 << 10)
        # The error speaks the user's words, not Rust's debug text.
        assert "TooLarge" not in str(e.value)


def test_integer_arguments_out_of_range_are_value_errors_and_non_integers_type_errors():
    with pytest.raises(ValueError, match="nbytes"):
        symm.simulate("all_reduce", "ring", world=2, nbytes=2**64)
    with pytest.raises(ValueError, match="world"):
        symm.cost.predict("all_reduce", "ring", world=-(2**70), nbytes=64)
    with pytest.raises(TypeError, match="nbytes"):
        symm.cost.tune("all_reduce", world=2, nbytes="64")
    with pytest.raises(TypeError, match="world"):
        symm.reference("all_reduce", "ring", world=True, nbytes=64, inputs=[b"\0" * 64] * 2)
    with pytest.raises(ValueError, match="seed"):
        symm.simulate("all_reduce", "ring", world=2, nbytes=64, seed=-1)


def test_reference_wants_a_buffer_per_rank():
    with pytest.raises(TypeError, match="one buffer per rank"):
        symm.reference("all_reduce", "ring", world=2, nbytes=8, inputs=b"\0" * 16)
    with pytest.raises(TypeError, match="one buffer per rank"):
        symm.reference("all_reduce", "ring", world=2, nbytes=8, inputs=[1, 2])


def test_a_trace_limit_is_positive_and_a_file_is_read_at_most_one_byte_past_it(tmp_path):
    with pytest.raises(ValueError, match="positive"):
        symm.Trace(b"", max_bytes=-1)
    with pytest.raises(TypeError, match="max_bytes"):
        symm.Trace(b"", max_bytes=1.5)
    big = tmp_path / "big.trace"
    big.write_bytes(b"\0" * 4096)
    with pytest.raises(symm.TraceError, match="over 100 bytes"):
        symm.Trace(big, max_bytes=100)
    # A device is read up to the limit and one byte more, then refused.
    if os.path.exists("/dev/zero"):
        with pytest.raises(symm.TraceError, match="over 1000 bytes"):
            symm.Trace("/dev/zero", max_bytes=1000)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
def test_ctrl_c_interrupts_a_long_simulation():
    import signal
    import time

    # A simulation of about a minute; Ctrl-C must end it within a second or two. The child
    # answers Ctrl-C as an interactive Python does, whatever this process inherited (a job
    # started in the background by a shell without job control ignores SIGINT, and so would
    # every program it starts).
    code = ("import signal\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "import symm\n"
            "print('started', flush=True)\n"
            "symm.simulate('all_reduce', 'ring', world=512, nbytes=256 << 10, channels=8)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "started"
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        t = time.monotonic()
        _, err = p.communicate(timeout=20)
        assert time.monotonic() - t < 5, "the run ignored Ctrl-C"
        assert "KeyboardInterrupt" in err, err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_all_to_allv_is_reachable_where_the_other_collectives_are():
    # Its nbytes is every rank's buffer: the largest row or column total of its counts.
    r = symm.Request("all_to_allv", 4, 1 << 20)
    assert r.algorithm == "pairwise"
    assert symm.cost.predict("all_to_allv", "pairwise", 4, 1 << 20) > 0
    assert symm.cost.select("all_to_allv", 4, 1 << 20) == "pairwise"
    assert symm.cost.tune("all_to_allv", 4, 1 << 20)[0] == "pairwise"
    # Runs that need its per-pair counts say so.
    with pytest.raises(ValueError, match="per-pair counts"):
        symm.simulate("all_to_allv", "pairwise", 4, 64)
    with pytest.raises(ValueError, match="per-pair counts"):
        symm.reference("all_to_allv", "pairwise", 4, 64, inputs=[b"\0" * 64] * 4)
