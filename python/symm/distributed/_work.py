"""The backend's ``torch.distributed.Work``: what an asynchronous call returns.

symm enqueues a collective on torch's current stream, as NCCL's work would be ordered after
it, so the stream that issued the call sees its result with no wait. :meth:`Work.wait` makes
the stream current at the wait (often another one: FSDP issues its all-gathers on a stream
of their own) wait for the call, through an event recorded after it (only for asynchronous
calls: a synchronous call is waited for on the stream that issued it), then raises the
communicator's asynchronous error, if any, as ``DistBackendError``. Both are legal while a
CUDA graph captures, so captured calls and their waits become graph nodes.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

# NVLink multicast stays off in every process that loads torch through symm (`symm._gpu`
# assigns the same on import).
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


class Work(dist.Work):
    """One call of the backend, enqueued."""

    def __init__(self, result: list[Any], stream: Any = None,
                 check: Optional[Callable[[], None]] = None) -> None:
        super().__init__()
        self._result = result
        self._stream = stream
        self._check = check
        self._event: Any = None
        self._future: Any = None
        if stream is not None:
            self._event = torch.cuda.Event()
            self._event.record(stream)

    def wait(self, timeout: Any = None) -> bool:
        """The current stream waits for the call; raises the call's asynchronous error."""
        if self._event is not None:
            torch.cuda.current_stream(self._stream.device).wait_event(self._event)
        if self._check is not None:
            self._check()
        return True

    def synchronize(self) -> None:
        """As :meth:`wait`."""
        self.wait()

    def is_completed(self) -> bool:
        """Whether the GPU finished the call."""
        return self._event is None or self._event.query()

    def is_success(self) -> bool:
        """Whether the call completed without an error known so far."""
        return self.is_completed()

    def exception(self) -> Any:
        """None: an error is raised by :meth:`wait`."""
        return None

    def result(self) -> list[Any]:
        """The call's output tensors."""
        return self._result

    def get_future(self) -> Any:
        """A CUDA-aware ``torch.futures.Future`` of the output tensors, completed after the
        call on the stream that issued it.
        """
        if self._future is None:
            if self._stream is None:
                f = torch.futures.Future()
                f.set_result(self._result)
            else:
                f = torch.futures.Future(devices=[self._stream.device])
                with torch.cuda.stream(self._stream):
                    f.set_result(self._result)
            self._future = f
        return self._future


class Each(Work):
    """Several calls of another backend issued as one (a coalesced call its binding lacks,
    made one call per tensor): waiting waits for every one, in order.
    """

    def __init__(self, works: list[Any], result: list[Any]) -> None:
        super().__init__(result)
        self._works = works

    def wait(self, timeout: Any = None) -> bool:
        """The current stream waits for every call; raises the first one's error."""
        for w in self._works:
            if timeout is None:
                w.wait()
            else:
                w.wait(timeout)
        return True

    def is_completed(self) -> bool:
        """Whether every call completed."""
        return all(w.is_completed() for w in self._works)

    def get_future(self) -> Any:
        """A future of the output tensors, completed when every call's future is."""
        if self._future is None:
            result = self._result
            self._future = torch.futures.collect_all(
                [w.get_future() for w in self._works]).then(lambda _: result)
        return self._future
