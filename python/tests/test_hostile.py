"""Hostile input to every function of the host API: each bad argument is a ValueError or a
TypeError in Python's words (never Rust's Debug text), and the package stays usable after it."""

import re

import pytest

import symm
import symm.cost

# Rust Debug text: a struct or enum variant with braces, or a bare variant name of an error.
DEBUG = re.compile(r"\w+ \{ \w+: |BadWorld|TooLarge|AboveLimit|Sched\(|Some\(|None\b")

SIM = dict(collective="all_reduce", algorithm="ring", world=4, nbytes=64)
COST = dict(collective="all_reduce", world=4, nbytes=64)

# (function, keyword arguments, exception): every function, every kind of argument.
CASES = []
for fn, base in [
    (symm.simulate, SIM),
    (lambda **k: symm.reference(inputs=[b"\0" * 64] * 4, **k), SIM),
    (symm.cost.predict, SIM),
    (symm.cost.select, COST),
    (symm.cost.tune, COST),
    (symm.Request, COST),
]:
    for bad, exc in [
        ({"collective": "all_reduc"}, ValueError),
        ({"collective": 3}, TypeError),
        ({"world": 0}, ValueError),
        ({"world": 2**64}, ValueError),
        ({"world": -(2**70)}, ValueError),
        ({"world": 4.0}, TypeError),
        ({"world": True}, TypeError),
        ({"nbytes": -1}, ValueError),
        ({"nbytes": 2**64}, ValueError),
        ({"nbytes": "64"}, TypeError),
        ({"nbytes": None}, TypeError),
        ({"dtype": "float33"}, ValueError),
        ({"dtype": b"f32"}, TypeError),
        ({"op": "plus"}, ValueError),
        ({"channels": 0}, ValueError),
        ({"channels": 10**6}, ValueError),
    ]:
        if fn is symm.cost.tune and "channels" in bad:
            continue  # tune chooses the channels itself
        CASES.append((fn, {**base, **bad}, exc))
for bad, exc in [({"algorithm": "rink"}, ValueError), ({"algorithm": None}, TypeError),
                 ({"algorithm": "one_shot_ll", "nbytes": 1 << 30}, ValueError),
                 ({"seed": -1}, ValueError),
                 ({"collective": "broadcast", "root": 9}, ValueError)]:
    CASES.append((symm.simulate, {**SIM, **bad}, exc))
for inputs, exc in [(b"\0" * 256, TypeError), ([1, 2, 3, 4], TypeError),
                    ([b"\0" * 63] * 4, ValueError), ([b"\0" * 64] * 3, ValueError)]:
    CASES.append((lambda inputs=inputs, **k: symm.reference(inputs=inputs, **k), SIM, exc))
for kwargs, exc in [({"source": 5}, TypeError), ({"source": b"", "max_bytes": 0}, ValueError),
                    ({"source": b"", "max_bytes": -1}, ValueError),
                    ({"source": b"", "max_bytes": "1"}, TypeError),
                    ({"source": "/nonexistent/symm.trace"}, OSError)]:
    CASES.append((symm.Trace, kwargs, exc))


@pytest.mark.parametrize("fn, kwargs, exc", CASES,
                         ids=[f"{i}-{sorted(k)}" for i, (_, k, _) in enumerate(CASES)])
def test_a_bad_argument_is_a_python_error_in_python_words(fn, kwargs, exc):
    with pytest.raises(exc) as e:
        fn(**kwargs)
    assert not DEBUG.search(str(e.value)), str(e.value)
    # The package is still usable.
    assert symm.simulate("all_reduce", "ring", 2, 16).matches


def test_every_host_function_is_driven_here():
    driven = {getattr(fn, "__name__", "") for fn, _, _ in CASES}
    for name in ("simulate", "predict", "select", "tune", "Request", "Trace"):
        assert name in driven, name
