"""`bertkit evaluate retrieval DIR --index INDEX [--rerank MODEL --rerank-top N]`: the figures of an index as it
serves, equal to those computed by hand from `bertkit search --json` answers scored with `evaluate_run`."""

import json

import pytest
from test_index import OVERLAP, TOKENS
from test_retrieval_beir import scifact_slice
from test_search import cross_encoder

from bertkit.cli import main
from bertkit.data.beir import load_beir
from bertkit.retrieval.index import build_index
from bertkit.metrics.retrieval import evaluate_run

MEASURES = ("ndcg@10", "mrr@10", "map@100", "recall@10", "recall@100")


@pytest.fixture(scope="module")
def setup(shared_data, tiny_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate_index")
    folder = scifact_slice(shared_data, root / "sf", n_queries=6, n_extra=10)
    build_index(folder / "corpus.jsonl", root / "index", str(tiny_dir), passage_tokens=TOKENS, overlap=OVERLAP,
                batch_size=64, dtype="float32", progress=False)
    return {"root": root, "folder": folder, "index": root / "index", "cross": cross_encoder(root / "cross", "pair", 2)}


def by_hand(setup, capsys, *flags, ranked=False):
    """The split's queries through `bertkit search --json` (100 documents each), scored by evaluate_run."""
    data = load_beir(setup["folder"], "test")
    ids = list(data.queries)
    (setup["root"] / "q.txt").write_text("\n".join(data.queries[q] for q in ids) + "\n")
    dtype = [] if "lexical" in flags and "--rerank" not in flags else ["--dtype", "float32"]  # lexical: no encoder
    assert main(["search", str(setup["index"]), "--queries", str(setup["root"] / "q.txt"), "-k", "100", "--json",
                 *dtype, *flags]) == 0
    answers = json.loads(capsys.readouterr().out)
    # a reranked answer mixes cross-encoder and cosine scores: its run scores documents by their place
    run = {q: {h["doc_id"]: float(len(hits) - rank) if ranked else h["score"] for rank, h in enumerate(hits)}
           for q, hits in zip(ids, answers)}
    return evaluate_run(data.qrels, run)


@pytest.mark.parametrize("rerank", [False, True])
def test_index_figures_equal_bertkit_search_scored_by_hand(setup, capsys, rerank):
    out = setup["root"] / f"figures_{rerank}.json"
    flags = ["--rerank", str(setup["cross"]), "--rerank-top", "5"] if rerank else []
    assert main(["evaluate", "retrieval", str(setup["folder"]), "--index", str(setup["index"]), "--dtype", "float32",
                 "--output", str(out), "--quiet", *flags]) == 0
    printed = capsys.readouterr().out
    assert f"through {setup['index']}" in printed and ("index, hybrid" in printed)
    assert ("+ rerank" in printed) == rerank
    got = json.loads(out.read_text())
    want = by_hand(setup, capsys, *flags, ranked=rerank)
    assert {m: got[m] for m in MEASURES} == pytest.approx(want, abs=1e-9)
    assert got["index"]["documents"] == got["documents"]  # the index holds every document of the corpus
    assert got["index"]["rerank"] == ({"model": str(setup["cross"]), "top": 5} if rerank else None)


def test_the_pairs_the_cross_encoder_reads_cut_are_said(setup, capsys, transformers_mod):
    """evaluate retrieval --rerank scored a cross-encoder on (query, passage) pairs it read cut at its max_length,
    unsaid (a reranker at finetune's default 128 tokens, passages of 256): one warning now counts them, as `search
    --rerank` says it. Reference: transformers' count of each query with each of its first stage's best 5 passages
    (`bertkit search --json`), uncut, against the model's max_length (lowered to the passages' 32 tokens)."""
    import re
    import shutil

    cross = shutil.copytree(setup["cross"], setup["root"] / "cross_short")
    info = json.loads((cross / "bertkit_task.json").read_text())
    (cross / "bertkit_task.json").write_text(json.dumps({**info, "max_length": TOKENS}))
    data = load_beir(setup["folder"], "test")
    (setup["root"] / "q.txt").write_text("\n".join(data.queries.values()) + "\n")
    assert main(["search", str(setup["index"]), "--queries", str(setup["root"] / "q.txt"), "-k", "100", "--json",
                 "--dtype", "float32"]) == 0
    first = json.loads(capsys.readouterr().out)
    fast = transformers_mod.BertTokenizerFast.from_pretrained(str(cross))
    cut = sum(len(fast(q, h["text"])["input_ids"]) > TOKENS for q, hits in zip(data.queries.values(), first)
              for h in hits[:5])
    assert cut > 0
    with pytest.warns(UserWarning, match=rf"^--rerank {re.escape(str(cross))}: {cut} of {5 * len(first)} "
                      rf"\(query, passage\) pairs are longer than the {TOKENS} tokens the model reads"):
        assert main(["evaluate", "retrieval", str(setup["folder"]), "--index", str(setup["index"]), "--dtype",
                     "float32", "--quiet", "--rerank", str(cross), "--rerank-top", "5"]) == 0


def test_reranking_changes_the_figures_only_through_the_top(setup, capsys):
    plain = by_hand(setup, capsys)
    top1 = by_hand(setup, capsys, "--rerank", str(setup["cross"]), "--rerank-top", "1", ranked=True)
    assert top1 == pytest.approx(plain)  # one document re-scored alone: nothing moves
    top5 = by_hand(setup, capsys, "--rerank", str(setup["cross"]), "--rerank-top", "5", ranked=True)
    assert top5["mrr@10"] != pytest.approx(plain["mrr@10"])  # the (random) cross-encoder re-orders the top 5
    assert top5["recall@100"] == pytest.approx(plain["recall@100"])  # ... and only re-orders it


def test_mode_all_prints_the_three_searches_as_served(setup, capsys, monkeypatch):
    from bertkit.retrieval.index import Index

    # scoring a run needs each hit's document and score, not its passage's text: every hit's line of
    # passages.jsonl was read and parsed (100 per query and mode), about half of the time on 8,000 queries,
    # and held until the end (~55 KB a query)
    read = []
    monkeypatch.setattr(Index, "passages", lambda self, rows: read.extend(rows) or [])
    out = setup["root"] / "modes.json"
    assert main(["evaluate", "retrieval", str(setup["folder"]), "--index", str(setup["index"]), "--dtype", "float32",
                 "--mode", "all", "--fusion", "rrf", "--rrf-k", "5", "--output", str(out), "--quiet"]) == 0
    assert read == []
    monkeypatch.undo()
    printed = capsys.readouterr().out
    assert "| index, dense |" in printed and "| index, lexical |" in printed
    assert "| index, hybrid (rrf, alpha 0.5, k 5) |" in printed
    got = json.loads(out.read_text())
    for mode, flags in (("dense", []), ("lexical", []), ("hybrid", ["--fusion", "rrf", "--rrf-k", "5"])):
        want = by_hand(setup, capsys, "--mode", mode, *flags, ranked=mode == "hybrid")
        assert {m: got["modes"][mode][m] for m in MEASURES} == pytest.approx(want, abs=1e-9), mode
    assert {m: got[m] for m in MEASURES} == {m: got["modes"]["hybrid"][m] for m in MEASURES}


def test_a_hybrid_search_holds_the_deep_runs_of_a_block_of_queries_at_a_time(setup, monkeypatch):
    # hybrid fuses each query's 100 best documents from each side: those runs were made for every query at once
    # and held until all were fused, ~25 KB a query (8,000 queries: +200 MB over a dense search), to keep 10 each
    import bertkit.retrieval.search as search_module
    from bertkit.retrieval.index import open_index

    index = open_index(setup["index"])
    queries = list(load_beir(setup["folder"], "test").queries.values())
    whole = search_module.search(index, queries, 3, dtype="float32", fusion={"mode": "hybrid"})
    asked, runs = [], search_module.ranked_runs
    monkeypatch.setattr(search_module, "ranked_runs",
                        lambda index, vectors, texts, *a, **o: asked.append(len(texts)) or runs(index, vectors, texts,
                                                                                                *a, **o))
    monkeypatch.setattr(search_module, "RUN_BLOCK", 2, raising=False)  # (main had none: all queries at once)
    blocked = search_module.search(index, queries, 3, dtype="float32", fusion={"mode": "hybrid"})
    # the same answers (the scores within float32 rounding: a matrix product of 2 queries sums in another order)
    assert [[h.id for h in hits] for hits in blocked] == [[h.id for h in hits] for hits in whole]
    assert [[h.score for h in hits] for hits in blocked] == [pytest.approx([h.score for h in hits], abs=1e-5)
                                                             for hits in whole]
    assert len(queries) > 2 and max(asked) == 2 and sum(asked) == len(queries)


@pytest.mark.parametrize("depth", [2, 12])
def test_a_shallow_fusion_is_scored_at_its_own_depth(setup, capsys, depth):
    """A hybrid search fuses each run's best max(k, --fusion-depth) documents; the evaluation asked for 100, so a
    fusion of depth 12 was scored fused 100 deep: the flag (or a tuned record) changed no figure. The figures are
    those of `bertkit search` with the search's default k 10 (-k 12 at depth 12: its first 10 are -k 10's)."""
    out = setup["root"] / f"depth{depth}.json"
    flags = ["--fusion-depth", str(depth)]
    assert main(["evaluate", "retrieval", str(setup["folder"]), "--index", str(setup["index"]), "--dtype", "float32",
                 "--mode", "hybrid", "--output", str(out), "--quiet", *flags]) == 0
    capsys.readouterr()
    got = json.loads(out.read_text())
    want = by_hand(setup, capsys, *flags, "-k", str(max(depth, 10)), ranked=True)
    assert {m: got[m] for m in MEASURES} == pytest.approx(want, abs=1e-9)


def test_tune_writes_the_pick_into_the_index_and_search_uses_it(setup, capsys, tmp_path):
    import shutil

    index = tmp_path / "index"
    shutil.copytree(setup["index"], index)
    assert main(["evaluate", "retrieval", str(setup["folder"]), "--index", str(index), "--dtype", "float32",
                 "--tune", "test", "--quiet", "--output", str(tmp_path / "t.json")]) == 0
    printed = capsys.readouterr().out
    assert "tuned on split test" in printed and f"written into {index}/index.json" in printed
    assert "tuned on the split scored below, so its figures are not held out" in printed
    tuning = json.loads((tmp_path / "t.json").read_text())["tuning"]
    fusion = json.loads((index / "index.json").read_text())["fusion"]
    best = max(tuning["table"], key=lambda r: (r["smoothed"], r["ndcg@10"]))
    assert (fusion["fusion"], fusion["alpha"], fusion["tuned_on"]) == (best["fusion"], best["alpha"], "test")
    # search and evaluate read it as their default
    from bertkit.retrieval.index import open_index
    from bertkit.retrieval.search import fusion_options

    assert fusion_options(open_index(index).info).fusion == best["fusion"]
    assert fusion_options(open_index(index).info).alpha == best["alpha"]
    assert fusion_options(open_index(index).info, {"alpha": 0.25}).alpha == 0.25  # a flag given wins


@pytest.mark.parametrize("argv, message", [
    (["--index", "{index}", "--mode", "sparse"], "unknown mode 'sparse'"),
    (["--index", "{index}", "--alpha", "-0.5"], "must be between 0 and 1"),
    (["--rerank", "{cross}"], "--rerank needs --index INDEX"),
    (["--index", "{index}", "--max-length", "16"], "--max-length does not apply with --index"),
    (["--index", "{index}", "--rerank", "{cross}", "--rerank-top", "0"], "argument --rerank-top: must be at least 1"),
])
def test_bad_index_options_are_one_line(setup, capsys, argv, message):
    argv = [a.format(cross=setup["cross"], index=setup["index"]) for a in argv]
    try:
        code = main(["evaluate", "retrieval", str(setup["folder"]), "--quiet", *argv])
    except SystemExit as stop:  # a count below 1 is refused by the parser
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_the_printed_precision_is_the_queries_and_the_passages(setup, tiny_dir, capsys):
    """An index built in bfloat16 and queried in float32: the line says both (it said "float32")."""
    index = setup["root"] / "index_bf16"
    build_index(setup["folder"] / "corpus.jsonl", index, str(tiny_dir), passage_tokens=TOKENS, overlap=OVERLAP,
                batch_size=64, dtype="bfloat16", progress=False)
    assert main(["evaluate", "retrieval", str(setup["folder"]), "--index", str(index), "--dtype", "float32",
                 "--quiet"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "(queries in float32, the index's passages in bfloat16, max length" in first


def _corpus_copy(setup, tmp_path, edit):
    """The setup's BEIR folder copied with its corpus lines passed through edit(lines) -> lines."""
    import shutil

    folder = tmp_path / "sf"
    shutil.copytree(setup["folder"], folder)
    lines = (folder / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    (folder / "corpus.jsonl").write_text("\n".join(edit(lines)) + "\n", encoding="utf-8")
    return folder


def test_an_index_of_another_corpus_is_refused_not_scored(setup, tiny_dir, tmp_path, capsys):
    """An index built from another corpus scored 0.0 (or a quietly lower or higher figure): each way the corpora
    differ is one line naming the index's corpus and a document; the same corpus is scored as before."""
    judged = {d for docs in load_beir(setup["folder"], "test").qrels.values() for d in docs}
    lines = (setup["folder"] / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    distractor = next(json.loads(line)["_id"] for line in lines if json.loads(line)["_id"] not in judged)
    cases = {
        # the corpus has a document the index lacks (a judged one: it could never be found)
        "lacks 1 of the": lambda ls: ls + [json.dumps({"_id": "new-doc", "title": "", "text": "A new abstract."})],
        # the index holds a document the corpus no longer has (a distractor: the qrels still hold)
        "are not in": lambda ls: [line for line in ls if json.loads(line)["_id"] != distractor],
    }
    for i, (words, edit) in enumerate(cases.items()):
        folder = _corpus_copy(setup, tmp_path / str(i), edit)
        assert main(["evaluate", "retrieval", str(folder), "--index", str(setup["index"]), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert words in err and f"was built from {setup['folder'] / 'corpus.jsonl'}" in err, err
        assert err.count("\n") == 1 and f"bertkit index {folder} -o INDEX" in err
    # a document without any token is left out of an index: the corpus that has it is still the index's corpus
    folder = _corpus_copy(setup, tmp_path / "blank", lambda ls: ls + [json.dumps({"_id": "blank", "text": "\u0000"})])
    build_index(folder / "corpus.jsonl", tmp_path / "blank.index", str(tiny_dir), passage_tokens=TOKENS,
                overlap=OVERLAP, batch_size=64, dtype="float32", progress=False)
    assert json.loads((tmp_path / "blank.index" / "index.json").read_text())["documents_without_tokens"] == 1
    for index in (tmp_path / "blank.index", setup["index"]):  # the index of this corpus; the index of one fewer
        code = main(["evaluate", "retrieval", str(folder), "--index", str(index), "--dtype", "float32", "--quiet"])
        err = capsys.readouterr().err
        assert code == (0 if index != setup["index"] else 2), err


def test_a_lexical_evaluation_through_an_index_needs_no_model(setup, tmp_path, capsys):
    """evaluate --index INDEX --mode lexical loaded the index's model to embed no query: an index whose model
    folder is gone (copied to another machine) was refused, "pass --model DIR", where `bertkit search --mode
    lexical` answers. It scores now as the index with its model does, and says no query was embedded."""
    import shutil

    moved = shutil.copytree(setup["index"], tmp_path / "moved")
    info = json.loads((moved / "index.json").read_text())
    info["model"]["directory"] = str(tmp_path / "gone")
    (moved / "index.json").write_text(json.dumps(info))
    scores = {}
    for index in (setup["index"], moved):
        out = tmp_path / f"{index.name}.json"
        assert main(["evaluate", "retrieval", str(setup["folder"]), "--index", str(index), "--mode", "lexical",
                     "--quiet", "-o", str(out)]) == 0
        scores[index.name] = {m: json.loads(out.read_text())[m] for m in MEASURES}
    assert scores["moved"] == scores[setup["index"].name]
    assert "no query embedded (lexical), the index's passages in float32" in capsys.readouterr().out
    assert main(["evaluate", "retrieval", str(setup["folder"]), "--index", str(moved), "--mode", "dense"]) == 2
    assert "pass --model DIR" in capsys.readouterr().err  # the dense search does need it


def test_a_query_without_tokens_is_named_by_its_id_through_an_index(setup, tmp_path, capsys):
    """Without --index a query of characters BERT drops is refused naming its id; through an index the line
    said only "text '\u200b' yields no tokens": which of the split's queries, the user had to find."""
    import shutil

    folder = shutil.copytree(setup["folder"], tmp_path / "sf")
    lines = (folder / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    judged = next(iter(load_beir(folder, "test").qrels))
    edited = [json.dumps({**row, "text": "\u200b"}) if row["_id"] == judged else line
              for line, row in ((line, json.loads(line)) for line in lines)]
    (folder / "queries.jsonl").write_text("\n".join(edited) + "\n", encoding="utf-8")
    assert main(["evaluate", "retrieval", str(folder), "--index", str(setup["index"]), "--dtype", "float32",
                 "--mode", "dense", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{folder}/queries.jsonl _id {judged!r}: text '\\u200b' yields no tokens" in err and err.count("\n") == 1


def test_the_recorded_query_precision_is_the_one_used(setup, tiny_dir, tmp_path, capsys):
    """With --index, the result said the --dtype asked for: "auto" (the line: "queries in auto"), and "float32"
    for queries an int8 model (a folder save_quantized wrote, which made the index) computed in int8."""
    import bertkit
    from bertkit.runtime.devices import auto_dtype, dtype_name
    from bertkit.runtime.quantization import save_quantized

    out = tmp_path / "auto.json"
    assert main(["evaluate", "retrieval", str(setup["folder"]), "--index", str(setup["index"]), "--dtype", "auto",
                 "--mode", "dense", "--quiet", "-o", str(out)]) == 0
    used = dtype_name(auto_dtype())
    assert f"(queries in {used}, the index's passages in float32" in capsys.readouterr().out
    assert json.loads(out.read_text())["precision"] == used
    loaded = bertkit.load(str(tiny_dir), int8=True)
    save_quantized(loaded.model, tmp_path / "int8", loaded.tokenizer)
    build_index(setup["folder"] / "corpus.jsonl", tmp_path / "index8", str(tmp_path / "int8"), passage_tokens=TOKENS,
                overlap=OVERLAP, batch_size=64, progress=False)
    out = tmp_path / "int8.json"
    assert main(["evaluate", "retrieval", str(setup["folder"]), "--index", str(tmp_path / "index8"), "--mode", "dense",
                 "--quiet", "-o", str(out)]) == 0
    assert "(queries in int8, the index's passages in int8" in capsys.readouterr().out
    assert json.loads(out.read_text())["precision"] == "int8"


def test_tune_does_not_write_an_index_another_process_is_writing(setup, capsys, tmp_path):
    # evaluate --tune read index.json and wrote it back with "fusion", unlocked: an `index add` running on
    # the folder meanwhile lost its record (its lexical part or graph there, index.json without it). It
    # now takes the folder's lock for the write, and a held folder is refused in one line naming the holder.
    import shutil

    from test_output_folders import holder

    index = tmp_path / "index"
    shutil.copytree(setup["index"], index)
    before = (index / "index.json").read_bytes()
    proc = holder(index)
    try:
        status = main(["evaluate", "retrieval", str(setup["folder"]), "--index", str(index), "--dtype", "float32",
                       "--tune", "test", "--quiet"])
    finally:
        proc.kill()
        proc.wait()
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert f"is being written by process {proc.pid} (the holder, since" in err, err
    assert (index / "index.json").read_bytes() == before


def test_a_fusion_tuned_on_one_build_is_not_written_into_the_next(setup, tiny_dir, tmp_path):
    # an index built again (--overwrite) while evaluate --tune ran got the fusion tuned on the build before
    from bertkit.errors import BertkitError
    from bertkit.retrieval.index import open_index, update_info

    index = tmp_path / "index"
    build_index(setup["folder"] / "corpus.jsonl", index, str(tiny_dir), passage_tokens=TOKENS, overlap=OVERLAP,
                batch_size=64, dtype="float32", progress=False)
    opened = open_index(index)
    build_index(setup["folder"] / "corpus.jsonl", index, str(tiny_dir), passage_tokens=TOKENS, overlap=OVERLAP,
                batch_size=64, dtype="float32", progress=False, overwrite=True)
    before = (index / "index.json").read_bytes()
    with pytest.raises(BertkitError, match="was built again while this ran"):
        update_info(index, command="test", opened=opened, fusion={"fusion": "rrf"})
    assert (index / "index.json").read_bytes() == before
    update_info(index, command="test", opened=open_index(index), fusion={"fusion": "rrf"})  # the build it opened
    assert json.loads((index / "index.json").read_text())["fusion"] == {"fusion": "rrf"}


@pytest.mark.parametrize("missing", ["bm25s", "Stemmer"])
def test_an_index_whose_default_search_needs_a_missing_package_is_refused_before_any_model_loads(
        setup, tiny_dir, capsys, monkeypatch, missing):
    """An index built where the search extra is (a lexical part, so hybrid by default), searched in an install
    without bm25s or PyStemmer: `search` and `evaluate retrieval --index` loaded the query encoder and embedded
    every query before the one line; `serve --index` started and answered each /search with an internal error
    (a traceback in its log); `finetune rerank --dev --index` trained to the end before its evaluation failed
    (check_index_of passed), and mining through `--mining-index` loaded its encoder first. Each is one line naming
    the extra now, before an encoder loads; a dense search still runs without it."""
    import sys

    from bertkit.errors import BertkitError
    from bertkit.retrieval import evaluation, search
    from bertkit.retrieval.evaluation import check_index_of, index_answers
    from bertkit.serve.runner import load_runner, load_searcher
    from bertkit.serve.settings import ServeConfig

    runner = load_runner(ServeConfig(model=str(tiny_dir), index=str(setup["index"]), workers=1, threads=1,
                                     dtype="float32").validate())
    monkeypatch.setitem(sys.modules, missing, None)  # None in sys.modules: importing it raises ImportError

    def no_encoder(*args, **kwargs):
        raise AssertionError("the query encoder was loaded before the missing package was said")

    for module in (search, evaluation):
        monkeypatch.setattr(module, "query_encoder", no_encoder)
    index = str(setup["index"])
    for argv in (["search", index, "a query"], ["evaluate", "retrieval", str(setup["folder"]), "--index", index]):
        assert main([*argv, "--quiet"] if argv[0] == "evaluate" else argv) == 2
        err = capsys.readouterr().err
        assert "pip install 'bertkit[search]'" in err and "--mode dense" in err and err.count("\n") == 1, err
    for call in (lambda: check_index_of(index, setup["folder"]), lambda: index_answers(index, ["a query"], 5),
                 lambda: load_searcher(ServeConfig(model=str(tiny_dir), index=index), runner)):
        with pytest.raises(BertkitError, match=r"pip install 'bertkit\[search\]'") as refused:
            call()
    assert "--mode dense" not in str(refused.value)  # a server's /search is hybrid by default: no way around
    monkeypatch.undo()  # the encoder back; the package still missing: a dense search needs neither
    monkeypatch.setitem(sys.modules, missing, None)
    assert main(["search", index, "a query", "--mode", "dense", "--dtype", "float32"]) == 0


def test_a_search_through_a_graph_the_index_lacks_is_refused_before_any_model_loads(setup, capsys, monkeypatch):
    """`search --ann` and `evaluate retrieval --index --ann` on an index without an HNSW graph (or in an install
    without FAISS: the same read, test_index_add) loaded the query encoder and embedded every query before the
    one line saying so."""
    from bertkit.retrieval import evaluation, search

    def no_encoder(*args, **kwargs):
        raise AssertionError("the query encoder was loaded before the missing graph was said")

    for module in (search, evaluation):
        monkeypatch.setattr(module, "query_encoder", no_encoder)
    index = str(setup["index"])
    for argv in (["search", index, "a query", "--ann", "--mode", "dense"],
                 ["evaluate", "retrieval", str(setup["folder"]), "--index", index, "--ann", "--mode", "dense", "--quiet"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{index} has no ANN index (hnsw.faiss): add one with bertkit index add" in err, err
        assert err.count("\n") == 1
