"""Remake the figures of docs/guide.md: `python docs/make_guide_figures.py [--out docs]`.

guide_attention_heads.png        the attention weights [T, T] of every head of one layer of the
                                 default model for the guide's sentence (bertkit.trace)
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
LAYER = 2  # 0-based, as bertkit.trace counts

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


def attention_heads(path: Path, text: str = SENTENCE, layer: int = LAYER) -> Path:
    import matplotlib.pyplot as plt

    t = bertkit.trace(text, layer=layer)
    N = t.num_heads
    cols = 4
    rows = (N + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 3.2, rows * 3.3))
    T = len(t.tokens)
    for h, ax in enumerate(axes.flat):
        if h >= N:
            ax.axis("off")
            continue
        ax.imshow(t.weights[h].numpy(), cmap="Blues", vmin=0, vmax=1)
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xticks(range(T))
        ax.set_yticks(range(T))
        ax.set_xticklabels(t.tokens, rotation=90, fontsize=6)
        ax.set_yticklabels(t.tokens, fontsize=6)
    fig.suptitle(f"layer {layer} of all-MiniLM-L6-v2: row = the token attending, column = the token attended to",
                 fontsize=10)
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
    for made in (attention_heads(out / "guide_attention_heads.png"),
                 contextual_embeddings(out / "guide_contextual_embeddings.png")):
        print(f"wrote {made}")


if __name__ == "__main__":
    main()
