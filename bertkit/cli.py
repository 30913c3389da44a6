"""The `bertkit` command line: thin, typed commands over the library.

Each command parses its arguments, calls one library function and prints the
result. Imports happen inside the handlers so that `bertkit --help` and the
tokenizer commands start without loading torch. A user mistake (BertkitError,
a missing file) prints one line on stderr and exits with status 2, never a
traceback.

Sections below belong to one area each (tokenizer, model, pre-training,
fine-tuning, features); add a command next to its siblings.
"""

import argparse
import json
import sys

from bertkit.errors import BertkitError

EPILOG = """examples:
  bertkit tokenize "Hello, how are you?" --pair "I am fine."
  bertkit vocab train corpus/ -o vocab.txt --vocab-size 8000
  bertkit vocab check vocab.txt
  bertkit model info --class BertForSequenceClassification
"""


# --- tokenizer -------------------------------------------------------------

def add_tokenize(sub):
    p = sub.add_parser(
        "tokenize",
        help="split text into WordPiece tokens and show ids, segments and offsets",
        description="Tokenize TEXT (and an optional second segment) the way BERT sees it: "
        "[CLS] A [SEP] B [SEP], with token ids, segment ids and character offsets.",
    )
    p.add_argument("text", help="the text to tokenize")
    p.add_argument("--pair", help="a second segment (sentence B)")
    p.add_argument("--vocab", help="a vocab.txt or model directory (default: the embedded model's)")
    p.add_argument("--max-length", type=int, default=512, help="truncate to this many tokens (<= 512)")
    p.add_argument("--json", action="store_true", help="print the encoding as JSON")
    p.set_defaults(handler=run_tokenize)


def run_tokenize(args):
    from bertkit.tokenizer import Tokenizer, format_encoding

    tok = Tokenizer.from_pretrained(args.vocab)
    enc = tok.encode(args.text, args.pair, max_length=args.max_length)
    if args.json:
        print(json.dumps(enc.to_dict(), ensure_ascii=False))
    else:
        print(format_encoding(tok, enc, args.text, args.pair))


def add_vocab(sub):
    p = sub.add_parser("vocab", help="train or inspect WordPiece vocabularies")
    vsub = p.add_subparsers(dest="vocab_command", metavar="COMMAND", required=True)
    t = vsub.add_parser(
        "train",
        help="train a WordPiece vocabulary from raw text",
        description="Learn a WordPiece vocabulary (vocab.txt) from plain-text files or folders, streaming.",
    )
    t.add_argument("corpus", nargs="+", help="text files or folders of .txt files")
    t.add_argument("-o", "--output", required=True,
                   help="where to write vocab.txt (a file path, or a folder); tokenizer_config.json goes beside it")
    t.add_argument("--vocab-size", type=int, default=30522, help="target vocabulary size")
    t.add_argument("--min-frequency", type=int, default=2, help="ignore merges seen fewer times")
    t.add_argument("--cased", action="store_true", help="keep case and accents (default: lower-case)")
    t.set_defaults(handler=run_vocab_train)
    c = vsub.add_parser(
        "check",
        help="validate a vocab.txt and show its size, casing and special token ids",
        description="Load a vocab.txt (or a model directory) with the tokenizer's checks: special tokens "
        "present, no duplicate or empty lines, casing consistent with tokenizer_config.json.",
    )
    c.add_argument("vocab", nargs="?", help="a vocab.txt or model directory (default: the embedded model's)")
    c.set_defaults(handler=run_vocab_check)


def run_vocab_train(args):
    from bertkit.vocab_training import train_vocab_cli

    train_vocab_cli(args)


def run_vocab_check(args):
    from bertkit.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(args.vocab)
    specials = ", ".join(f"{t}={i}" for t, i in zip(tok.all_special_tokens, tok.all_special_ids))
    pieces = sum(t.startswith("##") for t in tok.ids_to_tokens)
    print(f"ok: {len(tok)} tokens ({pieces} ## continuation pieces); lowercase={tok.lowercase}, "
          f"strip_accents={tok.strip_accents}, max_input_chars_per_word={tok.max_input_chars_per_word}; {specials}")


# --- model -----------------------------------------------------------------

HEAD_CHOICES = ["BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForNextSentencePrediction",
                "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
                "BertForMultipleChoice"]


def add_model(sub):
    p = sub.add_parser("model", help="inspect BERT checkpoints (shape, parameters, what loads)")
    msub = p.add_subparsers(dest="model_command", metavar="COMMAND", required=True)
    i = msub.add_parser(
        "info",
        help="show a checkpoint's config, parameter count and how it loads into a model class",
        description="Read a Hugging Face BERT directory (default: the embedded model), load it into "
        "CLASS without strictness and report missing / unused / unexpected weights.",
    )
    i.add_argument("path", nargs="?", help="model directory (default: the embedded all-MiniLM-L6-v2)")
    i.add_argument("--class", dest="cls", default="BertModel", choices=HEAD_CHOICES, help="model class to load into")
    i.add_argument("--json", action="store_true", help="print the config and report as JSON")
    i.set_defaults(handler=run_model_info)


def run_model_info(args):
    import warnings

    import bertkit

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the report below says it all
        model = getattr(bertkit, args.cls).from_pretrained(args.path, strict=False)
    report = model.load_report
    if args.json:
        print(json.dumps({"config": model.config.to_dict(), "parameters": model.num_parameters(),
                          "source": report.source, "missing": report.missing, "unused": report.unused,
                          "unexpected": report.unexpected, "mismatched": report.mismatched}))
        return
    c = model.config
    print(f"{report.source}")
    print(f"{args.cls}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_attention_heads} heads, "
          f"intermediate {c.intermediate_size}, vocab {c.vocab_size}, max positions {c.max_position_embeddings}")
    print(f"parameters: {model.num_parameters():,}")
    print(f"weights: {report.describe()}")


# --- pre-training ----------------------------------------------------------

def add_pretrain(sub):
    p = sub.add_parser("pretrain", help="prepare pre-training data and pre-train BERT from scratch")
    psub = p.add_subparsers(dest="pretrain_command", metavar="COMMAND", required=True)
    for add in PRETRAIN_COMMANDS:
        add(psub)


def add_pretrain_run(psub):
    from bertkit.pretraining.run_config import add_arguments

    p = psub.add_parser(
        "run",
        help="pre-train (MLM + NSP/SOP, or MLM alone) on prepared shards",
        description="Train a BERT from scratch on a directory made by `bertkit pretrain prepare`. Writes "
        "checkpoints (atomic, the last K kept), metrics.jsonl, curves.png and, at the end, a Hugging Face "
        "checkpoint (config.json, model.safetensors, vocab.txt) into --output. Launch under "
        "`torchrun --nproc_per_node N` for data-parallel training.",
        epilog="examples:\n  bertkit pretrain run data/ --config tiny --max-steps 200 --output runs/tiny\n"
        "  bertkit pretrain run data/ --output runs/tiny --resume\n"
        "  bertkit pretrain run indomain/ --init-from runs/tiny --output runs/adapted   # continued pre-training\n"
        "  torchrun --nproc_per_node 2 -m bertkit.cli pretrain run data/ --config mini --output runs/ddp",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(handler=run_pretrain_run)


def run_pretrain_run(args):
    from bertkit.pretraining.train import run_from_args

    run_from_args(args)


def add_pretrain_prepare(psub):
    from bertkit.pretraining.prepare import add_arguments

    p = psub.add_parser(
        "prepare",
        help="tokenise a text corpus into masked pre-training instances (NSP/SOP/none)",
        description="Read text files or folders (optionally .gz), split documents into sentences, tokenise "
        "once into numpy shards (both cores), and build training instances as google-research/bert's "
        "create_pretraining_data does: span pairs for NSP or SOP (or packed sequences), with token, "
        "whole-word or n-gram masking, static or dynamic. Prints a summary (documents, sentences, tokens, "
        "instances, mean length, what was skipped) and a decoded example. Re-running resumes.",
        epilog="examples:\n  bertkit pretrain prepare books/ -o data/ --documents file\n"
        "  bertkit pretrain prepare wiki.txt.gz -o data/ --objective sop --masking ngram --dynamic-masking\n"
        "  bertkit pretrain prepare corpus/ -o data/ --vocab my_vocab.txt --max-seq-length 512 --dupe-factor 5",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(handler=run_pretrain_prepare)


def run_pretrain_prepare(args):
    from bertkit.pretraining.prepare import prepare_from_args

    prepare_from_args(args)


PRETRAIN_COMMANDS = [add_pretrain_prepare, add_pretrain_run]

# --- fine-tuning -----------------------------------------------------------

FINETUNE_TASKS = {
    # CLI task -> (library task, default text column, default pair column, default label column)
    "classify": ("classify", "sentence", None, "label"),
    "pair": ("pair", "sentence1", "sentence2", "label"),
    "regression": ("regression", "sentence", None, "label"),
    "multi-label": ("multi_label", "sentence", None, "labels"),
    "ner": ("ner", None, None, None),
    "qa": ("qa", None, None, None),
}


def _training_flags(p, max_length: int) -> None:
    # default=None everywhere: the defaults live once, in TrainConfig/OptimConfig
    g = p.add_argument_group("training (defaults: the BERT paper's fine-tuning recipe)")
    g.add_argument("--model", help="pretrained model directory (default: the packaged all-MiniLM-L6-v2)")
    g.add_argument("--epochs", type=float, help="passes over the training set (default 3)")
    g.add_argument("--batch-size", type=int, help="training batch size (default 32)")
    g.add_argument("--learning-rate", type=float, help="peak AdamW learning rate (default 5e-5)")
    g.add_argument("--warmup-ratio", type=float, help="fraction of steps warming up (default 0.1)")
    g.add_argument("--weight-decay", type=float, help="AdamW weight decay, not on biases/LayerNorm (default 0.01)")
    g.add_argument("--schedule", choices=["linear", "cosine", "constant"], help="decay after warm-up (default linear)")
    g.add_argument("--max-steps", type=int, help="stop after this many updates")
    g.add_argument("--seed", type=int, help="seed for batch order, dropout and the new head (default 42)")
    g.add_argument("--metric", help="evaluation metric that picks the best epoch")
    g.add_argument("--max-length", type=int, default=max_length, help=f"tokens per input window (default {max_length})")
    g.add_argument("--max-train-examples", type=int, help="use only the first N training examples")
    g.add_argument("--max-dev-examples", type=int, help="evaluate on the first N dev examples only")
    g.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def add_finetune(sub):
    p = sub.add_parser(
        "finetune",
        help="fine-tune a pretrained model on labelled data (classify, pair, regression, multi-label, ner, qa)",
        description="Fine-tune BERT with a fresh task head; evaluates on --dev each epoch, keeps the best "
        "epoch as a Hugging Face checkpoint in --output, with metrics.json and dev predictions.",
        epilog="examples:\n"
        "  bertkit finetune classify --train train.tsv --dev dev.tsv --output out/sst2\n"
        "  bertkit finetune pair --train mrpc/train.tsv --dev mrpc/dev.tsv --output out/mrpc\n"
        "  bertkit finetune regression --train stsb/train.tsv --dev stsb/dev.tsv --text-column sentence1 "
        "--text-pair-column sentence2 --label-column score --output out/stsb\n"
        "  bertkit finetune ner --train conll/train.txt --dev conll/dev.txt --tag-scheme iob1 --output out/ner\n"
        "  bertkit finetune qa --train dev-v1.1.json --train-articles 0:40 --dev dev-v1.1.json "
        "--dev-articles 40:48 --output out/squad",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tsub = p.add_subparsers(dest="task", metavar="TASK", required=True)
    for name, (_, text_col, pair_col, label_col) in FINETUNE_TASKS.items():
        t = tsub.add_parser(name, help=f"fine-tune for {name}")
        t.add_argument("--train", required=True, help="training file")
        t.add_argument("--dev", help="dev file, evaluated after each epoch")
        t.add_argument("--output", "-o", required=True, help="output directory for the checkpoint and metrics")
        if name == "ner":
            t.add_argument("--test", help="a test file scored once with the best epoch's model")
            t.add_argument("--tag-scheme", choices=["iob1", "bio"], default="bio",
                           help="tags of the files: bio (IOB2) or iob1 (CoNLL-2003's own)")
            t.add_argument("--stride", type=int, default=32,
                           help="overlap of windows over sentences longer than max-length (default 32)")
            _training_flags(t, 128)
        elif name == "qa":
            t.add_argument("--train-articles", help="START:END slice of the training file's articles")
            t.add_argument("--dev-articles", help="START:END slice of the dev file's articles")
            t.add_argument("--doc-stride", type=int, default=128,
                           help="tokens shared by consecutive context windows (default 128)")
            t.add_argument("--max-query-length", type=int, default=64, help="question tokens kept (default 64)")
            t.add_argument("--max-answer-length", type=int, default=30, help="longest answer in tokens (default 30)")
            t.add_argument("--n-best", type=int, default=20, help="start/end candidates per window (default 20)")
            t.add_argument("--version-2-with-negative", action="store_true",
                           help="SQuAD v2: questions may have no answer")
            t.add_argument("--null-score-diff-threshold", type=float, default=0.0,
                           help="v2: predict no answer when null score - best span score exceeds this")
            _training_flags(t, 384)
        else:
            t.add_argument("--text-column", default=text_col, help=f"column with the text (default {text_col})")
            t.add_argument("--text-pair-column", default=pair_col,
                           help="column with the second text of a pair" + (f" (default {pair_col})" if pair_col else ""))
            t.add_argument("--label-column", default=label_col, help=f"column with the label (default {label_col})")
            if name == "multi-label":
                t.add_argument("--label-separator", default=",", help="separator between labels (default ,)")
            t.add_argument("--stride", type=int, default=0,
                           help="> 0: cut single texts longer than max-length into windows overlapping by this "
                           "many tokens and average their logits (default 0: truncate)")
            t.add_argument("--pooling", choices=["cls", "mean"], default="cls",
                           help="what the classifier reads: cls, BERT's pooled [CLS] vector (default), or mean, "
                           "the average of the last layer's token vectors (for MLM-only pre-trained models)")
            _training_flags(t, 128)
        t.set_defaults(handler=run_finetune)


def _train_config(args, **task_defaults):
    from bertkit.finetune.trainer import TrainConfig
    from bertkit.optim import OptimConfig

    optim = {k: v for k, v in dict(
        learning_rate=args.learning_rate, warmup_ratio=args.warmup_ratio, weight_decay=args.weight_decay,
        schedule=args.schedule).items() if v is not None}
    train = {k: v for k, v in dict(
        epochs=args.epochs, batch_size=args.batch_size, max_steps=args.max_steps, seed=args.seed,
        metric=args.metric).items() if v is not None}
    for k, v in task_defaults.items():
        train.setdefault(k, v)
    return TrainConfig(optim=OptimConfig(**optim), progress=not args.no_progress, **train)


def run_finetune(args):
    task = FINETUNE_TASKS[args.task][0]
    if task == "ner":
        from bertkit.finetune.ner import NerConfig, finetune_ner, format_ner_report

        cfg = NerConfig(train=args.train, dev=args.dev, test=args.test, output=args.output, model=args.model,
                        tag_scheme=args.tag_scheme, max_length=args.max_length, stride=args.stride,
                        max_train_examples=args.max_train_examples, max_dev_examples=args.max_dev_examples,
                        training=_train_config(args, metric="f1"))
        print(format_ner_report(finetune_ner(cfg)))
    elif task == "qa":
        from bertkit.finetune.qa import QAConfig, finetune_qa

        cfg = QAConfig(train=args.train, dev=args.dev, output=args.output, model=args.model,
                       train_articles=args.train_articles, dev_articles=args.dev_articles,
                       max_length=args.max_length, doc_stride=args.doc_stride,
                       max_query_length=args.max_query_length, max_answer_length=args.max_answer_length,
                       n_best=args.n_best, version_2=args.version_2_with_negative,
                       null_score_diff_threshold=args.null_score_diff_threshold,
                       max_train_examples=args.max_train_examples, max_dev_examples=args.max_dev_examples,
                       training=_train_config(args, metric="f1"))
        final = finetune_qa(cfg)
        if "dev" in final:
            print(f"dev: exact match {final['dev']['exact_match']:.2f}, F1 {final['dev']['f1']:.2f}")
    else:
        from bertkit.finetune.classification import BEST_METRIC, TextTaskConfig, finetune_text, format_report

        cfg = TextTaskConfig(train=args.train, dev=args.dev, output=args.output, task=task, model=args.model,
                             text_column=args.text_column, text_pair_column=args.text_pair_column,
                             label_column=args.label_column,
                             label_separator=getattr(args, "label_separator", ","),
                             max_length=args.max_length, stride=args.stride, pooling=args.pooling,
                             max_train_examples=args.max_train_examples, max_dev_examples=args.max_dev_examples,
                             training=_train_config(args, metric=BEST_METRIC[task]))
        print(format_report(finetune_text(cfg)))
    print(f"saved the best epoch's model to {args.output}")


def _device_flags(p) -> None:
    """--device and --dtype, the same for every command that runs a model for inference."""
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where the model runs: auto (the GPU if torch sees one, else the CPU), cpu or cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="float32 (default) or bfloat16; bfloat16 pays off on a GPU or a CPU with native bf16 "
                   "(avx512_bf16/amx_bf16); elsewhere it is emulated, slower, and a warning says so")


def _int8_flag(p) -> None:
    """--int8 for the commands that run a model for inference on the CPU."""
    p.add_argument("--int8", action="store_true",
                   help="int8 dense layers (dynamic quantization, bertkit.quantize): faster on the CPU for a small "
                   "accuracy cost; CPU and float32 only (see docs/deployment.md)")


def add_predict(sub):
    p = sub.add_parser(
        "predict",
        help="run a fine-tuned model over a file, one prediction per input row (and score it if labelled)",
        description="Predict with a model saved by `bertkit finetune`. INPUT is a TSV/CSV/JSONL table "
        "with the columns the model was trained on (NER: also CoNLL or one sentence per line; "
        "QA: SQuAD JSON or a table with question and context columns). Evaluate mode: when INPUT also "
        "carries the answers (the label column, a CoNLL tag column, SQuAD answers) the predictions are "
        "scored too: accuracy and F1 (classification), Pearson and Spearman (regression), micro F1 "
        "(multi-label), entity F1 (NER), exact match and F1 (QA).",
        epilog="examples:\n  bertkit predict out/sst2 new.tsv --output preds.tsv\n"
        "  bertkit predict out/sst2 dev.tsv            # dev.tsv has a label column: predicts and reports accuracy\n"
        "  bertkit predict out/ner conll/test.txt --device cuda",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model_dir", help="a fine-tuned output directory")
    p.add_argument("input", help="input file")
    p.add_argument("--output", "-o", help="where to write the predictions (default INPUT.predictions.tsv)")
    p.add_argument("--text-column", help="override the text column")
    p.add_argument("--text-pair-column", help="override the second-text column")
    p.add_argument("--label-column", help="override the label column evaluate mode reads")
    p.add_argument("--evaluate", action=argparse.BooleanOptionalAction, default=None,
                   help="score the predictions against the answers in INPUT (default: whenever INPUT has them; "
                   "--evaluate: fail if it has none; --no-evaluate: only predict)")
    p.add_argument("--batch-size", type=int, default=32)
    _device_flags(p)
    _int8_flag(p)
    p.set_defaults(handler=run_predict)


def run_predict(args):
    from bertkit.finetune.predict import format_metrics, predict_file

    result = predict_file(args.model_dir, args.input, args.output, text_column=args.text_column,
                          text_pair_column=args.text_pair_column, label_column=args.label_column,
                          batch_size=args.batch_size, evaluate=args.evaluate, device=args.device, dtype=args.dtype,
                          int8=args.int8)
    print(f"wrote {result.count} predictions to {result.path}")
    if result.metrics is not None:
        print(f"evaluation on {args.input} ({result.count} examples): {format_metrics(result.metrics)}")


def add_demo(sub):
    p = sub.add_parser(
        "demo",
        help="transfer learning in one go: fine-tune the default model on a small sentiment set and use it",
        description="Writes a small labelled sentiment set (made up by bertkit itself), fine-tunes the packaged "
        "pretrained model on part of it, reports accuracy on the held-out part and classifies a few new "
        "sentences. Takes a minute or two on 2 CPU cores.",
    )
    p.add_argument("--output", "-o", default="bertkit-demo", help="working directory (default ./bertkit-demo)")
    p.add_argument("--epochs", type=float, default=None, help="passes over the training part (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", help="pretrained model directory (default: the packaged model)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p.set_defaults(handler=run_demo)


def run_demo(args):
    from bertkit.demo import run_demo as demo

    demo(args.output, model=args.model, epochs=args.epochs, seed=args.seed, progress=not args.no_progress)


# --- features --------------------------------------------------------------

def add_embed(sub):
    p = sub.add_parser(
        "embed",
        help="embed texts with a frozen BERT: sentence, token or word vectors",
        description="Read texts from INPUT (.txt: one per line; .jsonl: a 'text' field; .tsv: a column "
        "under a header), embed them in length-sorted batches, streaming, and write the vectors to OUT "
        "(.npy, .safetensors or .jsonl). Texts beyond the model's 512 positions are cut into overlapping "
        "windows, each token keeping the vector from the window where it has the most context.",
        epilog="examples:\n  bertkit embed sentences.txt -o vectors.npy --normalize\n"
        "  bertkit embed sentences.txt -o tokens.safetensors --layers concat_last_four --pooling none\n"
        "  bertkit embed dev.tsv --column sentence -o words.jsonl --layers=-1,-2 --combine sum --pooling words",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input", help="a text file: .txt (one text per line), .jsonl or .tsv")
    p.add_argument("-o", "--output", required=True, help="where to write: .npy, .safetensors or .jsonl")
    p.add_argument("--model", help="a model directory (default: the embedded model)")
    p.add_argument(
        "--layers", default="last",
        help="first, last, sum_all, second_to_last, sum_last_four, concat_last_four, or layer indices "
        "like -1,-2 (0 = embedding output, -1 = last layer); default last",
    )
    p.add_argument("--combine", choices=["sum", "mean", "concat"], help="how to merge a list of layers (default concat)")
    p.add_argument("--pooling", default="mean", choices=["mean", "cls", "words", "none"],
                   help="one vector per text (mean, cls), per whitespace word (words) or per token (none)")
    p.add_argument("--word-pooling", default="mean", choices=["mean", "first"], help="how pieces make a word vector")
    p.add_argument("--normalize", action="store_true", help="L2-normalise every vector")
    p.add_argument("--column", help="the .tsv column or .jsonl field holding the text")
    p.add_argument("--batch-size", type=int, default=32, help="texts per forward pass (default 32)")
    p.add_argument("--max-length", type=int, help="tokens per pass / window (default: the model's 512)")
    p.add_argument("--stride", type=int, help="window step for long texts (default: half a window)")
    p.add_argument("--truncate", action="store_true", help="cut long texts at --max-length instead of windowing")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _device_flags(p)
    _int8_flag(p)
    p.set_defaults(handler=run_embed)


def run_embed(args):
    from bertkit.features import iter_embed, read_texts, write_vectors

    texts, count = read_texts(args.input, args.column)
    pooling = None if args.pooling == "none" else args.pooling
    rows = iter_embed(
        texts, args.model, args.layers, pooling, args.normalize, combine=args.combine,
        word_pooling=args.word_pooling, batch_size=args.batch_size, max_length=args.max_length,
        stride=args.stride, truncate=args.truncate, progress=not args.quiet, total=count,
        device=args.device, dtype=args.dtype, int8=args.int8,
    )
    n = write_vectors(rows, args.output, pooled=pooling in ("mean", "cls"))
    print(f"wrote {n} {'vectors' if pooling in ('mean', 'cls') else 'texts'} to {args.output}", file=sys.stderr)


def add_attention(sub):
    p = sub.add_parser(
        "attention",
        help="show what each token attends to: an HTML page, a PNG, bertviz data",
        description="Run the model on TEXT (and --pair) and write its attention weights per layer and head "
        "as a self-contained HTML page (no network), optionally a PNG of one view and a bertviz JSON file.",
        epilog="examples:\n  bertkit attention \"Bert notices the hat, but chooses not to engage Ernie since he "
        "knows it'll lead to some ridiculous stuff.\" --token he -o page.html\n"
        "  bertkit attention \"The cat sat.\" --pair \"It was tired.\" --png heads.png --view overview",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("text", help="the text to look at (at most 512 tokens)")
    p.add_argument("--pair", help="a second segment (sentence B)")
    p.add_argument("--token", help="the word whose attention to show (default: [CLS])")
    p.add_argument("--occurrence", type=int, default=1, help="which occurrence of --token (default 1)")
    p.add_argument("--layer", type=int, default=0, help="layer shown first, from 0 (default 0)")
    p.add_argument("--head", default="0", help="head shown first, from 0, or 'mean' (default 0)")
    p.add_argument("-o", "--output", default="attention.html", help="the HTML page (default attention.html)")
    p.add_argument("--png", help="also render a PNG of one view")
    p.add_argument("--view", default="text", choices=["text", "head", "overview"], help="the PNG's view")
    p.add_argument("--bertviz", help="also write the tensors and tokens as JSON for bertviz")
    p.add_argument("--model", help="a model directory (default: the embedded model)")
    _device_flags(p)
    p.set_defaults(handler=run_attention)


def run_attention(args):
    from bertkit.attention_view import attention_map, find_token, save_bertviz, save_html, save_png

    if args.head == "mean":
        head = "mean"
    else:
        try:
            head = int(args.head)
        except ValueError:
            raise BertkitError(f"--head must be a head number or 'mean', got {args.head!r}") from None
    amap = attention_map(args.text, args.pair, args.model, device=args.device, dtype=args.dtype)
    token = find_token(amap, args.token, args.occurrence) if args.token is not None else 0
    save_html(amap, args.output, token, args.layer, head)
    print(f"wrote {args.output}", file=sys.stderr)
    if args.png:
        save_png(amap, args.png, args.view, token, args.layer, head)
        print(f"wrote {args.png}", file=sys.stderr)
    if args.bertviz:
        save_bertviz(amap, args.bertviz)
        print(f"wrote {args.bertviz}", file=sys.stderr)


# --- deployment ------------------------------------------------------------

def add_export(sub):
    p = sub.add_parser("export", help="export a model for deployment (ONNX)")
    esub = p.add_subparsers(dest="export_command", metavar="FORMAT", required=True)
    o = esub.add_parser(
        "onnx",
        help="export the encoder or a fine-tuned head to ONNX, checked against ONNX Runtime",
        description="Write OUT_DIR/model.onnx (inputs input_ids, attention_mask, token_type_ids; outputs "
        "last_hidden_state and pooler_output for the encoder, logits for classification and tagging, "
        "start_logits and end_logits for QA; dynamic batch and sequence axes) with config.json and the "
        "tokenizer files beside it. ONNX Runtime's outputs are checked against bertkit's on real text "
        "(max abs diff 1e-4). Needs the onnx extra: pip install 'bertkit[onnx]'.",
        epilog="examples:\n  bertkit export onnx out/sst2 -o deploy/sst2\n"
        "  bertkit export onnx default -o deploy/minilm      # the packaged default model",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    o.add_argument("model_dir", help="a model directory (a fine-tuned output or a checkpoint), or 'default'")
    o.add_argument("-o", "--output", required=True, help="directory to write model.onnx and the tokenizer into")
    o.add_argument("--opset", type=int, default=17, help="ONNX opset version (default 17, at least 14)")
    o.set_defaults(handler=run_export_onnx)


def run_export_onnx(args):
    from bertkit.export import export_onnx

    report = export_onnx(None if args.model_dir == "default" else args.model_dir, args.output, opset=args.opset)
    print(report.describe())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertkit",
        description="BERT from scratch: tokenize, pre-train, fine-tune, embed and look inside.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


COMMANDS = [add_tokenize, add_vocab, add_model, add_embed, add_attention, add_finetune, add_predict, add_export, add_demo, add_pretrain]


def _warning_line(message, category, filename, lineno, line=None) -> str:
    return f"bertkit: warning: {message}\n"  # advice for a person, not a source location


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if argv is None:  # the `bertkit` command owns its process: let big activations reuse freed memory
        import warnings

        from bertkit.allocator import reuse_freed_memory

        reuse_freed_memory()
        warnings.formatwarning = _warning_line
    try:
        args.handler(args)
    except (BertkitError, FileNotFoundError, IsADirectoryError) as err:
        print(f"bertkit: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
