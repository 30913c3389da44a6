"""`bertkit pretrain run --method electra`: replaced-token detection on the one training loop.

The same checks BERT's pre-training has: a run writes an ELECTRA pre-training directory
(the discriminator at the top, the generator in generator/) with ELECTRA's metrics and
curves; a run killed with SIGKILL and resumed gives the very same losses step for step;
2 DDP (or FSDP) processes equal one process accumulating 2 micro-batches. The replacements are
sampled from a seed carried by each batch (drawn from its position-seeded generator),
which is what makes the last two hold.
"""

import json
import signal

import pytest
import torch
from safetensors.torch import load_file

from pretrain_support import make_prepared_data, refusal, run_cli, tiny_config_file, train_losses
from test_distributed import torchrun


pytestmark = pytest.mark.slow

COMMON = ("--method", "electra", "--batch-size", 8, "--seed", 7, "--learning-rate", 1e-3, "--generator-size", 0.5)


@pytest.fixture(scope="module")
def setup(shared_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("electra")
    return make_prepared_data(shared_data, tmp, objective="none"), tiny_config_file(tmp), tmp


def test_an_electra_run_writes_both_networks_metrics_and_curves(setup):
    data, config, tmp = setup
    out = tmp / "run"
    # --generator-size 0.4 of 4 heads rounds to 2 (hidden 16, half): once the run said nothing of it
    res = run_cli("pretrain", "run", data, "--config", config, "-o", out, "--max-steps", 6, "--eval-every", 3,
                  "--eval-sequences", 16, *COMMON, "--generator-size", 0.4)
    assert ("generator: 2 heads of 8, hidden 16 = 0.5 of the discriminator's 32 (--generator-size 0.4 rounds to "
            "whole heads") in res.stdout, res.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    evals = [r for r in rows if r["split"] == "eval"]
    assert len(train) == 6 and [r["step"] for r in evals] == [3, 6]
    for key in ("mlm_acc", "disc_acc", "disc_recall", "sampled_original"):
        assert all(0.0 <= r[key] <= 1.0 for r in train), key
    assert (out / "curves.png").stat().st_size > 0
    disc, gen = json.loads((out / "config.json").read_text()), json.loads((out / "generator" / "config.json").read_text())
    assert disc["model_type"] == gen["model_type"] == "electra"
    assert (disc["hidden_size"], gen["hidden_size"]) == (32, 16)  # 2 of the tiny shape's 4 heads
    # the output is what the learner's tools read
    assert run_cli("fill-mask", out, "the man went to the [MASK] .").returncode == 0
    assert "replaced" in run_cli("electra", "show", out, "the man went to the house .").stdout


def test_electra_refuses_sentence_pairs(shared_data, tmp_path, capsys):
    data = make_prepared_data(shared_data, tmp_path, objective="nsp")
    status, err = refusal(capsys, "pretrain", "run", data, "--config", tiny_config_file(tmp_path), "-o", tmp_path / "o",
                          "--max-steps", 1, *COMMON)
    assert status == 2 and "--objective none" in err
    assert not (tmp_path / "o").exists()


def test_a_killed_electra_run_resumes_exactly(setup):
    data, config, tmp = setup
    args = ("--max-steps", 8, "--save-every", 3, "--eval-every", 4, "--eval-sequences", 16, *COMMON)
    straight, killed = tmp / "straight", tmp / "killed"
    run_cli("pretrain", "run", data, "--config", config, "-o", straight, *args)
    res = run_cli("pretrain", "run", data, "--config", config, "-o", killed, *args,
                  kill_at_step=4, check=False)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    run_cli("pretrain", "run", data, "-o", killed, "--resume")
    assert train_losses(killed) == train_losses(straight)  # exact, step for step
    for sub in ("", "generator"):
        a, b = load_file(straight / sub / "model.safetensors"), load_file(killed / sub / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def single(setup):
    data, config, tmp = setup
    run_cli("pretrain", "run", data, "--config", config, "-o", tmp / "single", "--grad-accum", 2, *DIST_ARGS)
    return tmp / "single"


DIST_ARGS = ("--max-steps", 4, "--dropout", 0, "--eval-every", 0, "--save-every", 100, *COMMON)


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_two_electra_ranks_match_one_process_accumulating_two(setup, single, engine):
    """DDP, and FSDP, whose shards are gathered into both networks' final checkpoints: the
    embeddings the two share must come out of the gather once and equal in both files."""
    data, config, tmp = setup
    out = tmp / engine
    torchrun(2, "pretrain", "run", data, "--config", config, "-o", out, *DIST_ARGS,
             *(["--fsdp"] if engine == "fsdp" else []))
    expected, got = train_losses(single), train_losses(out)
    assert sorted(got) == [1, 2, 3, 4]
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-5), step
    for sub in ("", "generator"):
        a, b = load_file(single / sub / "model.safetensors"), load_file(out / sub / "model.safetensors")
        assert a.keys() == b.keys(), sub
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-5, msg=f"{sub}/{k}")
    assert expected[4] < expected[1]
