"""The exceptions symm raises."""

from __future__ import annotations

from typing import Optional


class SymmError(Exception):
    """Base class of every error symm defines."""


class TraceError(SymmError, ValueError):
    """A trace that cannot be read: bad magic, a record that does not decode, a wrong count
    or checksum, an event outside the header's world, or input over the size cap.

    ``offset`` is the byte offset of the problem in the input, or None when there is none.
    """

    def __init__(self, message: str, offset: Optional[int] = None) -> None:
        super().__init__(message)
        self.offset = offset


class TimeoutError(SymmError):  # noqa: A001 - mirrors symm's own name for a wait that expired
    """A deadline passed: a device wait, a host exchange or joining the job.

    For a device wait, ``rank`` waited for ``peer`` on ``slot``, which had to reach
    ``expected`` and held ``found``; for other deadlines those fields are None.
    """

    def __init__(self, message: str, rank: Optional[int] = None, peer: Optional[int] = None,
                 slot: Optional[int] = None, expected: Optional[int] = None,
                 found: Optional[int] = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.peer = peer
        self.slot = slot
        self.expected = expected
        self.found = found


class PeerLostError(SymmError):
    """A peer of the job stopped answering (its process or GPU is gone): ``rank``, where
    known.
    """

    def __init__(self, message: str, rank: Optional[int] = None) -> None:
        super().__init__(message)
        self.rank = rank


class PoisonedError(SymmError):
    """The communicator was poisoned by an earlier failure and refuses further work."""
