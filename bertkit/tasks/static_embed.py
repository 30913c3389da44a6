"""`bertkit finetune embed --static`: contrastive training of a static embedding table.

sentence-transformers' static recipe (Aarsen 2025, "Train 400x faster Static Embedding
Models"): the model is a table [V, D] whose rows are averaged (`bertkit.model.static`), trained
with the same losses as a transformer (`bertkit.embeddings.losses`: multiple-negatives
ranking, Matryoshka) through the same loop; only the start and the tokens differ:

- the start: the table of a static folder (`bertkit distill static`: training then refines
  Model2Vec's distilled vectors), or a new one over MODEL's vocabulary, N(0, 1) as
  `torch.nn.EmbeddingBag` initialises it (the recipe's "from scratch");
- the tokens: the ids without [CLS]/[SEP] (`Tokenizer.ids_batch`), cut at max_length, padded
  to a batch as for an encoder; `SentenceEmbedder.embed` hands them to
  `StaticEmbedding.embed_padded`, the run-time mean.

The recipe (`bertkit.tasks.config.STATIC_RECIPE`, the command's defaults under --static): MNRL at
batch 2048 (in-batch negatives are the signal, and a static model makes a big batch cheap: no
GradCache needed), a large rate, no weight decay, one epoch. A row moves only when its token is
in a batch; Adam's step is about the rate whatever the gradient, so the rate is relative to the
table's scale: 2e-1 for sentence-transformers' N(0, 1) start, 5e-2 for a distilled table (rows of
norm ~6; 0.1 and 0.2 measured worse: docs/distill.md). The text's vector is the mean of its rows,
normalised only in the loss (cosine) and at run time, so a row's norm is how much its token counts
(what IDF or SIF weights do in a lexical or distilled model) and training learns it. Saved as a
sentence-transformers StaticEmbedding folder, as `bertkit distill static` writes it, cutting texts
where its start did (a new table: at 512 tokens, model2vec's default and `distill static`'s) or at
--max-length, which is also where its texts are cut in training and on the dev set.
"""

from __future__ import annotations

import torch

from bertkit.model.static import DEFAULT_MAX_LENGTH, StaticEmbedding, is_static, read_static, save_static, saved_about
from bertkit.text.tokenizer_json import read_tokenizer_json, truncation_length, write_tokenizer_json


FITTED_RATE = 0.02  # above it, MNRL moves a fitted table away from its fit (docs/distill.md: 0.05 lost, 0.01-0.02 gained)


def static_start(cfg, load_tokenizer, log=print) -> tuple:
    """(the StaticEmbedding to train, its Tokenizer) (see the module docstring); `load_tokenizer(model)`
    reads a transformer folder's vocabulary (the task's own reader)."""
    if cfg.model is not None and is_static(cfg.model):
        static = read_static(cfg.model)
        tok = read_tokenizer_json(static.tokenizer_dir)
        log(f"static table: {static.model.config.vocab_size} x {static.model.config.hidden_size} from {cfg.model}")
        rate = cfg.training.optim.learning_rate
        if saved_about(cfg.model).get("fit") and rate > FITTED_RATE:
            log(f"warning: {cfg.model} was fitted to its model's sentence vectors (distill static --fit); at "
                f"--learning-rate {rate:g} training undoes part of that fit: 0.01 keeps it (docs/distill.md)")
        model = static.model
        if static.layout != "model2vec":  # where sentence-transformers cuts (model2vec's: read_static)
            model.config.max_length = truncation_length(static.tokenizer_dir)
    else:
        tok = load_tokenizer(cfg.model)
        weight = torch.randn(len(tok), cfg.static_dim, generator=torch.Generator().manual_seed(cfg.training.seed))
        log(f"static table: {len(tok)} x {cfg.static_dim}, random (from scratch), vocabulary of "
            f"{cfg.model or 'the default model'}")
        model = StaticEmbedding(weight, normalize=True)  # a new sentence model is saved unit-length (as _settle's)
        model.config.max_length = DEFAULT_MAX_LENGTH
    if cfg.normalize is not None:  # else the start's, as a transformer's layout is kept (embedding._settle)
        model.config.normalize = bool(cfg.normalize)
    cfg.normalize = model.config.normalize
    # one cut for the training texts, the dev figures and the saved model: --max-length when given, else the
    # start's (the run used finetune embed's 256 and saved the start's 512, dropping a --max-length)
    if cfg.max_length:
        model.config.max_length = cfg.max_length
    cfg.max_length = model.config.max_length
    model.train()
    return model, tok


def static_rows(tok, examples, max_length: int) -> list[list[list[int]]]:
    """The ids of every text (no special tokens, at most max_length), each distinct text once: ids[row][column]."""
    rows = examples.rows
    distinct = list(dict.fromkeys(t for row in rows for t in row))
    where = dict(zip(distinct, tok.ids_lists(distinct, max_length)))
    return [[where[t] for t in row] for row in rows]


def save_static_model(model: StaticEmbedding, tok, out) -> None:
    write_tokenizer_json(tok, save_static(model, out), model.config.max_length)
