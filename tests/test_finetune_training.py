"""Fine-tuning on the one training loop: what it gained from it, checked against plain references.

- accumulation: k micro-batches of n give the weights one batch of k x n gives
  (1e-6), also for token labels, whose loss is averaged over the labelled tokens
  of the whole update (a control shows the per-micro-batch mean would differ);
- a run killed with SIGKILL and resumed equals the uninterrupted run: the
  same loss at every step, the same final metrics and weights (exact);
- 2-process torchrun DDP equals one process accumulating 2 (1e-5);
- bf16 autocast trains; `--device cuda` equals the CPU (skipped without a GPU);
- a run that learns nothing says so; bad arguments fail before any loading
  and leave no output directory behind.
"""

import json
import random
import signal
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pretrain_support import refusal, run_cli
from test_distributed import torchrun
from test_finetune import Bag, bag_features, sentiment_rows, tiny_model_dir, write_tsv

from bertkit.tasks.classification import TextTaskConfig, finetune_text
from bertkit.tasks.config import TrainConfig
from bertkit.model.config import IGNORE_INDEX
from bertkit.tasks.batching import loss_terms
from bertkit.tasks.trainer import EpochBatches, train, warn_if_trivial, warnings_once
from bertkit.training.loop import LoopConfig, train_loop
from bertkit.training.optim import OptimConfig

def fast(epochs=5, lr=5e-3, warmup_ratio=0.1, **kw):
    return TrainConfig(**{"batch_size": 8, "seed": 0, "progress": False, "device": "cpu", **kw}, epochs=epochs,
                       optim=OptimConfig(learning_rate=lr, warmup_ratio=warmup_ratio))


# --- accumulation ---------------------------------------------------------------------


class Tagger(torch.nn.Module):
    """Per-token classification: embedding -> 3 tags, cross-entropy over the labelled tokens."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 5)
        self.out = torch.nn.Linear(5, 3)

    def forward(self, input_ids, attention_mask, token_type_ids, labels):
        logits = self.out(self.emb(input_ids))

        class O:
            pass

        o = O()
        o.loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
        return o


def tagged_features(n=24):
    rng = random.Random(4)
    feats = []
    for _ in range(n):
        ids = [rng.randrange(1, 20) for _ in range(rng.randint(2, 12))]
        # a few labelled tokens or many: micro-batches differ in how many terms their loss averages
        feats.append({"input_ids": ids, "labels": [rng.randrange(3) if rng.random() < 0.5 else IGNORE_INDEX
                                                   for _ in ids[:-1]] + [rng.randrange(3)]})
    return feats


def one_update(batch_size, accum, weigh):
    torch.manual_seed(0)
    model = Tagger()
    stream = EpochBatches(tagged_features(), batch_size, accum, seed=3, group_by_length=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    cfg = LoopConfig(max_steps=1, grad_accum=accum, optim=OptimConfig(learning_rate=0.5, warmup_ratio=0, max_grad_norm=0))
    train_loop(model, opt, stream, cfg, weigh=weigh, progress=False)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_accumulated_token_level_micro_batches_equal_one_batch():
    whole = one_update(8, 1, loss_terms)
    torch.testing.assert_close(one_update(4, 2, loss_terms), whole, rtol=0, atol=1e-6)
    torch.testing.assert_close(one_update(2, 4, loss_terms), whole, rtol=0, atol=1e-6)
    # control: a plain mean of the micro-batch means is another update
    assert (one_update(4, 2, None) - whole).abs().max() > 1e-4


def test_the_epoch_batches_are_split_not_redrawn():
    feats = tagged_features(30)
    whole, parts = EpochBatches(feats, 8, 1, seed=1), EpochBatches(feats, 4, 2, seed=1)
    assert whole.steps_per_epoch == parts.steps_per_epoch == 4  # 30 = 3 x 8 + 6, and 6 fill both parts
    for k in range(2 * whole.steps_per_epoch):  # two epochs: an update's micro-batches share out its batch
        a = whole.micro_batch(k)[0]["input_ids"]
        b, c = parts.micro_batch(2 * k)[0]["input_ids"], parts.micro_batch(2 * k + 1)[0]["input_ids"]
        assert len(a) == len(b) + len(c)
        assert whole.batches(k // 4)[k % 4] == parts.batches(k // 4)[k % 4]
    assert sorted(i for b in whole.batches(0) for i in b) == list(range(30))
    assert whole.batches(0) != whole.batches(1)  # reshuffled every epoch


def test_train_with_accumulation_equals_the_full_batch():
    results = []
    for batch_size, accum in ((8, 1), (4, 2)):
        torch.manual_seed(123)
        model = Bag()
        train(model, bag_features(), fast(epochs=2, lr=0.05, batch_size=batch_size, grad_accum=accum), log=lambda s: None)
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=1e-6)


def test_a_diverging_fine_tuning_run_stops_naming_step_and_batch(tmp_path):
    from bertkit.training.loop import NonFiniteLoss

    # AdamW moves every weight by about lr per step: lr 1e30 overflows the logits in step 2
    with pytest.raises(NonFiniteLoss, match=r"at step 2 .*epoch 1, batch 2, part 1/1"):
        train(Bag(), bag_features(), fast(lr=1e30, warmup_ratio=0), output_dir=tmp_path, log=lambda s: None)
    assert sorted(train_losses(tmp_path)) == [1]  # nothing after the bad step was logged


# --- precision and devices --------------------------------------------------------------


def test_bf16_autocast_trains_close_to_fp32():
    losses = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(123)
        r = train(Bag(), bag_features(), fast(epochs=4, lr=0.05, precision=precision), log=lambda s: None)
        losses[precision] = [h["train_loss"] for h in r.history]
    assert losses["bf16"][-1] < losses["bf16"][0]  # it learns
    assert losses["bf16"] != losses["fp32"]  # autocast was on
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.05)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_trains_like_the_cpu():
    weights = {}
    for device in ("cpu", "cuda"):
        torch.manual_seed(123)
        model = Bag()
        train(model, bag_features(), fast(epochs=2, lr=0.05, device=device), log=lambda s: None)
        assert next(model.parameters()).device.type == device
        weights[device] = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    torch.testing.assert_close(weights["cuda"], weights["cpu"], rtol=1e-4, atol=1e-5)


# --- the CLI: resume, DDP, argument checks ---------------------------------------------------


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    d = tmp_path_factory.mktemp("ft")
    rng = random.Random(0)
    train_p = write_tsv(d / "train.tsv", ["sentence", "label"], sentiment_rows(80, rng))
    dev_p = write_tsv(d / "dev.tsv", ["sentence", "label"], sentiment_rows(30, rng))
    return d, tiny_model_dir(d / "tiny"), train_p, dev_p


def finetune_cli_args(task, out, *args) -> tuple:
    d, model, train_p, dev_p = task
    return ("finetune", "classify", "--train", train_p, "--dev", dev_p, "--model", model, "--max-length", 32,
            "--no-progress", "--device", "cpu", "-o", out, *args)


def finetune_cli(task, out, *args, check=True, kill_at_step=None):
    return run_cli(*finetune_cli_args(task, out, *args), check=check, kill_at_step=kill_at_step)


def train_losses(out) -> dict:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


def without_seconds(final: dict) -> dict:
    drop = ("train_seconds", "eval_seconds")
    return {k: ([{a: b for a, b in e.items() if a not in drop} for e in v] if k == "epochs" else v)
            for k, v in final.items() if k not in drop}


@pytest.mark.slow
def test_a_killed_fine_tuning_run_resumes_exactly(task, tmp_path):
    common = ("--epochs", 2, "--batch-size", 8, "--learning-rate", 5e-3, "--save-every", 3, "--seed", 0)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    finetune_cli(task, straight, *common)
    # 10 updates per epoch; killed during update 13 (in epoch 2), after the step-12 checkpoint
    res = finetune_cli(task, killed, *common, kill_at_step=12, check=False)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    assert sorted(train_losses(killed)) == list(range(1, 13))
    assert [p.name for p in (killed / "checkpoints").iterdir()] == ["step-00000012.pt"]

    run_cli("finetune", "classify", "-o", killed, "--resume")  # the saved settings, nothing repeated

    assert train_losses(killed) == train_losses(straight)  # exact, step for step
    a = json.loads((straight / "metrics.json").read_text())
    b = json.loads((killed / "metrics.json").read_text())
    assert without_seconds(b) == without_seconds(a)  # the same epochs, best epoch and dev report
    wa, wb = load_file(straight / "model.safetensors"), load_file(killed / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (killed / "curves.png").stat().st_size > 0


ONE_EPOCH = ("--epochs", 1, "--batch-size", 16, "--seed", 0)  # 80 rows / 16: 5 updates, one checkpoint at the end


@pytest.fixture(scope="module")
def one_epoch(task, tmp_path_factory):
    """A finished one-epoch run (ONE_EPOCH) and what it printed."""
    done = tmp_path_factory.mktemp("one_epoch") / "done"
    return done, finetune_cli(task, done, *ONE_EPOCH)


def test_a_finished_run_deletes_its_checkpoint_unless_asked_to_keep_it(task, one_epoch, tmp_path, capsys):
    common = ONE_EPOCH
    done, res = one_epoch
    assert "deleted the resume checkpoint" in res.stdout
    assert not (done / "checkpoints").exists() and (done / "model.safetensors").is_file()
    # finished is still a run: neither overwritten nor resumable
    status, err = refusal(capsys, *finetune_cli_args(task, done, *common))
    assert status == 2 and "already holds a run" in err
    status, err = refusal(capsys, "finetune", "classify", "-o", done, "--resume", "--epochs", 2)
    assert status == 2 and "finished and deleted its checkpoint" in err

    kept = tmp_path / "kept"
    finetune_cli(task, kept, *common, "--keep-checkpoint")
    assert [p.name for p in (kept / "checkpoints").iterdir()] == ["step-00000005.pt"]  # 80 rows / 16
    run_cli("finetune", "classify", "-o", kept, "--resume", "--epochs", 2)  # a second epoch on top
    assert sorted(train_losses(kept)) == list(range(1, 11))
    assert [p.name for p in (kept / "checkpoints").iterdir()] == ["step-00000010.pt"]  # still kept: a saved setting


def test_a_checkpoint_of_an_earlier_bertkit_without_the_saved_epochs_reason_resumes():
    """A checkpoint written before the best epoch's record kept why it was saved ("saved_because", 19cb000)
    resumed to its end, then died in a KeyError traceback when the resumed epochs did not beat its best epoch:
    `finetune classify -o RUN --resume` of a run of the bertkit of 11-25 (53df944), its model and metrics.json
    unwritten. The record below is that checkpoint's, as it wrote it."""
    from bertkit.tasks.trainer import Epochs, TrainResult

    record = {"epoch": 1, "step": 5, "train_loss": 0.6926, "train_seconds": 58.19, "accuracy": 0.5,
              "macro_f1": 0.4048, "f1": 0.1667, "eval_seconds": 3.46}
    epochs = Epochs(per_epoch=5, metric="accuracy", greater_is_better=True, evaluate=None, save=None, is_main=True,
                    log=print)
    epochs.resume({"finetune": {"history": [record], "best": dict(record), "epoch_losses": [],
                                "best_weights": None}}, torch.nn.Linear(2, 2))
    saved = TrainResult(epochs.history, epochs.best, 0.0).saved["saved"]  # what metrics.json and the last line say
    assert saved == {"epoch": 1, "because": "the best accuracy (0.5000) before the resume"}


@pytest.mark.slow
def test_a_resume_on_a_training_file_edited_since_is_refused(task, tmp_path, capsys):
    """A run's checkpoint recorded only its row count: a training file edited in place (labels fixed, rows
    replaced) with as many rows resumed on the edited rows, half the run on one data set and half on another.
    It records a digest of the training rows now, and a resume on other rows is refused in one line."""
    d, model, train_p, dev_p = task
    mine = tmp_path / "train.tsv"
    mine.write_text(Path(train_p).read_text(encoding="utf-8"), encoding="utf-8")
    out = tmp_path / "run"
    args = ("finetune", "classify", "--train", mine, "--dev", dev_p, "--model", model, "--max-length", 32,
            "--no-progress", "--device", "cpu", "-o", out, "--epochs", 1, "--batch-size", 8, "--save-every", 3)
    res = run_cli(*args, check=False, kill_at_step=3)
    assert res.returncode == -signal.SIGKILL and (out / "checkpoints").is_dir(), res.stderr[-2000:]
    header, *rows = mine.read_text(encoding="utf-8").splitlines()
    other = {"pos": "neg", "neg": "pos"}
    flipped = [f"{text}\t{other[label]}" for text, label in (r.rsplit("\t", 1) for r in rows)]
    mine.write_text("\n".join([header, *flipped]) + "\n", encoding="utf-8")  # the same 80 rows, other labels
    with pytest.warns(UserWarning, match="took over a stale lock"):  # the killed run's (a stderr line in a process)
        status, err = refusal(capsys, "finetune", "classify", "-o", out, "--resume")
    assert status == 2
    assert err.splitlines()[-1].startswith("bertkit: error: --resume: the training rows are not the ones"), err
    mine.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")  # the rows it started on: resumes
    run_cli("finetune", "classify", "-o", out, "--resume")
    assert (out / "model.safetensors").is_file()



def test_a_run_killed_before_its_first_checkpoint_starts_again_on_resume(task, one_epoch, tmp_path):
    # killed during update 3 of 5: the epoch's checkpoint was never written and nothing is finished
    killed = tmp_path / "killed"
    res = finetune_cli(task, killed, *ONE_EPOCH, kill_at_step=2, check=False)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    assert sorted(train_losses(killed)) == [1, 2]
    assert not (killed / "checkpoints").exists() and not (killed / "model.safetensors").exists()

    res = run_cli("finetune", "classify", "-o", killed, "--resume")  # no "finished and deleted" error
    assert "stopped before its first checkpoint" in res.stdout and "from the beginning" in res.stdout
    assert "--save-every" in res.stdout

    done = one_epoch[0]
    assert train_losses(killed) == train_losses(done)  # the whole run again, exactly, nothing kept twice
    wa, wb = load_file(done / "model.safetensors"), load_file(killed / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_run_killed_while_its_first_checkpoint_is_written_starts_again_not_finished(task, one_epoch, tmp_path,
                                                                                     capsys):
    # the epoch's best model is saved before its checkpoint: a kill between the two left the model and no
    # checkpoint, and --resume called the run finished ("deleted its checkpoint") and would not go on
    killed = tmp_path / "killed"
    res = run_cli(*finetune_cli_args(task, killed, *ONE_EPOCH), kill_at_step="kill-checkpoint:5", check=False)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    assert (killed / "model.safetensors").is_file() and not list((killed / "checkpoints").glob("*.pt"))
    res = run_cli("finetune", "classify", "-o", killed, "--resume")
    assert "stopped before its first checkpoint" in res.stdout
    done = one_epoch[0]
    assert train_losses(killed) == train_losses(done)
    wa, wb = load_file(done / "model.safetensors"), load_file(killed / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # finished now (checkpoint deleted, curves drawn): that is what --resume calls finished
    status, err = refusal(capsys, "finetune", "classify", "-o", killed, "--resume")
    assert status == 2 and "finished and deleted its checkpoint" in err


def test_a_run_saved_without_dev_by_an_earlier_bertkit_resumes(task, tmp_path, capsys):
    # before --metric was checked, a run without --dev saved its task's default metric in run_config.json
    d, model, train_p, _ = task
    killed = tmp_path / "killed"
    res = run_cli("finetune", "classify", "--train", train_p, "--model", model, "--max-length", 32, "--no-progress",
                  "--device", "cpu", "-o", killed, *ONE_EPOCH, kill_at_step=2, check=False)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    saved = json.loads((killed / "run_config.json").read_text())
    assert saved["dev"] is None and saved["training"]["metric"] is None
    saved["training"]["metric"] = "accuracy"  # as the earlier bertkit wrote it
    (killed / "run_config.json").write_text(json.dumps(saved))
    run_cli("finetune", "classify", "-o", killed, "--resume")
    assert sorted(train_losses(killed)) == [1, 2, 3, 4, 5]
    status, err = refusal(capsys, "finetune", "classify", "-o", tmp_path / "new", "--train", train_p, "--model", model,
                          "--metric", "accuracy")  # a --metric given without --dev is still refused
    assert status == 2 and "give --dev too" in err


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["classify", "ner"])
def test_two_ddp_processes_equal_one_accumulating_two(task, tmp_path, kind):
    from test_finetune_ner import ner_file

    d, model, train_p, dev_p = task
    if kind == "ner":  # token labels: 4 or 6 per sentence, so the update is weighted by labelled tokens
        rng = random.Random(0)
        train_p, dev_p = ner_file(tmp_path / "train.txt", 40, rng), ner_file(tmp_path / "dev.txt", 10, rng)
    exact = tiny_model_dir(tmp_path / "no-dropout")  # dropout off: each process has its own stream
    config = json.loads((exact / "config.json").read_text())
    assert config["hidden_dropout_prob"] > 0
    (exact / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.0,
                                                   "attention_probs_dropout_prob": 0.0}))
    extra = ("--stride", 8) if kind == "ner" else ()
    common = (kind, *extra, "--train", train_p, "--dev", dev_p, "--model", exact, "--max-length", 32, "--no-progress",
              "--max-steps", 5, "--batch-size", 4, "--learning-rate", 1e-3, "--seed", 5, "--device", "cpu")
    run_cli("finetune", *common, "--grad-accum", 2, "-o", tmp_path / "single")
    torchrun(2, "finetune", *common, "-o", tmp_path / "ddp")
    single, ddp = train_losses(tmp_path / "single"), train_losses(tmp_path / "ddp")
    assert sorted(ddp) == sorted(single) == [1, 2, 3, 4, 5]
    for step in single:
        assert ddp[step] == pytest.approx(single[step], rel=1e-5), step
    a, b = load_file(tmp_path / "single" / "model.safetensors"), load_file(tmp_path / "ddp" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-5, msg=k)


def test_bad_arguments_fail_first_and_leave_nothing(tmp_path, capsys):
    # no training file exists: the argument is what must be reported, before any loading
    for flag, value, message in (("--batch-size", -4, "--batch-size must be >= 1, got -4"),
                                 ("--epochs", 0, "--epochs must be > 0, got 0.0"),
                                 ("--learning-rate", -1, "--learning-rate must be > 0, got -1.0"),
                                 ("--grad-accum", 0, "--grad-accum must be >= 1, got 0"),
                                 ("--adam-beta1", 2, "--adam-beta1 must be in [0, 1), got 2.0"),
                                 ("--adam-beta2", 1, "--adam-beta2 must be in [0, 1), got 1.0"),
                                 ("--adam-epsilon", -1, "--adam-epsilon must be >= 0, got -1.0"),
                                 ("--max-train-examples", 0, "--max-train-examples must be >= 1 (leave it out")):
        status, err = refusal(capsys, "finetune", "classify", "--train", tmp_path / "missing.tsv",
                              "-o", tmp_path / "out", flag, value)
        error = err.strip().splitlines()[-1]
        assert status == 2 and error.startswith(f"bertkit: error: {message}"), err[-500:]
        assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_a_device_this_machine_lacks_fails_first(tmp_path, capsys):
    cases = [(("--precision", "fp16", "--device", "cpu"), "--precision fp16 needs a CUDA GPU")]
    if not torch.cuda.is_available():
        cases.append((("--device", "cuda"), "--device cuda was asked for but no CUDA GPU is visible"))
    for args, message in cases:
        status, err = refusal(capsys, "finetune", "ner", "--train", tmp_path / "missing.txt", "-o", tmp_path / "out",
                              *args)
        assert status == 2 and message in err and not (tmp_path / "out").exists()


def test_a_pre_training_run_that_cannot_start_leaves_no_output(tmp_path, capsys):
    status, err = refusal(capsys, "pretrain", "run", tmp_path / "no-data", "--config", "huge", "-o", tmp_path / "out")
    assert status == 2 and "--config 'huge' is neither a preset" in err
    status, err = refusal(capsys, "pretrain", "run", tmp_path / "no-data", "--batch-size", 0, "-o", tmp_path / "out")
    assert status == 2 and "--batch-size must be >= 1, got 0" in err
    status, err = refusal(capsys, "pretrain", "run", tmp_path / "no-data", "-o", tmp_path / "out")
    assert status == 2 and "pretrain prepare" in err
    # a real process: its whole standard error is the one line (a warning would show there)
    res = run_cli("pretrain", "run", tmp_path / "no-data", "--init-from", tmp_path / "no-model", "-o", tmp_path / "out",
                  check=False)  # was "no vocab.txt there", once the data had loaded
    assert res.returncode == 2 and res.stderr == (f"bertkit: error: --init-from {tmp_path / 'no-model'} does not exist: "
                                                  "name the folder of the checkpoint to continue (config.json, "
                                                  "model.safetensors, vocab.txt)\n"), res.stderr
    assert not (tmp_path / "out").exists()


# --- a run that learns nothing ------------------------------------------------------------


def test_trivial_baseline_check_by_hand():
    said = []
    assert warn_if_trivial({"accuracy": 0.8, "epoch": 1}, "accuracy", True, (0.8, "always 'neg'"), said.append)
    assert "no better than the trivial baseline 0.8000 (always 'neg')" in said[0] and "--learning-rate" in said[0]
    assert not warn_if_trivial({"accuracy": 0.81, "epoch": 1}, "accuracy", True, (0.8, "x"), said.append)
    assert warn_if_trivial({"mse": 2.0, "epoch": 1}, "mse", False, (1.5, "always the mean"), said.append)
    assert not warn_if_trivial(None, "f1", True, (0.0, "no entities"), said.append)


def test_a_dev_warning_is_shown_once_a_run_not_once_an_epoch(monkeypatch):
    # a regression whose predictions are constant warned "every example the same score -0.0084: pearson and
    # spearman are undefined" after every epoch, its number new each time (so Python's own once-per-text filter
    # let each through): 4 epochs, 4 warnings of one cause. Now the first of each cause (its words, numbers
    # aside) is shown; a different cause still is, and the epochs' figures are still recorded
    epoch = iter(range(1, 10))

    def evaluate(model):
        n = next(epoch)
        warnings.warn(f"the model gives every example the same score {n / 1000:.4f}: undefined")
        if n == 3:
            warnings.warn("another cause")
        return {"accuracy": n / 10}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(Bag(), bag_features(), fast(epochs=4, lr=0.05), evaluate=evaluate, log=lambda s: None)
    assert [str(w.message) for w in caught] == ["the model gives every example the same score 0.0010: undefined",
                                                "another cause"]
    assert [r["accuracy"] for r in result.history] == [0.1, 0.2, 0.3, 0.4]
    # under torchrun every process evaluates: the first shows the warning, the others (RANK 1) did too
    for rank, shown in (("1", []), ("0", ["the model gives every example the same score 0.0060: undefined"])):
        monkeypatch.setenv("RANK", rank)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert "accuracy" in warnings_once(lambda: evaluate(None), set())  # epochs 5 and 6's figures
        assert [str(w.message) for w in caught] == shown


def test_a_run_that_learns_nothing_is_reported(task, tmp_path):
    d, model, train_p, _ = task
    rng = random.Random(2)
    rows = [r for r in sentiment_rows(60, rng) if r[1] == "neg"][:24] + [r for r in sentiment_rows(20, rng) if r[1] == "pos"][:6]
    dev = write_tsv(tmp_path / "dev.tsv", ["sentence", "label"], rows)  # 80% neg: the majority class scores 0.8
    said = []
    cfg = TextTaskConfig(train=str(train_p), dev=str(dev), output=str(tmp_path / "out"), model=str(model),
                         max_length=32, training=fast(epochs=1, lr=1e-9, max_steps=1))
    final = finetune_text(cfg, log=said.append)
    assert final["dev"]["accuracy"] <= 0.8
    warning = [s for s in said if s.startswith("warning:")]
    assert len(warning) == 1 and "always the majority class 'neg'" in warning[0]
    records = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["split"] for r in records] == ["train", "eval"] and (tmp_path / "out" / "curves.png").is_file()


def test_ctrl_c_while_a_checkpoint_is_written_is_one_line_and_the_run_resumes_exactly(task, one_epoch, tmp_path):
    """Ctrl-C (SIGINT) during a checkpoint's write: once a screen of traceback (torch's zip writer turned the
    KeyboardInterrupt into "RuntimeError: ... unexpected pos"), exit status 1, and a .tmp file left. The
    checkpoint under way is finished first, the command says in one line how to go on, and --resume ends
    where the uninterrupted run ends."""
    stopped = tmp_path / "stopped"
    res = finetune_cli(task, stopped, *ONE_EPOCH, "--save-every", 2, kill_at_step="interrupt-checkpoint:4",
                       check=False)  # 5 updates: checkpoints 2 and 4, Ctrl-C while 4 is written
    assert res.returncode == 130, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr[-3000:]
    assert res.stderr.startswith("bertkit: interrupted") and "--resume" in res.stderr
    # checkpoint 4 whole (and 2, which it would have replaced), no .tmp
    assert sorted(p.name for p in (stopped / "checkpoints").iterdir()) == ["step-00000002.pt", "step-00000004.pt"]

    run_cli("finetune", "classify", "-o", stopped, "--resume")
    done = one_epoch[0]
    assert train_losses(stopped) == train_losses(done)
    wa, wb = load_file(done / "model.safetensors"), load_file(stopped / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("save_every, warned", [(4, False), (1, True)])
def test_the_free_space_warning_counts_the_checkpoints_the_run_still_writes(tmp_path, monkeypatch, save_every,
                                                                           warned):
    """After its first checkpoint a run warns when the ones still to come will not fit: --keep-last 3 of them, or
    as many as the run still writes when that is fewer. The disk is made to have room for 2.5 checkpoints: a run of
    8 updates saving every 4 writes 1 more (was warned for 3), every 1 writes 7 (warned). The checkpoints the run
    really writes are counted as it writes them."""
    import bertkit.training.state as state

    written, real_save = [], state.save_checkpoint

    def counted(run_dir, step, *args, **kwargs):
        written.append(step)
        return real_save(run_dir, step, *args, **kwargs)

    monkeypatch.setattr(state, "save_checkpoint", counted)
    monkeypatch.setattr(state, "free_space", lambda folder: 2.5 * min(p.stat().st_size for p in folder.iterdir()))
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(Bag(), bag_features(), fast(epochs=1, save_every=save_every, keep_last=3), output_dir=tmp_path / "run",
              log=lambda s: None)
    said = [str(w.message) for w in caught if "checkpoints still to come" in str(w.message)]
    assert len(written) - 1 == (1 if save_every == 4 else 7)  # 64 rows in batches of 8: 8 updates
    assert bool(said) == (min(3, len(written) - 1) > 2.5) == warned, said
