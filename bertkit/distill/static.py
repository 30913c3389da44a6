"""Distil a sentence model into a static table: Model2Vec's recipe (Tulkens & van Dongen 2024).

    every vocabulary token t:   [CLS] t [SEP] --the model, its own pooling--> v_t [H]
    the table [V, H]            --PCA to --dim--> [V, D] (centred, eigenvectors of the covariance)
    each row                    x  a / (a + p(t))   (SIF: Arora et al. 2017)

p(t) is Zipf's law over the vocabulary's order (p ~ 1 / (rank + 1): BERT's WordPiece
vocabulary lists frequent pieces first), as model2vec's `compute_weights` estimates it, or
with `--corpus` the token's frequency in that corpus, SIF's own estimate. With `--corpus`
its frequent whole words that WordPiece cuts into pieces are added to the vocabulary and
go through the model whole (model2vec's `vocabulary`): WordPiece's longest-match-first
then reads them as one token, so "unaffable" gets its own vector instead of the mean of
un, ##aff, ##able.

As model2vec does, the [unusedN] tokens and [CLS]/[SEP]/[MASK] (which a static model
never sees: it adds no special tokens) take no part; their rows are zeros. So does [UNK]:
an unknown piece's vector is noise, and model2vec drops it from a text's mean; a zero row
leaves the mean's direction as if it were dropped, so the normalised vectors agree with
model2vec's reading and sentence-transformers' alike (which keeps every id). A text is cut at
--max-length tokens (512, model2vec's default), written as tokenizer.json's truncation, where
sentence-transformers' tokenizer cuts too (`bertkit.model.static`). Deviation:
model2vec removes them from the vocabulary (its ids shift); we keep every id, so the
teacher's tokenizer is the static model's, and a folder written here keeps the
teacher's vocabulary with the added words after it. The table is saved as a
sentence-transformers StaticEmbedding folder with a Normalize module (model2vec
normalises too), which `SentenceTransformer(OUT)` loads and `bertkit.runtime.loading`
runs (`bertkit.embeddings.static`). PCA follows model2vec's `_pca_fit_transform`
(eigh of the covariance in float64, each component's sign set so its largest
projection is positive); a test checks both steps against model2vec's functions.

Shapes: V vocabulary (+ added words), H the model's width, D = --dim <= H.
"""

from __future__ import annotations

import collections
import re
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from bertkit.data.atomic import write_folder
from bertkit.data.textfiles import numbered_texts, read_texts
from bertkit.distill.config import StaticDistillConfig
from bertkit.distill.fit import fit_table
from bertkit.distill.layers import cached_targets
from bertkit.embeddings.features import sentence_vectors
from bertkit.errors import BertkitError
from bertkit.model.static import StaticEmbedding, save_static
from bertkit.runtime.loading import load, resolve
from bertkit.text.basic_tokenizer import basic_words
from bertkit.text.tokenizer_json import write_tokenizer_json

UNUSED = re.compile(r"\[unused\d+\]")
NOT_DISTILLED = ("[CLS]", "[SEP]", "[MASK]", "[UNK]")  # a static model adds none of the first three; [UNK]: below


def pca_basis(table: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The mean [H] and the top `dim` components [H, dim] (float64) of the rows of `table` [V, H]: the
    covariance's eigenvectors, largest eigenvalue first, each component's sign chosen so that its largest
    absolute projection is positive (model2vec's rule)."""
    x = table.astype(np.float64)
    mean = x.mean(axis=0)
    x = x - mean
    values, vectors = np.linalg.eigh(x.T @ x / (len(x) - 1))
    components = vectors[:, ::-1][:, :dim]  # [H, dim], largest eigenvalue first
    scores = x @ components
    biggest = np.argmax(np.abs(scores), axis=0)
    return mean, components * np.sign(scores[biggest, np.arange(dim)])


def project(vectors: np.ndarray, basis: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """[N, H] -> [N, dim]: vectors centred on the basis's mean and projected on its components."""
    mean, components = basis
    return ((vectors.astype(np.float64) - mean) @ components).astype(np.float32)


def pca(table: np.ndarray, dim: int) -> np.ndarray:
    """[V, H] -> [V, dim]: the centred rows projected on the covariance's top `dim` eigenvectors."""
    return project(table, pca_basis(table, dim))


def zipf_probabilities(n: int) -> np.ndarray:
    """p(rank) proportional to 1 / (rank + 2) for ranks 0..n-1 (model2vec's estimate)."""
    inv = 1.0 / np.arange(2, n + 2)
    return inv / inv.sum()


def sif_weights(probabilities: np.ndarray, a: float) -> np.ndarray:
    """a / (a + p): frequent tokens count less in the mean (SIF)."""
    return a / (a + probabilities)


def corpus_texts(files, option: str = "--corpus") -> list[str]:
    """Every text of the files given to `option`; an error when there is none."""
    texts = []
    for name in files:
        lines, _ = read_texts(name)
        texts.extend(t for t in lines if t.strip())
    if not texts:
        raise BertkitError(f"{option} {' '.join(map(str, files))} holds no text: give files with one text per "
                           "line (or .tsv/.jsonl)")
    return texts


def check_tokens(tok, texts: list, path) -> None:
    """Refuse a text of `path` (what `corpus_texts` read from it) that yields no tokens, naming its line: the
    model has no vector for it to fit (checked before the distillation, which takes minutes)."""
    _, lengths = tok.ids_batch(texts)
    if 0 in lengths:
        k = lengths.index(0)
        number = next(n for i, (n, _) in enumerate((n, t) for n, t in numbered_texts(path)() if t.strip()) if i == k)
        raise BertkitError(f"{path}:{number}: text {texts[k][:40]!r} yields no tokens: it holds only characters BERT "
                           "drops (controls, zero-width marks); remove the line or give it words")


def frequent_words(tok, texts: list, max_words: int, min_count: int) -> list[str]:
    """The corpus's words (as the basic tokenizer cuts and normalises them) that WordPiece splits into
    several pieces, seen at least `min_count` times, most frequent first, at most `max_words`."""
    chunks = collections.Counter(c for text in texts for c in text.split())
    words = collections.Counter()
    for chunk, n in chunks.items():
        for word, _ in basic_words(chunk, tok.lowercase, tok.strip_accents, tok.tokenize_chinese_chars):
            words[word] += n
    ranked = [w for w, n in words.most_common() if n >= min_count and w not in tok.vocab
              and len(w) <= tok.max_input_chars_per_word and len(tok.tokenize(w)) > 1]
    return ranked[:max_words]


def token_inputs(tok, n_vocab: int, words: list) -> list[list[int]]:
    """What the model reads for each row: [CLS] t [SEP] for a vocabulary token, [CLS] its pieces [SEP]
    for an added word."""
    rows = [[tok.cls_token_id, i, tok.sep_token_id] for i in range(n_vocab)]
    return rows + [[tok.cls_token_id, *tok.ids_batch([w])[0], tok.sep_token_id] for w in words]


class _Row:
    __slots__ = ("input_ids", "token_type_ids")

    def __init__(self, ids):
        self.input_ids, self.token_type_ids = ids, [0] * len(ids)


def teacher_vectors(loaded, inputs: list, batch_size: int, progress: bool) -> np.ndarray:
    """[len(inputs), H]: each input through the model, pooled as the model pools (its layout), as `bertkit embed`
    runs and pools a batch (`bertkit.embeddings.features.sentence_vectors`)."""
    pooling = loaded.layout.pooling if loaded.layout is not None else "mean"  # `teacher_pooling`
    with tqdm(total=len(inputs), unit="token", desc="distil", disable=not progress) as bar:
        rows = sentence_vectors(loaded.model, [_Row(ids) for ids in inputs], "last", None,
                                loaded.tokenizer.pad_token_id, batch_size, bar, False, pooling)
    return np.stack(rows).astype(np.float32, copy=False)


def teacher_pooling(loaded, model, log) -> str:
    """How the teacher's token vectors are pooled: its sentence-transformers layout's pooling, else the mean, as
    `bertkit embed` pools a folder without one. Such a folder is no sentence model (a pre-training run, a plain
    encoder): its MLM/NSP heads take no part, and one line says what is distilled instead of nothing, as if it
    were a sentence model."""
    if loaded.layout is not None:
        return loaded.layout.pooling
    log(f"{model}: no sentence-transformers layout (modules.json), so not a sentence model (e.g. a pre-training "
        "run): distilling its encoder's last layer, mean-pooled as `bertkit embed` reads it (MLM/NSP heads unused); "
        "a sentence model (bertkit finetune embed's output) makes a better table")
    return "mean"


def _probabilities(tok, keep: np.ndarray, texts: list | None) -> np.ndarray:
    """p(t) for the kept rows: the corpus's token frequencies, else Zipf over the vocabulary order."""
    p = np.zeros(len(tok), dtype=np.float64)
    if texts is None:
        p[keep] = zipf_probabilities(int(keep.sum()))
        return p
    ids, _ = tok.ids_batch(texts)
    counts = np.bincount(np.asarray(ids, dtype=np.int64), minlength=len(tok)).astype(np.float64)
    return counts / max(counts.sum(), 1.0)


def _check_output(output, overwrite: bool = False, teacher=None) -> Path:
    """-o, refused before the model loads: a file, a folder that holds something (unless --overwrite), or the
    teacher's own folder (which --overwrite would replace with its student)."""
    output = Path(output)
    if output.exists() and (not output.is_dir() or (any(output.iterdir()) and not overwrite)):
        raise BertkitError(f"{output} already exists and is not an empty folder: choose a new -o folder"
                           + ("" if not output.is_dir() else ", or pass --overwrite to replace it"))
    if overwrite and teacher and output.is_dir() and output.resolve() == Path(teacher).resolve():
        raise BertkitError(f"{output} is the folder of the model being distilled: --overwrite would replace it with "
                           "its student; choose another -o folder")
    return output


def _save(model: StaticEmbedding, tok, output: Path, about: dict | None = None, overwrite: bool = False) -> None:
    """Write the folder beside `output`, then move it into place (`write_folder`): a killed run leaves no half
    folder. A folder already there (--overwrite) is replaced once the new one is whole."""
    try:
        with write_folder(output, replace=overwrite) as work:
            write_tokenizer_json(tok, save_static(model, work, about), model.config.max_length)
    except FileExistsError as err:  # two `distill static -o X` at once (--overwrite or not): the other wrote X first
        if err.filename2 is None:
            raise
        raise BertkitError(f"{output} was written by another process while this one ran (or is being written by "
                           f"it now); this run's model is kept in {err.filename2}: move it to a new folder"
                           f"{' (or over ' + str(output) + ')' if overwrite else ''}") from None


def distill_static(model=None, output=None, config: StaticDistillConfig = StaticDistillConfig(), *,
                   progress: bool = True, fast=True, log=print) -> dict:
    """Distil `model` (None: the default model; a model folder) into a static model saved at `output`
    (a sentence-transformers StaticEmbedding folder), fitted to its sentence vectors on `config.fit`'s texts
    when given. Returns what was done: rows, words added, the fit's loss before and after, seconds.
    fast: the encoder's fast-path settings (`bertkit.runtime.loading.load`)."""
    config.validate()
    output = _check_output(output, config.overwrite, resolve(model) if model is None else model)  # None: the default
    texts = corpus_texts(config.corpus) if config.corpus else None
    fit_texts = corpus_texts([config.fit], "--fit") if config.fit else None  # read first: a bad file fails early
    start = time.perf_counter()
    loaded = load(model, head="encoder", dtype=config.dtype, fast=fast)
    loaded.need_layers("distill static")
    if loaded.fine_tuned:  # head="encoder" loads its encoder as "embed": the task is in its info
        raise BertkitError(f"{model} is a fine-tuned {loaded.info.get('task', 'task')} model: distill static needs a "
                           "sentence model's vectors, e.g. the one it was fine-tuned from (fewer layers of this "
                           "model: bertkit distill layers)")
    pooling = teacher_pooling(loaded, model, log)
    width = loaded.config.hidden_size
    if config.dim > width:
        raise BertkitError(f"--dim {config.dim} is above the model's width ({width}): PCA keeps at most {width}")
    tok = loaded.tokenizer
    if fit_texts:
        check_tokens(tok, fit_texts, config.fit)
    words = frequent_words(tok, texts, config.max_words, config.min_count) if texts else []
    n_vocab = len(tok)
    student_tok = type(tok)(tok.ids_to_tokens + words, lowercase=tok.lowercase, strip_accents=tok.strip_accents,
                            tokenize_chinese_chars=tok.tokenize_chinese_chars,
                            max_input_chars_per_word=tok.max_input_chars_per_word)
    keep = np.array([not (UNUSED.fullmatch(t) or t in NOT_DISTILLED) for t in student_tok.ids_to_tokens])
    inputs = token_inputs(tok, n_vocab, words)
    kept = np.flatnonzero(keep)
    vectors = teacher_vectors(loaded, [inputs[i] for i in kept], config.batch_size, progress)
    if config.dim > len(kept) - 1:
        raise BertkitError(f"--dim {config.dim} needs more than {len(kept)} distilled tokens")
    table = np.zeros((len(student_tok), config.dim), dtype=np.float32)
    weights = sif_weights(_probabilities(student_tok, keep, texts), config.sif_coefficient)
    basis = pca_basis(vectors, config.dim)
    table[kept] = project(vectors, basis) * weights[kept, None].astype(np.float32)
    static = StaticEmbedding(torch.from_numpy(table), normalize=True)
    static.config.max_length = config.max_length or None
    fitted = _fit(loaded, static, student_tok, basis, fit_texts, config, progress, log) if fit_texts else {}
    _save(static, student_tok, output, {"fit": {k: fitted[k] for k in ("fit_texts", "fit_loss_after")}} if fitted else None,
          config.overwrite)
    return {"rows": len(table), "distilled": int(len(kept)), "words_added": len(words), "dim": config.dim,
            "pooling": pooling, **fitted,
            "seconds": round(time.perf_counter() - start, 1), "output": str(output)}


def _fit(loaded, static: StaticEmbedding, tok, basis, texts: list, config: StaticDistillConfig, progress: bool,
         log) -> dict:
    """--fit: the model's sentence vectors of its texts (cut where the model cuts), projected on the table's
    PCA basis, then the table fitted to them (`bertkit.distill.fit`)."""
    length = loaded.max_length
    vectors = cached_targets(loaded, texts, length, config.teacher_cache, config.teacher_dtype, progress, log)
    ids = tok.ids_lists(texts, length - 2)  # the word pieces the model saw between its [CLS] and [SEP]
    return fit_table(static, ids, project(vectors, basis), config.fit_training(progress), tok.pad_token_id, log)
