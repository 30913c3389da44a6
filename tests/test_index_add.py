"""`bertkit index add INDEX [--ann hnsw]`: a finished index given an HNSW graph or a lexical part made from its own
files, without encoding again, equal to what a build that asked for them at once wrote."""

import json
import os

import numpy as np
import pytest
from test_index import OVERLAP, TOKENS, make_tiny, scifact_corpus

from bertkit.cli import main
from bertkit.retrieval.index import build_index, open_index
from bertkit.retrieval.search import search

QUERIES = ["vitamin D deficiency and bone fractures", "gene expression in stem cells", "insulin and diabetes"]


@pytest.fixture(scope="module")
def made(shared_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("index_add")
    tiny = make_tiny(root / "tiny")
    corpus = scifact_corpus(shared_data, root / "corpus.jsonl", n=10, first=80)
    settings = dict(passage_tokens=TOKENS, overlap=OVERLAP, dtype="float32", progress=False)
    build_index(corpus, root / "whole", str(tiny), ann="hnsw", **settings)  # everything asked for at once
    build_index(corpus, root / "bare", str(tiny), lexical=None, **settings)  # --no-lexical, no --ann
    return root


def _answers(index, **flags):
    return [[(h.id, round(h.score, 5)) for h in hits] for hits in search(index, QUERIES, k=5, dtype="float32", **flags)]


def test_add_gives_a_bare_index_the_graph_and_lexical_part_of_a_whole_build(made, capsys):
    bare, whole = made / "bare", made / "whole"
    vectors = (bare / "vectors.safetensors").read_bytes()
    assert main(["search", str(bare), QUERIES[0], "--ann"]) == 2  # the premise: neither part is there
    assert f"add one with bertkit index add {bare} --ann hnsw" in capsys.readouterr().err
    assert main(["index", "add", str(bare), "--ann", "hnsw", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "added ann and lexical" in printed and "recall@10 1.0000" in printed and "lexical: BM25" in printed
    assert (bare / "vectors.safetensors").read_bytes() == vectors  # nothing encoded again
    for name in sorted(os.listdir(whole / "lexical")):  # the same BM25 files as the build's
        assert (bare / "lexical" / name).read_bytes() == (whole / "lexical" / name).read_bytes(), name
    got, want = (json.loads((d / "index.json").read_text()) for d in (bare, whole))
    assert got == want  # the same records: ann's settings and recall, lexical's settings and vocabulary
    for flags in ({"fusion": {"mode": "dense"}, "ann": True}, {"fusion": {"mode": "lexical"}}, {}):
        assert _answers(open_index(bare), **flags) == _answers(open_index(whole), **flags), flags
    np.testing.assert_array_equal(  # the graph is of these vectors: walking it everywhere finds the exact answer
        [h.id for h in search(open_index(bare), QUERIES, k=5, dtype="float32", ann=True, fusion={"mode": "dense"})[0]],
        [h.id for h in search(open_index(bare), QUERIES, k=5, dtype="float32", fusion={"mode": "dense"})[0]])


def test_add_refuses_what_is_there_and_rebuilds_a_graph_only_with_overwrite(made, capsys):
    index = made / "whole"
    for argv, message in [([], "nothing to add"),
                          (["--ann", "hnsw"], "has an HNSW graph already (M 32, efConstruction 200): pass --overwrite"),
                          (["--ann", "hnsw", "--ann-m", "1"], "--ann-m must be an int of at least 2, got 1"),
                          # the graph was built again and --bm25-k1 ignored: the lexical part is never rebuilt
                          (["--ann", "hnsw", "--overwrite", "--bm25-k1", "0.9"], "--bm25-k1: " + str(index) +
                           " has its lexical part already (k1 1.5, b 0.75), and index add does not build it again")]:
        assert main(["index", "add", str(index), "--quiet", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert main(["index", "add", str(index), "--quiet", "--ann", "hnsw", "--ann-m", "8", "--overwrite"]) == 0
    assert json.loads((index / "index.json").read_text())["ann"]["m"] == 8
    assert open_index(index).graph().hnsw.nb_neighbors(1) == 8  # FAISS's M: links per vector above layer 0
    assert main(["index", "add", str(made / "nowhere"), "--ann", "hnsw"]) == 2
    assert "is not an index" in capsys.readouterr().err


def test_an_output_folder_given_as_a_second_word_is_answered_with_the_command_that_writes_it(made, capsys):
    """`bertkit index corpus.jsonl my_index` (as cp or tar would read it) was told how to export an index."""
    corpus, out = made / "corpus.jsonl", made / "second_word"
    assert main(["index", str(corpus), str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"bertkit index {corpus} -o {out}" in err and err.count("\n") == 1, err
    assert not out.exists()


def test_a_graph_is_added_without_bm25s_when_the_lexical_part_is_there(made, tmp_path, monkeypatch, capsys):
    """`index add INDEX --ann hnsw` asked for bm25s and PyStemmer whatever the index held: one with its lexical
    part already (a default build) was refused its graph in an install with FAISS but not bm25s, though nothing
    lexical was to be built. They are asked for only when the lexical part is missing, before the graph is built."""
    import shutil
    import sys

    whole, bare = shutil.copytree(made / "whole", tmp_path / "whole"), tmp_path / "bare"
    build_index(made / "corpus.jsonl", bare, str(made / "tiny"), lexical=None, passage_tokens=TOKENS, overlap=OVERLAP,
                dtype="float32", progress=False)  # `made`'s bare index has both parts once the first test ran
    monkeypatch.setitem(sys.modules, "bm25s", None)  # None in sys.modules: importing it raises ImportError
    assert main(["index", "add", str(whole), "--ann", "hnsw", "--overwrite", "--quiet"]) == 0, capsys.readouterr().err
    assert "added ann" in capsys.readouterr().out
    assert main(["index", "add", str(bare), "--ann", "hnsw", "--quiet"]) == 2  # the lexical part is to be built
    err = capsys.readouterr().err
    assert "pip install 'bertkit[search]'" in err and err.count("\n") == 1, err
    assert not (bare / "hnsw.faiss").exists() and "ann" not in json.loads((bare / "index.json").read_text())


def test_a_search_through_the_graph_without_faiss_is_refused_before_the_encoder_loads(made, monkeypatch, capsys):
    """An index with an HNSW graph searched with --ann in an install without FAISS (the search extra): the query
    encoder loaded and embedded the queries before the one line naming the extra."""
    import sys

    from bertkit.retrieval import search as search_module

    def no_encoder(*args, **kwargs):
        raise AssertionError("the query encoder was loaded before the missing package was said")

    monkeypatch.setitem(sys.modules, "faiss", None)  # None in sys.modules: importing it raises ImportError
    monkeypatch.setattr(search_module, "query_encoder", no_encoder)
    assert main(["search", str(made / "whole"), QUERIES[0], "--ann", "--mode", "dense"]) == 2
    err = capsys.readouterr().err
    assert "--ann hnsw needs FAISS: pip install 'bertkit[search]'" in err and err.count("\n") == 1, err
