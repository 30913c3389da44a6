"""Tokenizer commands: `bertkit tokenize`, `bertkit vocab train|check`."""

import json


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
    t.add_argument("corpus", nargs="+", help="text files (.txt, .gz) or folders of them")
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
    from bertkit.wordpiece import CONTINUATION

    tok = Tokenizer.from_pretrained(args.vocab)
    specials = ", ".join(f"{t}={i}" for t, i in zip(tok.all_special_tokens, tok.all_special_ids))
    pieces = sum(t.startswith(CONTINUATION) for t in tok.ids_to_tokens)
    print(f"ok: {len(tok)} tokens ({pieces} ## continuation pieces); lowercase={tok.lowercase}, "
          f"strip_accents={tok.strip_accents}, max_input_chars_per_word={tok.max_input_chars_per_word}; {specials}")
