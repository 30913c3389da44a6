"""Static embedding models: the folders sentence-transformers and model2vec write and read, the
ids-only tokenizer path, and `bertkit distill static` (Model2Vec's recipe).

Oracles: the Rust `tokenizers` library reads the tokenizer.json we write; sentence-transformers'
StaticEmbedding and model2vec's StaticModel encode the same folders (1e-6); model2vec's own PCA
and Zipf weights check the distillation's steps.
"""

import importlib.util
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import oracle

import bertkit
from bertkit.cli import main
from bertkit.distill.config import StaticDistillConfig
from bertkit.distill.static import distill_static, pca, sif_weights, teacher_vectors, zipf_probabilities
from bertkit.errors import BertkitError
from bertkit.model.static import StaticEmbedding, save_static
from bertkit.runtime.loading import load
from bertkit.text.tokenizer import Tokenizer
from bertkit.text.tokenizer_json import read_tokenizer_json, truncation_length, write_tokenizer_json

TEXTS = ["A man with a hard hat is dancing.", "Hello, World! naïve café", "unaffable 東京 zzqxj 🦄", "the",
         "tab\tnew\nline\u2028sep\x0bvt [MASK] x\u00a0y", "!!!"]
LONG = " ".join(f"w{i} zzqxj word{i % 7}" for i in range(150)) + " " + " ".join(TEXTS[:3] * 40)  # ~1,500 tokens


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_pretrained()


def table(rows: int, dim: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def ours(tok, tmp_path_factory):
    """A random static model saved by bertkit, normalised."""
    path = tmp_path_factory.mktemp("ours")
    write_tokenizer_json(tok, save_static(StaticEmbedding(table(len(tok)), normalize=True), path))
    return path


# --- the tokenizer ------------------------------------------------------------------------


def test_ids_batch_is_the_segments_ids_on_real_text(tok, shared_data):
    lines = (shared_data / "stsb" / "dev.tsv").read_text(encoding="utf-8").split("\n")[1:300]
    docs = [json.loads(line)["text"] for line in
            (shared_data / "retrieval" / "scifact" / "corpus.jsonl").read_text(encoding="utf-8").split("\n")[:200]]
    texts = [t for line in lines if line for t in line.split("\t")[:2]] + docs + TEXTS
    ids, lengths = tok.ids_batch(texts)
    want = [tok._segment(t).ids for t in texts]
    assert lengths == [len(w) for w in want]
    assert ids == [i for w in want for i in w]


def test_written_tokenizer_json_reads_in_the_rust_library_with_the_same_ids(tok, tmp_path):
    tokenizers = oracle("tokenizers", "tokenizers")
    rust = tokenizers.Tokenizer.from_file(str(write_tokenizer_json(tok, tmp_path)))
    for text in TEXTS:
        assert rust.encode(text, add_special_tokens=False).ids == tok.ids_batch([text])[0]
        assert rust.encode(text).ids == tok.encode(text).input_ids
    back = read_tokenizer_json(tmp_path)
    assert back.ids_to_tokens == tok.ids_to_tokens and back.lowercase and back.strip_accents


def test_a_tokenizer_json_of_another_kind_is_one_clear_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps(
        {"normalizer": None, "pre_tokenizer": {"type": "Metaspace"},
         "model": {"type": "WordPiece", "vocab": {t: i for i, t in enumerate(["[PAD]", "[UNK]", "a"])}}}))
    with pytest.raises(BertkitError, match="BertNormalizer, BertPreTokenizer"):
        read_tokenizer_json(tmp_path)


# --- folders: ours in sentence-transformers, theirs in bertkit ---------------------------------


def test_our_static_folder_loads_in_sentence_transformers_with_the_same_vectors(st, ours):
    theirs = st.SentenceTransformer(str(ours), device="cpu").encode(TEXTS)
    mine = bertkit.embed(TEXTS, ours)
    assert np.abs(mine - theirs).max() < 1e-6
    assert np.allclose(np.linalg.norm(mine, axis=1), 1, atol=1e-6)


@pytest.mark.parametrize("normalize", [False, True])
def test_a_folder_sentence_transformers_wrote_loads_with_the_same_vectors(st, default_model_dir, tmp_path, normalize):
    tokenizers = oracle("tokenizers", "tokenizers")
    from sentence_transformers.sentence_transformer.modules import Normalize, StaticEmbedding as STStatic

    rust = tokenizers.Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    modules = [STStatic(rust, embedding_weights=table(rust.get_vocab_size(), 7, seed=1))]
    model = st.SentenceTransformer(modules=modules + ([Normalize()] if normalize else []), device="cpu")
    model.save(str(tmp_path))
    mine = bertkit.embed(TEXTS + [LONG], tmp_path)  # LONG cut where the tokenizer.json's truncation says
    assert np.abs(mine - model.encode(TEXTS + [LONG])).max() < 1e-6
    assert load(tmp_path).layout.normalize is normalize
    assert load(tmp_path).model.config.max_length == truncation_length(default_model_dir) == 128
    rust.no_truncation()  # and a tokenizer that cuts nothing: every token of LONG counts
    model = st.SentenceTransformer(modules=[STStatic(rust, embedding_weights=table(rust.get_vocab_size(), 7, seed=1))],
                                   device="cpu")
    model.save(str(tmp_path / "uncut"))
    assert load(tmp_path / "uncut").model.config.max_length is None
    assert np.abs(bertkit.embed([LONG], tmp_path / "uncut", normalize=False) - model.encode([LONG])).max() < 1e-6


def test_a_folder_model2vec_wrote_loads_with_model2vecs_vectors(tok, tmp_path):
    model2vec = oracle("model2vec", "model2vec")
    tokenizers = oracle("tokenizers", "tokenizers")
    write_tokenizer_json(tok, tmp_path)
    rust = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    vectors = table(len(tok), 9, seed=2).numpy()
    theirs = model2vec.StaticModel(vectors=vectors, tokenizer=rust, normalize=True)
    theirs.save_pretrained(str(tmp_path / "m2v"))
    texts = [t for t in TEXTS if "[MASK]" not in t] + [LONG]  # model2vec keeps [MASK]; see the next test
    mine = bertkit.embed(texts, tmp_path / "m2v")
    assert np.abs(mine - theirs.encode(texts)).max() < 1e-6  # "🦄" is [UNK]: model2vec drops it, so do we
    assert np.abs(mine[-1] - theirs.encode([LONG], max_length=None)[0]).max() > 1e-3  # LONG cut at its 512
    assert load(tmp_path / "m2v").model.config.max_length == 512


def test_a_model2vec_vocabulary_without_cls_sep_mask_gets_them_after_its_last_id(tmp_path):
    words = ["[PAD]", "[UNK]", "the", "cat", "##s"]
    tok = Tokenizer(words + ["[CLS]", "[SEP]", "[MASK]"])
    data = {"normalizer": {"type": "BertNormalizer", "lowercase": True}, "pre_tokenizer": {"type": "BertPreTokenizer"},
            "model": {"type": "WordPiece", "vocab": {t: i for i, t in enumerate(words)}}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    back = read_tokenizer_json(tmp_path)
    assert back.ids_to_tokens == tok.ids_to_tokens
    assert back.ids_batch(["the cats"]) == ([2, 3, 4], [3])


# --- running a static model ---------------------------------------------------------------------


def test_the_loader_reads_a_static_folder_and_refuses_what_it_cannot_do(ours):
    loaded = load(ours)
    assert loaded.task == "static" and loaded.dtype == torch.float32 and loaded.layout.pooling == "mean"
    with pytest.raises(BertkitError, match="no task head"):
        load(ours, head="task")
    with pytest.raises(BertkitError, match="int8"):
        load(ours, int8=True)
    with pytest.raises(BertkitError, match="pooling 'cls'"):
        bertkit.embed(TEXTS, ours, pooling="cls")


def test_a_layer_combine_beside_a_static_model_is_refused_not_ignored(ours, tmp_path, capsys):
    # combine= (--combine) merges a list of layers, which a table does not have: it was dropped without a word
    with pytest.raises(BertkitError, match="combine 'sum'.*static model has no layers"):
        bertkit.embed(TEXTS, ours, combine="sum")
    (tmp_path / "s.txt").write_text("a cat\na dog\n")
    assert main(["embed", str(tmp_path / "s.txt"), "-o", str(tmp_path / "v.npy"), "--model", str(ours),
                 "--combine", "mean", "--quiet"]) == 2
    assert "combine 'mean'" in capsys.readouterr().err and not (tmp_path / "v.npy").exists()
    # and `bertkit serve --model STATIC --combine sum` started, its /embed unchanged by it
    from bertkit.embeddings.settings import EmbedOptions
    from bertkit.serve.runner import load_runner
    from bertkit.serve.settings import ServeConfig

    settings = ServeConfig(model=str(ours), workers=1, threads=1, embedding=EmbedOptions(combine="sum")).validate()
    with pytest.raises(BertkitError, match="combine 'sum'"):
        load_runner(settings)


def test_what_needs_layers_refuses_a_static_model_in_one_line(ours, tmp_path, capsys):
    # trace died in an AttributeError (StaticConfig has no num_attention_heads) and attention spoke of
    # max_length=1000000: a table has no attention to show
    for call in (lambda: bertkit.trace("the cat", model=ours), lambda: bertkit.attention_map("the cat", model=ours)):
        with pytest.raises(BertkitError, match="static embedding model .*no layers"):
            call()
    assert main(["attention", "the cat", "--model", str(ours), "-o", str(tmp_path / "a.html")]) == 2
    err = capsys.readouterr().err
    assert "static embedding model" in err and len(err.strip().splitlines()) == 1
    if importlib.util.find_spec("onnx") and importlib.util.find_spec("onnxruntime"):  # export says why first
        # export onnx said "is not a model directory: it has no config.json"
        assert main(["export", "onnx", str(ours), "-o", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert "static embedding model" in err and "export onnx needs a transformer" in err, err
    assert not (tmp_path / "a.html").exists()
    (tmp_path / "s.txt").write_text("a cat\na dog\n")
    assert main(["distill", "layers", str(ours), "--keep", "1", "--data", str(tmp_path / "s.txt"),
                 "-o", str(tmp_path / "student")]) == 2
    assert "distill layers needs a transformer" in capsys.readouterr().err


def test_a_text_without_tokens_is_refused_as_for_a_transformer(ours):
    # it came back as a zero vector from embed (and so from index and evaluate) while serve, and every
    # transformer, refuse it; a zero row scores 0 against everything and hides a broken input
    for text in ("\x00\ufffd", "\u200b"):
        with pytest.raises(BertkitError, match="yields no tokens"):
            bertkit.embed(["fine", text], ours)


def test_the_mean_is_over_the_ids_without_special_tokens(tok, ours):
    weight = load(ours).model.embedding.weight.detach().numpy()
    ids = tok.encode("Hello, world!").input_ids[1:-1]
    want = weight[ids].mean(axis=0)
    got = bertkit.embed("Hello, world!", ours, normalize=False)
    assert np.abs(got - want).max() < 1e-6


def test_max_length_cuts_the_ids(tok, ours):
    weight = load(ours).model.embedding.weight.detach().numpy()
    ids = tok.ids_batch(["the cat sat on the mat"])[0][:3]
    got = bertkit.embed(["the cat sat on the mat"], ours, normalize=False, max_length=3, truncate=True)
    assert np.abs(got[0] - weight[ids].mean(axis=0)).max() < 1e-6


def test_a_text_cut_at_the_folders_max_length_is_said(distilled, transformers_mod, default_model_dir):
    """A static model averaged a 1,500-token text's first 512 tokens (its folder's max_length, model2vec's cut)
    without a word, where a transformer's cut is warned of: one warning now counts such texts; a cut asked for
    (truncate=True) and truncate=False say nothing. Reference: transformers' count of each text's word pieces."""
    fast = transformers_mod.BertTokenizerFast.from_pretrained(str(default_model_dir))
    texts = [TEXTS[0], LONG, LONG + " and more"]
    cut = sum(len(fast(t, add_special_tokens=False)["input_ids"]) > 512 for t in texts)
    out, _ = distilled
    assert cut == 2 and load(out).max_length == 512
    with pytest.warns(UserWarning, match=rf"^{cut} of 3 texts are longer than the 512 tokens the model reads "
                      r"\(its max length\), and it read them cut there, where "
                      "the static model's folder cuts a text") as said:
        bertkit.embed(texts, out)
    assert len(said) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bertkit.embed(texts, out, truncate=True)
        bertkit.embed(texts, out, truncate=False)


def test_cli_embed_and_evaluate_run_a_static_model(ours, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("\n".join(TEXTS[:4]) + "\n")
    assert main(["embed", str(tmp_path / "in.txt"), "-o", str(tmp_path / "v.npy"), "--model", str(ours)]) == 0
    assert np.abs(np.load(tmp_path / "v.npy") - bertkit.embed(TEXTS[:4], ours)).max() < 1e-6
    # the last layer spelled as on a transformer (-1, a string on the command line) is the table: was refused
    assert main(["embed", str(tmp_path / "in.txt"), "-o", str(tmp_path / "l.npy"), "--model", str(ours),
                 "--layers", "-1"]) == 0
    assert (tmp_path / "l.npy").read_bytes() == (tmp_path / "v.npy").read_bytes()
    (tmp_path / "sts.tsv").write_text("sentence1\tsentence2\tscore\na cat\ta cat\t5\na dog\tthe sea\t0\n"
                                      "a man runs\ta man walks\t3\n")
    assert main(["evaluate", "sts", str(tmp_path / "sts.tsv"), "--model", str(ours)]) == 0
    assert "spearman" in capsys.readouterr().out
    # refused as the user typed it: it said "pooling None", Python's spelling
    assert main(["embed", str(tmp_path / "in.txt"), "-o", str(tmp_path / "t.jsonl"), "--model", str(ours),
                 "--pooling", "none"]) == 2
    assert "pooling 'none' (one vector per token): a static model" in capsys.readouterr().err


def test_a_static_embed_resumed_compares_the_cut_its_vectors_have(tok, tmp_path, capsys, monkeypatch):
    """embed --resume with a static model records where each text is cut (`static_cut`, the rule iter_embed
    applies, once): the folder's cut (8 tokens) spelled out goes on and gives the uninterrupted file; the whole
    text (--no-truncate, other vectors here) is refused naming the cut."""
    import bertkit.cli.features as command
    import bertkit.embeddings.features as features

    model = tmp_path / "cut8"
    write_tokenizer_json(tok, save_static(StaticEmbedding(table(len(tok)), normalize=True), model), 8)
    source = tmp_path / "in.txt"
    source.write_text("".join(f"text {i} about {'a big ' * (i % 5)}cat\n" for i in range(20)))
    embed = lambda out, *flags: main(["embed", str(source), "-o", str(tmp_path / out), "--model", str(model),  # noqa
                                      "--quiet", *flags])
    monkeypatch.setattr(command, "EMBED_CHUNK", 8)
    assert embed("whole.npy") == 0 and embed("all.npy", "--no-truncate") == 0
    assert np.load(tmp_path / "whole.npy").tobytes() != np.load(tmp_path / "all.npy").tobytes()  # the cut matters
    real = features.iter_embed

    def interrupted(*args, **kwargs):
        for i, row in enumerate(real(*args, **kwargs)):
            if i == 12:
                raise KeyboardInterrupt
            yield row
    monkeypatch.setattr(features, "iter_embed", interrupted)
    assert embed("v.npy") == 130
    monkeypatch.setattr(features, "iter_embed", real)
    capsys.readouterr()
    assert embed("v.npy", "--resume", "--no-truncate") == 2
    assert "max_length was 8 in the interrupted run and is None" in capsys.readouterr().err
    assert embed("v.npy", "--resume", "--max-length", "8", "--truncate") == 0
    assert (tmp_path / "v.npy").read_bytes() == (tmp_path / "whole.npy").read_bytes()


# --- distillation --------------------------------------------------------------------------------


def test_pca_and_zipf_weights_are_model2vecs():
    oracle("model2vec", "model2vec")
    from model2vec.distill.inference import apply_pca, compute_weights

    x = np.random.default_rng(0).normal(size=(60, 16)).astype(np.float32) * np.arange(1, 17)
    assert np.abs(pca(x, 5) - apply_pca(x.copy(), 5)).max() < 1e-4
    want = compute_weights(40, 1e-4)
    assert np.abs(sif_weights(zipf_probabilities(40), 1e-4) - want).max() < 1e-12


def test_the_teachers_token_vector_is_the_model_embedding_the_token(tiny_dir):
    loaded = load(tiny_dir, head="encoder")
    tok = loaded.tokenizer
    got = teacher_vectors(loaded, [[tok.cls_token_id, tok.vocab["hello"], tok.sep_token_id]], 4, False)[0]
    assert np.abs(got - bertkit.embed("hello", tiny_dir)).max() < 1e-5


@pytest.fixture(scope="module")
def distilled(tiny_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("distilled")
    (base / "corpus.txt").write_text("the unaffable cat\n" * 6 + "a dog\n")
    config = StaticDistillConfig(dim=8, corpus=[str(base / "corpus.txt")], min_count=5)
    said = []
    report = distill_static(tiny_dir, base / "out", config, progress=False, log=said.append)
    return base / "out", {**report, "said": said}


def test_distilling_an_encoder_without_a_sentence_layout_says_what_it_distils(distilled, tiny_dir, tmp_path):
    """A pre-training run (or any plain encoder: tiny_dir, like a run's folder, has no modules.json) was distilled
    without a word, as if it were a sentence model. It is distilled as `bertkit embed` reads it, its encoder
    mean-pooled, and one line says so; the report records the pooling. A folder with a layout is pooled as it
    says, without that line."""
    import shutil

    from bertkit.model.sentence_layout import write_layout

    _, report = distilled
    assert report["pooling"] == "mean"
    notes = [line for line in report["said"] if "sentence-transformers layout" in line]
    assert len(notes) == 1 and str(tiny_dir) in notes[0] and "mean-pooled" in notes[0], report["said"]
    layout = tmp_path / "cls-model"
    shutil.copytree(tiny_dir, layout)
    write_layout(layout, pooling="cls", normalize=False, max_seq_length=32, hidden_size=32)
    said = []
    with pytest.raises(BertkitError, match="above the model's width"):  # stops before the table is built
        distill_static(layout, tmp_path / "out", StaticDistillConfig(dim=64), progress=False, log=said.append)
    assert said == []


def test_distill_static_writes_a_folder_sentence_transformers_reads_the_same(st, distilled):
    out, report = distilled
    assert report["dim"] == 8 and report["words_added"] == 1  # "unaffable": three pieces, seen 6 times
    texts = TEXTS + ["the unaffable cat", LONG]
    assert np.abs(bertkit.embed(texts, out) - st.SentenceTransformer(str(out), device="cpu").encode(texts)).max() < 1e-6
    assert truncation_length(out / "0_StaticEmbedding") == 512 == load(out).max_length  # where both cut LONG


def test_no_truncate_averages_every_token_and_a_stride_is_refused(distilled):
    # truncate=False (--no-truncate) still cut at the folder's 512 tokens, and a stride was read by nothing
    model2vec = oracle("model2vec", "model2vec")
    out, _ = distilled
    whole = model2vec.StaticModel.from_pretrained(str(out)).encode([LONG], max_length=None)[0]
    assert np.abs(bertkit.embed(LONG, out, truncate=False) - whole).max() < 1e-6
    assert np.abs(bertkit.embed(LONG, out) - whole).max() > 1e-3  # by default: cut where the folder says
    with pytest.raises(BertkitError, match="no windows"):
        bertkit.embed(LONG, out, truncate=False, stride=8)


def test_model2vec_reads_a_folder_bertkit_wrote_with_bertkits_vectors(distilled, tok, tmp_path):
    # model2vec reads a sentence-transformers folder's settings from config_sentence_transformers.json, which named
    # neither: it gave a distilled table's vectors unnormalised (norm ~0.15) and cut every text at 512 tokens
    model2vec = oracle("model2vec", "model2vec")
    out, _ = distilled
    texts = [t for t in TEXTS if "[MASK]" not in t] + ["the unaffable cat", LONG]  # model2vec keeps [MASK]
    assert np.abs(model2vec.StaticModel.from_pretrained(str(out)).encode(texts) - bertkit.embed(texts, out)).max() < 1e-6
    raw = StaticEmbedding(table(len(tok)), normalize=False)
    raw.config.max_length = 40
    write_tokenizer_json(tok, save_static(raw, tmp_path / "raw"), 40)
    texts = [t for t in texts if "\U0001f984" not in t]  # [UNK]: model2vec drops it, sentence-transformers keeps it
    theirs = model2vec.StaticModel.from_pretrained(str(tmp_path / "raw")).encode(texts)
    assert np.abs(theirs - bertkit.embed(texts, tmp_path / "raw")).max() < 1e-6


def test_distill_static_zeroes_unk_so_a_text_points_where_its_known_tokens_do(distilled):
    out, _ = distilled
    loaded = load(out)
    tok, weight = loaded.tokenizer, loaded.model.embedding.weight.detach().numpy()
    ids = tok.ids_batch(["unaffable 東京 zzqxj 🦄"])[0]
    assert tok.unk_token_id in ids and not weight[tok.unk_token_id].any()
    known = weight[[i for i in ids if i != tok.unk_token_id]].mean(axis=0)  # model2vec's mean: [UNK] dropped
    assert np.abs(bertkit.embed("unaffable 東京 zzqxj 🦄", out) - known / np.linalg.norm(known)).max() < 1e-6


def test_distill_static_adds_corpus_words_whole_and_zeroes_unused_rows(distilled):
    out, _ = distilled
    loaded = load(out)
    tok, weight = loaded.tokenizer, loaded.model.embedding.weight.detach()
    assert tok.ids_batch(["unaffable"])[0] == [tok.vocab["unaffable"]] == [len(tok) - 1]
    assert torch.count_nonzero(weight[tok.vocab["[unused5]"]]) == 0 and torch.count_nonzero(weight[tok.cls_token_id]) == 0
    assert torch.count_nonzero(weight[tok.vocab["cat"]]) == 8


@pytest.mark.parametrize("args, words", [
    (["--dim", "33"], "above the model's width (32)"),
    (["--corpus", "EMPTY"], "holds no text"),
    (["--dim", "0"], "--dim must be at least 1"),
    # settings of --fit and --corpus without them were read by nothing: the run went on as if not given
    (["--fit-epochs", "5"], "--fit-epochs 5.0 applies to --fit"),
    (["--seed", "3"], "--seed 3 applies to --fit"),
    (["--min-count", "2"], "--min-count 2 applies to --corpus"),
    (["--max-words", "50"], "--max-words 50 applies to --corpus"),
])
def test_distill_static_bad_input_is_one_line(tiny_dir, tmp_path, capsys, args, words):
    (tmp_path / "empty.txt").write_text("\n \n")
    args = [str(tmp_path / "empty.txt") if a == "EMPTY" else a for a in args]
    assert main(["distill", "static", str(tiny_dir), "-o", str(tmp_path / "out"), "--quiet", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


def test_distill_static_from_a_classifier_or_a_static_model_names_what_it_is(tiny_dir, ours, tmp_path, capsys):
    # a classifier was "not a transformer encoder (a embed model)", while MODEL's help offered a fine-tuned model
    from test_distill_layers import fine_tuned

    from bertkit.model.heads import BertForSequenceClassification

    info = {"task": "classify", "max_length": 32, "text_column": "sentence", "label_column": "label"}
    classifier = fine_tuned(tiny_dir, tmp_path / "cls", BertForSequenceClassification, info, num_labels=2)
    for model, words in ((classifier, "is a fine-tuned classify model"), (ours, "holds a static embedding model")):
        assert main(["distill", "static", str(model), "-o", str(tmp_path / "out"), "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and "distill static needs" in err and "\n" not in err, err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):
        main(["distill", "static", "--help"])
    assert "fine-tuned" not in capsys.readouterr().out


def test_serve_answers_a_static_model_with_bertkits_vectors(ours, tiny_dir):
    from test_serve import AUTH, KEY, Server, call

    server = Server(ours, "--api-key", KEY)
    try:
        status, _, body = call(server.port, "POST", "/embed", {"inputs": TEXTS[:4]}, AUTH)
        assert status == 200
        assert np.abs(np.array(body) - bertkit.embed(TEXTS[:4], ours)).max() < 1e-6
        status, _, body = call(server.port, "POST", "/v1/embeddings", {"input": TEXTS[0]}, AUTH)
        assert status == 200 and len(body["data"][0]["embedding"]) == 12
        # /info says it is a static table (a mean of rows), without the transformer's layers and combine: it gave
        # "layers": [0], "combine": "sum", which mean nothing for a table
        info = call(server.port, "GET", "/info", headers=AUTH)[2]
        assert info["static"] is True and not {"layers", "combine"} & set(info), info
        assert (info["dimensions"], info["pooling"], info["normalize"]) == (12, "mean", True)
    finally:
        server.terminate()
        server.proc.wait(30)
    from bertkit.serve.runner import load_runner
    from bertkit.serve.settings import ServeConfig

    encoder = load_runner(ServeConfig(model=str(tiny_dir))).info()  # a transformer's keeps them
    assert encoder["static"] is False and encoder["layers"] == [2] and encoder["combine"] == "sum", encoder


# --- finetune embed --static ---------------------------------------------------------------------

PAIRS = [("a cat sat on the mat", "the cat is sitting"), ("dogs run in the park", "a dog running outside"),
         ("the stock market fell", "shares dropped today"), ("a red car", "an automobile painted red")]


def static_run(tmp_path, model, **options):
    from bertkit.tasks import finetune
    from bertkit.tasks.config import TrainConfig
    from bertkit.training.optim import OptimConfig

    (tmp_path / "pairs.tsv").write_text("anchor\tpositive\n" + "".join(f"{a}\t{p}\n" for a, p in PAIRS))
    training = TrainConfig(epochs=2, batch_size=4, seed=0, progress=False, device="cpu",
                           optim=OptimConfig(learning_rate=0.1, warmup_ratio=0.0, weight_decay=0.0))
    finetune("embed", train=str(tmp_path / "pairs.tsv"), output=str(tmp_path / "out"), model=str(model),
             training=training, log=lambda s: None, static=True, **options)
    return [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]


def test_static_training_starts_from_the_table_with_the_hand_computed_loss(ours, tok, tmp_path):
    before = load(ours).model.embedding.weight.detach().clone()
    log = [r for r in static_run(tmp_path, ours) if r["split"] == "train"]

    def mean(text):
        return before[tok.ids_batch([text])[0]].mean(dim=0)

    a = torch.nn.functional.normalize(torch.stack([mean(x) for x, _ in PAIRS]), dim=1)
    p = torch.nn.functional.normalize(torch.stack([mean(y) for _, y in PAIRS]), dim=1)
    want = torch.nn.functional.cross_entropy(20.0 * a @ p.T, torch.arange(len(PAIRS)))
    assert abs(log[0]["loss"] - float(want)) < 1e-5
    assert log[1]["loss"] < log[0]["loss"]
    after = load(tmp_path / "out").model.embedding.weight.detach()
    seen = sorted({i for x, y in PAIRS for i in tok.ids_batch([x, y])[0]})
    unseen = torch.ones(len(tok), dtype=torch.bool)
    unseen[seen] = False
    assert torch.equal(after[unseen], before[unseen])  # a row moves only when its token is in a batch
    assert not torch.equal(after[seen], before[seen])


def test_static_training_cuts_where_the_model_it_saves_cuts(distilled, tmp_path):
    # it trained (and scored its dev set) at 256 tokens, finetune embed's default for a transformer without a
    # layout, and saved a model cutting at its start's 512; an explicit --max-length was not saved either
    start, _ = distilled
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    static_run(tmp_path / "a", start)
    assert json.loads((tmp_path / "a" / "out" / "metrics.json").read_text())["max_length"] == 512
    assert load(tmp_path / "a" / "out").max_length == 512
    static_run(tmp_path / "b", start, max_length=8)
    assert json.loads((tmp_path / "b" / "out" / "metrics.json").read_text())["max_length"] == 8
    assert load(tmp_path / "b" / "out").max_length == 8 == truncation_length(tmp_path / "b" / "out" / "0_StaticEmbedding")


def test_a_static_model_where_a_transformer_is_needed_names_the_static_way(ours, tmp_path, capsys):
    # finetune embed without --static said "not supported ... use sentence-transformers for this model"
    (tmp_path / "pairs.tsv").write_text("".join(f"{x}\t{y}\n" for x, y in PAIRS))
    code = main(["finetune", "embed", "--train", str(tmp_path / "pairs.tsv"), "--model", str(ours),
                 "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "static embedding model" in err and "--static" in err and "sentence-transformers for" not in err


TRAIN_FILES = {  # a small valid training file of each task: the model is refused, not the data
    "classify": ("t.tsv", "sentence\tlabel\na cat\t0\na dog\t1\n"),
    "pair": ("t.tsv", "sentence1\tsentence2\tlabel\na cat\ta dog\t0\na car\tan auto\t1\n"),
    "regression": ("t.tsv", "sentence\tlabel\na cat\t0.5\nan auto\t4.0\n"),
    "multi-label": ("t.tsv", "sentence\tlabels\na cat\tpet\na dog\tpet,loud\n"),
    "ner": ("t.conll", "EU B-ORG\nrejects O\nGerman B-MISC\n\nPeter B-PER\nBlackburn I-PER\n\n"),
    "qa": ("t.json", json.dumps({"data": [{"title": "t", "paragraphs": [{"context": "The cat sat on the mat.", "qas": [
        {"id": "1", "question": "Where did the cat sit?", "answers": [{"text": "the mat", "answer_start": 15}]}]}]}]})),
    "rerank": ("t.tsv", "query\tpassage\tlabel\ncats\ta cat sat\t1\ncats\tstocks fell\t0\n"),
}


@pytest.mark.parametrize("task", TRAIN_FILES)
def test_fine_tuning_a_static_model_says_it_needs_a_transformer(ours, tmp_path, capsys, task):
    # finetune classify (and every task with a head) said "has no vocab.txt; pass a model directory or a
    # vocab.txt file": the folder is a model directory, of a kind that has no layers to fine-tune
    name, text = TRAIN_FILES[task]
    (tmp_path / name).write_text(text)
    code = main(["finetune", task, "--train", str(tmp_path / name), "--model", str(ours),
                 "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "holds a static embedding model" in err and "fine-tuning needs a transformer" in err, err
    assert not (tmp_path / "out" / "model.safetensors").exists()


@pytest.mark.parametrize("method", ["bert", "electra"])
def test_continued_pre_training_from_a_static_model_says_it_needs_a_transformer(ours, tmp_path, method):
    # pretrain run --init-from STATIC said "no vocab.txt there, so its vocabulary cannot be checked"
    from bertkit.pretraining.run_config import RunConfig
    from bertkit.pretraining.train import build_model

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "vocab.txt").write_text("\n".join(Tokenizer.from_pretrained().ids_to_tokens) + "\n")
    cfg = RunConfig(data=str(tmp_path / "data"), output=str(tmp_path / "out"), method=method, init_from=str(ours))
    with pytest.raises(BertkitError, match=r"holds a static embedding model .*pre-training \(--init-from\) needs a transformer"):
        build_model(cfg, 30522, "none")


def test_static_training_from_scratch_saves_a_folder_sentence_transformers_reads(st, tiny_dir, tmp_path):
    static_run(tmp_path, tiny_dir, static_dim=6)
    out = tmp_path / "out"
    assert load(out).model.config.hidden_size == 6 and load(out).model.config.max_length == 512
    texts = [x for x, _ in PAIRS] + [LONG]
    assert np.abs(bertkit.embed(texts, out) - st.SentenceTransformer(str(out), device="cpu").encode(texts)).max() < 1e-6


@pytest.mark.parametrize("flags, batch, rate, decay", [
    ([], 2048, 0.05, 0.0),  # the static recipe's own defaults (tasks.config.STATIC_RECIPE)
    (["--batch-size", "3", "--learning-rate", "0.2", "--weight-decay", "0.01"], 3, 0.2, 0.01),  # given flags win
])
def test_cli_static_training_takes_the_static_recipes_defaults(ours, tmp_path, flags, batch, rate, decay):
    (tmp_path / "pairs.tsv").write_text("anchor\tpositive\n" + "".join(f"{a}\t{p}\n" for a, p in PAIRS))
    assert main(["finetune", "embed", "--static", "--train", str(tmp_path / "pairs.tsv"), "--model", str(ours),
                 "-o", str(tmp_path / "out"), "--no-progress", "--device", "cpu", *flags]) == 0
    training = json.loads((tmp_path / "out" / "run_config.json").read_text())["training"]
    assert (training["batch_size"], training["optim"]["learning_rate"], training["optim"]["weight_decay"]) == \
        (batch, rate, decay)
    assert training["epochs"] == 1.0  # the embed task's default under the preset


def test_index_and_search_run_a_static_model(ours, tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("The cat sat on the mat.\n")
    (docs / "b.txt").write_text("Quantum computers use qubits.\n")
    assert main(["index", str(docs), "-o", str(tmp_path / "i"), "--model", str(ours)]) == 0
    capsys.readouterr()
    assert main(["search", str(tmp_path / "i"), "The cat sat on the mat.", "-k", "1"]) == 0
    assert "[a#0]" in capsys.readouterr().out


def test_a_static_output_another_run_wrote_meanwhile_is_refused_and_this_model_is_kept(tok, tmp_path, monkeypatch):
    # two `distill static -o X` at once: both found X new; the one that finished second died on
    # output.rmdir() ("[Errno 39] Directory not empty", an OSError traceback) and its model was deleted
    import bertkit.distill.static as static

    out, written = tmp_path / "out", static.write_tokenizer_json

    def and_the_other_run_finishes(*args):
        written(*args)
        out.mkdir()
        (out / "modules.json").write_text("[]")  # the other run's model, moved into place first

    monkeypatch.setattr(static, "write_tokenizer_json", and_the_other_run_finishes)
    model = StaticEmbedding(torch.randn(len(tok), 8), normalize=True)
    with pytest.raises(BertkitError, match="was written by another process while this one ran") as refused:
        static._save(model, tok, out)
    assert (out / "modules.json").read_text() == "[]"  # the other run's folder, untouched
    kept = Path(str(refused.value).split("kept in ")[1].split(":")[0])
    assert kept.parent == tmp_path and load(str(kept)).task == "static"  # this run's model, whole and loadable


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_static_output_another_run_is_writing_keeps_this_model_beside_it(tok, tmp_path, overwrite):
    """Two `distill static -o X` saving in the same second: the second found X's lock held and was refused ("X is
    being written by another process right now"), its freshly distilled model lost; with --overwrite still so (the
    refusal was kept there: write_folder's replace). It cannot take X now, so its folder is kept beside it, named
    in the one line, whole and loadable; the other run's write (and, with --overwrite, what X held) is left alone."""
    import fcntl
    import os

    import bertkit.distill.static as static

    out = tmp_path / "out"
    if overwrite:  # the model --overwrite replaces
        write_tokenizer_json(tok, save_static(StaticEmbedding(table(len(tok), 8), normalize=True), out))
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    other = os.open(tmp_path / "out.tmp.lock", os.O_WRONLY | os.O_CREAT)  # the other run, saving into X now
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        model = StaticEmbedding(torch.randn(len(tok), 8), normalize=True)
        with pytest.raises(BertkitError, match="by another process") as refused:
            static._save(model, tok, out, overwrite=overwrite)
    finally:
        os.close(other)
    kept = Path(str(refused.value).split("kept in ")[1].split(":")[0])
    assert kept.parent == tmp_path and load(str(kept)).task == "static"  # this run's model, whole and loadable
    assert np.array_equal(bertkit.embed(TEXTS[:2], str(kept)), bertkit.embed(TEXTS[:2], (model, tok)))
    after = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if kept not in p.parents)
    assert after == sorted([*before, kept.name, "out.tmp.lock"])  # X untouched


def test_distill_static_into_a_folder_it_wrote_needs_overwrite(tiny_dir, tmp_path, capsys):
    """A second `distill static -o OUT` was refused with no way but deleting OUT by hand ("choose a new -o folder"),
    where every other command that writes a model takes --overwrite. With it the folder is replaced whole (the new
    settings' table, nothing of the old left beside it, no work folder left in the parent); the teacher's own
    folder is still refused, and without --overwrite the folder is untouched."""
    from bertkit.cli import main

    out = tmp_path / "out"
    run = ["distill", "static", str(tiny_dir), "-o", str(out), "--quiet"]
    assert main([*run, "--dim", "8"]) == 0
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (out / "notes.txt").write_text("the user's own file in the old folder\n")
    assert main([*run, "--dim", "4"]) == 2
    assert "already exists and is not an empty folder: choose a new -o folder, or pass --overwrite to replace it" in \
        capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "notes.txt"} == before
    assert main([*run, "--dim", "4", "--overwrite"]) == 0
    assert load(out).model.config.hidden_size == 4 and not (out / "notes.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no work or replaced folder left beside it
    assert main(["distill", "static", str(out), "-o", str(out), "--overwrite", "--quiet"]) == 2
    assert "is the folder of the model being distilled" in capsys.readouterr().err


def test_the_vocabulary_of_a_static_folder_is_named_where_a_command_asks_for_one(distilled, capsys):
    """The chain `distill static` -> `tokenize --vocab OUT` (and `vocab check`, `pretrain prepare --vocab`): the
    folder every model command reads was refused with "has no vocab.txt; pass a model directory", which it is.
    Its tokenizer is in its module folder: the one line names it, and tokenizing with that folder gives what the
    Rust tokenizer (oracle) gives from the tokenizer.json, the corpus word distill added as one token."""
    from bertkit.cli import main

    tokenizers = oracle("tokenizers", "tokenizers")
    out, _ = distilled
    for argv in (["tokenize", "--vocab", str(out), "the unaffable cat"], ["vocab", "check", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(out / "0_StaticEmbedding") in err, err
    assert main(["tokenize", "--vocab", str(out / "0_StaticEmbedding"), "the unaffable cat", "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    rust = tokenizers.Tokenizer.from_file(str(out / "0_StaticEmbedding" / "tokenizer.json")).encode("the unaffable cat")
    assert ours["input_ids"] == rust.ids and "unaffable" in ours["tokens"]


def test_distill_takes_its_model_as_the_other_commands_do(tmp_path, capsys):
    """finetune, pretrain run, embed and index take the model as --model; distill took it only as its first
    argument, and `bertkit distill static --model DIR -o OUT` was 'unrecognized arguments: --model DIR'. Both forms
    are taken (the old one keeps working, test_distill_static_into_a_folder_it_wrote_needs_overwrite): the table
    made has a row per word of DIR's handmade vocabulary, not of the default model's 30,522. Both at once is one
    line, exit 2; so for distill layers."""
    from test_finetune import tiny_model_dir

    from bertkit.cli import main

    tiny_dir = tiny_model_dir(tmp_path / "tiny")

    assert main(["distill", "static", "--model", str(tiny_dir), "-o", str(tmp_path / "out"), "--dim", "8",
                 "--quiet"]) == 0
    report = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert report["rows"] == len((tiny_dir / "vocab.txt").read_text(encoding="utf-8").split()) < 100
    assert load(tmp_path / "out").model.config.hidden_size == 8
    for kind in ("static", "layers"):
        with pytest.raises(SystemExit) as stop:
            main(["distill", kind, str(tiny_dir), "--model", str(tiny_dir), "-o", str(tmp_path / "both")])
        err = capsys.readouterr().err.strip()
        assert stop.value.code == 2 and "argument --model: not allowed with argument MODEL" in err, err
    assert not (tmp_path / "both").exists()
