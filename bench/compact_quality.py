"""Compact vectors on a real index: nDCG@10 of int8 and binary codes with rescoring against float32.

    python bench/compact_quality.py --index scifact.index --data data/scifact --split test --documents 100 10

The index's float32 passage vectors are coded (`bertkit.retrieval.compact`, as `bertkit index --vectors`
codes them), the split's queries embedded by the index's model, the passages ranked by the codes and
rescored with the float query (`--documents` x the most passages per document x oversampling candidates,
as a search for that many documents asks), documents by their best passage; the figures are
bertkit.metrics.retrieval's. Rescoring against: the decoded codes (codes only), the int8 rows (binary
--rescore-with int8: sentence-transformers' binary index + int8 rescoring), the float rows (--keep-float).
`--copy DIR` also writes DIR/binary_int8.index, a copy of the index stored as `bertkit index --vectors binary
--rescore-with int8` stores it (codes.safetensors, no float rows), for `bertkit evaluate retrieval --index`.
Size and speed: `--scale N` (1M in docs/search.md) makes N vectors from the index's float rows (row i is
row i mod R plus Gaussian noise of norm about `--sigma`, normalised; seeded), writes them as float32 (.npy)
and as int8 and binary codes (codes.safetensors as `bertkit index --vectors` writes them), memory-maps them
and times the split's real queries: float32 exact (`exact.top_k`) and each kind of codes + rescoring
against the decoded codes or, binary+int8, its int8 rows (`compact.compact_top_k`, k 10, the last
`--oversampling`), all queries in one call
and `--single` one per call, the kinds interleaved in `--rounds` rounds (median); peak anonymous memory
sampled every 10 ms. `--cold` also times binary + int8 one query per call with the int8 rows' pages
dropped from the page cache before each query (`cold_rows`), against the same calls with them cached:

    OMP_NUM_THREADS=1 python bench/compact_quality.py --index scifact.index --data data/scifact --scale 1000000
"""

import argparse
import json
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np

from bertkit.data.beir import load_beir
from bertkit.metrics.retrieval import evaluate_run
from bertkit.retrieval.compact import compact_top_k, encode, int8_ranges
from bertkit.retrieval.documents import first_per_document
from bertkit.retrieval.exact import top_k
from bertkit.retrieval.codes_file import codes_writer
from bertkit.retrieval.index import _store_codes, document_ids, map_safetensors, open_index
from bertkit.retrieval.search import embed_queries, query_encoder


def doc_run(index, ids, scores, rows, k=100):
    names = document_ids(index)
    out = {}
    for q, s, r in zip(ids, scores, rows):
        kept = first_per_document(list(zip(r.tolist(), s.tolist())), lambda item: int(index.document[item[0]]), k)
        out[q] = {names[int(index.document[row])]: float(score) for row, score in kept}
    return out


def quality(args):
    index = open_index(args.index)
    data = load_beir(args.data, args.split)
    ids = list(data.queries)
    loaded = query_encoder(index.info, dtype="float32")
    queries = embed_queries(index.info, loaded, [data.queries[q] for q in ids])
    vectors = np.asarray(index.float_rows("bench/compact_quality.py"), np.float32)
    ranges = int8_ranges(vectors)
    codes = {kind: encode(vectors, kind, ranges) for kind in ("int8", "binary")}
    against = {"codes only": None, "int8 rows": codes["int8"], "float rows": vectors}
    print(f"{len(vectors)} passages, {len(ids)} queries; | vectors, rescored against | documents | candidates "
          "(of the passages) | nDCG@10 | of float32 | Recall@10 |")
    for documents in args.documents:
        depth = documents * int(index.info["max_passages_per_document"])
        base = _row(index, data.qrels, ids, "float32 (exact)", documents, depth, top_k(queries, vectors, depth,
                                                                                        normalized=True))
        for kind, rows_to in (("int8", "codes only"), ("binary", "codes only"), ("binary", "int8 rows"),
                              ("binary", "float rows")):
            for over in args.oversampling:
                found = compact_top_k(queries, codes[kind], kind, depth, ranges=ranges, oversampling=over,
                                      rescore_rows=against[rows_to])
                _row(index, data.qrels, ids, f"{kind} x{over}, {rows_to}", documents, depth * over, found, base)
    if args.copy:
        print("copy:", binary_int8_copy(args.index, Path(args.copy) / "binary_int8.index"))


def _row(index, qrels, ids, name, documents, candidates, found, base=None) -> float:
    figures = evaluate_run(qrels, doc_run(index, ids, *found, k=documents))
    share = min(candidates, len(index)) / len(index)
    print(f"| {name} | {documents} | {min(candidates, len(index))} ({share:.1%}) | {figures['ndcg@10']:.4f} | "
          f"{figures['ndcg@10'] / (base or figures['ndcg@10']):.4f} | {figures['recall@10']:.4f} |", flush=True)
    return figures["ndcg@10"]


def binary_int8_copy(source, out: Path) -> dict:
    """OUT: the index at `source` copied, then stored as `bertkit index --vectors binary --rescore-with int8`
    finishes a build (`index._store_codes`: the codes file written, the float rows dropped); its "vectors"."""
    shutil.copytree(source, out)
    info = json.loads((out / "index.json").read_text())
    info["vectors"] = _store_codes(out, "binary", "int8")
    (out / "index.json").write_text(json.dumps(info, indent=1))
    open_index(out)  # the copy passes the checks a search makes
    return info["vectors"]


def _sample_anon(peak: list, stop: threading.Event) -> None:
    """peak[0]: the largest RssAnon (MiB) seen, every 10 ms: what the process allocated, memory maps not counted."""
    while not stop.wait(0.01):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                peak[0] = max(peak[0], int(line.split()[1]) / 1024)


def _timed(run, queries, single):
    """(queries/s batched, queries/s one query per call over the first `single` queries, the batched answer)."""
    t0 = time.perf_counter()
    answer = run(queries)
    batched = len(queries) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for q in queries[:single]:
        run(q[None])
    return batched, single / (time.perf_counter() - t0), answer


def scale(args):
    """N vectors: the index's float rows, row i = normalise(row[i mod R] + e), e ~ N(0, sigma^2 / D) per
    dimension (seeded by block), written as float32 and as each kind of codes; the split's real queries.
    The kinds are timed in `--rounds` rounds, one kind after the other in each (interleaved: the machine's
    other load falls on all of them alike); the median round is reported."""
    index = open_index(args.index)
    base = np.asarray(index.float_rows("bench/compact_quality.py --scale"), np.float32)
    data = load_beir(args.data, args.split)
    queries = embed_queries(index.info, query_encoder(index.info, dtype="float32"), list(data.queries.values()))
    files = _scale_files(args, base)
    flat = np.load(files["float32"], mmap_mode="r")
    runs = {"float32": lambda q: top_k(q, flat, 10, normalized=True, query_block=64)}
    scanned = {"float32": flat.nbytes}
    for name in ("int8", "binary", "binary+int8"):
        t = map_safetensors(files[name])
        scanned[name] = t["codes"].nbytes
        runs[name] = (lambda t, kind: lambda q: compact_top_k(q, t["codes"], kind, 10, ranges=t.get("ranges"),
                                                              oversampling=args.oversampling[-1],
                                                              rescore_rows=t.get("rescore")))(t, name.split("+")[0])
    peak, stop = [0.0], threading.Event()
    sampler = threading.Thread(target=_sample_anon, args=(peak, stop), daemon=True)
    sampler.start()
    rounds, answers = {kind: [] for kind in runs}, {}
    for r in range(args.rounds):
        for kind, run in runs.items():
            load = os.getloadavg()[0]
            batched, single, (_, answers[kind]) = _timed(run, queries, args.single)
            rounds[kind].append({"batched": round(batched, 2), "single": round(single, 2), "load_1min": load})
            print(r, kind, json.dumps(rounds[kind][-1]), flush=True)
    stop.set()
    sampler.join()
    results = {}
    for kind in runs:
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(answers[kind].tolist(),
                                                                    answers["float32"].tolist())])
        results[kind] = {"bytes_on_disk": files[kind].stat().st_size, "bytes_scanned": scanned[kind],
                         "queries_per_s_batched": float(np.median([x["batched"] for x in rounds[kind]])),
                         "queries_per_s_single": float(np.median([x["single"] for x in rounds[kind]])),
                         "recall@10_vs_float32": round(float(recall), 4), "rounds": rounds[kind]}
    if args.cold:
        results["binary+int8, rows read cold"] = cold_rows(files["binary+int8"], queries, args)
    print(json.dumps({"n": args.scale, "dim": base.shape[1], "queries": len(queries), "single": args.single,
                      "sigma": args.sigma, "oversampling": args.oversampling[-1], "numpy": np.__version__,
                      "threads": os.environ.get("OMP_NUM_THREADS"), "peak_rss_anon_mib": round(peak[0]),
                      **results}, indent=1))


def cold_rows(path: Path, queries: np.ndarray, args) -> dict:
    """One query per call against binary codes held in memory (a copy, as the references keep the binary index)
    with the candidates' int8 rows read from the file: before each query the rows' pages are dropped from the
    page cache (`posix_fadvise(DONTNEED)` on their byte range, the file mapped afresh), so each query reads its
    candidates' rows from the disk (on a virtual machine, from what the host's cache holds). The same calls with
    the rows left in the cache alternate with them, query by query. Median seconds per query of each."""
    codes = np.array(map_safetensors(path)["codes"])
    fd = os.open(path, os.O_RDONLY)
    times = {"cold": [], "warm": []}
    try:
        for q in queries[: args.single * args.rounds]:
            for state in ("cold", "warm"):
                rows = map_safetensors(path)
                if state == "cold":
                    os.posix_fadvise(fd, rows["rescore"].offset, rows["rescore"].nbytes, os.POSIX_FADV_DONTNEED)
                t0 = time.perf_counter()
                compact_top_k(q[None], codes, "binary", 10, ranges=rows["ranges"],
                              oversampling=args.oversampling[-1], rescore_rows=rows["rescore"])
                times[state].append(time.perf_counter() - t0)
                del rows  # unmapped: pages still mapped would not leave the cache
    finally:
        os.close(fd)
    out = {f"ms_per_query_{k}": round(1000 * float(np.median(v)), 2) for k, v in times.items()}
    print("rows read cold", json.dumps(out), flush=True)
    return {**out, "queries": len(times["cold"]), "candidates_per_query": 10 * args.oversampling[-1]}


def _scale_files(args, base: np.ndarray) -> dict:
    """The N vectors (.npy) and their codes files in `--work`; kept from an earlier run with the same settings."""
    n, d, work = args.scale, base.shape[1], Path(args.work)
    files = {"float32": work / "vectors.npy", "int8": work / "codes_int8.safetensors",
             "binary": work / "codes_binary.safetensors", "binary+int8": work / "codes_binary_int8.safetensors"}
    made = {"n": n, "sigma": args.sigma, "index": str(Path(args.index).resolve())}
    if (work / "made.json").is_file() and json.loads((work / "made.json").read_text()) == made:
        return files
    work.mkdir(parents=True, exist_ok=True)
    vectors = np.lib.format.open_memmap(files["float32"], "w+", np.float32, (n, d))
    for start in range(0, n, 65536):
        rows = np.arange(start, min(n, start + 65536))
        noise = np.random.default_rng([1, start]).standard_normal((len(rows), d)).astype(np.float32)
        part = base[rows % len(base)] + noise * (args.sigma / d**0.5)
        vectors[start : start + len(rows)] = part / np.linalg.norm(part, axis=1, keepdims=True)
    vectors.flush()
    for name, kind, rows_to in (("int8", "int8", None), ("binary", "binary", None), ("binary+int8", "binary", "int8")):
        with open(files[name], "wb") as f:
            codes_writer(vectors, kind, rows_to)(f)
    (work / "made.json").write_text(json.dumps(made))
    return files


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index")
    p.add_argument("--data")
    p.add_argument("--split", default="test")
    p.add_argument("--oversampling", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--documents", type=int, nargs="+", default=[100, 10], help="documents asked for (a hybrid "
                   "search or evaluate asks 100; search -k 10 asks 10): the candidates are fewer")
    p.add_argument("--copy", help="also write FOLDER/binary_int8.index (see above)")
    p.add_argument("--scale", type=int, help="also time N vectors made from the index's (size and queries/s)")
    p.add_argument("--work", default="/tmp/compact_scale", help="--scale: the folder of the N vectors' files")
    p.add_argument("--sigma", type=float, default=0.3, help="--scale: the noise added to each repeated vector")
    p.add_argument("--single", type=int, default=20, help="--scale: queries timed one per call")
    p.add_argument("--rounds", type=int, default=3, help="--scale: rounds of timing, the kinds interleaved")
    p.add_argument("--cold", action="store_true", help="--scale: also time binary + int8 rows with the rows' pages "
                   "dropped from the page cache before each query (read from the disk), against the same left cached")
    args = p.parse_args()
    if args.scale:
        scale(args)
    elif args.index:
        quality(args)
