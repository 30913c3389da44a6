"""Pre-training commands: `bertkit pretrain prepare` and `bertkit pretrain run`; their
options are built from `PrepareConfig` and `RunConfig` by `bertkit.options`."""

import argparse


def add_pretrain(sub):
    p = sub.add_parser("pretrain", help="prepare pre-training data and pre-train BERT from scratch")
    psub = p.add_subparsers(dest="pretrain_command", metavar="COMMAND", required=True)
    for add in PRETRAIN_COMMANDS:
        add(psub)


def add_pretrain_run(psub):
    from bertkit.options import add_options
    from bertkit.pretraining.run_config import RunConfig

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
    p.set_defaults(handler=run_pretrain_run)


def run_pretrain_run(args):
    from bertkit.options import from_args
    from bertkit.pretraining.run_config import RunConfig
    from bertkit.pretraining.train import run

    run(from_args(args, RunConfig))


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
