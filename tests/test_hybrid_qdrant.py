"""Hybrid search through Qdrant (local mode): the exported BM25 sparse vectors score as bertkit's lexical part,
and Qdrant's prefetch + RRF (or DBSF) fusion returns bertkit's hybrid top 10 where a document is one passage."""

import importlib.util
import json

import numpy as np
import pytest
from conftest import need
from test_index import make_tiny

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.retrieval.config import FusionOptions
from bertkit.retrieval.index import build_index, open_index
from bertkit.retrieval.search import search

QUERIES = ["vitamin D deficiency and bone fractures", "gene expression in stem cells", "cancer cells and tumour growth",
           "the role of insulin in diabetes", "antibiotic resistance in bacteria", "mortality after heart surgery",
           "immune response to viral infection", "obesity in children", "protein folding and disease",
           "risk factors of stroke", "brain development and neurons", "smoking and lung function"]


@pytest.fixture(scope="module")
def exported(shared_data, tmp_path_factory):
    need(importlib.util.find_spec("qdrant_client") is not None, "qdrant-client (the search extra) is not installed")
    need(importlib.util.find_spec("bm25s") is not None and importlib.util.find_spec("Stemmer") is not None,
         "bm25s and PyStemmer (the search extra) are not installed")
    folder = tmp_path_factory.mktemp("qdrant_hybrid")
    tiny = make_tiny(folder / "tiny")
    # the first 3, 4, ..., 34 words of SciFact abstracts as documents: each fits one passage, so Qdrant's
    # passages are bertkit's documents, and each has its own length, so BM25 rarely gives two the same score
    lines = (shared_data / "retrieval" / "scifact" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[:32]
    docs = [{"_id": d["_id"], "title": "", "text": " ".join(d["text"].split()[: 3 + i])}
            for i, d in enumerate(map(json.loads, lines))]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    info = build_index(folder / "corpus.jsonl", folder / "index", str(tiny), passage_tokens=64, overlap=8,
                       dtype="float32", progress=False)
    assert info["max_passages_per_document"] == 1 and info["lexical"]
    assert main(["index", "export", str(folder / "index"), "--qdrant", str(folder / "qdrant"), "--collection", "t",
                 "--quiet"]) == 0
    return folder


@pytest.mark.parametrize("fusion, k", [("rrf", 2.0), ("rrf", 60.0), ("dbsf", 60.0)])
def test_qdrant_hybrid_returns_bertkits_top_10(exported, fusion, k):
    from bertkit.retrieval.qdrant import search as search_qdrant

    options = FusionOptions(mode="hybrid", fusion=fusion, alpha=0.5, rrf_k=k, depth=20)
    index = open_index(exported / "index")
    # equal scores within a run are ordered by row in bertkit and by Qdrant's own sort (its local mode: a
    # reversed argsort) in Qdrant: only queries whose runs hold no equal scores rank the same by rule
    runs = [search(index, QUERIES, k=options.depth, dtype="float32", fusion={"mode": m}) for m in ("dense", "lexical")]
    untied = [q for i, q in enumerate(QUERIES) if all(len({h.score for h in run[i]}) == len(run[i]) for run in runs)]
    assert len(untied) >= 8, untied
    ours = search(index, untied, k=10, dtype="float32", fusion=options)
    theirs = search_qdrant(str(exported / "qdrant"), "t", untied, k=10, dtype="float32", fusion=options)
    for a, b in zip(ours, theirs):
        assert len(a) == 10 and [h.doc_id for h in a] == [h.doc_id for h in b]
        # the same scores: Qdrant sums the runs unweighted (twice ours), and --qdrant prints them on bertkit's
        # scale, each run weighed by its share alpha = 0.5 (before, `search --qdrant` printed twice `search INDEX`)
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], rtol=1e-5)


def test_qdrant_sparse_vectors_score_as_the_lexical_part(exported):
    from bertkit.retrieval.qdrant import search as search_qdrant

    lexical = FusionOptions(mode="lexical")
    ours = search(open_index(exported / "index"), QUERIES, k=40, fusion=lexical)  # every matching document
    theirs = search_qdrant(str(exported / "qdrant"), "t", QUERIES, k=40, fusion=lexical)
    assert sum(len(a) > 0 for a in ours) >= 8
    for a, b in zip(ours, theirs):
        assert sorted(h.doc_id for h in a) == sorted(h.doc_id for h in b)
        score = {h.doc_id: h.score for h in b}
        np.testing.assert_allclose([h.score for h in a], [score[h.doc_id] for h in a], rtol=1e-5)


def test_what_qdrant_cannot_fuse_is_one_line(exported, capsys):
    argv = ["search", "--qdrant", str(exported / "qdrant"), "--collection", "t", "a query"]
    for flags in (["--fusion", "minmax"], ["--alpha", "0.7"], ["--fusion", "rrf", "--rrf-k", "2.5"]):
        assert main([*argv, *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert "--qdrant fuses by Qdrant's rrf" in err and "\n" not in err
    assert main([*argv, "--json", "-k", "3"]) == 0  # the default: hybrid, DBSF, equal weights
    assert len(json.loads(capsys.readouterr().out)[0]) == 3
    with pytest.raises(BertkitError, match="unknown mode"):
        FusionOptions(mode="both").validate()


def test_a_collection_of_a_tuned_index_fuses_as_its_tuning_chose(exported, capsys):
    """`evaluate retrieval --tune` writes its pick into index.json, which the export keeps in the collection:
    `search --qdrant` without fusion flags runs that pick (here rrf k 2, depth 20) where Qdrant computes it, as
    `search INDEX` does, and says in one line when Qdrant cannot (alpha 0.3: its fusion weighs the runs equally).
    Before, it fused by dbsf at depth 100 whatever the index's record said."""
    import shutil

    from bertkit.retrieval.index import update_info
    from bertkit.retrieval.qdrant import collection_fusion, search as search_qdrant

    location, tuned = str(exported / "qdrant"), {"fusion": "rrf", "alpha": 0.5, "rrf_k": 2.0, "depth": 20}
    shutil.copytree(exported / "index", exported / "tuned")
    update_info(exported / "tuned", fusion={**tuned, "tuned_on": "train"})
    assert main(["index", "export", str(exported / "tuned"), "--qdrant", location, "--collection", "tuned",
                 "--quiet"]) == 0
    capsys.readouterr()
    (exported / "queries.txt").write_text("\n".join(QUERIES[:4]) + "\n")
    assert main(["search", "--qdrant", location, "--collection", "tuned", "--queries", str(exported / "queries.txt"),
                 "--json", "--dtype", "float32"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = search_qdrant(location, "t", QUERIES[:4], dtype="float32", fusion=FusionOptions(mode="hybrid", **tuned))
    assert [[(h["id"], h["score"]) for h in hits] for hits in got] == [[(h.id, h.score) for h in hits] for hits in want]
    info = {**open_index(exported / "index").info, "fusion": {**tuned, "fusion": "dbsf", "alpha": 0.3}}
    with pytest.warns(UserWarning, match="alpha 0.3") as said:
        assert collection_fusion(info, {}) == FusionOptions(mode="hybrid", alpha=0.5, rrf_k=2.0, depth=20)
    assert len(said) == 1 and "\n" not in str(said[0].message) and "equal weights" in str(said[0].message)
    assert collection_fusion(info, {"alpha": 0.3}).alpha == 0.3  # given, it is refused by check_fusion


def test_a_collection_without_sparse_vectors_says_how_to_get_them(exported, capsys):
    """A collection exported from an index without a lexical part (--no-lexical, or an index of a bertkit
    before lexical parts: compat2's 11-25 export) has no sparse vectors. search --qdrant --mode hybrid/lexical
    said the index's line, "add one with bertkit index add INDEX": done, the collection still had none and the
    same line came back. The line names the collection and the export again; its advice, followed, works."""
    import shutil

    location, dense = str(exported / "qdrant"), exported / "dense"
    shutil.copytree(exported / "index", dense, ignore=shutil.ignore_patterns("lexical"))
    info = json.loads((dense / "index.json").read_text())
    del info["lexical"]  # as `bertkit index --no-lexical` (and the 11-25 bertkit) writes index.json
    (dense / "index.json").write_text(json.dumps(info))
    export_argv = ["index", "export", str(dense), "--qdrant", location, "--collection", "dense", "--quiet"]
    assert main(export_argv) == 0
    capsys.readouterr()
    for mode in ("hybrid", "lexical"):
        assert main(["search", "--qdrant", location, "--collection", "dense", "a query", "--mode", mode]) == 2
        err = capsys.readouterr().err.strip()
        assert "'dense'" in err and "bertkit index add" in err and "--overwrite" in err and "\n" not in err
    assert main(["index", "add", str(dense)]) == 0 and main([*export_argv, "--overwrite"]) == 0
    assert main(["search", "--qdrant", location, "--collection", "dense", "a query", "--mode", "hybrid"]) == 0
