"""Tokenizer commands: `bertkit tokenize`, `bertkit vocab train|check`.

`vocab train`'s options come from two dataclasses through `bertkit.options`:
`VocabTrainFiles` (what to read, where to write) and the library's
`VocabTrainingConfig` (what to learn, the corpus encoding).
"""

import argparse
import json
import sys
from dataclasses import dataclass, field

from bertkit.data.textfiles import stdin_lines
from bertkit.options import add_options, count, from_args
from bertkit.text.tokenizer import MODEL_MAX_LENGTH, Tokenizer
from bertkit.text.vocab_training import (VocabTrainingConfig, save_trained_vocab, train_vocab_from_files,
                                        vocab_output)
from bertkit.text.vocab import CONTINUATION, check_has_words


@dataclass
class VocabTrainFiles:
    """`bertkit vocab train`'s input and output; what it learns is `VocabTrainingConfig`'s."""

    corpus: list[str] = field(metadata={"help": "text files (.txt, .gz) or folders of them", "positional": True})
    output: str = field(metadata={"help": "where to write vocab.txt (a file path, or a folder); "
                                          "tokenizer_config.json goes beside it", "short": "-o", "required": True})
    overwrite: bool = field(default=False, metadata={"help": "replace the vocab.txt and tokenizer_config.json an "
                                                     "earlier run wrote there (without it they are refused)"})


def add_tokenize(sub):
    p = sub.add_parser(
        "tokenize",
        help="split text into WordPiece tokens and show ids, segments and offsets",
        description="Tokenize TEXT (and an optional second segment) the way BERT sees it: "
        "[CLS] A [SEP] B [SEP], with token ids, segment ids and character offsets. Without TEXT (or with '-') "
        "each line of standard input is tokenized (with --json: one JSON line each).",
        epilog="examples:\n  bertkit tokenize \"Hello, how are you?\" --pair \"I am fine.\"\n"
        "  bertkit tokenize --json < sentences.txt > encodings.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("text", nargs="?", default="-",
                   help="the text to tokenize; '-' or none: each line of standard input, one encoding per line")
    p.add_argument("--pair", help="a second segment (sentence B); with standard input, each line's")
    p.add_argument("--vocab", help="a vocab.txt, tokenizer.json or model directory (default: the embedded model's)")
    p.add_argument("--max-length", type=positions, default=MODEL_MAX_LENGTH,
                   help=f"truncate to this many tokens (<= {MODEL_MAX_LENGTH}; the summary says when it cut)")
    p.add_argument("--json", action="store_true", help="print the encoding as JSON")
    p.set_defaults(handler=run_tokenize)


def positions(text: str) -> int:
    """--max-length: a count BERT's positions hold. Above 512 the tokenizer's own error named its keyword
    arguments (max_length=, stride/return_overflowing), which the command does not have."""
    value = count(text)
    if value > MODEL_MAX_LENGTH:
        raise argparse.ArgumentTypeError(f"must be at most {MODEL_MAX_LENGTH}, the positions BERT has, got {value} "
                                         "(a longer text is cut there, and the summary says so)")
    return value


def run_tokenize(args):
    tok = Tokenizer.from_pretrained(args.vocab)
    for number, text in enumerate(stdin_lines() if args.text == "-" else [args.text]):
        # the cut is said, not silent: a 600-word text once showed "512 tokens" as if that were all of it. A text
        # that fits is its whole encoding; a longer one is encoded again cut, which reads only the head it keeps
        whole = tok.encode(text, args.pair, truncation=False)
        enc = whole if len(whole) <= args.max_length else tok.encode(text, args.pair, max_length=args.max_length)
        cut = "" if enc is whole else f"cut from {len(whole)} tokens to {len(enc)} by --max-length {args.max_length}"
        if args.json:  # JSON lines: the n-th line of output is the n-th line of input (a blank one too)
            print(json.dumps(enc.to_dict(), ensure_ascii=False))
            if cut:
                print(f"bertkit: line {number + 1} {cut}", file=sys.stderr)
        else:
            print(("\n" if number else "") + format_encoding(tok, enc, text, args.pair) + (f" ({cut})" if cut else ""))


def format_encoding(tok, enc, text: str, pair: str | None = None) -> str:
    """A readable table of an encoding (what `bertkit tokenize` prints): position, token, id, segment,
    offsets, substring."""
    rows = [("pos", "token", "id", "seg", "word", "offsets", "text")]
    for i, (t, tid, seg, w, (s, e), sid) in enumerate(
        zip(enc.tokens, enc.input_ids, enc.token_type_ids, enc.word_ids, enc.offsets, enc.sequence_ids)
    ):
        source = text if sid == 0 else pair if sid == 1 else None
        sub = repr(source[s:e]) if source is not None else ""
        rows.append((str(i), t, str(tid), str(seg), "" if w is None else str(w), f"{s}:{e}" if sid is not None else "", sub))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(widths[c]) for c, cell in enumerate(r)).rstrip() for r in rows]
    lines.append(f"{len(enc)} tokens, {enc.attention_mask.count(1)} attended")
    return "\n".join(lines)


def add_vocab(sub):
    p = sub.add_parser("vocab", help="train or inspect WordPiece vocabularies")
    vsub = p.add_subparsers(dest="vocab_command", metavar="COMMAND", required=True)
    t = vsub.add_parser(
        "train",
        help="train a WordPiece vocabulary from raw text",
        description="Learn a WordPiece vocabulary (vocab.txt) from plain-text files or folders, streaming.",
        epilog="examples:\n  bertkit vocab train corpus/ -o vocab.txt --vocab-size 8000\n"
        "  bertkit vocab train books_fr/ -o fr/ --cased --encoding latin-1   # keeps case and accents",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(t, VocabTrainFiles)
    add_options(t, VocabTrainingConfig)
    t.set_defaults(handler=run_vocab_train, outputs={"--output": "either"})
    c = vsub.add_parser(
        "check",
        help="validate a vocab.txt and show its size, casing and special token ids",
        description="Load a vocab.txt (or a model directory) with the tokenizer's checks: special tokens "
        "present, no duplicate or empty lines, casing consistent with tokenizer_config.json.",
    )
    c.add_argument("vocab", nargs="?", help="a vocab.txt or model directory (default: the embedded model's)")
    c.set_defaults(handler=run_vocab_check)


def run_vocab_train(args):
    files, config = from_args(args, VocabTrainFiles), from_args(args, VocabTrainingConfig)
    config.validate()  # a mistyped flag is named first, before what the output holds
    with vocab_output(files.output, files.overwrite):  # refused before the corpus is read; locked until saved
        tokens = train_vocab_from_files(files.corpus, config, progress=True, output=files.output, log=print)
        path = save_trained_vocab(tokens, files.output, config, overwrite=files.overwrite)
    print(f"wrote {len(tokens)} tokens to {path} (and its casing to {path.parent / 'tokenizer_config.json'})")


def run_vocab_check(args):
    tok = Tokenizer.from_pretrained(args.vocab)
    check_has_words(tok.ids_to_tokens, args.vocab)  # pre-training refuses such a vocabulary
    specials = ", ".join(f"{t}={i}" for t, i in zip(tok.all_special_tokens, tok.all_special_ids))
    pieces = sum(t.startswith(CONTINUATION) for t in tok.ids_to_tokens)
    print(f"ok: {len(tok)} tokens ({pieces} ## continuation pieces); lowercase={tok.lowercase}, "
          f"strip_accents={tok.strip_accents}, max_input_chars_per_word={tok.max_input_chars_per_word}; {specials}")
