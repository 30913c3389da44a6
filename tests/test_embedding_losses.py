"""The embedding losses against sentence-transformers (the oracle), and the batches they need.

Each loss gives sentence-transformers' loss and gradients (1e-5) on identical
batches: on fixed embedding tensors, and through a tiny odd-shaped BERT
(hidden 32, 4 heads, intermediate 37, 2 layers) with the pooling in between,
where sentence-transformers runs the same weights through transformers.
The cached loss (GradCache) equals the full batch; batches never hold a text
(or a group) twice.
"""

import random

import pytest
import torch
from test_finetune import WORDS, tiny_model_dir

from bertkit.tasks.embedding import SentenceEmbedder, no_duplicate_batches
from bertkit.embeddings.losses import cosent, matryoshka, multiple_negatives_ranking
from bertkit.model.modeling import BertModel
from bertkit.text.tokenizer import Tokenizer


def leaves(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).requires_grad_() for s in shapes]


def grads_of(loss, tensors):
    return torch.autograd.grad(loss, tensors)


@pytest.mark.parametrize("negatives", [0, 1, 3])
def test_multiple_negatives_ranking_equals_sentence_transformers(st, negatives):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    B, D = 7, 13
    anchors, *cands = leaves(*[(B, D)] * (2 + negatives), seed=negatives)
    ours = multiple_negatives_ranking(anchors, torch.stack(cands))
    theirs = MultipleNegativesRankingLoss(None).compute_loss_from_embeddings([anchors, *cands], None)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads_of(ours, [anchors, *cands]), grads_of(theirs, [anchors, *cands])):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert ours.item() > 0.1  # a random batch is far from solved: the comparison is not of two zeros


def test_cosent_equals_sentence_transformers_with_tied_scores(st):
    from sentence_transformers.sentence_transformer.losses import CoSENTLoss

    a, b = leaves((9, 11), (9, 11), seed=3)
    labels = torch.tensor([0.0, 1.0, 1.0, 2.5, 5.0, 3.0, 3.0, 0.0, 4.2])  # ties must not be compared
    ours = cosent(a, b, labels)
    theirs = CoSENTLoss(None).compute_loss_from_embeddings([a, b], labels)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    for x, y in zip(grads_of(ours, [a, b]), grads_of(theirs, [a, b])):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_cosent_is_log2_when_two_pairs_tie_in_cosine():
    # by hand: one ordered pair (i above j) with equal cosines: log(1 + e^0) = log 2
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    b = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    assert cosent(a, b, torch.tensor([1.0, 0.0])).item() == pytest.approx(torch.log(torch.tensor(2.0)).item())


# --- through a tiny model: pooling and the losses as sentence-transformers trains them ---------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny_embed"), seed=5)


def sentences(n, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS[:-5]) for _ in range(rng.randint(2, 9))) for _ in range(n)]


def columns_batch(tok, columns):
    """Our stacked batch [C*B, T] and sentence-transformers' one dict per column, from the same token ids."""
    enc = [tok.encode_batch(col, max_length=32) for col in columns]
    T = max(e["input_ids"].shape[1] for e in enc)

    def pad(x):
        return torch.nn.functional.pad(x, (0, T - x.shape[1]))

    ours = {k: torch.cat([pad(e[k]) for e in enc]) for k in ("input_ids", "attention_mask", "token_type_ids")}
    theirs = [{k: e[k] for k in ("input_ids", "attention_mask", "token_type_ids")} for e in enc]
    return ours, theirs


def st_model(st, path, pooling="mean"):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    word = Transformer(str(path), max_seq_length=32)
    return SentenceTransformer(modules=[word, Pooling(word.get_embedding_dimension(), pooling)],
                               device="cpu").eval()


def ours_model(path, **kw):
    return SentenceEmbedder(BertModel.from_pretrained(path), **kw).eval()


def compare_grads(ours: SentenceEmbedder, theirs, rtol=1e-5, atol=1e-5):
    hf = theirs[0].auto_model
    layers, theirs_layers = ours.encoder.encoder.layers, hf.encoder.layer
    pairs = [(ours.encoder.embeddings.word_embeddings.weight, hf.embeddings.word_embeddings.weight),
             (layers[0].attention.output.weight, theirs_layers[0].attention.output.dense.weight),
             (layers[1].attention_norm.weight, theirs_layers[1].attention.output.LayerNorm.weight)]
    for a, b in pairs:
        assert a.grad is not None and a.grad.abs().sum() > 0
        torch.testing.assert_close(a.grad, b.grad, rtol=rtol, atol=atol)


@pytest.mark.parametrize("loss,pooling,dims", [("mnrl", "mean", None), ("mnrl", "cls", None),
                                               ("mnrl", "mean", [32, 16, 8]), ("cached-mnrl", "mean", None),
                                               ("cosent", "mean", None)])
def test_losses_through_a_tiny_model_equal_sentence_transformers(st, tiny, loss, pooling, dims):
    from sentence_transformers.sentence_transformer import losses as L

    tok = Tokenizer.from_pretrained(tiny)
    texts = sentences(24, seed=1)
    if loss == "cosent":
        columns, labels = [texts[:8], texts[8:16]], torch.tensor([0.0, 1, 2, 2, 5, 3, 1, 4])
    else:  # anchors, positives and two hard-negative columns
        columns, labels = [texts[:6], texts[6:12], texts[12:18], texts[18:24]], None
    batch, features = columns_batch(tok, columns)
    weights = [1.0, 0.5, 0.25] if dims else None
    ours = ours_model(tiny, pooling=pooling, loss=loss, columns=len(columns), mini_batch_size=4, dims=dims,
                      weights=weights)
    theirs = st_model(st, tiny, pooling)
    if loss == "cosent":
        oracle = L.CoSENTLoss(theirs)
    elif loss == "cached-mnrl":
        oracle = L.CachedMultipleNegativesRankingLoss(theirs, mini_batch_size=4)
    else:
        oracle = L.MultipleNegativesRankingLoss(theirs)
    if dims:
        oracle = L.MatryoshkaLoss(theirs, oracle, matryoshka_dims=dims, matryoshka_weights=weights)
    out = ours(**batch, labels=labels).loss
    out.backward()
    expected = oracle(features, labels)
    expected.backward()
    torch.testing.assert_close(out, expected.detach(), rtol=1e-5, atol=1e-6)
    compare_grads(ours, theirs)


def test_cached_loss_equals_the_full_batch_with_any_chunk_size(tiny):
    tok = Tokenizer.from_pretrained(tiny)
    texts = sentences(30, seed=2)
    batch, _ = columns_batch(tok, [texts[:10], texts[10:20], texts[20:]])
    full = ours_model(tiny, loss="mnrl", columns=3)
    full_loss = full(**batch).loss
    full_loss.backward()
    for chunk in (1, 3, 10, 64):
        cached = ours_model(tiny, loss="cached-mnrl", columns=3, mini_batch_size=chunk)
        loss = cached(**batch).loss
        (loss * 0.5).backward()  # the loop scales the loss (accumulation, processes): the gradient follows
        torch.testing.assert_close(loss, full_loss, rtol=1e-5, atol=1e-6)
        for (name, p), q in zip(cached.named_parameters(), full.parameters()):
            if q.grad is None:
                assert p.grad is None, name  # the frozen pooler
                continue
            # float32 sums in another order: the tolerance is relative to the gradient's scale (a
            # token-type row sums every token's gradient; 1.7e-6 apart on a tensor of 10 on AMD Zen 4)
            atol = 1e-6 * max(1.0, q.grad.abs().max().item())
            torch.testing.assert_close(p.grad * 2, q.grad, rtol=1e-5, atol=atol, msg=name)


def test_cached_loss_replays_dropout(tiny):
    """In training mode the re-embedding draws the very masks of the first pass: the gradient is
    the full-batch gradient under those masks, and a second run with the same seed repeats it."""
    tok = Tokenizer.from_pretrained(tiny)
    texts = sentences(16, seed=3)
    batch, _ = columns_batch(tok, [texts[:8], texts[8:]])
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = ours_model(tiny, loss="cached-mnrl", columns=2, mini_batch_size=3).train()
        model(**batch).loss.backward()
        runs.append((model.encoder.embeddings.word_embeddings.weight.grad.clone(), torch.rand(1)))
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=0, atol=0)
    assert runs[0][1] == runs[1][1]  # and the random stream after it is where it would be
    # with dropout the masks matter: the gradient differs from the eval-mode one
    model = ours_model(tiny, loss="cached-mnrl", columns=2, mini_batch_size=3)
    model(**batch).loss.backward()
    assert not torch.allclose(model.encoder.embeddings.word_embeddings.weight.grad, runs[0][0])


def test_matryoshka_by_hand():
    a, p = leaves((5, 8), (5, 8), seed=9)
    wrapped = matryoshka(multiple_negatives_ranking, [8, 4, 2], [1.0, 0.5, 2.0])
    expected = sum(w * multiple_negatives_ranking(a[:, :d], p[None, :, :d]) for d, w in [(8, 1.0), (4, 0.5), (2, 2.0)])
    torch.testing.assert_close(wrapped(a, p[None]), expected, rtol=1e-6, atol=1e-6)


# --- batches with no duplicate ---------------------------------------------------------------


def test_no_duplicate_batches_keep_every_row_once_and_no_key_twice():
    rng = random.Random(0)
    # a claim with several relevant abstracts is several rows sharing their anchor (SciFact), and
    # captions of one image share a group: in both cases the rows must go to different batches
    rows = [frozenset({f"claim {i // 3}", f"abstract {i}"}) for i in range(60)]
    rows += [frozenset({f"caption {i}", ("group", i // 5)}) for i in range(40)]
    batches = no_duplicate_batches(rows, 8, rng)
    assert sorted(i for b in batches for i in b) == list(range(100))
    for b in batches:
        assert 1 <= len(b) <= 8
        keys = [k for i in b for k in rows[i]]
        assert len(keys) == len(set(keys))
    assert sum(len(b) == 8 for b in batches) >= 11  # almost all full: 100 rows -> 12.5 batches
    assert no_duplicate_batches(rows, 8, random.Random(0)) == batches  # a pure function of the seed
    assert no_duplicate_batches(rows, 8, random.Random(1)) != batches


def test_rows_that_clash_with_everything_end_up_alone():
    rows = [frozenset({"same"})] * 3 + [frozenset({f"t{i}"}) for i in range(5)]
    batches = no_duplicate_batches(rows, 4, random.Random(2))
    assert sorted(i for b in batches for i in b) == list(range(8))
    assert all(sum(i < 3 for i in b) <= 1 for b in batches)
    assert len(batches) >= 3
