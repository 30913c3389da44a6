"""Feature commands: `bertkit embed` (vectors) and `bertkit attention` (pictures)."""

import argparse
import dataclasses
import itertools
import sys
from functools import partial
from pathlib import Path

from bertkit.errors import BertkitError, refuse_unneeded
from bertkit.embeddings.settings import EmbedOptions, resolve_layers, resolve_output, word_pooling_for
from bertkit.options import add_options, count, device_flags, from_args, int8_flag, quiet_flag
from bertkit.data.textfiles import OnePass, file_identity, read_texts, reads_once, text_line
from bertkit.data.vector_files import RECORD_SUFFIX, open_journal, room_for_rows, vector_format, write_vectors

# texts taken at a time: sorted by length into batches (little padding), and a checkpoint after each
# (`bertkit.data.vector_files.Journal`), which --resume goes on from: their vectors depend on the chunk
EMBED_CHUNK = 1024


def add_embed(sub):
    p = sub.add_parser(
        "embed",
        help="embed texts with a frozen BERT: sentence, token or word vectors",
        description="Read texts from INPUT (.txt: one per line, blank lines skipped; .jsonl, .json: JSON Lines, "
        "a 'text' field; .tsv, "
        ".csv: a column under a header), embed them in length-sorted batches, streaming, and write the vectors to OUT "
        "(.npy, .safetensors or .jsonl). Sentence vectors follow the model's sentence-transformers layout when "
        "it has one (its pooling, normalisation and max_seq_length: the default model is mean-pooled, "
        "normalised and cut at 256 tokens, or at --max-length); any option given overrides it. Other texts "
        "beyond the window (the model's 512 positions, or --max-length) are cut into windows that share --stride "
        "tokens, each token keeping the vector from the window where it has the most context (--no-truncate "
        "asks for windows for a layout's sentence vectors too). The vectors are written to OUT.tmp and renamed "
        f"to OUT when whole; every {EMBED_CHUNK} texts of a file they reach the disk and OUT.resume.json records "
        "them, so a run stopped midway (killed, Ctrl-C, a full disk) goes on from there with --resume.",
        epilog="examples:\n  bertkit embed sentences.txt -o vectors.npy --normalize\n"
        "  bertkit embed corpus.jsonl -o vectors.npy --resume     # the same command again, after a kill\n"
        "  bertkit embed sentences.txt -o tokens.safetensors --layers concat_last_four --pooling none\n"
        "  bertkit embed dev.tsv --column sentence -o words.jsonl --layers=-1,-2 --combine sum --pooling words",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("input", help="a text file: .txt (one text per line), .jsonl (.json: JSON Lines too), .tsv or "
                   ".csv; '-': standard input, "
                   "one text per line")
    p.add_argument("-o", "--output", required=True, help="where to write: .npy, .safetensors or .jsonl")
    p.add_argument("--model", help="a model directory (default: the embedded model)")
    add_options(p, EmbedOptions)
    p.add_argument("--word-pooling", choices=["mean", "first"],
                   help="with --pooling words: how a word's pieces make its vector (default mean)")
    p.add_argument("--column", "--text-column", help="the .tsv/.csv column or .jsonl/.json field holding the text "
                   "(default: 'sentence', else 'text', else a table's one column of text; --text-column: its name "
                   "in finetune and predict)")
    p.add_argument("--batch-size", type=count, default=32, help="texts per forward pass (default 32)")
    p.add_argument("--max-length", type=count, help="tokens per pass / window (default: for sentence vectors the "
                   "model's sentence-transformers max_seq_length, else its 512 positions)")
    p.add_argument("--stride", type=int,
                   help="tokens shared by consecutive windows of a long text, the overlap (default: half a window)")
    p.add_argument("--truncate", action=argparse.BooleanOptionalAction, default=None,
                   help="cut long texts at the window instead of windowing them (default: cut, at the layout's "
                   "max_seq_length or --max-length, for the sentence vectors of a model with a "
                   "sentence-transformers layout, as sentence-transformers does; else window)")
    # not args.go_on: `bertkit.options.from_args` reads a trainer's run_config.json under that name
    p.add_argument("--resume", action="store_true", dest="go_on",
                   help="go on from the vectors an interrupted run of this command wrote (OUT.tmp, recorded in "
                   "OUT.resume.json): the finished file is the one an uninterrupted run writes. The input file, the "
                   "model and every option must be the same (a difference is refused, named); not for standard input")
    quiet_flag(p)
    device_flags(p)
    int8_flag(p)
    p.set_defaults(handler=run_embed, runs_model=True, outputs={"--output": "file+dirs"}, resumes=resumes_embed)


def resumes_embed(args) -> bool:
    """Whether the same command with --resume goes on where this one stopped (the Ctrl-C and full-disk lines say
    so): rows of it are recorded beside OUT (none from standard input, nor before the first chunk's end)."""
    return Path(args.output + RECORD_SUFFIX).is_file()


def run_embed(args):
    from bertkit.embeddings.features import iter_embed, load_encoder

    options = from_args(args, EmbedOptions)
    texts, count, where, blanks = _embed_input(args)
    loaded = load_encoder(args.model, device=args.device, dtype=args.dtype, int8=args.int8, fast=args.speed)
    output = resolve_output(loaded.layout, options.pooling, options.normalize)
    vector_format(args.output, output.sentence)  # a format that cannot hold these rows, refused before the plan
    # checkpoints for a file, which a resumed run reads again; none for standard input, read once (its journal
    # only refuses to write over a killed run's recorded rows, and clears a stale record)
    plan = partial(_embed_plan, args, options, loaded, output, count) if count is not None else None
    per_token = output.pooling is None  # each row's token beside it: ids in a .safetensors, strings in a .jsonl
    journal = open_journal(args.output, plan, EMBED_CHUNK if plan else 0, args.go_on, output.sentence, ids=per_token)
    start = journal.rows
    if count is not None:  # the rows of the texts still to embed, of hidden_size values at least (concat: a multiple)
        # one per text; per token at least [CLS], a token and [SEP] (a text without a token is refused); per word one
        per_text = 1 if output.sentence or output.pooling == "words" else 3
        room_for_rows(args.output, count - start, loaded.config.hidden_size, per_text)
    if start:  # the killed run's chunks are written: the same chunks after them, so the same batches
        texts, where = itertools.islice(texts, start, None), (lambda i, at=where: at(start + i))
    rows = iter_embed(
        texts, loaded, options.layers, output.pooling, output.normalize, combine=options.combine,
        word_pooling=args.word_pooling, batch_size=args.batch_size, max_length=args.max_length,
        stride=args.stride, truncate=args.truncate, progress=not args.quiet, total=None if count is None else
        count - start, where=where, chunk_size=EMBED_CHUNK, with_ids=per_token,
    )
    n = write_vectors(rows, args.output, pooled=output.sentence, journal=journal,
                      tokens=loaded.tokenizer.convert_ids_to_tokens if per_token else None)
    # rows are the texts in order: say that a blank line has none
    blank = texts.blank if isinstance(texts, OnePass) else blanks
    skipped = f"; {blank} blank line{'s' if blank > 1 else ''} skipped, so row i is the i-th text" if blank else ""
    resumed = f"; went on from the {start} texts the interrupted run wrote" if start else ""
    # the file always holds float32 numbers; the model's precision is what they were computed in
    print(f"wrote {n} {'vectors' if output.sentence else 'texts'} to {args.output} (float32 values, computed in "
          f"{loaded.precision}){skipped}{resumed}", file=sys.stderr)


def _embed_input(args) -> tuple:
    """(the texts, how many (None: standard input, counted as it streams), where(i): text i's file and line, how
    many blank records a file's count left out (standard input's: `OnePass.blank`, once it has streamed))."""
    if reads_once(args.input):  # standard input, a pipe: streamed, its lines counted and named as they pass
        if args.go_on:
            raise BertkitError("--resume reads the input again, and standard input (or a pipe) gives its lines once: "
                               "save them to a file, embed that, and --resume then goes on after a stop")
        texts = OnePass(args.input, args.column)
        count, where, blanks = (None if texts.first is not None else 0), texts.line, None
    else:  # a file: counted first (the progress bar's total; its blank records), read again for its texts
        left_out = []  # a bad file is refused by the count, before the model loads
        texts, count = read_texts(args.input, args.column, on_blank=lambda: left_out.append(1))
        where, blanks = partial(text_line, args.input, column=args.column), len(left_out)
    if count == 0:  # was "nothing to write", once the model had loaded
        raise BertkitError(f"{args.input} holds no texts: write one per line (.txt), or rows under a header (.tsv), "
                           "or one JSON object per line (.jsonl)")
    return texts, count, where, blanks


def _embed_plan(args, options: EmbedOptions, loaded, output, count: int) -> dict:
    """What makes `bertkit embed`'s rows, recorded beside them for --resume (`bertkit.data.vector_files.Journal`):
    the input's bytes, the model's weights and what it computes in, where, on which kernels, every option that
    changes a vector (the batch and the chunk too: they decide which texts are padded and computed together,
    and so the last bits of each vector), and the output's format."""
    from bertkit.runtime.loading import weights_fingerprint  # late: the command line builds without loading torch

    speed = getattr(args, "speed", None)
    return {"format": 3, "input": file_identity(args.input), "column": args.column, "texts": count,
            "model": {"fingerprint": weights_fingerprint(loaded.weights_dir), "precision": loaded.precision,
                      "device": loaded.device.type, "fast_path": speed and dataclasses.asdict(speed)},
            "pooling": output.pooling, "normalize": output.normalize, **_applied(args, options, loaded, output),
            "batch_size": args.batch_size, "chunk_size": EMBED_CHUNK, "output": Path(args.output).suffix.lower()}


def _applied(args, options: EmbedOptions, loaded, output) -> dict:
    """The layers, word pooling and cut as iter_embed applies them, not as typed: a default spelled out on
    --resume (--max-length at the layout's max_seq_length, --layers -1 for last, --truncate where texts are cut
    anyway, the default --stride) makes the same vectors, so only a real difference is refused."""
    from bertkit.embeddings.features import static_cut  # late, as _embed_plan's imports
    from bertkit.embeddings.inputs import window_cut

    if loaded.task == "static":  # a table and a mean: no layers or windows, each text cut at max_length (or not)
        return {"max_length": static_cut(loaded, args.max_length, args.truncate)}
    net = getattr(loaded.model, "base_model", loaded.model)  # a task model embeds with its encoder
    spec = resolve_layers(options.layers, net.config.num_hidden_layers, options.combine)
    cut = window_cut(loaded.max_positions, output, args.max_length, args.stride, args.truncate)
    return {"layers": list(spec.indices), "combine": spec.combine if len(spec.indices) > 1 else None,  # one: itself
            "word_pooling": word_pooling_for(args.word_pooling, output) if output.pooling == "words" else None,
            "max_length": cut.max_length, "truncate": cut.truncate, "stride": None if cut.truncate else cut.stride}


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
    p.add_argument("--occurrence", type=count, help="which occurrence of --token (default 1)")
    p.add_argument("--layer", type=int, default=0, help="layer shown first, from 0 (-1: the last; default 0)")
    p.add_argument("--head", default="0", help="head shown first, from 0, or 'mean' (default 0)")
    p.add_argument("-o", "--output", default="attention.html", help="the HTML page (default attention.html)")
    p.add_argument("--png", help="also render a PNG of one view")
    p.add_argument("--view", choices=["text", "head", "overview"], help="the --png's view (default text)")
    p.add_argument("--bertviz", help="also write the tensors and tokens as JSON for bertviz")
    p.add_argument("--model", help="a model directory (default: the embedded model)")
    device_flags(p, dtype="float32")  # the weights as transformers and bertviz show them
    p.set_defaults(handler=run_attention, runs_model=True,
                   outputs={"--output": "file", "--png": "file", "--bertviz": "file"})


# what each option of `bertkit attention` needs (`bertkit.errors.refuse_unneeded`): without it, it changed nothing
ATTENTION_NEEDS = [
    ({"occurrence": "--occurrence"}, ("token", None), "{given} counts the occurrences of --token: give --token WORD "
     "too (without it the page follows [CLS])"),
    ({"view": "--view"}, ("png", None), "{given} chooses the PNG's view: give --png FILE too, or leave {flags} out (the "
     "HTML page has every view)"),  # every view is on the page
]


def run_attention(args):
    from bertkit.explain.attention_view import (attention_map, check_picture, find_token, most_attended, save_bertviz,
                                                save_html, save_png)

    if args.head == "mean":
        head = "mean"
    else:
        try:
            head = int(args.head)
        except ValueError:
            raise BertkitError(f"--head must be a head number or 'mean', got {args.head!r}") from None
    refuse_unneeded(ATTENTION_NEEDS, vars(args), vars(args))
    if args.png:  # before the model runs
        check_picture(args.png)
    amap = attention_map(args.text, args.pair, args.model, device=args.device, dtype=args.dtype, fast=args.speed)
    token = find_token(amap, args.token, args.occurrence or 1) if args.token is not None else 0
    layer, token = amap.place(args.layer, head, token)  # -1: the last layer
    save_html(amap, args.output, token, layer, head)
    top = ", ".join(f"{t} {w:.2f}" for _, t, w in most_attended(amap, token, layer, head))
    print(f"{amap.tokens[token]!r} (token {token}), layer {layer}, head {head}: attends most to {top}")
    print(f"wrote {args.output}", file=sys.stderr)
    if args.png:
        save_png(amap, args.png, args.view or "text", token, layer, head)
        print(f"wrote {args.png}", file=sys.stderr)
    if args.bertviz:
        save_bertviz(amap, args.bertviz)
        print(f"wrote {args.bertviz}", file=sys.stderr)
