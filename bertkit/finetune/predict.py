"""Using a fine-tuned model: `predict(model_dir, texts)` and `bertkit predict`.

The output directory of `bertkit finetune` is a Hugging Face checkpoint plus
`bertkit_task.json`, which says how inputs were encoded (task, max_length,
stride, columns). Prediction loads both and encodes new inputs the same way:

- classify / pair / multi_label: {"label", "probabilities": {name: p}} (or
  {"labels", ...}); regression: {"score"};
- ner: each text is split on whitespace into words -> {"words", "tags"};
- qa: `texts` are questions and `pairs` their contexts -> {"answer", "start", "end", "score"}.

A checkpoint without `bertkit_task.json` (e.g. one made by transformers) is
read from its config.json `architectures`.
"""

from __future__ import annotations

import json
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.finetune.data import TextExample, read_conll, read_rows, ReadReport
from bertkit.finetune.run import read_task_info
from bertkit.textfiles import existing_file, read_text


def load(model_dir):
    """(model, tokenizer, task info) from a fine-tuned output directory."""
    from bertkit import heads
    from bertkit.linear import pack_weights
    from bertkit.tokenizer import Tokenizer

    model_dir = Path(model_dir)
    info = read_task_info(model_dir)
    cls = {"ner": heads.BertForTokenClassification, "qa": heads.BertForQuestionAnswering}.get(
        info["task"], heads.BertForSequenceClassification)
    model = pack_weights(cls.from_pretrained(model_dir).eval())  # loaded here for inference only
    return model, Tokenizer.from_pretrained(model_dir), info


def predict(model_dir, texts, pairs=None, *, batch_size: int = 32, loaded=None) -> list[dict]:
    """Predictions for `texts` (and `pairs`, the second texts or QA contexts), one dict each."""
    if isinstance(texts, str):
        raise BertkitError("predict takes a list of texts; wrap a single text in a list")
    texts = list(texts)
    if pairs is not None:
        pairs = list(pairs)
        if len(pairs) != len(texts):
            raise BertkitError(f"{len(texts)} texts but {len(pairs)} pairs; give one second text per text")
    model, tok, info = loaded or load(model_dir)
    task = info["task"]
    if task == "ner":
        from bertkit.finetune.ner import predict_words

        sentences = [t.split() for t in texts]
        tags = predict_words(model, tok, sentences, info, batch_size)
        return [{"words": w, "tags": t} for w, t in zip(sentences, tags)]
    if task == "qa":
        from bertkit.finetune.qa import predict_answers

        if pairs is None:
            raise BertkitError("a QA model needs contexts: pass pairs=[context, ...] (one per question)")
        return predict_answers(model, tok, texts, pairs, info, batch_size)
    from bertkit.finetune.classification import predict_examples

    if info.get("text_pair_column") and pairs is None:
        raise BertkitError("this model was trained on sentence pairs: pass pairs=[second text, ...]")
    examples = [TextExample(t, None if pairs is None else pairs[i]) for i, t in enumerate(texts)]
    names = model.config.labels if task != "regression" else None
    return predict_examples(model, tok, examples, task, names, info.get("max_length", 512), info.get("stride", 0),
                            batch_size)


# --- files -----------------------------------------------------------------

def read_inputs(path, info: dict, text_column=None, text_pair_column=None) -> tuple[list[str], list[str] | None]:
    """Texts (and pairs) from an input file, with the columns the model was trained on."""
    path = existing_file(path)
    task = info["task"]
    if task == "ner" and path.suffix.lower() not in (".tsv", ".csv", ".jsonl", ".json"):
        if looks_like_conll(path):  # one token per line (first column), blank lines between sentences
            sentences, _ = read_conll(path, tagged=False)
            return [" ".join(s.words) for s in sentences], None
        lines = [line.strip() for line in read_text(path).split("\n")]
        return [line for line in lines if line], None  # one sentence per line, words split on whitespace
    if task == "qa" and path.suffix.lower() == ".json":
        from bertkit.finetune.data import read_squad

        examples, _ = read_squad(path)
        return [e.question for e in examples], [e.context for e in examples]
    tcol = text_column or (info.get("text_column") or "sentence")
    pcol = text_pair_column or info.get("text_pair_column")
    if task == "qa":
        tcol, pcol = text_column or "question", text_pair_column or "context"
    report = ReadReport(str(path))
    texts, pairs = [], []
    for n, row in read_rows(path, report):
        if tcol not in row or (pcol and pcol not in row):
            missing = tcol if tcol not in row else pcol
            raise BertkitError(f"{path}:{n}: no column {missing!r} (columns: {', '.join(row)}); pass --text-column/--text-pair-column")
        texts.append(str(row[tcol]))
        if pcol:
            pairs.append(str(row[pcol]))
    if report.skipped:
        print(report.summary())
    return texts, (pairs if pcol else None)


def looks_like_conll(path) -> bool:
    """CoNLL columns start with -DOCSTART- or have blank lines between sentences; else one sentence per line."""
    text = read_text(path)
    blocks = [b for b in text.strip().split("\n\n") if b.strip()]
    return text.lstrip().startswith("-DOCSTART-") or len(blocks) > 1


def predict_file(model_dir, input_path, output_path=None, *, text_column=None, text_pair_column=None,
                 batch_size: int = 32) -> tuple[Path, int]:
    """Write one prediction per input row as TSV (text, prediction, details)."""
    loaded = load(model_dir)
    info = loaded[2]
    texts, pairs = read_inputs(input_path, info, text_column, text_pair_column)
    if not texts:
        raise BertkitError(f"{input_path}: no inputs to predict")
    preds = predict(model_dir, texts, pairs, batch_size=batch_size, loaded=loaded)
    out = Path(output_path) if output_path else Path(input_path).with_suffix(".predictions.tsv")
    with open(out, "w", encoding="utf-8") as f:
        f.write("text\tprediction\tdetails\n")
        for t, p in zip(texts, preds):
            if "tags" in p:
                pred, details = " ".join(p["tags"]), ""
            elif "answer" in p:
                pred, details = p["answer"], json.dumps({k: p[k] for k in ("start", "end", "score")})
            elif "score" in p:
                pred, details = f"{p['score']:.4f}", ""
            else:
                pred = p["label"] if "label" in p else ",".join(p["labels"])
                details = " ".join(f"{k}={v:.4f}" for k, v in p["probabilities"].items())
            f.write("\t".join(x.replace("\t", " ").replace("\n", " ") for x in (t, pred, details)) + "\n")
    return out, len(preds)
