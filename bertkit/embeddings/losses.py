"""Losses that train sentence embeddings, each a small function of the embeddings.

Each loss is the one sentence-transformers implements under the same name
(`sentence_transformers/sentence_transformer/losses/`), and the tests hold ours
to theirs (loss and gradients within 1e-5) on identical batches. Legend:

    B  examples (anchors) in this process's batch     D  embedding size
    C  candidate columns: the positive, then any hard negatives
    N  rows of each candidate column: B alone, W x B when gathered over W processes

Embeddings come in float32 (autocast may have made them bf16): the scores are
formed in float32, where a scale of 20 on bf16 cosines would cost the loss its
last digits.

- `multiple_negatives_ranking`  pairs / triplets / n-tuples: in-batch negatives
- `cosent`                      scored pairs
- `matryoshka`                  a wrapper: the same loss on several leading dimensions
- `cached`                      GradCache: any of them over a big batch in bounded memory
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from bertkit.errors import BertkitError

SCALE = 20.0  # sentence-transformers' default for both losses: temperature 0.05


def cosine_scores(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of every row of a [Q, D] with every row of b [K, D]: [Q, K]."""
    return F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T


def multiple_negatives_ranking(anchors: torch.Tensor, candidates: torch.Tensor, scale: float = SCALE,
                               first: int = 0) -> torch.Tensor:
    """Multiple-negatives ranking loss (InfoNCE with in-batch negatives), a scalar.

    Henderson et al. 2017, "Efficient Natural Language Response Suggestion for
    Smart Reply", section 4.4; van den Oord et al. 2018 (InfoNCE);
    sentence-transformers' `MultipleNegativesRankingLoss`. For anchor i the
    right answer is its positive among every candidate of the batch, the other
    anchors' positives and all hard negatives included:

        s_ij = scale * cos(a_i, c_j)             over all C x N candidates j
        loss = mean_i [ -s_i,pos(i) + log sum_j exp(s_ij) ]

    anchors [B, D]; candidates [C, N, D], column 0 the positives, columns 1.. the
    hard negatives; anchor i's positive is candidates[0, first + i] (`first` is
    this process's offset when the candidates were gathered from all processes).
    Use it for (query, relevant passage) or paraphrase pairs: every other pair
    in the batch is a free negative, so a bigger batch is a harder task. A text
    that appears twice in a batch is a false negative: build batches without
    duplicates (`bertkit.tasks.embedding.no_duplicate_batches`).
    """
    B, (C, N, D) = anchors.shape[0], candidates.shape
    if not first + B <= N:
        raise BertkitError(f"anchors {first}..{first + B} have no positives among {N} candidate rows")
    scores = cosine_scores(anchors, candidates.reshape(C * N, D)) * scale  # [B, C*N], positives in 0..N-1
    return F.cross_entropy(scores, torch.arange(first, first + B, device=scores.device))


def cosent(first: torch.Tensor, second: torch.Tensor, labels: torch.Tensor, scale: float = SCALE) -> torch.Tensor:
    """CoSENT loss for scored pairs, a scalar.

    Su 2022, "CoSENT: a more efficient sentence vector scheme than
    Sentence-BERT" (kexue.fm/archives/8847); sentence-transformers'
    `CoSENTLoss`. Only the order of the scores matters: every two pairs whose
    gold scores differ should have cosines in the same order,

        loss = log(1 + sum over (i, j) with label_i > label_j of exp(scale (cos_j - cos_i)))

    first, second [B, D], labels [B] (any scale: only their order counts). Use it
    for graded similarity (STS-style 0-5 scores, or 0/1 labels); it trains
    faster and ranks better than a regression on the cosine (CosineSimilarityLoss).
    """
    s = F.cosine_similarity(first.float(), second.float(), dim=-1) * scale  # [B]
    higher = labels[:, None] > labels[None, :]  # [B, B]: pair i outranks pair j
    gaps = (s[None, :] - s[:, None])[higher]  # s_j - s_i where i should be above j
    return torch.logsumexp(torch.cat([gaps.new_zeros(1), gaps]), dim=0)  # the 0 is the "1 +"


def matryoshka(loss: Callable[..., torch.Tensor], dims: Sequence[int], weights: Sequence[float] | None = None):
    """The same loss on the first d dimensions of every embedding, for each d in `dims`, weighted and summed.

    Kusupati et al. 2022, "Matryoshka Representation Learning"; sentence-transformers'
    `MatryoshkaLoss`. `loss(*embeddings, *rest)` is any loss above; the wrapper
    returns one with the same arguments that computes

        sum_d  weight_d * loss(normalize(e[..., :d]) for each embedding e, *rest)

    Use it when the vectors will be stored truncated (64 or 128 of 384
    dimensions): the leading dimensions learn to carry the meaning alone.
    Weights default to 1 each.
    """
    weights = [1.0] * len(dims) if weights is None else list(weights)
    if not dims or len(weights) != len(dims) or any(d < 1 for d in dims):
        raise BertkitError(f"Matryoshka dimensions {list(dims)} need positive sizes and one weight each ({weights})")

    def wrapped(*args, **kwargs):
        embeddings = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dim() >= 2]
        rest = args[len(embeddings):]
        total = 0.0
        for d, w in zip(dims, weights):
            if d > embeddings[0].shape[-1]:
                raise BertkitError(f"Matryoshka dimension {d} exceeds the embedding size {embeddings[0].shape[-1]}")
            total = total + w * loss(*(F.normalize(e[..., :d].float(), dim=-1) for e in embeddings), *rest, **kwargs)
        return total

    return wrapped


# --- GradCache --------------------------------------------------------------------


def _rng_state(device: torch.device):
    return (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def cached(embed: Callable[[object], torch.Tensor], chunks: Sequence, loss_of: Callable[[torch.Tensor], torch.Tensor],
           parameters: Sequence[torch.nn.Parameter], device: torch.device, weight: float = 1.0) -> torch.Tensor:
    """A loss over all `chunks` whose backward gives `parameters` the whole batch's gradients,
    with the activations of one chunk alive at a time (GradCache).

    Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory
    Limited Setup" (github.com/luyug/GradCache); sentence-transformers'
    `CachedMultipleNegativesRankingLoss`. The contrastive loss couples every
    example of the batch, but its gradient reaches the encoder only through the
    embeddings, so

      1. embed each chunk without a graph: E [M, D], the batch's embeddings;
      2. loss = loss_of(E) and g = dloss/dE [M, D] (a graph over E only);
      3. re-embed each chunk with a graph, replaying the random state it started
         from (the same dropout masks), and backpropagate its rows of g:
         d(E_chunk . g_chunk)/dtheta summed over chunks = dloss/dtheta.

    Peak memory is one chunk's activations instead of the batch's, for one extra
    forward pass. Deviation from sentence-transformers, which re-embeds inside
    a hook on the returned loss: step 3 runs here, in the forward (so under the
    caller's autocast, with the parameters' gradients kept in a buffer), and the
    result is `loss + sum(p . G_p) - sum(p . G_p)` with the second sum
    detached: its value is the loss, its gradient G_p, one normal backward
    that DDP, accumulation and loss scaling treat like any other.

    embed(chunk) -> [m, D]; `loss_of` may gather across processes (its
    backward reaches the other processes, step 2 runs on all of them). Then
    `weight` is this process's rows over the mean process's (B_r W / N): the
    training loop weighs each process's loss by its rows, and since step 2
    hands every process the sum of all the processes' gradients before that
    weight is applied, each loss is weighted here, in step 2, and the weight
    taken out of the result (1 when the processes hold equal batches).
    """
    starts, parts = [], []
    with torch.no_grad():
        for chunk in chunks:
            starts.append(_rng_state(device))
            parts.append(embed(chunk))
    after = _rng_state(device)
    embeddings = torch.cat(parts).detach().requires_grad_()
    with torch.enable_grad():
        loss = loss_of(embeddings)
        (grad,) = torch.autograd.grad(loss * weight, embeddings)
    params = [p for p in parameters if p.requires_grad]
    sums: list[torch.Tensor | None] = [None] * len(params)
    offset = 0
    for chunk, start, part in zip(chunks, starts, parts):
        _set_rng_state(start, device)
        with torch.enable_grad():
            again = embed(chunk)
            grads = torch.autograd.grad(again, params, grad_outputs=grad[offset:offset + len(part)].to(again.dtype),
                                        allow_unused=True)
        offset += len(part)
        for k, g in enumerate(grads):
            if g is not None:
                sums[k] = g if sums[k] is None else sums[k].add_(g)
    _set_rng_state(after, device)  # what comes next draws as if the chunks ran once
    surrogate = sum(((p * g).sum() for p, g in zip(params, sums) if g is not None), loss.new_zeros(())) / weight
    return loss.detach() + (surrogate - surrogate.detach())
