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
    t.add_argument("-o", "--output", required=True, help="where to write vocab.txt")
    t.add_argument("--vocab-size", type=int, default=30522, help="target vocabulary size")
    t.add_argument("--min-frequency", type=int, default=2, help="ignore merges seen fewer times")
    t.add_argument("--cased", action="store_true", help="keep case and accents (default: lower-case)")
    t.set_defaults(handler=run_vocab_train)


def run_vocab_train(args):
    from bertkit.vocab_training import train_vocab_cli

    train_vocab_cli(args)


# --- model -----------------------------------------------------------------

# --- pre-training ----------------------------------------------------------

# --- fine-tuning -----------------------------------------------------------

# --- features --------------------------------------------------------------


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


COMMANDS = [add_tokenize, add_vocab]


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
