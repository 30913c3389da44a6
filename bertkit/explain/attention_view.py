"""Attention pictures: what each token of a text attends to, layer by layer, head by head.

BERT's self-attention (Vaswani et al. 2017, section 3.2.1; BERT paper section 3)
gives, in each of L layers and N heads, a row-stochastic matrix softmax(QK^T /
sqrt(d) + mask) [T, T]: row i is how token i spreads its attention over all
tokens, padding masked to zero. `attention_map()` runs the model once with
`output_attentions=True` and keeps those weights:

    AttentionMap.weights   [L, N, T, T] float32, rows sum to 1
    AttentionMap.tokens    the T word pieces, [CLS] ... [SEP] (... [SEP])

and this module shows them in three ways:

- `attention_html`: one self-contained HTML page (inline CSS/JS from the
  template `bertkit/templates/attention.html`, the weights embedded as base64
  float32, nothing fetched from the network) with the text
  coloured by the attention the chosen token gives every other token, layer and
  head selectors (or the mean over heads), and the head-by-layer overview of
  small heatmaps in the manner of bertviz's model view (Vig 2019) and Clark et
  al. 2019 ("What does BERT look at?"); click a heatmap or a token to switch.
- `save_png`: the same views rendered with matplotlib (text, one head's
  heatmap, or the overview grid).
- `to_bertviz` / `save_bertviz`: the tensors and tokens in the form bertviz's
  `head_view(attention, tokens, sentence_b_start)` and `model_view` take
  (a tuple of L tensors [1, N, T, T]).

`offset_attention` measures one pattern over a batch: the attention each head
gives the previous (or next) token, which a trained BERT has heads for and a
model on masked-LM's early plateau does not (docs/pretraining.md).
"""

from __future__ import annotations

import base64
import html
import json
import re
import unicodedata
import warnings
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from bertkit.data.atomic import replace_atomically
from bertkit.errors import BertkitError, int_at_least
from bertkit.embeddings.features import placed_encoder


@dataclass
class AttentionMap:
    """The attention weights of one text (or pair) and the tokens they run over."""

    tokens: list
    weights: np.ndarray  # [L, N, T, T] float32
    token_type_ids: list = field(default_factory=list)
    text: str = ""
    pair: str | None = None

    @property
    def num_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def num_heads(self) -> int:
        return self.weights.shape[1]

    @property
    def sentence_b_start(self) -> int | None:
        """Index of the first token of segment B (bertviz's argument), None for a single text."""
        return self.token_type_ids.index(1) if 1 in self.token_type_ids else None

    def row(self, layer: int, head, token: int) -> np.ndarray:
        """The attention token `token` gives every token: [T]; head may be "mean"."""
        layer, token = self.place(layer, head, token)
        if head == "mean":
            return self.weights[layer, :, token].mean(axis=0)
        return self.weights[layer, head, token]

    def place(self, layer, head, token: int = 0) -> tuple[int, int]:
        """(layer, token) counted from 0, after checking them and `head`: a negative layer or token counts
        from the end (-1: the last), as in `bertkit.trace` and `bertkit.embed`."""
        for name, value in (("layer", layer), ("head", head), ("token", token)):
            if value is not None and not (name == "head" and value == "mean") and (
                    isinstance(value, bool) or not isinstance(value, (int, np.integer))):
                kind = "an int or 'mean'" if name == "head" else "an int"
                raise BertkitError(f"{name} must be {kind}, got {value!r}")
        T, L = len(self.tokens), self.num_layers
        if not -T <= token < T:
            raise BertkitError(f"token {token} is out of range: the text has {T} tokens, numbered 0..{T - 1}")
        if not -L <= layer < L:
            raise BertkitError(f"layer {layer} is out of range: this model has {L} layers, numbered 0..{L - 1} "
                               f"(or -{L}..-1 from the last)")
        if head != "mean" and not 0 <= head < self.num_heads:
            raise BertkitError(
                f"head {head} is out of range: each layer has {self.num_heads} heads, numbered 0..{self.num_heads - 1}"
            )
        return int(layer) % L, int(token) % T


# --- computing the weights -----------------------------------------------------------


def attention_map(text: str, pair: str | None = None, model=None, *, device=None, dtype=None,
                  fast=True) -> AttentionMap:
    """Run the model on `text` (and `pair`) and keep every layer's attention weights.

    model: None (the default model), a model directory, a (model, tokenizer) pair, or what
    `bertkit.load` returned (then where and in what it runs was decided there).
    device: auto, cpu or cuda; dtype: auto, float32 or bfloat16; fast: the fast path's settings (see
    bertkit.runtime.loading.load).
    The text must fit in the model's positions (512): the page shows whole
    attention matrices, which windows of a longer text would not give.
    """
    for name, value in (("text", text), ("pair", pair)):
        if value is not None and not isinstance(value, str):
            raise BertkitError(f"attention_map's {name} must be a str (one text; a page shows one pass), "
                               f"got {type(value).__name__}")
    if text is None or not text.strip():
        raise BertkitError("cannot show attention for an empty text: give a sentence")
    if pair is not None and not pair.strip():
        raise BertkitError("the second segment (pair) is empty: drop it or give it some text")
    loaded = placed_encoder(model, "attention_map", device, dtype, fast=fast)
    loaded.need_layers("an attention picture")
    net, tok = loaded.model, loaded.tokenizer
    limit = int(getattr(net.config, "max_position_embeddings", 512))
    enc = tok.encode(text, pair, max_length=limit, truncation=False)  # no cut: checked below
    if len(enc.input_ids) > limit:
        raise BertkitError(
            f"the text has {len(enc.input_ids)} tokens but the model takes at most {limit}: "
            "attention is shown for one pass, so shorten the text"
        )
    device = next(net.parameters()).device
    ids = torch.tensor([enc.input_ids], device=device)
    types = torch.tensor([enc.token_type_ids], device=device)
    was_training = net.training
    net.eval()  # attention dropout off: rows must sum to 1
    try:
        with torch.inference_mode():
            out = net(ids, attention_mask=torch.ones_like(ids), token_type_ids=types, output_attentions=True)
    finally:
        net.train(was_training)
    weights = torch.stack([a[0] for a in out.attentions]).float().cpu().numpy()  # [L, N, T, T]
    return AttentionMap(list(enc.tokens), weights, list(enc.token_type_ids), text, pair)


def offset_attention(attentions, attention_mask=None, offset: int = -1) -> np.ndarray:
    """How much attention each head puts on the token `offset` positions away: [L, N].

    attentions: a model's `output_attentions` (L tensors [B, N, T, T]) or one
    [L, B, N, T, T] tensor; attention_mask [B, T] (1 real, 0 padding). The mean, over
    every real query whose neighbour at `offset` is real too, of the weight it gives
    that neighbour (-1: the previous token, +1: the next). Clark et al. 2019 found
    BERT-Base heads that put most of their attention on the previous or next token;
    a model still on masked-LM's early plateau has none (uniform attention over n
    tokens gives 1/n), which makes this the plateau's simplest gauge.
    """
    w = torch.stack(list(attentions)) if isinstance(attentions, (list, tuple)) else torch.as_tensor(attentions)
    if w.dim() != 5 or w.shape[-1] != w.shape[-2]:
        raise BertkitError(f"attentions must be L x [B, N, T, T] (or [L, B, N, T, T]), got shape {tuple(w.shape)}")
    B, T = w.shape[1], w.shape[-1]
    if not 0 < abs(offset) < T:
        raise BertkitError(f"offset {offset} has no neighbour in sequences of {T} tokens: use 0 < |offset| < {T}")
    real = torch.ones(B, T, dtype=torch.bool) if attention_mask is None else torch.as_tensor(attention_mask).bool()
    if real.shape != (B, T):
        raise BertkitError(f"attention_mask has shape {tuple(real.shape)}, the attentions are for [B, T] = [{B}, {T}]")
    # diagonal `offset` of a [T, T] matrix holds entry (i, i + offset) for every i that has one
    weight = torch.diagonal(w.float(), offset=offset, dim1=-2, dim2=-1)  # [L, B, N, T - |offset|]
    both_real = torch.diagonal(real[:, :, None] & real[:, None, :], offset=offset, dim1=-2, dim2=-1)  # [B, T - |offset|]
    keep = both_real[None, :, None, :].float()
    return ((weight * keep).sum(dim=(1, 3)) / keep.sum(dim=(1, 3)).clamp_min(1)).numpy()


def find_token(amap: AttentionMap, word: str, occurrence: int = 1) -> int:
    """Index of the token for `word` (its first word piece), the n-th occurrence.

    Matches a whole word piece first ("he"), then a word rebuilt from its
    pieces ("ridiculous" from "ridic", "##ulous"), regardless of case and accents
    (`_folded`), so a word is found as the text writes it ("Café": an uncased
    model's token is "cafe").
    """
    # from 1: hits[occurrence - 1] below it counted from the end (0 was the last occurrence)
    int_at_least(occurrence, 1, "occurrence")
    target = _folded(word.strip())
    if not target:
        raise BertkitError("the token to follow is empty: give a word of the text, e.g. --token he")
    hits = [i for i, t in enumerate(amap.tokens) if _folded(t) == target]
    if not hits:
        words = _words(amap.tokens)
        hits = [start for start, w in words if _folded(w) == target]
    if len(hits) < occurrence:
        shown = " ".join(w for _, w in _words(amap.tokens))
        where = f"only {len(hits)} times" if hits else "nowhere"
        raise BertkitError(f"the token {word!r} occurs {where} in the text; its tokens are: {shown}")
    return hits[occurrence - 1]


def _folded(word: str) -> str:
    """`word` lower-cased and without accents, as an uncased BERT's tokenizer reads it (NFD, combining marks
    dropped: google-research/bert's _run_strip_accents)."""
    return "".join(c for c in unicodedata.normalize("NFD", word.lower()) if unicodedata.category(c) != "Mn")


class HeadHit(NamedTuple):
    """One head's answer to "where does this token look?" (layer and head from 0)."""

    layer: int
    head: int
    weight: float  # the attention the token gives `attended` in this head
    attended: str  # the token attended to (the first piece of a word)


def rank_heads(amap: AttentionMap, token: int, target: int | None = None) -> list:
    """Every (layer, head) ranked by the attention token `token` gives: to the token at index `target`,
    or, with target None, to the token each head sends it to most. [HeadHit], largest weight first."""
    rows = amap.weights[:, :, token, :]  # [L, N, T]: what `token` gives every token, per layer and head
    picked = np.argmax(rows, axis=-1) if target is None else np.full(rows.shape[:2], target)
    hits = [HeadHit(l, h, float(rows[l, h, picked[l, h]]), amap.tokens[picked[l, h]])
            for l in range(amap.num_layers) for h in range(amap.num_heads)]
    return sorted(hits, key=lambda hit: (-hit.weight, hit.layer, hit.head))


def find_heads(text: str, token: str, target: str | None = None, model=None, *, occurrence: int = 1,
               top: int | None = None) -> list:
    """Search all layers and heads for where the word `token` of `text` attends: the heads ranked by the
    weight it gives the word `target` (None: whatever each head sends it to most), largest first, the
    first `top` of them (None: all L x N). Words are found as `find_token` finds them (first piece,
    `occurrence`-th time); model as in `attention_map`. Clark et al. 2019 found heads this way (e.g. a
    coreference head that sends a pronoun to its antecedent)."""
    amap = attention_map(text, model=model)
    where = find_token(amap, token, occurrence)
    hits = rank_heads(amap, where, None if target is None else find_token(amap, target))
    return hits if top is None else hits[:top]


def most_attended(amap: AttentionMap, token: int, layer: int, head, k: int = 3) -> list:
    """The k tokens `token` gives the most attention in one layer and head (or "mean"):
    [(index, token, weight)], largest weight first."""
    row = amap.row(layer, head, token)
    order = np.argsort(-row, kind="stable")[:k]
    return [(int(j), amap.tokens[j], float(row[j])) for j in order]


def _words(tokens: list) -> list:
    """(index of first piece, word) for words rebuilt from ## continuation pieces."""
    words = []
    for i, t in enumerate(tokens):
        if t.startswith("##") and words:
            start, w = words[-1]
            words[-1] = (start, w + t[2:])
        else:
            words.append((i, t))
    return words


# --- bertviz -----------------------------------------------------------------------------


def to_bertviz(amap: AttentionMap) -> dict:
    """Keyword arguments for bertviz: `head_view(**to_bertviz(m))`, `model_view(**...)`.

    attention: tuple of L torch tensors [1, N, T, T] (what a Hugging Face model
    returns with output_attentions=True); tokens; sentence_b_start.
    """
    attn = tuple(torch.from_numpy(np.ascontiguousarray(layer))[None] for layer in amap.weights)
    return {"attention": attn, "tokens": list(amap.tokens), "sentence_b_start": amap.sentence_b_start}


def save_bertviz(amap: AttentionMap, path) -> Path:
    """Write the bertviz arguments as JSON: {"attention": [L][1][N][T][T], "tokens", "sentence_b_start"}.

    Load with `load_bertviz(path)` and call `head_view(**kwargs)`.
    """
    path = Path(path)
    record = {
        "attention": amap.weights[:, None].tolist(),
        "tokens": list(amap.tokens),
        "sentence_b_start": amap.sentence_b_start,
    }
    text = json.dumps(record)
    replace_atomically(path, lambda f: f.write(text.encode("utf-8")))  # whole or not at all, as every output
    return path


def load_bertviz(path) -> dict:
    """The keyword arguments saved by `save_bertviz`, with torch tensors again."""
    record = json.loads(Path(path).read_text())
    record["attention"] = tuple(torch.tensor(layer, dtype=torch.float32) for layer in record["attention"])
    return record


# --- the HTML page -------------------------------------------------------------------------

# The page (bertkit/templates/attention.html, package data) is plain HTML, CSS and JavaScript with two
# placeholders: __TITLE__ (the text, HTML-escaped) and __DATA__ (the JSON below, inside a <script> element).
PAGE_TEMPLATE = "templates/attention.html"


def page_template() -> str:
    return resources.files("bertkit").joinpath(PAGE_TEMPLATE).read_text(encoding="utf-8")


def attention_html(amap: AttentionMap, token: int = 0, layer: int = 0, head=0) -> str:
    """A self-contained HTML page (no network) showing `amap`; starts at token/layer/head."""
    layer, token = amap.place(layer, head, token)
    weights = np.ascontiguousarray(amap.weights, dtype="<f4")
    data = {
        "tokens": list(amap.tokens),
        "layers": amap.num_layers,
        "heads": amap.num_heads,
        "segment_b_start": amap.sentence_b_start,
        "layer": int(layer),
        "head": head if head == "mean" else int(head),
        "token": int(token),
        "weights": base64.b64encode(weights.tobytes()).decode("ascii"),
    }
    # "</" inside the JSON would end the <script> element early.
    payload = json.dumps(data).replace("</", "<\\/")
    title = html.escape(amap.text[:60] + ("..." if len(amap.text) > 60 else ""))
    return page_template().replace("__TITLE__", title).replace("__DATA__", payload)


def save_html(amap: AttentionMap, path, token: int = 0, layer: int = 0, head=0) -> Path:
    path = Path(path)
    page = attention_html(amap, token, layer, head).encode("utf-8")
    replace_atomically(path, lambda f: f.write(page))  # a full disk or a kill leaves the earlier page, not half one
    return path


# --- PNG (matplotlib) ----------------------------------------------------------------------

VIEWS = ("text", "head", "overview")


def check_picture(path) -> Path:
    """`path`, refused unless its suffix names a format matplotlib writes (it picks the format by the suffix:
    `--png view.txt` was a ValueError once the model had run)."""
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = FigureCanvasBase.get_supported_filetypes()
    if Path(path).suffix[1:].lower() not in kinds:
        raise BertkitError(f"--png {path}: name the picture .png (or another suffix matplotlib writes: "
                           f"{', '.join(sorted(kinds))})")
    return Path(path)


def save_png(amap: AttentionMap, path, view: str = "text", token: int = 0, layer: int = 0, head=0, dpi: int = 120) -> Path:
    """Render one view to a PNG: "text" (tokens coloured by the chosen token's
    attention), "head" (one layer/head as a T x T heatmap) or "overview" (L x N grid)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    check_picture(path)

    if view not in VIEWS:
        raise BertkitError(f"unknown view {view!r}: use one of {', '.join(VIEWS)}")
    layer, token = amap.place(layer, head, token)
    T = len(amap.tokens)
    if view == "text":
        fig = _text_figure(plt, amap, token, layer, head)
    elif view == "head":
        matrix = amap.weights[layer].mean(axis=0) if head == "mean" else amap.weights[layer, head]
        size = max(4.0, 0.28 * T + 1.5)
        fig, ax = plt.subplots(figsize=(size + 1, size))
        im = ax.imshow(matrix, cmap="Reds", vmin=0.0, vmax=float(matrix.max()) or 1.0)
        ax.set_xticks(range(T), amap.tokens, rotation=90, fontsize=8)
        ax.set_yticks(range(T), amap.tokens, fontsize=8)
        ax.set_xlabel("attended to")
        ax.set_ylabel("attending token")
        ax.set_title(f"layer {layer}, {'mean of heads' if head == 'mean' else f'head {head}'}")
        fig.colorbar(im, ax=ax, fraction=0.046)
    else:
        L, N = amap.num_layers, amap.num_heads
        fig, axes = plt.subplots(L, N, figsize=(1.1 * N + 1, 1.1 * L + 0.6), squeeze=False)
        for l in range(L):
            for h in range(N):
                ax = axes[l][h]
                ax.imshow(np.sqrt(amap.weights[l, h]), cmap="Blues", vmin=0.0, vmax=1.0)
                ax.set_xticks([])
                ax.set_yticks([])
                if l == 0:
                    ax.set_title(f"head {h}", fontsize=7)
                if h == 0:
                    ax.set_ylabel(f"layer {l}", fontsize=7)
        fig.suptitle("attention of every head (rows: layers)", fontsize=9)
    path = Path(path)
    with warnings.catch_warnings(record=True) as caught:  # matplotlib's, drawing: `_pass_on`
        warnings.simplefilter("always")
        try:  # into a file object (NAME.tmp names no format): the suffix check_picture accepted names it
            replace_atomically(path, lambda f: fig.savefig(f, format=path.suffix[1:].lower() or "png", dpi=dpi,
                                                           bbox_inches="tight"))
        finally:
            plt.close(fig)
    _pass_on(caught)
    return path


def _pass_on(caught: list) -> None:
    """The warnings of a drawing, passed on, but for matplotlib's one per character its fonts have no glyph for
    ("Glyph 21271 (...) missing from font(s) DejaVu Sans."): a Chinese paragraph gave a line per ideograph. One
    line says them all, and where they are drawn (the HTML page: the browser's own fonts)."""
    missing, fonts = [], ""
    for w in caught:
        glyph = re.match(r"Glyph (\d+) .*missing from font\(s\) (.+?)\.?$", str(w.message))
        if glyph is None:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        elif chr(int(glyph[1])) not in missing:
            missing, fonts = [*missing, chr(int(glyph[1]))], glyph[2]
    if missing:
        shown = "".join(missing[:20]) + ("..." if len(missing) > 20 else "")
        warnings.warn(f"the picture draws {len(missing)} character{'s' if len(missing) > 1 else ''} as empty boxes "
                      f"({shown}): matplotlib's fonts ({fonts}) have no glyph for them; install a font that has (e.g. "
                      "Debian's fonts-noto-cjk), or read the HTML page, which the browser draws with its own fonts")


def _text_figure(plt, amap: AttentionMap, token: int, layer: int, head):
    """Tokens laid out in lines, each box shaded by the attention `token` gives it."""
    weights = amap.row(layer, head, token)
    top = float(weights.max()) or 1.0
    per_line, width = 12, 12.0
    lines = (len(amap.tokens) + per_line - 1) // per_line
    fig, ax = plt.subplots(figsize=(width, 0.55 * lines + 0.9))
    ax.set_xlim(0, per_line)
    ax.set_ylim(lines, -0.6)
    ax.axis("off")
    cmap = plt.get_cmap("Reds")
    for j, tok in enumerate(amap.tokens):
        x, y = j % per_line, j // per_line
        ax.text(
            x + 0.5, y + 0.35, tok, ha="center", va="center", fontsize=10,
            bbox=dict(boxstyle="round,pad=0.25", fc=cmap(0.85 * weights[j] / top),
                      ec="#d33" if j == token else "none", lw=1.5),
            color="white" if weights[j] / top > 0.6 else "black",
        )
    head_name = "mean of heads" if head == "mean" else f"head {head}"
    ax.set_title(f"attention from {amap.tokens[token]!r} (token {token}), layer {layer}, {head_name}", fontsize=10)
    return fig
