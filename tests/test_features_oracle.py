"""The default model's sentence embeddings against independent computations.

all-MiniLM-L6-v2's published pipeline (its modules.json) is Transformer ->
mean pooling over the attention mask -> L2 normalisation. We check
`bertkit.embed(..., pooling="mean", normalize=True)` against

- transformers' BertModel with that pooling written out here, and
- sentence-transformers itself loading the same directory offline (when installed),

on real sentences (SST-2 dev, sliced), within 1e-5. Layer strategies are
checked against transformers' hidden states too.
"""

import os

import numpy as np
import pytest

from bertkit.embeddings.features import embed
from conftest import need

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="module")
def sentences(shared_data):
    lines = (shared_data / "sst2" / "dev.tsv").read_text(encoding="utf-8").split("\n")[1:]
    texts = [line.split("\t")[0] for line in lines if line.strip()]
    # a spread of lengths (short and long sentences) plus text the tokenizer has to work on
    picked = texts[:6] + sorted(texts, key=len)[-2:]
    return picked + ["Bert notices the hat, but chooses not to engage Ernie since he knows it'll lead to "
                     "some ridiculous stuff.", "Ünïcödé façade — naïve café!"]


@pytest.fixture(scope="module")
def hf(transformers_mod, default_model_dir):
    model = transformers_mod.BertModel.from_pretrained(str(default_model_dir)).eval()
    tok = transformers_mod.BertTokenizerFast.from_pretrained(str(default_model_dir))
    return model, tok


def test_mean_pooled_normalised_equals_transformers(hf, sentences):
    import torch

    model, tok = hf
    batch = tok(sentences, padding=True, truncation=True, max_length=512, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    mean = (out * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    expected = torch.nn.functional.normalize(mean, p=2, dim=1).numpy()
    got = embed(sentences, pooling="mean", normalize=True, batch_size=4)
    assert got.shape == (len(sentences), 384)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_equals_sentence_transformers(sentences, default_model_dir):
    """With no options, embed follows the model's sentence-transformers layout: mean pooling, normalised,
    cut at its max_seq_length (256), so a text longer than that gives sentence-transformers' vector too."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        need(False, "sentence-transformers (the oracle, dev extra) is not installed")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    st = SentenceTransformer(str(default_model_dir), device="cpu")
    long_text = " ".join(sentences * 20)
    texts = [*sentences, long_text]
    assert len(st.tokenizer(long_text)["input_ids"]) > 400 and st.max_seq_length == 256
    expected = st.encode(texts, batch_size=4, convert_to_numpy=True)
    np.testing.assert_allclose(embed(texts), expected, rtol=0, atol=1e-5)
    # asking for windows embeds the whole long text instead: another vector
    windowed = embed([long_text], truncate=False)[0]
    assert float(windowed @ expected[-1]) < 0.9999
    # a length asked for is sentence-transformers' max_seq_length: the text cut there, as `bertkit evaluate
    # --max-length` cuts it (it was read as a window size: max_length=256, the default spelled out, gave the
    # windowed vector above)
    np.testing.assert_allclose(embed(texts, max_length=256), expected, rtol=0, atol=1e-5)
    st.max_seq_length = 64
    np.testing.assert_allclose(embed(texts, max_length=64), st.encode(texts, batch_size=4), rtol=0, atol=1e-5)
    assert float(embed([long_text], max_length=64, truncate=False)[0] @ expected[-1]) < 0.9999
    # text pairs: sentence-transformers encodes a (first, second) tuple as segments A and B, embed takes the
    # second texts as pairs= (a tuple given as a text is refused: test_features)
    st.max_seq_length = 256
    pairs = [(sentences[0], sentences[1]), (sentences[2], sentences[3])]
    np.testing.assert_allclose(embed([a for a, _ in pairs], pairs=[b for _, b in pairs]), st.encode(pairs),
                               rtol=0, atol=1e-5)


def test_strategies_equal_transformers_hidden_states(hf, sentences):
    import torch

    model, tok = hf
    text = sentences[-2]
    batch = tok(text, return_tensors="pt")
    with torch.no_grad():
        h = [x[0].numpy() for x in model(**batch, output_hidden_states=True).hidden_states]  # 7 x [T, 384]
    need(len(h) == 7, "the default model has 6 layers")
    np.testing.assert_allclose(embed(text, layers="first", pooling=None), h[0], atol=1e-5)
    np.testing.assert_allclose(embed(text, layers="sum_all", pooling=None), sum(h[1:]), atol=1e-4)
    np.testing.assert_allclose(embed(text, layers="concat_last_four", pooling=None),
                               np.concatenate([h[6], h[5], h[4], h[3]], -1), atol=1e-5)
    np.testing.assert_allclose(embed(text, layers="second_to_last", pooling="cls", normalize=False), h[5][0], atol=1e-5)
