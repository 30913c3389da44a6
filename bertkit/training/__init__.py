"""Training, the same for pre-training and every fine-tuning task.

    loop.py          the one loop: accumulation, clipping, LR schedule, bf16/fp16, NaN stop,
                     progress, metrics records, evaluation and checkpoint callbacks, exact resume
    harness.py       one run around the loop, written once: output folder, resume, seed, model, optimizer,
                     run_config.json, metrics.jsonl, checkpoints, curves.png (its docstring: one run)
    optim.py         AdamW parameter groups (no decay on biases/LayerNorm), LR schedules, LAMB choice
    lamb.py          LAMB (You et al. 2019) for large batches
    state.py         atomic checkpoints of the whole training state, RNG capture, resume checks
    distributed.py   torchrun + DDP/FSDP: process group, wrapping, no_sync, reductions
    metrics_log.py   metrics.jsonl and curves.png

Nothing here imports torch until a module that needs it is imported.
"""

import os

PRECISIONS = ("fp32", "bf16", "fp16")  # fp16 needs a CUDA GPU (GradScaler)


def paths_as_text(settings) -> None:
    """A run's settings (a config dataclass) hold each file or folder given as a pathlib.Path, a notebook's, as
    the str the command line gives: run_config.json and bertkit_task.json record them, and json cannot write a
    Path (such a run loaded its data and model, then died writing them). Called by each config's __post_init__."""
    for name, value in vars(settings).items():
        if isinstance(value, os.PathLike):
            setattr(settings, name, os.fspath(value))
