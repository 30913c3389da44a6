"""How far one machine goes: exact search, FAISS HNSW and the Qdrant export at 100k to 1M vectors.

The figures docs/search.md asks for ("Approximate search", "How far one machine goes"), measured
through the code `bertkit search` runs, on vectors written as a bertkit index holds them:

1. Real vectors: `--real` Gutenberg sentences (`shared/data/pretrain_corpus`, split at . ! ?, 5 to
   60 words, deduplicated, shuffled with seed 0) embedded with the default model
   (`bertkit.retrieval.encoding.encode`, `--dtype`, bf16 by default), plus `--queries` further
   sentences as the held-out queries: they are not in any base set.
2. N base vectors per size (`--sizes`), a stated synthetic mix around the real ones. `neighbours`
   (default): rows 0..R-1 are the R real vectors; every further row is
       normalise(a + w (b - a) + e),  a a random real vector, b one of a's 10 nearest real
       vectors, w ~ U(0, 1), e ~ N(0, sigma^2 / D) per dimension (|e| ~ sigma, `--sigma` 0.2),
   points on and around the segments between real neighbours, so a neighbourhood looks like
   the model's. `isotropic`: every row and every query a Gaussian draw, normalised: no
   structure at all, the hardest unrealistic case. Rows are drawn in fixed blocks of 65,536
   from seeds (mix, block), so a smaller set is a prefix of a bigger one.
   Each set is an index folder under `--work` (`vectors.safetensors` memory-mapped by
   `bertkit.retrieval.index.open_index`, `passages.jsonl`, `index.json`).
3. Per size, each in a fresh subprocess (so its peak memory is its own), with
   OMP/BLAS threads = `--threads`:
   - exact: `bertkit.retrieval.search.best_documents` (the scan `bertkit search` runs: blocks
     of 16,384 vectors, 64 queries per pass), all queries in one call ("batched") and
     `--single` queries one call each; peak memory;
   - reference: the top 10 of `--check` queries by a plain float64 numpy product over every
     vector, against the exact scan's ids and scores (1e-6);
   - hnsw build: `bertkit.retrieval.ann.build_hnsw` (M `--m`, `--ef-construction`): time,
     memory, file size;
   - hnsw search: `bertkit.retrieval.ann.ann_top_k` at each `--ef-search`, batched and one query
     per call; recall@10 against the exact scan's top 10 on every held-out query;
   - qdrant: `bertkit.retrieval.qdrant.export` of the `--qdrant-size` set (default 20,000: local
     mode commits each point to SQLite on its own) into local mode (a folder, in-process),
     vectors/s; `bertkit.retrieval.qdrant.search_vectors`' top 10 against the exact scan's on
     `--check` queries.
4. 10M vectors, computed from the measured figures (stated as computed).

Memory is read from /proc/self/status: VmHWM (peak resident, memory-mapped file pages
included: page cache the kernel may drop) and RssAnon sampled every 5 ms (what the process
allocated itself). Every step's result is kept in `--work/results/`, so a rerun (or a run
killed and started again) redoes only what is missing; `--fresh` measures again.

    OMP_NUM_THREADS=1 python bench/bench_search_scale.py --sizes 100000 1000000 --work /tmp/scale
    python bench/bench_search_scale.py --sizes 20000 50000 --real 5000 --queries 500 --work /tmp/scale-smoke
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import SHARED_DATA, machine_line, report  # noqa: E402

from bertkit.retrieval.ann import ann_top_k, build_hnsw, read_hnsw  # noqa: E402  (faiss: imported when used)
from bertkit.retrieval.encoding import encode, encoder_and_settings  # noqa: E402
from bertkit.retrieval.index import FORMAT, INDEX_JSON, PASSAGES, VECTORS, open_index  # noqa: E402
from bertkit.retrieval.qdrant import export, search_vectors  # noqa: E402  (qdrant-client: imported when used)
from bertkit.retrieval.search import best_documents  # noqa: E402
from bertkit.data.vector_files import safetensors_header  # noqa: E402

DIM = 384
BLOCK = 65536  # rows drawn per seeded block
NEAREST = 10  # the neighbours b is drawn from
MIB = 1 << 20


# --- memory --------------------------------------------------------------------------------------

def _status() -> dict:
    """Resident memory now (bytes): VmHWM, VmRSS, RssAnon, RssFile."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def watch_memory(every: float = 0.005):
    """Start sampling; the returned function stops and gives {baseline_anon, peak_anon, peak_rss}."""
    start = _status()
    peak = {"anon": start["RssAnon"]}
    stop = threading.Event()

    def sample():
        while not stop.wait(every):
            peak["anon"] = max(peak["anon"], _status()["RssAnon"])

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()

    def finish() -> dict:
        stop.set()
        thread.join()
        now = _status()
        return {"baseline_anon": start["RssAnon"], "peak_anon": max(peak["anon"], now["RssAnon"]),
                "peak_rss": now["VmHWM"]}

    return finish


# --- the vectors ---------------------------------------------------------------------------------

def gutenberg_sentences(count: int, seed: int = 0) -> list[str]:
    """`count` distinct sentences of 5 to 60 words from the Gutenberg books, shuffled by `seed`."""
    seen = set()
    for path in sorted((SHARED_DATA / "pretrain_corpus" / "gutenberg").glob("*.txt")):
        for paragraph in path.read_text(encoding="utf-8").split("\n\n"):
            for sentence in re.split(r"(?<=[.!?])\s+", " ".join(paragraph.split())):
                if 5 <= len(sentence.split()) <= 60:
                    seen.add(sentence)
    sentences = sorted(seen)
    random.Random(seed).shuffle(sentences)
    if len(sentences) < count:
        raise SystemExit(f"the corpus has {len(sentences)} sentences, fewer than the {count} asked for")
    return sentences[:count]


def real_vectors(work: Path, real: int, queries: int, dtype: str) -> dict:
    """Encode (once; cached in WORK/real.npz) `queries` + `real` sentences: queries first."""
    path = work / f"real-{real}-{queries}-{dtype}.npz"
    if not path.is_file():
        sentences = gutenberg_sentences(queries + real)
        loaded, settings = encoder_and_settings(None, dtype=dtype)
        t0 = time.perf_counter()
        vectors = encode(sentences, loaded, settings, batch_size=64, progress=True)
        seconds = time.perf_counter() - t0
        meta = {"model": settings.model, "pooling": settings.pooling, "max_length": settings.max_length,
                "dtype": settings.dtype, "sentences": len(sentences), "encode_seconds": seconds}
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, vectors=vectors, sentences=np.array(sentences), meta=json.dumps(meta))
        os.replace(tmp, path)
    data = np.load(path)
    vectors = data["vectors"]
    return {"queries": vectors[:queries], "base": vectors[queries:],
            "sentences": [str(s) for s in data["sentences"][queries:]], "meta": json.loads(str(data["meta"]))}


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def nearest_real(base: np.ndarray, k: int = NEAREST) -> np.ndarray:
    """[R, k] rows of each real vector's k nearest other real vectors (cosine)."""
    out = np.empty((len(base), k), dtype=np.int64)
    for start in range(0, len(base), 2048):
        scores = base[start : start + 2048] @ base.T  # [b, R]
        scores[np.arange(len(scores)), np.arange(start, start + len(scores))] = -np.inf  # not itself
        out[start : start + len(scores)] = np.argpartition(-scores, k, axis=1)[:, :k]
    return out


def draw_block(mix: str, number: int, rows: int, base: np.ndarray, near: np.ndarray | None, sigma: float):
    """Rows of synthetic block `number` [rows, D] and their passage texts."""
    rng = np.random.default_rng([0 if mix == "neighbours" else 1, number])
    if mix == "isotropic":
        return _unit(rng.standard_normal((rows, DIM))), [f"isotropic {number}.{i}" for i in range(rows)]
    a = rng.integers(0, len(base), rows)
    b = near[a, rng.integers(0, near.shape[1], rows)]
    w = rng.random(rows, dtype=np.float32)[:, None]
    noise = rng.standard_normal((rows, DIM), dtype=np.float32) * (sigma / np.sqrt(DIM))
    texts = [f"mix of real rows {i} and {j}, w {x:.3f}" for i, j, x in zip(a, b, w[:, 0])]
    return _unit(base[a] + w * (base[b] - base[a]) + noise), texts


def write_index(folder: Path, n: int, mix: str, real: dict, sigma: float) -> None:
    """An index folder of n vectors as `bertkit index` lays it out (index.json written last)."""
    if (folder / INDEX_JSON).is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    base = real["base"]
    near = nearest_real(base) if mix == "neighbours" else None
    first = (base, real["sentences"]) if mix == "neighbours" else (np.empty((0, DIM), np.float32), [])
    header = safetensors_header({"vectors": ("F32", (n, DIM)), "document": ("I64", (n,)),
                                 "passage_offset": ("I64", (n + 1,))})
    offsets, written = [0], 0
    with open(folder / (VECTORS + ".tmp"), "wb") as vf, open(folder / (PASSAGES + ".tmp"), "wb") as pf:
        vf.write(header)

        def put(vectors, texts):
            nonlocal written
            take = min(len(vectors), n - written)
            vf.write(np.ascontiguousarray(vectors[:take], dtype="<f4").tobytes())
            for i, text in enumerate(texts[:take]):
                line = json.dumps({"id": str(written + i), "doc_id": str(written + i), "title": "", "start": 0,
                                   "end": len(text), "text": text}, ensure_ascii=False).encode() + b"\n"
                pf.write(line)
                offsets.append(offsets[-1] + len(line))
            written += take

        put(*first)
        number = 0
        while written < n:
            put(*draw_block(mix, number, BLOCK, base, near, sigma))
            number += 1
        vf.write(np.arange(n, dtype="<i8").tobytes())  # one document per passage
        vf.write(np.asarray(offsets, dtype="<i8").tobytes())
    os.replace(folder / (VECTORS + ".tmp"), folder / VECTORS)
    os.replace(folder / (PASSAGES + ".tmp"), folder / PASSAGES)
    meta = real["meta"]
    info = {"format": FORMAT, "model": {"directory": meta["model"], "fingerprint": "synthetic",
                                        "pooling": meta["pooling"], "normalize": True,
                                        "max_length": meta["max_length"], "precision": meta["dtype"]},
            "passage_tokens": meta["max_length"], "overlap": 0, "passages": n, "documents": n,
            "documents_without_tokens": 0, "dim": DIM, "max_passages_per_document": 1,
            "corpus": f"bench_search_scale: {mix} mix, sigma {sigma}, {len(base)} real vectors"}
    (folder / INDEX_JSON).write_text(json.dumps(info, indent=2) + "\n")


# --- the measurements, each in its own process ----------------------------------------------------

def child_exact(job: dict) -> dict:
    index = open_index(job["index"])
    queries = np.load(job["queries"])
    finish = watch_memory()
    best_documents(index, queries[:1], 10)  # warm-up: the scan pages the vectors in once
    t0 = time.perf_counter()
    rows, scores = best_documents(index, queries, 10)
    batched = time.perf_counter() - t0
    single = queries[: job["single"]]
    t0 = time.perf_counter()
    for q in single:
        best_documents(index, q[None], 10)
    one = time.perf_counter() - t0
    memory = finish()
    np.savez(job["truth"], rows=np.array(rows, dtype=np.int64), scores=np.array(scores, dtype=np.float32))
    return {"qps_batched": len(queries) / batched, "qps_single": len(single) / one, "single_queries": len(single),
            **memory}


def child_reference(job: dict) -> dict:
    index = open_index(job["index"])
    queries = np.load(job["queries"])[: job["check"]].astype(np.float64)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    truth = np.load(job["truth"])
    n = len(index)
    scores = np.empty((len(queries), n))
    for start in range(0, n, 1 << 17):  # float64 over every vector, no blocking tricks of ours
        scores[:, start : start + (1 << 17)] = queries @ np.asarray(index.vectors[start : start + (1 << 17)],
                                                                   dtype=np.float64).T
    same, near_tie, worst = 0, 0, 0.0
    for s, rows, ours in zip(scores, truth["rows"], truth["scores"]):
        top = np.lexsort((np.arange(n), -s))[:10]
        worst = max(worst, float(np.abs(s[rows] - ours).max()))  # our score of each row we returned
        if np.array_equal(top, rows):
            same += 1
        elif np.abs(np.sort(s[top]) - np.sort(s[rows])).max() <= 1e-6:
            near_tie += 1  # another row within 1e-6 of the 10th: float32 cannot order them
    return {"queries": len(queries), "same_ids": same, "near_ties": near_tie, "max_score_diff": worst}


def child_hnsw_build(job: dict) -> dict:
    index = open_index(job["index"])
    finish = watch_memory()
    t0 = time.perf_counter()
    build_hnsw(index.vectors, job["graph"], m=job["m"], ef_construction=job["ef_construction"], progress=True)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "file_bytes": os.path.getsize(job["graph"]), **finish()}


def child_hnsw_search(job: dict) -> dict:
    queries = np.load(job["queries"])
    truth = np.load(job["truth"])["rows"]
    finish = watch_memory()
    t0 = time.perf_counter()
    graph = read_hnsw(job["graph"])
    load = time.perf_counter() - t0
    out = {}
    for ef in job["ef_search"]:
        ann_top_k(graph, queries[:10], 10, ef)  # warm-up
        t0 = time.perf_counter()
        _, rows = ann_top_k(graph, queries, 10, ef)
        batched = time.perf_counter() - t0
        t0 = time.perf_counter()
        for q in queries:
            ann_top_k(graph, q[None], 10, ef)
        one = time.perf_counter() - t0
        recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(rows.tolist(), truth.tolist())])
        out[str(ef)] = {"recall@10": float(recall), "qps_batched": len(queries) / batched,
                        "qps_single": len(queries) / one}
    return {"load_seconds": load, "ef": out, **finish()}


def child_qdrant(job: dict) -> dict:
    index = open_index(job["index"])
    shutil.rmtree(job["location"], ignore_errors=True)
    finish = watch_memory()
    t0 = time.perf_counter()
    n = export(index, job["location"], "scale", progress=True)
    seconds = time.perf_counter() - t0
    memory = finish()
    queries = np.load(job["queries"])[: job["check"]]
    truth = np.load(job["truth"])
    t0 = time.perf_counter()
    answers = search_vectors(job["location"], "scale", queries, k=10)
    search_seconds = time.perf_counter() - t0
    same = sum([int(h.id) for h in hits] == rows.tolist() for hits, rows in zip(answers, truth["rows"]))
    worst = max(float(np.abs(np.array([h.score for h in hits]) - s).max())
                for hits, s in zip(answers, truth["scores"]))
    shutil.rmtree(job["location"], ignore_errors=True)  # a local-mode copy of the index: disk, not a result
    return {"points": n, "seconds": seconds, "vectors_per_s": n / seconds, "checked": len(answers),
            "same_top10": same, "max_score_diff": worst, "search_seconds": search_seconds, **memory}


CHILDREN = {"exact": child_exact, "reference": child_reference, "hnsw_build": child_hnsw_build,
            "hnsw_search": child_hnsw_search, "qdrant": child_qdrant}


def run_step(work: Path, name: str, job: dict, threads: int, fresh: bool) -> dict:
    """`job` in a fresh process (threads pinned), its result kept as WORK/results/NAME.json."""
    path = work / "results" / f"{name}.json"
    job = {**job, "threads": threads}
    if path.is_file() and not fresh:
        saved = json.loads(path.read_text())
        if saved.get("job") == job:
            return saved["result"]
    env = {**os.environ, **{v: str(threads) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                      "MKL_NUM_THREADS")}}
    print(f"[{time.strftime('%H:%M:%S')}] {name} ...", file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(job)], env=env, stdout=subprocess.PIPE,
                          text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["load"] = os.getloadavg()[0]  # the 1-minute load average as the step ended
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"job": job, "result": result}, indent=2) + "\n")
    return result


# --- the report ----------------------------------------------------------------------------------

def mib(x) -> str:
    return f"{x / MIB:,.0f} MiB"


def measure_size(work: Path, args, mix: str, n: int, real: dict) -> dict:
    folder = work / f"{mix}-{n}"
    write_index(folder, n, mix, real, args.sigma)
    queries = work / f"queries-{mix}.npy"
    tag = f"{mix}-{n}"
    truth = str(folder / "exact-top10.npz")
    out = {"n": n, "vectors_bytes": n * DIM * 4}
    out["exact"] = run_step(work, f"{tag}-exact", {"kind": "exact", "index": str(folder), "queries": str(queries),
                                                   "single": args.single, "truth": truth}, args.threads, args.fresh)
    out["reference"] = run_step(work, f"{tag}-reference", {"kind": "reference", "index": str(folder),
                                                           "queries": str(queries), "check": args.check,
                                                           "truth": truth}, args.threads, args.fresh)
    graph = str(folder / f"hnsw-M{args.m}-efc{args.ef_construction}.faiss")
    out["hnsw_build"] = run_step(work, f"{tag}-hnsw-build-M{args.m}-efc{args.ef_construction}",
                                 {"kind": "hnsw_build", "index": str(folder), "graph": graph, "m": args.m,
                                  "ef_construction": args.ef_construction}, args.threads, args.fresh)
    out["hnsw_search"] = run_step(work, f"{tag}-hnsw-search-M{args.m}-efc{args.ef_construction}",
                                  {"kind": "hnsw_search", "graph": graph, "queries": str(queries), "truth": truth,
                                   "ef_search": args.ef_search}, args.threads, args.fresh)
    return out


def tables(results: dict, args, real: dict, line: str, load: str) -> str:
    md = [f"Machine: {line}", f"Load: {load}", "",
          f"Real vectors: {real['meta']['sentences']} Gutenberg sentences ({args.queries} held out as queries) "
          f"embedded by the default model in {real['meta']['dtype']}; threads {args.threads}; queries best-first "
          f"top 10; exact = `best_documents` (blocks of 16,384, 64 queries per pass).", ""]
    for mix, sizes in results["mixes"].items():
        md += [f"### {mix} mix" + (f" (sigma {args.sigma})" if mix == "neighbours" else ""), "",
               "| N | vectors N x 384 x 4 | exact q/s batched | exact q/s one by one | exact peak anon (baseline) "
               "| peak RSS incl. mapped file | ids = numpy float64 (1e-6) |",
               "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for s in sizes:
            e, r = s["exact"], s["reference"]
            md.append(f"| {s['n']:,} | {mib(s['vectors_bytes'])} | {e['qps_batched']:,.1f} | {e['qps_single']:,.2f} "
                      f"| {mib(e['peak_anon'])} ({mib(e['baseline_anon'])}) | {mib(e['peak_rss'])} "
                      f"| {r['same_ids']}/{r['queries']} same" + (f", {r['near_ties']} near-ties" if r['near_ties']
                                                                 else "") + f", max diff {r['max_score_diff']:.1e} |")
        md += ["", f"HNSW M {args.m}, efConstruction {args.ef_construction}:", "",
               "| N | build s | build peak anon | graph file | efSearch | recall@10 | q/s batched | vs exact "
               "| q/s one by one | vs exact |", "|" + " ---: |" * 10]
        for s in sizes:
            b, e = s["hnsw_build"], s["exact"]
            for i, (ef, h) in enumerate(s["hnsw_search"]["ef"].items()):
                head = (f"| {s['n']:,} | {b['seconds']:,.0f} | {mib(b['peak_anon'])} | {mib(b['file_bytes'])} "
                        if i == 0 else "| | | | ")
                md.append(head + f"| {ef} | {h['recall@10']:.4f} | {h['qps_batched']:,.0f} "
                          f"| {h['qps_batched'] / e['qps_batched']:,.1f}x | {h['qps_single']:,.0f} "
                          f"| {h['qps_single'] / e['qps_single']:,.0f}x |")
        md += ["", "Lowest efSearch with recall@10 >= 0.95:", ""]
        for s in sizes:
            ok = [(int(ef), h) for ef, h in s["hnsw_search"]["ef"].items() if h["recall@10"] >= 0.95]
            if ok:
                ef, h = min(ok)
                md.append(f"- N {s['n']:,}: efSearch {ef}, recall@10 {h['recall@10']:.4f}, "
                          f"{h['qps_batched'] / s['exact']['qps_batched']:,.1f}x exact's q/s batched, "
                          f"{h['qps_single'] / s['exact']['qps_single']:,.0f}x one by one")
            else:
                md.append(f"- N {s['n']:,}: no efSearch tried reaches 0.95")
        md += ["", computed_10m(sizes, args), ""]
    loads = [f"{mix} {s['n']:,} {step} {s[step]['load']:.1f}" for mix, sizes in results["mixes"].items()
             for s in sizes for step in ("exact", "hnsw_build", "hnsw_search") if "load" in s[step]]
    md += ["Load average (1 min) as each step ended: " + "; ".join(loads) + ".", ""]
    if "qdrant" in results:
        q = results["qdrant"]
        md += ["### Qdrant local mode", "",
               f"`export` of {q['points']:,} vectors ({results['qdrant_mix']} mix) into a local-mode folder: "
               f"{q['seconds']:,.1f} s, {q['vectors_per_s']:,.0f} vectors/s, peak anon {mib(q['peak_anon'])}; "
               f"`search_vectors` top 10 equal to the exact scan's on {q['same_top10']}/{q['checked']} queries "
               f"(max score diff {q['max_score_diff']:.1e}; {q['search_seconds']:.1f} s for the {q['checked']}, "
               "client start included).", ""]
    return "\n".join(md)


def computed_10m(sizes: list[dict], args) -> str:
    """Memory and q/s at 10M, computed from the largest measured size (and the one below it)."""
    big = sizes[-1]
    scale = 10_000_000 / big["n"]
    e, b = big["exact"], big["hnsw_build"]
    graph = b["file_bytes"] * scale
    lines = [f"Computed for 10,000,000 vectors from N {big['n']:,} (not measured): the vectors file "
             f"{10_000_000 * DIM * 4 / 2**30:.1f} GiB. Exact: q/s falls as 1/N, "
             f"{e['qps_batched'] / scale:,.2f} batched and {e['qps_single'] / scale:,.3f} one by one; its own "
             f"memory stays as measured ({mib(e['peak_anon'] - e['baseline_anon'])} above the process's "
             f"baseline), but every pass of 64 queries reads the whole file, so at that speed the file must "
             f"sit in the page cache. HNSW: the graph holds every vector in memory, {graph / 2**30:.1f} GiB "
             f"(the graph file scaled by N); building it takes at least {b['seconds'] * scale / 3600:,.1f} h "
             f"at these threads ({scale:,.0f}x the measured build; the cost per vector grows with N)"]
    if len(sizes) >= 2:
        small = sizes[-2]
        decades = np.log10(big["n"] / small["n"])
        growth = ((b["seconds"] / big["n"]) / (small["hnsw_build"]["seconds"] / small["n"])) ** (1 / decades)
        lines.append(f", about {b['seconds'] * scale * growth / 3600:,.1f} h if it grows by the factor "
                     f"measured from N {small['n']:,} to {big['n']:,} ({growth:.2f} per decade)")
        fast, slow = big["hnsw_search"]["ef"], small["hnsw_search"]["ef"]
        lines.append("; per decade of N the measured HNSW q/s changed by " + ", ".join(
            f"{(fast[ef]['qps_batched'] / slow[ef]['qps_batched']) ** (1 / decades):.2f}x (efSearch {ef})"
            for ef in fast if ef in slow) + ", and a given recall needs a larger efSearch as N grows")
    return "".join(lines) + "."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--work", type=Path, default=Path("/tmp/scale"), help="vectors, indexes, graphs and results")
    ap.add_argument("--mixes", nargs="+", default=["neighbours"], choices=["neighbours", "isotropic"])
    ap.add_argument("--real", type=int, default=20_000, help="real sentences embedded for the base sets")
    ap.add_argument("--queries", type=int, default=1_000, help="held-out real sentences as queries")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--sigma", type=float, default=0.2, help="norm of the noise added to the neighbours mix")
    ap.add_argument("--single", type=int, default=20, help="queries timed one call each on the exact scan")
    ap.add_argument("--check", type=int, default=20, help="queries checked against numpy and against Qdrant")
    ap.add_argument("--m", type=int, default=32)
    ap.add_argument("--ef-construction", type=int, default=200)
    ap.add_argument("--ef-search", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    ap.add_argument("--qdrant-size", type=int, default=20_000, help="vectors exported to Qdrant's local mode "
                    "(0: skip); it commits every point to SQLite, ~100 points/s here")
    ap.add_argument("--threads", type=int, default=1, help="OpenMP/BLAS threads of every measuring process")
    ap.add_argument("--fresh", action="store_true", help="measure again instead of reusing WORK/results")
    ap.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks.md")
    args = ap.parse_args(argv)
    if args.child:
        job = json.loads(args.child)
        print(json.dumps(CHILDREN[job["kind"]](job)))
        return 0

    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    real = real_vectors(work, args.real, args.queries, args.dtype)
    results = {"mixes": {}}
    for mix in args.mixes:
        queries = real["queries"]
        if mix == "isotropic":
            queries = _unit(np.random.default_rng([2, 0]).standard_normal((args.queries, DIM)))
        np.save(work / f"queries-{mix}.npy", queries)
        results["mixes"][mix] = [measure_size(work, args, mix, n, real) for n in sorted(args.sizes)]
    if args.qdrant_size:
        mix = args.mixes[0]
        folder = work / f"{mix}-{args.qdrant_size}"
        write_index(folder, args.qdrant_size, mix, real, args.sigma)
        truth = str(folder / "exact-top10.npz")
        run_step(work, f"{mix}-{args.qdrant_size}-exact",
                 {"kind": "exact", "index": str(folder), "queries": str(work / f"queries-{mix}.npy"),
                  "single": args.single, "truth": truth}, args.threads, args.fresh)
        results["qdrant_mix"] = mix
        results["qdrant"] = run_step(work, f"{mix}-{args.qdrant_size}-qdrant",
                                     {"kind": "qdrant", "index": str(folder), "location": str(work / "qdrant"),
                                      "queries": str(work / f"queries-{mix}.npy"), "truth": truth,
                                      "check": args.check}, args.threads, args.fresh)
    (work / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    load = "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg())
    report("search_scale", tables(results, args, real, machine_line("faiss-cpu", "qdrant-client"), load), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
