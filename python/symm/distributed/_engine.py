"""The engines inside the backend, started only here: NCCL (what symm does not serve, and the
hops between hosts) and gloo (CPU tensors, the host side of a barrier).

NCCL is started only through :func:`nccl`, which refuses unless NVLink multicast is off in
this process (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``, which ``import symm`` sets). torch's NCCL process group connects
on its first call, so a group whose calls symm serves never starts a NCCL communicator.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from .._gpu import _SAFETY_ENV
from ..errors import SymmError

# NVLink multicast stays off in every process that loads torch through symm (`symm._gpu`
# assigns the same on import).
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"


def check_safety_env() -> None:
    """Raises :class:`SymmError` unless every multicast-off variable holds its value."""
    for k, v in _SAFETY_ENV.items():
        if os.environ.get(k) != v:
            raise SymmError(f"the NCCL engine needs {k}={v} (NVLink multicast off); it is "
                            f"{os.environ.get(k)!r:.40}")


def nccl(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    """A torch NCCL process group (backend) over ``store``'s ranks, multicast off."""
    check_safety_env()
    import torch.distributed as dist

    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, size, opts)


def gloo(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    """A torch gloo process group (backend) over ``store``'s ranks."""
    import torch.distributed as dist

    return dist.ProcessGroupGloo(store, rank, size, timeout)
