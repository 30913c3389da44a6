"""`bertkit serve` end to end: the real server as a subprocess on 127.0.0.1, spoken to over HTTP.

Servers start once per module, all at the same time (a start is mostly
importing torch), on `--port 0`; each prints the port it got. The encoder is a
tiny random BERT of odd shape (5 layers, hidden 32, 4 heads, intermediate 37)
with the real uncased vocabulary, so a wrong layer or a swapped dimension shows;
the fine-tuned models are untrained heads on the handmade-vocabulary tiny model
of test_finetune, with bertkit_task.json written as `bertkit finetune` writes it.
The reference for every answer is the library itself run in this process:
`bertkit.embed` and `bertkit.predict` on the same directory and texts. The
OpenAI round trip uses the default model and the official `openai` client.
"""

import base64
import contextlib
import gzip
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.serve.batching import plan_batches, spread

ROOT = Path(__file__).resolve().parent.parent
KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXTS = ["The cat sat on the mat.", "Hello!", "a much longer sentence about the weather, which was not nice "
         "at all on that day in Paris", "bye", "Quiet."]


# --- the server as a subprocess ------------------------------------------------------


class Server:
    """`bertkit serve ARGS --port 0` in a subprocess; `.port` waits until it answers /health."""

    def __init__(self, *args):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, "-m", "bertkit.cli", "serve", *map(str, args), "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self._port = None
        self.lines = []
        self.signalled = False

    @property
    def port(self) -> int:
        if self._port is None:
            deadline = time.monotonic() + 90
            while self._port is None:
                line = self.proc.stdout.readline()
                if not line:
                    raise AssertionError(f"the server exited ({self.proc.wait()}): {''.join(self.lines)}")
                self.lines.append(line)
                found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
                self._port = int(found.group(1)) if found else None
                assert time.monotonic() < deadline, "the server did not start in 90 s"
            threading.Thread(target=self._drain_output, daemon=True).start()
            while True:
                try:
                    if call(self._port, "GET", "/health")[0] == 200:
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "the server did not answer /health in 90 s"
                time.sleep(0.05)
        return self._port

    def _drain_output(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def terminate(self) -> None:
        """SIGTERM, once: a second one during the drain would be a user insisting (and kill it). Sent once the
        server is up (a run of a few tests ends before some of its servers have started; one still importing
        torch dies of the signal, -15, as any program does, where a started one answers its requests, exits 0)."""
        if self.proc.poll() is None and not self.signalled:
            with contextlib.suppress(AssertionError):  # one that never starts is signalled all the same
                self.port  # noqa: B018 (waits for the start)
            self.proc.send_signal(signal.SIGTERM)
            self.signalled = True

    def stop(self, timeout=30) -> int:
        self.terminate()
        return self.proc.wait(timeout)


def call(port, method, path, body=None, headers=None, timeout=60):
    """(status, headers, JSON or text) of one request on a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        raw = response.read().decode()
        kind = response.getheader("Content-Type", "")
        return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(raw) if "json" in kind else raw
    finally:
        conn.close()


def metric(port, name) -> float:
    text = call(port, "GET", "/metrics", headers=AUTH)[2]
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


# --- models -----------------------------------------------------------------------------


def encoder_dir(path):
    from bertkit.model.config import BertConfig
    from bertkit.model.modeling import BertModel
    from bertkit.text.tokenizer import Tokenizer

    config = BertConfig(hidden_size=32, num_hidden_layers=5, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64)
    BertModel(config, generator=torch.Generator().manual_seed(0)).save_pretrained(path, tokenizer=Tokenizer.from_pretrained())
    return path


def task_dir(path, tiny, head: str, info: dict, labels=None, problem_type=None):
    """An untrained task head on the tiny model, saved the way `bertkit finetune` saves its output."""
    import bertkit
    from bertkit.text.tokenizer import Tokenizer

    overrides = {"id2label": dict(enumerate(labels))} if labels else {}
    overrides.update({"problem_type": problem_type} if problem_type else {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fresh head's weights are missing from the encoder: on purpose
        model = getattr(bertkit, head).from_pretrained(tiny, strict=False, generator=torch.Generator().manual_seed(1),
                                                       **overrides)
    model.save_pretrained(path, tokenizer=Tokenizer.from_pretrained(tiny))
    (path / "bertkit_task.json").write_text(json.dumps(info))
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    from test_finetune import tiny_model_dir

    root = tmp_path_factory.mktemp("serve")
    tiny = tiny_model_dir(root / "tiny")
    return {
        "encoder": encoder_dir(root / "encoder"),
        "pair": task_dir(root / "pair", tiny, "BertForSequenceClassification",
                         {"task": "pair", "max_length": 32, "stride": 8, "text_column": "sentence1",
                          "text_pair_column": "sentence2"}, ["no", "yes"]),
        "ner": task_dir(root / "ner", tiny, "BertForTokenClassification",
                        {"task": "ner", "max_length": 16, "stride": 4, "tag_scheme": "iob2"},
                        ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]),
        # one output, the score as it is: /rerank's raw_scores
        "regression": task_dir(root / "regression", tiny, "BertForSequenceClassification",
                               {"task": "regression", "max_length": 32, "text_column": "sentence1",
                                "text_pair_column": "sentence2"}, ["score"]),
        "qa": task_dir(root / "qa", tiny, "BertForQuestionAnswering",
                       {"task": "qa", "max_length": 24, "doc_stride": 8, "max_query_length": 8,
                        "max_answer_length": 6}),
    }


@pytest.fixture(scope="module")
def servers(dirs):
    """Every long-lived server of this module, started together; stopped (and checked) at the end."""
    started = {
        # --layers/--pooling are start-up choices; the input limit is small so 413 is cheap to reach
        # --dtype float32: their answers are compared with the library's float32 ones to 1e-6
        "main": Server(dirs["encoder"], "--api-key", KEY, "--layers", "sum_last_four", "--max-input-length", 24,
                       "--max-body-bytes", 65536, "--threads", 1, "--dtype", "float32"),
        # a long batching window and a short queue: requests wait together, and a third one is refused
        # test_sigterm_... (the last test) stops it
        "window": Server(dirs["encoder"], "--layers", "sum_last_four", "--max-wait-ms", 1500, "--max-queue", 6,
                         "--threads", 1, "--dtype", "float32"),
        "pair": Server(dirs["pair"], "--threads", 1, "--dtype", "float32"),
        "ner": Server(dirs["ner"], "--threads", 1, "--dtype", "float32"),
        "regression": Server(dirs["regression"], "--threads", 1, "--dtype", "float32"),
        "qa": Server(dirs["qa"], "--threads", 1, "--dtype", "float32"),
        # the default model with the default precision (auto: bf16 where this CPU has it natively)
        "default": Server("--api-key", KEY, "--threads", 1),
        "int8": Server(dirs["encoder"], "--int8", "--threads", 1),
    }
    yield started
    for server in started.values():
        server.terminate()
    for name, server in started.items():
        assert server.stop() == 0, f"{name} server: {''.join(server.lines)}"


def post(port, path, body, headers=AUTH):
    return call(port, "POST", path, body, headers)


# --- embeddings --------------------------------------------------------------------------


def test_embed_equals_bertkit_embed(servers, dirs):
    import bertkit

    port = servers["main"].port
    status, _, vectors = post(port, "/embed", {"inputs": TEXTS, "normalize": False})
    assert status == 200
    expected = bertkit.embed(TEXTS, str(dirs["encoder"]), layers="sum_last_four")
    np.testing.assert_allclose(np.array(vectors, dtype=np.float32), expected, atol=1e-6, rtol=0)
    status, _, unit = post(port, "/embed", {"inputs": TEXTS[0]})  # normalize defaults to true, as in TEI
    assert status == 200 and len(unit) == 1
    np.testing.assert_allclose(unit[0], expected[0] / np.linalg.norm(expected[0]), atol=1e-6, rtol=0)


def test_int8_server_equals_bertkit_embed_int8(servers, dirs):
    # one text per request, so each is its own batch: int8 quantizes activations per batch
    import bertkit

    port = servers["int8"].port
    assert call(port, "GET", "/info")[2]["int8"] is True
    for text in TEXTS[:3]:
        status, _, vectors = post(port, "/embed", {"inputs": text, "normalize": False}, headers={})
        assert status == 200
        expected = bertkit.embed([text], str(dirs["encoder"]), int8=True)
        np.testing.assert_allclose(np.array(vectors, dtype=np.float32), expected, atol=1e-5, rtol=0)
        fp32 = bertkit.embed([text], str(dirs["encoder"]))[0]
        cos = float(np.dot(vectors[0], fp32) / np.linalg.norm(vectors[0]) / np.linalg.norm(fp32))
        assert cos > 0.9 and not np.allclose(vectors[0], fp32, atol=1e-6)  # int8 really ran, close to float32


def test_truncate_cuts_at_the_input_limit(servers, dirs):
    import bertkit

    long_text = " ".join(["weather"] * 40)
    expected = bertkit.embed([long_text], str(dirs["encoder"]), layers="sum_last_four", truncate=True, max_length=24)
    for flags in ({"truncate": True}, {}):  # truncating is the default, as in TEI
        status, _, vectors = post(servers["main"].port, "/embed", {"inputs": [long_text], "normalize": False, **flags})
        assert status == 200
        np.testing.assert_allclose(vectors, expected, atol=1e-6, rtol=0)
    # a 50 KB text (under the body limit) is tokenized only as far as the cut needs (Tokenizer.head): as a text of
    # 30 words, short enough to be read whole, and refused without truncation by its first pieces
    huge = " ".join(["weather"] * 7000)
    short = bertkit.embed([" ".join(["weather"] * 30)], str(dirs["encoder"]), layers="sum_last_four",
                          truncate=True, max_length=24)
    status, _, vectors = post(servers["main"].port, "/embed", {"inputs": [huge], "normalize": False})
    assert status == 200
    np.testing.assert_allclose(vectors, short, atol=1e-6, rtol=0)
    status, _, answer = post(servers["main"].port, "/embed", {"inputs": [huge], "truncate": False})
    assert status == 413 and "has more than" in answer["error"] and "over the limit of 24" in answer["error"], answer


def test_each_answer_counts_the_inputs_the_model_read_cut(servers, dirs, transformers_mod):
    """A text past the input limit was cut with no word in the answer (/embed, /v1/embeddings, /predict,
    /rerank): each answer of a route that cuts now says how many of its inputs the model read cut, in the
    X-Truncated-Inputs header (0: none; /v1/embeddings' usage too), and /metrics counts them. Reference: each
    input's length by transformers' tokenizer, uncut, against the limit (the main server's --max-input-length
    24; the pair model's max_length 32; a QA question's pieces against max_query_length 8); the NER and QA models
    read a long sentence or context whole, in windows: not cut."""
    fast = transformers_mod.BertTokenizerFast.from_pretrained(str(dirs["encoder"]))
    texts = [*TEXTS, " ".join(["weather"] * 30), "the cat " * 100]
    over = sum(len(fast(t)["input_ids"]) > 24 for t in texts)
    assert 0 < over < len(texts)
    port, counted = servers["main"].port, 'bertkit_serve_truncated_inputs_total{endpoint="/embed"}'
    before = metric(port, counted)
    status, headers, _ = post(port, "/embed", {"inputs": texts})
    assert status == 200 and headers["x-truncated-inputs"] == str(over)
    assert metric(port, counted) == before + over
    status, headers, body = post(port, "/v1/embeddings", {"input": texts})
    assert status == 200 and headers["x-truncated-inputs"] == str(over) == str(body["usage"]["truncated_inputs"])
    assert post(port, "/embed", {"inputs": TEXTS[:2]})[1]["x-truncated-inputs"] == "0"

    pair = transformers_mod.BertTokenizerFast.from_pretrained(str(dirs["pair"]))
    first, second = ["the movie was good .", "it was bad", "mary went"], ["it was fine .", "day " * 40, "paris " * 9]
    over = sum(len(pair(a, b)["input_ids"]) > 32 for a, b in zip(first, second))
    assert 0 < over < len(first)
    status, headers, _ = post(servers["pair"].port, "/predict", {"inputs": first, "pairs": second}, {})
    assert status == 200 and headers["x-truncated-inputs"] == str(over)
    over = sum(len(pair(first[0], t)["input_ids"]) > 32 for t in second)
    status, headers, _ = post(servers["pair"].port, "/rerank", {"query": first[0], "texts": second}, {})
    assert status == 200 and headers["x-truncated-inputs"] == str(over)
    status, headers, _ = post(servers["ner"].port, "/predict", {"inputs": ["john went to paris " * 10]}, {})
    assert status == 200 and headers["x-truncated-inputs"] == "0"  # longer than 16: read in windows
    questions = ["who ?", "who went to paris and then to rome in the day ?"]  # cut past max_query_length 8
    over = sum(len(pair(q, add_special_tokens=False)["input_ids"]) > 8 for q in questions)
    assert over == 1
    status, headers, _ = post(servers["qa"].port, "/predict", {"inputs": questions, "pairs": ["paris " * 40] * 2}, {})
    assert status == 200 and headers["x-truncated-inputs"] == str(over)  # the long contexts: whole, in windows


def test_a_text_gets_the_same_vector_alone_and_in_a_crowded_batch(servers):
    alone = {}
    for text in TEXTS:  # one text per request on the main server (same model and layers, no batch window)
        status, _, vectors = post(servers["main"].port, "/embed", {"inputs": [text]})
        assert status == 200
        alone[text] = vectors[0]
    # two requests land in one 1.5 s batch window: their rows are sorted by length and packed together
    port = servers["window"].port
    crowd = [" ".join(["word"] * n) + " end" for n in range(1, 50, 3)]
    results = {}
    threads = [threading.Thread(target=lambda k, body: results.__setitem__(k, post(port, "/embed", body, {})),
                                args=(k, {"inputs": crowd[k::2] + TEXTS})) for k in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for k in range(2):
        status, _, vectors = results[k]
        assert status == 200
        for text, vector in zip(TEXTS, vectors[-len(TEXTS):]):
            np.testing.assert_allclose(vector, alone[text], atol=1e-6, rtol=0)


def close_to(got, expected, native_bf16: bool) -> None:
    """The default server's answers: float32's to 1e-6, or within cosine 0.999 of them in bf16."""
    if native_bf16:
        got = np.asarray(got, dtype=np.float32)
        assert (got * expected).sum(-1).min() > 0.999 and not np.allclose(got, expected, atol=1e-6)
    else:
        np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)


def test_openai_client_round_trip_on_the_default_model(servers):
    import bertkit
    from bertkit.runtime.devices import cpu_features

    openai = pytest.importorskip("openai")
    port = servers["default"].port
    native = cpu_features().native_bf16
    info = call(port, "GET", "/info", headers=AUTH)[2]
    assert info["precision"] == ("bfloat16" if native else "float32")  # --dtype auto, the default
    assert f'precision="{info["precision"]}"' in call(port, "GET", "/metrics", headers=AUTH)[2]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY)
    response = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS)  # base64 on the wire
    got = np.array([d.embedding for d in response.data], dtype=np.float32)
    expected = bertkit.embed(TEXTS, normalize=True)
    close_to(got, expected, native)
    assert [d.index for d in response.data] == list(range(len(TEXTS)))
    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained()
    n_tokens = sum(len(tok.encode(t).input_ids) for t in TEXTS)
    assert response.usage.prompt_tokens == response.usage.total_tokens == n_tokens
    floats = client.embeddings.create(model="all-MiniLM-L6-v2", input="Hello!", encoding_format="float")
    close_to([floats.data[0].embedding], expected[1:2], native)
    # the model's sentence-transformers layout says 256 tokens: a longer text is embedded as its first 256
    long_text = " ".join(TEXTS * 40)
    cut = client.embeddings.create(model="all-MiniLM-L6-v2", input=long_text, encoding_format="float")
    close_to([cut.data[0].embedding], bertkit.embed([long_text]), native)
    assert cut.usage.prompt_tokens == 256 and info["max_input_length"] == 256
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=client.base_url, api_key="wrong").embeddings.create(model="m", input="x")


def test_openai_shape_and_base64(servers, dirs):
    import bertkit

    port = servers["main"].port
    status, _, body = post(port, "/v1/embeddings", {"input": TEXTS[:2], "model": "tiny", "encoding_format": "base64"})
    assert status == 200 and body["object"] == "list" and body["model"] == "encoder"
    got = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in body["data"]])
    expected = bertkit.embed(TEXTS[:2], str(dirs["encoder"]), layers="sum_last_four", normalize=True)
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
    status, _, body = post(port, "/v1/embeddings", {"input": "", "model": "tiny"})
    assert status == 422 and "empty" in body["error"]["message"] and body["error"]["code"] == 422


def test_dimensions_need_matryoshka_dimensions_in_the_model(servers):
    port = servers["main"].port
    for path, field in (("/v1/embeddings", "input"), ("/embed", "inputs")):
        status, _, body = post(port, path, {field: "x", "dimensions": 16})
        message = body["error"]["message"] if path.startswith("/v1") else body["error"]
        assert status == 422 and "gives 32 and records no Matryoshka dimensions" in message, body
        assert post(port, path, {field: "x", "dimensions": 32})[0] == 200  # the full size is always fine
    status, _, body = post(port, "/search", {"query": "x"})  # no --index: no /search
    assert status == 400 and "--index INDEX" in body["error"]


# --- tokens ----------------------------------------------------------------------------------


@pytest.mark.parametrize("server", ["main", "pair"])
def test_tokenize_answers_as_tei_from_the_models_tokenizer(servers, dirs, server):
    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(dirs["encoder" if server == "main" else "pair"])
    texts = ["Naïve café-goers, unaffable!", "The cat sat."]
    for special in (True, False):
        status, _, answer = post(servers[server].port, "/tokenize", {"inputs": texts, "add_special_tokens": special})
        assert status == 200 and len(answer) == 2
        for text, tokens in zip(texts, answer):
            enc = tok.encode(text, truncation=False, add_special_tokens=special)
            assert [t["id"] for t in tokens] == enc.input_ids
            assert [t["special"] for t in tokens] == [bool(m) for m in enc.special_tokens_mask]
            for t, token in zip(tokens, enc.tokens):
                if t["special"]:
                    assert t["text"] == token and t["start"] is None and t["stop"] is None
                else:  # TEI's offsets: UTF-8 bytes of the input
                    assert text.encode()[t["start"] : t["stop"]].decode() == t["text"]
    status, _, answer = post(servers[server].port, "/tokenize", {"inputs": "naïve x"})
    if server == "main":  # the real uncased vocabulary, checked by hand: "ï" takes two bytes
        assert answer == [[{"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None},
                           {"id": tok.vocab["naive"], "text": "naïve", "special": False, "start": 0, "stop": 6},
                           {"id": tok.vocab["x"], "text": "x", "special": False, "start": 7, "stop": 8},
                           {"id": 102, "text": "[SEP]", "special": True, "start": None, "stop": None}]]
    status, _, body = post(servers[server].port, "/tokenize", {"inputs": "x", "add_special_tokens": 1})
    assert status == 422 and "`add_special_tokens` must be true or false" in body["error"]


# --- predictions and reranking -----------------------------------------------------------------


def test_predict_pairs_equals_bertkit_predict(servers, dirs):
    import bertkit

    first, second = ["the movie was good .", "it was bad"], ["the food was great .", "this day was fine ."]
    status, _, preds = post(servers["pair"].port, "/predict", {"inputs": first, "pairs": second}, {})
    assert status == 200
    expected = bertkit.predict(dirs["pair"], first, second)
    assert [p["label"] for p in preds] == [p["label"] for p in expected]
    for got, want in zip(preds, expected):
        assert got["probabilities"] == pytest.approx(want["probabilities"], abs=1e-6)
    status, _, body = post(servers["pair"].port, "/predict", {"inputs": first}, {})
    assert status == 422 and "pairs" in body["error"]


def test_rerank_sorts_by_the_pair_score(servers, dirs):
    import bertkit

    query, texts = "the movie was good .", ["the food was great .", "it was bad", "paris in the day", "mary went"]
    status, _, ranked = post(servers["pair"].port, "/rerank", {"query": query, "texts": texts, "return_text": True}, {})
    assert status == 200
    yes = [p["probabilities"]["yes"] for p in bertkit.predict(dirs["pair"], [query] * len(texts), texts)]
    assert [r["index"] for r in ranked] == sorted(range(len(texts)), key=lambda i: -yes[i])
    for r in ranked:
        assert r["score"] == pytest.approx(yes[r["index"]], abs=1e-6) and r["text"] == texts[r["index"]]
    status, _, body = post(servers["main"].port, "/rerank", {"query": "a", "texts": ["b"]})
    assert status == 400 and "fine-tuned" in body["error"]


def test_ner_entities_carry_character_offsets(servers, dirs):
    import bertkit
    from bertkit.metrics.tasks import get_entities

    texts = ["john  visited paris and london in the day", "mary went to berlin . the city was new and old"]
    status, _, preds = post(servers["ner"].port, "/predict", {"inputs": texts}, {})
    assert status == 200
    expected = bertkit.predict(dirs["ner"], texts)
    n_entities = 0
    for text, got, want in zip(texts, preds, expected):
        assert got["tags"] == want["tags"] and got["words"] == want["words"]
        spans = [m.span() for m in re.finditer(r"\S+", text)]
        assert [(e["type"], e["words"][0], e["words"][1] - 1) for e in got["entities"]] == get_entities(want["tags"])
        for e in got["entities"]:
            assert (e["start"], e["end"]) == (spans[e["words"][0]][0], spans[e["words"][1] - 1][1])
            assert e["text"] == text[e["start"]:e["end"]]
            n_entities += 1
    assert n_entities > 0  # the untrained head tags something: the offsets were really checked


def test_qa_answers_long_contexts_with_offsets(servers, dirs):
    import bertkit

    questions = ["who went to paris ?", "where did mary go ?"]
    contexts = ["john went to paris . " * 8, "mary went to berlin and then to london in the day ."]
    status, _, preds = post(servers["qa"].port, "/predict", {"inputs": questions, "pairs": contexts}, {})
    assert status == 200
    expected = bertkit.predict(dirs["qa"], questions, contexts)
    for got, want, context in zip(preds, expected, contexts):
        assert (got["answer"], got["start"], got["end"]) == (want["answer"], want["start"], want["end"])
        assert got["score"] == pytest.approx(want["score"], abs=1e-5)
        assert got["answer"] == context[got["start"]:got["end"]]
    status, _, body = post(servers["qa"].port, "/predict", {"inputs": questions}, {})
    assert status == 422 and "context" in body["error"]


def test_predict_and_rerank_refuse_a_text_without_tokens(servers, dirs):
    """A text of characters BERT drops has no word piece: the model would answer for an empty text, so it is
    refused naming the field, as the embeddings routes refuse it (it was a 200 with a prediction)."""
    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(dirs["pair"])
    assert tok.encode("\x00\x01", add_special_tokens=False).input_ids == []  # the premise, independently
    port = servers["pair"].port
    for path, body, words in [
        ("/predict", {"inputs": ["fine", "\x00\x01"], "pairs": ["a", "b"]}, "`inputs[1]` yields no tokens"),
        ("/predict", {"inputs": ["fine"], "pairs": ["\x00\x01"]}, "`pairs[0]` yields no tokens"),
        ("/rerank", {"query": "\x00\x01", "texts": ["a"]}, "`query` yields no tokens"),
        ("/rerank", {"query": "fine", "texts": ["a", "b", "\x00\x01"]}, "`texts[2]` yields no tokens"),
        ("/rerank", {"texts": ["a"]}, "`query` is required"),
    ]:
        status, _, answer = post(port, path, body, {})
        assert status == 422 and words in answer["error"], (body, answer)
    status, _, answer = post(servers["qa"].port, "/predict", {"inputs": ["who ?"], "pairs": ["\x00\x01"]}, {})
    assert status == 422 and "`pairs[0]` yields no tokens" in answer["error"], answer
    assert post(port, "/rerank", {"query": "fine", "texts": ["a", "b"]}, {})[0] == 200  # still serving


# --- the fields each route takes ---------------------------------------------------------------


@pytest.mark.parametrize("server, path, body, words", [
    # fields no route of ours takes: refused, naming them (they were ignored, answering another question)
    ("main", "/embed", {"inputs": "x", "bogus": 1}, 'unknown field "bogus": this route takes inputs, normalize'),
    ("main", "/tokenize", {"inputs": "x", "truncate": True}, 'unknown field "truncate"'),
    ("pair", "/predict", {"inputs": "a", "pairs": "b", "top_k": 1}, 'unknown field "top_k"'),
    ("pair", "/rerank", {"query": "a", "texts": ["b", "c"], "top_n": 1}, 'unknown field "top_n"'),
    ("pair", "/rerank", {"query": "a", "documents": ["b"], "texts": ["b"]}, 'unknown field "documents"'),
    # TEI's options that ask for something this server does not do
    ("main", "/embed", {"inputs": "x", "truncation_direction": "Left"}, '`truncation_direction` "left" is not'),
    ("main", "/embed", {"inputs": "x", "truncation_direction": "up"}, 'must be "right" or "left", got "up"'),
    ("main", "/embed", {"inputs": "x", "prompt_name": "query"}, '`prompt_name` "query": this server applies no'),
    ("main", "/tokenize", {"inputs": "x", "prompt_name": "query"}, "`prompt_name`"),
    ("pair", "/rerank", {"query": "a", "texts": ["b"], "truncation_direction": "left"}, '"left" is not available'),
    ("pair", "/rerank", {"query": "a", "texts": ["b"], "raw_scores": True}, "`raw_scores`: true is not available"),
    ("pair", "/rerank", {"query": "a", "texts": ["b"], "raw_scores": "yes"}, "`raw_scores` must be true or false"),
    ("pair", "/predict", {"inputs": "a", "pairs": "b", "raw_scores": True}, "its scores are probabilities"),
    ("ner", "/predict", {"inputs": "john went", "raw_scores": True}, "`raw_scores`: true is not available"),
    ("pair", "/predict", {"inputs": "a", "pairs": "b", "truncate": "no"}, "`truncate` must be true or false"),
])
def test_every_route_refuses_a_field_it_does_not_take_or_a_value_it_does_not_do(servers, server, path, body, words):
    status, _, answer = post(servers[server].port, path, body)
    assert status == 422 and words in answer["error"] and len(answer["error"]) < 500, answer


def test_openai_fields_are_taken_and_others_refused_in_openais_shape(servers):
    port = servers["main"].port
    plain_answer = post(port, "/v1/embeddings", {"input": TEXTS})[2]
    status, _, answer = post(port, "/v1/embeddings", {"input": TEXTS, "model": "text-embedding-3-small",
                                                      "encoding_format": "float", "dimensions": 32, "user": "u-42"})
    assert status == 200 and answer["data"] == plain_answer["data"]
    for body, words in [({"input": "x", "temperature": 0}, 'unknown field "temperature"'),
                        ({"input": "x", "user": 7}, "`user` must be a string")]:
        status, _, answer = post(port, "/v1/embeddings", body)
        assert status == 422 and words in answer["error"]["message"], answer


def test_tei_fields_asking_for_what_the_server_does_are_taken(servers, dirs, transformers_mod):
    """TEI's clients send their options with each request: where the value asks for what the route does anyway,
    the answer is the one without them; `return_text` is honoured; `raw_scores: true` on a regression model,
    whose score is the head's output as it is, gives that score; so on a QA model, whose answer's score is its
    start and end logits summed (transformers' model over the same weights: the premise). The QA model refused
    it, 'its scores are probabilities', and docs/serving.md listed QA's scores among the probabilities."""
    main, pair, regression = (servers[k].port for k in ("main", "pair", "regression"))
    tei = {"truncate": True, "truncation_direction": "Right"}
    assert post(main, "/embed", {"inputs": TEXTS, **tei, "prompt_name": None, "normalize": True})[2] == \
        post(main, "/embed", {"inputs": TEXTS})[2]
    assert post(main, "/tokenize", {"inputs": TEXTS, "prompt_name": None})[2] == post(main, "/tokenize", {"inputs": TEXTS})[2]
    query, texts = "the movie was good .", ["the food was great .", "it was bad", "paris in the day"]
    for port in (pair, regression):
        plain_answer = post(port, "/rerank", {"query": query, "texts": texts})[2]
        status, _, answer = post(port, "/rerank", {"query": query, "texts": texts, "raw_scores": False,
                                                    "return_text": True, **tei})
        assert status == 200 and answer == [{**r, "text": texts[r["index"]]} for r in plain_answer]
        body = {"inputs": [query] * 3, "pairs": texts}
        assert post(port, "/predict", {**body, "raw_scores": False, **tei})[2] == post(port, "/predict", body)[2]
    plain_answer = post(regression, "/rerank", {"query": query, "texts": texts})[2]
    assert post(regression, "/rerank", {"query": query, "texts": texts, "raw_scores": True})[2] == plain_answer
    question, context = "where did mary go ?", "mary went to paris in the day ."
    status, _, answer = post(servers["qa"].port, "/predict", {"inputs": question, "pairs": context, "raw_scores": True})
    assert status == 200 and answer == post(servers["qa"].port, "/predict", {"inputs": question, "pairs": context})[2]
    model = transformers_mod.BertForQuestionAnswering.from_pretrained(dirs["qa"]).eval()
    enc = transformers_mod.BertTokenizerFast.from_pretrained(dirs["qa"])(question, context, return_offsets_mapping=True,
                                                                        return_tensors="pt")
    pieces = [(i, a, b) for i, ((a, b), s) in enumerate(zip(enc.pop("offset_mapping")[0].tolist(), enc.sequence_ids(0)))
              if s == 1]
    with torch.no_grad():
        out = model(**enc)
    first = next(i for i, a, _ in pieces if a == answer[0]["start"])
    last = next(i for i, _, b in pieces if b == answer[0]["end"])
    assert answer[0]["score"] == pytest.approx(float(out.start_logits[0, first] + out.end_logits[0, last]), abs=1e-4)


def test_truncate_false_refuses_a_pair_the_model_would_cut(servers, dirs):
    """TEI's `truncate: false` on /predict and /rerank: an input longer than the model's max_length (32) is
    refused with 413 naming it and its tokens (counted by the model's tokenizer, uncut), not cut silently."""
    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(dirs["pair"])
    port = servers["pair"].port
    query = "the movie was good ."

    def tokens(k):  # of the query with a second text of k words, uncut
        return len(tok.encode(query, " ".join(["day"] * k), truncation=False).input_ids)

    k = next(k for k in range(1, 40) if tokens(k) == 32)
    fits, over = " ".join(["day"] * k), " ".join(["day"] * (k + 1))
    assert tokens(k + 1) == 33
    assert post(port, "/rerank", {"query": query, "texts": [fits], "truncate": False})[0] == 200
    status, _, answer = post(port, "/rerank", {"query": query, "texts": [fits, over], "truncate": False})
    assert status == 413 and "`query` with `texts[1]` holds 33 tokens, over this model's max_length of 32" \
        in answer["error"], answer
    status, _, answer = post(port, "/predict", {"inputs": [query], "pairs": [over * 40], "truncate": False})
    assert status == 413 and "`inputs[0]` with `pairs[0]` holds more than 32 tokens" in answer["error"], answer
    assert post(port, "/rerank", {"query": query, "texts": [fits, over]})[0] == 200  # cut, by default


# --- info, health, metrics --------------------------------------------------------------------


def test_info_and_metrics(servers):
    port = servers["main"].port
    status, _, info = call(port, "GET", "/info", headers=AUTH)
    assert status == 200
    assert (info["task"], info["dimensions"], info["max_input_length"], info["layers"]) == ("embed", 32, 24, [2, 3, 4, 5])
    assert info["batching"]["max_body_bytes"] == 65536 and info["auth"] is True
    post(port, "/embed", {"inputs": ["one", "two", "three"]})
    status, headers, text = call(port, "GET", "/metrics", headers=AUTH)
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert re.search(r'^bertkit_serve_requests_total\{endpoint="/embed",status="200"\} [1-9]', text, re.M)
    assert metric(port, "bertkit_serve_batch_size_count") >= 1
    assert metric(port, 'bertkit_serve_batch_size_bucket{le="+Inf"}') == metric(port, "bertkit_serve_batch_size_count")
    assert "bertkit_serve_request_duration_seconds_bucket" in text and "bertkit_serve_queue_depth 0" in text
    assert call(port, "GET", "/health")[2] == {"status": "ok"}  # no key needed


# --- bad input and faults ------------------------------------------------------------------------


@pytest.mark.parametrize("body, status, words", [
    (b'{"inputs": ["unclosed', 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (b'{"inputs": "x", "dimensions": ' + b"9" * 5000 + b"}", 400, "a number of 5000 digits: no field takes one"),
    ([1, 2], 422, "JSON object"),
    ({"inputs": 5}, 422, "string or a list"),
    ({"inputs": ["ok", 7]}, 422, "`inputs[1]` must be a string"),
    ({"inputs": []}, 422, "empty list"),
    ({"inputs": ["fine", "   "]}, 422, "`inputs[1]` is empty"),
    ({"inputs": ""}, 422, "empty"),
    ({"text": "wrong field"}, 422, "`inputs` is required"),
    ({"inputs": "x", "normalize": "yes"}, 422, "`normalize` must be true or false"),
    ({"inputs": ["x", " ".join(["weather"] * 40)], "truncate": False}, 413, "limit of 24"),
    ({"inputs": [[101, 102]]}, 422, "token ids"),
    ({"inputs": "x", "dimensions": 16.5}, 422, "`dimensions` must be a whole number, got 16.5"),  # was "got a number"
])
def test_bad_requests_get_clear_errors(servers, body, status, words):
    got, _, answer = post(servers["main"].port, "/embed", body)
    assert got == status and words in answer["error"], answer


def test_openai_errors_name_the_limit(servers):
    status, _, body = post(servers["main"].port, "/v1/embeddings", {"input": " ".join(["weather"] * 40), "model": "m",
                                                                     "truncate": False})
    assert status == 413 and "limit of 24" in body["error"]["message"]
    status, _, body = post(servers["main"].port, "/v1/embeddings", {"input": "x", "encoding_format": "int8"})
    assert status == 422 and "encoding_format" in body["error"]["message"]
    for wrong in ([], {}, 0, False, ""):  # not a format: refused, not taken for "float"
        status, _, body = post(servers["main"].port, "/v1/embeddings", {"input": "x", "encoding_format": wrong})
        assert status == 422 and "`encoding_format` must be" in body["error"]["message"], (wrong, body)
    assert post(servers["main"].port, "/v1/embeddings", {"input": "x", "encoding_format": None})[0] == 200  # default


def test_a_compressed_body_is_refused_naming_its_content_encoding(servers):
    """A body sent gzip-compressed (Content-Encoding: gzip, as some HTTP clients send it) is 415 naming the
    encoding (RFC 9110 15.5.16), not 400 "not valid JSON: 'utf-8' codec can't decode byte 0x8b": the server
    reads bodies as they are. Sent uncompressed, the same request is answered."""
    body = json.dumps({"inputs": "Hello!"}).encode()
    status, _, answer = post(servers["main"].port, "/embed", gzip.compress(body), {**AUTH, "Content-Encoding": "gzip"})
    assert status == 415 and "Content-Encoding gzip" in answer["error"], answer
    assert answer["error_type"] == "unsupported_media_type"  # a kind of its own, not the catch-all "error"
    status, _, answer = post(servers["main"].port, "/v1/embeddings", gzip.compress(b'{"input": "x"}'),
                             {**AUTH, "Content-Encoding": "gzip"})
    assert status == 415 and "Content-Encoding gzip" in answer["error"]["message"], answer
    assert answer["error"]["type"] == "unsupported_media_type"
    assert post(servers["main"].port, "/embed", body, {**AUTH, "Content-Encoding": "identity"})[0] == 200
    assert post(servers["main"].port, "/embed", body)[0] == 200


def test_wrong_or_missing_api_key_is_401(servers):
    port = servers["main"].port
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": KEY}):
        status, h, body = post(port, "/embed", {"inputs": "x"}, headers)
        assert status == 401 and "API key" in body["error"] and h["www-authenticate"] == "Bearer"


def test_body_over_the_limit_is_413(servers):
    port = servers["main"].port
    big = json.dumps({"inputs": ["word " * 20] * 1000})
    assert len(big) > 65536
    status, _, body = post(port, "/embed", big)
    assert status == 413 and "65536" in body["error"]
    # no Content-Length (chunked): the limit holds while the body streams in
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/embed", body=iter([big[i:i + 8192].encode() for i in range(0, len(big), 8192)]),
                 headers={**AUTH, "Content-Type": "application/json"}, encode_chunked=True)
    response = conn.getresponse()
    assert response.status == 413 and "65536" in json.loads(response.read())["error"]
    conn.close()
    assert post(port, "/embed", {"inputs": "still serving"})[0] == 200


def test_a_client_that_writes_its_whole_body_first_reads_the_413(servers):
    # urllib sends all 16 MB before reading: the server must read and drop what it refused
    # (a lingering close), or closing on unread bytes resets the connection and the answer is lost
    import urllib.error
    import urllib.request

    port = servers["main"].port
    for headers, status, words in ((AUTH, 413, "65536"), ({}, 401, "API key")):
        request = urllib.request.Request(f"http://127.0.0.1:{port}/embed", data=b"[" * (16 * 1024 * 1024),
                                         headers={**headers, "Content-Type": "application/json"}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == status and words in json.loads(refused.value.read())["error"]
    assert post(port, "/embed", {"inputs": "still serving"})[0] == 200


def test_queue_full_is_429_with_retry_after_never_a_hang(servers):
    port = servers["window"].port
    held = []
    threads = [threading.Thread(target=lambda: held.append(post(port, "/embed", {"inputs": "wait"}, {})))
               for _ in range(6)]
    [t.start() for t in threads]
    deadline = time.monotonic() + 10
    while metric(port, "bertkit_serve_queue_depth") < 6:  # the window holds them for 1.5 s
        assert time.monotonic() < deadline
        time.sleep(0.02)
    start = time.monotonic()
    status, headers, body = post(port, "/embed", {"inputs": "one too many"}, {})
    assert status == 429 and headers["retry-after"] == "1" and "--max-queue 6" in body["error"]
    assert time.monotonic() - start < 1.0  # refused at once, not after the window
    [t.join() for t in threads]
    assert [r[0] for r in held] == [200] * 6


def test_client_that_disconnects_mid_request_does_not_hurt_the_others(servers):
    port = servers["window"].port
    before = metric(port, "bertkit_serve_client_disconnects_total")
    other = []
    neighbour = threading.Thread(target=lambda: other.append(post(port, "/embed", {"inputs": ["neighbour"]}, {})))
    neighbour.start()
    sock = socket.create_connection(("127.0.0.1", port))
    body = json.dumps({"inputs": ["I will leave"]}).encode()
    sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    time.sleep(0.3)  # inside the 1.5 s batch window: both requests are waiting for the same batch
    sock.close()
    neighbour.join()
    assert other[0][0] == 200 and len(other[0][2]) == 1
    deadline = time.monotonic() + 10
    while metric(port, "bertkit_serve_client_disconnects_total") < before + 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    while metric(port, "bertkit_serve_queue_depth") > 0:  # the one that left is released, never answered
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert post(port, "/embed", {"inputs": "after"}, {})[0] == 200


def test_a_client_that_leaves_while_sending_its_body_is_counted_as_a_disconnect(servers):
    """bertkit_serve_client_disconnects_total counts "requests whose client left before the answer": one that
    leaves halfway through its body is one of them (it was logged, answered 499 in requests_total, and left out
    of the count), and the server logs it in one line."""
    port = servers["window"].port
    before = metric(port, "bertkit_serve_client_disconnects_total")
    body = json.dumps({"inputs": ["I will leave before my body is sent"]}).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body[:10]))
    time.sleep(0.3)
    sock.close()
    deadline = time.monotonic() + 10
    while metric(port, "bertkit_serve_client_disconnects_total") < before + 1:
        assert time.monotonic() < deadline, "the disconnect was not counted"
        time.sleep(0.05)
    lines = list(servers["window"].lines)
    assert any("the client closed the connection before its request body was read" in line for line in lines)


def test_missing_or_corrupt_model_fails_at_start_up_in_one_line(tmp_path, dirs):
    def start(model):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, "-m", "bertkit.cli", "serve", str(model), "--port", "0"],
                              capture_output=True, text=True, env=env, timeout=120)
        return done.returncode, done.stdout + done.stderr

    code, out = start(tmp_path / "nowhere")
    assert code == 2 and out.count("\n") == 1 and "does not exist" in out
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for f in dirs["encoder"].iterdir():
        (corrupt / f.name).write_bytes(f.read_bytes())
    (corrupt / "model.safetensors").write_bytes(b"\x00" * 100)
    code, out = start(corrupt)
    assert code == 2 and out.count("\n") == 1 and "model.safetensors" in out and "Traceback" not in out


def test_embedding_flags_beside_a_fine_tuned_model_are_refused_not_ignored(dirs):
    """--layers, --combine, --pooling, --normalize and --max-input-length shape the embeddings endpoints' vectors and
    inputs; a fine-tuned model's server answers /predict as `bertkit predict` reads its inputs, so `bertkit serve
    runs/sst2 --max-input-length 8` started and cut nothing at 8 (and /info said the model's own length), silently.
    Refused at start-up in one line naming the flags; an encoder still takes them."""
    from bertkit.embeddings.settings import EmbedOptions
    from bertkit.errors import BertkitError
    from bertkit.serve.runner import load_runner
    from bertkit.serve.settings import ServeConfig

    for given, flags in (({"max_input_length": 8}, "--max-input-length"),
                         ({"embedding": EmbedOptions(pooling="cls", normalize=False)}, "--pooling, --normalize"),
                         ({"embedding": EmbedOptions(layers="sum_all", combine="sum")}, "--layers, --combine")):
        settings = ServeConfig(model=str(dirs["pair"]), workers=1, threads=1, **given).validate()
        with pytest.raises(BertkitError, match=f"^{flags}.* fine-tuned .*leave"):
            load_runner(settings)
    encoder = ServeConfig(model=str(dirs["encoder"]), workers=1, threads=1, max_input_length=8,
                          embedding=EmbedOptions(pooling="cls")).validate()
    assert load_runner(encoder).info()["pooling"] == "cls"


def test_the_start_line_says_what_cuts_a_batch(servers):
    """An encoder's passes are cut by tokens and rows; a fine-tuned model's by inputs (`bertkit.predict`
    batches them by count), so its line names no token budget (it said "max 2048 tokens" all the same)."""
    def start_line(name):
        servers[name].port  # noqa: B018 (waits for the start)
        return next(line for line in servers[name].lines if line.startswith("bertkit serve:"))

    assert "max 2048 tokens / 64 rows per batch" in start_line("window")
    for name in ("pair", "ner", "qa"):
        line = start_line(name)
        assert "max 64 inputs per batch" in line and "tokens" not in line, line


def test_the_start_line_comes_once_the_port_takes_connections(dirs):
    """The start line says "on http://127.0.0.1:PORT": a client (a supervisor, a script) that connects as soon as it
    reads it is connected, and answered. The socket was bound but listened on only once uvicorn started, a few
    more lines of Python later: connections in between were refused (ECONNREFUSED)."""
    server = Server(dirs["encoder"], "--threads", 1, "--dtype", "float32")
    try:
        line = server.proc.stdout.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)", line).group(1))
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)  # at once: no retry
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200"), line
        sock.close()
    finally:
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0


def test_sigterm_as_soon_as_the_start_line_shows_stops_the_server(dirs):
    """A SIGTERM sent the moment the start line shows (a supervisor stopping what it just started) stops the
    server, exit 0. It came before uvicorn had installed its handler, into the one that was there to absorb
    uvicorn's re-raise, and was lost: the server went on serving."""
    server = Server(dirs["encoder"], "--threads", 1, "--dtype", "float32")
    try:
        assert "http://127.0.0.1:" in server.proc.stdout.readline()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def test_the_server_hands_its_speed_settings_to_the_model(dirs, monkeypatch):
    """The server's fast-path settings are one value passed down: rule 7's row buckets reach every
    dense layer it runs (no environment variable written for it), and BERTKIT_ONEDNN is read by
    the command line, which passes it on."""
    from bertkit.cli import main
    from bertkit.runtime.fast import FastLinear
    from bertkit.serve import server
    from bertkit.serve.runner import load_runner
    from bertkit.serve.settings import ServeConfig

    settings = ServeConfig(model=str(dirs["pair"]), threads=1, dtype="float32").validate()
    speed = server.speed()
    runner = load_runner(settings, speed)
    layers = [m for m in runner.loaded.model.modules() if isinstance(m, FastLinear)]
    assert speed.row_buckets and runner.speed is speed and layers and all(m.speed is speed for m in layers)
    assert not load_runner(settings).speed.row_buckets  # the library's default: this CPU's rules alone
    assert "BERTKIT_ROW_BUCKETS" not in os.environ
    assert server.speed(onednn=False).matmul_kernel == "MKL"
    seen = []
    monkeypatch.setattr(server, "serve", lambda settings, onednn=None: seen.append(onednn))
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        monkeypatch.delenv(name, raising=False)  # the command sets them (cli.serve.bound_kernel_caches): undone after
    for value, expected in (("0", False), ("1", True), ("", None)):
        monkeypatch.setenv("BERTKIT_ONEDNN", value)
        main(["serve", str(dirs["pair"])])
        assert seen[-1] is expected


# --- packing, by hand ---------------------------------------------------------------------------


def test_plan_batches_by_hand():
    # lengths sorted: 3 (i=1), 4 (i=3), 5 (i=0), 9 (i=2); budget 12 tokens: [3,4] costs 2x4=8, +5 -> 3x5=15 > 12
    assert plan_batches([5, 3, 9, 4], max_tokens=12, max_rows=8) == [[1, 3], [0], [2]]
    assert plan_batches([2, 2, 2, 2, 2], max_tokens=100, max_rows=2) == [[0, 1], [2, 3], [4]]
    assert plan_batches([50], max_tokens=10, max_rows=4) == [[0]]  # too long alone: still answered
    assert plan_batches([], max_tokens=10, max_rows=4) == []


def test_plan_batches_cuts_where_the_lengths_jump():
    # ten texts of 3 tokens and two of 50: cut only at the budget, one pass of 12 x 50 = 600 padded tokens;
    # two passes cost 2 x 32 (overhead) + 10 x 3 + 2 x 50 = 194
    assert plan_batches([3] * 10 + [50] * 2, max_tokens=1000, max_rows=64) == [list(range(10)), [10, 11]]
    # even lengths: one pass (a cut would cost an overhead and save no padding)
    assert plan_batches([7, 8, 8, 7], max_tokens=1000, max_rows=64) == [[0, 3, 1, 2]]
    # a pass costs rows x longest: [4, 4, 5] x 5 = 15 padded tokens and 1 pass beats [4, 4] + [5] (8 + 5 + 32)
    assert plan_batches([5, 4, 4], max_tokens=100, max_rows=8, overhead=32) == [[1, 2, 0]]
    assert plan_batches([5, 4, 4], max_tokens=100, max_rows=8, overhead=0) == [[1, 2], [0]]


def test_plan_batches_pads_little_and_respects_the_budgets():
    import random

    rng = random.Random(0)
    lengths = [rng.randint(5, 55) for _ in range(300)]
    batches = plan_batches(lengths, max_tokens=2048, max_rows=64)
    assert sorted(i for b in batches for i in b) == list(range(300))  # every row exactly once
    assert all(len(b) <= 64 and len(b) * max(lengths[i] for i in b) <= 2048 for b in batches)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    assert padded < 1.06 * sum(lengths)  # cut only at the budget, the same rows carry 15% padding


def test_spread_halves_the_largest_passes_for_idle_workers():
    assert spread([[0, 1, 2, 3, 4]], 2) == [[0, 1, 2], [3, 4]]
    assert spread([[0], [1, 2, 3, 4]], 3) == [[0], [1, 2], [3, 4]]
    assert spread([[0], [1]], 4) == [[0], [1]]  # single rows cannot be split
    assert spread([[0, 1], [2, 3]], 1) == [[0, 1], [2, 3]]  # enough passes already


# --- shutdown (last: it stops the window server) ----------------------------------------------


def test_sigterm_answers_every_accepted_request_then_exits_0(servers):
    """Last in the module: it stops the window server."""
    server = servers["window"]
    port = server.port
    results = []
    threads = [threading.Thread(target=lambda i: results.append(post(port, "/embed", {"inputs": [f"text {i}"] * 3}, {})),
                                args=(i,)) for i in range(6)]
    [t.start() for t in threads]
    deadline = time.monotonic() + 10
    while metric(port, "bertkit_serve_queue_depth") < 6:  # all six accepted, held by the batch window
        assert time.monotonic() < deadline
        time.sleep(0.02)
    server.terminate()
    [t.join(30) for t in threads]
    assert server.proc.wait(30) == 0
    assert sorted(r[0] for r in results) == [200] * 6 and all(len(r[2]) == 3 for r in results)
    with pytest.raises(OSError):
        call(port, "GET", "/health", timeout=2)  # gone: nothing listens any more
    assert "stopped after answering every accepted request" in "".join(server.lines)


def test_engine_fails_only_the_job_that_breaks_a_batch():
    """A batch that raises is retried job by job: the culprit gets the error, its neighbours their answers."""
    import asyncio

    from bertkit.serve.batching import Engine

    class Runner:
        budget_in_tokens = False
        calls = []

        def run_jobs(self, jobs):
            self.calls.append(len(jobs))
            if any("bad" in job.items for job in jobs):
                raise ValueError("bad input")
            return [[x.upper() for x in job.items] for job in jobs]

    async def scenario():
        engine = Engine(Runner(), max_queue=8, max_batch_tokens=100, max_batch_size=100, max_wait_ms=300).start()
        jobs = [engine.submit(items, [1] * len(items)) for items in (["a"], ["bad"], ["b", "c"])]
        results = await asyncio.gather(*(job.future for job in jobs), return_exceptions=True)
        engine.close()
        return results, engine.depth

    (first, broken, third), depth = asyncio.run(scenario())
    assert first == ["A"] and third == ["B", "C"] and isinstance(broken, ValueError) and depth == 0
    assert Runner.calls == [3, 1, 1, 1]  # one batch of three, then each alone


def test_parallelism_defaults_to_one_single_threaded_worker_per_core():
    from bertkit.serve.settings import ServeConfig

    assert ServeConfig().parallelism(2, gpu=False) == (2, 1)
    assert ServeConfig(threads=2).parallelism(4, gpu=False) == (2, 2)
    assert ServeConfig(workers=1).parallelism(2, gpu=False) == (1, 2)  # the classic layout: matmuls split
    assert ServeConfig(workers=3, threads=1).parallelism(2, gpu=False) == (3, 1)
    assert ServeConfig().parallelism(8, gpu=True) == (1, 8)


def test_engine_spreads_one_request_over_idle_workers_and_keeps_its_order():
    """Two workers, one request of four texts: two passes run at the same time; the answer is in order."""
    import asyncio

    from bertkit.serve.batching import Engine

    class Runner:
        budget_in_tokens = True
        passes, running, most = [], [0], [0]

        def run_jobs(self, parts):
            self.running[0] += 1
            self.most[0] = max(self.most[0], self.running[0])
            time.sleep(0.2)  # both workers are inside a pass at once
            self.running[0] -= 1
            self.passes.append([p.items for p in parts])
            return [[x * 10 for x in p.items] for p in parts]

    async def scenario():
        engine = Engine(Runner(), max_queue=8, max_batch_tokens=100, max_batch_size=100, max_wait_ms=0,
                        workers=2).start()
        job = engine.submit([4, 1, 3, 2], [4, 1, 3, 2])  # costs = lengths: sorted 1, 2 | 3, 4
        result = await job.future
        engine.close()
        return result, engine.depth

    result, depth = asyncio.run(scenario())
    assert result == [40, 10, 30, 20] and depth == 0
    assert sorted(Runner.passes) == [[[1, 2]], [[4, 3]]] and Runner.most[0] == 2


def test_a_free_worker_takes_its_fair_share_of_the_requests_not_all_that_wait():
    """Two workers: one busy with request A, seven more arrive. The free worker takes four of
    the eight requests in the server (its share), oldest first; the other three wait for the
    next free worker. Without the share it would take all seven and leave uneven passes."""
    import asyncio

    from bertkit.serve.batching import Engine

    class Runner:
        budget_in_tokens = True
        passes = []

        def run_jobs(self, parts):
            self.passes.append([p.items[0] for p in parts])
            time.sleep(0.3)
            return [p.items for p in parts]

    async def scenario():
        engine = Engine(Runner(), max_queue=16, max_batch_tokens=1000, max_batch_size=100, max_wait_ms=100,
                        workers=2).start()
        first = engine.submit(["A"], [1])
        await asyncio.sleep(0.15)  # A's pass has started on one worker
        rest = [engine.submit([f"r{i}"], [1]) for i in range(7)]
        results = await asyncio.gather(first.future, *(job.future for job in rest))
        engine.close()
        return results, engine.depth

    results, depth = asyncio.run(scenario())
    assert results == [["A"]] + [[f"r{i}"] for i in range(7)] and depth == 0
    assert [sorted(p) for p in Runner.passes] == [["A"], ["r0", "r1", "r2", "r3"], ["r4", "r5", "r6"]]


def test_info_says_int8_for_a_folder_holding_an_int8_model(tmp_path, dirs):
    """A folder save_quantized wrote serves in int8 without --int8: /info said "precision": "int8" beside
    "int8": false (the flag asked for, not what runs)."""
    from starlette.testclient import TestClient

    import bertkit
    from bertkit.runtime.quantization import save_quantized
    from bertkit.serve.app import create_app
    from bertkit.serve.metrics import Metrics
    from bertkit.serve.runner import load_runner
    from bertkit.serve.settings import ServeConfig

    loaded = bertkit.load(str(dirs["encoder"]), int8=True)
    save_quantized(loaded.model, tmp_path / "int8", loaded.tokenizer)
    for model, int8 in ((tmp_path / "int8", False), (dirs["encoder"], True), (dirs["encoder"], False)):
        settings = ServeConfig(model=str(model), workers=1, threads=1, int8=int8).validate()
        with TestClient(create_app(load_runner(settings), settings, Metrics())) as client:
            info = client.get("/info").json()
        assert info["int8"] is (info["precision"] == "int8") is (model != dirs["encoder"] or int8), info


def test_a_hugging_face_qa_checkpoint_is_served_as_squad_v2_when_asked(tmp_path, dirs):
    """`bertkit predict` reads a transformers QA checkpoint (no bertkit_task.json: nothing says v1 or v2) as SQuAD v2
    with --version-2-with-negative; `bertkit serve` had no such choice, so a v2 model's server never answered "no
    answer" (''), and /info did not say which it answers. Now it takes the flag: its answers are `bertkit.predict`'s
    with version_2=True (the reference), /info says version_2, and the flag is refused as predict refuses it:
    beside a model that is no QA model, and beside a bertkit QA folder whose task file says otherwise."""
    import shutil

    from starlette.testclient import TestClient

    import bertkit
    from bertkit.errors import BertkitError
    from bertkit.serve.app import create_app
    from bertkit.serve.metrics import Metrics
    from bertkit.serve.runner import load_runner
    from bertkit.serve.settings import ServeConfig

    hf = shutil.copytree(dirs["qa"], tmp_path / "hf")
    (hf / "bertkit_task.json").unlink()  # as transformers saves it
    questions, contexts = ["who went to paris ?", "what was new ?"], ["john went to paris .", "the movie was new ."]
    answers = {}
    for version_2 in (True, False):
        settings = ServeConfig(model=str(hf), workers=1, threads=1, dtype="float32", version_2=version_2).validate()
        with TestClient(create_app(load_runner(settings), settings, Metrics())) as client:
            assert client.get("/info").json()["version_2"] is version_2
            answers[version_2] = [p["answer"] for p in client.post("/predict", json={"inputs": questions,
                                                                                      "pairs": contexts}).json()]
        expected = bertkit.predict(hf, questions, contexts, version_2=version_2 or None)
        assert answers[version_2] == [p["answer"] for p in expected], (version_2, answers)
    assert "" in answers[True] and answers[True] != answers[False]  # the premise: the two readings differ here
    for model, says in ((dirs["pair"], "is for a question-answering model"), (dirs["encoder"], "is for a question-"
                        "answering model"), (dirs["qa"], "was trained without --version-2-with-negative")):
        with pytest.raises(BertkitError, match=says):
            load_runner(ServeConfig(model=str(model), workers=1, threads=1, version_2=True).validate())


def test_an_iob1_tagger_says_the_tags_it_answers_and_refuses_raw_scores_truly(tmp_path):
    """A NER model trained with --tag-scheme iob1 answers IOB1 tags (`bertkit.predict`), but /info listed the IOB2
    names it was trained on: a file whose persons are single words ('I-PER' in IOB1, B-PER in IOB2) gives a model
    whose every person is answered 'I-PER', a tag /info did not list. Reference: the IOB1 file's own tags and the
    tags bertkit.predict answers are all in /info's labels. And `raw_scores: true` was refused with "its scores
    are probabilities", where a tagger's predictions carry no scores."""
    from starlette.testclient import TestClient

    import bertkit
    from bertkit.metrics.tasks import iob1_to_iob2
    from bertkit.serve.app import create_app
    from bertkit.serve.metrics import Metrics
    from bertkit.serve.runner import load_runner
    from bertkit.serve.settings import ServeConfig
    from test_finetune import tiny_model_dir

    iob1_file = [["I-PER", "O", "O", "I-LOC", "I-LOC"], ["I-PER", "B-PER", "O", "I-LOC"]]  # the training file's tags
    names = ["O", *sorted({t for s in iob1_file for t in iob1_to_iob2(s)} - {"O"})]  # as finetune names them
    model = task_dir(tmp_path / "iob1", tiny_model_dir(tmp_path / "tiny"), "BertForTokenClassification", {}, names)
    head = bertkit.BertForTokenClassification.from_pretrained(model)
    with torch.no_grad():  # every word a person: IOB1's I-PER, then B-PER after a person
        head.classifier.weight.zero_()
        head.classifier.bias.copy_(torch.tensor([10.0 if n == "B-PER" else 0.0 for n in names]))
    head.save_pretrained(model, tokenizer=bertkit.Tokenizer.from_pretrained(model))
    (model / "bertkit_task.json").write_text(json.dumps({"task": "ner", "max_length": 16, "stride": 4,
                                                         "tag_scheme": "iob1"}))
    answered = {t for p in bertkit.predict(model, ["john met mary", "paris"]) for t in p["tags"]}
    assert answered == {"I-PER", "B-PER"}  # the premise: IOB1 tags, one of them not a training name
    settings = ServeConfig(model=str(model), workers=1, threads=1, dtype="float32").validate()
    with TestClient(create_app(load_runner(settings), settings, Metrics())) as client:
        info = client.get("/info").json()
        assert info["tag_scheme"] == "iob1"
        assert answered | {t for s in iob1_file for t in s} <= set(info["labels"]), info["labels"]
        answer = client.post("/predict", json={"inputs": "john went", "raw_scores": True})
        assert answer.status_code == 422 and "probabilities" not in answer.json()["error"], answer.json()
        assert "no scores" in answer.json()["error"]
