"""Feature extraction: layer strategies, pooling, word alignment, windows, streaming, writers.

Most tests use a tiny random model of odd shape (5 layers, hidden 32, 4 heads,
intermediate 37) with the real uncased vocabulary, so a swapped dimension or a
wrong layer shows up. Every expected value is computed here directly from the
model's hidden states, with the layer lists written out by hand from the
paper's Table 7 (not taken from bertkit.embeddings.settings.STRATEGIES).
"""

import copy
import json
import os

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.embeddings.features import embed, iter_embed, load_encoder
from bertkit.embeddings.pooling import pool_words
from bertkit.embeddings.settings import resolve_layers
from bertkit.data.textfiles import read_texts
from bertkit.runtime.devices import auto_dtype, dtype_name
from bertkit.data.vector_files import write_vectors

L = 5  # layers of the tiny model


@pytest.fixture(scope="module")
def tiny():
    from bertkit.model.config import BertConfig
    from bertkit.model.modeling import BertModel
    from bertkit.text.tokenizer import Tokenizer

    config = BertConfig(hidden_size=32, num_hidden_layers=L, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64)
    model = BertModel(config, generator=torch.Generator().manual_seed(0)).eval()
    return model, Tokenizer.from_pretrained()


@pytest.fixture
def collect():
    """gc.collect over what the test makes: everything alive before it is frozen first (gc.freeze), so a
    collection skips the suite's imported modules and objects. A full collection in a worker that has run
    many test files took 0.3-0.5 s, and the tests below collect once per batch or row (30 collections: ~10 s
    a test). Cycles among the objects made since are collected as before; the frozen ones when it ends."""
    import gc

    gc.freeze()
    try:
        yield gc.collect
    finally:
        gc.unfreeze()


def hidden_states(pair, text, text_pair=None):
    """All L+1 hidden states of one text, run alone: [L+1, T, H]."""
    model, tok = pair
    enc = tok.encode(text, text_pair)
    with torch.no_grad():
        out = model(torch.tensor([enc.input_ids]), token_type_ids=torch.tensor([enc.token_type_ids]),
                    output_hidden_states=True)
    return torch.stack(out.hidden_states)[:, 0].numpy(), enc


TEXT = "The quick brown fox jumps over the unaffable dog."

# Table 7 of the paper, written out for L = 5 (index 0 = embeddings, 5 = last layer)
BY_HAND = {
    "first": lambda h: h[0],
    "last": lambda h: h[5],
    "sum_all": lambda h: h[1] + h[2] + h[3] + h[4] + h[5],
    "second_to_last": lambda h: h[4],
    "sum_last_four": lambda h: h[2] + h[3] + h[4] + h[5],
    "concat_last_four": lambda h: np.concatenate([h[5], h[4], h[3], h[2]], axis=-1),
}


@pytest.mark.parametrize("name", list(BY_HAND))
def test_named_strategies_equal_the_direct_computation(tiny, name):
    h, _ = hidden_states(tiny, TEXT)
    got = embed(TEXT, tiny, layers=name, pooling=None)
    np.testing.assert_allclose(got, BY_HAND[name](h), rtol=0, atol=1e-5)


def test_explicit_layer_lists_with_sum_mean_concat(tiny):
    h, _ = hidden_states(tiny, TEXT)
    got = embed(TEXT, tiny, layers=[0, -1, 2], combine="sum", pooling=None)
    np.testing.assert_allclose(got, h[0] + h[5] + h[2], atol=1e-5)
    got = embed(TEXT, tiny, layers="1,3", combine="mean", pooling=None)
    np.testing.assert_allclose(got, (h[1] + h[3]) / 2, atol=1e-5)
    got = embed(TEXT, tiny, layers=[-2, 1], pooling=None)  # concat is the default for lists
    np.testing.assert_allclose(got, np.concatenate([h[4], h[1]], -1), atol=1e-5)
    got = embed(TEXT, tiny, layers=3, pooling=None)
    np.testing.assert_allclose(got, h[3], atol=1e-5)


def test_sentence_pooling_cls_mean_and_normalisation(tiny):
    h, enc = hidden_states(tiny, TEXT)
    last = h[5]
    np.testing.assert_allclose(embed(TEXT, tiny, pooling="cls"), last[0], atol=1e-5)
    mean = last.sum(0) / len(enc.input_ids)  # every token, [CLS] and [SEP] included
    np.testing.assert_allclose(embed(TEXT, tiny), mean, atol=1e-5)
    unit = embed(TEXT, tiny, normalize=True)
    np.testing.assert_allclose(unit, mean / np.linalg.norm(mean), atol=1e-6)
    assert abs(np.linalg.norm(unit) - 1) < 1e-6


def test_pairs_use_segment_ids(tiny):
    h, enc = hidden_states(tiny, "Who sat?", "The cat sat.")
    assert 1 in enc.token_type_ids
    got = embed(["Who sat?"], tiny, pairs=["The cat sat."], pooling="cls")
    np.testing.assert_allclose(got[0], h[5][0], atol=1e-5)


def test_batched_length_sorted_equals_one_by_one(tiny):
    texts = ["a b", TEXT, "Short.", "A somewhat longer sentence about Bert, Ernie and a hat.", "x"]
    together = embed(texts, tiny, layers="sum_last_four", batch_size=2)
    alone = np.stack([embed(t, tiny, layers="sum_last_four") for t in texts])
    assert together.shape == (5, 32)
    np.testing.assert_allclose(together, alone, atol=2e-5)


def test_sentence_vectors_pooled_a_batch_at_a_time_equal_each_text_run_alone(tiny):
    # the ids-only tokenizer path and the batch pooling against encode's ids run one text at a time, by hand
    model, tok = tiny
    texts = [TEXT, "a b", "Short.", "word " * 30 + "end", "\u00dcn\u00efc\u00f6d\u00e9  accents\tand\u3000odd   spaces, \u6771\u4eac!",
             "x", "don't   stop-me now\n"]
    for cut in ({}, {"max_length": 16, "truncate": True}):
        alone = {}
        for t in texts:
            enc = tok.encode(t, max_length=cut.get("max_length", 64), truncation=True)
            with torch.no_grad():
                alone[t] = model(torch.tensor([enc.input_ids])).last_hidden_state[0].numpy()  # [T, H]
        for pooling, by_hand in (("mean", lambda h: h.mean(0)), ("max", lambda h: h.max(0)), ("cls", lambda h: h[0])):
            got = embed(texts, tiny, pooling=pooling, normalize=True, batch_size=3, **cut)
            want = np.stack([by_hand(alone[t]) for t in texts])
            np.testing.assert_allclose(got, want / np.linalg.norm(want, axis=1, keepdims=True), atol=1e-5)
        tokens = embed(texts, tiny, pooling=None, batch_size=3, **cut)
        assert [len(x) for x in tokens] == [len(alone[t]) for t in texts]


def test_streaming_reads_lazily_and_keeps_order(tiny):
    texts = [f"sentence number {i} " + "word " * (i % 7) for i in range(11)]
    pulled = []

    def source():
        for t in texts:
            pulled.append(t)
            yield t

    stream = iter_embed(source(), load_encoder(tiny), chunk_size=4, batch_size=3)
    first = next(stream)
    assert len(pulled) == 4  # only the first chunk was read
    rest = list(stream)
    np.testing.assert_allclose(np.stack([first, *rest]), embed(texts, tiny), atol=2e-5)


def test_embed_copies_each_vector_into_its_result_and_keeps_no_other(tiny, monkeypatch, collect):
    # bertkit.embed listed every row, then np.stack copied them: the vectors were held twice at the end (the
    # default model's 1M texts: 1.5 GB of rows and a 1.5 GB array); a row no longer needed is now let go
    import weakref

    import bertkit.embeddings.features as features

    texts = [f"text number {i}" for i in range(7)]
    want, kept, real = embed(texts, tiny), [], features.iter_embed

    def rows(*args, **kwargs):
        for row in real(*args, **kwargs):
            collect()
            kept.append(sum(ref() is not None for ref in refs))  # earlier rows still alive when this one comes
            row = row.copy()
            refs.append(weakref.ref(row))
            yield row

    refs = []
    monkeypatch.setattr(features, "iter_embed", rows)
    np.testing.assert_array_equal(embed(texts, tiny), want)
    assert max(kept) <= 2, kept  # the first row and the one before: a constant, not every row


@pytest.mark.parametrize("pooling", ["mean", "words"])
def test_where_names_a_text_only_when_an_error_asks(tiny, pooling):
    # `bertkit embed` names a text's line with where(i), which reads the file again up to line i: it was called
    # for every text (twice for word vectors), so 20,000 lines took minutes and 4x the lines took ~16x the time
    asked = []

    def where(i):
        asked.append(i)
        return f"in.txt:{i + 1}"

    texts = [f"sentence number {i}" for i in range(9)]
    list(iter_embed(texts, load_encoder(tiny), pooling=pooling, chunk_size=4, where=where))
    assert asked == []  # no error, no line looked up
    with pytest.raises(BertkitError, match="in.txt:3: cannot embed an empty text"):
        list(iter_embed(["one", "two", " ", "four"], load_encoder(tiny), pooling=pooling, where=where))


# --- word vectors ---------------------------------------------------------------------


def test_word_vectors_pool_the_pieces_of_each_input_word(tiny):
    model, tok = tiny
    words = ["He", "was", "unaffable", "."]
    h, enc = hidden_states(tiny, "He was unaffable .")
    # the google-research/bert README example: unaffable -> una ##ffa ##ble
    assert enc.tokens == ["[CLS]", "he", "was", "una", "##ffa", "##ble", ".", "[SEP]"]
    last = h[5]
    mean = embed([words], tiny, pooling="words")[0]
    assert mean.shape == (4, 32)
    np.testing.assert_allclose(mean[0], last[1], atol=1e-5)
    np.testing.assert_allclose(mean[2], last[3:6].mean(0), atol=1e-5)
    np.testing.assert_allclose(mean[3], last[6], atol=1e-5)
    first = embed([words], tiny, pooling="words", word_pooling="first")[0]
    np.testing.assert_allclose(first[2], last[3], atol=1e-5)
    # a plain string's words (BERT's, here its whitespace words) align the same way
    np.testing.assert_allclose(embed("He was unaffable .", tiny, pooling="words"), mean, atol=1e-6)


def test_a_strings_words_are_berts_words_as_transformers_numbers_them(tiny, default_model_dir, transformers_mod):
    """A string's words are the BasicTokenizer's (whitespace, each punctuation character, each CJK ideograph: the
    words BertTokenizerFast's word_ids() numbers). They were its whitespace words: "Hello, world!" gave 2 vectors,
    'hello' averaged with ',', and a Chinese sentence without spaces one vector for the whole sentence."""
    fast = transformers_mod.BertTokenizerFast.from_pretrained(str(default_model_dir))
    cut = {"max_length": 16, "truncate": True}
    for text, kwargs in (("Hello, world!", {}), ("我爱北京 Paris.", {}), ("it'll rain", {}),
                         ("Café  déjà-vu [MASK] x\x00y", {}), ("Hello, world! " * 20, cut)):
        hf = fast(text, **({"truncation": True, "max_length": 16} if kwargs else {}))
        word_ids = hf.word_ids()
        tokens = embed(text, tiny, pooling=None, **kwargs)  # [T, D]: the same tokens, [CLS] and [SEP] included
        assert len(tokens) == len(word_ids)
        n = max(w for w in word_ids if w is not None) + 1  # a cut text: the words read
        expected = np.stack([tokens[[t for t, w in enumerate(word_ids) if w == k]].mean(0) for k in range(n)])
        got = embed(text, tiny, pooling="words", **kwargs)
        assert got.shape == (n, 32), (text, got.shape, n)
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert [tuple(hf.word_to_chars(w)) for w in range(4)] == [(0, 5), (5, 6), (7, 12), (12, 13)]  # Hello , world !


def test_a_pre_split_word_the_tokenizer_splits_further_stays_one_word(tiny):
    h, enc = hidden_states(tiny, "it'll rain")
    assert enc.tokens == ["[CLS]", "it", "'", "ll", "rain", "[SEP]"]
    got = embed([["it'll", "rain"]], tiny, pooling="words")[0]
    assert got.shape == (2, 32)
    np.testing.assert_allclose(got[0], h[5][1:4].mean(0), atol=1e-5)


def test_pool_words_by_hand():
    vectors = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    token_words = [None, 0, 1, 1, 1, None]
    np.testing.assert_array_equal(pool_words(vectors, token_words, 3),
                                  [[2, 3], [6, 7], [0, 0]])  # word 2 has no piece: zeros
    np.testing.assert_array_equal(pool_words(vectors, token_words, 3, "first"), [[2, 3], [4, 5], [0, 0]])
    # pieces out of order (a pair's second segment maps to no word): the first piece is the earliest token
    np.testing.assert_array_equal(pool_words(vectors, [1, 0, 1, None, 0, None], 2, "first"), [[2, 3], [0, 1]])


# --- long inputs ------------------------------------------------------------------------------


def test_long_input_takes_each_token_from_its_max_context_window(tiny):
    model, tok = tiny
    text = " ".join(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"] * 2)
    ids = tok.encode(text, max_length=512, truncation=False).input_ids
    content = ids[1:-1]
    assert len(content) == 14
    got = embed(text, tiny, pooling=None, max_length=10, stride=4)  # windows of 8 content tokens
    assert got.shape == (16, 32)
    windows = [(0, 8), (4, 8), (8, 6)]
    owner = [0] * 6 + [1] * 4 + [2] * 4
    outs = []
    with torch.no_grad():
        for start, n in windows:
            window_ids = [ids[0], *content[start:start + n], ids[-1]]
            outs.append(model(torch.tensor([window_ids])).last_hidden_state[0].numpy())
    np.testing.assert_allclose(got[0], outs[0][0], atol=1e-5)  # [CLS] of the first window
    np.testing.assert_allclose(got[-1], outs[2][-1], atol=1e-5)  # [SEP] of the last
    for p in range(14):
        start = windows[owner[p]][0]
        np.testing.assert_allclose(got[1 + p], outs[owner[p]][1 + p - start], atol=1e-5)
    # a text that fits one window is not windowed at all
    np.testing.assert_allclose(embed(text, tiny, pooling=None, max_length=16),
                               embed(text, tiny, pooling=None), atol=1e-6)


@pytest.mark.parametrize("pooling", [None, "words", "mean"])
def test_a_chunk_lets_go_of_each_texts_windows_once_the_text_is_put_together(tiny, monkeypatch, collect, pooling):
    """A chunk's windows were all held until its last forward pass, then stitched and pooled: per-token vectors of
    long texts took ~3x the chunk's output in memory (`bertkit embed long160.txt --pooling none --max-length 256`:
    maxrss 803 MB for 40 texts of 800 words, 1,336 MB for 160; the windows overlap by half, and the stitched copy
    comes on top). Each text is now stitched and pooled as soon as its last window has run, and its windows let go:
    at the last forward pass only the windows of texts not yet whole are alive. The vectors are unchanged."""
    import weakref

    import bertkit.embeddings.features as features

    texts = [" ".join(f"word{i}" for i in range(k, k + 30)) for k in range(6)]  # ~60+ pieces each: 5+ windows of 16
    want = embed(texts, tiny, pooling=pooling, max_length=16, chunk_size=1)  # one text at a time: nothing to hold
    real, made, alive_at_last = features.run_batch, [], []

    def run_batch(model, pieces, *args):
        collect()
        alive_at_last[:] = [ref for ref, _ in made if ref() is not None]
        out = real(model, pieces, *args)
        made.extend((weakref.ref(v), p.item) for v, p in zip(out, pieces))
        return out

    monkeypatch.setattr(features, "run_batch", run_batch)
    got = embed(texts, tiny, pooling=pooling, max_length=16, batch_size=2)
    windows = len(made)
    assert windows > 4 * len(texts)  # every text windowed
    # the last pass runs the last 2 of the longest windows: alive beside it at most those of the texts it completes
    # (all but 2 of 5+ each for 2 texts), never the chunk's (was: every window but the last pass's)
    assert len(alive_at_last) <= 2 * 6, (len(alive_at_last), windows)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_beyond_512_tokens_is_windowed_with_the_default_model():
    text = "the hat " * 300  # 600 content tokens
    vectors = embed(text, pooling=None)
    assert vectors.shape == (602, 384)
    assert np.isfinite(vectors).all()
    truncated = embed(text, pooling=None, truncate=True)
    assert truncated.shape == (512, 384)


# --- errors -----------------------------------------------------------------------------------


def test_max_pooling_and_the_default_without_a_layout(tiny):
    h, _ = hidden_states(tiny, TEXT)
    np.testing.assert_allclose(embed(TEXT, tiny, pooling="max"), h[5].max(axis=0), atol=1e-5)
    # a model with no sentence-transformers layout: the tokens' mean, not normalised
    np.testing.assert_allclose(embed(TEXT, tiny), h[5].mean(axis=0), atol=1e-5)


def test_bad_input_gets_clear_errors(tiny):
    with pytest.raises(BertkitError, match="empty text"):
        embed("", tiny)
    with pytest.raises(BertkitError, match="empty text"):
        embed(["fine", "   "], tiny)
    with pytest.raises(BertkitError, match="no texts"):
        embed([], tiny)
    for pooling in ("mean", "words"):  # the ids-only path and encode's
        with pytest.raises(BertkitError, match="yields no tokens"):
            embed(["fine", "\x00\ufffd"], tiny, pooling=pooling)
    with pytest.raises(BertkitError, match=r"layer index 6 is out of range.*5 layers"):
        embed("hi", tiny, layers=[6])
    with pytest.raises(BertkitError, match="layer index -7 is out of range"):
        embed("hi", tiny, layers="-7")
    with pytest.raises(BertkitError, match="unknown layer strategy 'sum_last_five'"):
        embed("hi", tiny, layers="sum_last_five")
    with pytest.raises(BertkitError, match="unknown pooling"):
        embed("hi", tiny, pooling="median")
    with pytest.raises(BertkitError, match="already fixes"):
        embed("hi", tiny, layers="sum_all", combine="concat")
    with pytest.raises(BertkitError, match="pairs are not windowed"):
        embed(["word " * 40], tiny, pairs=["other " * 40], max_length=32)
    with pytest.raises(BertkitError, match="max_length 600"):
        embed("hi", tiny, max_length=600)


def test_an_error_about_one_text_of_a_list_names_its_position(tiny):
    """embed(list) said "cannot embed an empty text" with no hint which of the texts it was (the command line names
    file:line; a list of 10,000 texts named none): texts[i] now, on every path that refuses a text."""
    texts = ["fine", "also fine", "   ", "more"]
    for pooling in ("mean", "words", None):  # the ids-only batch path, encode's path (words, tokens)
        with pytest.raises(BertkitError, match=r"^texts\[2\]: cannot embed an empty text"):
            embed(texts, tiny, pooling=pooling)
        with pytest.raises(BertkitError, match=r"^texts\[1\]: text '\\x00' yields no tokens"):
            embed(["fine", "\x00", "more"], tiny, pooling=pooling)
    with pytest.raises(BertkitError, match=r"^texts\[1\]: cannot embed an empty text"):
        embed([["EU", "rejects"], []], tiny, pooling="words")  # pre-split words
    with pytest.raises(BertkitError, match=r"^texts\[1\]: a pre-split text must be a list of strings"):
        embed([["EU"], ["x", 3]], tiny, pooling="words")
    with pytest.raises(BertkitError, match=r"^texts\[1\]: the second segment \(pair\) is empty"):
        embed(["a", "b"], tiny, pairs=["c", " "])
    # texts past the first chunk are counted from the list's start, not the chunk's
    with pytest.raises(BertkitError, match=r"^texts\[5\]: cannot embed an empty text"):
        embed(["a", "b", "c", "d", "e", ""], tiny, chunk_size=2)
    with pytest.raises(BertkitError, match=r"^cannot embed an empty text"):  # one string: nothing to point at
        embed(" ", tiny)



def test_bad_types_are_named_not_a_python_traceback(tiny):
    """Each once failed with a TypeError or IndexError from inside (or, for bytes, said "got int": it
    iterated the bytes), or silently paired each text with one character of a str of pairs."""
    cases = [
        (lambda: embed(b"hello", tiny), "texts must be a str or a list of str, got bytes: decode it first"),
        (lambda: embed(None, tiny), "texts must be a str or a list of str, got NoneType"),
        (lambda: embed(["a", "b"], tiny, pairs="cd"), "pairs must be a list of str .* got a str"),
        (lambda: embed(["a"], tiny, batch_size="4"), "batch_size must be an int of at least 1, got '4'"),
        (lambda: embed(["a"], tiny, batch_size=2.5), "batch_size must be an int of at least 1, got 2.5"),
        (lambda: embed(["a"], tiny, chunk_size=0), "chunk_size must be an int of at least 1, got 0"),
        (lambda: embed(["a"], tiny, max_length="8"), "max_length '8' must be an int between 3"),
        (lambda: embed(["a"], tiny, stride="2", truncate=False), "stride must be an int"),
        (lambda: embed("a", tiny, layers=None), "layers must be a strategy name .* got None"),
        # sentence-transformers' way to write a pair, read here as pre-split words: "Who sat? The cat sat." in
        # one segment, silently another vector than the pair's (test_features_oracle: pairs= equals its pair)
        (lambda: embed(["a", ("Who sat?", "The cat sat.")], tiny),
         r"texts\[1\] is a tuple: give a text pair's second texts as pairs=\[\.\.\.\] \(one per text\); pre-split "
         "words as a list"),
    ]
    for call, message in cases:
        with pytest.raises(BertkitError, match=message):
            call()
    with pytest.raises(TypeError, match="embed\\(\\) got an unexpected keyword argument 'batchsize'; it takes "
                                        "batch_size, chunk_size"):
        embed("a", tiny, batchsize=8)  # was named as iter_embed's, after the model loaded
    # what works stays working: a generator of texts and of pairs
    want = embed(["a b", "c d"], tiny, pairs=["e", "f"])
    np.testing.assert_array_equal(embed((t for t in ["a b", "c d"]), tiny, pairs=iter(["e", "f"])), want)


def test_settings_for_loading_beside_a_loaded_model_are_refused(tiny):
    """embed(texts, model=bertkit.load(..., dtype="auto"), dtype="float32") ran the loaded bfloat16 model and
    int8=True was ignored: the model is already loaded, so where and in what it runs was decided then."""
    from bertkit.runtime.loading import load

    model, tok = tiny
    loaded = load((copy.deepcopy(model), tok), dtype="bfloat16")  # cast in place: a copy
    for option in ({"dtype": "float32"}, {"int8": True}, {"device": "cpu"}):
        with pytest.raises(BertkitError, match=f"model is already loaded .*bfloat16.*: {next(iter(option))}= applies "
                                               r"when embed loads it; pass it to bertkit.load\(\) instead"):
            embed(["a b"], loaded, **option)
    assert embed(["a b"], loaded, dtype=None, int8=False).shape == (1, 32)  # the defaults ask for nothing


def test_a_task_model_embeds_with_its_encoder(tiny):
    """A head (a fine-tuned classifier, as bertkit.load returns it) in place of the encoder: its encoder's
    vectors, as embedding its directory gives; once an AttributeError (a HeadOutput has no hidden states)."""
    from bertkit.model.heads import BertForSequenceClassification

    model, tok = tiny
    head = BertForSequenceClassification(model.config, generator=torch.Generator().manual_seed(1)).eval()
    head.bert.load_state_dict(model.state_dict())
    texts = ["the cat sat on the mat", "a dog"]
    np.testing.assert_array_equal(embed(texts, (head, tok)), embed(texts, tiny))
    np.testing.assert_array_equal(embed(texts, (head, tok), pooling=None)[1], embed(texts, tiny, pooling=None)[1])


def test_strategies_need_four_layers():
    with pytest.raises(BertkitError, match="needs at least 4 layers"):
        resolve_layers("sum_last_four", 2)
    assert resolve_layers("sum_last_four", 4).indices == (1, 2, 3, 4)


# --- writers and readers ---------------------------------------------------------------------


def test_writers_npy_safetensors_jsonl(tiny, tmp_path):
    from safetensors.numpy import load_file

    texts = ["one text", "and another, longer text", "third"]
    pooled = embed(texts, tiny)
    assert write_vectors(iter(pooled), tmp_path / "v.npy", pooled=True) == 3
    np.testing.assert_array_equal(np.load(tmp_path / "v.npy"), pooled)
    write_vectors(iter(pooled), tmp_path / "v.safetensors", pooled=True)
    np.testing.assert_array_equal(load_file(tmp_path / "v.safetensors")["embeddings"], pooled)
    write_vectors(iter(pooled), tmp_path / "v.jsonl", pooled=True, texts=texts)
    records = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert [r["text"] for r in records] == texts
    np.testing.assert_allclose(np.array([r["embedding"] for r in records]), pooled, atol=1e-6)

    tokens = embed(texts, tiny, pooling=None)
    write_vectors(iter(tokens), tmp_path / "t.safetensors", pooled=False)
    loaded = load_file(tmp_path / "t.safetensors")
    offsets = loaded["offsets"]
    assert offsets.tolist() == np.cumsum([0] + [len(t) for t in tokens]).tolist()
    for i, t in enumerate(tokens):
        np.testing.assert_array_equal(loaded["vectors"][offsets[i]:offsets[i + 1]], t)
    with pytest.raises(BertkitError, match="do not fit one .npy"):
        write_vectors(iter(tokens), tmp_path / "t.npy", pooled=False)
    with pytest.raises(BertkitError, match="unknown output format"):
        write_vectors(iter(pooled), tmp_path / "v.csv", pooled=True)


@pytest.mark.parametrize("dtype, shape", [("<f4", (3, 32)), (np.uint16, (2400,)), (np.int64, (101,)),
                                          (np.int32, (0,)), (np.int16, (5, 4))])
def test_the_npy_header_written_before_streamed_data_is_np_saves(tmp_path, dtype, shape):
    """The .npy header bertkit writes before data it streams itself (embed's vectors, pre-training's shards and
    corpus) is one function, and to the byte np.save's (the oracle: numpy); it was written twice, by
    data.vector_files (float32 only) and by pretraining.shards."""
    import io

    from bertkit.data.vector_files import npy_header
    from bertkit.pretraining.shards import save_npy

    array = np.arange(int(np.prod(shape))).astype(dtype).reshape(shape)
    np.save(tmp_path / "numpy.npy", array)
    header = io.BytesIO()
    npy_header(header, array.dtype, array.shape)
    assert (tmp_path / "numpy.npy").read_bytes() == header.getvalue() + array.tobytes()
    save_npy(tmp_path / "ours.npy", array)
    assert (tmp_path / "ours.npy").read_bytes() == (tmp_path / "numpy.npy").read_bytes()


def test_texts_cut_at_the_layouts_max_seq_length_are_counted_in_one_warning(tiny_dir, tmp_path, monkeypatch):
    """A model's sentence vectors are made at its sentence-transformers max_seq_length, and a longer text is cut
    there (sentence-transformers' rule, kept); nothing said so, and `bertkit embed` of a book's chapters wrote each
    chapter's first page. One warning counts the texts cut. Reference: each text's whole encoding (no truncation)
    against max_seq_length 12; 12 tokens fit, 13 do not. The vectors are the ones truncate=True makes, which is
    asked for and so not warned of, and truncate=False windows them: nothing is cut."""
    import shutil
    import warnings

    from test_search import ReadOnce

    from bertkit.cli import main
    from bertkit.model.sentence_layout import write_layout
    from bertkit.text.tokenizer import Tokenizer

    folder = tmp_path / "model"
    shutil.copytree(tiny_dir, folder)
    write_layout(folder, pooling="mean", normalize=True, max_seq_length=12, hidden_size=32)
    tok = Tokenizer.from_pretrained(folder)
    texts = ["the hat", "the hat " * 5, "the hat " * 5 + "red", "the red hat sat on the mat . " * 9]
    cut = sum(len(tok.encode(t, truncation=False)) > 12 for t in texts)
    assert [len(tok.encode(t, truncation=False)) for t in texts[1:3]] == [12, 13] and cut == 2
    with pytest.warns(UserWarning, match=rf"^{cut} of 4 texts are longer than the 12 tokens the model reads "
                      r"\(its max length\), and it read them cut there") as said:
        vectors = embed(texts, str(folder))
    assert len(said) == 1 and "truncate=False" in str(said[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asked for: no warning
        np.testing.assert_array_equal(vectors, embed(texts, str(folder), truncate=True))
        embed(texts, str(folder), truncate=False)
    # a pair takes the tokenizer's other path: [CLS] A [SEP] B [SEP] over 12 tokens is cut too
    pairs = ["the hat", "the hat", "the hat", "the"]
    cut = sum(len(tok.encode(t, p, truncation=False)) > 12 for t, p in zip(texts, pairs))
    watch = ReadOnce(monkeypatch)
    with pytest.warns(UserWarning, match=rf"^{cut} of 4 texts are longer than the 12 tokens"):
        embed(texts, str(folder), pairs=pairs)
    assert not watch.read  # counted from the encodings themselves, not read toward the cut a second time
    monkeypatch.undo()
    # the command says it once (on standard error, as `bertkit: warning: ...`)
    src = tmp_path / "texts.txt"
    src.write_text("".join(t + "\n" for t in texts))
    with pytest.warns(UserWarning, match=r"^2 of 4 texts are longer than the 12 tokens the model reads "
                      r"\(its max length\), and it read them cut there") as said:
        assert main(["embed", str(src), "-o", str(tmp_path / "v.npy"), "--model", str(folder), "--quiet"]) == 0
    assert len(said) == 1 and "--no-truncate" in str(said[0].message)


def test_a_stride_beside_truncation_is_refused_not_ignored():
    """The default model's sentence vectors are cut at 256 tokens, so a stride (the overlap of windows) did
    nothing, silently; with windows asked for it applies."""
    long_text = "word " * 400
    with pytest.raises(BertkitError, match="stride=100 applies to windows"):
        embed([long_text], stride=100)
    with pytest.raises(BertkitError, match="stride=100 applies to windows"):
        embed([long_text], stride=100, truncate=True, pooling=None)
    assert not np.allclose(embed([long_text], stride=100, truncate=False), embed([long_text], stride=10,
                                                                                 truncate=False))


def test_word_pooling_beside_other_vectors_is_refused_not_ignored(tiny, tiny_dir, tmp_path, capsys):
    """word_pooling= (`--word-pooling`) says how a word's pieces make the word's vector: beside sentence or token
    vectors it changed nothing, silently (`bertkit embed s.txt -o v.npy --word-pooling first` wrote the mean
    vectors); with pooling='words' it applies ("unaffable" is three pieces: the first is not their mean)."""
    from bertkit.cli import main

    for pooling in ("mean", "cls", None):
        with pytest.raises(BertkitError, match=r"^word_pooling='first' \(--word-pooling\) .*pooling='words'"):
            embed("it'll rain", tiny, pooling=pooling, word_pooling="first")
    first, mean = (embed("unaffable rain", tiny, pooling="words", word_pooling=w) for w in ("first", "mean"))
    assert first.shape == mean.shape == (2, 32) and not np.allclose(first[0], mean[0])
    np.testing.assert_array_equal(mean, embed("unaffable rain", tiny, pooling="words"))
    (tmp_path / "s.txt").write_text("it'll rain\n")
    assert main(["embed", str(tmp_path / "s.txt"), "-o", str(tmp_path / "v.npy"), "--model", str(tiny_dir),
                 "--word-pooling", "first", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertkit: error: word_pooling='first'") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "v.npy").exists()


def test_read_texts_formats(tmp_path):
    (tmp_path / "a.txt").write_text("first line\n\nsecond line\n")
    (tmp_path / "b.tsv").write_text("sentence\tlabel\nit 's good\t1\nbad\t0\n")
    (tmp_path / "c.jsonl").write_text('{"text": "x y"}\n{"text": "z"}\n')
    for name, expected in [("a.txt", ["first line", "second line"]), ("b.tsv", ["it 's good", "bad"]),
                           ("c.jsonl", ["x y", "z"])]:
        texts, count = read_texts(tmp_path / name)
        assert list(texts) == expected and count == 2
    with pytest.raises(BertkitError, match="no column 'text'"):
        read_texts(tmp_path / "b.tsv", column="text")
    with pytest.raises(BertkitError, match="does not exist"):
        read_texts(tmp_path / "missing.txt")
    # a .csv was read one line per text: its header became a text, a quoted comma-holding cell kept its quotes
    (tmp_path / "d.csv").write_text('id,text\n1,"Hello, world"\n\n2,plain\n', encoding="utf-8")
    texts, count = read_texts(tmp_path / "d.csv")
    assert list(texts) == ["Hello, world", "plain"] and count == 2
    with pytest.raises(BertkitError, match="no column 'sentence'; its columns are id, text"):
        read_texts(tmp_path / "d.csv", column="sentence")
    # and --column on a plain text file was silently ignored
    with pytest.raises(BertkitError, match="a.txt is read one text per line: --column applies to .tsv, .csv"):
        read_texts(tmp_path / "a.txt", column="sentence")
    # embed's CSV reader is the tables' one (data.textfiles.csv_records): a text longer than the csv module's
    # 131,072-character field limit is read (it was a csv.Error traceback), and a record is numbered by the line
    # it starts on (it was the line it ends on)
    from bertkit.data.textfiles import numbered_texts
    (tmp_path / "e.csv").write_text('text,n\n"' + "word " * 30000 + '",1\n"two\nlines",2\nlast,3\n', encoding="utf-8")
    assert [(n, len(t)) for n, t in numbered_texts(tmp_path / "e.csv")()] == [(2, 150000), (3, 9), (5, 4)]



def test_a_table_without_a_sentence_or_text_column_is_read_from_its_one_column_of_text(shared_data, tmp_path, capsys):
    """A table without a 'sentence' or 'text' column was read from its first column, whatever it held: `bertkit
    embed captions_val2017.tsv` (image_id, caption_id, caption) embedded the image ids, a qrels file its query ids,
    and an STS-B or MRPC file (sentence1, sentence2, ...) its first sentences alone, each without a word. The one
    column of text is read (predict's rule for a table, `bertkit.data.tables.text_column_of`); several, or none,
    are refused in one line naming the columns and --column, before the model loads."""
    from bertkit.cli import main

    def head(source, name, n=6):
        lines = (shared_data / source).read_text(encoding="utf-8").splitlines()[:n]
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        return tmp_path / name, [line.split("\t") for line in lines]

    captions, rows = head("pairs/coco_captions/captions_val2017.tsv", "captions.tsv")
    assert rows[0] == ["image_id", "caption_id", "caption"]
    texts, count = read_texts(captions)
    assert list(texts) == [r[2] for r in rows[1:]] and count == 5
    csv_copy = tmp_path / "captions.csv"
    csv_copy.write_text("".join(",".join(r[:2] + ['"' + r[2] + '"']) + "\n" for r in rows), encoding="utf-8")
    assert list(read_texts(csv_copy)[0]) == [r[2] for r in rows[1:]]
    for source, says in (("stsb/dev.tsv", "several columns of text ('sentence1', 'sentence2')"),
                         ("retrieval/scifact/qrels/test.tsv", "no column of text")):
        path, rows = head(source, source.replace("/", "-"))
        assert main(["embed", str(path), "-o", str(tmp_path / "v.npy"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert says in err and "--column" in err and ", ".join(rows[0]) in err and err.count("\n") == 1, err
        assert list(read_texts(path, column=rows[0][1])[0]) == [r[1] for r in rows[1:]]  # a named one is read
    assert not (tmp_path / "v.npy").exists()
    (tmp_path / "one.tsv").write_text("review\n12\ngood film\n")  # one column: read whatever its first cell holds
    assert list(read_texts(tmp_path / "one.tsv")[0]) == ["12", "good film"]
    (tmp_path / "rte.tsv").write_text("premise\tlabel\nA man sleeps.\tentailment\n")  # a label is no text to embed
    assert list(read_texts(tmp_path / "rte.tsv")[0]) == ["A man sleeps."]


def test_a_json_file_is_read_as_json_lines_not_as_one_text(shared_data, tmp_path, capsys):
    """A .json file was read as plain text, one text per line: `bertkit embed dev-v1.1.json` (SQuAD, one JSON
    document on one line) wrote one vector, of the raw JSON, without a word. It is read as JSON Lines (what
    datasets' `to_json` writes under .json): its objects' 'text' fields; a single document like SQuAD's is
    refused in one line, before the model loads."""
    import json

    from bertkit.cli import main

    squad = json.loads((shared_data / "squad_v1.1" / "dev-v1.1.json").read_text(encoding="utf-8"))
    squad["data"] = squad["data"][:1]
    (tmp_path / "squad.json").write_text(json.dumps(squad), encoding="utf-8")
    assert main(["embed", str(tmp_path / "squad.json"), "-o", str(tmp_path / "v.npy"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "squad.json:1: no field 'text'" in err and "JSON Lines" in err and err.count("\n") == 1, err
    assert not (tmp_path / "v.npy").exists()
    contexts = [p["context"] for p in squad["data"][0]["paragraphs"][:3]]
    (tmp_path / "lines.json").write_text("".join(json.dumps({"text": c}) + "\n" for c in contexts), encoding="utf-8")
    texts, count = read_texts(tmp_path / "lines.json")
    assert list(texts) == contexts and count == 3


def test_cli_embed_refuses_a_bad_input_file_before_the_model_loads(tmp_path, capsys):
    # JSON lines named .tsv were embedded as texts, each its raw JSON (the first column of a one-column
    # "table"), and exited 0; the model loaded before the input was opened. --model names no folder here.
    from bertkit.cli import main

    (tmp_path / "rows.tsv").write_text('{"text": "a good film", "label": "pos"}\n{"text": "bad", "label": "neg"}\n')
    (tmp_path / "texts.tsv").write_text("review\nit was fine\n")
    (tmp_path / "header.tsv").write_text("sentence\tlabel\n")
    for name, words in (("rows.tsv", "holds JSON lines, not a TSV table (its first line is a JSON object): "
                                     "name it .jsonl"),
                        ("missing.txt", "does not exist"), ("header.tsv", "header.tsv holds no texts: write one")):
        assert main(["embed", str(tmp_path / name), "-o", str(tmp_path / "v.npy"), "--model",
                     str(tmp_path / "none")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
        assert not (tmp_path / "v.npy").exists()
    texts, count = read_texts(tmp_path / "texts.tsv")  # a one-column table is still read by its first column
    assert list(texts) == ["it was fine"] and count == 1


def test_cli_embed_says_which_lines_its_rows_are_when_blank_lines_were_skipped(tiny, tmp_path, capsys):
    # a blank line has no vector: row 1 was the file's line 3 and nothing said so
    from bertkit.model.checkpoint import save_pretrained
    from bertkit.cli import main

    save_pretrained(tiny[0], tmp_path / "tiny", tokenizer=tiny[1])
    (tmp_path / "in.txt").write_text("first\n\n  \nfourth\n")
    out = tmp_path / "out.jsonl"
    assert main(["embed", str(tmp_path / "in.txt"), "-o", str(out), "--model", str(tmp_path / "tiny"), "--quiet",
                 "--dtype", "float32"]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"wrote 2 vectors to {out}") and "2 blank lines skipped" in last
    np.testing.assert_allclose([json.loads(x)["embedding"] for x in out.read_text().splitlines()][1],
                               embed("fourth", tiny), atol=1e-5)


def test_cli_embed_names_the_line_of_a_jsonl_text_that_is_no_string(tiny_dir, tmp_path, capsys):
    # "expected a string (or a list of words), got int", and no line: the file's 2nd line holds {"text": 5}
    from bertkit.cli import main

    (tmp_path / "in.jsonl").write_text('{"text": "fine"}\n{"text": 5}\n', encoding="utf-8")
    assert main(["embed", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "v.npy"), "--model", str(tiny_dir),
                 "--quiet", "--dtype", "float32"]) == 2
    assert f"{tmp_path / 'in.jsonl'}:2: expected a string (or a list of words), got int" in capsys.readouterr().err


ZERO_WIDTH_FILES = {  # a text of only a zero-width space among others: the line it is on, counted in the file
    "in.txt": "first\n\nsecond\n\u200b\nthird\n",
    "in.tsv": "id\tsentence\n1\tfirst\n\n2\tsecond\n3\t\u200b\n",
    "in.jsonl": '{"text": "first"}\n\n{"text": "second"}\n{"text": "\u200b"}\n',
}


@pytest.mark.parametrize("name", ZERO_WIDTH_FILES)
@pytest.mark.parametrize("kind", ["transformer", "static"])
def test_cli_embed_names_the_line_of_a_text_without_tokens(tiny_dir, tmp_path, capsys, name, kind):
    # the error named the text ('\u200b') but not where it was: a job on a million lines stopped on a line
    # nobody could find
    import torch
    from bertkit.cli import main
    from bertkit.model.static import StaticEmbedding, save_static
    from bertkit.text.tokenizer import Tokenizer
    from bertkit.text.tokenizer_json import write_tokenizer_json

    model = tiny_dir
    if kind == "static":
        tok, model = Tokenizer.from_pretrained(tiny_dir), tmp_path / "static"
        write_tokenizer_json(tok, save_static(StaticEmbedding(torch.randn(len(tok), 8)), model))
    text = ZERO_WIDTH_FILES[name]
    (tmp_path / name).write_text(text, encoding="utf-8")
    line = text.split("\n").index(next(x for x in text.split("\n") if "\u200b" in x)) + 1
    assert main(["embed", str(tmp_path / name), "-o", str(tmp_path / "v.npy"), "--model", str(model), "--quiet",
                 "--dtype", "float32"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{tmp_path / name}:{line}: text '\\u200b' yields no tokens" in err and "\n" not in err, err


def test_cli_embed(tiny, tmp_path, capsys):
    from bertkit.model.checkpoint import save_pretrained
    from bertkit.cli import main

    model, tok = tiny
    model_dir = tmp_path / "tiny"
    save_pretrained(model, model_dir, tokenizer=tok)
    texts = ["Bert notices the hat.", "Ernie knows.", "it'll lead to some ridiculous stuff"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    out = tmp_path / "out.npy"
    assert main(["embed", str(tmp_path / "in.txt"), "-o", str(out), "--model", str(model_dir),
                 "--layers", "concat_last_four", "--pooling", "cls", "--normalize", "--quiet", "--dtype", "float32"]) == 0
    expected = embed(texts, tiny, layers="concat_last_four", pooling="cls", normalize=True)
    np.testing.assert_allclose(np.load(out), expected, atol=1e-5)  # --dtype float32 is exact
    # the default precision, auto: bf16 where this CPU has it natively, within cosine 0.999 of float32
    assert main(["embed", str(tmp_path / "in.txt"), "-o", str(out), "--model", str(model_dir),
                 "--layers", "concat_last_four", "--pooling", "cls", "--normalize", "--quiet"]) == 0
    assert (np.load(out) * expected).sum(axis=1).min() > 0.999
    assert np.load(out).dtype == np.float32  # what the file holds, whatever computed it: the message says both
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"wrote 3 vectors to {out} (float32 values, computed in " \
                                              f"{dtype_name(auto_dtype())})"
    assert main(["embed", str(tmp_path / "in.txt"), "-o", str(tmp_path / "w.jsonl"), "--model", str(model_dir),
                 "--layers=-1,-2", "--combine", "sum", "--pooling", "words", "--quiet"]) == 0
    rows = [json.loads(x)["vectors"] for x in (tmp_path / "w.jsonl").read_text().splitlines()]
    assert [len(r) for r in rows] == [5, 3, 8]  # BERT's words: Bert notices the hat . | Ernie knows . | it ' ll ...
    # without the `=` too (argparse alone reads "-1,-2" as an unknown option)
    assert main(["embed", str(tmp_path / "in.txt"), "-o", str(tmp_path / "w2.jsonl"), "--model", str(model_dir),
                 "--layers", "-1,-2", "--combine", "sum", "--pooling", "words", "--quiet"]) == 0
    assert (tmp_path / "w2.jsonl").read_text() == (tmp_path / "w.jsonl").read_text()
    capsys.readouterr()
    assert main(["embed", str(tmp_path / "in.txt"), "-o", str(out), "--model", str(model_dir),
                 "--layers", "9", "--quiet"]) == 2
    assert "layer index 9 is out of range" in capsys.readouterr().err
    assert main(["embed", str(tmp_path / "nope.txt"), "-o", str(out)]) == 2


def test_cli_embed_per_token_files_say_which_token_each_row_is(tiny_dir, tmp_path, capsys):
    """Per-token vectors (--pooling none) came without their tokens: a .jsonl row held "vectors" alone and a
    .safetensors `vectors` and `offsets`, so a reader had to tokenize again, and `bertkit tokenize --json` gives a
    row for a blank line (embed skips it) and cuts at 512 (embed windows a long text): rows and tokens misaligned.
    Now a .jsonl row holds "tokens" (strings) and a .safetensors `token_ids` [sum T_i] (the model's vocab.txt line
    numbers), both beside each vector row, [CLS] and [SEP] included; read here with json and safetensors alone."""
    from safetensors.numpy import load_file

    from bertkit.cli import main
    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(tiny_dir)
    texts = ["The bank of the river flooded.", "Unaffable tokenizers split words into pieces " * 6]
    (tmp_path / "in.txt").write_text(f"{texts[0]}\n\n{texts[1]}\n")  # a blank line: no row
    encodings = [tok.encode(t) for t in texts]  # uncut: the long text's windows give every token a row
    assert len(encodings[1].input_ids) > 40  # beyond --max-length 24: windowed
    expected = embed(texts, str(tiny_dir), pooling=None, max_length=24)
    base = ["embed", str(tmp_path / "in.txt"), "--model", str(tiny_dir), "--pooling", "none", "--max-length", "24",
            "--quiet", "--dtype", "float32"]
    assert main([*base, "-o", str(tmp_path / "t.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [r["tokens"] for r in rows] == [e.tokens for e in encodings]
    assert rows[0]["tokens"][0] == "[CLS]" and rows[0]["tokens"][-1] == "[SEP]"
    for row, want in zip(rows, expected):
        np.testing.assert_allclose(row["vectors"], want, atol=1e-6)
    assert main([*base, "-o", str(tmp_path / "t.safetensors")]) == 0
    tensors = load_file(str(tmp_path / "t.safetensors"))
    offsets, ids = tensors["offsets"], tensors["token_ids"]
    assert ids.dtype == np.int64 and ids.shape == (tensors["vectors"].shape[0],)
    for i, e in enumerate(encodings):
        assert ids[offsets[i]:offsets[i + 1]].tolist() == e.input_ids
        np.testing.assert_allclose(tensors["vectors"][offsets[i]:offsets[i + 1]], expected[i], atol=1e-6)
    vocab = (tiny_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert [vocab[k] for k in ids[offsets[0]:offsets[1]]] == encodings[0].tokens
    # per word and pooled files are as they were: a word's row is the text's whitespace word, no ids
    words = [*base[:4], "--pooling", "words", "--quiet", "-o", str(tmp_path / "w.safetensors")]
    assert main(words) == 0
    assert set(load_file(str(tmp_path / "w.safetensors"))) == {"vectors", "offsets"}
    # the Python side: iter_embed(with_ids=True) pairs each text's token vectors with its ids, per token only
    (vectors, ids), = iter_embed([texts[1]], load_encoder(str(tiny_dir)), pooling=None, max_length=24, with_ids=True)
    assert ids == encodings[1].input_ids and vectors.shape[0] == len(ids)
    with pytest.raises(BertkitError, match="with_ids .* per-token vectors"):
        next(iter_embed(texts, load_encoder(str(tiny_dir)), pooling="mean", with_ids=True))


def test_cli_embed_counts_the_rows_its_csv_reader_skipped_not_the_files_blank_lines(tiny_dir, tmp_path, capsys):
    # the note "N blank lines skipped, so row i is the i-th text" counted the file's blank lines, not the
    # records the CSV reader left out: a blank line inside a quoted cell (one text) was said to be skipped,
    # and a row of empty cells (",") was skipped unsaid, so the vectors' rows were not the rows the note named
    from bertkit.cli import main

    for body, texts, skipped in [('text,id\n"first\n\nparagraph",1\nsecond,2\n', 2, 0),
                                 ('text,id\nfirst,1\n,\nthird,3\n', 2, 1)]:
        (tmp_path / "in.csv").write_text(body, encoding="utf-8")
        assert main(["embed", str(tmp_path / "in.csv"), "-o", str(tmp_path / "v.npy"), "--model", str(tiny_dir),
                     "--quiet", "--dtype", "float32"]) == 0
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert np.load(tmp_path / "v.npy").shape[0] == texts
        assert ("skipped" in last) == bool(skipped) and (not skipped or f"{skipped} blank line skipped" in last), last


@pytest.mark.parametrize("name, body, skipped", [("in.txt", "first\n\n  \nfourth\n", 2),
                                                  ("in.csv", 'text,id\nfirst,1\n,\nthird,3\n', 1)])
def test_cli_embed_reads_its_input_file_twice_its_blank_records_counted_on_the_first_pass(tiny_dir, tmp_path, capsys,
                                                                                         monkeypatch, name, body,
                                                                                         skipped):
    """embed reads a file twice by design (counted first: the progress bar's total, the plan; then the texts,
    streamed), and read it a third time, whole, after the last vector, only to count the blank records it had left
    out (blank_lines). The first pass counts them now: 3 -> 2 whole passes (opens at textfiles.open_text read to
    the end; a CSV's header is peeked apart), the same note and rows (reference: the blank records by hand)."""
    from contextlib import contextmanager

    import bertkit.data.textfiles as textfiles
    from bertkit.cli import main

    src = tmp_path / name
    src.write_text(body, encoding="utf-8")
    passes, open_text = [], textfiles.open_text

    @contextmanager
    def counted(path, *args, **kwargs):
        with open_text(path, *args, **kwargs) as f:
            yield f
            passes.append(str(path) == str(src) and f.read(1) == "")  # read to its end

    monkeypatch.setattr(textfiles, "open_text", counted)
    assert main(["embed", str(src), "-o", str(tmp_path / "v.npy"), "--model", str(tiny_dir), "--quiet",
                 "--dtype", "float32"]) == 0
    assert passes.count(True) == 2  # main: 3
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert np.load(tmp_path / "v.npy").shape[0] == 2 and f"{skipped} blank line{'s' if skipped > 1 else ''} skipped" in last


def test_a_model_folder_written_again_is_read_again_not_served_from_the_cache(tmp_path):
    """embed keeps the last models it loaded, by folder: a notebook that fine-tuned into out/, embedded, fine-tuned
    into out/ again (--overwrite) and embedded again got the first model's vectors, silently (a new process, the
    CLI, gave the second's). The trace's cache held the first model the same way."""
    from bertkit.explain.tracing import trace
    from bertkit.model.config import BertConfig
    from bertkit.model.modeling import BertModel
    from bertkit.text.tokenizer import Tokenizer

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64)
    tok = Tokenizer.from_pretrained()

    def write(seed):
        model = BertModel(config, generator=torch.Generator().manual_seed(seed)).eval()
        model.save_pretrained(tmp_path, tokenizer=tok)
        return model

    first = write(0)
    np.testing.assert_allclose(embed(TEXT, str(tmp_path)), embed(TEXT, (first, tok)), rtol=0, atol=1e-5)
    traced = trace(TEXT, model=tmp_path).token_embeddings
    second = write(1)
    np.testing.assert_allclose(embed(TEXT, str(tmp_path)), embed(TEXT, (second, tok)), rtol=0, atol=1e-5)
    assert not torch.equal(trace(TEXT, model=tmp_path).token_embeddings, traced)


def test_threads_embedding_at_once_load_a_model_once_and_never_lose_it(tiny_dir, tmp_path, monkeypatch):
    """embed's cache of the last two models was read and filled without a lock: threads asking for one folder at
    once (a web app's workers) each loaded it, and a third model's eviction between one thread's check and its read
    could take the entry it was about to return (KeyError). Properties: four threads on one folder load it once;
    threads on three folders (one more than the cache keeps) each get their own model, none fails."""
    import shutil
    import threading
    import time

    from bertkit.embeddings import features

    others = [tmp_path / "b", tmp_path / "c"]
    for other in others:
        shutil.copytree(tiny_dir, other)
    calls = []

    def slow_load(folder, **kwargs):  # the real loader's cost, without its seconds: the threads overlap inside it
        calls.append(folder)
        time.sleep(0.3)
        return ("loaded", folder)

    def at_once(folders):
        start, got, failed = threading.Barrier(len(folders)), [None] * len(folders), []

        def work(i):
            start.wait()
            try:
                got[i] = load_encoder(folders[i])
            except Exception as error:  # noqa: BLE001 - what a thread raised, asserted below
                failed.append(error)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(folders))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failed == []
        assert got == [("loaded", os.path.realpath(f)) for f in folders]

    monkeypatch.setattr(features, "load", slow_load)
    monkeypatch.setattr(features, "_LOADED", {})
    at_once([str(tiny_dir)] * 4)
    assert calls == [os.path.realpath(tiny_dir)]  # one load for the four (main: four)
    monkeypatch.setattr(features, "_LOADED", {})
    at_once([str(tiny_dir), *map(str, others)] * 3)  # which stays cached depends on the threads' order: not asked


def test_cli_embed_reads_standard_input_as_a_txt_file(tiny_dir, tmp_path, capsys, monkeypatch):
    # `tokenize` reads standard input for '-', `embed -` said "input file - does not exist"; it reads the lines
    # as it reads a .txt of the same bytes (blank lines skipped and said, CRLF and a byte order mark dropped)
    import io
    import sys

    from bertkit.cli import main

    data = "\ufeffthe first text\r\n\r\nsecond one\r\n  \nlast".encode("utf-8")
    (tmp_path / "in.txt").write_bytes(data)
    common = ["--model", str(tiny_dir), "--quiet", "--dtype", "float32"]
    assert main(["embed", str(tmp_path / "in.txt"), "-o", str(tmp_path / "file.npy"), *common]) == 0
    from_file = capsys.readouterr().err.strip().splitlines()[-1]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["embed", "-", "-o", str(tmp_path / "stdin.npy"), *common]) == 0
    from_stdin = capsys.readouterr().err.strip().splitlines()[-1]
    np.testing.assert_array_equal(np.load(tmp_path / "stdin.npy"), np.load(tmp_path / "file.npy"))
    assert "wrote 3 vectors" in from_stdin and "2 blank lines skipped" in from_stdin, from_stdin
    assert from_stdin == from_file.replace(str(tmp_path / "file.npy"), str(tmp_path / "stdin.npy"))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"fine\n\xe2\x80\x8b\n")))
    assert main(["embed", "-", "-o", str(tmp_path / "none.npy"), *common]) == 2
    assert "standard input:2: text '\\u200b' yields no tokens" in capsys.readouterr().err


def test_cli_embed_streams_standard_input_instead_of_reading_it_all_first(tiny_dir, tmp_path, monkeypatch, capsys):
    # `embed -` held every line of standard input (to count them, then to read them again): a piped corpus took
    # memory in proportion (+63 MB from 8 to 31 MB of text) and no vector was made before the pipe closed
    import sys

    import bertkit.cli.features as features
    from bertkit.cli import main

    lines = [b"first text\n", b"\n", *[b"text %d\n" % i for i in range(1100)], b"\xe2\x80\x8b\n"]
    read = []

    class Stdin:
        def __init__(self, lines):
            self.buffer = self  # what stdin_lines reads
            self.lines = iter(lines)

        def __iter__(self):
            return self

        def __next__(self):
            line = next(self.lines)
            read.append(line)
            return line

    at_first_row = []

    def write_vectors(rows, path, pooled, **journal):
        rows = iter(rows)
        first = next(rows)
        at_first_row.append(len(read))
        return real(iter([first, *rows]), path, pooled, **journal)

    real = features.write_vectors
    monkeypatch.setattr(features, "write_vectors", write_vectors)
    monkeypatch.setattr(sys, "stdin", Stdin(lines[:-1]))
    assert main(["embed", "-", "-o", str(tmp_path / "v.npy"), "--model", str(tiny_dir), "--quiet"]) == 0
    assert at_first_row[0] < len(lines) - 1  # the first chunk's vectors before the last line was read
    assert np.load(tmp_path / "v.npy").shape[0] == 1101
    monkeypatch.setattr(sys, "stdin", Stdin(lines))  # a line without tokens is still named by its line
    assert main(["embed", "-", "-o", str(tmp_path / "w.npy"), "--model", str(tiny_dir), "--quiet"]) == 2
    assert f"standard input:{len(lines)}: text '\\u200b' yields no tokens" in capsys.readouterr().err


def test_a_string_for_a_switch_is_refused_not_read_as_true(tiny):
    """normalize="false" (a setting read from a config file or an environment variable) normalised every vector:
    a non-empty str is true in Python. A switch takes True or False (numpy's bool too, and None where it means
    "the model's own"); a str is refused naming it. Property: numpy's False gives what False gives."""
    import bertkit

    for name in ("normalize", "truncate", "progress", "int8"):
        with pytest.raises(BertkitError, match=f"{name} must be True or False.*, got 'false'"):
            embed(["a cat"], tiny, **{name: "false"})
    plain = embed(["a cat"], tiny, normalize=False)
    assert abs(float(np.linalg.norm(plain[0])) - 1) > 0.1  # not unit length: what "false" must not give
    np.testing.assert_array_equal(embed(["a cat"], tiny, normalize=np.bool_(False)), plain)
    with pytest.raises(BertkitError, match="int8 must be True or False, got 'no'"):
        bertkit.load(int8="no")
