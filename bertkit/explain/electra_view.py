"""`electra show`: ELECTRA's two networks at work on one text, token by token.

The pre-training step of bertkit.model.electra made visible (Clark et al. 2020, figure 1):
some tokens are masked, the generator fills each with a word sampled from its
softmax, and the discriminator gives every token of the result its probability of
having been replaced. Which tokens are masked:
    the text's own [MASK]s, when it has any (the original word is then unknown, so
        every sample other than [MASK] itself counts as a replacement);
    otherwise `mask_prob` of the word-piece tokens, at least one (the special tokens never,
        [UNK] included: the rule of pre-training's masking, bertkit.pretraining.masking),
        drawn with `seed`; mask_prob 0 masks nothing and shows the discriminator's
        view of the text as written (write your own substitution and see if it is caught).

MODEL_DIR is an ELECTRA pre-training directory: the discriminator at its top, the
generator in generator/ (bertkit.model.electra_pretraining.ElectraPretrainingModel.save_pretrained).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertkit.errors import BertkitError, probability
from bertkit.model.config import IGNORE_INDEX
from bertkit.runtime.loading import load


@dataclass
class TokenRow:
    """One token of the text as the discriminator saw it."""

    token: str  # the token in the input text
    masked: bool  # chosen for the generator to fill
    shown: str  # what the discriminator read there (the generator's sample where masked)
    replaced: bool  # shown differs from token: the discriminator's right answer is "replaced"
    p_replaced: float  # the discriminator's probability of "replaced"


def choose_masked(ids: list[int], special: list[int], mask_id: int, mask_prob: float, seed: int) -> list[int]:
    """Positions to mask: the text's own [MASK]s, else mask_prob of the non-special tokens (>= 1)."""
    own = [i for i, t in enumerate(ids) if t == mask_id]
    if own or mask_prob == 0:
        return own
    probability(mask_prob, "mask_prob")  # 0 returned above
    candidates = [i for i, s in enumerate(special) if not s]
    if not candidates:
        raise BertkitError("the text has no token to mask: give it some words")
    k = max(1, round(mask_prob * len(candidates)))
    order = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed))
    return sorted(candidates[int(j)] for j in order[:k])


@torch.no_grad()
def show(model, text: str, mask_prob: float = 0.15, seed: int = 0, fast=True) -> list[TokenRow]:
    """One row per token. model: an ELECTRA pre-training directory or a (model, tokenizer) pair; fast: the
    fast path's settings for a directory (`bertkit.runtime.loading.load`)."""
    if not isinstance(model, tuple):  # generator + discriminator, and the tokenizer
        loaded = load(model, head="electra", fast=fast)
        model = loaded.model, loaded.tokenizer
    net, tok = model
    net.eval()
    limit = min(net.config.max_position_embeddings, 512)
    enc = tok.encode(text, max_length=limit, truncation=False)  # no cut: a row for every token written
    if len(enc.input_ids) > limit:
        raise BertkitError(f"the text has {len(enc.input_ids)} tokens but the model reads at most {limit}: "
                           "electra show judges one pass, so shorten the text")
    ids = torch.tensor([enc.input_ids])  # [1, T]
    types = torch.tensor([enc.token_type_ids])
    never = set(tok.all_special_ids)  # the text.vocab.SPECIAL_TOKENS, as pre-training's MaskVocab
    masked = choose_masked(enc.input_ids, [t in never for t in enc.input_ids], tok.mask_token_id, mask_prob, seed)
    if masked:
        labels = torch.full_like(ids, IGNORE_INDEX)
        labels[0, masked] = ids[0, masked]  # the original (the [MASK] itself where the text wrote one)
        inputs = ids.clone()
        inputs[0, masked] = tok.mask_token_id
        out = net(inputs, labels, token_type_ids=types, rng=torch.Generator().manual_seed(seed))
        shown, logits = out.corrupted_ids, out.disc_logits
    else:
        shown, logits = ids, net.discriminator(ids, token_type_ids=types).logits
    p = torch.sigmoid(logits.float())[0].tolist()
    written, read = tok.convert_ids_to_tokens(enc.input_ids), tok.convert_ids_to_tokens(shown[0].tolist())
    chosen = set(masked)
    return [TokenRow(w, i in chosen, r, w != r, p[i]) for i, (w, r) in enumerate(zip(written, read))]


def format_rows(rows: list[TokenRow]) -> str:
    """A table: token, what the discriminator read, p(replaced), and a mark where it was replaced."""
    width = max(len("token"), *(len(r.token) for r in rows))
    shown = max(len("discriminator read"), *(len(r.shown) for r in rows))
    lines = [f"{'token':<{width}}  {'discriminator read':<{shown}}  p(replaced)"]
    for r in rows:
        note = "  <- replaced" if r.replaced else ("  (masked, sampled the original)" if r.masked else "")
        lines.append(f"{r.token:<{width}}  {r.shown:<{shown}}  {r.p_replaced:11.3f}{note}")
    return "\n".join(lines)


__all__ = ["TokenRow", "show", "format_rows", "load", "choose_masked"]
