"""Data-parallel training on PyTorch's own engine: torchrun + DDP (or FSDP).

Launch any training command under `torchrun --nproc_per_node N`; torchrun sets
RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT for every process, and
`setup()` joins them into one process group: gloo on the CPU, NCCL on GPUs.
Each process then

  * builds the same model from the same seed (DDP also broadcasts rank 0's
    weights when it wraps the model, so they start identical anyway),
  * reads its own micro-batches: the batch stream hands rank r the
    micro-batches r, r + N, r + 2N, ... of the global order (see
    `bertkit.training.loop.micro_batch_slot`),
  * and lets DistributedDataParallel average the gradients across processes
    during backward (an all-reduce, overlapped with computation). With
    gradient accumulation the all-reduce is skipped (`no_sync`) on all but
    the last micro-batch of an update.

The effective batch is batch_size x grad_accum x world_size; N processes with
batch B compute the same update as 1 process accumulating N micro-batches of B
(a test checks it). FSDP (`fully_shard`, "FSDP2") is the option for models too
big for one device: parameters, gradients and optimizer state are sharded
across ranks and gathered layer by layer. No communication here is our own:
everything goes through torch.distributed.

Commands that are not training runs join the same way: `bertkit index` under
torchrun (`process_group` for the length of the build, `deal` to share the
length-sorted parts among the ranks, `broadcast_object` to stop every rank
when rank 0 refuses).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from bertkit.errors import BertkitError


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: rank in 0..world_size-1 and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def pick_device(name: str = "auto", local_rank: int = 0) -> str:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise BertkitError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu")
        return f"cuda:{local_rank}" if name == "cuda" else name
    if name != "cpu":
        raise BertkitError(f"unknown device {name!r}: use cpu, cuda or auto")
    return "cpu"


def setup(device: str = "auto") -> DistInfo:
    """Join the torchrun process group if launched by torchrun, else run alone."""
    if not launched_by_torchrun():
        return DistInfo(device=pick_device(device))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    dev = pick_device(device, local_rank)
    if dev.startswith("cuda"):
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.startswith("cuda") else "gloo")
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=dev)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def process_group(device: str = "auto"):
    """`setup()` for the length of a `with` block, for a command that is not a training run
    (`bertkit index`): the group is left afterwards if this block joined it; one that was
    already there (a caller's own torchrun program) stays."""
    joined = launched_by_torchrun() and not dist.is_initialized()
    info = setup(device)
    try:
        yield info
    except RuntimeError as err:
        if info.enabled and peer_lost(err):
            raise BertkitError(f"another process of this torchrun run stopped ({_first_words(err)}): its own lines "
                               "say why; --resume goes on from what is saved") from None
        raise
    finally:
        if joined:
            teardown()


def peer_lost(err: BaseException) -> bool:
    """Whether `err` is a collective failing because another rank is gone (killed, crashed, its machine lost):
    torch's own communication errors (DistError: NCCL, the store) and gloo's transport errors, which reach
    Python as a plain RuntimeError naming gloo's source file ("Connection reset by peer", "Connection closed")."""
    return isinstance(err, dist.DistError) or "gloo/transport" in str(err)


def _first_words(err: BaseException) -> str:
    # gloo's message opens with its source location in brackets, then what happened, then advice
    text = str(err).split("] ", 1)[-1].strip()
    return (text.splitlines() or [type(err).__name__])[0].split(". ", 1)[0]


def deal(n: int, info: DistInfo) -> list[int]:
    """This rank's items among 0..n-1 when item i costs no more than item i+1 (length-sorted
    parts), in increasing order. The items are dealt like cards from the dearest down, back and
    forth: the dearest W to ranks 0..W-1, the next W to ranks W-1..0, then again, so what a rank
    gains in one round it gives back in the next, and an uneven last round deals the cheapest
    items. With costs rising evenly the ranks' totals differ by at most W-1 steps of cost, and
    with any rising costs by at most the dearest item's cost (tests/test_index_distributed.py);
    round-robin (0..W-1, 0..W-1, ...) hands rank W-1 the dearest item of every round. Alone:
    every item."""
    W = info.world_size

    def owner(j: int) -> int:  # j: the item's place counted from the dearest
        return j % W if (j // W) % 2 == 0 else W - 1 - j % W

    return [i for i in range(n) if owner(n - 1 - i) == info.rank]


def wrap(model: torch.nn.Module, info: DistInfo, fsdp: bool = False) -> torch.nn.Module:
    """DDP (default) or FSDP around `model`; the model itself when alone.

    With FSDP each encoder layer (of every encoder: ELECTRA has two) is its
    own shard unit (gathered only while it computes), then the whole model.
    """
    if fsdp and not info.enabled:
        raise BertkitError("--fsdp needs several processes: launch with torchrun --nproc_per_node N")
    if not info.enabled:
        return model
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in _encoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        return model
    ids = [info.local_rank] if info.device.startswith("cuda") else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)


def _encoder_layers(model):
    # the transformer blocks: the entries of every ModuleList (bert.encoder.layer; ELECTRA's
    # generator and discriminator each have one). The embeddings the two share stay in the
    # root unit, so they are one sharded tensor however many modules own them.
    return [layer for module in model.modules() if isinstance(module, torch.nn.ModuleList) for layer in module]


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's model inside DDP and/or torch.compile wrappers."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


def is_fsdp(model: torch.nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(unwrap(model), FSDPModule)


def no_sync(model: torch.nn.Module, skip: bool):
    """Skip the gradient all-reduce for this backward (accumulation micro-batches)."""
    if skip and isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.no_sync()
    if skip and is_fsdp(model):
        unwrap(model).set_requires_gradient_sync(False)
        return _restore_sync(unwrap(model))
    return contextlib.nullcontext()


@contextlib.contextmanager
def _restore_sync(module):
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def sum_over_ranks(values: dict, info: DistInfo) -> dict:
    """Sum a dict of numbers over all ranks (counts); identity when alone."""
    if not info.enabled or not values:
        return values
    keys = sorted(values)  # every rank must reduce the values in the same order
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return {k: t[i].item() for i, k in enumerate(keys)}


def gather_objects(obj, info: DistInfo) -> list:
    """Every rank's `obj`, in rank order (e.g. the RNG states for a checkpoint)."""
    if not info.enabled:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, info: DistInfo, src: int = 0):
    """Rank `src`'s `obj` (picklable) on every rank; a barrier too. Alone: `obj`."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def on_rank_0(info: DistInfo, step) -> None:  # step() -> None
    """step() on rank 0 alone, the other ranks waiting; a BertkitError it raises is raised on every rank
    (one line each), so that no rank is left waiting for one that quit, as the error it is (a NoSpace, the disk
    refusal, is an OSError too on every rank). Alone: step()."""
    if not info.enabled:
        return step()
    error = None
    if info.is_main:
        try:
            step()
        except BertkitError as e:
            error = e
    error = broadcast_object(error, info)
    if error is not None:
        raise error


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def state_dicts(model, optimizer) -> tuple[dict, dict]:
    """Full (unsharded) model and optimizer state dicts, on the CPU for FSDP.

    A collective under FSDP: every rank must call it.
    """
    if is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_state_dict(unwrap(model), optimizer, options=opts)
    return unwrap(model).state_dict(), optimizer.state_dict()


def load_state_dicts(model, optimizer, model_state: dict, optim_state: dict) -> None:
    """Inverse of `state_dicts` (every rank calls it with the full dicts)."""
    if is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        opts = StateDictOptions(full_state_dict=True)
        set_state_dict(unwrap(model), optimizer, model_state_dict=model_state, optim_state_dict=optim_state, options=opts)
        return
    unwrap(model).load_state_dict(model_state)
    optimizer.load_state_dict(optim_state)


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward sends each process the gradient of its own rows, summed over processes."""

    @staticmethod
    def forward(ctx, tensor, sizes: list):
        rank = dist.get_rank()
        ctx.rows = (sum(sizes[:rank]), sizes[rank])
        padded = tensor.new_zeros((max(sizes), *tensor.shape[1:]))  # all_gather needs equal shapes
        padded[: tensor.shape[0]] = tensor
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous())
        return torch.cat([p[:n] for p, n in zip(parts, sizes)])

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)  # every process's loss reaches these rows
        start, n = ctx.rows
        return grad[start:start + n], None


def gather_with_grad(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(every process's `tensor` stacked in rank order [sum of rows, ...], the offset of this process's rows).

    For losses that score against the whole global batch (in-batch negatives,
    `bertkit.tasks.embedding`): unlike `dist.all_gather`, the result keeps the
    gradient. Process r's rows receive the sum over processes of d(loss_s)/d(rows),
    so with DDP's average of the parameter gradients, W processes with B rows each
    compute the update of one process holding all W x B (the all-gather of
    Chen et al. 2020, SimCLR, and of sentence-transformers' `all_gather_with_grad`).
    Processes may hold different numbers of rows (an epoch's short last batch).
    Alone (no process group) it returns `tensor` and 0.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tensor, 0
    size = torch.tensor([tensor.shape[0]], device=tensor.device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    sizes = [int(s) for s in sizes]
    return _GatherWithGrad.apply(tensor, sizes), sum(sizes[: dist.get_rank()])
