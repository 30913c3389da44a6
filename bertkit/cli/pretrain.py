"""Pre-training commands: `bertkit pretrain prepare` and `bertkit pretrain run` (their options
are built from `PrepareFiles` + `PrepareConfig` and from `RunConfig` by `bertkit.options`), and the two pre-training
tasks made visible: `bertkit fill-mask` (masked LM) and `bertkit electra show` (replaced-token
detection)."""

import argparse
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.options import add_options, count, device_flags, finite_float, from_args, quiet_flag, seed
from bertkit.pretraining.prepare import PrepareConfig, format_example, format_summary, prepare
from bertkit.pretraining.run_config import RunConfig


@dataclass
class PrepareFiles:
    """`bertkit pretrain prepare`'s input, output and printing; its settings are `PrepareConfig`'s."""

    corpus: list[str] = field(metadata={"help": "text files (.txt, .gz) or folders of them", "positional": True})
    output: str = field(metadata={"help": "folder to write the prepared data into", "short": "-o", "required": True})
    vocab: str | None = field(default=None, metadata={"help": "vocab.txt or model folder (default: the default "
                                                              "model's)"})
    examples: int = field(default=1, metadata={"help": "decoded example instances to print"})
    quiet: bool = field(default=False, metadata={"help": "no progress bar", "flags": ["--quiet", "--no-progress"]})
    overwrite: bool = field(default=False, metadata={"help": "prepare again into a folder that holds finished "
                                                     "prepared data (without it such a folder is refused; an "
                                                     "interrupted one is continued)"})


def add_pretrain(sub):
    p = sub.add_parser("pretrain", help="prepare pre-training data and pre-train BERT from scratch")
    psub = p.add_subparsers(dest="pretrain_command", metavar="COMMAND", required=True)
    for add in PRETRAIN_COMMANDS:
        add(psub)


def add_pretrain_run(psub):
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
    add_options(p, RunConfig)
    quiet_flag(p)
    p.set_defaults(handler=run_pretrain_run, runs_model=True, torchrun=True, outputs={"--output": "folder"})


def run_pretrain_run(args):
    from bertkit.pretraining.train import run

    run(from_args(args, RunConfig), progress=not args.quiet, speed=args.speed)


def add_pretrain_prepare(psub):
    p = psub.add_parser(
        "prepare",
        help="tokenise a text corpus into masked pre-training instances (NSP/SOP/none)",
        description="Read text files or folders (optionally .gz), split documents into sentences, tokenise "
        "once into numpy shards (both cores), and build training instances as google-research/bert's "
        "create_pretraining_data does: span pairs for NSP or SOP (or packed sequences), with token, "
        "whole-word or n-gram masking, static or dynamic. Prints a summary (documents, sentences, tokens, "
        "instances, mean length, what was skipped) and a decoded example. Re-running after an interruption "
        "resumes; a finished folder is prepared again only with --overwrite.",
        epilog="examples:\n  bertkit pretrain prepare books/ -o data/ --documents file\n"
        "  bertkit pretrain prepare wiki.txt.gz -o data/ --objective sop --masking ngram --dynamic-masking\n"
        "  bertkit pretrain prepare corpus/ -o data/ --vocab my_vocab.txt --max-seq-length 512 --dupe-factor 5\n"
        "  bertkit pretrain prepare livres/ -o data/ --vocab fr/ --encoding latin-1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p, PrepareFiles)
    add_options(p, PrepareConfig)
    p.set_defaults(handler=run_pretrain_prepare, outputs={"--output": "folder"})


def run_pretrain_prepare(args):
    """Prepare, then print the summary and a few decoded instances."""
    from bertkit.pretraining.dataset import PretrainingDataset

    files, cfg = from_args(args, PrepareFiles), from_args(args, PrepareConfig)
    if files.examples < 0:  # -1 printed none, silently
        raise BertkitError(f"--examples must be >= 0 (0: print none), got {files.examples}")
    summary = prepare(files.corpus, files.output, cfg, vocab=files.vocab, progress=not files.quiet,
                      overwrite=files.overwrite)
    print(format_summary(summary, cfg))
    if files.examples > 0:
        ds = PretrainingDataset(files.output, seed=cfg.seed)
        tok = ds.tokenizer()
        for i in range(min(files.examples, len(ds))):
            print()
            print(format_example(ds, ds.index_at(i), tok))
    print(f"\nwrote {files.output} (read it with bertkit.pretraining.dataset.PretrainingDataset, "
          f"or `bertkit pretrain run {files.output}`)")


PRETRAIN_COMMANDS = [add_pretrain_prepare, add_pretrain_run]


# --- the pre-training tasks made visible ----------------------------------------

def add_fill_mask(sub):
    p = sub.add_parser(
        "fill-mask",
        help="show the words a masked-LM head predicts for each [MASK], with probabilities",
        description="Run the MLM head of MODEL_DIR (a bertkit pre-training output, a Hugging Face "
        "BertForMaskedLM/BertForPreTraining checkpoint, an ELECTRA generator or an ELECTRA pre-training "
        "directory) on TEXT and print the top-k vocabulary entries for each [MASK].",
        epilog='example: bertkit fill-mask runs/mlm "The man went to the [MASK] ."',
    )
    p.add_argument("model", metavar="MODEL_DIR", help="a model directory with an MLM head (the default model has none)")
    # optional so that a sentence given alone gets an answer about the model, not "text is required"
    p.add_argument("text", nargs="?", help="text with one or more [MASK] tokens")
    p.add_argument("--pair", help="a second segment (sentence B)")
    p.add_argument("--top-k", type=count, default=5, help="candidates per [MASK] (default 5)")
    p.add_argument("--json", action="store_true", help="print the predictions as JSON")
    device_flags(p, dtype="float32")  # the probabilities as transformers' fill-mask pipeline gives them
    p.set_defaults(handler=run_fill_mask, runs_model=True)


def run_fill_mask(args):
    from bertkit.explain.fill_mask import fill_mask, format_predictions, load_mlm

    if args.text is None:
        raise BertkitError(_one_argument(args.model))
    # the two swapped once said "no model directory at The man went to the [MASK] .", the sentence as the folder
    # (os.path.isdir, not Path.is_dir: a text longer than a file name may be raised OSError)
    if args.text.strip() and os.path.isdir(args.text) and not os.path.isdir(args.model):
        raise BertkitError(f"the model folder comes first, then the text: bertkit fill-mask {args.text} "
                           f"{json.dumps(args.model, ensure_ascii=False)}")
    model = load_mlm(args.model, device=args.device, dtype=args.dtype, fast=args.speed)
    predictions = fill_mask(model, args.text, top_k=args.top_k, pair=args.pair)
    if args.json:
        print(json.dumps([[asdict(c) for c in candidates] for candidates in predictions], ensure_ascii=False))
    else:
        print(format_predictions(args.text, predictions, args.pair))


def _one_argument(given: str) -> str:
    """What to say when fill-mask gets one argument: a model folder without its text, or a text without
    a model (there is no default: the packaged model is a sentence encoder without a masked-LM head)."""
    if given.strip() and os.path.isdir(given):  # "": not the current folder; a long text: no OSError
        return f'give the text after the model folder: bertkit fill-mask {given} "The man went to the [MASK] ."'
    return ("fill-mask needs a model with a masked-LM head before the text, and the default model "
            "(all-MiniLM-L6-v2, a sentence encoder) has none: pass a `bertkit pretrain run` output, an ELECTRA "
            "pre-training run or a BertForMaskedLM / BertForPreTraining folder (e.g. bert-base-uncased), as in "
            f"bertkit fill-mask runs/mlm {json.dumps(given, ensure_ascii=False)}")


def add_electra(sub):
    p = sub.add_parser("electra", help="look at an ELECTRA pre-training run's generator and discriminator")
    esub = p.add_subparsers(dest="electra_command", metavar="COMMAND", required=True)
    s = esub.add_parser(
        "show",
        help="the generator's replacements and the discriminator's probability of 'replaced' per token",
        description="Mask some tokens of TEXT (its own [MASK]s, else --mask-prob of them, drawn with --seed), "
        "let the generator fill them by sampling, and print for every token what the discriminator read "
        "and its probability that the token was replaced. MODEL_DIR holds the discriminator and, in "
        "generator/, the generator (the output of ELECTRA pre-training).",
        epilog='examples:\n  bertkit electra show runs/electra "the chef cooked the meal"\n'
        '  bertkit electra show runs/electra "the chef ate the meal" --mask-prob 0',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("model", metavar="MODEL_DIR", help="an ELECTRA pre-training output directory")
    s.add_argument("text", help="the text to corrupt and judge")
    s.add_argument("--mask-prob", type=finite_float, default=0.15,
                   help="fraction of tokens to mask when TEXT has no [MASK] (default 0.15; 0: judge TEXT as written)")
    s.add_argument("--seed", type=seed, default=0, help="draws the masked positions and the samples")
    s.add_argument("--json", action="store_true", help="print the rows as JSON")
    s.set_defaults(handler=run_electra_show, runs_model=True)


def run_electra_show(args):
    from bertkit.explain.electra_view import format_rows, show

    rows = show(args.model, args.text, mask_prob=args.mask_prob, seed=args.seed, fast=args.speed)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], ensure_ascii=False))
    else:
        print(format_rows(rows))
