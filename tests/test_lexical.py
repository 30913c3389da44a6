"""The lexical part of an index and hybrid search: BM25 over the passages as bm25s scores them on its own,
a build killed mid-way and resumed writes the same files, the modes and their one-line refusals."""

import importlib.abc
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_index import OVERLAP, TOKENS, make_tiny, scifact_corpus

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.retrieval.config import LexicalOptions
from bertkit.retrieval.fusion import fuse, hybrid_weights
from bertkit.retrieval.index import build_index, open_index
from bertkit.retrieval.search import fusion_options, search

pytest.importorskip("bm25s")
Stemmer = pytest.importorskip("Stemmer")

QUERIES = ["vitamin D deficiency and bone fractures", "gene expression in stem cells", "the of and"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory):
    return scifact_corpus(shared_data, tmp_path_factory.mktemp("corpus") / "corpus.jsonl", n=14)


def _args(corpus, out, tiny):
    return ["index", str(corpus), "-o", str(out), "--model", str(tiny), "--passage-tokens", str(TOKENS),
            "--overlap", str(OVERLAP), "--batch-size", "64", "--part-size", "40", "--dtype", "float32", "--quiet"]


@pytest.fixture(scope="module")
def built(tiny, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("lexical") / "index"
    assert main(_args(corpus, out, tiny)) == 0
    return out


def _reference(passages, query):
    """bm25s on its own over the passages (Lucene idf, k1 1.5, b 0.75, English stop words, Porter 2 stems):
    each document's best passage score, best first."""
    import bm25s

    stem = Stemmer.Stemmer("english").stemWords
    retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    retriever.index(bm25s.tokenize([p["text"] for p in passages], stopwords="en", stemmer=stem,
                                   show_progress=False), show_progress=False)
    tokens = bm25s.tokenize([query], stopwords="en", stemmer=stem, return_ids=False, show_progress=False)[0]
    ids = retriever.get_tokens_ids(tokens)
    scores = retriever.get_scores_from_ids(ids) if ids else np.zeros(len(passages))
    best = {}
    for p, s in zip(passages, scores):
        if s > 0 and s > best.get(p["doc_id"], (0, None))[0]:
            best[p["doc_id"]] = (float(s), p["id"])
    return sorted(best.items(), key=lambda item: -item[1][0])


def test_lexical_search_scores_the_best_passage_as_bm25s_does(built):
    index = open_index(built)
    passages = [json.loads(line) for line in (built / "passages.jsonl").read_text(encoding="utf-8").splitlines()]
    made = index.info["lexical"]
    assert (made["k1"], made["b"], made["stopwords"], made["stemmer"], made["method"]) == (1.5, 0.75, "en",
                                                                                          "english", "lucene")
    answers = search(index, QUERIES, k=5, fusion={"mode": "lexical"})
    for query, hits in zip(QUERIES, answers):
        want = _reference(passages, query)[:5]
        assert [h.doc_id for h in hits] == [d for d, _ in want], query
        assert [h.id for h in hits] == [p for _, (_, p) in want]
        np.testing.assert_allclose([h.score for h in hits], [s for _, (s, _) in want], rtol=1e-6)
    assert answers[2] == []  # only stop words: no document shares a token with the query
    # stemming: the stem of "fractures" is looked up, and found in the passages that say "fracture"
    fractures = search(index, ["fractures"], k=3, fusion={"mode": "lexical"})[0]
    assert fractures == [] or all("fractur" in h.text.lower() for h in fractures)


def test_nothing_read_back_is_unpickled(built, monkeypatch):
    calls = []
    real = np.load

    def load(*args, **kwargs):
        calls.append(kwargs.get("allow_pickle", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(np, "load", load)
    search(open_index(built), QUERIES[:1], k=2, fusion={"mode": "lexical"})
    assert calls and not any(calls)
    assert sorted(os.listdir(built / "lexical")) == ["data.csc.index.npy", "indices.csc.index.npy",
                                                     "indptr.csc.index.npy", "params.index.json", "vocab.index.json"]


def test_a_dense_search_imports_no_bm25s_and_a_hybrid_one_reads_the_part_as_bm25s_loads_it(built, monkeypatch,
                                                                                           capsys):
    """`bertkit search INDEX q --mode dense` read the lexical part it never uses through bm25s when the index
    was opened (a fraction of a second of start-up for every dense search). Now opening holds the part (its
    arrays mapped, its JSON files open) without bm25s, and a hybrid search makes the retriever from what was held,
    as bm25s' own BM25.load makes it from the folder."""
    import bm25s

    asked = []

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("bm25s", "Stemmer"):
                asked.append(name)
                raise ImportError(f"{name} is refused by this test")

    loaded = bm25s.BM25.load(str(built / "lexical"), mmap=True, allow_pickle=False)  # the oracle's own reading
    with monkeypatch.context() as patched:  # a process that never imported them, and cannot
        for name in [m for m in sys.modules if m.split(".")[0] in ("bm25s", "Stemmer")]:
            patched.delitem(sys.modules, name)
        patched.setattr(sys, "meta_path", [Refuse(), *sys.meta_path])
        assert main(["search", str(built), QUERIES[0], "--mode", "dense", "-k", "3", "--dtype", "float32"]) == 0
        index = open_index(built)
    assert asked == [] and "1." in capsys.readouterr().out
    made = index.lexical()
    assert made.vocab_dict == loaded.vocab_dict and made.unique_token_ids_set == loaded.unique_token_ids_set
    assert {k: v for k, v in vars(made).items() if k not in ("scores", "vocab_dict", "unique_token_ids_set")} == \
        {k: v for k, v in vars(loaded).items() if k not in ("scores", "vocab_dict", "unique_token_ids_set")}
    assert made.scores["num_docs"] == loaded.scores["num_docs"]
    for name in ("data", "indices", "indptr"):
        assert isinstance(made.scores[name], np.memmap) and np.array_equal(made.scores[name], loaded.scores[name])
    assert search(index, QUERIES[:1], k=3, dtype="float32", fusion={"mode": "hybrid"})[0]


def test_an_index_reads_its_lexical_json_files_once_for_the_check_and_the_retriever(built, monkeypatch):
    """Opening an index read vocab.index.json and params.index.json whole to check that each is a JSON object, then
    held them open, and its first lexical search read and parsed them again for the retriever: a hybrid search (such
    an index's default) parsed the vocabulary twice (SciFact's 27,576 terms, 128-token passages: ~22 ms each). Each
    is opened once now (opens counted at io.open), the check's objects making the retriever bm25s' own load makes."""
    import builtins
    import io

    import bm25s

    opens, real = [], io.open

    def counted(file, *args, **kwargs):
        opens.append(os.path.basename(str(file)))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counted)
    monkeypatch.setattr(io, "open", counted)
    index = open_index(built)
    assert search(index, QUERIES[:1], k=3, dtype="float32", fusion={"mode": "hybrid"})[0]
    monkeypatch.undo()
    assert (opens.count("vocab.index.json"), opens.count("params.index.json")) == (1, 1)  # main: 2 and 2
    loaded = bm25s.BM25.load(str(built / "lexical"), mmap=True, allow_pickle=False)
    assert index.lexical().vocab_dict == loaded.vocab_dict and index.lexical().k1 == loaded.k1


def test_hybrid_fuses_the_dense_and_lexical_answers(built):
    index = open_index(built)
    assert fusion_options(index.info).mode == "hybrid"  # the default when the index has a lexical part
    for fusion, alpha in (("rrf", 0.5), ("minmax", 0.3), ("dbsf", 0.8)):
        # rrf's k only beside rrf: given beside another fusion it is refused, as it would be unused
        settings = {"fusion": fusion, "alpha": alpha, "depth": 8, **({"rrf_k": 2.0} if fusion == "rrf" else {})}
        hybrid = search(index, QUERIES[:2], k=5, dtype="float32", fusion=settings)
        dense = search(index, QUERIES[:2], k=8, dtype="float32", fusion={"mode": "dense"})
        lexical = search(index, QUERIES[:2], k=8, fusion={"mode": "lexical"})
        for h, d, l in zip(hybrid, dense, lexical):
            want = fuse([[(x.doc_id, x.score) for x in d], [(x.doc_id, x.score) for x in l]],
                        hybrid_weights(alpha), fusion, 2.0)[:5]
            assert [x.doc_id for x in h] == [doc for doc, _ in want]
            np.testing.assert_allclose([x.score for x in h], [s for _, s in want], rtol=1e-6)
            passage = {x.doc_id: x.id for x in l} | {x.doc_id: x.id for x in d}  # the dense run's passage first
            assert [x.id for x in h] == [passage[x.doc_id] for x in h]


KILLED_AT_THE_LEXICAL_RENAME = textwrap.dedent("""
    import os, signal, sys
    real_replace = os.replace

    def replace(src, dst):
        # the lexical part is written whole into lexical.tmp/; die before it is renamed into place
        if str(dst).endswith("lexical"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(src, dst)

    os.replace = replace
    from bertkit.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_killed_while_writing_the_lexical_part_and_resumed_equals_an_uninterrupted_build(built, tiny, corpus,
                                                                                         tmp_path):
    out = tmp_path / "index"
    child = subprocess.run([sys.executable, "-c", KILLED_AT_THE_LEXICAL_RENAME, *_args(corpus, out, tiny)],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stderr
    assert (out / "lexical.tmp" / "vocab.index.json").is_file() and not (out / "lexical").exists()
    assert not (out / "index.json").exists()
    with pytest.raises(BertkitError, match="--resume: lexical k1 was {'k1': 1.5} in the interrupted run"):
        build_index(corpus, out, str(tiny), passage_tokens=TOKENS, overlap=OVERLAP, batch_size=64, part_size=40,
                    dtype="float32", resume=True, progress=False, lexical=LexicalOptions(k1=1.2))
    assert main([*_args(corpus, out, tiny), "--resume"]) == 0
    assert sorted(os.listdir(out)) == sorted(os.listdir(built)) == ["index.json", "lexical", "passages.jsonl",
                                                                    "vectors.safetensors"]
    for name in ("index.json", "passages.jsonl", "vectors.safetensors", *(f"lexical/{n}" for n in
                                                                          os.listdir(built / "lexical"))):
        assert (out / name).read_bytes() == (built / name).read_bytes(), name


def test_an_index_without_a_lexical_part(tiny, corpus, tmp_path, capsys):
    out = tmp_path / "dense"
    assert main([*_args(corpus, out, tiny), "--no-lexical"]) == 0
    index = open_index(out)
    assert "lexical" not in index.info and not (out / "lexical").exists()
    assert fusion_options(index.info).mode == "dense"  # the default without a lexical part
    capsys.readouterr()
    for mode in ("lexical", "hybrid"):
        assert main(["search", str(out), "a query", "--mode", mode]) == 2
        err = capsys.readouterr().err.strip()
        assert "has no lexical part" in err and "--mode dense" in err and "\n" not in err


@pytest.mark.parametrize("flags, words", [
    (["--mode", "sparse"], "unknown mode 'sparse': choose one of hybrid, dense, lexical"),
    (["--alpha", "1.5"], "alpha (the dense run's share) must be between 0 and 1, got 1.5"),
    (["--fusion", "sum"], "unknown fusion 'sum'"),
    (["--rrf-k", "-2"], "rrf_k must be >= 0"),
])
def test_bad_search_settings_are_one_line(built, capsys, flags, words):
    assert main(["search", str(built), "a query", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


def test_bad_bm25_settings_are_refused_before_encoding(tiny, corpus, tmp_path, capsys):
    assert main([*_args(corpus, tmp_path / "x", tiny), "--bm25-b", "1.5"]) == 2
    assert "--bm25-b must be between 0 and 1" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_the_lexical_part_is_the_same_bytes_whatever_the_string_hashing(tmp_path):
    """bm25s numbers its vocabulary through a set (Python's string hashing, seeded per process): the part is
    written with the words numbered in sorted order, so two processes write the same files."""
    code = textwrap.dedent("""
        import sys
        from pathlib import Path
        from bertkit.retrieval.config import LexicalOptions
        from bertkit.retrieval.lexical import build_lexical
        texts = ["the quick brown fox jumps over dogs", "a lazy dog sleeps all day", "quick dogs and foxes run",
                 "stemming keeps running and runs together"]
        build_lexical(Path(sys.argv[1]), texts, LexicalOptions())
    """)
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / seed
        out.mkdir()
        subprocess.run([sys.executable, "-c", code, str(out)], check=True, env={**os.environ, "PYTHONHASHSEED": seed})
        outs.append(out / "lexical")
    names = sorted(os.listdir(outs[0]))
    assert names == sorted(os.listdir(outs[1])) and "vocab.index.json" in names
    for name in names:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name


def test_the_lexical_part_reads_back_as_bm25s_loads_it_and_another_bm25s_is_one_line(tmp_path, monkeypatch):
    """The round trip: a lexical part written by build_lexical and made back by read_lexical (from the files held
    open, not through bm25s' public BM25.load, which takes a path) scores every query as BM25.load's retriever of
    the same folder does. read_lexical sets bm25s' own fields, so a bm25s outside the releases whose layout it knows
    (pyproject: >=0.2,<0.4) was read as if it were one: it is refused in one line naming the release and the pip
    command; a params.index.json holding a setting this bm25s lacks (another layout) names the file."""
    import bm25s

    from bertkit.errors import MissingPackage
    from bertkit.retrieval.lexical import build_lexical, hold_lexical, passage_scores, read_lexical, tokenize

    texts = ["Vitamin D deficiency and bone fractures.", "Stem cells express the gene.", "A fracture heals slowly.",
             "Cells divide; genes are expressed.", "the of and"]
    options = LexicalOptions()
    build_lexical(tmp_path, texts, options)
    made = read_lexical(hold_lexical(tmp_path))
    oracle = bm25s.BM25.load(str(tmp_path / "lexical"), mmap=True, allow_pickle=False)
    for query in [*QUERIES, "fractures fractures heal", "zebra"]:
        tokens = tokenize([query], options, ids=False)[0]
        ids = oracle.get_tokens_ids(tokens)
        got = passage_scores(made, tokens)
        assert (got is None) == (not ids), query
        if ids:
            np.testing.assert_array_equal(got, np.asarray(oracle.get_scores_from_ids(ids), dtype=np.float32))
    assert passage_scores(made, tokenize(["fractures"], options, ids=False)[0])[[0, 2]].min() > 0  # the stem matched
    for release in ("0.4.0", "1.0", "0.1.10"):
        monkeypatch.setattr(bm25s, "__version__", release)
        with pytest.raises(MissingPackage, match=rf"bm25s {release} is installed: pip install 'bm25s>=0.2,<0.4'$"):
            read_lexical(hold_lexical(tmp_path))
        with pytest.raises(MissingPackage, match=rf"bm25s {release} is installed"):
            build_lexical(tmp_path / "other", texts, options)
    monkeypatch.undo()
    params = json.loads((tmp_path / "lexical" / "params.index.json").read_text(encoding="utf-8"))
    (tmp_path / "lexical" / "params.index.json").write_text(json.dumps({**params, "version": "9.9", "sharding": 4}))
    with pytest.raises(BertkitError, match=r"params.index.json was written by bm25s 9.9, and bm25s .* does not read "
                                           r"it .*: build the index's lexical part again"):
        read_lexical(hold_lexical(tmp_path))


def test_a_lexical_part_its_disk_cannot_hold_is_refused_before_bm25s_builds_it(tmp_path, monkeypatch):
    """`bertkit index` refused vectors and passages its disk could not hold before encoding, but built the lexical
    part whatever the free space: a full disk stopped bm25s' save. The part's size is known once the passages are
    tokenized (a weight and a row per token and passage, a column boundary per word, the words): a need at most
    what the same build writes where there is room, and with less free space (shutil.disk_usage says so) refused
    in room_for's words before the matrix is made, nothing left in the index folder."""
    import collections
    import shutil

    from bertkit.data.atomic import room_for
    from bertkit.retrieval.lexical import build_lexical, lexical_bytes, tokenize

    texts = [f"Vitamin D{i} deficiency and bone fractures in patients {i}." for i in range(40)] + ["the of and"]
    options = LexicalOptions()
    build_lexical(tmp_path / "roomy", texts, options)
    written = sum(p.stat().st_size for p in (tmp_path / "roomy" / "lexical").iterdir())
    need = lexical_bytes(tokenize(texts, options, ids=True))
    assert 40 * 8 * 5 < need <= written  # 40 passages of 5 kept words at least; the files hold more
    with pytest.raises(Exception) as same:  # whatever type room_for raises
        room_for(tmp_path, 1 << 62, "x")
    real, usage = shutil.disk_usage, collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(*real(path)[:2], need - 1))
    (tmp_path / "small").mkdir()
    with pytest.raises(same.type, match=r"small: the BM25 files of the index's lexical part need at least .* and its "
                                        "disk has "):
        build_lexical(tmp_path / "small", texts, options)
    assert list((tmp_path / "small").iterdir()) == []
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(*real(path)[:2], need))  # exactly enough: built
    build_lexical(tmp_path / "small", texts, options)
    assert sorted(os.listdir(tmp_path / "small" / "lexical")) == sorted(os.listdir(tmp_path / "roomy" / "lexical"))
