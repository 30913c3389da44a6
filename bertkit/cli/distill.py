"""`bertkit distill`: a smaller model from a sentence model (see `bertkit.distill`)."""

import argparse
import json
import sys

from bertkit.distill.config import StaticDistillConfig
from bertkit.options import add_options, from_args


def add_distill(sub):
    p = sub.add_parser("distill", help="a faster model from a sentence model: a static table, or fewer layers")
    kinds = p.add_subparsers(dest="kind", metavar="KIND", required=True)
    s = kinds.add_parser(
        "static",
        help="distil a static embedding table (Model2Vec's recipe): no transformer at run time",
        description="Every vocabulary token through MODEL with its pooling, PCA to --dim, SIF weights from "
        "Zipf's law (or --corpus frequencies); saved as a sentence-transformers StaticEmbedding folder that "
        "every bertkit command, sentence-transformers and model2vec-style tools load.",
        epilog="examples:\n  bertkit distill static -o static/\n"
        "  bertkit distill static runs/emb -o static/ --dim 128 --corpus notes.txt",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("model", metavar="MODEL", nargs="?", help="a sentence model folder (default: the default model)")
    s.add_argument("-o", "--output", required=True, help="the folder to write (new, or empty)")
    add_options(s, StaticDistillConfig)
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(handler=run_static)


def run_static(args):
    from bertkit.distill.static import distill_static

    report = distill_static(args.model, args.output, from_args(args, StaticDistillConfig), progress=not args.quiet)
    print(json.dumps(report), file=sys.stderr)
