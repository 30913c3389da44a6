"""Run a `bertkit` command and SIGKILL it in the middle of a training step, the way an out-of-memory
killer or a pre-empted node would: how the exact-resume tests stop a real process mid-run.

    python tests/killed_run.py STEP ARGS...     # `bertkit ARGS...`, killed in update STEP (from 0)
    python tests/killed_run.py interrupt-checkpoint:STEP ARGS...   # Ctrl-C while checkpoint STEP is written
    python tests/killed_run.py kill-checkpoint:STEP ARGS...        # SIGKILL while checkpoint STEP is written

The process kills itself right after the forward pass of update STEP's last micro-batch, before its
backward: the updates before it are done and logged, and the checkpoints they wrote are on disk.
Every run trains through `bertkit.training.harness.train`, which calls the loop as
`harness.train_loop`; this wraps that one call to hook the model's training-mode forward passes
(evaluation runs in eval mode and is not counted). The library itself holds no test switch.
"""

import os
import signal
import sys

from bertkit.training import harness
from killed_write import as_a_terminal_delivers_it


def killing_loop(kill_at: int, loop):
    def train_loop(model, optimizer, stream, cfg, *, start_step: int = 0, **kwargs):
        calls = {"n": 0}
        last = (kill_at - start_step + 1) * cfg.grad_accum  # the forward of update kill_at's last micro-batch

        def count(module, args, output):
            if module.training:
                calls["n"] += 1
                if calls["n"] == last:
                    os.kill(os.getpid(), signal.SIGKILL)

        if kill_at >= start_step:
            model.register_forward_hook(count)
        return loop(model, optimizer, stream, cfg, start_step=start_step, **kwargs)

    return train_loop


def interrupting_save(step: int, save, sig=signal.SIGINT):
    """torch.save, which sends this process SIGINT (Ctrl-C) once the bytes of checkpoint `step` begin to go
    out: a person pressing Ctrl-C while the run writes its checkpoint (SIGKILL: a lost machine)."""
    name = f"step-{step:08d}.pt.tmp"

    class Interrupting:
        def __init__(self, f):
            self.f, self.sent = f, False

        def write(self, data):
            if not self.sent:
                self.sent = True
                os.kill(os.getpid(), sig)
            return self.f.write(data)

        def flush(self):
            return self.f.flush()

    def torch_save(obj, f, *args, **kwargs):
        return save(obj, Interrupting(f) if str(getattr(f, "name", "")).endswith(name) else f, *args, **kwargs)

    return torch_save


if __name__ == "__main__":
    as_a_terminal_delivers_it()  # Ctrl-C, even under a pytest started in the background (`pytest ... &`)
    where, sys.argv = sys.argv[1], ["bertkit", *sys.argv[2:]]
    if where.startswith(("interrupt-checkpoint:", "kill-checkpoint:")):  # while checkpoint STEP is written
        import torch

        sig = signal.SIGKILL if where.startswith("kill") else signal.SIGINT
        torch.save = interrupting_save(int(where.partition(":")[2]), torch.save, sig)
    else:
        harness.train_loop = killing_loop(int(where), harness.train_loop)
    from bertkit.cli import main

    sys.exit(main())  # as `python -m bertkit.cli` runs it
