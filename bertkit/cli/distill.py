"""`bertkit distill`: a smaller model from a sentence model (see `bertkit.distill`)."""

import argparse
import json
import sys

from bertkit.distill.config import HOLDOUT_METRICS, LayersDistillConfig, StaticDistillConfig
from bertkit.options import add_options, from_args, quiet_flag


def add_distill(sub):
    p = sub.add_parser("distill", help="a faster model from a sentence model: a static table, or fewer layers")
    kinds = p.add_subparsers(dest="kind", metavar="KIND", required=True)
    s = kinds.add_parser(
        "static",
        help="distil a static embedding table (Model2Vec's recipe): no transformer at run time",
        description="Every vocabulary token through MODEL with its pooling, PCA to --dim, SIF weights from "
        "Zipf's law (or --corpus frequencies); with --fit FILE the table is then trained so each text's mean row "
        "points where MODEL's sentence vector of the text does (Tokenlearn's idea). Saved as a sentence-transformers "
        "StaticEmbedding folder that every bertkit command, sentence-transformers and model2vec-style tools load.",
        epilog="examples:\n  bertkit distill static -o static/\n"
        "  bertkit distill static runs/emb -o static/ --dim 128 --corpus notes.txt\n"
        "  bertkit distill static -o fitted/ --dim 384 --fit texts.txt --teacher-cache t.safetensors",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model_arguments(s, "a sentence model folder (default: the default model); a folder without a "
                    "sentence-transformers layout (a pre-training run) is read as embed reads it: its encoder, "
                    "mean-pooled (said in one line)")
    s.add_argument("-o", "--output", required=True, help="the folder to write (new, or empty)")
    add_options(s, StaticDistillConfig)
    quiet_flag(s)
    s.set_defaults(handler=run_static, runs_model=True, outputs={"--output": "folder", "--teacher-cache": "cache"})

    lay = kinds.add_parser(
        "layers",
        help="a student with --keep of the teacher's layers, trained to give its sentence vectors (MSE) or, "
        "for a fine-tuned model, its logits (KL at a temperature)",
        description="Build a student from --keep evenly spaced layers of MODEL (its embeddings, pooler, task head "
        "and sentence-transformers layout copied) and train it through the training loop to match MODEL on --data "
        "(the teacher runs once): a sentence model's sentence vectors (MSE); a fine-tuned model's logits "
        "(DistilBERT's soft loss at --temperature, plus the labels' loss when --data is the table it was trained "
        "on). Saved in the teacher's layout: every command takes the output as a model. --resume continues a "
        "killed run.",
        epilog="examples:\n  bertkit distill layers --keep 3 --data sentences.txt -o student/\n"
        "  bertkit distill layers runs/emb --keep 2 --data s.txt -o student/ --epochs 2 --precision bf16\n"
        "  bertkit distill layers runs/sst2 --keep 3 --data sst2/train.tsv -o sst2-3/ --epochs 3",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model_arguments(lay, "a sentence model or a fine-tuned model folder (default: the default model)")
    add_options(lay, LayersDistillConfig, LAYERS_DEFAULTS,
                notes={"metric": f"; --holdout gives {', '.join(HOLDOUT_METRICS)}"})
    lay.set_defaults(handler=run_layers, runs_model=True, torchrun=True, outputs={"--output": "folder", "--teacher-cache": "cache"})


def model_arguments(p, says: str) -> None:
    """MODEL as the first argument (distill's own form), or --model as finetune, pretrain run, embed and index take
    it: a user who typed the family's form got 'unrecognized arguments: --model'. One or the other (argparse
    refuses both in one line); the handler reads `args.model or args.model_flag`."""
    given = p.add_mutually_exclusive_group()
    given.add_argument("model", metavar="MODEL", nargs="?", help=says + "; or give it as --model MODEL")
    given.add_argument("--model", dest="model_flag", metavar="MODEL", help="the same as MODEL, as the other "
                       "commands take it")


# the command's own defaults (sentence-transformers' layer-reduction example: one pass, a higher rate)
LAYERS_DEFAULTS = {"training": {"epochs": 1.0, "optim": {"learning_rate": 1e-4}}}


def run_static(args):
    from bertkit.distill.static import distill_static

    report = distill_static(args.model or args.model_flag, args.output, from_args(args, StaticDistillConfig), progress=not args.quiet,
                            fast=args.speed)
    print(json.dumps(report), file=sys.stderr)


def run_layers(args):
    from bertkit.distill.layers import distill_layers

    config = from_args(args, LayersDistillConfig, LAYERS_DEFAULTS)
    report = distill_layers(args.model or args.model_flag, config.output, config, speed=args.speed)
    if report.get("is_main", True):  # torchrun's other ranks ran the same job: one summary, as every other line
        print(json.dumps({k: v for k, v in report.items() if k not in ("epochs", "is_main")}), file=sys.stderr)
