"""AdamW parameter groups and the warm-up/decay schedule.

The schedule is checked against transformers' schedulers (the oracle) and
against hand-computed points; the parameter groups against a hand-built module.
"""

import math

import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.training.optim import OptimConfig, build_optimizer, lr_at, param_groups, warmup_steps_for


def test_linear_schedule_hand_points():
    kw = dict(peak_lr=1.0, warmup_steps=10, total_steps=110)
    assert lr_at(0, **kw) == 0.0  # the first update uses rate 0, as in the reference code
    assert lr_at(5, **kw) == 0.5
    assert lr_at(10, **kw) == 1.0
    assert lr_at(60, **kw) == pytest.approx(0.5)
    assert lr_at(110, **kw) == 0.0
    assert lr_at(500, **kw) == 0.0  # never negative past the end


def test_cosine_and_constant_hand_points():
    kw = dict(peak_lr=2.0, warmup_steps=0, total_steps=100)
    assert lr_at(0, schedule="cosine", **kw) == pytest.approx(2.0)
    assert lr_at(50, schedule="cosine", **kw) == pytest.approx(1.0)
    assert lr_at(100, schedule="cosine", **kw) == pytest.approx(0.0)
    assert lr_at(70, schedule="constant", **kw) == 2.0


@pytest.mark.oracle
@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_schedule_matches_transformers(transformers_mod, schedule):
    total, warmup, peak = 57, 6, 3e-5
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=peak)
    make = {
        "linear": transformers_mod.get_linear_schedule_with_warmup,
        "cosine": transformers_mod.get_cosine_schedule_with_warmup,
    }[schedule]
    sched = make(opt, num_warmup_steps=warmup, num_training_steps=total)
    for step in range(total + 1):  # past the end their cosine rises again; ours stays at 0
        theirs = opt.param_groups[0]["lr"]
        assert lr_at(step, peak_lr=peak, warmup_steps=warmup, total_steps=total, schedule=schedule) == pytest.approx(
            theirs, abs=1e-15
        ), step
        opt.step()
        sched.step()


def test_warmup_steps_rounds_up():
    assert warmup_steps_for(95, 0.1) == 10
    assert warmup_steps_for(100, 0.1) == 10
    assert warmup_steps_for(100, 0.0) == 0


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(7, 5)
        self.dense = torch.nn.Linear(5, 3)
        self.LayerNorm = torch.nn.LayerNorm(3)
        self.out = torch.nn.Linear(3, 7, bias=False)
        self.out.weight = self.emb.weight  # tied, must appear once


def test_param_groups_exclude_bias_and_layernorm():
    m = Tiny()
    decay, keep = param_groups(m, 0.01)
    assert decay["weight_decay"] == 0.01 and keep["weight_decay"] == 0.0
    ids = lambda ps: {id(p) for p in ps}  # noqa: E731
    assert ids(decay["params"]) == {id(m.emb.weight), id(m.dense.weight)}
    assert ids(keep["params"]) == {id(m.dense.bias), id(m.LayerNorm.weight), id(m.LayerNorm.bias)}


def test_adamw_decays_only_the_decay_group():
    # With a zero gradient Adam's update is 0 and only decoupled decay acts:
    # p <- p * (1 - lr * wd), by hand.
    torch.manual_seed(0)
    m = Tiny()
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    opt = build_optimizer(m, OptimConfig(learning_rate=0.1, weight_decay=0.5))
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = dict(m.named_parameters())
    torch.testing.assert_close(after["dense.weight"], before["dense.weight"] * (1 - 0.05))
    torch.testing.assert_close(after["emb.weight"], before["emb.weight"] * (1 - 0.05))
    torch.testing.assert_close(after["dense.bias"], before["dense.bias"])
    torch.testing.assert_close(after["LayerNorm.weight"], before["LayerNorm.weight"])


@pytest.mark.parametrize(
    "bad", [dict(learning_rate=0), dict(warmup_ratio=1.5), dict(weight_decay=-1), dict(schedule="step")]
)
def test_bad_config_is_a_clear_error(bad):
    with pytest.raises(BertkitError):
        OptimConfig(**bad).validate()


def test_cosine_is_monotone_after_warmup():
    vals = [lr_at(s, peak_lr=1.0, warmup_steps=3, total_steps=40, schedule="cosine") for s in range(3, 41)]
    assert all(a >= b for a, b in zip(vals, vals[1:]))
    assert math.isclose(vals[0], 1.0)
