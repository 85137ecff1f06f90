"""symm as a ``torch.distributed`` backend: existing PyTorch code on symm with one line.

.. code-block:: python

    >>> import symm.distributed  # registers the backend "symm" (so does ``import symm``
    >>> #                          when torch is imported already)
    >>> torch.distributed.init_process_group("cuda:symm,cpu:gloo")

Every CUDA collective of ``torch.distributed`` on a group symm can serve then runs on symm's
kernels: ``all_reduce`` (sum, avg, product, min, max), ``all_gather_into_tensor``,
``all_gather``, ``reduce_scatter_tensor``, ``reduce_scatter``, ``all_to_all_single`` (equal
splits), ``broadcast``, ``reduce``, ``barrier``, and the functional collectives DTensor and
``torch.compile`` use. Sub-groups (``new_group``, ``DeviceMesh`` dimensions) get symm
communicators of their own. Calls run on torch's current stream, so CUDA graphs capture them;
asynchronous calls return a ``Work`` whose ``wait()`` orders the current stream after them.

A real NCCL group inside the backend serves the rest: ops symm lacks (``send``/``recv``,
``gather``, ``scatter``, coalesced calls), dtypes and reductions it does not take, uneven
all-to-all splits, and groups that span hosts, where all-reduce, reduce-scatter and all-gather
are hierarchical (symm inside each host, NCCL between hosts). CPU tensors go to gloo.
:func:`paths` counts which path served each call; ``SYMM_DIST_DEBUG=1`` logs every one.
Options: :class:`Options`, from ``pg_options=`` or the ``SYMM_DIST_*`` variables.

Errors are ``torch.distributed.DistBackendError`` naming the call, group, rank and path, with
symm's message. The routing decisions (:func:`route`) and the options need no torch.
"""

from __future__ import annotations

import os
from typing import Any

from ._options import OptionError, Options
from ._route import OPS, PATHS, Group, Route, RouteError, route

# NVLink multicast stays off in every process that loads torch through symm (`symm._gpu`
# assigns the same on import).
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

__all__ = ["OPS", "PATHS", "Group", "OptionError", "Options", "Route", "RouteError", "paths",
           "register", "route"]

#: The backend's name in ``torch.distributed``.
NAME = "symm"


def register() -> None:
    """Registers the backend ``symm`` with ``torch.distributed`` (imports torch; done by
    ``import symm`` when torch is imported already, and by ``import symm.distributed``).
    Registering again does nothing.
    """
    import torch.distributed as dist

    if NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cuda", "cpu"])


def _create(opts: Any, backend_options: Any) -> Any:
    """torch's constructor of the backend for one group (on its members)."""
    import torch.distributed as dist

    from ..errors import SymmError
    from ._group import SymmGroup

    try:
        options = backend_options if isinstance(backend_options, Options) else \
            Options.from_env(os.environ)
        return SymmGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                         opts.group_id, list(opts.global_ranks_in_group), options)
    except (SymmError, ValueError, TypeError) as e:
        raise dist.DistBackendError(
            f"symm backend: group {opts.group_id!r} (rank {opts.group_rank} of "
            f"{opts.group_size}) could not start: {type(e).__name__}: {e}") from e


def paths(group: Any = None) -> dict[str, dict[str, int]]:
    """How many calls each path (``symm``, ``hier``, ``nccl``, ``gloo``, ``local``) served on
    ``group`` (default: the default group), by call.
    """
    import torch.distributed as dist

    from ._group import SymmGroup

    g = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(g, SymmGroup):
        raise ValueError(f"{g!r} is not a group of the symm backend")
    return g.paths()


try:
    register()
except ImportError:  # no torch: the routing decisions and options still import
    pass
