"""Fine-tuning commands: `bertkit finetune TASK` (options built from the task's config
dataclass by `bertkit.options`), `bertkit predict` and `bertkit demo`."""

import argparse
import json
import sys
from functools import partial
from pathlib import Path

from bertkit.options import add_options, count, device_flags, finite_float, from_args, int8_flag, quiet_flag, seed
from bertkit.cli.demo import run_demo as demo
from bertkit.tasks import format_report, run_task, task_config
from bertkit.tasks.registry import TASKS, task_named
from bertkit.tasks.reports import format_metrics


# finetune scores its dev set in float32 (unless --precision): a figure in another precision may differ a little
PRECISION_NOTE = {"bfloat16": "; finetune scored in float32, which --dtype float32 reproduces",
                  "int8": "; finetune scored in float32, which predict without --int8 reproduces"}


def add_finetune(sub):
    p = sub.add_parser(
        "finetune",
        help="fine-tune a pretrained model on labelled data (classify, pair, regression, multi-label, ner, qa) "
        "or train sentence embeddings (embed)",
        description="Fine-tune BERT with a fresh task head; evaluates on --dev each epoch, keeps the best "
        "epoch as a Hugging Face checkpoint in --output, with metrics.json, metrics.jsonl, curves.png and dev "
        "predictions. Checkpoints let a killed run go on with --resume; launch under "
        "`torchrun --nproc_per_node N` for data-parallel training.",
        epilog="examples:\n"
        "  bertkit finetune classify --train train.tsv --dev dev.tsv --output out/sst2\n"
        "  bertkit finetune pair --train mrpc/train.tsv --dev mrpc/dev.tsv --output out/mrpc\n"
        "  bertkit finetune regression --train stsb/train.tsv --dev stsb/dev.tsv --text-column sentence1 "
        "--text-pair-column sentence2 --label-column score --output out/stsb\n"
        "  bertkit finetune ner --train conll/train.txt --dev conll/dev.txt --tag-scheme iob1 --output out/ner\n"
        "  bertkit finetune qa --train dev-v1.1.json --train-articles 0:40 --dev dev-v1.1.json "
        "--dev-articles 40:48 --output out/squad\n"
        "  bertkit finetune embed --train scifact/ --dev scifact/ --dev-split test --output out/emb\n"
        "  bertkit finetune classify --output out/sst2 --resume   # after a crash or a kill",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tsub = p.add_subparsers(dest="task", metavar="TASK", required=True)
    for task in TASKS.values():  # one command per task record
        t = tsub.add_parser(task.cli_name, help=task.help or f"fine-tune for {task.cli_name}", description=task.help)
        add_options(t, task.config, task.defaults, skip=task.hidden,
                    notes={"metric": f"; --dev gives {', '.join(task.metrics)}"})
        t.set_defaults(handler=run_finetune, runs_model=True, torchrun=True, outputs={"--output": "folder"})


def run_finetune(args):
    cls, defaults = task_config(args.task, vars(args))  # e.g. --static: the static recipe's defaults on top
    cfg = from_args(args, cls, {**defaults, **dict.fromkeys(cls.FITTED)})  # not given: fitted to the model (settle)
    if args.resume and not cfg.dev and getattr(args, "metric", None) is None:
        # a run saved by an earlier bertkit without --dev holds its task's default metric, never scored:
        # resume it as it ran (a --metric given now without --dev is still refused)
        cfg.training.metric = None
    final = run_task(cfg, speed=args.speed)
    report = format_report(final)
    if report:  # not on the other processes of a torchrun
        print(report)
        saved = final.get("saved")
        print(f"saved epoch {saved['epoch']}'s model to {cfg.output}: {saved['because']}" if saved
              else f"saved the best epoch's model to {cfg.output}")


def add_predict(sub):
    p = sub.add_parser(
        "predict",
        help="run a fine-tuned model over a file, one prediction per input row (and score it if labelled)",
        description="Predict with a model saved by `bertkit finetune`. INPUT is a TSV/CSV/JSONL table "
        "with the columns the model was trained on (NER: also CoNLL or one sentence per line; "
        "QA: SQuAD JSON or a table with question and context columns). Evaluate mode: when INPUT also "
        "carries the answers (the label column, a CoNLL tag column, SQuAD answers) the predictions are "
        "scored too: accuracy and F1 (classification, then per label and the confusion matrix), Pearson and "
        "Spearman (regression), micro F1 (multi-label), entity F1 (NER, then per entity type), exact match and F1 "
        "(QA). Every row is predicted; a row without its answer "
        "(an empty label cell, a question without answers) is left out of the scores. A row whose text (or second "
        "text) is empty is skipped and counted; a text with no word piece (only characters BERT drops) is refused. "
        "The predictions are TSV. From a table (TSV, CSV, JSONL): each predicted row with its columns as they were, "
        "names and cells (the label, an id), then prediction and details; a column of INPUT named prediction or "
        "details stays as it was and the added one is prediction.1 (details.1), said in one line. From one text per "
        "line, CoNLL or SQuAD JSON: text (and the second text or QA context), prediction, details, and for SQuAD "
        "JSON the question's id last (what the official evaluation script maps to answers). A multi-label "
        "prediction's labels are joined by the separator the model was trained with (--label-separator, ','), or "
        "written as a JSON list where a label's name holds it. A classifier's details are its probabilities, "
        "'name=p' pairs separated by spaces, or a JSON object {name: p} where a label's name holds a space or '='. "
        "A NER prediction is a tag per word, separated by spaces, and its details those words, a JSON list: a "
        "text's words are the Penn Treebank's (punctuation around a word apart: 'Paris.' is Paris and ., 'U.S.' one "
        "word), a CoNLL file's its own.",
        epilog="examples:\n  bertkit predict out/sst2 new.tsv --output preds.tsv\n"
        "  bertkit predict out/sst2 dev.tsv            # dev.tsv has a label column: predicts and reports accuracy\n"
        "  bertkit predict out/ner conll/test.txt --device cuda",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model_dir", help="a fine-tuned output directory")
    p.add_argument("input", help="input file")
    p.add_argument("--output", "-o", help="where to write the predictions ('-': standard output; default: "
                   "INPUT's name + .predictions.tsv in the current directory, never over an existing file)")
    p.add_argument("--text-column", help="override the text column (default: the one the model was trained on; for "
                   "a Hugging Face checkpoint, 'sentence', else 'text', else the file's one column of text)")
    p.add_argument("--text-pair-column", help="override the second-text column")
    p.add_argument("--label-column", help="override the label column evaluate mode reads")
    p.add_argument("--evaluate", action=argparse.BooleanOptionalAction, default=None,
                   help="score the predictions against the answers in INPUT (default: whenever INPUT has them; "
                   "--evaluate: fail if it has none; --no-evaluate: only predict)")
    p.add_argument("--batch-size", type=count, default=32, help="rows per forward pass (default 32)")
    p.add_argument("--version-2-with-negative", dest="version_2", action="store_true", default=None,
                   help="QA: the model was trained on SQuAD v2, so a question may get no answer (''); for a Hugging "
                   "Face checkpoint, whose folder does not say (a bertkit folder says it itself)")
    quiet_flag(p)
    device_flags(p)
    int8_flag(p)
    p.set_defaults(handler=run_predict, runs_model=True, outputs={"--output": "file"})


def run_predict(args):
    from bertkit.tasks.predict import format_tables, predict_file

    to_stdout = args.output == "-"
    stream = sys.stderr if to_stdout else sys.stdout  # with --output - the predictions own standard output
    result = predict_file(args.model_dir, args.input, args.output, text_column=args.text_column,
                          text_pair_column=args.text_pair_column, label_column=args.label_column,
                          batch_size=args.batch_size, evaluate=args.evaluate, device=args.device, dtype=args.dtype,
                          int8=args.int8, fast=args.speed, log=partial(print, file=stream), progress=not args.quiet,
                          version_2=args.version_2)
    where = "standard output" if to_stdout else result.path
    print(f"wrote {result.count} predictions to {where}" + ("" if args.output else " (--output names another file)"),
          file=stream)
    if result.metrics is not None:
        inputs = task_named(result.task).inputs if result.task else "examples"  # NER's sentences, as finetune says
        predicted, skipped = result.scored - result.unpredicted, result.unpredicted
        rows = (f"{result.count} {inputs}" if predicted == result.count else
                f"the {predicted} of the {result.count} rows that carry answers")
        if skipped:  # SQuAD's official script counts a question it has no answer for, and gives it 0
            rows += (f", and {skipped} skipped {inputs[:-1] if skipped == 1 else inputs} scored 0 as unanswered, as "
                     f"the official SQuAD script scores them: {result.scored} in all")
        print(f"evaluation on {args.input} ({rows}, computed in {result.precision}"
              f"{_precision_note(result.precision, args)}): {format_metrics(result.metrics)}", file=stream)
        tables = format_tables(result.metrics, result.task)  # per label (or entity type), as finetune shows them
        if tables:
            print(tables, file=stream)


def _precision_note(precision: str, args) -> str:
    """Why the figure may differ from finetune's. An int8 run without --int8 is a folder save_quantized wrote: it
    runs int8 whatever the flags say, so "predict without --int8" would reproduce nothing."""
    if precision == "int8" and not args.int8:  # save_quantized keeps no metrics.json: whether finetune scored is unknown
        return (f"; {args.model_dir} holds int8 weights (save_quantized): a finetune score is of the float32 model "
                "they were made from")
    # a run without --dev (or a checkpoint from elsewhere) has no finetune figure to reproduce
    return PRECISION_NOTE.get(precision, "") if _finetune_scored(args.model_dir) else ""


def _finetune_scored(model_dir) -> bool:
    """Whether finetune left a figure for this folder to compare with: its metrics.json holds a dev (or NER's
    test) score. A run without --dev writes none, and a checkpoint from elsewhere has no metrics.json."""
    try:
        final = json.loads((Path(model_dir) / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(final, dict) and any(final.get(split) for split in ("dev", "test"))


def add_demo(sub):
    p = sub.add_parser(
        "demo",
        help="transfer learning in one go: fine-tune the default model on a small sentiment set and use it",
        description="Writes a small labelled sentiment set (made up by bertkit itself), fine-tunes the packaged "
        "pretrained model on part of it, reports accuracy on the held-out part and classifies a few new "
        "sentences. It prints how long the fine-tuning took.",
    )
    p.add_argument("--output", "-o", default="bertkit-demo", help="working directory (default ./bertkit-demo)")
    p.add_argument("--epochs", type=finite_float, default=None, help="passes over the training part (default 3)")
    p.add_argument("--seed", type=seed, default=0,
                   help="seeds the made-up sentences, the new head, dropout and the batch order (default 0)")
    p.add_argument("--model", help="pretrained model directory (default: the packaged model)")
    p.add_argument("--no-progress", "--quiet", action="store_true", help="hide the progress bars")
    p.set_defaults(handler=run_demo, runs_model=True, outputs={"--output": "folder"})


def run_demo(args):
    demo(args.output, model=args.model, epochs=args.epochs, seed=args.seed, progress=not args.no_progress,
         speed=args.speed)
