"""Distributed equivalence: torchrun with 2 processes (gloo, CPU) x batch B == 1 process x B x accumulation 2.

Checked for DistributedDataParallel and for FSDP (fully_shard), which also has to
gather its shards into full checkpoints and the final Hugging Face model.

DDP averages the two ranks' gradients; one process accumulating the same two
micro-batches (each loss divided by 2) computes the same update. Rank r reads
micro-batches r, r + 2, ... of the global order, so the data are the same too.
Dropout is off (each rank has its own dropout stream). Tolerance: 1e-5
relative on every step's loss and 1e-5 absolute on the final weights (the
all-reduce sums in another order than the accumulation does).
"""

import os
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from pretrain_support import make_prepared_data, run_cli, tiny_config_file, train_losses

pytestmark = pytest.mark.slow

COMMON = ("--max-steps", 5, "--batch-size", 4, "--dropout", 0, "--eval-every", 0, "--seed", 11,
          "--learning-rate", 1e-3, "--save-every", 100)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, *args, timeout=240):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "bertkit.cli", *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-4000:]
    return res


@pytest.fixture(scope="module")
def setup(shared_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    return make_prepared_data(shared_data, tmp), tiny_config_file(tmp), tmp


@pytest.fixture(scope="module")
def single(setup):
    data, config, tmp = setup
    run_cli("pretrain", "run", data, "--config", config, "-o", tmp / "single", "--grad-accum", 2, *COMMON)
    return tmp / "single"


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_two_ranks_match_one_process_accumulating_two(setup, single, engine):
    data, config, tmp = setup
    out = tmp / engine
    torchrun(2, "pretrain", "run", data, "--config", config, "-o", out, *COMMON, *(["--fsdp"] if engine == "fsdp" else []))

    expected, got = train_losses(single), train_losses(out)
    assert sorted(got) == list(range(1, 6))
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-5), step
    a, b = load_file(single / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-5, msg=k)
    # and the updates really moved the weights (the comparison is not of two untouched inits)
    assert expected[5] < expected[1]
