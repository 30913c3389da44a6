"""`bertkit serve --index`: POST /search answers as `bertkit search --json` does, batched with the embeddings;
and the text-embeddings-inference extras on the same server: Matryoshka `dimensions` and /tokenize.

One real server process (test_serve's `Server`) on a tiny odd-shaped encoder (hidden 32) that carries a
sentence-transformers layout with Matryoshka dimensions 32, 16, 8, an index of ten SciFact abstracts built
with it, and a random cross-encoder for `rerank`. The reference for every answer is the library run in this
process: `bertkit search --json` (the CLI) on the same index, `bertkit.embed`, the tokenizer. A second
process, started beside it, must refuse an index made by another model before it opens a port.
"""

import json
import threading

import numpy as np
import pytest
from test_index import OVERLAP, TOKENS, make_tiny, scifact_corpus
from test_search import cross_encoder
from test_serve import Server, call, metric

from bertkit.cli import main
from bertkit.retrieval.index import build_index
from bertkit.model.sentence_layout import write_layout

QUERIES = ["vitamin D deficiency and bone fractures", "gene expression in stem cells",
           # past the server's --max-input-length 24 and the index's 48: cut at 48, as bertkit search cuts it
           " ".join(["chronic inflammation of the airways in children with asthma"] * 8)]
WINDOW_MS = 200  # the batching window: an /embed and a /search sent together share one pass
# --max-request-tokens: three of the long query reranked, each cut at 48 and its --rerank-top 4 pairs at the
# cross-encoder's 64 (test_rerank_pairs_count_against_the_request_tokens); no other request here comes near it
MOST_TOKENS = 3 * (48 + 4 * 64)


@pytest.fixture(scope="module")
def made(shared_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve_search")
    tiny = make_tiny(root / "tiny")
    write_layout(tiny, pooling="mean", normalize=True, max_seq_length=48, hidden_size=32, dimensions=[32, 16, 8])
    corpus = scifact_corpus(shared_data, root / "corpus.jsonl", n=10, first=20)
    build_index(corpus, root / "index", str(tiny), passage_tokens=TOKENS, overlap=OVERLAP, batch_size=64,
                dtype="float32", progress=False)
    return {"root": root, "tiny": tiny, "index": root / "index", "cross": cross_encoder(root / "cross", "regression", 1),
            "other": make_tiny(root / "other", seed=1)}


@pytest.fixture(scope="module")
def servers(made):
    started = {
        "search": Server(made["tiny"], "--index", made["index"], "--rerank", made["cross"], "--rerank-top", 4,
                         "--max-request-tokens", MOST_TOKENS, "--max-input-length", 24, "--max-wait-ms", WINDOW_MS,
                         "--workers", 1, "--threads", 1, "--dtype", "float32"),
        "refused": Server(made["other"], "--index", made["index"], "--threads", 1),
    }
    yield started
    if started["refused"].proc.poll() is None:  # it should have exited at start-up; never leave it behind
        started["refused"].proc.kill()
    assert started["search"].stop() == 0, "".join(started["search"].lines)


def cli_search(made, capsys, queries, *flags):
    (made["root"] / "queries.txt").write_text("\n".join(queries) + "\n")
    dtype = [] if "lexical" in flags else ["--dtype", "float32"]  # the server's, where a model embeds the queries
    assert main(["search", str(made["index"]), "--queries", str(made["root"] / "queries.txt"), "--json",
                 *dtype, *map(str, flags)]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def assert_same_answers(got, want, atol=1e-5):
    """Same hits, scores to `atol`: 1e-5 for hybrid, whose min-max scaling divides the cosines' rounding (it
    differs with the batch a query was embedded in, ~1e-7) by the run's range; 1e-6 for one run alone."""
    assert len(got) == len(want)
    for hits, expected in zip(got, want):
        assert [(h["id"], h["doc_id"], h["text"]) for h in hits] == [(h["id"], h["doc_id"], h["text"]) for h in expected]
        np.testing.assert_allclose([h["score"] for h in hits], [h["score"] for h in expected], atol=atol, rtol=0)


def test_search_answers_as_bertkit_search_json(servers, made, capsys):
    port = servers["search"].port
    status, _, answer = call(port, "POST", "/search", {"query": QUERIES, "k": 3})
    assert status == 200
    want = cli_search(made, capsys, QUERIES, "-k", 3)
    assert_same_answers(answer, want)
    assert all(set(h) == {"id", "doc_id", "score", "text"} and len(hits) == 3 for hits in answer for h in hits)
    status, _, one = call(port, "POST", "/search", {"query": QUERIES[0]})  # a string; k defaults to 10 (all 10 docs)
    assert status == 200
    assert_same_answers(one, cli_search(made, capsys, QUERIES[:1]))
    assert len(one[0]) == 10


@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
def test_each_mode_answers_as_bertkit_search_json(servers, made, capsys, mode):
    status, _, answer = call(servers["search"].port, "POST", "/search", {"query": QUERIES, "k": 4, "mode": mode})
    assert status == 200
    assert_same_answers(answer, cli_search(made, capsys, QUERIES, "-k", 4, "--mode", mode),
                        atol=1e-5 if mode == "hybrid" else 1e-6)


def test_search_counts_the_queries_the_model_read_cut(servers, made, transformers_mod):
    """A /search query longer than the index's passages (48 tokens) was cut as they were, and the answer said
    nothing (`bertkit search` warns): the X-Truncated-Inputs header counts such queries where the model embeds
    them; lexical, BM25 alone, reads them whole: 0. Reference: transformers' count of each query, uncut."""
    fast = transformers_mod.BertTokenizerFast.from_pretrained(str(made["tiny"]))
    over = sum(len(fast(q)["input_ids"]) > 48 for q in QUERIES)
    assert over == 1
    for mode, cut in (("dense", over), ("hybrid", over), ("lexical", 0)):
        status, headers, _ = call(servers["search"].port, "POST", "/search", {"query": QUERIES, "k": 2, "mode": mode})
        assert status == 200 and headers["x-truncated-inputs"] == str(cut), mode


def test_a_mode_the_index_lacks_is_refused_in_one_line(made):
    from bertkit.retrieval.index import open_index
    from bertkit.serve.runner import InputError, Searcher

    index = open_index(made["index"])
    index.info = {k: v for k, v in index.info.items() if k != "lexical"}  # as built with --no-lexical
    with pytest.raises(InputError, match="`mode` 'lexical' needs the index's lexical part") as caught:
        Searcher(index, 48).mode("lexical")
    assert caught.value.status == 422 and "\n" not in str(caught.value)
    assert Searcher(index, 48).mode(None) == "dense"


def test_rerank_answers_as_bertkit_search_rerank(servers, made, capsys):
    status, _, answer = call(servers["search"].port, "POST", "/search", {"query": QUERIES[:2], "k": 3, "rerank": True})
    assert status == 200
    assert_same_answers(answer, cli_search(made, capsys, QUERIES[:2], "-k", 3, "--rerank", made["cross"],
                                           "--rerank-top", 4))
    plain = cli_search(made, capsys, QUERIES[:2], "-k", 3)
    assert [h["id"] for h in answer[0]] != [h["id"] for h in plain[0]] or \
        [h["score"] for h in answer[0]] != pytest.approx([h["score"] for h in plain[0]])  # the cross-encoder ran


def test_rerank_counts_the_pairs_the_cross_encoder_read_cut(servers, made, capsys, transformers_mod):
    """/search with "rerank": true counted only the queries it read cut (X-Truncated-Inputs and /metrics), not the
    (query, passage) pairs the cross-encoder read cut at its max_length (64 here; finetune's default 128 beside an
    index's 256-token passages), which `bertkit search --rerank` warns of: both are counted now. Reference:
    transformers' counts, uncut: each query against the index's 48 tokens, and each with its first stage's best 4
    passages (--rerank-top 4; `bertkit search --json`) against the cross-encoder's 64."""
    words = transformers_mod.BertTokenizerFast.from_pretrained(str(made["tiny"]))
    pairs = transformers_mod.BertTokenizerFast.from_pretrained(str(made["cross"]))
    first = cli_search(made, capsys, QUERIES, "-k", 4)
    queries_cut = sum(len(words(q)["input_ids"]) > 48 for q in QUERIES)
    pairs_cut = sum(len(pairs(q, h["text"])["input_ids"]) > 64 for q, hits in zip(QUERIES, first) for h in hits)
    assert queries_cut == 1 and 0 < pairs_cut < 12
    port, counted = servers["search"].port, 'bertkit_serve_truncated_inputs_total{endpoint="/search"}'
    before = metric(port, counted)
    status, headers, _ = call(port, "POST", "/search", {"query": QUERIES, "k": 2, "rerank": True})
    assert status == 200 and headers["x-truncated-inputs"] == str(queries_cut + pairs_cut)
    assert metric(port, counted) == before + queries_cut + pairs_cut


def test_rerank_pairs_count_against_the_request_tokens(servers):
    """/search with "rerank": true counted only its queries against --max-request-tokens, not the --rerank-top
    (query, passage) pairs per query the cross-encoder reads (up to its max_length each: 32 queries x 50 pairs x 512
    tokens is 819,200 tokens against a limit of 16,384). Now they count, as /rerank counts its pairs. Reference: the
    long query is read cut, by the encoder at the index's 48 and in each pair at the cross-encoder's 64 (its answer's
    X-Truncated-Inputs, which transformers' counts check above), so three of it reranked read exactly MOST_TOKENS:
    answered; a short query more is refused, as is nothing without rerank."""
    port, long_ones = servers["search"].port, [QUERIES[2]] * 3
    status, headers, answer = call(port, "POST", "/search", {"query": long_ones, "k": 2, "rerank": True, "mode": "dense"})
    assert status == 200 and headers["x-truncated-inputs"] == str(3 + 3 * 4), answer  # every query, every pair cut
    body = {"query": [*long_ones, "gene"], "k": 2, "rerank": True, "mode": "dense"}
    status, _, answer = call(port, "POST", "/search", body)
    assert status == 413, answer  # the short query's own tokens take it over before its pairs are read
    assert f"more than {MOST_TOKENS} tokens, the limit per request (--max-request-tokens)" in answer["error"], answer
    assert "--rerank-top" in answer["error"] and len(answer["error"]) < 500, answer
    assert call(port, "POST", "/search", {**body, "rerank": False})[0] == 200  # the queries alone: far below it


@pytest.mark.parametrize("body, words", [
    ({"query": "x", "k": 0}, "`k` must be a whole number from 1 to 1000, got 0"),
    ({"query": "x", "k": "3"}, "`k` must be a whole number"),
    ({"query": "x", "k": True}, "`k` must be a whole number"),
    ({"query": "x", "k": 1001}, "from 1 to 1000"),
    ({"query": "  "}, "`query` is empty"),
    ({"query": []}, "`query` is an empty list"),
    ({"query": ["fine", ""]}, "`query[1]` is empty"),
    ({"k": 3}, "`query` is required"),
    ({"query": "x", "rerank": "yes"}, "`rerank` must be true or false"),
    ({"query": "x", "mode": "sparse"}, "`mode` must be one of hybrid, dense, lexical, got 'sparse'"),
    ({"query": "x", "mode": 3}, "`mode` must be one of"),
    # a field /search does not take is refused, not ignored: `alpha` would have answered with the index's fusion
    ({"query": "x", "alpha": 2}, 'unknown field "alpha": this route takes query, k, rerank, mode: the fusion'),
    ({"query": "x", "k": 2, "fusion": "rrf", "top_k": 3}, 'unknown fields "fusion", "top_k"'),
    ({"query": "x", "y" * 100000: 1}, 'unknown field "' + "y" * 40 + '": this route'),  # the name cut: one line
])
def test_bad_search_requests_get_one_clear_error(servers, body, words):
    status, _, answer = call(servers["search"].port, "POST", "/search", body)
    assert status == 422 and words in answer["error"] and len(answer["error"]) < 500, answer


def test_queries_share_the_embeddings_batches_and_are_counted(servers):
    port = servers["search"].port
    rows_before, passes_before = metric(port, "bertkit_serve_batch_size_sum"), metric(port, "bertkit_serve_batch_size_count")
    answers = {}

    def send(path, body):
        answers[path] = call(port, "POST", path, body)[0]

    threads = [threading.Thread(target=send, args=("/search", {"query": "bone density", "k": 2})),
               threading.Thread(target=send, args=("/embed", {"inputs": "bone density"}))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == {"/search": 200, "/embed": 200}
    # both texts in one forward pass of the EmbeddingModel: the query rode with the embeddings traffic
    assert metric(port, "bertkit_serve_batch_size_count") - passes_before == 1
    assert metric(port, "bertkit_serve_batch_size_sum") - rows_before == 2
    assert metric(port, 'bertkit_serve_requests_total{endpoint="/search",status="200"}') >= 1
    assert metric(port, 'bertkit_serve_inputs_total{endpoint="/search"}') >= 1
    status, _, info = call(port, "GET", "/info")
    assert "/search" in info["endpoints"] and info["index"]["documents"] == 10 and info["index"]["rerank_top"] == 4
    from bertkit.retrieval import config  # an untuned index fuses with the defaults, and /info says which
    assert info["index"]["fusion"] == {"fusion": config.DEFAULT_FUSION, "alpha": config.DEFAULT_ALPHA,
                                       "rrf_k": config.DEFAULT_RRF_K, "depth": config.DEFAULT_DEPTH}


def test_info_says_the_fusion_a_tuned_index_serves_with(made):
    """/info's index shows the fusion /search runs: the one `evaluate retrieval --tune` wrote into index.json (it
    showed the mode alone, so a user could not check what a tuned index serves), and none without a lexical part."""
    from bertkit.retrieval.index import open_index
    from bertkit.retrieval.search import fusion_options
    from bertkit.serve.runner import Searcher

    index = open_index(made["index"])
    index.info = {**index.info, "fusion": {"fusion": "rrf", "alpha": 0.3, "rrf_k": 2, "depth": 7}}  # as --tune writes
    searcher = Searcher(index, 48, fusion=fusion_options(index.info))
    assert searcher.info()["fusion"] == {"fusion": "rrf", "alpha": 0.3, "rrf_k": 2, "depth": 7}
    assert searcher.info()["mode"] == "hybrid" == searcher.fusion.mode
    index.info = {k: v for k, v in index.info.items() if k not in ("lexical", "fusion")}  # as built with --no-lexical
    assert Searcher(index, 48, fusion=fusion_options(index.info)).info()["fusion"] is None


def test_concurrent_searches_get_their_own_answers(servers, made, capsys):
    """Requests arriving together share embedding passes and index scans; each keeps its own queries and k."""
    port = servers["search"].port
    requests = [({"query": QUERIES[i % 3], "k": 1 + i % 4}) for i in range(8)] + [{"query": QUERIES[:2], "k": 5}]
    answers = [None] * len(requests)

    def send(i):
        answers[i] = call(port, "POST", "/search", requests[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for request, (status, _, answer) in zip(requests, answers):
        queries = request["query"] if isinstance(request["query"], list) else [request["query"]]
        assert status == 200
        assert_same_answers(answer, cli_search(made, capsys, queries, "-k", request["k"]))


def test_a_hybrid_answer_does_not_depend_on_the_requests_sharing_its_scan(made):
    """A hybrid search fuses each run's best max(k, fusion depth) documents, so a request of k 8 gathered into one
    scan with a request of k 2 must not fuse the k 2 request's runs 8 deep: its answer is `search_vectors`' for
    its own k, as `bertkit search -k 2` gives it (depth 2 here, as an index tuned so would record)."""
    from bertkit.retrieval.config import FusionOptions
    from bertkit.retrieval.index import open_index
    from bertkit.retrieval.search import embed_queries, query_encoder, search_vectors
    from bertkit.serve.runner import Searcher

    index = open_index(made["index"])
    vectors = embed_queries(index.info, query_encoder(index.info, dtype="float32"), QUERIES[:2])
    fusion = FusionOptions(mode="hybrid", depth=2)
    want = search_vectors(index, vectors[:1], 2, queries=QUERIES[:1], fusion=fusion)[0]
    got = Searcher(index, 48, fusion=fusion).scan(vectors, [2, 8], QUERIES[:2], ["hybrid", "hybrid"])[0]
    assert [(h.id, h.score) for h in got] == [(h.id, h.score) for h in want]


def test_an_index_of_another_model_is_refused_at_start_up_in_one_line(servers, made):
    server = servers["refused"]
    assert server.proc.wait(90) == 2
    out = server.proc.stdout.read().strip()
    assert "\n" not in out and "this index was made by" in out, out
    assert str(made["tiny"].resolve()) in out and str(made["other"].resolve()) in out


def test_rerank_without_a_cross_encoder_is_422_naming_the_flag(made):
    from starlette.testclient import TestClient

    from bertkit.serve.app import create_app
    from bertkit.serve.metrics import Metrics
    from bertkit.serve.runner import load_runner
    from bertkit.serve.settings import ServeConfig

    settings = ServeConfig(model=str(made["tiny"]), index=str(made["index"]), workers=1, threads=1,
                           dtype="float32").validate()
    with TestClient(create_app(load_runner(settings), settings, Metrics())) as client:
        response = client.post("/search", json={"query": "x", "rerank": True})
        assert response.status_code == 422 and "--rerank MODEL" in response.json()["error"]
        assert client.post("/search", json={"query": "x", "k": 2}).status_code == 200


def test_without_a_model_the_server_runs_the_model_that_made_the_index(made, capsys):
    """The chain `index --model M` -> `serve --index` as `search INDEX` runs it: search takes the index's model when
    none is given, and serve took the default model, refused at start-up ("this index was made by M, not
    all-MiniLM-L6-v2"). Without MODEL_DIR the server now loads the index's model (its fingerprint checked as
    before) and answers /search as `bertkit search --json` does; /info names it."""
    from starlette.testclient import TestClient

    from bertkit.serve.app import create_app
    from bertkit.serve.metrics import Metrics
    from bertkit.serve.runner import load_runner
    from bertkit.serve.settings import ServeConfig

    settings = ServeConfig(index=str(made["index"]), workers=1, threads=1, dtype="float32").validate()
    runner = load_runner(settings)  # the index's model: its searcher is not refused
    queries = ["vitamin d and bone density", "stem cells"]
    with TestClient(create_app(runner, settings, Metrics())) as client:
        assert client.get("/info").json()["model"] == made["tiny"].resolve().name
        served = client.post("/search", json={"query": queries, "k": 3, "mode": "dense"}).json()
    assert_same_answers(served, cli_search(made, capsys, queries, "-k", 3, "--mode", "dense"), atol=1e-6)


def test_a_server_without_a_model_opens_its_index_once(made, monkeypatch):
    """serve --index without MODEL_DIR opened the whole index (every file's header checked, every vector scanned for
    NaN) only to read which model made it, then opened it again for its searches: a large index's start-up scan
    twice. The model's folder is read from index.json alone (`model_folder`), the index opened once (scans counted
    at index.check_values); its model is loaded and checked as before (its fingerprint against index.json's)."""
    import bertkit.retrieval.index as index_module
    from starlette.testclient import TestClient

    from bertkit.serve.app import create_app
    from bertkit.serve.metrics import Metrics
    from bertkit.serve.runner import load_runner
    from bertkit.serve.settings import ServeConfig

    scans, check_values = [], index_module.check_values
    monkeypatch.setattr(index_module, "check_values", lambda *a, **k: (scans.append(a[0]), check_values(*a, **k))[1])
    settings = ServeConfig(index=str(made["index"]), workers=1, threads=1, dtype="float32").validate()
    with TestClient(create_app(load_runner(settings), settings, Metrics())) as client:
        assert client.get("/info").json()["model"] == made["tiny"].resolve().name
    assert len(scans) == 1  # main: 2


# --- Matryoshka dimensions ---------------------------------------------------------------------


def test_dimensions_truncate_then_renormalise(servers, made):
    import bertkit

    port = servers["search"].port
    texts = ["The cat sat on the mat.", "Quiet."]
    full = bertkit.embed(texts, str(made["tiny"]), normalize=False, dtype="float32")
    for dims in (16, 8):
        want = full[:, :dims] / np.linalg.norm(full[:, :dims], axis=1, keepdims=True)
        status, _, vectors = call(port, "POST", "/embed", {"inputs": texts, "dimensions": dims})
        assert status == 200
        np.testing.assert_allclose(vectors, want, atol=1e-6, rtol=0)
        status, _, body = call(port, "POST", "/v1/embeddings", {"input": texts, "dimensions": dims})
        assert status == 200
        np.testing.assert_allclose([d["embedding"] for d in body["data"]], want, atol=1e-6, rtol=0)
    status, _, raw = call(port, "POST", "/embed", {"inputs": texts, "dimensions": 16, "normalize": False})
    np.testing.assert_allclose(raw, full[:, :16], atol=1e-6, rtol=0)  # cut, not renormalised
    status, _, body = call(port, "POST", "/v1/embeddings", {"input": texts, "dimensions": 32})
    assert status == 200 and len(body["data"][0]["embedding"]) == 32
    for dims, words in ((12, "trained for 32, 16, 8"), (64, "trained for 32, 16, 8"), ("16", "whole number")):
        status, _, body = call(port, "POST", "/embed", {"inputs": texts, "dimensions": dims})
        assert status == 422 and words in body["error"], body
    # /info lists the dimensions the folder records (32 included: it listed [16, 8], the full size left out)
    recorded = json.loads((made["tiny"] / "config_sentence_transformers.json").read_text())["matryoshka_dims"]
    assert call(port, "GET", "/info")[2]["matryoshka_dimensions"] == recorded == [32, 16, 8]


def test_info_lists_every_dimension_a_request_may_ask_for(made, tmp_path):
    """/info's matryoshka_dimensions are what `dimensions` takes: the full size (always) and the smaller ones the
    layout records, also where the layout leaves the full size out; none without Matryoshka dimensions."""
    import shutil

    from bertkit.serve.runner import load_runner
    from bertkit.serve.settings import ServeConfig

    for recorded, listed in (([16, 8], [32, 16, 8]), (None, [])):
        folder = shutil.copytree(made["tiny"], tmp_path / f"m{len(listed)}")
        write_layout(folder, pooling="mean", normalize=True, max_seq_length=48, hidden_size=32, dimensions=recorded)
        runner = load_runner(ServeConfig(model=str(folder), workers=1, threads=1, dtype="float32").validate())
        assert runner.info()["matryoshka_dimensions"] == listed
        assert all(runner.check_dimensions(d) in (None, d) for d in listed)  # each one taken


@pytest.mark.parametrize("flags, words", [
    ({"rerank": "runs/cross"}, "--rerank re-scores /search answers: give --index INDEX too"),
    ({"index": "ix", "rerank_top": 0}, "--rerank-top must be at least 1"),
    ({"index": "ix", "embedding": {"layers": "sum_last_four"}}, "leave out --layers sum_last_four"),
])
def test_search_settings_are_checked_before_anything_loads(flags, words):
    from bertkit.errors import BertkitError
    from bertkit.embeddings.settings import EmbedOptions
    from bertkit.serve.settings import ServeConfig

    if "embedding" in flags:
        flags = {**flags, "embedding": EmbedOptions(**flags["embedding"])}
    with pytest.raises(BertkitError, match=words):
        ServeConfig(**flags).validate()
