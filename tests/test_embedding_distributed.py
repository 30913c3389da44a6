"""Embeddings gathered across processes with their gradients: 2 ranks x n = 1 process x 2n.

Two gloo processes on the CPU each hold half of a batch. With
`bertkit.training.distributed.gather_with_grad` every anchor is scored against
the candidates of both, and after the gradient average DDP does, the loss and
every parameter's gradient equal one process holding the whole batch (1e-5):
for multiple-negatives ranking (with a hard-negative column), its cached form
and CoSENT, also when the halves differ in size (an epoch's short last batch,
weighted as the loop weighs micro-batches: by their rows). Then the command:
`torchrun --nproc_per_node 2 bertkit finetune embed --batch-size 4 --loss cached-mnrl`
trains as `bertkit finetune embed --batch-size 8` does, step for step (DDP, the
gather and GradCache together).
"""

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file

from pretrain_support import run_cli
from test_distributed import torchrun
from test_embedding_losses import columns_batch, sentences
from test_finetune import tiny_model_dir

from bertkit.tasks.embedding import SentenceEmbedder
from bertkit.model.modeling import BertModel
from bertkit.text.tokenizer import Tokenizer

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def batch_for(path, loss: str, rows: list[int]):
    """The stacked batch of the given rows of one fixed global batch (column by column), and its labels."""
    texts = sentences(3 * 8, seed=11)
    columns = [texts[0:8], texts[8:16]] + ([texts[16:24]] if loss != "cosent" else [])
    labels = torch.tensor([0.0, 1, 2, 2, 5, 3, 1, 4])[rows] if loss == "cosent" else None
    batch, _ = columns_batch(Tokenizer.from_pretrained(path), [[col[i] for i in rows] for col in columns])
    return batch, labels, len(columns)


def loss_and_grads(path, loss: str, rows: list[int], weight: float = 1.0):
    batch, labels, C = batch_for(path, loss, rows)
    model = SentenceEmbedder(BertModel.from_pretrained(path), loss=loss, columns=C, mini_batch_size=2).eval()
    out = model(**batch, labels=labels).loss
    (out * weight).backward()
    return out.detach(), [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


CASES = [("mnrl", (4, 4)), ("mnrl", (3, 5)), ("cached-mnrl", (3, 5)), ("cosent", (4, 4)), ("cosent", (5, 3))]


def _rank(rank, world, port, path, result):
    """Every case in one pair of processes (starting them is the slow part)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {}
        for loss, sizes in CASES:
            start = sum(sizes[:rank])
            rows = list(range(start, start + sizes[rank]))
            share = sizes[rank] / sum(sizes)  # the loop's weight: this micro-batch's rows of the update's
            loss_value, grads = loss_and_grads(path, loss, rows, weight=share * world)
            for g in grads:  # what DDP does with the gradients: their average
                dist.all_reduce(g)
                g /= world
            total = loss_value * share
            dist.all_reduce(total)
            results[(loss, sizes)] = {"loss": total, "grads": grads}
        if rank == 0:
            torch.save(results, result)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    path = tiny_model_dir(tmp_path_factory.mktemp("dist_embed"), seed=13)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.0,
                                                  "attention_probs_dropout_prob": 0.0}))
    return path


@pytest.fixture(scope="module")
def two_ranks(exact, tmp_path_factory):
    result = tmp_path_factory.mktemp("ranks") / "rank0.pt"
    mp.spawn(_rank, args=(2, free_port(), exact, result), nprocs=2, join=True)
    return torch.load(result)


@pytest.mark.parametrize("loss,sizes", CASES)
def test_two_ranks_of_n_equal_one_process_of_2n(exact, two_ranks, loss, sizes):
    got = two_ranks[(loss, sizes)]
    expected_loss, expected_grads = loss_and_grads(exact, loss, list(range(8)))
    torch.testing.assert_close(got["loss"], expected_loss, rtol=1e-5, atol=1e-6)
    for g, e in zip(got["grads"], expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    # a control: without the gather each rank would score only its own half, a different loss
    alone, _ = loss_and_grads(exact, loss, list(range(sizes[0])))
    assert abs(alone.item() - expected_loss.item()) > 1e-3


def test_torchrun_two_processes_train_as_one_with_the_whole_batch(exact, tmp_path):
    rows = sentences(40, seed=21)
    train = tmp_path / "train.tsv"
    train.write_text("anchor\tpositive\n" + "".join(f"{a}\t{b}\n" for a, b in zip(rows[:20], rows[20:])))
    common = ("finetune", "embed", "--train", train, "--model", exact, "--max-length", 32, "--epochs", 2,
              "--learning-rate", 1e-3, "--seed", 4, "--no-progress", "--device", "cpu")
    run_cli(*common, "--batch-size", 8, "-o", tmp_path / "one")
    # DDP around the cached loss too (its gradients come from inside the forward): still the same run
    torchrun(2, *common, "--batch-size", 4, "--loss", "cached-mnrl", "--mini-batch-size", 3, "-o", tmp_path / "two")

    def losses(out):
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return {r["step"]: r["loss"] for r in map(json.loads, lines) if r["split"] == "train"}

    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(two) == list(range(1, 7))  # 20 pairs, batches of 8 (the last of 4): 3 updates per epoch
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5), step
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-5, msg=k)
    assert one[6] < one[1]
