"""Several processes with ``torchrun``: DistributedDataParallel, gloo on CPU, nccl on CUDA.

``torchrun --nproc_per_node N -m aiayn train ...`` sets RANK/WORLD_SIZE/LOCAL_RANK; a plain run
is world size 1 and every helper here is then a no-op.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as torch_dist
from torch import nn

from aiayn.device import resolve_device


def setup() -> tuple[int, int]:
    """Join the process group when started by torchrun; return ``(rank, world_size)``."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and not torch_dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        torch_dist.init_process_group(backend)
    return (torch_dist.get_rank(), world_size) if world_size > 1 else (0, 1)


def active() -> bool:
    return torch_dist.is_available() and torch_dist.is_initialized()


def pick_device(name: str) -> torch.device:
    """train.device resolved (:func:`aiayn.device.resolve_device`); a GPU becomes the current one."""
    device = resolve_device(name, "train.device")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def wrap(module: nn.Module, device: torch.device) -> nn.Module:
    """DistributedDataParallel around ``module`` when several processes run, else ``module``."""
    if not active():
        return module
    device_ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(module, device_ids=device_ids)


def no_sync(module: nn.Module, enabled: bool):
    """Skip DDP's gradient all-reduce for the first micro-batches of an accumulation group."""
    if enabled and isinstance(module, nn.parallel.DistributedDataParallel):
        return module.no_sync()
    return contextlib.nullcontext()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over processes (in place on a CPU/GPU tensor); identity for one process."""
    if active():
        torch_dist.all_reduce(tensor)
    return tensor


def broadcast_float(value: float) -> float:
    """Rank 0's value on every rank (validation metrics decide early stopping everywhere)."""
    if not active():
        return value
    device = "cuda" if torch_dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    torch_dist.broadcast(tensor, src=0)
    return tensor.item()


def barrier() -> None:
    if active():
        torch_dist.barrier()


def cleanup() -> None:
    if active():
        torch_dist.destroy_process_group()
