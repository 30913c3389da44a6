"""Search commands: `bertkit index` (a corpus -> an index folder) and `bertkit search` (queries -> answers)."""

import argparse
import dataclasses
import json
import sys

from bertkit.options import SEARCH_NEEDS, add_options, count, device_flags, given, quiet_flag
from bertkit.retrieval.config import FUSION_NEEDS, RERANK_TOP, FusionOptions, LexicalOptions
from bertkit.data.textfiles import existing_file, open_text
from bertkit.errors import BertkitError, refuse_unneeded

SHOWN_CHARS = 200  # of a passage, in the plain-text answer
QUERY_CHARS = 80  # of a query, echoed above its hits (--json echoes none)


def add_index(sub):
    p = sub.add_parser(
        "index", help="cut a corpus into passages, embed them and write a searchable index folder",
        description="Read CORPUS (a BEIR corpus.jsonl or its folder, a TSV whose header names id, text and "
        "optionally title, or a folder of .txt files), cut each document (title and text joined by a space) into "
        "passages of at most --passage-tokens tokens sharing --stride word pieces, embed them length-sorted and "
        "write INDEX: vectors.safetensors (unit float32 vectors; with --vectors int8|binary, codes.safetensors "
        "in their place), passages.jsonl (id, doc_id, title, start, end, text), lexical/ (BM25 over the same "
        "passages, stemmed; not with --no-lexical) and index.json (the model, its weights' SHA-256, pooling, max "
        "length, what is stored). Work is saved in parts: "
        "after a crash or kill, the same command with --resume continues where it stopped, and the index is "
        "the same as an uninterrupted run's. Under torchrun (--nproc_per_node N, one or more nodes) each rank "
        "encodes its share of the parts into INDEX (across nodes: a shared filesystem) and rank 0 writes the "
        "index, the one a single process writes. See docs/search.md.",
        epilog="examples:\n  bertkit index data/scifact -o scifact.index\n"
        "  bertkit index notes/ -o notes.index --passage-tokens 128 --stride 16\n"
        "  bertkit index data/scifact -o scifact.index --resume\n"
        "  torchrun --nproc_per_node 4 -m bertkit.cli index data/scifact -o scifact.index --part-size 256\n"
        "  bertkit index export scifact.index --qdrant qdrant_data/ --collection scifact   (or --qdrant "
        "http://host:6333)\n  bertkit index add scifact.index --ann hnsw\n\nbertkit index export INDEX --qdrant "
        "PATH|URL --collection NAME writes an index's vectors, passages and model into a new Qdrant collection "
        "(local mode: a folder; a URL: a server), which bertkit search --qdrant searches. bertkit index add INDEX "
        "[--ann hnsw] adds to a finished index what is made from its own files, without encoding again: the HNSW "
        "graph asked for, and the lexical part if it was built with --no-lexical.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("corpus", metavar="CORPUS", help="corpus.jsonl, a BEIR folder, a .tsv (id, title, text) or a "
                   "folder of .txt files; or the word export or add (then INDEX follows)")
    p.add_argument("exported", nargs="?", metavar="INDEX", help="after export or add: the index folder")
    p.add_argument("-o", "--output", metavar="INDEX", help="the index folder to write (new or empty; required)")
    p.add_argument("--qdrant", metavar="PATH|URL", help="export: a Qdrant local-mode folder, or a server's URL")
    p.add_argument("--collection", help="export: the new collection's name")
    p.add_argument("--model", help="an embedding model directory (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--passage-tokens", type=count, help="tokens per passage, [CLS] and [SEP] included (default: the "
                   "model's max length: its sentence-transformers max_seq_length, 256 for the default model)")
    p.add_argument("--stride", type=int, help="word pieces shared by consecutive passages of a document, the "
                   "overlap, as embed's and finetune's --stride (default: half a passage; --overlap, its old name, "
                   "still works)")
    p.add_argument("--overlap", dest="stride", type=int, help=argparse.SUPPRESS)  # the old name of --stride
    p.add_argument("--batch-size", type=count, help="passages per forward pass (default 32)")
    p.add_argument("--part-size", type=count, help="passages per saved part: what a kill can lose, "
                   "and what torchrun ranks are dealt (default 1024)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted build of INDEX (export: an "
                   "interrupted export into the collection)")
    p.add_argument("--overwrite", action="store_true", help="replace the index (finished or not) already in INDEX "
                   "(export: the collection)")
    p.add_argument("--dedupe", action="store_true", help="keep the first document of an id that repeats (and say "
                   "how many were dropped); without it a repeated id is an error naming its lines")
    _add_search_structures(p)
    add_options(p, LexicalOptions)
    device_flags(p)
    quiet_flag(p)
    p.set_defaults(handler=run_index, runs_model=True, torchrun=builds_index, resumes=resumes_index,
                   outputs={"--output": "folder"})


def _add_search_structures(p) -> None:
    """index's options for what is built beside the float vectors: HNSW, compact codes, the lexical part."""
    p.add_argument("--ann", choices=["hnsw"], help="also build an approximate index: hnsw, a FAISS HNSW graph for "
                   "corpora where exact search is too slow (needs: pip install 'bertkit[search]'); its recall@10 "
                   "against exact search is measured and printed")
    # the tuning options default to None, so that one given without what it tunes is seen (INDEX_NEEDS)
    p.add_argument("--ann-m", type=count, help="HNSW: links per vector (default 32)")
    p.add_argument("--ef-construction", type=count, help="HNSW: candidates kept while building "
                   "(default 200)")
    p.add_argument("--ef-search", type=count, help="HNSW: candidates kept while searching, recorded "
                   "as the index's default (default 128)")
    p.add_argument("--vectors", choices=["float32", "int8", "binary"], help="store the vectors "
                   "as compact codes that exact search scans, rescoring its candidates against the decoded codes "
                   "(int8: 1/4 of the bytes, binary: 1/32; default float32: the float rows alone)")
    p.add_argument("--rescore-with", choices=["int8", "float32"], help="rows kept beside the codes to rescore the "
                   "candidates against, read for the candidates only (default: the decoded codes). int8, with "
                   "--vectors binary: 1/32 of float32's bytes scanned, 1/32 + 1/4 stored (sentence-transformers' "
                   "binary index + int8 rescoring); float32: the float rows (as --keep-float)")
    p.add_argument("--keep-float", action="store_true", help="with --vectors int8|binary: keep the float rows too, "
                   "and rescore the candidates against them (more bytes on disk, float32's ranking); the same as "
                   "--rescore-with float32")
    p.add_argument("--no-lexical", action="store_true", help="leave out the lexical part (BM25 over the same "
                   "passages, stemmed, which hybrid and lexical search need; built by default, with the search "
                   "extra: pip install 'bertkit[search]')")


HNSW_FLAGS = {"ann_m": "--ann-m", "ef_construction": "--ef-construction", "ef_search": "--ef-search"}
BM25_FLAGS = {"k1": "--bm25-k1", "b": "--bm25-b"}
# what only a build reads: how it encodes the corpus (index add and index export encode nothing)
BUILD_FLAGS = {"model": "--model", "passage_tokens": "--passage-tokens", "stride": "--stride", "batch_size": "--batch-size",
               "part_size": "--part-size", "dedupe": "--dedupe", "vectors": "--vectors", "rescore_with": "--rescore-with",
               "keep_float": "--keep-float"}


# what each option of `bertkit index` needs (`bertkit.errors.refuse_unneeded`); "command" is build, add or export
INDEX_NEEDS = [
    ({**BUILD_FLAGS, "ann": "--ann", **HNSW_FLAGS, "no_lexical": "--no-lexical", **BM25_FLAGS}, ("command", ("build", "add")),
     "{flags} {set} what a build makes, and index export copies INDEX as it is: bertkit index add INDEX adds a graph or "
     "a lexical part, bertkit index CORPUS -o INDEX --overwrite builds it again"),
    (BUILD_FLAGS, ("command", "build"), "{flags} {set} how a build encodes a corpus, and index add encodes nothing (it "
     "makes its parts from INDEX's own files): build again with bertkit index CORPUS -o INDEX --overwrite"),
    ({"output": "-o/--output"}, ("command", ("build", "export")), "{flags} sets the folder a build writes, and index "
     "add writes into INDEX itself: leave it out"),
    ({"resume": "--resume"}, ("command", ("build", "export")), "{flags} sets that a build goes on after a kill, and "
     "index add needs none (INDEX gains its record last: a kill leaves it as it was): leave it out"),
    (HNSW_FLAGS, ("ann", None), "{flags} {set} the HNSW graph --ann hnsw builds: give --ann hnsw too (without it no "
     "graph is built)"),
    (BM25_FLAGS, ("no_lexical", False), "{flags} {set} the lexical part's BM25, which --no-lexical leaves out: give "
     "one or the other"),
]


def _refuse_unused(args, command: str) -> None:
    """Refuse what `bertkit index` (command "build"), `index add` or `index export` would take and not use."""
    refuse_unneeded(INDEX_NEEDS, vars(args), {**vars(args), "command": command})


def builds_index(args) -> bool:
    """Whether `bertkit index` builds an index (ranks share the encoding under torchrun); `index add` and
    `index export` run in one process."""
    return args.exported is None


def resumes_index(args) -> bool:
    """Whether the same `bertkit index` with --resume goes on where this one stopped: a build or an export, not
    `index add`, which refuses --resume (a stopped add leaves INDEX as it was: it is simply run again)."""
    return not (args.corpus == "add" and args.exported is not None)


def run_index(args):
    from bertkit.retrieval.index import build_index

    if args.corpus == "export" and args.exported is not None:
        return run_export(args)
    if args.corpus == "add" and args.exported is not None:
        return run_add(args)
    if args.exported is not None and not (args.qdrant or args.collection):  # `bertkit index corpus.txt my_index`
        raise BertkitError(f"bertkit index writes to the folder -o names: bertkit index {args.corpus} -o "
                           f"{args.exported} (a second word follows only 'add' or 'export')")
    if args.exported is not None or args.qdrant or args.collection:
        raise BertkitError("to export an index: bertkit index export INDEX --qdrant PATH|URL --collection NAME")
    if not args.output:
        raise BertkitError("-o/--output INDEX is required: the folder to write the index to")
    _refuse_unused(args, "build")
    # the flags given (on --resume too: build.json, not run_config.json, holds a resumed index's plan)
    lexical = _lexical_options(args)
    info = build_index(args.corpus, args.output, args.model, passage_tokens=args.passage_tokens,
                       stride=args.stride, device=args.device, dtype=args.dtype, resume=args.resume,
                       progress=not args.quiet, ann=args.ann, lexical=lexical, dedupe=args.dedupe,
                       overwrite=args.overwrite, rescore_with=_rescore_with(args), fast=args.speed,
                       **given(args, ("batch_size", "part_size", "vectors", *HNSW_FLAGS)))
    if info is None:  # a torchrun rank other than 0: its parts are written, rank 0 reports
        return
    skipped = info["documents_without_tokens"]
    print(f"{args.output}: {info['passages']} passages of {info['documents']} documents "
          f"({info['passage_tokens']} tokens, sharing {info['overlap']}), {info['dim']} dimensions, "
          f"{info['model']['directory']} ({info['model']['precision']}, {info['model']['pooling']} pooling)"
          + (f"; {skipped} documents without any token left out" if skipped else ""))
    if info.get("vectors"):
        made = info["vectors"]
        kept = {"float32": "the float rows", "int8": "int8 rows"}
        print(f"vectors: {made['kind']} codes, {made['bytes_per_vector']} bytes each scanned"
              + "".join(f", and {kept[k]} to rescore the candidates ({made['bytes_stored_per_vector']} bytes a vector "
                        "stored)" for k in made["stored"][1:]) + ("" if made["stored"][1:] else ", the float rows not kept"))
    _print_parts(info)


def _print_parts(info: dict) -> None:
    """The lines saying what an index's lexical part and HNSW graph are (`info`: index.json, or what was added)."""
    if info.get("lexical"):
        made = info["lexical"]
        print(f"lexical: BM25 (Lucene idf, k1 {made['k1']}, b {made['b']}, stop words {made['stopwords']}, stemmer "
              f"{made['stemmer']}) over the same passages, {made['vocabulary']} terms")
    if info.get("ann"):
        ann = info["ann"]
        print(f"{ann['kind']} (M {ann['m']}, efConstruction {ann['ef_construction']}, efSearch {ann['ef_search']}): "
              f"recall@10 {ann['recall@10']:.4f} against exact search on {ann['held_out']} held-out passages as "
              "queries (each one's own row left out)")


def run_add(args):
    from bertkit.retrieval.extend import add_parts
    from bertkit.retrieval.index import open_index

    _refuse_unused(args, "add")
    bm25 = [flag for dest, flag in BM25_FLAGS.items() if getattr(args, dest) is not None]
    have = open_index(args.exported).info.get("lexical") if bm25 else None
    if have:  # add_parts builds a lexical part only where there is none: the settings were ignored
        raise BertkitError(f"{' and '.join(bm25)}: {args.exported} has its lexical part already (k1 {have['k1']}, b "
                           f"{have['b']}), and index add does not build it again: build the index again with them "
                           "(bertkit index CORPUS -o INDEX --overwrite)")
    added = add_parts(args.exported, ann=args.ann, lexical=_lexical_options(args), overwrite=args.overwrite,
                      progress=not args.quiet, **given(args, HNSW_FLAGS))
    print(f"{args.exported}: added {' and '.join(added)}, made from its own files (nothing encoded again)")
    _print_parts(added)


def _lexical_options(args) -> LexicalOptions | None:
    """The lexical part's settings given (None: --no-lexical)."""
    return None if args.no_lexical else LexicalOptions(**{f.name: getattr(args, f.name) for f in
                                                          dataclasses.fields(LexicalOptions)
                                                          if getattr(args, f.name, None) is not None})


def _rescore_with(args) -> str | None:
    """--rescore-with, with --keep-float its other name for float32."""
    if args.keep_float and args.rescore_with not in (None, "float32"):
        raise BertkitError(f"--keep-float is --rescore-with float32: give one of them, not --rescore-with "
                           f"{args.rescore_with} too")
    return "float32" if args.keep_float else args.rescore_with


def run_export(args):
    from bertkit.retrieval.index import open_index
    from bertkit.retrieval.qdrant import export, require_qdrant

    if not args.qdrant or not args.collection:
        raise BertkitError("bertkit index export INDEX needs --qdrant PATH|URL and --collection NAME")
    _refuse_unused(args, "export")
    require_qdrant()  # said before the index is opened (its check reads every vector), not after
    n = export(open_index(args.exported), args.qdrant, args.collection, progress=not args.quiet, resume=args.resume,
               overwrite=args.overwrite)
    print(f"{args.exported}: {n} passages written to collection {args.collection!r} in {args.qdrant}")


def add_search(sub):
    p = sub.add_parser(
        "search", help="the best documents of an index for a query: hybrid (BM25 + the model), dense or lexical",
        description="Rank INDEX's documents for each query and print the k best, each with its best passage (a "
        "document scores its best passage's score). --mode dense embeds the query with the model that made INDEX "
        "(another model is refused) and scores every passage by cosine similarity (exact: blocked matrix products "
        "over the memory-mapped vectors, bounded memory; --ann: the HNSW graph; an index of int8 or binary codes: "
        "the codes, the best candidates rescored); --mode lexical scores them by BM25 (the index's lexical part); "
        "--mode hybrid, the default when the index has a lexical part, fuses the two runs (--fusion, --alpha: the "
        "index's tuned choice if evaluate retrieval --tune wrote one, else dbsf 0.5; docs/search.md). --rerank "
        "re-scores the best --rerank-top documents with a cross-encoder (bertkit finetune rerank; or finetune "
        "regression, or pair with two labels). --json prints, per query, a best-first list of "
        "{\"id\", \"doc_id\", \"score\", \"text\"}.",
        epilog="examples:\n  bertkit search scifact.index \"vitamin D prevents fractures\" -k 5\n"
        "  bertkit search scifact.index --queries claims.txt --json > answers.json\n"
        "  bertkit search scifact.index \"statins and dementia\" --rerank runs/cross-encoder --rerank-top 50\n"
        "  bertkit search --qdrant qdrant_data/ --collection scifact \"vitamin D prevents fractures\"",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("index", nargs="?", metavar="INDEX", help="an index folder written by bertkit index (none with "
                   "--qdrant)")
    p.add_argument("query", nargs="?", metavar="QUERY", help="the query (or --queries FILE)")
    p.add_argument("--qdrant", metavar="PATH|URL", help="search a Qdrant collection written by bertkit index export "
                   "instead of an index folder (with --collection)")
    p.add_argument("--collection", help="with --qdrant: the collection")
    p.add_argument("--queries", metavar="FILE", help="a text file of queries, one per line")
    p.add_argument("-k", type=count, default=10, help="documents per query (default 10)")
    p.add_argument("--model", help="the query encoder; must be the model that made INDEX (default: that model)")
    p.add_argument("--rerank", metavar="MODEL", help="a cross-encoder directory re-scoring the best documents (bertkit "
                   "finetune rerank)")
    p.add_argument("--rerank-top", type=count, help="with --rerank: documents the cross-encoder re-scores (default "
                   f"{RERANK_TOP})")
    p.add_argument("--json", action="store_true", help="print JSON: per query a best-first list of hits")
    p.add_argument("--batch-size", type=count, help="texts per forward pass (default 32)")
    p.add_argument("--ann", action="store_true", help="search the HNSW graph built by bertkit index --ann hnsw "
                   "(approximate, faster on millions of vectors) instead of every vector")
    p.add_argument("--ef-search", type=count, help="with --ann: candidates the graph walk keeps (default: the "
                   "index's, 128); more is slower and finds more")
    p.add_argument("--block-size", type=count, help="vectors scored per block of the exact scan: "
                   "memory grows with it, about 64 x block x 13 bytes for the scores and their merge (default 16384: "
                   "13 MiB; docs/search.md)")
    add_options(p, FusionOptions, {"mode": None})
    device_flags(p)
    # None: not given, so that one given to a lexical search is seen (QUERY_NEEDS); run_search reads
    # them as the library's defaults (32; auto)
    p.set_defaults(handler=run_search, runs_model=True, device=None, dtype=None)


# what each option of `bertkit search` needs (`bertkit.errors.refuse_unneeded`), of its settings and of these:
# "lexical" (--mode lexical: BM25 alone ranks, no query is embedded) and "encodes" (a model runs: the query
# encoder, or --rerank's cross-encoder, which --device, --dtype and --batch-size run too)
LEXICAL_SAYS = ("{flags} {set} how the queries are embedded and scanned, and --mode lexical embeds no query (BM25 alone "
                "ranks): leave them out, or search with --mode dense or hybrid")
QUERY_NEEDS = [
    ({"ef_search": "--ef-search"}, ("ann", True), "{flags} sets how far --ann's HNSW walk looks: give --ann too (the "
     "exact search without it scores every passage)"),
    *SEARCH_NEEDS,
    ({"model": "--model", "block_size": "--block-size"}, ("lexical", False), LEXICAL_SAYS),
    ({"device": "--device", "dtype": "--dtype", "batch_size": "--batch-size"}, ("encodes", True), LEXICAL_SAYS),
    ({"block_size": "--block-size"}, ("ann", False), "{flags} sets the exact scan's blocks, and --ann walks the HNSW "
     "graph instead: leave one of them out"),
    ({"ann": "--ann"}, ("qdrant", False), "{flags} walks an index folder's HNSW graph; a Qdrant collection is "
     "searched by Qdrant"),
    ({"block_size": "--block-size"}, ("qdrant", False), "{flags} sets the exact scan's blocks over an index folder, "
     "and a Qdrant collection is searched by Qdrant: leave it out"),
    ({"collection": "--collection"}, ("qdrant", None), "{flags} names the Qdrant collection --qdrant searches: give "
     "--qdrant PATH|URL too, or leave it out"),  # without it INDEX was searched, the collection never looked at
]


def _queries(args) -> tuple[list[str], object]:
    """The queries, and names(i) naming query i in an error about it (a line without tokens: FILE:LINE)."""
    if (args.query is None) == (args.queries is None):
        raise BertkitError("give one QUERY or --queries FILE (one query per line)")
    if args.query is not None:
        return [args.query], lambda i: "the query"
    with open_text(existing_file(args.queries, "queries file"), "queries file") as f:
        lines = [line.strip() for line in f]
    numbers = [n for n, line in enumerate(lines, 1) if line]
    queries = [lines[n - 1] for n in numbers]
    if not queries:
        raise BertkitError(f"{args.queries} holds no query: write one per line")
    blank = len(lines) - len(queries)  # --json echoes no query: say which line an answer is, as embed does
    if blank:
        print(f"{args.queries}: {blank} blank line{'s' if blank > 1 else ''} skipped, so answer i is the i-th query",
              file=sys.stderr)
    return queries, lambda i: f"{args.queries}:{numbers[i]}"


def _shown(text: str, chars: int) -> str:
    """`text` on one line, cut to `chars` characters ending in "..." when longer."""
    text = " ".join(text.split())
    return text if len(text) <= chars else text[: chars - 3] + "..."


def _print_plain(queries, answers) -> None:
    for query, hits in zip(queries, answers):
        print(f"query: {_shown(query, QUERY_CHARS)}")
        for rank, hit in enumerate(hits, 1):
            print(f"{rank:3d}. {hit.score:.4f}  {hit.doc_id}  [{hit.id}]  {_shown(hit.text, SHOWN_CHARS)}")
        print()


def run_search(args):
    from bertkit.tasks.rerank import PairsCut, recorded_effect, rerank, reranker
    from bertkit.retrieval.index import open_index
    from bertkit.retrieval.qdrant import search as search_qdrant
    from bertkit.retrieval.search import DEFAULT_BLOCK, search, search_options

    if args.k < 1:
        raise BertkitError(f"-k must be at least 1, got {args.k}")
    # what was typed, handed on below (the rest: the library's defaults); an option typed without what it tunes: refused
    typed, batch = given(args, [f.name for f in dataclasses.fields(FusionOptions)]), given(args, ("batch_size",))
    refuse_unneeded(QUERY_NEEDS, vars(args), {**vars(args), "lexical": args.mode == "lexical",
                                              "encodes": args.mode != "lexical" or bool(args.rerank)})
    if args.qdrant:  # no INDEX: the one positional is the query
        if args.query is not None or not args.collection:
            raise BertkitError("with --qdrant PATH|URL give --collection NAME and no INDEX: bertkit search --qdrant "
                               "PATH --collection NAME QUERY")
        args.index, args.query = None, args.index
    elif args.index is None:
        raise BertkitError("give an INDEX folder (or --qdrant PATH|URL --collection NAME)")
    queries, names = _queries(args)
    index = None if args.qdrant else open_index(args.index)
    if index is not None:
        fusion = search_options(index, typed, ann=args.ann)  # a missing bm25s, FAISS or graph said before a model loads
    else:  # the flags given, checked now; the rest as for the collection's index (its tuned fusion, or the defaults)
        fusion = FusionOptions(**typed)
        fusion.validate()
        if fusion.mode is not None:  # else the collection decides, as an index does
            refuse_unneeded(FUSION_NEEDS, typed, {"mode": fusion.mode, "fusion": fusion.fusion})
        fusion = typed
    dtype = args.dtype or "auto"
    cross = reranker(args.rerank, args.device, dtype, args.speed) if args.rerank else None  # refused before any search
    effect = recorded_effect(args.rerank) if args.rerank else None
    if effect:
        print(effect, file=sys.stderr)
    top = args.rerank_top or RERANK_TOP
    depth = args.k if cross is None else max(args.k, top)
    if args.qdrant:
        answers = search_qdrant(args.qdrant, args.collection, queries, depth, model=args.model, device=args.device,
                                dtype=dtype, fusion=fusion, fast=args.speed, **batch)
    else:
        answers = search(index, queries, depth, model=args.model, device=args.device, dtype=dtype,
                         block_size=args.block_size or DEFAULT_BLOCK, ann=args.ann, ef_search=args.ef_search,
                         fusion=fusion, fast=args.speed, names=names, **batch)
    if cross is not None:
        cut = PairsCut(cross)  # the pairs the cross-encoder read cut, said once for every query
        answers = [rerank(cross, q, hits, top, on_cut=cut, **batch) for q, hits in zip(queries, answers)]
        cut.say()
    answers = [hits[: args.k] for hits in answers]
    if args.json:
        json.dump([[h.to_dict() for h in hits] for hits in answers], sys.stdout, ensure_ascii=False)
        print()
    else:
        _print_plain(queries, answers)
