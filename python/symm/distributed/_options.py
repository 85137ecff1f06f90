"""The backend's options: from ``init_process_group(pg_options=Options(...))`` or the
environment (``SYMM_DIST_*``), checked before anything starts. No torch import.

=========================  ===========================================================
``SYMM_DIST_ENGINE``       ``nccl`` (default): NCCL serves what symm does not; ``none``:
                           such a call is a ``DistBackendError`` naming why
``SYMM_DIST_HEAP``         bytes of the symmetric heap per rank of the default group
                           (default 1 GiB; the same heap ``symm.init`` would make)
``SYMM_DIST_GROUP_HEAP``   bytes per rank of every other group's heap (default 256 MiB)
``SYMM_DIST_TIMEOUT``      seconds a device wait may take before it is an error
                           (default 10)
``SYMM_DIST_DEBUG``        ``1``: one log line per call naming the path that served it
``SYMM_DIST_HOST_SIZE``    test only: ranks per host, overriding the host names (a
                           4-GPU machine as two hosts of two ranks: ``2``)
=========================  ===========================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Optional

ENGINES = ("nccl", "none")

#: The largest heap a rank may ask for (1 TiB).
MAX_HEAP = 1 << 40


class OptionError(ValueError):
    """An option (or its environment variable) that is not valid: ``name`` and the reason."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name


@dataclass(frozen=True)
class Options:
    """The backend's options (see the module's table for the variables that set them)."""

    #: ``"nccl"`` or ``"none"``.
    engine: str = "nccl"
    #: Symmetric heap per rank of the default group, bytes.
    heap_bytes: int = 1 << 30
    #: Symmetric heap per rank of every other group, bytes.
    group_heap_bytes: int = 256 << 20
    #: Deadline of a device wait, seconds.
    timeout: float = 10.0
    #: Log the path of every call.
    debug: bool = False
    #: Test only: ranks per host (None: the host names decide).
    host_size: Optional[int] = None

    def __post_init__(self) -> None:
        """Checks every field."""
        if self.engine not in ENGINES:
            raise OptionError("engine", f"must be one of {ENGINES}, got {self.engine!r:.40}")
        for name in ("heap_bytes", "group_heap_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_HEAP:
                raise OptionError(name, f"must be an int in (0, {MAX_HEAP}], got {v!r:.40}")
        t = self.timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 3600:
            raise OptionError("timeout", f"must be seconds in (0, 3600], got {t!r:.40}")
        if not isinstance(self.debug, bool):
            raise OptionError("debug", f"must be a bool, got {self.debug!r:.40}")
        h = self.host_size
        if h is not None and (isinstance(h, bool) or not isinstance(h, int) or not
                              0 < h <= 1 << 16):
            raise OptionError("host_size", f"must be a positive int or None, got {h!r:.40}")

    @classmethod
    def from_env(cls, env: Mapping[str, str], **given: object) -> Options:
        """The options from ``env`` (``os.environ``), with ``given`` fields over them."""
        o = {}
        v = env.get("SYMM_DIST_ENGINE")
        if v is not None:
            o["engine"] = v
        for var, name in (("SYMM_DIST_HEAP", "heap_bytes"),
                          ("SYMM_DIST_GROUP_HEAP", "group_heap_bytes"),
                          ("SYMM_DIST_HOST_SIZE", "host_size")):
            v = env.get(var)
            if v is not None:
                o[name] = _decimal(var, v)
        v = env.get("SYMM_DIST_TIMEOUT")
        if v is not None:
            o["timeout"] = _seconds("SYMM_DIST_TIMEOUT", v)
        v = env.get("SYMM_DIST_DEBUG")
        if v is not None:
            if v not in ("0", "1"):
                raise OptionError("SYMM_DIST_DEBUG", f"must be 0 or 1, got {v!r:.40}")
            o["debug"] = v == "1"
        known = {f.name for f in fields(cls)}
        for k in given:
            if k not in known:
                raise OptionError(k, f"is not an option (options: {sorted(known)})")
        o.update(given)
        try:
            return cls(**o)  # type: ignore[arg-type]
        except OptionError as e:
            var = next((k for k, n in _VARS.items() if n == e.name and k in env), None)
            if var is not None and e.name not in given:
                raise OptionError(var, str(e).split(": ", 1)[1]) from None
            raise


_VARS = {
    "SYMM_DIST_ENGINE": "engine",
    "SYMM_DIST_HEAP": "heap_bytes",
    "SYMM_DIST_GROUP_HEAP": "group_heap_bytes",
    "SYMM_DIST_TIMEOUT": "timeout",
    "SYMM_DIST_DEBUG": "debug",
    "SYMM_DIST_HOST_SIZE": "host_size",
}


def _decimal(var: str, v: str) -> int:
    if not (0 < len(v) <= 16 and v.isascii() and v.isdigit()):
        raise OptionError(var, f"must be a decimal integer, got {v!r:.40}")
    return int(v)


def _seconds(var: str, v: str) -> float:
    if not 0 < len(v) <= 16:
        raise OptionError(var, f"must be seconds, got {v!r:.40}")
    try:
        s = float(v)
    except ValueError:
        raise OptionError(var, f"must be seconds, got {v!r:.40}") from None
    if not 0 < s <= 3600:  # also refuses nan and inf
        raise OptionError(var, f"must be seconds in (0, 3600], got {v!r:.40}")
    return s
