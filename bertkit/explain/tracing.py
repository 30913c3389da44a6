"""Look inside one forward pass: the named intermediate tensors of one text, one layer.

The classic explanations of BERT (Devlin et al. 2019, section 3; Vaswani et al.
2017, section 3.2; Alammar's "Illustrated Transformer") name every step of an
encoder layer. `trace()` runs the real model once on one text and hands back the
tensor each step produced, under the step's name, so a reader can recompute any
step by hand and see it equal the model's own (docs/guide.md does this).

No second copy of the model code: the tensors come from forward hooks on the
real submodules of `bertkit.model.modeling` (`attention.qkv`, `attention.output`,
`attention_norm`, `intermediate`, `output`, `output_norm`, `embeddings.layer_norm`),
from the model's own outputs (`hidden_states`, and the attention weights of
`output_attentions=True`), and from the embedding tables read by id. Two are
derived here from traced tensors by their definition, because the fused attention
kernel never materialises them: the raw scores Q K^T and the scaled scores
Q K^T / sqrt(D); tests/test_trace.py checks that their softmax is the model's
own weights.

Legend: T tokens ([CLS] ... [SEP]), H hidden size, N heads, D = H / N head size,
I intermediate size, L layers. Every tensor is float32 on the CPU, batch dimension
dropped:

    embeddings      token_embeddings, position_embeddings, segment_embeddings,
                    embedding_sum (their sum), embedding_output (after LayerNorm)  [T, H]
    the layer       layer_input                                                   [T, H]
                    query, key, value (per head)                                  [N, T, D]
                    scores = Q K^T, scaled_scores = scores / sqrt(D)              [N, T, T]
                    weights = softmax(scaled_scores), rows sum to 1               [N, T, T]
                    head_context = weights @ value                                [N, T, D]
                    context (heads concatenated)                                  [T, H]
                    attention_output (the output projection of context)           [T, H]
                    attention_residual = layer_input + attention_output           [T, H]
                    attention_norm = LayerNorm(attention_residual)                [T, H]
                    intermediate (W1 x + b1, before the activation)               [T, I]
                    activated = gelu(intermediate)                                [T, I]
                    ffn_output (W2 activated + b2)                                [T, H]
                    ffn_residual = attention_norm + ffn_output                    [T, H]
                    layer_output = LayerNorm(ffn_residual)                        [T, H]
    the stack       hidden_states (embedding output, then every layer's output)   [L+1, T, H]

`head` picks the head that the shortcuts `q`, `k`, `v` ([T, D]) and
`head_scores`, `head_weights` ([T, T]) read; the per-head fields keep all N.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from bertkit.errors import BertkitError
from bertkit.runtime.loading import Loaded, folder_stamp, load, resolve  # the model folder, as the loader reads it

# the submodules of one encoder layer whose inputs and outputs are traced
LAYER_PARTS = ("attention.qkv", "attention.output", "attention_norm", "intermediate", "output", "output_norm")


@dataclass
class Trace:
    """The tensors of one forward pass (see the module docstring for names and shapes)."""

    text: str
    pair: str | None
    tokens: list
    token_ids: list
    token_type_ids: list
    layer: int
    head: int
    num_heads: int
    head_size: int
    token_embeddings: torch.Tensor
    position_embeddings: torch.Tensor
    segment_embeddings: torch.Tensor
    embedding_sum: torch.Tensor
    embedding_output: torch.Tensor
    layer_input: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    scores: torch.Tensor
    scaled_scores: torch.Tensor
    weights: torch.Tensor
    head_context: torch.Tensor
    context: torch.Tensor
    attention_output: torch.Tensor
    attention_residual: torch.Tensor
    attention_norm: torch.Tensor
    intermediate: torch.Tensor
    activated: torch.Tensor
    ffn_output: torch.Tensor
    ffn_residual: torch.Tensor
    layer_output: torch.Tensor
    hidden_states: torch.Tensor

    @property
    def q(self) -> torch.Tensor:
        return self.query[self.head]  # [T, D]

    @property
    def k(self) -> torch.Tensor:
        return self.key[self.head]  # [T, D]

    @property
    def v(self) -> torch.Tensor:
        return self.value[self.head]  # [T, D]

    @property
    def head_scores(self) -> torch.Tensor:
        return self.scaled_scores[self.head]  # [T, T]

    @property
    def head_weights(self) -> torch.Tensor:
        return self.weights[self.head]  # [T, T]

    def shapes(self) -> dict:
        """{name: shape} of every traced tensor, in the order of the forward pass."""
        return {name: tuple(getattr(self, name).shape) for name in TENSORS}


# the tensor fields of Trace in forward order (Trace.shapes, the guide's table)
TENSORS = (
    "token_embeddings", "position_embeddings", "segment_embeddings", "embedding_sum", "embedding_output",
    "layer_input", "query", "key", "value", "scores", "scaled_scores", "weights", "head_context", "context",
    "attention_output", "attention_residual", "attention_norm", "intermediate", "activated", "ffn_output",
    "ffn_residual", "layer_output", "hidden_states",
)


@functools.lru_cache(maxsize=2)
def _load(directory: str, stamp: tuple):
    # cached: a reader traces many layers and heads of the same model one call at a time (keyed by the
    # folder's files too, `stamp`: a folder written again is loaded again); the plain
    # layers (fast=False): a hook on an accelerated dense layer would not see W x + b alone
    loaded = load(directory, head="encoder", device="cpu", dtype="float32", fast=False)
    loaded.need_layers("trace")
    return loaded.model, loaded.tokenizer


def load_plain_encoder(model=None):
    """The encoder to trace, with its plain layers on the CPU in float32: (BertModel, Tokenizer): None = the
    default model, a directory, a `bertkit.load()` result, or a (model, tokenizer) pair.
    A task model (BertForSequenceClassification, ...) is traced through its encoder, `.bert`."""
    if isinstance(model, Loaded):  # load()'s layers are fused for speed (their hooks would not see W x + b): the
        # folder it was read from, in plain layers (one held in memory, no folder: as a pair, checked below)
        model = (model.model, model.tokenizer) if model.directory is None else model.directory
    if model is None or isinstance(model, (str, Path)):
        directory = str(resolve(model).resolve())
        return _load(directory, folder_stamp(directory))
    if isinstance(model, tuple) and len(model) == 2:
        net, tok = model
        net = getattr(net, "bert", net)
        if not hasattr(net, "embeddings") or not hasattr(net, "encoder"):
            raise BertkitError(f"trace needs a BERT encoder (BertModel or a model with .bert), got {type(net).__name__}")
        return net, tok
    raise BertkitError(
        f"model must be None (the default model), a model directory, a bertkit.load() result or a (model, tokenizer) "
        f"pair, got {type(model).__name__}"
    )


def _check(text, pair, layer, head, config) -> None:
    for name, value in (("text", text), ("pair", pair)):
        if value is not None and not isinstance(value, str):
            raise BertkitError(f"trace's {name} must be a str (one text, one pass), got {type(value).__name__}")
    if text is None or not text.strip():
        raise BertkitError("trace needs a non-empty text: give it a sentence")
    if pair is not None and not pair.strip():
        raise BertkitError("the second segment (pair) is empty: drop it or give it some text")
    L, N = config.num_hidden_layers, config.num_attention_heads
    if not isinstance(layer, int) or not -L <= layer < L:
        raise BertkitError(f"layer {layer!r} is out of range: this model has {L} layers, numbered 0..{L - 1} (or -1 for the last)")
    if not isinstance(head, int) or not 0 <= head < N:
        raise BertkitError(f"head {head!r} is out of range: each layer has {N} heads, numbered 0..{N - 1}")


def _encode(tok, text: str, pair: str | None, config):
    """The one encoding of text (and pair), refused when it does not fit the model's positions (no windows)."""
    enc = tok.encode(text, pair, max_length=config.max_position_embeddings, truncation=False)
    if len(enc.input_ids) > config.max_position_embeddings:
        raise BertkitError(
            f"the text has {len(enc.input_ids)} tokens but the model takes at most {config.max_position_embeddings}: "
            "shorten it"
        )
    return enc


def _traced_parts(net, layer: int) -> dict:
    """{name: submodule} whose input and output trace keeps: the embeddings' LayerNorm and LAYER_PARTS of `layer`."""
    block = net.encoder.layers[layer]
    parts = {"embeddings.layer_norm": net.embeddings.layer_norm}
    parts.update({name: block.get_submodule(name) for name in LAYER_PARTS})
    fused = [name for name, module in parts.items() if getattr(module, "post_ops", False)]
    if fused:
        # such a module applies the GELU or the residual add inside its kernel: its hook would not see W x + b
        raise BertkitError(
            f"{', '.join(fused)} of layer {layer} fuse what follows them (an accelerated or int8 model): "
            "trace the plain model, e.g. model=None or BertModel.from_pretrained(directory)"
        )
    return parts


def _run_hooked(net, layer: int, ids, types):
    """One eval-mode forward with hooks on the traced parts: ({part: (input, output)}, the model's output)."""
    parts = _traced_parts(net, layer)
    seen: dict[str, tuple] = {}  # part -> (input, output) of its last call

    def keep(name):
        def hook(module, args, output):
            seen[name] = (args[0].detach(), output.detach())
        return hook

    handles = [module.register_forward_hook(keep(name)) for name, module in parts.items()]
    was_training = net.training
    net.eval()
    try:
        out = net(ids, token_type_ids=types, output_hidden_states=True, output_attentions=True)
    finally:
        net.train(was_training)
        for h in handles:
            h.remove()
    missing = [name for name in parts if name not in seen]
    if missing:
        raise BertkitError(
            f"layer {layer} ran without calling {', '.join(missing)}: trace reads those submodules, "
            "so trace the plain model (not a compiled or fused copy)"
        )
    return seen, out


def _plain(t: torch.Tensor) -> torch.Tensor:  # [1, ...] -> [...] float32 on the CPU
    return t[0].float().cpu()


@torch.no_grad()
def trace(text: str, layer: int = 0, head: int = 0, *, pair: str | None = None, model=None) -> Trace:
    """Run `model` once on `text` (and `pair`) and return the named tensors of `layer`.

    layer: 0..L-1 (negative counts from the end); head: 0..N-1, the head the
    shortcuts q, k, v, head_scores and head_weights read. model: None (the
    default model, all-MiniLM-L6-v2, float32), a model directory, a `bertkit.load()`
    result (traced from its folder, in plain layers) or a (model, tokenizer) pair; it
    runs in eval mode (dropout off) and is left as it was.
    The text must fit in the model's positions: one pass, no windows.
    """
    net, tok = load_plain_encoder(model)
    config = net.config
    _check(text, pair, layer, head, config)
    layer = layer % config.num_hidden_layers
    enc = _encode(tok, text, pair, config)
    device = next(net.parameters()).device
    ids = torch.tensor([enc.input_ids], device=device)  # [1, T]
    types = torch.tensor([enc.token_type_ids], device=device)
    seen, out = _run_hooked(net, layer, ids, types)
    T, N, D = len(enc.input_ids), config.num_attention_heads, config.head_size
    emb = net.embeddings
    qkv = _plain(seen["attention.qkv"][1]).view(T, 3, N, D).permute(1, 2, 0, 3)  # [T, 3H] -> [3, N, T, D]
    query, key, value = qkv.unbind(0)  # 3 x [N, T, D]
    scores = query @ key.transpose(-1, -2)  # [N, T, T]: query x key
    context = _plain(seen["attention.output"][0])  # [T, H]: the heads' outputs side by side
    return Trace(
        text=text, pair=pair, tokens=list(enc.tokens), token_ids=list(enc.input_ids),
        token_type_ids=list(enc.token_type_ids), layer=layer, head=head, num_heads=N, head_size=D,
        token_embeddings=emb.word_embeddings.weight[ids[0]].float().cpu(),
        position_embeddings=emb.position_embeddings.weight[:T].float().cpu(),
        segment_embeddings=emb.token_type_embeddings.weight[types[0]].float().cpu(),
        embedding_sum=_plain(seen["embeddings.layer_norm"][0]),
        embedding_output=_plain(seen["embeddings.layer_norm"][1]),
        layer_input=_plain(out.hidden_states[layer]),
        query=query, key=key, value=value,
        scores=scores,
        scaled_scores=scores / math.sqrt(D),
        weights=_plain(out.attentions[layer]),
        head_context=context.view(T, N, D).transpose(0, 1),  # [T, H] -> [N, T, D]
        context=context,
        attention_output=_plain(seen["attention.output"][1]),
        attention_residual=_plain(seen["attention_norm"][0]),
        attention_norm=_plain(seen["attention_norm"][1]),
        intermediate=_plain(seen["intermediate"][1]),
        activated=_plain(seen["output"][0]),
        ffn_output=_plain(seen["output"][1]),
        ffn_residual=_plain(seen["output_norm"][0]),
        layer_output=_plain(seen["output_norm"][1]),
        hidden_states=torch.stack([_plain(h) for h in out.hidden_states]),
    )


__all__ = ["Trace", "TENSORS", "trace", "load"]
