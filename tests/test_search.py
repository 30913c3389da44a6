"""Searching an index: exact document top-k against brute-force numpy, bounded memory over a memory map,
the model check, reranking with a cross-encoder, and the commands end to end."""

import json
import re
import shutil
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import torch
from test_index import OVERLAP, TOKENS, make_tiny, scifact_corpus

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.retrieval.config import FusionOptions
from bertkit.tasks.rerank import pair_scores, rerank, reranker
from bertkit.retrieval.index import FORMAT, build_index, open_index
from bertkit.retrieval.search import best_documents, embed_queries, query_encoder, search


def write_index(path, vectors, document):
    """An index folder written without bertkit's writer (the safetensors library's own), for search alone."""
    from safetensors.numpy import save_file

    path.mkdir(parents=True)
    lines = [(json.dumps({"id": f"p{i}", "doc_id": f"d{d}", "title": "", "start": 0, "end": 1, "text": f"t{i}"})
              + "\n").encode() for i, d in enumerate(document)]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in lines])]).astype(np.int64)
    (path / "passages.jsonl").write_bytes(b"".join(lines))
    save_file({"vectors": vectors.astype(np.float32), "document": np.asarray(document, dtype=np.int64),
               "passage_offset": offsets}, str(path / "vectors.safetensors"))
    model = {"directory": "", "fingerprint": "", "pooling": "mean", "max_length": 8}  # no model embeds here
    info = {"format": FORMAT, "model": model, "passages": len(vectors), "documents": int(document.max()) + 1,
            "dim": vectors.shape[1],
            "max_passages_per_document": int(np.bincount(document).max())}
    (path / "index.json").write_text(json.dumps(info))
    return open_index(path)


def unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def brute_force(queries, vectors, document, k):
    """Per query: (doc numbers, scores) of the k best documents, a document scored by its best passage."""
    scores = unit(queries) @ vectors.T  # [Q, N]
    out = []
    for row in scores:
        best = {}
        for i, s in enumerate(row):
            if document[i] not in best or s > row[best[document[i]]]:
                best[document[i]] = i
        ranked = sorted(best.items(), key=lambda item: -row[item[1]])[:k]
        out.append(([d for d, _ in ranked], [float(row[i]) for _, i in ranked], [i for _, i in ranked]))
    return out


def test_exact_search_equals_brute_force_over_many_blocks(tmp_path):
    rng = np.random.default_rng(0)
    n, dim = 3000, 24
    document = np.sort(rng.integers(0, 700, n))  # documents of 0 to ~12 passages, as an index stores them
    document = np.unique(document, return_inverse=True)[1]
    vectors = unit(rng.standard_normal((n, dim)))
    index = write_index(tmp_path / "ix", vectors, document)
    queries = rng.standard_normal((7, dim)).astype(np.float32)
    for k in (1, 10, 40):
        rows, scores = best_documents(index, queries, k, block_size=256)  # 12 blocks
        for got_rows, got_scores, (docs, want_scores, want_rows) in zip(rows, scores, brute_force(
                queries, vectors, document, k)):
            assert [int(document[r]) for r in got_rows] == docs and got_rows == want_rows
            np.testing.assert_allclose(got_scores, want_scores, atol=1e-6)
    # k above the number of documents: every document once
    rows, _ = best_documents(index, queries[:1], 10_000, block_size=512)
    assert sorted(int(document[r]) for r in rows[0]) == list(range(document.max() + 1))


def test_a_document_whose_passages_fill_the_first_look_is_searched_to_the_full_depth(tmp_path):
    """best_documents looks SHALLOW x k passages deep first; when one document's 60 passages all beat every
    other passage, that look holds one document, and the query is searched again to the full depth: still
    the brute force's k documents. A query elsewhere is answered by the first look alone (same answer)."""
    from bertkit.retrieval.search import SHALLOW

    rng = np.random.default_rng(1)
    dim, crowded = 16, 60
    toward = unit(rng.standard_normal((1, dim)))
    near = unit(toward + 0.05 * rng.standard_normal((crowded, dim)))  # document 0's passages, all close
    far = unit(rng.standard_normal((400, dim)) - 3 * toward)  # the others point away
    vectors = np.concatenate([near, far]).astype(np.float32)
    document = np.concatenate([np.zeros(crowded, np.int64), 1 + np.arange(400) // 2])
    index = write_index(tmp_path / "ix", vectors, document)
    queries = np.concatenate([toward, rng.standard_normal((3, dim))]).astype(np.float32)
    k = 10
    assert SHALLOW * k < crowded  # the first look holds document 0 alone
    rows, scores = best_documents(index, queries, k)
    for got_rows, got_scores, (docs, want_scores, want_rows) in zip(rows, scores, brute_force(
            queries, vectors, document, k)):
        assert got_rows == want_rows and [int(document[r]) for r in got_rows] == docs
        np.testing.assert_allclose(got_scores, want_scores, atol=1e-6)


def test_search_over_a_memory_map_stays_far_below_the_index_size(tmp_path):
    rng = np.random.default_rng(1)
    n, dim, block = 60_000, 64, 1024
    index = write_index(tmp_path / "big", unit(rng.standard_normal((n, dim))), np.arange(n) // 3)
    assert isinstance(index.vectors, np.memmap)
    queries = rng.standard_normal((4, dim)).astype(np.float32)
    tracemalloc.start()
    rows, _ = best_documents(index, queries, 10, block_size=block)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # exact.top_k's bound: one block [block, dim] float32 and the score tile [4, block + depth], not the
    # 15.4 MB matrix; numpy reports its buffers to tracemalloc
    assert peak < 4 * block * dim * 4 < n * dim * 4 / 10
    want = brute_force(queries, np.asarray(index.vectors), np.asarray(index.document), 10)
    assert rows == [w[2] for w in want]


def test_exact_top_k_keeps_the_lowest_rows_among_many_ties_whatever_the_blocks():
    from bertkit.retrieval.exact import top_k

    rng = np.random.default_rng(3)
    vectors = rng.integers(0, 2, (2000, 6)).astype(np.float32)
    queries = np.zeros((9, 6), np.float32)
    for q in queries:
        q[rng.choice(6, 4, replace=False)] = 0.5  # unit length exactly: every score a multiple of 0.5, ties everywhere
    scores = queries @ vectors.T
    want = np.lexsort((np.broadcast_to(np.arange(2000), scores.shape), -scores), axis=1)[:, :25]
    for block, query_block in [(1, 9), (7, 2), (64, 4), (2000, 9), (4096, 1)]:
        got_scores, got = top_k(queries, vectors, 25, block_size=block, query_block=query_block, normalized=True)
        assert np.array_equal(got, want), (block, query_block)
        assert np.array_equal(got_scores, np.take_along_axis(scores, want, axis=1))


def test_bad_k_is_refused(tmp_path):
    index = write_index(tmp_path / "ix", unit(np.eye(3, 4) + 0.1), np.array([0, 0, 1]))
    for k in (0, -1, True):
        with pytest.raises(BertkitError, match="k must be at least 1"):
            best_documents(index, np.ones((1, 4), np.float32), k)


# --- a real index ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def built(tiny, shared_data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("search")
    corpus = scifact_corpus(shared_data, folder / "corpus.jsonl", n=10, first=20)
    build_index(corpus, folder / "index", str(tiny), passage_tokens=TOKENS, overlap=OVERLAP, batch_size=64,
                part_size=64, dtype="float32", progress=False)
    return folder / "index"


QUERIES = ["vitamin D deficiency and bone fractures", "gene expression in stem cells"]


def test_search_ranks_documents_by_their_best_passage(built, tiny):
    index = open_index(built)
    hits = search(index, QUERIES, k=4, dtype="float32", fusion={"mode": "dense"})
    loaded = query_encoder(index.info, dtype="float32")
    queries = embed_queries(index.info, loaded, QUERIES)
    want = brute_force(queries, np.asarray(index.vectors), np.asarray(index.document), 4)
    for got, (_, scores, rows) in zip(hits, want):
        passages = index.passages(rows)
        assert [h.id for h in got] == [p["id"] for p in passages] and len({h.doc_id for h in got}) == 4
        np.testing.assert_allclose([h.score for h in got], scores, atol=1e-6)
        assert [h.text for h in got] == [p["text"] for p in passages]


def test_queries_as_any_iterable_and_the_index_as_its_folder_answer_as_a_list_does(built):
    """A notebook passes a generator, a numpy column or the index folder's path: each is the list's answer. A
    generator used to be read twice (once for the vectors, once for BM25), so hybrid search, the default,
    fused against no lexical run and answered [] without a word; a path was an AttributeError."""
    index = open_index(built)
    assert index.info["lexical"], "the fixture's index has a lexical part (hybrid is the default mode)"
    want = [[(h.id, h.score) for h in hits] for hits in search(index, QUERIES, k=3, dtype="float32")]
    assert len(want) == len(QUERIES) and all(want)
    for given in ((q for q in QUERIES), np.array(QUERIES), tuple(QUERIES)):
        got = search(index, given, k=3, dtype="float32")
        assert [[(h.id, h.score) for h in hits] for hits in got] == want, type(given).__name__
    for folder in (built, str(built)):
        assert [[(h.id, h.score) for h in hits] for hits in search(folder, QUERIES, k=3, dtype="float32")] == want


def test_a_query_longer_than_the_passages_is_cut_as_they_were_and_said(built, tiny):
    """A pasted paragraph as a query was embedded from its first max_length tokens and nothing said so; one
    warning counts the queries cut. Reference: each query's whole encoding against the index's max length; the
    vectors are the ones the cut query alone gives."""
    from bertkit.text.tokenizer import Tokenizer

    index = open_index(built)
    length = index.info["model"]["max_length"]
    tok = Tokenizer.from_pretrained(tiny)
    long_query = "vitamin D deficiency and bone fractures in older adults " * 8
    queries = [QUERIES[0], long_query]
    assert [len(tok.encode(q, truncation=False)) > length for q in queries] == [False, True]
    loaded = query_encoder(index.info, dtype="float32")
    with pytest.warns(UserWarning, match=rf"^1 of 2 queries are longer than the {length} tokens") as said:
        vectors = embed_queries(index.info, loaded, queries)
    assert len(said) == 1
    head = tok.decode(tok.encode(long_query, max_length=length).input_ids, skip_special_tokens=True)
    np.testing.assert_allclose(vectors[1], embed_queries(index.info, loaded, [head])[0], atol=1e-5)


def test_another_model_is_refused_naming_both(built, tiny, tmp_path):
    other = make_tiny(tmp_path / "other", seed=1)
    with pytest.raises(BertkitError) as err:
        search(open_index(built), QUERIES, model=str(other), dtype="float32")
    message = str(err.value)
    assert str(tiny.resolve()) in message and str(other.resolve()) in message and "\n" not in message
    # the same directory with other weights: refused too
    moved = tmp_path / "moved"
    make_tiny(moved, seed=0)
    info = json.loads((built / "index.json").read_text())
    info["model"]["directory"] = str(moved.resolve())
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("passages.jsonl", "vectors.safetensors"):
        (copy / name).write_bytes((built / name).read_bytes())
    shutil.copytree(built / "lexical", copy / "lexical")
    (copy / "index.json").write_text(json.dumps(info))
    assert search(open_index(copy), QUERIES[:1], k=1, dtype="float32")  # same weights, another folder: fine
    make_tiny(moved, seed=2)
    with pytest.raises(BertkitError, match="its weights changed since"):
        search(open_index(copy), QUERIES[:1], dtype="float32")


def cross_encoder(path, task, num_labels):
    """A random cross-encoder saved as `bertkit finetune regression|pair` saves one."""
    from bertkit.model.config import BertConfig
    from bertkit.model.heads import BertForSequenceClassification
    from bertkit.text.tokenizer import Tokenizer

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64, num_labels=num_labels)
    if task == "regression":
        config.problem_type = "regression"
    torch.manual_seed(3)
    BertForSequenceClassification(config).save_pretrained(path, tokenizer=Tokenizer.from_pretrained())
    (path / "bertkit_task.json").write_text(json.dumps(
        {"task": task, "text_column": "sentence1", "text_pair_column": "sentence2", "max_length": 64}))
    return path


@pytest.mark.parametrize("task,labels", [("regression", 1), ("pair", 2)])
def test_rerank_orders_the_top_by_the_cross_encoders_score(built, tmp_path, task, labels):
    from bertkit.tasks.predict import predict

    model = cross_encoder(tmp_path / task, task, labels)
    first = search(open_index(built), QUERIES[:1], k=6, dtype="float32")[0]
    loaded = reranker(str(model), dtype="float32")
    got = rerank(loaded, QUERIES[0], first, top=4)
    preds = predict(model, [QUERIES[0]] * 4, pairs=[h.text for h in first[:4]], dtype="float32")
    scores = [p["score"] if task == "regression" else list(p["probabilities"].values())[1] for p in preds]
    order = np.argsort(-np.array(scores), kind="stable")
    assert [h.id for h in got[:4]] == [first[i].id for i in order] and got[4:] == first[4:]
    np.testing.assert_allclose([h.score for h in got[:4]], np.array(scores)[order], atol=1e-6)
    assert pair_scores(loaded, QUERIES[0], [first[0].text]) == pytest.approx([scores[0]], abs=1e-6)


def test_a_cross_encoder_that_reads_the_pairs_cut_says_so(built, tmp_path, transformers_mod):
    """`search --rerank` with a cross-encoder whose max_length is shorter than a (query, passage) pair read the
    pairs cut without a word (finetune's default is 128 tokens, an index's passages 256): one warning now counts
    them, in the line `bertkit predict` says. Reference: transformers' count of each pair re-scored (the first
    stage's best --rerank-top), uncut, against the model's max_length."""
    model = cross_encoder(tmp_path / "cross", "regression", 1)
    info = json.loads((model / "bertkit_task.json").read_text())
    (model / "bertkit_task.json").write_text(json.dumps({**info, "max_length": TOKENS}))
    fast = transformers_mod.BertTokenizerFast.from_pretrained(str(model))
    first = search(open_index(built), QUERIES, k=4, dtype="float32")
    cut = sum(len(fast(q, h.text)["input_ids"]) > TOKENS for q, hits in zip(QUERIES, first) for h in hits)
    assert 0 < cut <= 8
    (tmp_path / "q.txt").write_text("\n".join(QUERIES) + "\n")
    with pytest.warns(UserWarning, match=rf"^--rerank {re.escape(str(model))}: {cut} of 8 \(query, passage\) pairs "
                      rf"are longer than the {TOKENS} tokens the model reads \(its max length\)") as said:
        assert main(["search", str(built), "--queries", str(tmp_path / "q.txt"), "-k", "2", "--rerank", str(model),
                     "--rerank-top", "4", "--json", "--dtype", "float32"]) == 0
    assert len([w for w in said if "--rerank" in str(w.message)]) == 1  # one line for every query


class ReadOnce:
    """Tokenizer.encode and Tokenizer.head watched: every text a cross-encoder's pair gives `encode`, and every text
    read toward a cut (`head` past one piece: predict's check that a text has a piece reads one) outside an encode."""

    def __init__(self, monkeypatch):
        from bertkit.text.tokenizer import Tokenizer

        self.encoded, self.read, self.inside = [], [], 0
        encode, head = Tokenizer.encode, Tokenizer.head

        def watched_encode(tok, text, pair=None, **options):
            self.encoded.append((text, pair))
            self.inside += 1
            try:
                return encode(tok, text, pair, **options)
            finally:
                self.inside -= 1

        def watched_head(tok, text, n):
            if not self.inside and n > 1:
                self.read.append(text)
            return head(tok, text, n)

        monkeypatch.setattr(Tokenizer, "encode", watched_encode)
        monkeypatch.setattr(Tokenizer, "head", watched_head)


def test_search_rerank_reads_each_pair_once_and_counts_it_cut_from_that_pass(built, tmp_path, transformers_mod,
                                                                              monkeypatch):
    """`search --rerank` counted the pairs the cross-encoder read cut by reading every re-scored (query, passage)
    pair toward its cut a first time (each side's head and its pieces), before the cross-encoder encoded them all
    again to score them: the count now comes from the scoring pass's own encodings (`Encoding.truncated`). Each
    pair is encoded once and no passage is read toward a cut anywhere else; the warning's count is still
    transformers' (BertTokenizerFast: each re-scored pair uncut, against the model's max_length)."""
    model = cross_encoder(tmp_path / "cross", "regression", 1)
    info = json.loads((model / "bertkit_task.json").read_text())
    (model / "bertkit_task.json").write_text(json.dumps({**info, "max_length": TOKENS}))
    fast = transformers_mod.BertTokenizerFast.from_pretrained(str(model))
    first = search(open_index(built), QUERIES, k=4, dtype="float32")
    pairs = [(q, h.text) for q, hits in zip(QUERIES, first) for h in hits]
    cut = sum(len(fast(q, p)["input_ids"]) > TOKENS for q, p in pairs)
    assert 0 < cut < len(pairs)
    (tmp_path / "q.txt").write_text("\n".join(QUERIES) + "\n")
    watch = ReadOnce(monkeypatch)
    with pytest.warns(UserWarning, match=rf"^--rerank .*\b{cut} of 8\b"):  # the line: test above
        assert main(["search", str(built), "--queries", str(tmp_path / "q.txt"), "-k", "2", "--rerank", str(model),
                     "--rerank-top", "4", "--json", "--dtype", "float32"]) == 0
    assert sorted(p for p in watch.encoded if p[1] is not None) == sorted(pairs)  # each pair once
    assert not {p for _, p in pairs} & set(watch.read)  # and nowhere else read toward its cut


def test_rerank_counts_the_pairs_cut_at_the_boundary_as_transformers(tmp_path, transformers_mod):
    """rerank's on_cut counts a pair cut when its [CLS] query [SEP] passage [SEP] holds more than the model's
    max_length, not when it holds exactly that many (reference: BertTokenizerFast's count of each pair, uncut)."""
    from bertkit.retrieval.search import Hit

    model = cross_encoder(tmp_path / "cross", "regression", 1)
    info = json.loads((model / "bertkit_task.json").read_text())
    (model / "bertkit_task.json").write_text(json.dumps({**info, "max_length": 24}))
    fast = transformers_mod.BertTokenizerFast.from_pretrained(str(model))
    query = "vitamin d and bones"
    passages = [" ".join(["bone"] * k) for k in range(14, 20)] + ["the passage goes on and on . " * 40]
    lengths = [len(fast(query, p)["input_ids"]) for p in passages]
    assert 24 in lengths and 25 in lengths
    counted = []
    hits = [Hit(f"p{i}", f"d{i}", 0.0, p, "", 0, len(p)) for i, p in enumerate(passages)]
    rerank(reranker(str(model), dtype="float32"), query, hits, top=7, on_cut=lambda *n: counted.append(n))
    assert counted == [(sum(n > 24 for n in lengths), 7)]


def test_rerank_refuses_a_model_that_is_no_cross_encoder(built, tmp_path, tiny):
    three = cross_encoder(tmp_path / "three", "pair", 3)
    with pytest.raises(BertkitError, match="pair model with 3 labels: --rerank needs a cross-encoder"):
        reranker(str(three))
    with pytest.raises(BertkitError, match="not a fine-tuned task model"):
        reranker(str(tiny))


def test_a_cross_encoder_saved_by_transformers_reranks(tmp_path, transformers_mod):
    """A Hugging Face cross-encoder folder (a one-label BertForSequenceClassification saved by
    transformers or sentence-transformers' CrossEncoder: config.json and weights, no bertkit_task.json)
    says nothing of being trained on pairs; it was refused as "a regression model of single texts".
    It reranks, its scores are transformers' logits, and the server answers /rerank with it and takes
    single texts and pairs in one batch. A model bertkit trained on single texts still refuses pairs."""
    from bertkit.runtime.loading import load
    from bertkit.serve.runner import Query, TaskModel
    from bertkit.serve.settings import ServeConfig
    from bertkit.tasks.predict import predict
    from bertkit.text.tokenizer import Tokenizer

    config = transformers_mod.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=37, max_position_embeddings=64, num_labels=1)
    torch.manual_seed(5)
    peer = transformers_mod.BertForSequenceClassification(config).eval()
    peer.save_pretrained(tmp_path / "hf")
    Tokenizer.from_pretrained().save_pretrained(tmp_path / "hf")
    passages = ["vitamin d lowers the risk of fractures", "the cat sat on the mat", "statins and memory"]
    cross = reranker(str(tmp_path / "hf"), dtype="float32")
    tok = transformers_mod.BertTokenizer(str(tmp_path / "hf" / "vocab.txt"))
    with torch.no_grad():
        logits = peer(**tok([QUERIES[0]] * 3, passages, return_tensors="pt", padding=True)).logits[:, 0]
    assert pair_scores(cross, QUERIES[0], passages) == pytest.approx(logits.tolist(), abs=1e-5)

    served = TaskModel(load(tmp_path / "hf", dtype="float32"), ServeConfig(), "hf")
    assert served.can_rerank() and "/rerank" in served.info()["endpoints"]
    mixed = served.run_jobs([type("Job", (), {"items": [Query(QUERIES[0], passages[0]), Query(passages[1], None)]})])
    alone = [predict(None, [QUERIES[0]], [passages[0]], loaded=cross)[0], predict(None, [passages[1]], loaded=cross)[0]]
    assert [p["score"] for p in mixed[0]] == pytest.approx([p["score"] for p in alone], abs=1e-6)

    three = transformers_mod.BertForSequenceClassification(transformers_mod.BertConfig(**{**config.to_dict(),
                                                                                         "num_labels": 3}))
    three.save_pretrained(tmp_path / "nli")
    Tokenizer.from_pretrained().save_pretrained(tmp_path / "nli")
    with pytest.raises(BertkitError, match=r"is a classify model with 3 labels: --rerank needs"):
        reranker(str(tmp_path / "nli"))
    single = cross_encoder(tmp_path / "single", "classify", 2)
    (single / "bertkit_task.json").write_text(json.dumps({"task": "classify", "text_column": "sentence",
                                                          "max_length": 64}))
    with pytest.raises(BertkitError, match="was trained on single texts: it reads no pairs"):
        predict(single, ["a text"], pairs=["another"])


def test_cli_index_and_search_end_to_end(tiny, shared_data, tmp_path, capsys):
    corpus = scifact_corpus(shared_data, tmp_path / "corpus.jsonl", n=6, first=40)
    out = tmp_path / "index"
    assert main(["index", str(corpus), "-o", str(out), "--model", str(tiny), "--passage-tokens", "48",
                 "--dtype", "float32", "--quiet"]) == 0
    assert f"{out}: " in capsys.readouterr().out
    assert main(["search", str(out), QUERIES[0], "-k", "3", "--json", "--dtype", "float32"]) == 0
    answer = json.loads(capsys.readouterr().out)
    want = search(open_index(out), QUERIES[:1], k=3, dtype="float32")
    assert answer == [[h.to_dict() for h in want[0]]]
    assert set(answer[0][0]) == {"id", "doc_id", "score", "text"}
    (tmp_path / "q.txt").write_text(f"{QUERIES[0]}\n\n{QUERIES[1]}\n")
    assert main(["search", str(out), "--queries", str(tmp_path / "q.txt"), "-k", "2", "--dtype", "float32"]) == 0
    plain = capsys.readouterr().out
    assert plain.count("query: ") == 2 and f"  {want[0][0].doc_id}  [{want[0][0].id}]" in plain
    model = cross_encoder(tmp_path / "cross", "regression", 1)
    assert main(["search", str(out), QUERIES[0], "-k", "2", "--rerank", str(model), "--rerank-top", "3",
                 "--json", "--dtype", "float32"]) == 0
    reranked = json.loads(capsys.readouterr().out)[0]
    assert len(reranked) == 2 and {h["doc_id"] for h in reranked} <= {h.doc_id for h in search(
        open_index(out), QUERIES[:1], k=3, dtype="float32")[0]}
    with pytest.raises(SystemExit) as stop:  # a count below 1: refused where it is typed, before the index opens
        main(["search", str(out), "q", "-k", "0"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "argument -k: must be at least 1, got 0" in err and err.count("\n") == 1, err
    for argv, message in [(["search", str(out)], "give one QUERY or --queries FILE"),
                          (["search", str(tmp_path), "q"], "is not an index"),
                          (["search", str(out), "q", "--model", str(tmp_path / "cross")], "this index was made by")]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_a_fusion_setting_the_search_would_not_use_is_refused(built, capsys):
    """--alpha 0.2 with --mode dense, --fusion-depth with --mode lexical, --rrf-k beside dbsf: each search ran and
    answered exactly as without the setting, unsaid (a user tuning alpha saw nothing move). Refused in one line,
    from the CLI and the library alike, before the model loads; where it applies it is still taken."""
    index = open_index(built)
    cases = [({"mode": "dense", "alpha": 0.2}, "--alpha sets how hybrid search fuses the dense and lexical runs, and "
              "this search is dense (one run, nothing fused): give --mode hybrid, or leave it out"),
             ({"mode": "lexical", "fusion": "rrf", "depth": 20}, "--fusion and --fusion-depth set how hybrid search "
              "fuses the dense and lexical runs, and this search is lexical (one run, nothing fused): give --mode "
              "hybrid, or leave them out"),
             ({"rrf_k": 10}, "--rrf-k sets rrf's constant, and this search fuses by dbsf: give --fusion rrf too, or "
              "leave --rrf-k out")]
    for given, says in cases:
        with pytest.raises(BertkitError) as err:
            search(index, QUERIES, k=2, model="no/such/model", fusion=given)  # refused before the model is looked for
        assert str(err.value) == says
    argv = ["search", str(built), QUERIES[0], "--mode", "dense", "--alpha", "0.2", "--model", "no/such/model"]
    assert main(argv) == 2 and capsys.readouterr().err == f"bertkit: error: {cases[0][1]}\n"
    with pytest.raises(BertkitError, match="^ann=True walks the HNSW graph"):
        search(index, QUERIES, k=2, ann=True, fusion={"mode": "lexical"})
    # where they apply: rrf with its k moves the fused scores, and the dense search is the default's dense one
    rrf = [[h.score for h in hits] for hits in search(index, QUERIES, k=3, dtype="float32",
                                                      fusion={"fusion": "rrf", "rrf_k": 1})]
    assert rrf != [[h.score for h in hits] for hits in search(index, QUERIES, k=3, dtype="float32",
                                                              fusion={"fusion": "rrf"})]


def test_a_lexical_search_refuses_the_query_encoders_options(built, tmp_path, capsys):
    """search --mode lexical ranks by BM25 and embeds no query: --model, --dtype, --device, --batch-size and the
    dense scan's --block-size were taken and ignored (the answers the same whatever they said). Each is refused
    in one line before anything loads; beside --rerank, --dtype, --device and --batch-size run the cross-encoder
    and are taken; a dense search takes them all."""
    base = ["search", str(built), QUERIES[0], "--mode", "lexical", "-k", "2", "--json"]
    for flags in (["--model", "no/such/model"], ["--dtype", "float32"], ["--device", "cpu"], ["--batch-size", "8"],
                  ["--block-size", "64"], ["--dtype", "bfloat16", "--batch-size", "8"]):
        assert main(base + flags) == 2, flags
        err = capsys.readouterr().err
        named = " and ".join(f for f in flags if f.startswith("--"))
        assert err.startswith(f"bertkit: error: {named} set") and "--mode lexical embeds no query" in err, err
        assert err.count("\n") == 1, err
    assert main(base) == 0
    lexical = json.loads(capsys.readouterr().out)
    assert lexical == [[h.to_dict() for h in search(open_index(built), QUERIES[:1], k=2, fusion={"mode": "lexical"})[0]]]
    model = cross_encoder(tmp_path / "cross", "regression", 1)
    assert main(base + ["--rerank", str(model), "--rerank-top", "2", "--dtype", "float32", "--device", "cpu",
                        "--batch-size", "8"]) == 0
    assert {h["id"] for h in json.loads(capsys.readouterr().out)[0]} == {h["id"] for h in lexical[0]}
    assert main(base + ["--rerank", str(model), "--model", "no/such/model"]) == 2  # the query encoder still not
    assert "--model sets" in capsys.readouterr().err
    assert main(["search", str(built), QUERIES[0], "--mode", "dense", "-k", "2", "--dtype", "float32", "--device",
                 "cpu", "--batch-size", "8", "--block-size", "64"]) == 0


def test_queries_in_another_precision_than_the_passages_are_said(built, tiny, capsys):
    """A bfloat16 index searched with float32 queries (or the reverse) ran without a word, its scores neither
    precision's own (evaluate retrieval --index printed both precisions; search and serve neither). search
    warns naming both and the --dtype that matches; the same precision stays quiet; serve's /info gives the
    passages' precision beside its own."""
    import warnings

    from bertkit.serve.runner import Searcher

    index = open_index(built)
    assert index.info["model"]["precision"] == "float32"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mixed = search(index, QUERIES, k=3, dtype="bfloat16", fusion={"mode": "dense"})
        said = [str(w.message) for w in caught if "index's passages" in str(w.message)]
        assert said == ["queries are embedded in bfloat16, the index's passages were in float32 (--dtype float32 "
                        "embeds them as the passages were)"]
        caught.clear()
        same = search(index, QUERIES, k=3, dtype="float32", fusion={"mode": "dense"})
        assert not [w for w in caught if "index's passages" in str(w.message)]
    assert [[h.doc_id for h in hits] for hits in mixed] and [h.score for h in mixed[0]] != [h.score for h in same[0]]
    assert Searcher(index, 64).info()["precision"] == "float32"
    from bertkit.serve.runner import load_runner, load_searcher
    from bertkit.serve.settings import ServeConfig

    for dtype, noted in (("bfloat16", True), ("float32", False)):  # serve says it at start-up
        settings = ServeConfig(model=str(tiny), index=str(built), dtype=dtype)
        load_searcher(settings, load_runner(settings))
        err = capsys.readouterr().err
        assert ("note: queries are embedded in bfloat16, the index's passages were in float32" in err) == noted, err


def test_a_query_without_tokens_is_named_by_its_line(built, tmp_path, capsys):
    """search --queries FILE with a line of characters BERT drops said "text '\u200b' yields no tokens" and not
    which line (embed names FILE:LINE); the blank line before it is skipped but still counted."""
    (tmp_path / "q.txt").write_text(f"{QUERIES[0]}\n\n\u200b\n{QUERIES[1]}\n", encoding="utf-8")
    assert main(["search", str(built), "--queries", str(tmp_path / "q.txt"), "--mode", "dense"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"bertkit: error: {tmp_path / 'q.txt'}:3: text '\\u200b' yields no tokens"), err
    with pytest.raises(BertkitError, match=r"^queries\[1\]: text '\\u200b' yields no tokens"):
        search(built, [QUERIES[0], "\u200b"], dtype="float32", fusion={"mode": "dense"})


def test_an_empty_query_is_refused_in_every_mode(built, capsys):
    """`search INDEX "  " --mode lexical` printed "query:" and no hit, exit 0, where the dense and hybrid
    searches refused it: one line now in every mode, from the CLI and the library."""
    for mode in ("lexical", "dense", "hybrid"):
        with pytest.raises(BertkitError, match="^every query needs some text$"):
            search(built, [QUERIES[0], "  "], k=2, dtype="float32", fusion={"mode": mode})
        assert main(["search", str(built), " ", "--mode", mode]) == 2
        assert capsys.readouterr().err == "bertkit: error: every query needs some text\n"


def test_plain_output_shows_a_long_query_cut_and_json_leaves_it_out(built, capsys):
    # a 2,000-word query was echoed whole: a 12 KB "query:" line above the hits
    long_query = " ".join([QUERIES[0]] * 300)
    assert main(["search", str(built), long_query, "-k", "2", "--dtype", "float32"]) == 0
    shown = capsys.readouterr().out.splitlines()[0]
    assert shown.startswith(f"query: {long_query[:60]}") and shown.endswith("...") and len(shown) <= len("query: ") + 80
    assert main(["search", str(built), QUERIES[1], "-k", "2", "--dtype", "float32"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"query: {QUERIES[1]}"  # a short one whole
    assert main(["search", str(built), long_query, "-k", "2", "--json", "--dtype", "float32"]) == 0
    want = search(open_index(built), [long_query], k=2, dtype="float32")
    assert json.loads(capsys.readouterr().out) == [[h.to_dict() for h in want[0]]]


def test_json_answers_to_a_queries_file_say_when_blank_lines_were_skipped(built, tmp_path, capsys):
    # --json answers one list per query and echoes none: a blank line of --queries FILE was skipped unsaid, so
    # answer i was not the file's line i (as embed says of its rows)
    (tmp_path / "q.txt").write_text(f"\n{QUERIES[0]}\n  \n{QUERIES[1]}\n", encoding="utf-8")
    assert main(["search", str(built), "--queries", str(tmp_path / "q.txt"), "-k", "2", "--json",
                 "--dtype", "float32"]) == 0
    captured = capsys.readouterr()
    want = search(open_index(built), QUERIES, k=2, dtype="float32")
    assert json.loads(captured.out) == [[h.to_dict() for h in hits] for hits in want]
    assert "2 blank lines skipped, so answer i is the i-th query" in captured.err, captured.err
    (tmp_path / "q.txt").write_text(f"{QUERIES[0]}\n", encoding="utf-8")
    assert main(["search", str(built), "--queries", str(tmp_path / "q.txt"), "-k", "2", "--json",
                 "--dtype", "float32"]) == 0
    assert "skipped" not in capsys.readouterr().err


# --- approximate search: FAISS HNSW --------------------------------------------------------------

def test_hnsw_recall_is_measured_against_exact_search(tmp_path):
    from bertkit.retrieval.ann import build_hnsw, read_hnsw, recall_at_10

    rng = np.random.default_rng(2)
    centres = rng.standard_normal((30, 24))
    vectors = unit(centres[rng.integers(0, 30, 1500)] + 0.3 * rng.standard_normal((1500, 24)))
    index = write_index(tmp_path / "ix", vectors, np.arange(1500))
    build_hnsw(index.vectors, tmp_path / "ix" / "hnsw.faiss", m=16, ef_construction=100, block_size=700)
    graph = read_hnsw(tmp_path / "ix" / "hnsw.faiss")
    assert graph.ntotal == 1500
    assert recall_at_10(graph, index.vectors, ef_search=1500) == 1.0  # a walk that keeps everything is exact
    build_hnsw(index.vectors, tmp_path / "poor.faiss", m=2, ef_construction=2)
    poor = recall_at_10(read_hnsw(tmp_path / "poor.faiss"), index.vectors, ef_search=1)
    assert poor < 0.9  # a graph of 2 links walked greedily misses neighbours, and the measure sees it
    queries = rng.standard_normal((5, 24)).astype(np.float32)
    exact_rows, exact_scores = best_documents(index, queries, 10)
    ann_rows, ann_scores = best_documents(index, queries, 10, ann=True, ef_search=1500)
    assert ann_rows == exact_rows
    np.testing.assert_allclose(ann_scores, exact_scores, atol=1e-5)


def test_an_open_index_answers_from_its_own_build_while_the_folder_is_built_again(tiny, shared_data, tmp_path):
    """A server holds its index open while `bertkit index --overwrite` rebuilds the folder from another corpus:
    before, its passages were then read from the new passages.jsonl at the old offsets (a JSONDecodeError, a 500;
    or another passage's text), its lexical part (read on first use) and HNSW graph were the new build's, mixed
    with the old vectors. Now an open index answers from the build it opened, every mode, exact and --ann; one
    opened afterwards answers from the new build; a graph of another build is refused."""
    from bertkit.retrieval.ann import ann_top_k

    folder = tmp_path / "index"
    settings = dict(passage_tokens=TOKENS, overlap=OVERLAP, dtype="float32", progress=False, ann="hnsw")
    build_index(scifact_corpus(shared_data, tmp_path / "a.jsonl", n=8, first=0), folder, str(tiny), **settings)
    old, untouched = open_index(folder), open_index(folder)  # untouched: its lexical part first used later

    def answers(index):
        return [[(h.doc_id, h.id, h.text, round(h.score, 6)) for hits in search(
            index, QUERIES, k=3, dtype="float32", ann=ann, fusion={"mode": mode}) for h in hits]
            for mode in ("dense", "lexical", "hybrid") for ann in (False, True) if not (ann and mode == "lexical")]

    before = answers(old)
    assert old.graph() is old.graph()  # read once
    ann_top_k(old.graph(), np.ones((1, old.info["dim"]), np.float32), 3, ef_search=7)
    assert old.graph().hnsw.efSearch != 7  # efSearch goes with the call, the shared graph is not changed
    build_index(scifact_corpus(shared_data, tmp_path / "b.jsonl", n=5, first=40), folder, str(tiny), overwrite=True,
                **settings)
    assert answers(old) == before  # the build it opened, whole
    assert answers(untouched) == before  # its lexical part too, held at open (not read through bm25s until now)
    new = open_index(folder)
    b_ids = {json.loads(line)["_id"] for line in (tmp_path / "b.jsonl").read_text().splitlines()}
    assert {doc for run in answers(new) for doc, *_ in run} <= b_ids and new.graph().ntotal == len(new)
    # a graph left from another build (a copy, a half-done rebuild) is refused, not walked with other rows
    shutil.copy(folder / "hnsw.faiss", tmp_path / "b.faiss")
    build_index(scifact_corpus(shared_data, tmp_path / "c.jsonl", n=8, first=0), folder, str(tiny), overwrite=True,
                **settings)
    shutil.copy(tmp_path / "b.faiss", folder / "hnsw.faiss")
    with pytest.raises(BertkitError, match=f"hnsw.faiss holds {len(new)} vectors and its index {len(old)}: it was "
                                           "built for another index"):
        search(open_index(folder), QUERIES, k=3, dtype="float32", ann=True, fusion={"mode": "dense"})


def test_cli_ann_index_and_search(tiny, shared_data, tmp_path, capsys):
    corpus = scifact_corpus(shared_data, tmp_path / "corpus.jsonl", n=6, first=60)
    out = tmp_path / "index"
    assert main(["index", str(corpus), "-o", str(out), "--model", str(tiny), "--passage-tokens", "48", "--ann",
                 "hnsw", "--dtype", "float32", "--quiet"]) == 0
    printed = capsys.readouterr().out
    info = json.loads((out / "index.json").read_text())
    assert f"recall@10 {info['ann']['recall@10']:.4f} against exact search" in printed
    assert info["ann"]["recall@10"] == 1.0  # ~60 vectors and a walk of 128 candidates: every one is seen
    for flags in ([], ["--ann"]):
        assert main(["search", str(out), QUERIES[1], "-k", "4", "--json", "--dtype", "float32", *flags]) == 0
    exact, approx = (json.loads(x) for x in capsys.readouterr().out.strip().split("\n"))
    assert [h["id"] for h in approx[0]] == [h["id"] for h in exact[0]]
    np.testing.assert_allclose([h["score"] for h in approx[0]], [h["score"] for h in exact[0]], atol=1e-5)


def test_ann_without_faiss_is_one_line_before_any_encoding(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(__import__("sys").modules, "faiss", None)  # import faiss -> ImportError
    (tmp_path / "c.tsv").write_text("id\ttext\nd1\tsome text\n")
    assert main(["index", str(tmp_path / "c.tsv"), "-o", str(tmp_path / "ix"), "--model", str(tiny),
                 "--ann", "hnsw"]) == 2
    assert "pip install 'bertkit[search]'" in capsys.readouterr().err and not (tmp_path / "ix").exists()



def test_hnsw_sizes_faiss_cannot_build_are_one_line_before_any_encoding(tmp_path, capsys):
    # --ann-m 1 crashed the process (a segmentation fault in FAISS), --ann-m 0 aborted it (a C++
    # assertion, exit -6): no exception to catch, so they are refused before the model (here: none) loads
    (tmp_path / "c.tsv").write_text("id\ttext\nd1\tsome text\n")
    argv = ["index", str(tmp_path / "c.tsv"), "-o", str(tmp_path / "ix"), "--model", str(tmp_path / "none"),
            "--ann", "hnsw"]
    assert main([*argv, "--ann-m", "1"]) == 2
    assert capsys.readouterr().err == "bertkit: error: --ann-m must be an int of at least 2, got 1\n"
    for flag, value in (("--ann-m", "0"), ("--ef-construction", "0"), ("--ef-search", "-3")):  # below 1: parsing
        with pytest.raises(SystemExit) as stop:
            main([*argv, flag, value])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.startswith(f"bertkit: error: argument {flag}: must be at least 1, got "
                                                       f"{value} ") and err.count("\n") == 1
    assert not (tmp_path / "ix").exists()

# --- Qdrant ------------------------------------------------------------------------------------

def test_a_qdrant_collection_answers_as_the_exact_search(built, tiny, tmp_path, capsys):
    where = str(tmp_path / "qdrant")
    assert main(["index", "export", str(built), "--qdrant", where, "--collection", "sci", "--quiet"]) == 0
    assert f"{len(open_index(built))} passages written" in capsys.readouterr().out
    exact = search(open_index(built), QUERIES, k=10, dtype="float32", fusion={"mode": "dense"})
    assert main(["search", "--qdrant", where, "--collection", "sci", QUERIES[0], "-k", "10", "--json",
                 "--dtype", "float32", "--mode", "dense"]) == 0
    answer = json.loads(capsys.readouterr().out)[0]
    assert [h["id"] for h in answer] == [h.id for h in exact[0]] and len(answer) == 10
    np.testing.assert_allclose([h["score"] for h in answer], [h.score for h in exact[0]], atol=1e-5)
    from bertkit.retrieval.qdrant import search as search_qdrant

    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        both = search_qdrant(where, "sci", QUERIES, k=5, dtype="float32")
        assert not [w for w in caught if "index's passages" in str(w.message)]
        # bfloat16 queries against float32 passages: said as search() and serve --index say it (it was silent)
        search_qdrant(where, "sci", QUERIES[:1], k=2, dtype="bfloat16", fusion=FusionOptions(mode="dense"))
        said = [str(w.message) for w in caught if "index's passages" in str(w.message)]
        assert said == ["queries are embedded in bfloat16, the index's passages were in float32 (--dtype float32 "
                        "embeds them as the passages were)"]
    assert [[h.id for h in hits] for hits in both] == [[h.id for h in hits[:5]] for hits in exact]
    assert [h.text for h in both[1]] == [h.text for h in exact[1][:5]]
    from bertkit.retrieval.qdrant import search_vectors as qdrant_vectors

    info = open_index(built).info
    vectors = embed_queries(info, query_encoder(info, dtype="float32"), QUERIES)
    given = qdrant_vectors(where, "sci", vectors, k=10)  # queries embedded beforehand, as a server has them
    assert [[h.id for h in hits] for hits in given] == [[h.id for h in hits] for hits in exact]
    np.testing.assert_allclose([h.score for h in given[1]], [h.score for h in exact[1]], atol=1e-5)
    for argv, message in [(["index", "export", str(built), "--qdrant", where, "--collection", "sci"], "already exists"),
                          (["search", "--qdrant", where, "--collection", "nope", "q"], "no collection 'nope'"),
                          (["search", "--qdrant", where, "--collection", "sci", "q", "--model",
                            str(make_tiny(tmp_path / "other", seed=1))], "this index was made by"),
                          (["index", "export", str(built), "--qdrant", where], "needs --qdrant PATH|URL and --collection")]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


KILLED_AFTER_TWO_BATCHES = """
import os, signal, sys
from qdrant_client import QdrantClient
from bertkit.retrieval.index import open_index
from bertkit.retrieval.qdrant import export

real_upsert, calls = QdrantClient.upsert, []

def upsert(self, *args, **kwargs):
    out = real_upsert(self, *args, **kwargs)
    calls.append(1)
    if len(calls) == 2:  # two batches written, the rest not
        os.kill(os.getpid(), signal.SIGKILL)
    return out

QdrantClient.upsert = upsert
export(open_index(sys.argv[1]), sys.argv[2], "sci", batch_size=8, progress=False)
"""


def test_an_export_killed_half_way_is_refused_by_search_and_finished_by_resume(built, tmp_path, capsys):
    """A collection whose export was SIGKILLed held 16 of the passages and answered from them, silently; now
    search refuses it naming --resume, and export --resume (or --overwrite) writes the rest: then it answers as
    the exact search."""
    from qdrant_client import QdrantClient

    where, n = str(tmp_path / "qdrant"), len(open_index(built))
    child = subprocess.run([sys.executable, "-c", KILLED_AFTER_TWO_BATCHES, str(built), where], capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == -9, child.stderr
    client = QdrantClient(path=where)
    assert client.count("sci", exact=True).count == 16 < n  # the premise: a part of the passages is there
    client.close()
    search_argv = ["search", "--qdrant", where, "--collection", "sci", QUERIES[0], "-k", "5", "--json", "--dtype",
                   "float32", "--mode", "dense"]
    export_argv = ["index", "export", str(built), "--qdrant", where, "--collection", "sci", "--quiet"]
    for argv, message in [(search_argv, f"holds 16 of its index's {n} passages: its export did not finish"),
                          (export_argv, f"holds 16 of its index's {n} passages (an export that was interrupted): "
                                        "pass --resume"),
                          ([*export_argv, "--resume", "--overwrite"], "give one")]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    exact = [h.id for h in search(open_index(built), QUERIES[:1], k=5, dtype="float32", fusion={"mode": "dense"})[0]]
    for flag in ("--resume", "--overwrite"):
        assert main([*export_argv, flag]) == 0, capsys.readouterr().err
        capsys.readouterr()
        assert main(search_argv) == 0
        assert [h["id"] for h in json.loads(capsys.readouterr().out)[0]] == exact
    assert main([*export_argv, "--resume"]) == 0  # a finished export resumed: nothing left to write
    assert main(export_argv) == 2 and "already exists" in capsys.readouterr().err
    assert main([*export_argv[:-2], "other", "--quiet", "--resume"]) == 2
    assert "no collection 'other'" in capsys.readouterr().err


def test_an_index_whose_model_folder_is_gone_finds_the_default_model_or_asks_for_model(built, tiny, tmp_path,
                                                                                       capsys):
    """index.json names its model's folder; an index copied to another machine (or made in another environment,
    whose default model lives elsewhere) named a folder that is not there: the search failed with "no model
    directory at ..." and no word of --model. Now the default model is used when its weights are the index's,
    and otherwise the one line names --model, which works."""
    def moved(index, folder):
        shutil.copytree(index, folder)
        info = json.loads((folder / "index.json").read_text())
        info["model"]["directory"] = str(tmp_path / "gone" / "model")
        (folder / "index.json").write_text(json.dumps(info))
        return folder

    other = moved(built, tmp_path / "tiny.index")
    assert main(["search", str(other), QUERIES[0], "--mode", "dense", "--json", "--dtype", "float32"]) == 2
    err = capsys.readouterr().err
    assert f"made by the model in {tmp_path / 'gone' / 'model'}" in err and "pass --model DIR" in err, err
    assert err.count("\n") == 1
    assert main(["search", str(other), QUERIES[0], "--mode", "dense", "--json", "--dtype", "float32",
                 "--model", str(tiny)]) == 0
    assert [h["id"] for h in json.loads(capsys.readouterr().out)[0]] == \
        [h.id for h in search(open_index(built), QUERIES[:1], dtype="float32", fusion={"mode": "dense"})[0]]
    (tmp_path / "c.tsv").write_text("id\ttext\nd1\tVitamin D and bone fractures.\nd2\tStem cells in the brain.\n")
    default = tmp_path / "default.index"
    build_index(tmp_path / "c.tsv", default, dtype="float32", progress=False, lexical=None)  # the default model
    want = [h.id for h in search(open_index(default), QUERIES[:1], dtype="float32")[0]]
    assert [h.id for h in search(open_index(moved(default, tmp_path / "d.index")), QUERIES[:1],
                                 dtype="float32")[0]] == want
