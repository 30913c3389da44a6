"""Embedding-model commands: `bertkit evaluate retrieval|sts` (figures) and `bertkit mine` (hard negatives)."""

import argparse
import dataclasses
import sys
from functools import partial

from bertkit.options import DTYPE_CHOICES, SEARCH_NEEDS, add_options, count, from_args, given, quiet_flag
from bertkit.retrieval.config import RERANK_TOP, FusionOptions, MiningOptions
from bertkit.errors import figure, refuse_unneeded
from bertkit.data.atomic import write_json

MEASURE_LABELS = ("ndcg@10", "mrr@10", "map@100", "recall@10", "recall@100")


def _model_flags(p) -> None:
    p.add_argument("--model", help="a model directory (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--batch-size", type=count, default=32, help="texts per forward pass (default 32)")
    p.add_argument("--max-length", type=count, help="tokens per text; longer texts are truncated (default: the "
                   "model's sentence-transformers max_seq_length, 256 for the default model, else its positions)")
    p.add_argument("--dtype", default="float32", choices=list(DTYPE_CHOICES),
                   help="the precision (default float32, so the figures compare with published ones; auto: "
                   "bfloat16 where the CPU has it natively)")
    quiet_flag(p)  # every command that embeds with a model (evaluate sts refused it: evaluate retrieval's flag)


def _counts(text: str) -> list[int]:
    """One --dimensions word: a count, or counts joined by commas as finetune embed's --matryoshka-dims takes
    them (a list copied from the training command was refused: 'invalid int value: 64,128')."""
    return [count(part) for part in text.split(",")]


class _Joined(argparse.Action):
    """The lists of the words `_counts` read, as one list (--dimensions 64 128 and 64,128 are [64, 128])."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [d for word in values for d in word])


def add_evaluate(sub):
    p = sub.add_parser("evaluate", help="measure an embedding model: retrieval on a BEIR set, or STS correlation",
                       description="Figures of a sentence-embedding model, computed as sentence-transformers, "
                       "BEIR and MTEB compute them (see docs/embeddings.md).")
    kinds = p.add_subparsers(dest="kind", metavar="KIND", required=True)
    r = kinds.add_parser(
        "retrieval", help="nDCG@10, MRR@10, MAP@100, Recall@10/100 on a BEIR-layout folder",
        description="Embed the corpus (title and text joined) and the split's queries, rank the corpus for each "
        "query (--mode: by exact cosine similarity, BM25 or their fusion), and score the ranking against the qrels "
        "as trec_eval does. DIR holds corpus.jsonl, queries.jsonl and qrels/<split>.tsv (the BEIR layout). --bm25 "
        "adds a BM25 baseline (bm25s: Lucene idf, k1 1.5, b 0.75, English stop words, no stemming) to the same "
        "table. --index "
        "evaluates through an index of DIR's corpus (bertkit index) as bertkit search and bertkit serve's /search "
        "answer: passages, a document scored by its best passage, --ann's graph, --rerank's cross-encoder.",
        epilog="examples:\n  bertkit evaluate retrieval data/scifact --split test --output scifact.json\n"
        "  bertkit evaluate retrieval data/scifact --model runs/embed --bm25\n"
        "  bertkit evaluate retrieval data/scifact --index scifact.index --rerank runs/cross --rerank-top 100",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("directory", metavar="DIR", help="a BEIR folder: corpus.jsonl, queries.jsonl, qrels/")
    r.add_argument("--split", default="test", help="which qrels/<split>.tsv to evaluate (default test)")
    r.add_argument("--max-queries", type=count, metavar="N", help="score only the split's first N judged queries (the "
                   "qrels file's order), each still ranked against the whole corpus: a quick look")
    _model_flags(r)
    r.add_argument("--bm25", action="store_true", help="also rank with BM25 (needs: pip install 'bertkit[search]')")
    r.add_argument("--index", metavar="INDEX", help="rank through this index of DIR's corpus (bertkit index), as "
                   "bertkit search does; the model is the index's")
    r.add_argument("--ann", action="store_true", help="with --index: through its HNSW graph (bertkit index --ann)")
    r.add_argument("--rerank", metavar="MODEL", help="with --index: a cross-encoder re-scoring each answer's best "
                   "--rerank-top documents (bertkit finetune rerank; or finetune regression, or pair "
                   "with two labels)")
    r.add_argument("--rerank-top", type=count, help=f"with --rerank: documents the cross-encoder re-scores (default "
                   f"{RERANK_TOP})")
    r.add_argument("--dimensions", type=_counts, nargs="+", metavar="D", action=_Joined,
                   help="also score the vectors cut to these leading dimensions and renormalised (Matryoshka: "
                   "e.g. --dimensions 64 128, or 64,128 as finetune embed's --matryoshka-dims); one encoding "
                   "serves them all")
    r.add_argument("--mode", help="dense, lexical, hybrid, or all (the three in one table); default: as bertkit "
                   "search (with --index: hybrid when it has a lexical part; without: dense, the model alone)")
    add_options(r, FusionOptions, skip=("mode",))
    r.add_argument("--tune", metavar="SPLIT", help="choose hybrid's fusion and weight on this split's judged "
                   "queries (never the split you report) before scoring --split; with --index, written into its "
                   "index.json so that bertkit search and serve use them")
    r.add_argument("--dedupe", action="store_true", help="keep the first line of a corpus or query id that repeats "
                   "(as bertkit index --dedupe) instead of refusing the folder")
    r.add_argument("--output", "-o", help="write the figures as JSON here")
    r.set_defaults(handler=run_evaluate_retrieval, runs_model=True, outputs={"--output": "file"},
                   batch_size=None, dtype=None)  # None: not given (RETRIEVAL_NEEDS); defaults as shown
    s = kinds.add_parser(
        "sts", help="Spearman and Pearson correlation of cosine similarity with gold scores",
        description="Embed both sentences of each pair and correlate their cosine similarity with the gold "
        "score (the STS benchmark's figure). FILE is a TSV, CSV or JSONL file whose header (or fields) name "
        "sentence1, sentence2 and score, as finetune embed --dev reads scored pairs.",
        epilog="examples:\n  bertkit evaluate sts stsb/dev.tsv --output sts.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("file", metavar="FILE", help="a TSV/CSV/JSONL with columns sentence1, sentence2, score")
    _model_flags(s)
    s.add_argument("--output", "-o", help="write the figures as JSON here")
    s.set_defaults(handler=run_evaluate_sts, runs_model=True, outputs={"--output": "file"})


def _write(result: dict, output) -> None:
    """The figures as JSON, whole or not at all (written at the end of a run: a full disk or a kill there left
    the first bytes of the report at its name)."""
    if output:
        write_json(output, result)


def _label(fusion: dict) -> str:
    if fusion["mode"] != "hybrid":
        return fusion["mode"]
    return f"hybrid ({fusion['fusion']}, alpha {fusion['alpha']}" + (
        f", k {fusion['rrf_k']:g}" if fusion["fusion"] == "rrf" else "") + (
        f", depth {fusion['depth']})" if fusion["depth"] != FusionOptions.depth else ")")


def _name(result: dict, mode: str) -> str:
    base = "model" if "index" not in result else "index"
    if base == "model" and mode == "dense" and "modes" not in result:
        return base
    mode = _label(result.get("modes", {}).get(mode, result).get("fusion", {"mode": mode}))
    if base == "model" and mode == "lexical":  # beside --bm25's row, which does not stem
        mode = "lexical (BM25, stemmed)"
    reranked = "index" in result and result["index"]["rerank"] and mode.startswith(result["mode"])
    return f"{base}, {mode}" + (" + rerank" if reranked else "")


def _table(result: dict) -> str:
    modes = result.get("modes") or {result.get("mode", "dense"): result}
    rows = [(_name(result, m), figures) for m, figures in modes.items()]
    if "before_rerank" in result:  # the reranked search's first stage alone, just above it
        rows.insert(len(rows) - 1, (_name(result, result["mode"]).removesuffix(" + rerank"), result["before_rerank"]))
    rows += [(f"model, {d} dimensions", figures) for d, figures in result.get("dimensions", {}).items()]
    rows += [("BM25 (no stemming: the baseline)", result["bm25"])] if "bm25" in result else []
    lines = ["| ranker | " + " | ".join(MEASURE_LABELS) + " |", "|---" * (len(MEASURE_LABELS) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(f"{figures[m]:.4f}" for m in MEASURE_LABELS) + " |" for name, figures in rows]
    return "\n".join(lines)


# what each option of `evaluate retrieval` needs (`bertkit.errors.refuse_unneeded`), of its settings and of these:
# "lexical" (--mode lexical: BM25 alone ranks, no text is embedded), and "encodes" (a model runs: the encoder,
# or --rerank's cross-encoder, which --batch-size and --dtype run too), as `search` refuses them
LEXICAL_SAYS = ("{flags} {set} how the texts are embedded, and --mode lexical embeds no text (BM25 alone ranks): leave "
                "them out, or evaluate with --mode dense, hybrid or all")
NEEDS_INDEX = "{flags} needs --index INDEX: it re-orders an index's answers"
RETRIEVAL_NEEDS = [
    ({"rerank": "--rerank"}, ("index", None), NEEDS_INDEX),
    ({"ann": "--ann"}, ("index", None), NEEDS_INDEX),
    *SEARCH_NEEDS,
    ({"model": "--model", "max_length": "--max-length"}, ("lexical", False), LEXICAL_SAYS),
    ({"batch_size": "--batch-size", "dtype": "--dtype"}, ("encodes", True), LEXICAL_SAYS),
]


def run_evaluate_retrieval(args):
    from bertkit.tasks.rerank import PairsCut, rerank, reranker
    from bertkit.retrieval.evaluation import evaluate_retrieval

    refuse_unneeded(RETRIEVAL_NEEDS, vars(args), {**vars(args), "lexical": args.mode == "lexical",
                                                  "encodes": args.mode != "lexical" or bool(args.rerank)})
    dtype, batch = args.dtype or "float32", given(args, ("batch_size",))  # the defaults of what was not given
    top = args.rerank_top or RERANK_TOP
    cross = reranker(args.rerank, dtype=dtype, fast=args.speed) if args.rerank else None  # refused before any search
    cut = None if cross is None else PairsCut(cross)  # the pairs the cross-encoder read cut, said once for all
    result = evaluate_retrieval(args.model, args.directory, args.split, **batch, dtype=dtype,
                                max_length=args.max_length, bm25=args.bm25,
                                progress=not args.quiet, index=args.index, ann=args.ann,
                                rerank=cut and partial(rerank, cross, top=top, on_cut=cut, **batch),
                                rerank_top=top, rerank_model=args.rerank, dimensions=args.dimensions,
                                mode=args.mode, fusion={f.name: getattr(args, f.name)
                                                        for f in dataclasses.fields(FusionOptions) if f.name != "mode"},
                                tune=args.tune, dedupe=args.dedupe,
                                max_queries=args.max_queries, fast=args.speed)
    if cut is not None:
        cut.say()
    _write(result, args.output)
    empty = result.get("documents_without_tokens")
    print(f"{result['dataset']} split {args.split}: {result['queries']} queries, {result['documents']} documents"
          + (f" ({empty} without any token, left out of the ranking as bertkit index leaves them out)" if empty else "") + "; "
          + (f"{result['model']} ({_precision(result)}, max length {result['max_length']}, {result['pooling']} pooling)"
             if result["model"] is not None else "BM25 alone over whole documents (stemmed): no model used")
          + (f"; through {args.index}{' (HNSW)' if args.ann else ''}" if args.index else "")
          + (f", top {top} reranked by {args.rerank}" if args.rerank else ""))
    if "tuning" in result:
        tuning = result["tuning"]
        print(f"tuned on split {tuning['split']}: {_label(tuning['pick'])} "
              f"(the best nDCG@10 averaged with its alpha neighbours, of {len(tuning['table'])} settings)"
              + (f"; written into {args.index}/index.json" if args.index else "")
              + ("; tuned on the split scored below, so its figures are not held out" if tuning["split"] == args.split
                 else ""))
    print(_table(result))
    if "before_rerank" in result:
        before, after = result["before_rerank"]["ndcg@10"], result["ndcg@10"]
        print(f"reranking the top {top}: nDCG@10 {before:.4f} before, {after:.4f} after "
              f"({after - before:+.4f})")


def _precision(result: dict) -> str:
    """The precision a figure was computed in; through an index, the passages' (made when it was built)
    and the queries' (now) each."""
    index = result.get("index")
    if index is None:
        return result["precision"]
    queries = "no query embedded (lexical)" if result["precision"] is None else f"queries in {result['precision']}"
    return f"{queries}, the index's passages in {index['precision']}"


def run_evaluate_sts(args):
    from bertkit.retrieval.evaluation import evaluate_sts

    result = evaluate_sts(args.model, args.file, batch_size=args.batch_size, max_length=args.max_length,
                          dtype=args.dtype, progress=not args.quiet, fast=args.speed)
    _write(result, args.output)
    print(f"spearman {figure(result['spearman'])}  pearson {figure(result['pearson'])}  ({result['pairs']} pairs; "
          f"{result['model']}, {result['precision']}, max length {result['max_length']})")


def add_mine(sub):
    p = sub.add_parser(
        "mine", help="hard negatives for contrastive training: triplets from a BEIR folder or a pairs file",
        description="Embed the candidate passages and the queries, rank the passages for each query by cosine, "
        "and keep as negatives the best-ranked ones that are not positives and score clearly below the "
        "positive (default: at most 95% of the positive's cosine, NV-Retriever's TopK-PercPos rule; the options "
        "are sentence-transformers' mine_hard_negatives'). SOURCE is a BEIR folder (--split's queries and qrels, "
        "the corpus as candidates) or a TSV/JSONL with columns anchor, positive (the positives are the "
        "candidates; a group_id column, e.g. the picture of a caption, keeps each anchor's negatives out of its own "
        "group). Writes anchor, positive, negative_1..n (and group_id), the columns `bertkit finetune embed` reads.",
        epilog="examples:\n  bertkit mine data/scifact --split train -o scifact_triplets.tsv --num-negatives 3\n"
        "  bertkit mine pairs.tsv -o triplets.jsonl --relative-margin 0.1 --range-min 2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", metavar="SOURCE", help="a BEIR folder, or a .tsv/.jsonl of anchor, positive pairs")
    p.add_argument("-o", "--output", required=True, help="where to write the rows: .tsv or .jsonl")
    p.add_argument("--split", help="a BEIR folder's qrels split to mine for (default train)")
    _model_flags(p)
    add_options(p, MiningOptions)
    p.add_argument("--report", help="also write the counts (queries, rows, skipped candidates) as JSON here")
    p.add_argument("--dedupe", action="store_true", help="a BEIR folder: keep the first line of a corpus or query id "
                   "that repeats instead of refusing the folder")
    p.set_defaults(handler=run_mine, runs_model=True, outputs={"--output": "file", "--report": "file"})


def run_mine(args):
    from bertkit.retrieval.mining import check_output, mine_hard_negatives, write_rows

    options = from_args(args, MiningOptions)
    check_output(args.output)
    rows, report = mine_hard_negatives(args.source, args.model, split=args.split, options=options,
                                       batch_size=args.batch_size, max_length=args.max_length, dtype=args.dtype,
                                       progress=not args.quiet, dedupe=args.dedupe, fast=args.speed)
    write_rows(rows, args.output, groups=report["groups"])
    _write(report, args.report)
    skipped = ", ".join(f"{n} {rule}" for rule, n in report["skipped"].items() if n)
    print(f"wrote {report['rows']} rows ({options.num_negatives} negatives each) for "
          f"{report['queries'] - report['queries_without_enough_negatives']} of {report['queries']} queries to "
          f"{args.output}; candidates skipped: {skipped or 'none'}; mean cosine positive "
          f"{report['mean_positive_cosine']:.3f}, negative {report['mean_negative_cosine']:.3f}"
          + ("; group_id kept (no negative from the anchor's group)" if report["groups"] else ""), file=sys.stderr)
