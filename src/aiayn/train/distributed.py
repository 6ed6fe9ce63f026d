"""Several processes with ``torchrun``: DistributedDataParallel, gloo on CPU, nccl on CUDA.

``torchrun --nproc_per_node N -m aiayn train ...`` sets RANK/WORLD_SIZE/LOCAL_RANK; a plain run
is world size 1 and every helper here is then a no-op.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

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


def shard(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The same optimizer with its state split between the processes (ZeRO stage 1, PyTorch's
    :class:`ZeroRedundancyOptimizer`): each process keeps the moments of its share of the
    parameters, updates that share and broadcasts it. The updates are those of ``optimizer`` (an
    element-wise optimizer such as Adam gives the same weights, bit for bit); identity for one process."""
    if not active():
        return optimizer
    accepted = inspect.signature(type(optimizer)).parameters
    defaults = {key: value for key, value in optimizer.defaults.items() if key in accepted}
    groups = [dict(group) for group in optimizer.param_groups]
    return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **defaults)


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
    """``optimizer.state_dict()`` as one unsharded optimizer's: on rank 0 the whole state (a sharded
    optimizer's other shards sent to it tensor by tensor, so that no process ever holds a serialized
    copy), ``None`` on the other ranks of a sharded one. Call it on every rank."""
    if not isinstance(optimizer, ZeroRedundancyOptimizer):
        return optimizer.state_dict()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    index = {p: i for i, p in enumerate(params)}
    local = {index[p]: state for p, state in optimizer.optim.state.items()}
    layout = {i: {key: _layout(value) for key, value in state.items()} for i, state in local.items()}
    rank, world_size = torch_dist.get_rank(), torch_dist.get_world_size()
    layouts: list[Any] = [None] * world_size
    torch_dist.all_gather_object(layouts, layout)  # which rank holds which state: small
    gathered: dict[int, dict[str, Any]] = dict(local) if rank == 0 else {}
    for source in range(1, world_size):
        for i, keys in layouts[source].items():
            for key, kind in keys.items():
                if rank == source and kind[0] == "tensor":
                    torch_dist.send(local[i][key].contiguous(), dst=0)
                elif rank == 0:
                    gathered.setdefault(i, {})[key] = _received(kind, source, params[i].device)
    if rank != 0:
        return None
    full = torch.optim.Optimizer.state_dict(optimizer)  # the param groups, as one optimizer's
    full["state"] = {i: gathered[i] for i in sorted(gathered)}
    return full


def _layout(value: Any) -> tuple:
    """How a state value travels: a tensor by shape and dtype, anything else (a 0-d step) by value."""
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return ("tensor", tuple(value.shape), value.dtype)
    if isinstance(value, torch.Tensor):
        return ("scalar", value.item(), value.dtype, str(value.device))
    return ("value", value)


def _received(kind: tuple, source: int, device: torch.device) -> Any:
    if kind[0] == "tensor":
        tensor = torch.empty(kind[1], dtype=kind[2], device=device)
        torch_dist.recv(tensor, src=source)
        return tensor
    if kind[0] == "scalar":
        return torch.tensor(kind[1], dtype=kind[2], device=kind[3])
    return kind[1]


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
