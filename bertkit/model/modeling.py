"""The BERT encoder: embeddings, self-attention, encoder layers, pooler, BertModel.

Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding", section 3, on top of the Transformer encoder of Vaswani
et al. 2017 (section 3.2 for attention). The reference implementations are
google-research/bert `modeling.py` and Hugging Face `modeling_bert.py`; parameter
names differ from theirs (see `bertkit.model.checkpoint` for the one table that maps
them), the arithmetic is the same, and the tests hold us to 1e-5 of transformers.

Shape legend used in every comment below:
    B  batch size              T  sequence length (tokens)
    H  hidden size             N  attention heads
    D  head size = H / N       I  intermediate (feed-forward) size, 4H in BERT
    L  layers                  V  vocabulary size

    input_ids [B, T] (int) -> embeddings [B, T, H] -> L x layer [B, T, H]
        -> last_hidden_state [B, T, H], pooler_output [B, H] (tanh dense on [CLS])

Attention has three paths with the same result: the explicit one computes the
[B, N, T, T] weights (to return or draw them), the fused one calls
`torch.nn.functional.scaled_dot_product_attention` (FlashAttention / memory
efficient kernels where available; on a GPU, `CUDA_ATTENTION` names which) and never materialises them, and in training
on the CPU, where no fused kernel drops attention weights, `bertkit.model.chunked_attention`
goes through a few sequences at a time and recomputes them in backward. The fused
path is the default; `output_attentions=True` or `attn_implementation="eager"`
takes the explicit one. Dropout draws its masks with `bertkit.model.dropout` (torch's
arithmetic, a cheaper draw).

Every layer here is a plain PyTorch layer (`nn.Linear`, `nn.LayerNorm`,
`nn.Embedding`), and the encoder layer's forward is written once, below. Other
ways of computing its dense ops (`bertkit.runtime.fast.accelerate`: other matmul
kernels, packed weights; `bertkit.quantize`: int8 products) replace the dense
modules under the layer, never the layer; `dense()` is where a replacement
that can apply the GELU or the residual add inside its own kernel is handed
them. Every parameter and state-dict name stays.

Deviations from the reference code, all numerically neutral: the query, key and
value projections are one [H, 3H] matrix (one matmul instead of three; the
checkpoint table splits it), and the padding mask is built once per forward in
the dtype the attention runs in, with that dtype's most negative finite value
rather than -inf, so a fully padded row gives a uniform softmax, never NaN.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from bertkit.model import checkpoint as hf_checkpoint
from bertkit.model import chunked_attention
from bertkit.model.config import BertConfig
from bertkit.model.dropout import Dropout, dropout
from bertkit.model.sentence_layout import SENTENCE_POOLINGS
from bertkit.errors import BertkitError


@dataclass
class BertOutput:
    """What BertModel returns. Tuples hold one tensor per layer (embeddings first)."""

    last_hidden_state: torch.Tensor  # [B, T, H]
    pooler_output: torch.Tensor | None  # [B, H]; None when the model has no pooler
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L+1 x [B, T, H], on request
    attentions: tuple[torch.Tensor, ...] | None = None  # L x [B, N, T, T], on request


def activation(name: str):
    """The feed-forward non-linearity named in the config. BERT's "gelu" is the exact erf form."""
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh"):  # the tanh approximation (GPT-2, some BERT ports)
        return lambda x: F.gelu(x, approximate="tanh")
    return {"relu": F.relu, "silu": F.silu, "swish": F.silu, "tanh": torch.tanh}[name]


# --- embeddings ---------------------------------------------------------------


class BertEmbeddings(nn.Module):
    """Token + learned absolute position + segment embeddings, summed, LayerNorm, dropout (paper fig. 2).
    Their width is the hidden size H unless `width` says otherwise (ELECTRA's embedding_size E)."""

    def __init__(self, config: BertConfig, width: int | None = None):
        super().__init__()
        H = config.hidden_size if width is None else width
        # padding_idx: the [PAD] row gets no gradient (as transformers; QA's loss reaches padded positions)
        self.word_embeddings = nn.Embedding(config.vocab_size, H, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, H)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, H)
        self.layer_norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        T = input_ids.shape[1]
        x = self.word_embeddings(input_ids)  # [B, T, H]
        if token_type_ids is None:  # every token is segment A: one row, broadcast
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings.weight[:T]  # [T, H] broadcast over B: positions 0..T-1
        return self.dropout(self.layer_norm(x))


# --- a dense op and what follows it ---------------------------------------------


def dense(linear: nn.Module, x: torch.Tensor, act=None, dropout: nn.Dropout | None = None,
          residual: torch.Tensor | None = None) -> torch.Tensor:
    """residual + dropout(act(linear(x))), the parts that are given: a dense op and what follows it.

    A plain nn.Linear computes W x + b alone and the rest follows here, one operation
    each (a forward hook on it sees W x + b: bertkit.explain.tracing reads it). A dense module
    that can apply the activation or the residual add inside its own kernel says so with
    `post_ops = True` (bertkit.runtime.fast's FastLinear) and is handed them, whenever dropout is
    idle (inference, or a rate of 0): the same sums.
    """
    if getattr(linear, "post_ops", False) and (dropout is None or not dropout.training or dropout.p == 0):
        return linear(x, act=act, residual=residual)
    y = linear(x)
    if act is not None:
        y = act(y)
    if dropout is not None:
        y = dropout(y)
    return y if residual is None else residual + y


# --- attention ----------------------------------------------------------------


def additive_mask(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """[B, T] with 1 = real token, 0 = padding -> [B, 1, 1, T] to add to the scores.

    Kept positions add 0, padding adds the dtype's most negative finite number (not
    -inf, so a row with no real token softmaxes to uniform instead of NaN). None
    when nothing is masked: the fused kernel is fastest without a mask.
    """
    if attention_mask is None or (not torch.compiler.is_compiling() and bool(attention_mask.all())):
        return None  # (compiled, a mask always: reading it on the host would cut the graph)
    keep = attention_mask.bool()[:, None, None, :]  # [B, 1, 1, T]: broadcast over heads and queries
    mask = torch.zeros(keep.shape, dtype=dtype, device=attention_mask.device)
    return mask.masked_fill_(~keep, torch.finfo(dtype).min)


# The fused kernels a CUDA GPU may use, in this order. torch tries cuDNN's attention first on Hopper
# GPUs, and with a padding mask it builds a plan for every new (batch, length) shape, met at nearly
# every step of a run whose batches are padded to their longest: the plans, not the arithmetic, were
# the step's time (once every shape was seen the kernels were alike; docs/benchmarks.md "On a GPU" has
# the figures). Memory-efficient attention takes a mask and dropout and builds nothing per shape;
# FlashAttention runs where there is no mask.
CUDA_ATTENTION = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def fused_kernels(device: torch.device):
    """The context that limits scaled_dot_product_attention to CUDA_ATTENTION on a CUDA device."""
    return sdpa_kernel(list(CUDA_ATTENTION)) if device.type == "cuda" else contextlib.nullcontext()


class BertSelfAttention(nn.Module):
    """Multi-head self-attention with its output projection.

    Every head projects each token to a query, a key and a value (D each); scores
    q.k / sqrt(D) say how much a token attends to each other token; padding is
    masked out; softmax turns scores into weights; the output is the weighted
    average of the values. The N heads' outputs are concatenated back to H and
    recombined by one output projection.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads  # N
        self.head_size = config.head_size  # D
        # query, key and value of all heads in one [H, 3H] projection: rows 0:H are the
        # queries, H:2H the keys, 2H:3H the values (the checkpoint table splits them)
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.output = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_prob = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, explicit: bool,
                hidden_dropout: nn.Dropout | None = None, residual: torch.Tensor | None = None):
        """The output projection of the heads' outputs, [B, T, H], then `hidden_dropout` and + `residual`
        where given (`dense`: in one kernel where the projection can), and the weights or None."""
        B, T, H = x.shape
        N, D = self.num_heads, self.head_size
        qkv = self.qkv(x).view(B, T, 3, N, D)  # [B, T, 3H] -> [B, T, 3, N, D]
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x [B, N, T, D]
        rate = self.dropout_prob if self.training else 0.0
        # torch's CPU kernels cannot drop weights; compiled, the fused call below is traced whole instead
        if 0 < rate < 1 and not explicit and x.device.type == "cpu" and not torch.compiler.is_compiling():
            weights = None
            context = chunked_attention.attention(q, k, v, mask, rate)  # [B, N, T, D], the sums below
        elif explicit:
            scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(D))  # [B, N, T, T]: query x key
            if mask is not None:
                scores = scores + mask  # padding keys get the dtype's min -> weight 0
            weights = scores.softmax(dim=-1)  # [B, N, T, T], each row sums to 1
            context = dropout(weights, rate) @ v  # [B, N, T, D]
        else:
            weights = None
            with fused_kernels(x.device):
                context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=rate)  # [B, N, T, D]
        context = context.transpose(1, 2).reshape(B, T, H)  # [B, T, N, D] -> [B, T, H]: heads concatenated
        return dense(self.output, context, dropout=hidden_dropout, residual=residual), weights


# --- layer, encoder, pooler -----------------------------------------------------


class BertLayer(nn.Module):
    """One Transformer encoder layer, post-LayerNorm as in BERT:

    x = LayerNorm(x + Dropout(SelfAttention(x)))
    x = LayerNorm(x + Dropout(W2 gelu(W1 x)))      W1: H -> I, W2: I -> H

    The one forward of every kind of layer: plain, accelerated and int8 differ only in
    their dense modules (see `dense`).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertSelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, explicit: bool = False):
        # x + Dropout(SelfAttention(x)): [B, T, H]; the weights [B, N, T, T] or None
        x, weights = self.attention(x, mask, explicit, hidden_dropout=self.dropout, residual=x)
        x = self.attention_norm(x)
        h = dense(self.intermediate, x, act=self.act)  # gelu(W1 x + b1): [B, T, H] -> [B, T, I]
        x = dense(self.output, h, dropout=self.dropout, residual=x)  # x + Dropout(W2 h + b2): [B, T, H]
        return self.output_norm(x), weights


class BertEncoder(nn.Module):
    """L layers in a stack; optionally keeps every layer's output and attention weights."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = config.gradient_checkpointing

    def forward(self, x, mask, explicit=False, output_hidden_states=False, output_attentions=False):
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for layer in self.layers:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                # keep only the layer's input; recompute its inside during backward
                x, weights = checkpoint(layer, x, mask, explicit, use_reentrant=False)
            else:
                x, weights = layer(x, mask, explicit)
            if output_hidden_states:
                hidden_states.append(x)
            if output_attentions:
                attentions.append(weights)
        return x, hidden_states, attentions


class BertPooler(nn.Module):
    """tanh(W h_[CLS] + b): the sentence vector the NSP and classification heads read."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x[:, 0]))  # [B, T, H] -> [CLS] [B, H] -> [B, H]


def pool_sentence(vectors: torch.Tensor, attention_mask: torch.Tensor | None, pooling: str = "mean") -> torch.Tensor:
    """One vector per text from its token vectors, [B, T, D], [B, T] -> [B, D]: sentence-transformers'
    Pooling module, the one implementation bertkit trains, embeds and classifies with.

    "mean": the average over real tokens ([CLS] and [SEP] count, padding does not); "max": their
    element-wise maximum (padding never wins); "cls": the [CLS] vector. attention_mask None: every
    position is a real token.
    """
    if pooling not in SENTENCE_POOLINGS:
        raise BertkitError(f"unknown sentence pooling {pooling!r}: use one of {', '.join(SENTENCE_POOLINGS)}")
    if pooling == "cls":
        return vectors[:, 0]
    if attention_mask is None:
        return vectors.mean(dim=1) if pooling == "mean" else vectors.amax(dim=1)
    if pooling == "max":  # padding filled with the lowest value, as sentence-transformers fills it with -1e9
        padding = attention_mask.unsqueeze(-1) == 0  # [B, T, 1]
        return vectors.masked_fill(padding, torch.finfo(vectors.dtype).min).amax(dim=1)
    mask = attention_mask.unsqueeze(-1).to(vectors.dtype)  # [B, T, 1]
    return (vectors * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


# --- initialisation and input checks ----------------------------------------------


@torch.no_grad()
def init_weights(module: nn.Module, std: float, generator: torch.Generator | None = None) -> None:
    """BERT's initialisation: weights ~ N(0, std) (truncated in the TF original; plain normal
    here as in transformers), zero biases, LayerNorm scale 1 and shift 0, and the [PAD] embedding
    row zero (transformers' too: it gets no gradient, so it would keep its random start)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            m.weight.normal_(0.0, std, generator=generator)
            if getattr(m, "bias", None) is not None:
                m.bias.zero_()
            if getattr(m, "padding_idx", None) is not None:
                m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            m.weight.fill_(1.0)
            m.bias.zero_()


def check_inputs(config: BertConfig, input_ids, attention_mask, token_type_ids) -> None:
    """Fail early, with the fix, on input an embedding lookup would only fail on deep inside."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise BertkitError(
            f"input_ids must be a [batch, seq_len] tensor of token ids, got {shape}; "
            "for a single sequence use ids.unsqueeze(0)"
        )
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise BertkitError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    B, T = input_ids.shape
    if B == 0 or T == 0:
        raise BertkitError(f"input_ids is empty (shape {(B, T)}): encode at least one token")
    if T > config.max_position_embeddings:
        raise BertkitError(
            f"sequence length {T} exceeds max_position_embeddings={config.max_position_embeddings}: "
            f"truncate the input (tokenizer max_length <= {config.max_position_embeddings})"
        )
    lo, hi = map(int, torch.aminmax(input_ids))  # one pass for both ends
    if lo < 0 or hi >= config.vocab_size:
        bad = lo if lo < 0 else hi
        raise BertkitError(
            f"token id {bad} is outside the vocabulary (vocab_size={config.vocab_size}): "
            "was the text tokenized with another model's vocab.txt?"
        )
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.shape != input_ids.shape):
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise BertkitError(f"{name} has shape {shape} but input_ids has {tuple(input_ids.shape)}: they must match")
    if token_type_ids is not None:
        lo, hi = map(int, torch.aminmax(token_type_ids))
        if config.type_vocab_size == 1 and hi == 1 and lo == 0:
            raise BertkitError("the model has one segment (type_vocab_size 1): it reads no sentence pair "
                               "(segment B, token_type_ids 1); give it one text")
        if lo < 0 or hi >= config.type_vocab_size:
            raise BertkitError(
                f"token_type_ids must be in [0, {config.type_vocab_size}) (segment A/B), found {lo if lo < 0 else hi}"
            )


def attention_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype attention scores will have: autocast's if it is on, else the activations'."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


# --- the model ----------------------------------------------------------------------


class BertPreTrainedModel(nn.Module):
    """What BertModel and every head share: the config, loading and saving in HF format."""

    config_class = BertConfig  # what from_pretrained reads config.json as (ELECTRA's classes: ElectraConfig)
    base_model_prefix = "bert"  # the encoder's attribute in a head (ELECTRA's: "electra"), as in transformers

    def __init__(self, config: BertConfig):
        super().__init__()
        if not isinstance(config, BertConfig):
            raise BertkitError(f"expected a BertConfig, got {type(config).__name__}; try BertConfig.preset('base')")
        self.config = config

    @classmethod
    def from_pretrained(cls, path=None, strict: bool = True, generator: torch.Generator | None = None,
                        config_json: dict | None = None, **config_overrides):
        """Load a Hugging Face BERT directory (None: the default model) into this class.

        `config_overrides` change config fields before building, e.g. num_labels=3 for a
        fresh classification head. strict=True raises on missing or unexpected weights;
        strict=False initialises what is missing (with `generator`) and records what
        happened in `model.load_report`. `config_json`: the directory's config.json as the caller read it (read
        once for a whole load). See bertkit.model.checkpoint.
        """
        return hf_checkpoint.load_pretrained(cls, path, strict=strict, generator=generator, config_json=config_json,
                                             **config_overrides)

    def save_pretrained(self, directory, tokenizer=None) -> None:
        """Write config.json + model.safetensors (+ the tokenizer's files) so transformers loads them."""
        hf_checkpoint.save_pretrained(self, directory, tokenizer=tokenizer)

    @property
    def base_model(self) -> nn.Module:
        """The encoder of a head (its `bert` or `electra`); a bare encoder itself."""
        return getattr(self, self.base_model_prefix, self)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def set_gradient_checkpointing(self, enabled: bool = True) -> None:
        """Trade compute for memory in training: each layer is recomputed during backward."""
        self.config.gradient_checkpointing = enabled
        for m in self.modules():
            if isinstance(m, BertEncoder):
                m.gradient_checkpointing = enabled


class BertModel(BertPreTrainedModel):
    """The bare encoder: embeddings -> L layers -> (pooler).

    forward(input_ids [B, T], attention_mask [B, T] (1 real / 0 pad), token_type_ids [B, T])
    -> BertOutput. Dropout is active only in train(). `pool=False` skips the pooler
    (pooler_output None) for callers that read the token vectors only, as embedding does.
    """

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True, generator: torch.Generator | None = None):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        init_weights(self, config.initializer_range, generator)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        pool: bool = True,
    ) -> BertOutput:
        if not torch.compiler.is_compiling():  # its reads of the ids' range would cut a compiled graph in three
            check_inputs(self.config, input_ids, attention_mask, token_type_ids)
        x = self.embed(input_ids, token_type_ids)  # [B, T, H]
        mask = additive_mask(attention_mask, attention_dtype(x))  # [B, 1, 1, T] or None
        explicit = output_attentions or self.config.attn_implementation == "eager"
        x, hidden_states, attentions = self.encoder(x, mask, explicit, output_hidden_states, output_attentions)
        return BertOutput(
            last_hidden_state=x,
            pooler_output=self.pooler(x) if pool and self.pooler is not None else None,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        """The vectors the first layer reads, [B, T, H] (ELECTRA's: its narrower embeddings projected)."""
        return self.embeddings(input_ids, token_type_ids)
