"""One process group for every GPU test module: torch's gloo cannot be torn down and made
again reliably within one process, so the session makes it once."""

import os

import pytest

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"


@pytest.fixture(scope="session", autouse=True)
def process_group():
    if "WORLD_SIZE" not in os.environ:
        yield
        return
    import torch.distributed as dist

    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo")
    yield
    if own:
        dist.destroy_process_group()
