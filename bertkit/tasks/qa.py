"""Fine-tuning extractive question answering (SQuAD): question + context -> the answer's span.

BERT paper section 4.2 and google-research/bert `run_squad.py`: a few epochs of
BertForQuestionAnswering over windows of `[CLS] question [SEP] context [SEP]`
whose labels are the answer's first and last piece (both [CLS] in a window
without the whole answer, or for an unanswerable SQuAD v2 question); each epoch
is scored by SQuAD's exact match and F1 on the dev questions. The windows, the
answer lookup and the n-best decoding, all that using a QA model needs, are
`bertkit.tasks.qa_inference`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from bertkit.data.squad import read_squad
from bertkit.errors import BertkitError
from bertkit.tasks.batching import run_model
from bertkit.tasks.qa_inference import SETTINGS, best_answers, make_features, score
from bertkit.tasks.registry import task_for
from bertkit.tasks.run import load_head, load_tokenizer, saver, settle, write_json, write_lines
from bertkit.tasks.trainer import train
from bertkit.model.heads import BertForQuestionAnswering


def answer(model, tok, examples, cfg, progress=False) -> list[dict]:
    """Each example's answer (`best_answers`) read as `cfg` (a `bertkit.tasks.config.QAConfig`) says."""
    feats, _ = make_features(tok, examples, cfg, training=False)
    out = run_model(model, feats, cfg.training.eval_batch_size, outputs=("start_logits", "end_logits"),
                    per_token=True, progress=progress, desc="eval")
    return best_answers(examples, feats, out["start_logits"], out["end_logits"], cfg)


def finetune_qa(cfg, log=print, speed=None) -> dict:
    """Fine-tune as `cfg` (a `bertkit.tasks.config.QAConfig`) says; the final metrics (metrics.json's)."""
    settle(cfg, log)
    tcfg = cfg.training
    task_for(cfg).settle_metric(cfg)
    train_ex, rep = read_squad(cfg.train, articles=cfg.train_articles, max_examples=cfg.max_train_examples)
    log(rep.summary() + (f" (articles {cfg.train_articles})" if cfg.train_articles else ""))
    dev_ex = None
    if cfg.dev:
        dev_ex, rep = read_squad(cfg.dev, articles=cfg.dev_articles, max_examples=cfg.max_dev_examples)
        log(rep.summary() + (f" (articles {cfg.dev_articles})" if cfg.dev_articles else ""))
        if cfg.dev == cfg.train and set(e.id for e in dev_ex) & set(e.id for e in train_ex):
            raise BertkitError("the train and dev questions overlap: give --train-articles and --dev-articles "
                               "slices that do not overlap (e.g. 0:40 and 40:48)")
    for path, examples in ((cfg.train, train_ex), (cfg.dev, dev_ex or [])):  # v1 scoring has no empty answer
        if not cfg.version_2 and any(e.is_impossible for e in examples):
            raise BertkitError(f"{path} has unanswerable questions (SQuAD v2): pass --version-2-with-negative")

    tok = load_tokenizer(cfg.model, cfg.max_length)
    model = load_head(BertForQuestionAnswering, cfg.model, tcfg.seed, log)
    feats, skipped = make_features(tok, train_ex, cfg, training=True)
    if skipped:
        log("training questions: " + ", ".join(f"{n} {why}" for why, n in skipped.items()))
    log(f"qa: {len(train_ex)} questions -> {len(feats)} windows (max_length {cfg.max_length}, "
        f"doc_stride {cfg.doc_stride})")

    figures = task_for(cfg).metrics  # an epoch's record: SQuAD v2's HasAns/NoAns split is in metrics.json's dev

    def evaluate(m):
        preds = answer(m, tok, dev_ex, cfg, tcfg.progress)
        return {k: v for k, v in score(dev_ex, preds, cfg.version_2).items() if k in figures}, preds

    info = {"task": "qa", **{k: getattr(cfg, k) for k in SETTINGS},
            "config": {k: v for k, v in asdict(cfg).items() if k != "training"}}
    out = Path(cfg.output)
    empty = score(dev_ex, [{"answer": ""}] * len(dev_ex), cfg.version_2).get(tcfg.metric) if dev_ex else None
    result = train(model, feats, tcfg, evaluate=evaluate if dev_ex else None, save=saver(out, tok, info),
                   output_dir=out, pad_id=tok.pad_token_id, run_config=asdict(cfg), log=log,
                   baseline=None if empty is None else (empty, "always the empty answer"), speed=speed)
    if not result.is_main:
        return {}
    final = {"task": "qa", "train_questions": len(train_ex), "train_windows": len(feats),
             "train_skipped": dict(skipped), "train_seconds": round(result.seconds, 1), "epochs": result.history,
             **result.saved}  # which epoch the saved model is, and why
    if dev_ex:
        preds = result.best_predictions or answer(model, tok, dev_ex, cfg)  # a resumed run may lack them
        final["dev"] = score(dev_ex, preds, cfg.version_2)
        final["dev_questions"] = len(dev_ex)
        answers = {ex.id: p["answer"] for ex, p in zip(dev_ex, preds)}  # SQuAD's predictions file: id -> answer
        write_lines(out / "dev_predictions.json", [json.dumps(answers, indent=1, ensure_ascii=False)])
        if len(answers) < len(dev_ex):  # a hand-made file numbering each paragraph's questions: said, not silent
            left = len(dev_ex) - len(answers)
            log(f"{out / 'dev_predictions.json'} keeps one answer per id (SQuAD's format): dev questions left out "
                f"of it (their id repeats an earlier one's): {left} of {len(dev_ex)}; the figures score every question")
    write_json(out / "metrics.json", final)
    return final
