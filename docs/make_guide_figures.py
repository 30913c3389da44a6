"""Remake the figures of docs/guide.md: `python docs/make_guide_figures.py [--out docs]`.

guide_attention_heads.png        the attention weights [T, T] of every head of layer 0 of the
                                 default model for the guide's sentence (bertkit.trace), head 4 (the
                                 worked example of sections 3 and 4) framed, with a colour scale
guide_layer_block.png            one layer block drawn as its submodules, each with its parameter
                                 count read from the loaded model (parameter_counts)
guide_contextual_embeddings.png  last-layer vectors of ambiguous words in sentences of each sense
                                 (bertkit.embed, pooling="words"), projected per word to its first
                                 two principal components (numpy SVD)

The default model runs on the CPU in float32, so the pictures come out the same on every machine.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import bertkit

SENTENCE = "The bank of the river flooded after the storm."
LAYER, HEAD = 0, 4  # 0-based, as bertkit.trace counts: the guide's worked example

# word -> sense -> sentences (pre-split, lower case) that use the word in that sense
SENSES = {
    "bank": {
        "river": ["we sat on the bank of the river", "the boat drifted toward the muddy bank",
                  "reeds grew along the bank of the stream", "the fisherman stood on the grassy bank"],
        "money": ["she deposited the cheque at the bank", "the bank approved his loan",
                  "he works as a clerk in a bank", "the bank raised its interest rates"],
    },
    "bat": {
        "animal": ["a bat flew out of the cave at dusk", "the bat hung upside down from the branch",
                   "the bat hunts insects at night", "a small bat lives in the attic"],
        "sport": ["he swung the bat and hit the ball", "she bought a new cricket bat",
                  "the player dropped his bat and ran", "a wooden bat is heavier than it looks"],
    },
    "spring": {
        "season": ["the flowers bloom in spring", "we plan to travel next spring",
                   "spring arrived early this year", "the lambs were born in the spring"],
        "water": ["they drank from a cold mountain spring", "the village well is fed by a spring",
                  "hot water bubbled up from the spring", "the spring never runs dry"],
    },
}
COLOURS = ("tab:blue", "tab:orange")


def attention_heads(path: Path, text: str = SENTENCE, layer: int = LAYER, framed: int = HEAD) -> Path:
    import matplotlib.pyplot as plt

    t = bertkit.trace(text, layer=layer)
    N = t.num_heads
    cols = 4
    rows = (N + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 3.2, rows * 3.3))
    T = len(t.tokens)
    image = None
    for h, ax in enumerate(axes.flat):
        if h >= N:
            ax.axis("off")
            continue
        image = ax.imshow(t.weights[h].numpy(), cmap="Blues", vmin=0, vmax=1)
        ax.set_title(f"head {h}" + ("  (sections 3 and 4)" if h == framed else ""), fontsize=9,
                     fontweight="bold" if h == framed else "normal")
        if h == framed:
            for side in ax.spines.values():
                side.set_edgecolor("tab:red")
                side.set_linewidth(2.5)
        ax.set_xticks(range(T))
        ax.set_yticks(range(T))
        ax.set_xticklabels(t.tokens, rotation=90, fontsize=6)
        ax.set_yticklabels(t.tokens, fontsize=6)
    fig.suptitle(f"layer {layer} of all-MiniLM-L6-v2: row = the token attending, column = the token attended to",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.93, 1))
    bar = fig.colorbar(image, cax=fig.add_axes((0.945, 0.15, 0.015, 0.7)))
    bar.set_label("attention weight (each row sums to 1)", fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parameter_counts(model) -> dict:
    """Parameters of one layer block by submodule, of the embeddings and pooler, and in all."""
    layer = model.encoder.layers[0]
    count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    return {
        "attention: Q, K, V": count(layer.attention.qkv),
        "attention: output W_O": count(layer.attention.output),
        "LayerNorm after attention": count(layer.attention_norm),
        "feed-forward W1 (H -> I)": count(layer.intermediate),
        "feed-forward W2 (I -> H)": count(layer.output),
        "LayerNorm after feed-forward": count(layer.output_norm),
        "one layer": count(layer),
        "layers": len(model.encoder.layers),
        "embeddings": count(model.embeddings),
        "pooler": count(model.pooler),
        "model": count(model),
    }


def layer_block(path: Path) -> Path:
    """The post-LN layer as a column of boxes, input at the bottom, with parameter counts."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    model = bertkit.BertModel.from_pretrained()
    n = parameter_counts(model)
    c = model.config
    attention = n["attention: Q, K, V"] + n["attention: output W_O"]
    ffn = n["feed-forward W1 (H -> I)"] + n["feed-forward W2 (I -> H)"]
    boxes = [  # (label, parameters, colour), bottom to top
        (f"input x  [T, {c.hidden_size}]", None, "white"),
        (f"Q, K, V: one Linear {c.hidden_size} -> 3 x {c.hidden_size}, {c.num_attention_heads} heads of "
         f"{c.hidden_size // c.num_attention_heads}", n["attention: Q, K, V"], "#cfe2f3"),
        (f"softmax(Q K^T / sqrt({c.hidden_size // c.num_attention_heads})) V, heads concatenated", 0, "#cfe2f3"),
        (f"W_O: Linear {c.hidden_size} -> {c.hidden_size}", n["attention: output W_O"], "#cfe2f3"),
        ("add x, LayerNorm", n["LayerNorm after attention"], "#eeeeee"),
        (f"W1: Linear {c.hidden_size} -> {c.intermediate_size}, GELU", n["feed-forward W1 (H -> I)"], "#fde9d9"),
        (f"W2: Linear {c.intermediate_size} -> {c.hidden_size}", n["feed-forward W2 (I -> H)"], "#fde9d9"),
        ("add, LayerNorm", n["LayerNorm after feed-forward"], "#eeeeee"),
        (f"output  [T, {c.hidden_size}]: the next layer's input", None, "white"),
    ]
    fig, ax = plt.subplots(figsize=(8.2, 7.2))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.6, len(boxes) * 1.1 + 0.4)
    ax.axis("off")
    for k, (label, params, colour) in enumerate(boxes):
        y = k * 1.1
        ax.add_patch(FancyBboxPatch((0.3, y), 6.6, 0.7, boxstyle="round,pad=0.05", fc=colour, ec="black"))
        ax.text(3.6, y + 0.35, label, ha="center", va="center", fontsize=8)
        if params is not None:
            ax.text(7.1, y + 0.35, f"{params:,} parameters" if params else "no parameters", va="center", fontsize=8)
        if k:
            ax.add_patch(FancyArrowPatch((3.6, y - 0.35), (3.6, y - 0.02), arrowstyle="-|>", mutation_scale=10))
    total = n["one layer"]
    ax.text(0.3, -0.45, f"one layer: {total:,} parameters; attention {attention:,} ({attention / total:.0%}), "
            f"feed-forward {ffn:,} ({ffn / total:.0%}), LayerNorms {total - attention - ffn:,}; "
            f"x {n['layers']} layers", fontsize=8)
    ax.set_title(f"one layer block of all-MiniLM-L6-v2 ({n['model']:,} parameters in all)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def word_vectors(word: str, senses: dict) -> tuple[np.ndarray, list, list]:
    """[n, H] last-layer vectors of `word` in each sentence, its sense and its sentence."""
    vectors, labels, texts = [], [], []
    for sense, sentences in senses.items():
        split = [s.split() for s in sentences]
        for words, per_word in zip(split, bertkit.embed(split, layers="last", pooling="words")):
            vectors.append(per_word[words.index(word)])
            labels.append(sense)
            texts.append(" ".join(words))
    return np.stack(vectors), labels, texts


def pca_2d(x: np.ndarray) -> np.ndarray:
    """The rows of x on their first two principal components (SVD of the centred rows)."""
    centred = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return centred @ vt[:2].T


def contextual_embeddings(path: Path, senses: dict = SENSES) -> Path:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(senses), figsize=(5.2 * len(senses), 4.6))
    for ax, (word, by_sense) in zip(np.atleast_1d(axes), senses.items()):
        vectors, labels, texts = word_vectors(word, by_sense)
        xy = pca_2d(vectors)
        for colour, sense in zip(COLOURS, by_sense):
            keep = [i for i, s in enumerate(labels) if s == sense]
            ax.scatter(xy[keep, 0], xy[keep, 1], c=colour, label=sense, s=40)
        for (x, y), text in zip(xy, texts):
            ax.annotate(text, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set_title(f'"{word}": last layer, 2-D PCA', fontsize=10)
        ax.legend(fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent), help="folder for the PNGs (default: docs/)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    for made in (attention_heads(out / "guide_attention_heads.png"), layer_block(out / "guide_layer_block.png"),
                 contextual_embeddings(out / "guide_contextual_embeddings.png")):
        print(f"wrote {made}")


if __name__ == "__main__":
    main()
