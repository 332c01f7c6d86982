"""Where a run's processes run and what they share: device, process group, FSDP state gathering.

Under `torchrun` the same command runs DDP or FSDP: NCCL when the tensors are on CUDA, gloo when
they are on the CPU, whatever the host has; rank r takes cuda:LOCAL_RANK. Depends on config.py.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from domino_sglang.train.config import TrainConfigError


def resolve_device(name: str) -> torch.device:
    """auto -> cuda when torch sees one, else cpu; cuda -> this rank's GPU (LOCAL_RANK)."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise TrainConfigError("train: 'device' is cuda but torch sees no CUDA device")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())


def dist_backend(device: torch.device) -> str:
    """NCCL only when the tensors live on CUDA; gloo for CPU tensors, even on a GPU host
    (NCCL cannot reduce CPU tensors)."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_dist(device: torch.device | None = None) -> tuple[int, int]:
    """(rank, world): joins the process group torchrun describes (WORLD_SIZE > 1) unless one is
    already up; (0, 1) for a single process."""
    device = device if device is not None else torch.device("cpu")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.distributed.init_process_group(dist_backend(device))
    if torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def full_state(module: nn.Module) -> dict:
    """The drafter's full state dict, gathered from an FSDP-sharded training module onto rank 0's
    CPU (a collective: every rank calls it; the other ranks get {})."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True,
                                                                  cpu_offload=True))
    return {k.removeprefix("drafter."): v for k, v in full.items()}


def full_optim_state(module: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """The optimizer's full state dict of an FSDP-sharded module, gathered onto the CPU (a
    collective, as full_state)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(module, opt, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
