"""The pre-training loop on its own: batch stream, accumulation, NaN stop, precision.

The loop knows only "a model that returns a loss", so most of these tests drive
it with a toy regression model whose right answers are checkable by hand; the
end-to-end tests (real BERT, prepared data, the CLI) are further down.
"""

import json
from dataclasses import dataclass

import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.pretraining.run_config import RunConfig
from bertkit.training.optim import OptimConfig
from bertkit.pretraining.train import BatchStream
from bertkit.training.loop import LoopConfig, NonFiniteLoss, autocast_for, micro_batch_slot, train_loop


# --- a toy model and data ----------------------------------------------------------


@dataclass
class ToyOutput:
    loss: torch.Tensor


class Toy(torch.nn.Module):
    """Linear regression; the loss is NaN for any instance whose x is NaN."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)
        torch.nn.init.constant_(self.lin.weight, 0.1)
        torch.nn.init.zeros_(self.lin.bias)

    def forward(self, x, y):
        return ToyOutput(((self.lin(x).squeeze(-1) - y) ** 2).mean())


def toy_instances(n=12, poison=None):
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(n, 3, generator=g)
    ys = xs @ torch.tensor([1.0, -2.0, 0.5]) + 0.3
    if poison is not None:
        xs[poison] = float("nan")
    return [{"x": xs[i], "y": ys[i]} for i in range(n)]


def stack(items, generator):
    return {"x": torch.stack([i["x"] for i in items]), "y": torch.stack([i["y"] for i in items])}


def toy_cfg(**kw):
    return LoopConfig(**{"max_steps": 6, **kw}, optim=OptimConfig(learning_rate=0.05, warmup_ratio=0.0))


# --- the batch stream ----------------------------------------------------------------


def test_every_epoch_visits_each_instance_once():
    stream = BatchStream(list(range(10)), batch_size=5, collate=lambda items, g: items, seed=3)
    epoch0, epoch1 = stream.indices(0, 10), stream.indices(10, 10)
    assert sorted(epoch0) == list(range(10)) and sorted(epoch1) == list(range(10))
    assert epoch0 != epoch1  # reshuffled


def test_seeking_gives_the_batches_that_advancing_gives():
    collate = lambda items, g: (items, torch.rand(2, generator=g).tolist())  # noqa: E731  a "mask" draw too
    walked = BatchStream(list(range(7)), batch_size=3, collate=collate, seed=1)
    seen = []
    for _ in range(6):
        seen.append(walked.micro_batch(0)[0])
        walked.advance(1)
    jumped = BatchStream(list(range(7)), batch_size=3, collate=collate, seed=1, position=4 * 3)
    assert jumped.micro_batch(0)[0] == seen[4]
    assert jumped.micro_batch(1)[0] == seen[5]


def test_ranks_split_the_micro_batches_one_process_would_accumulate():
    # 2 ranks x 1 micro-batch == 1 rank x 2 accumulated micro-batches, for every step
    for step in range(4):
        two_ranks = {micro_batch_slot(step, 0, r, world_size=2, grad_accum=1) for r in range(2)}
        accumulate = {micro_batch_slot(step, a, 0, world_size=1, grad_accum=2) for a in range(2)}
        assert two_ranks == accumulate == {2 * step, 2 * step + 1}


# --- the loop ----------------------------------------------------------------------------


def test_accumulating_two_half_batches_equals_one_full_batch():
    results = []
    for batch_size, accum in ((4, 1), (2, 2)):
        model = Toy()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        stream = BatchStream(toy_instances(), batch_size, stack, seed=5)
        recs = train_loop(model, opt, stream, toy_cfg(grad_accum=accum), progress=False)
        results.append(([r["loss"] for r in recs], torch.cat([p.detach().flatten() for p in model.parameters()])))
    (loss_a, w_a), (loss_b, w_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-6)
    torch.testing.assert_close(w_a, w_b, rtol=1e-6, atol=1e-7)
    assert loss_a[-1] < loss_a[0]  # it does learn


def test_a_nan_loss_stops_training_naming_step_and_batch():
    instances = toy_instances(poison=5)
    stream = BatchStream(instances, 2, stack, seed=5)
    # the first training position holding instance 5: a NaN must stop the run at its step
    pos = stream.indices(0, 12).index(5)
    step, first = pos // 2 + 1, (pos // 2) * 2
    model = Toy()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with pytest.raises(NonFiniteLoss) as err:
        train_loop(model, opt, stream, toy_cfg(max_steps=6), progress=False)
    msg = str(err.value)
    assert f"at step {step} " in msg
    assert f"positions {first}..{first + 1}" in msg and "loss nan" in msg
    assert torch.isfinite(model.lin.weight).all()  # the poisoned update was never applied


def test_fp16_without_a_gpu_is_a_user_error():
    with pytest.raises(BertkitError, match="bf16"):
        autocast_for("fp16", "cpu")


def test_bad_run_settings_name_the_flag():
    with pytest.raises(BertkitError, match="--grad-accum"):
        RunConfig(data="x", grad_accum=0).validate()
    with pytest.raises(BertkitError, match="optimizer"):
        RunConfig(data="x", optimizer="sgd").validate()


def test_the_progress_bar_shows_tokens_per_second_in_one_format_at_every_size():
    # it showed "4299.6045" below 10^4 and "1.02e+04" above: a rate in two formats as a run sped up
    from bertkit.training.loop import bar_value

    for rate in (812.25, 4299.6045, 10234.5, 123456.7):
        shown = bar_value("tokens_per_s", rate)
        assert "e" not in shown and "." not in shown, shown
        assert int(shown.replace(",", "")) == round(rate)  # a whole number, thousands separated
    assert bar_value("loss", 4.29960) == "4.2996" and bar_value("lr", 5e-5) == "5e-05"


# --- the held-out loss -------------------------------------------------------------


@pytest.mark.parametrize("head", ["nsp", "mlm"])
def test_the_held_out_loss_is_the_loss_of_the_whole_slice(head):
    """The held-out loss was the mean of the batches' mean losses: a last batch of one sequence, or one with
    few masked tokens, weighed as much as a full one. It is the training objective over the whole slice: the
    MLM cross-entropy per masked token (plus NSP per pair), what the model gives for the slice as one batch."""
    from bertkit.model.config import BertConfig, IGNORE_INDEX
    from bertkit.model.heads import BertForMaskedLM, BertForPreTraining
    from bertkit.pretraining.train import evaluate

    g = torch.Generator().manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=16)
    model = (BertForPreTraining if head == "nsp" else BertForMaskedLM)(config, generator=g)
    n, t = 5, 12
    ids = torch.randint(5, 50, (n, t), generator=g)
    labels = torch.full((n, t), IGNORE_INDEX)
    for i, masked in enumerate((6, 5, 1, 2, 1)):  # the last batch of 2 holds 1 sequence with 1 masked token
        labels[i, 1:1 + masked] = ids[i, 1:1 + masked]
    whole = {"input_ids": ids, "attention_mask": torch.ones(n, t, dtype=torch.long),
             "token_type_ids": torch.zeros(n, t, dtype=torch.long), "labels": labels}
    if head == "nsp":
        whole["next_sentence_label"] = torch.tensor([0, 1, 1, 0, 1])
    batches = [{k: v[s:s + 2] for k, v in whole.items()} for s in range(0, n, 2)]
    model.eval()
    with torch.no_grad():
        one = float(model(**whole).loss)
        means = sum(float(model(**b).loss) for b in batches) / len(batches)
    assert abs(means - one) > 1e-3  # the mean of batch means is another figure
    assert evaluate(model, batches, autocast_for("fp32", "cpu"))["loss"] == pytest.approx(one, abs=1e-5)


def test_an_sop_run_names_its_pair_accuracy_sop_acc(tmp_path):
    """An SOP run (sentence-order prediction: is B swapped?) logged its held-out and training accuracy of that
    task as nsp_acc, a next-sentence figure it does not measure, in metrics.jsonl, its last line and the curves.
    Now it is sop_acc (an NSP run's stays nsp_acc): the head's argmax against the labels, counted by hand here;
    an SOP run's earlier lines that say nsp_acc (a run resumed across the rename) are still read for its curve."""
    from bertkit.model.config import BertConfig, IGNORE_INDEX
    from bertkit.model.heads import BertForPreTraining
    from bertkit.pretraining.train import accuracies, evaluate, final_summary

    g = torch.Generator().manual_seed(1)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=16)
    model = BertForPreTraining(config, generator=g).eval()
    ids = torch.randint(5, 50, (6, 10), generator=g)
    labels = torch.full((6, 10), IGNORE_INDEX)
    labels[:, 2] = ids[:, 2]
    batch = {"input_ids": ids, "attention_mask": torch.ones(6, 10, dtype=torch.long),
             "token_type_ids": torch.zeros(6, 10, dtype=torch.long), "labels": labels,
             "next_sentence_label": torch.tensor([0, 1, 1, 0, 1, 0])}
    with torch.no_grad():
        right = (model(**batch).seq_relationship_logits.argmax(-1) == batch["next_sentence_label"]).float().mean()
    figures = evaluate(model, [batch], autocast_for("fp32", "cpu"), pair="sop")
    assert figures["sop_acc"] == pytest.approx(float(right)) and "nsp_acc" not in figures
    assert "nsp_acc" in evaluate(model, [batch], autocast_for("fp32", "cpu"), pair="nsp")
    assert accuracies({"nsp_correct": 3.0, "nsp_total": 4.0}, "sop") == {"sop_acc": 0.75}
    # the run's last words and its curves
    from bertkit.pretraining.train import panels
    from bertkit.training.metrics_log import points

    old = {"split": "eval", "step": 2, "loss": 4.0, "mlm_acc": 0.1, "nsp_acc": 0.5}  # before the rename
    new = {"split": "eval", "step": 4, "loss": 3.0, "mlm_acc": 0.2, "sop_acc": 0.625}
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (old, new)))
    assert final_summary(tmp_path).endswith("held out at step 4: loss 3.0000, mlm_acc 0.2000, sop_acc 0.6250")
    (key, title), = [p for p in panels("sop") if "acc" in p[1] and "MLM" not in p[1]]
    assert title == "SOP accuracy" and points([old, new], key) == [(2, 0.5), (4, 0.625)]
    assert [p for p in panels("nsp") if p[1] == "NSP accuracy"] == [("nsp_acc", "NSP accuracy")]


def test_a_config_file_is_read_once_for_its_kind_and_its_settings(tmp_path, monkeypatch):
    """--config FILE was read twice, for its model_type and then for its settings: a file replaced in between (an
    ELECTRA config over a BERT one) was judged BERT and then refused as 'for model_type electra'. It is read once."""
    from pathlib import Path

    from test_checkpoint import _replaced_after_its_first_read

    from bertkit.model.config import BertConfig
    from bertkit.pretraining.train import preset_or_file

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "bert", "hidden_size": 48, "num_attention_heads": 3}))
    _replaced_after_its_first_read(monkeypatch, path, {"model_type": "electra", "hidden_size": 64})
    config = preset_or_file(str(path))
    assert type(config) is BertConfig and (config.hidden_size, config.num_attention_heads) == (48, 3)
    assert json.loads(Path(path).read_text())["model_type"] == "electra"  # the premise: the file was replaced
