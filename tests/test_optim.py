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


# --- layer-wise rates (ELECTRA's fine-tuning) ----------------------------------------------------------

def _three_layer_electra():
    from bertkit.model.electra import ElectraConfig, ElectraForSequenceClassification

    config = ElectraConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                           intermediate_size=20, embedding_size=8, num_labels=2, max_position_embeddings=16)
    return ElectraForSequenceClassification(config, generator=torch.Generator().manual_seed(0))


# google-research/electra model/optimization.py `_get_layer_lrs` at layer_decay 0.8 and 3 layers: depth
# "/embeddings/" and "/embeddings_project/" 0, "encoder/layer_i/" i + 1, "task_specific/" 5, rate x 0.8^(5 - depth)
REFERENCE_SCALES = {"embeddings": 0.8 ** 5, "layer 0": 0.8 ** 4, "layer 1": 0.8 ** 3, "layer 2": 0.8 ** 2,
                    "head": 1.0}


def _where(name):
    if "embeddings" in name:
        return "embeddings"
    for i in range(3):
        if f"layers.{i}." in name:
            return f"layer {i}"
    return "head"


def test_layerwise_rates_are_the_references():
    model = _three_layer_electra()
    groups = param_groups(model, 0.01, layer_decay=0.8)
    scale_of = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    for name, param in model.named_parameters():
        assert scale_of[id(param)] == pytest.approx(REFERENCE_SCALES[_where(name)]), name
    # decay still follows bias / LayerNorm inside each depth
    assert {g["weight_decay"] for g in groups} == {0.01, 0.0}
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    one_rate = param_groups(model, 0.01)  # the default: the two groups as before, no scale
    assert [g["weight_decay"] for g in one_rate] == [0.01, 0.0] and not any("lr_scale" in g for g in one_rate)


def test_each_group_steps_at_its_scaled_rate():
    """Adam's first step moves each weight by the rate (m / sqrt(v) = sign of the gradient, epsilon aside): the
    largest move in each tensor is the group's rate, 1e-3 x its scale."""
    from bertkit.training.optim import set_lr

    model = _three_layer_electra().train(False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, OptimConfig(learning_rate=1e-3, weight_decay=0.0, layerwise_lr_decay=0.8,
                                             adam_epsilon=1e-12))  # tiny gradients move by the full rate too
    set_lr(opt, 1e-3)
    ids = torch.randint(5, 50, (4, 10), generator=torch.Generator().manual_seed(1))
    model(ids, labels=torch.tensor([0, 1, 1, 0])).loss.backward()
    opt.step()
    for name, param in model.named_parameters():
        moved = (param.detach() - before[name]).abs().max().item()
        assert moved == pytest.approx(1e-3 * REFERENCE_SCALES[_where(name)], rel=1e-3), name


def test_layerwise_decay_is_checked_and_adamw_only():
    with pytest.raises(BertkitError, match="--layerwise-lr-decay must be in"):
        OptimConfig(layerwise_lr_decay=0).validate()
    with pytest.raises(BertkitError, match="--optimizer adamw"):
        build_optimizer(_three_layer_electra(), OptimConfig(layerwise_lr_decay=0.8), name="lamb")
