"""The index: passages cut by tokens with their spans, the files on disk, resuming after SIGKILL, the model check.

A tiny random model (2 layers, hidden 32, 4 heads, intermediate 37, 64 positions) with the real
uncased vocabulary, and a few SciFact abstracts cut into passages of 32 tokens, so every document
gives several overlapping passages.
"""

import hashlib
import gzip
import json
import os
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest
import torch

import bertkit
from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.data.beir import document_text
from bertkit.retrieval.index import build_index, open_index
from bertkit.retrieval.passages import Document, cut_all, passages_sha256, read_documents
from bertkit.text.tokenizer import Tokenizer

TOKENS, OVERLAP = 32, 6


def make_tiny(path, seed=0):
    from bertkit.model.config import BertConfig
    from bertkit.model.modeling import BertModel

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64)
    BertModel(config, generator=torch.Generator().manual_seed(seed)).save_pretrained(
        path, tokenizer=Tokenizer.from_pretrained())
    return path


def scifact_corpus(shared_data, path, n=12, first=0):
    """The first n abstracts of SciFact's corpus.jsonl, copied line by line."""
    lines = (shared_data / "retrieval" / "scifact" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(lines[first : first + n]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory):
    return scifact_corpus(shared_data, tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="module")
def built(tiny, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("built") / "index"
    info = build_index(corpus, out, str(tiny), passage_tokens=TOKENS, overlap=OVERLAP, batch_size=64,
                       part_size=40, dtype="float32", progress=False)
    return out, info


# --- passages ----------------------------------------------------------------------------------

def test_passage_spans_map_back_into_the_document_text():
    tok = Tokenizer.from_pretrained()
    long = " ".join(f"word{i} unaffable, (interleukin-{i})" for i in range(60))
    docs = [Document("a", "A title", long), Document("b", "", "short text"), Document("c", "", "\u0000 \u0001")]
    passages, pieces, empty = cut_all(docs, tok, TOKENS, OVERLAP)
    assert empty == 1  # "c": only characters BERT drops
    by_doc = {}
    for p, n in zip(passages, pieces):
        by_doc.setdefault(p.doc_id, []).append((p, n))
    for doc in docs:
        text = document_text({"title": doc.title, "text": doc.text})
        got = by_doc.get(doc.id, [])
        for k, (p, n) in enumerate(got):
            assert p.text == text[p.start : p.end] and p.id == f"{doc.id}#{k}" and p.title == doc.title
            assert 1 <= n <= TOKENS - 2
        if not got:
            continue
        encoded = tok.encode(text, truncation=False, add_special_tokens=False)
        offsets = encoded.offsets
        # the passages cover every token: the first starts at the first, the last ends at the last
        assert got[0][0].start == offsets[0][0] and got[-1][0].end == offsets[-1][1]
        starts = [o[0] for o in offsets]
        ends = [o[1] for o in offsets]
        step = TOKENS - 2 - OVERLAP
        for k, ((p, n), (q, _)) in enumerate(zip(got, got[1:])):
            first, nxt, last = starts.index(p.start), starts.index(q.start), ends.index(p.end)
            # windows step by size - overlap; one that would begin inside a word begins at the next word
            window = (k + 1) * step
            assert last == k * step + TOKENS - 3 and window <= nxt < window + OVERLAP
            assert not encoded.tokens[nxt].startswith("##")
            assert all(t.startswith("##") for t in encoded.tokens[window:nxt]) and n == last - first + 1
    assert len(by_doc["a"]) > 5 and len(by_doc["b"]) == 1 and by_doc["b"][0][0].text == "short text"


def test_no_passage_starts_inside_a_word(shared_data, tmp_path):
    """On real abstracts (SciFact), every later passage begins where a word begins: the character
    before it is not a letter or digit, or the first character is not (punctuation)."""
    tok = Tokenizer.from_pretrained()
    docs = read_documents(scifact_corpus(shared_data, tmp_path / "c.jsonl", n=60))
    passages, _, _ = cut_all(docs, tok, TOKENS, OVERLAP)
    texts = {d.id: document_text({"title": d.title, "text": d.text}) for d in docs}
    later = [p for p in passages if not p.id.endswith("#0")]
    inside = [p for p in later if texts[p.doc_id][p.start - 1].isalnum() and p.text[0].isalnum()]
    assert len(later) > 300 and inside == []


def test_a_document_of_dropped_characters_has_no_passage():
    tok = Tokenizer.from_pretrained()
    passages, _, empty = cut_all([Document("x", "", "\u0000\u0001"), Document("y", "", "fine")], tok, 8, 2)
    assert empty == 1 and [p.doc_id for p in passages] == ["y"]


def test_corpus_formats_read_the_same_documents(tmp_path):
    rows = [("d1", "First", "alpha beta"), ("d2", "", "gamma")]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in rows))
    (tmp_path / "c.tsv").write_text("id\ttitle\ttext\n" + "".join(f"{i}\t{t}\t{x}\n" for i, t, x in rows))
    folder = tmp_path / "txt"
    (folder / "sub").mkdir(parents=True)
    (folder / "d1.txt").write_text("alpha beta")
    (folder / "sub" / "d2.txt").write_text("gamma")
    want = [Document(i, t, x) for i, t, x in rows]
    assert read_documents(tmp_path / "c.jsonl") == want
    assert read_documents(tmp_path / "c.tsv") == want
    assert read_documents(folder) == [Document("d1", "", "alpha beta"), Document("sub/d2", "", "gamma")]
    # gzipped (BEIR's Hugging Face copies): were refused ("use a BEIR corpus.jsonl"; a folder: "no corpus.jsonl")
    beir = tmp_path / "beir"
    beir.mkdir()
    (beir / "corpus.jsonl.gz").write_bytes(gzip.compress((tmp_path / "c.jsonl").read_bytes()))
    assert read_documents(beir / "corpus.jsonl.gz") == want
    assert read_documents(beir) == want


def test_a_folder_index_reads_the_files_the_corpus_reader_reads(tmp_path):
    """A folder opened in Jupyter holds .ipynb_checkpoints/NAME-checkpoint.txt, a copy of each text file edited
    there: the index read it as one more document (each such text found twice in a search); it now reads the
    .txt files `corpus_files` (vocab train, pretrain prepare) reads, hidden files and folders skipped."""
    from bertkit.data.corpus import corpus_files

    folder = tmp_path / ".corpus"  # a hidden folder named as the corpus is read
    for name in ("d1.txt", "sub/d2.txt", ".ipynb_checkpoints/d1-checkpoint.txt", ".notes.txt", "sub/.git/x.txt"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(name)
    want = [f.relative_to(folder).with_suffix("").as_posix() for f in corpus_files([folder])]
    assert [d.id for d in read_documents(folder)] == want == ["d1", "sub/d2"]


def test_a_folder_index_skips_a_tokenizer_left_in_the_corpus_and_says_so(tmp_path):
    """`vocab train docs/ -o docs/v1` (or a model saved inside the corpus) leaves v1/vocab.txt beside a
    tokenizer_config.json: vocab train and pretrain prepare skip it (`corpus_files`), but `bertkit index docs/`
    read it as one more document, whose "[PAD] [UNK] [CLS] ..." lines a search then found. The index reads what
    `corpus_files` reads, and warns naming each vocabulary it skipped; a vocab.txt alone is a text, read."""
    from bertkit.data.corpus import corpus_files

    folder = tmp_path / "docs"
    files = {"d1.txt": "alpha beta", "v1/vocab.txt": "[PAD]\n[UNK]\n[CLS]\n", "v1/tokenizer_config.json": "{}",
             "model/vocab.txt": "[PAD]\n", "model/config.json": "{}", "words/vocab.txt": "a list of words"}
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    want = [f.relative_to(folder).with_suffix("").as_posix() for f in corpus_files([folder])]
    with pytest.warns(UserWarning) as said:
        got = [d.id for d in read_documents(folder)]
    assert got == want == ["d1", "words/vocab"]
    line = " ".join(str(w.message) for w in said)
    assert "v1/vocab.txt" in line and "model/vocab.txt" in line and "words/vocab.txt" not in line, line


def test_bad_corpora_are_one_line_errors(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "notext.tsv").write_text("id\ttitle\nd1\tx\n")
    (tmp_path / "header.tsv").write_text("id\ttext\n")
    (tmp_path / "twice.tsv").write_text("id\ttext\nd1\ta\nd1\tb\n")
    (tmp_path / "c.csv").write_text("id,text\n")
    (tmp_path / "none").mkdir()
    for name, match in [("empty.jsonl", "empty"), ("notext.tsv", "no text column"), ("header.tsv", "no documents"),
                        ("twice.tsv", "appears on line 2 and again on line 3"), ("c.csv", "use a BEIR corpus.jsonl"),
                        ("none", "no corpus.jsonl and no .txt"), ("missing.tsv", "does not exist")]:
        with pytest.raises(BertkitError, match=match) as err:
            read_documents(tmp_path / name)
        assert "\n" not in str(err.value)
    with pytest.raises(BertkitError, match="--stride 30"):
        cut_all([Document("a", "", "x")], Tokenizer.from_pretrained(), TOKENS, 30)
    with pytest.raises(BertkitError, match="at least 3 tokens"):
        cut_all([Document("a", "", "x")], Tokenizer.from_pretrained(), 2, 0)


# --- the files ---------------------------------------------------------------------------------

def test_the_index_holds_each_passage_vector_and_the_model(built, tiny, corpus):
    out, info = built
    index = open_index(out)
    lines = (out / "passages.jsonl").read_text(encoding="utf-8").splitlines()
    passages = [json.loads(line) for line in lines]
    docs = read_documents(corpus)
    assert info["passages"] == len(passages) == len(index) > 2 * len(docs)
    assert info["documents"] == len(docs) and info["dim"] == 32 and not (out / "parts").exists()
    assert index.passages([3, 0]) == [passages[3], passages[0]]
    text_of = {d.id: document_text({"title": d.title, "text": d.text}) for d in docs}
    assert all(p["text"] == text_of[p["doc_id"]][p["start"] : p["end"]] for p in passages)
    doc_numbers = {d.id: i for i, d in enumerate(docs)}
    assert index.document.tolist() == [doc_numbers[p["doc_id"]] for p in passages]
    assert info["max_passages_per_document"] == max(np.bincount(index.document))
    # every row is its own passage's vector, as bertkit.embed makes it on its own (the rows were encoded
    # length-sorted in parts and put back in passage order)
    expect = bertkit.embed([p["text"] for p in passages], str(tiny), pooling="mean", normalize=True,
                           max_length=TOKENS, truncate=True, dtype="float32")
    np.testing.assert_allclose(np.asarray(index.vectors), expect, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(index.vectors, axis=1), 1, atol=1e-6)
    model = info["model"]
    assert model["directory"] == str(tiny.resolve()) and model["pooling"] == "mean" and model["normalize"]
    assert model["fingerprint"] == hashlib.sha256((tiny / "model.safetensors").read_bytes()).hexdigest()
    assert model["precision"] == "float32" and json.loads((out / "index.json").read_text())["format"] == 1
    from safetensors.numpy import load_file  # the safetensors library reads our file

    np.testing.assert_array_equal(load_file(str(out / "vectors.safetensors"))["vectors"], index.vectors)


def test_building_into_a_used_folder_is_refused(built, tiny, corpus, tmp_path):
    out, _ = built
    with pytest.raises(BertkitError, match="already holds a finished index"):
        build_index(corpus, out, str(tiny), progress=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("mine")
    with pytest.raises(BertkitError, match="not empty"):
        build_index(corpus, tmp_path / "other", str(tiny), progress=False)
    with pytest.raises(BertkitError, match="holds no unfinished index"):
        build_index(corpus, tmp_path / "new", str(tiny), resume=True, progress=False)
    with pytest.raises(BertkitError, match="more than the model's 64 positions"):
        build_index(corpus, tmp_path / "long", str(tiny), passage_tokens=128, progress=False)
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["index", str(tmp_path / "empty.jsonl"), "-o", str(tmp_path / "e"), "--model", str(tiny)]) == 2
    assert not (tmp_path / "e").exists()  # a refused corpus leaves no half-made folder behind


def test_a_missing_bm25s_is_refused_before_any_passage_is_encoded(tiny, corpus, tmp_path, monkeypatch, capsys):
    """The lexical part is built last, after every passage is encoded; without bm25s (a base install,
    no [search] extra) the build stopped only there. Now one line names the extra and --no-lexical first,
    and nothing is written; --no-lexical builds."""
    monkeypatch.setitem(sys.modules, "bm25s", None)  # None in sys.modules: importing it raises ImportError
    out = tmp_path / "index"
    assert main(["index", str(corpus), "-o", str(out), "--model", str(tiny), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'bertkit[search]'" in err and "--no-lexical" in err and len(err.splitlines()) == 1, err
    assert not (out / "vectors.safetensors").exists() and not (out / "parts").exists()
    assert main(["index", str(corpus), "-o", str(out), "--model", str(tiny), "--quiet", "--no-lexical"]) == 0


def test_a_missing_qdrant_client_is_refused_before_the_index_is_read(built, tmp_path, monkeypatch, capsys):
    """`index export INDEX --qdrant ...` opened and checked the whole index (every vector read, to see that each is
    finite: minutes for a large one) before saying that qdrant-client, the search extra, is missing."""
    from bertkit.retrieval import index

    def read(*args, **kwargs):
        raise AssertionError("the index was read before the missing package was said")

    monkeypatch.setitem(sys.modules, "qdrant_client", None)  # None in sys.modules: importing it raises ImportError
    monkeypatch.setattr(index, "open_index", read)
    assert main(["index", "export", str(built), "--qdrant", str(tmp_path / "q"), "--collection", "c"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'bertkit[search]'" in err and err.count("\n") == 1, err
    assert not (tmp_path / "q").exists()


# --- resuming after SIGKILL ----------------------------------------------------------------------

KILLED_AT_THIRD_PART = textwrap.dedent("""
    import os, signal, sys
    real_replace, parts = os.replace, []

    def replace(src, dst):
        # the third part is written to its temporary file; die before it is renamed into place
        if str(dst).endswith(".npy"):
            parts.append(dst)
            if len(parts) == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(src, dst)

    os.replace = replace
    from bertkit.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_the_passages_hash_is_taken_a_line_at_a_time():
    """A build records passages.jsonl's SHA-256 (build.json's passages_sha256, compared by --resume), which was
    hashlib.sha256(b"".join(lines)): a second copy of every passage's bytes held at once, beside the lines
    (gigabytes for a large corpus). Now a line at a time: the same digest as over the whole bytes (so a build
    interrupted before this change still resumes), and no more than a line held for it."""
    lines = [json.dumps({"id": f"d{i}#0", "text": "é mot " * (i % 400)}, ensure_ascii=False).encode() + b"\n"
             for i in range(4000)]  # 5 MB
    want = hashlib.sha256(b"".join(lines)).hexdigest()
    tracemalloc.start()
    try:
        got = passages_sha256(lines)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == want
    assert peak < max(map(len, lines)) + 65536, peak


def test_a_resume_on_passages_cut_otherwise_names_the_corpus_or_the_bertkit_version(tiny, corpus, tmp_path,
                                                                                     monkeypatch):
    """An unfinished build started by the bertkit of 11-25 (53df944, before a window began at a word) and
    resumed by today's: the same corpus, model and flags, and the refusal told the user to 'resume with the same
    corpus, model and settings', which they had, naming passages_sha256 and two 64-hex hashes. It names the two
    causes now (the corpus changed, or another version cut it) and the fix, --overwrite."""
    import bertkit.retrieval.index as index_module

    out = tmp_path / "index"
    options = dict(passage_tokens=TOKENS, overlap=OVERLAP, part_size=40, dtype="float32", progress=False,
                   lexical=None)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # before the first part: build.json and passages.jsonl are written

    monkeypatch.setattr(index_module, "_encode_parts", killed)
    with pytest.raises(KeyboardInterrupt):
        build_index(corpus, out, str(tiny), **options)
    monkeypatch.undo()
    plan = json.loads((out / "build.json").read_text())
    # the old cut: as many passages, one window beginning two characters into a word
    lines = (out / "passages.jsonl").read_bytes().splitlines(keepends=True)
    first = json.loads(lines[1])
    lines[1] = json.dumps({**first, "text": first["text"][2:]}).encode() + b"\n"
    (out / "build.json").write_text(json.dumps({**plan, "passages_sha256": passages_sha256(lines)}))
    with pytest.raises(BertkitError) as refused:
        build_index(corpus, out, str(tiny), resume=True, **options)
    said = str(refused.value)
    assert f"{plan['passages']} passages" in said and "another bertkit version" in said and str(corpus) in said
    assert said.endswith("start again with --overwrite") and "passages_sha256" not in said
    build_index(corpus, out, str(tiny), overwrite=True, **options)  # which builds it
    assert open_index(out).info["passages"] == plan["passages"]


def test_plan_difference_gives_the_differing_key_as_data_beside_the_sentence():
    """index --resume chose its line on changed passages by `difference.startswith("passages")`, a test on the
    sentence for people: a new wording, or a setting whose name began so, would have changed the decision. The
    key that differs is data now (what index decides on); the sentences embed and index say are the same."""
    from bertkit.data.vector_files import plan_difference

    saved = {"format": 2, "model": {"fingerprint": "f", "precision": "float32"}, "batch_size": 32, "passages": 5,
             "passages_sha256": "ab"}
    cases = [({"passages_sha256": "cd"}, "passages_sha256", "passages_sha256 was 'ab' in the interrupted run and is "
              "'cd' now"),
             ({"model": {"fingerprint": "f", "precision": "bfloat16"}}, "model", "model precision was {'precision': "
              "'float32'} in the interrupted run and is {'precision': 'bfloat16'} now"),
             ({"batch_size": 4, "passages": 6}, "batch_size", "batch_size was 32 in the interrupted run and is 4 now")]
    for changed, key, said in cases:
        difference = plan_difference(saved, {**saved, **changed})
        assert (difference.key, str(difference)) == (key, said)
    assert plan_difference(saved, dict(saved)) is None

def test_killed_with_sigkill_and_resumed_equals_an_uninterrupted_build(built, tiny, corpus, tmp_path):
    whole, info = built
    out = tmp_path / "index"
    args = ["index", str(corpus), "-o", str(out), "--model", str(tiny), "--passage-tokens", str(TOKENS),
            "--stride", str(OVERLAP), "--batch-size", "64", "--part-size", "40", "--dtype", "float32", "--quiet"]
    child = subprocess.run([sys.executable, "-c", KILLED_AT_THIRD_PART, *args], capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == -9, child.stderr  # killed by SIGKILL, mid-way
    parts = sorted(p.name for p in (out / "parts").iterdir())
    # the part being written, and the lock its writer held (bertkit.data.atomic): both taken over by the resume
    assert parts == ["part-00000.npy", "part-00001.npy", "part-00002.npy.tmp", "part-00002.npy.tmp.lock"]
    assert not (out / "index.json").exists() and info["passages"] > 3 * 40  # parts were left to do
    with pytest.raises(BertkitError, match="unfinished index: add --resume"):
        build_index(corpus, out, str(tiny), passage_tokens=TOKENS, overlap=OVERLAP, progress=False)
    with pytest.raises(BertkitError, match="passage_tokens was 32 in the interrupted run and is 24"):
        build_index(corpus, out, str(tiny), passage_tokens=24, resume=True, dtype="float32", progress=False)
    with pytest.raises(BertkitError) as other:  # a record's fields that differ, not the whole record (a hash)
        build_index(corpus, out, str(tiny), passage_tokens=TOKENS, overlap=OVERLAP, batch_size=64, part_size=40,
                    resume=True, dtype="bfloat16", progress=False)
    assert "model precision was {'precision': 'float32'} in the interrupted run and is {'precision': 'bfloat16'}" \
        in str(other.value) and "fingerprint" not in str(other.value)
    with pytest.raises(BertkitError, match="not an index .*interrupted"):
        open_index(out)
    assert main([*args, "--resume"]) == 0
    lexical = [f"lexical/{name}" for name in sorted(os.listdir(whole / "lexical"))]  # BM25, written after the parts
    for name in ("index.json", "passages.jsonl", "vectors.safetensors", *lexical):
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name
    assert sorted(os.listdir(out)) == ["index.json", "lexical", "passages.jsonl", "vectors.safetensors"]
