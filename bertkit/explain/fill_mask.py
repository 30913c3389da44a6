"""Fill-mask: what a masked-LM head predicts for each [MASK], the pre-training task made visible.

BERT's first pre-training task (Devlin et al. 2019, section 3.1, "Masked LM") asks
the model to recover masked words from both sides' context; ELECTRA's generator
(Clark et al. 2020) is trained on the same task. Given a text with one or more
[MASK] tokens, this module runs the model's MLM head and returns, for each [MASK]
in order, the top-k vocabulary entries with their probabilities (softmax over the
whole vocabulary at that position, as transformers' `pipeline("fill-mask")`).

Which checkpoints have an MLM head:
    a BERT directory with `cls.predictions.*` (BertForMaskedLM, BertForPreTraining, the
        output of `bertkit pretrain run`)                  -> BertForMaskedLM
    an ELECTRA generator (ElectraForMaskedLM)               -> ElectraForMaskedLM
    an ELECTRA pre-training directory (generator in generator/) -> its generator
A directory without one (a bare encoder, a fine-tuned classifier, an ELECTRA
discriminator) is an error that says so. All [MASK]s are predicted in one pass,
each independently of the others' predictions (as the pipeline does). A text longer than the
model's positions is cut there (the pipeline with truncation=True cuts it alike) and a warning says
so; a [MASK] past the cut is refused.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from bertkit.errors import BertkitError, int_at_least
from bertkit.runtime.loading import load


@dataclass
class Prediction:
    """One candidate for one [MASK]."""

    token: str  # the vocabulary entry ("##s" for a word piece)
    id: int
    probability: float


def load_mlm(model_dir=None, *, device=None, dtype=None, fast=True):
    """(masked-LM model in eval mode, tokenizer) from a model directory (None: the default model,
    which has no MLM head: an error says so); an ELECTRA pre-training run gives its generator.
    Loaded by `bertkit.runtime.loading` (head "mlm"; `fast`: the fast path's settings)."""
    loaded = load(model_dir, head="mlm", device=device, dtype=dtype, fast=fast)
    return loaded.model, loaded.tokenizer


@torch.no_grad()
def fill_mask(model, text: str, top_k: int = 5, pair: str | None = None) -> list[list[Prediction]]:
    """For each [MASK] in `text` (and `pair`), the top_k predictions, most probable first.

    model: a model directory, None (the default model, which has no MLM head: an error),
    or a (masked-LM model, Tokenizer) pair as `load_mlm` returns.
    """
    net, tok = model if isinstance(model, tuple) else load_mlm(model)
    int_at_least(top_k, 1, "top_k", says="a positive integer")
    limit = min(net.config.max_position_embeddings, 512)
    enc = tok.encode(text, pair, max_length=limit)
    positions = [i for i, t in enumerate(enc.input_ids) if t == tok.mask_token_id]
    whole = tok.encode(text, pair, max_length=limit, truncation=False).input_ids
    written = whole.count(tok.mask_token_id)
    mask = tok.convert_ids_to_tokens([tok.mask_token_id])[0]  # the model's own [MASK], as the text writes it
    if positions and len(positions) < written:  # the answers would not say which masks they were for
        cut = written - len(positions)
        raise BertkitError(f"{cut} of the text's {written} {mask}s {'lies' if cut == 1 else 'lie'} past the first "
                           f"{limit} tokens, all the model reads: shorten the text")
    if not positions and any(mask in str(t) for t in (text, pair) if t is not None):  # cut off with the text's end
        raise BertkitError(f"every {mask} lies past the first {limit} tokens, all the model reads: shorten the text")
    if not positions:
        raise BertkitError(f"no {mask} in the text: write {mask} where a word should be predicted")
    if len(whole) > limit:  # the masks are inside, the words after the cut are not: their context was never read
        warnings.warn(f"the text has {len(whole)} tokens and the model reads {limit}: it predicted each {mask} from "
                      f"the first {limit} alone (a pair is cut longest side first)", stacklevel=2)
    device = next(net.parameters()).device
    ids = torch.tensor([enc.input_ids], device=device)
    types = torch.tensor([enc.token_type_ids], device=device)
    logits = net(ids, token_type_ids=types).logits[0, positions].float()  # [K masks, V]
    probs = logits.softmax(dim=-1)
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    tokens = tok.convert_ids_to_tokens
    return [
        [Prediction(token, int(i), float(p)) for token, i, p in zip(tokens(row_ids.tolist()), row_ids, row_p)]
        for row_ids, row_p in zip(top.indices, top.values)
    ]


def format_predictions(text: str, predictions: list[list[Prediction]], pair: str | None = None) -> str:
    """The text (and its pair: the masks are numbered through both), then one block per [MASK]: rank,
    probability, token."""
    lines = [text] + ([f"pair: {pair}"] if pair is not None else [])
    for k, candidates in enumerate(predictions, start=1):
        lines.append(f"[MASK] #{k}:" if len(predictions) > 1 else "[MASK]:")  # a heading: the mask's place
        lines += [f"  {r}. {c.probability:7.4f}  {c.token}" for r, c in enumerate(candidates, start=1)]
    return "\n".join(lines)
