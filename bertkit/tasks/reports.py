"""The readable summary of a fine-tuning run, one function per kind of task.

Each takes the run's final metrics (what OUTPUT/metrics.json holds) and gives
the lines `bertkit finetune` prints at the end; the task's record
(`bertkit.tasks.registry`) names its own. Plain formatting: no torch. A figure is said as every report says it
(`bertkit.errors.figure`: 4 decimals, or "undefined").
"""

from bertkit.errors import figure, undefined


def text_report(final: dict) -> str:
    """classify, pair, regression, multi-label: the metrics, per-label scores and the confusion matrix."""
    dev = final.get("dev")
    if not dev:
        return f"trained on {final['train_examples']} examples in {final['train_seconds']} s (no dev set)"
    return "\n".join([f"dev ({final['dev_examples']} examples): {format_metrics(dev)}", *label_tables(dev)])


def format_metrics(metrics: dict) -> str:
    """`name value` for every number of a metrics dict (nested reports left out, a regression's held_out_loss
    said once, as its mse), as `bertkit.errors.figure` says it (None or nan: "undefined", a regression's
    correlation with one constant score); two labels' f1 named `f1 (LABEL)`. finetune's dev line (`text_report`)
    and predict's evaluation line (the same metrics, of a labelled file) both say theirs so."""
    named = {"f1": f"f1 ({metrics['f1_label']})"} if "f1_label" in metrics else {}
    return ", ".join(f"{k} {v}" if isinstance(v, int)  # an int is a count (SQuAD v2's HasAns_total)
                     else f"{named.get(k, k)} {figure(v)}" for k, v in metrics.items()
                     if (v is None or isinstance(v, (int, float))) and k != "support" and not said_as_mse(k, metrics))


def said_as_mse(key: str, metrics: dict) -> bool:
    """A regression's held_out_loss is its mse (the squared error it trains on): metrics.json keeps both keys
    (--metric takes either), a printed line says the figure once, as mse."""
    return key == "held_out_loss" and "mse" in metrics


# a confusion matrix wider than this (characters) heads its columns with the labels' numbers, not their names
MATRIX_WIDTH = 100


def label_tables(scores: dict) -> list[str]:
    """A classifier's scores of a labelled set (finetune's dev set, predict's labelled file): per label its
    precision, recall, F1 and support, then the confusion matrix, labels by name; [] without them (regression,
    multi-label). Columns are as wide as the names; many or long names number the matrix's columns (its rows keep
    the names, numbered), so that 14 topics still fit a terminal."""
    if "per_label" not in scores:
        return []
    per_label, cm = scores["per_label"], scores["confusion_matrix"]
    w = max(5, *(len(n) for n in per_label))
    lines = [f"{'label':<{w}} {'precision':>9} {'recall':>7} {'f1':>7} {'support':>7}"]
    lines += [f"{name:<{w}} {r['precision']:9.3f} {r['recall']:7.3f} {r['f1']:7.3f} {r['support']:7d}"
              for name, r in per_label.items()]
    return lines + absent_labels(per_label, cm) + confusion_lines(cm)


def confusion_lines(cm: dict) -> list[str]:
    """The confusion matrix (`rows_gold_columns_predicted`), each column as wide as its head and its counts."""
    names, rows = cm["labels"], cm["rows_gold_columns_predicted"]
    digits = len(str(max(map(max, rows))))
    heads, gap, title = names, 2, "confusion matrix (rows: gold, columns: predicted)"
    if max(map(len, names)) + sum(max(len(n), digits) + gap for n in names) > MATRIX_WIDTH:
        heads, gap = [str(i) for i in range(1, len(names) + 1)], 1
        names = [f"{i:>{len(heads[-1])}} {n}" for i, n in enumerate(names, 1)]
        title = "confusion matrix (rows: gold, columns: predicted, numbered as the rows)"
    w = max(map(len, names))
    widths = [max(len(h), digits) + gap for h in heads]
    lines = [title, " " * w + "".join(f"{h:>{c}}" for h, c in zip(heads, widths))]
    return lines + [f"{n:<{w}}" + "".join(f"{k:>{c}}" for k, c in zip(row, widths)) for n, row in zip(names, rows)]


def absent_labels(per_label: dict, cm: dict) -> list[str]:
    """A line for the trained labels the scored set (a dev set, a labelled file) lacks (support 0), which the
    table lists as it lists the others: never predicted either, such a label has no F1 and macro_f1 leaves it out
    (`bertkit.metrics.tasks.per_label_report`); predicted, its F1 of 0 counts in it."""
    predicted = dict(zip(cm["labels"], (sum(col) for col in zip(*cm["rows_gold_columns_predicted"]))))
    absent = [name for name, r in per_label.items() if r["support"] == 0]
    left_out = [name for name in absent if not predicted.get(name)]
    counted = [name for name in absent if predicted.get(name)]
    lines = []
    if left_out:
        lines.append(f"no gold example (support 0) and never predicted, left out of macro_f1: {', '.join(left_out)}")
    if counted:
        lines.append(f"no gold example (support 0) but predicted, counted in macro_f1 with f1 0: {', '.join(counted)}")
    return lines


def ner_report(final: dict) -> str:
    """NER: entity precision, recall and F1 on dev (and test), and per entity type."""
    lines = []
    for split in ("dev", "test"):
        if split not in final:
            continue
        s = final[split]
        lines.append(f"{split} ({final[split + '_sentences']} sentences): entity precision {s['precision']:.4f}, "
                     f"recall {s['recall']:.4f}, F1 {s['f1']:.4f}")
        lines += type_lines(s)
    return "\n".join(lines) or f"trained on {final['train_sentences']} sentences (no dev set)"


def type_lines(scores: dict) -> list[str]:
    """NER's scores of a tagged set: each entity type's precision, recall, F1 and count (conlleval's per_type)."""
    w = max((len(t) for t in scores.get("per_type", ())), default=0)
    return [f"  {typ:>{max(w, 8)}}: precision {r['precision']:.3f} recall {r['recall']:.3f} f1 {r['f1']:.3f} "
            f"({r['support']} entities)" for typ, r in scores.get("per_type", {}).items()]


def no_tables(scores: dict) -> list[str]:
    """A task whose figures have no table beside them (QA's HasAns/NoAns are figures of their own)."""
    return []


def qa_report(final: dict) -> str:
    """QA: SQuAD's exact match and F1 on dev (v2: also of the questions with and without an answer)."""
    dev = final.get("dev")
    if not dev:
        return "trained (no dev set)"
    lines = [f"dev: exact match {dev['exact_match']:.2f}, F1 {dev['f1']:.2f}"]
    for name in ("HasAns", "NoAns"):  # SQuAD v2.0's split, named as its script names it
        if f"{name}_total" in dev:
            n = dev[f"{name}_total"]
            lines.append(f"  {name} ({n} question{'s' * (n != 1)}): exact match {dev[name + '_exact']:.2f}, "
                         f"F1 {dev[name + '_f1']:.2f}")
    return "\n".join(lines)


def embed_report(final: dict) -> str:
    """Sentence embeddings: the loss and pooling, the best epoch's dev scores and the change training made."""
    dev = final.get("dev")
    head = (f"trained on {final['train_examples']} examples ({final['loss']}, {final['pooling']} pooling) "
            f"in {final['train_seconds']} s")
    if not dev:
        return head + " (no dev set)"
    # None: a correlation of a model giving every pair one cosine
    shown = ", ".join(f"{k} {figure(v)}" for k, v in dev.items()
                      if (isinstance(v, float) or v is None) and not k.endswith("seconds"))
    lines = [head, f"dev (best epoch {final['best_epoch']}): {shown}"]
    before, metric = final.get("dev_before_training"), final.get("metric")
    if before is not None and metric in before and metric in dev:
        was, now = before[metric], dev[metric]
        change = "" if undefined(was) or undefined(now) else f" ({now - was:+.4f})"
        lines.append(f"dev {metric} before training {figure(was)}, after {figure(now)}{change}")
        if change and now < was:  # the kept epoch is the best of the trained ones, not of the start
            lines.append(f"warning: the saved model scores below the model it started from on this dev set "
                         f"({metric}): the starting model is the better one here; train with other settings "
                         "(a lower --learning-rate, fewer --epochs) or keep it")
    return "\n".join(lines)


def rerank_report(final: dict) -> str:
    """A reranker: its training pairs and, evaluated on --dev, nDCG@10 before and after reranking."""
    n, made = final["train_examples"], final.get("pairs_made", final["train_examples"])
    cut = f" of the {made} made" if made != n else ""  # --max-train-examples: the counts are of all those made
    lines = [f"trained on {n}{cut} pairs ({json_counts(final['pairs'])}) in {final['train_seconds']} s"]
    figures = final.get("retrieval")
    if not figures:
        return lines[0] + " (no --dev: no retrieval figures recorded)"
    before, after = figures["before"]["ndcg@10"], figures["after"]["ndcg@10"]
    lines.append(f"{figures['dataset']} split {figures['split']} ({figures['queries']} queries), top "
                 f"{figures['rerank_top']} of {figures['first_stage']}: nDCG@10 {before:.4f} before reranking, "
                 f"{after:.4f} after ({after - before:+.4f})")
    if after < before:
        lines.append("warning: this reranker lowers nDCG@10 on the dev split; search --rerank and serve --rerank "
                     "will say so when they load it")
    return "\n".join(lines)


def json_counts(counts: dict) -> str:
    return ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items())
