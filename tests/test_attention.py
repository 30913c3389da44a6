"""Attention weights, the token finder, the page's data, PNGs, bertviz export, the CLI.

The weights are checked against transformers' attentions for the default model
(the oracle), and by properties a reader can verify: every row sums to 1, and
in a padded batch the padding receives none.
"""

import base64
import json
import re

import numpy as np
import pytest
import torch

from bertkit.explain.attention_view import (
    AttentionMap,
    attention_html,
    attention_map,
    find_heads,
    find_token,
    load_bertviz,
    offset_attention,
    save_bertviz,
    save_html,
    save_png,
    to_bertviz,
)
from bertkit.errors import BertkitError

SENTENCE = "Bert notices the hat, but chooses not to engage Ernie since he knows it'll lead to some ridiculous stuff."


@pytest.fixture(scope="module")
def amap():
    return attention_map(SENTENCE)


@pytest.fixture(scope="module")
def tiny():
    from bertkit.model.config import BertConfig
    from bertkit.model.modeling import BertModel
    from bertkit.text.tokenizer import Tokenizer

    config = BertConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
                        max_position_embeddings=64)
    return BertModel(config, generator=torch.Generator().manual_seed(1)).eval(), Tokenizer.from_pretrained()


@pytest.mark.oracle
def test_weights_equal_transformers(amap, transformers_mod, default_model_dir):
    model = transformers_mod.BertModel.from_pretrained(str(default_model_dir), attn_implementation="eager").eval()
    tok = transformers_mod.BertTokenizerFast.from_pretrained(str(default_model_dir))
    batch = tok(SENTENCE, return_tensors="pt")
    with torch.no_grad():
        expected = torch.stack(model(**batch, output_attentions=True).attentions)[:, 0].numpy()
    assert amap.tokens == tok.convert_ids_to_tokens(batch["input_ids"][0])
    assert amap.weights.shape == (6, 12, 25, 25) == expected.shape
    np.testing.assert_allclose(amap.weights, expected, rtol=0, atol=1e-5)


def test_rows_sum_to_one_and_padding_gets_none(tiny, amap):
    np.testing.assert_allclose(amap.weights.sum(-1), 1.0, atol=1e-5)
    model, tok = tiny
    texts = ["a short one", "a much longer sentence that forces the first one to be padded"]
    batch = tok.encode_batch(texts, padding="longest", return_tensors="pt")
    with torch.no_grad():
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"], output_attentions=True)
    weights = torch.stack(out.attentions)[:, 0].numpy()  # the padded row: [L, N, T, T]
    n = int(batch["attention_mask"][0].sum())
    assert n < weights.shape[-1]
    assert np.abs(weights[:, :, :n, n:]).max() == 0.0  # real tokens give padding nothing
    np.testing.assert_allclose(weights[:, :, :n, :n].sum(-1), 1.0, atol=1e-5)
    # and what the view keeps for the text alone is exactly the unpadded part
    alone = attention_map(texts[0], model=tiny)
    np.testing.assert_allclose(alone.weights, weights[:, :, :n, :n], atol=1e-5)


def test_find_token(amap):
    assert amap.tokens[13] == "he"
    assert find_token(amap, "he") == 13
    assert find_token(amap, "HE") == 13
    assert find_token(amap, "to") == 9 and find_token(amap, "to", occurrence=2) == 19
    with pytest.raises(BertkitError, match="'zebra' occurs nowhere.*ernie"):
        find_token(amap, "zebra")
    with pytest.raises(BertkitError, match="only 1 times"):
        find_token(amap, "he", occurrence=2)
    with pytest.raises(BertkitError, match="empty"):
        find_token(amap, " ")
    pieces = AttentionMap(["[CLS]", "una", "##ffa", "##ble", "[SEP]"], np.zeros((1, 1, 5, 5), np.float32))
    assert find_token(pieces, "unaffable") == 1  # a word rebuilt from its pieces


def test_find_token_takes_the_word_as_the_text_writes_it(tiny, transformers_mod, default_model_dir):
    # the uncased model's tokens are lower-cased and stripped of accents: --token café, as the text writes it,
    # "occurs nowhere in the text; its tokens are: [CLS] the cafe ..."; the word is now compared as the
    # tokenizer reads it (transformers' BertTokenizer's normalisation is the reference)
    text = "The CAFÉ near Müller's naïve façade"
    amap = attention_map(text, model=tiny)
    oracle = transformers_mod.BertTokenizerFast.from_pretrained(str(default_model_dir))
    for word in ("CAFÉ", "café", "Müller", "naïve", "façade"):
        piece = oracle.tokenize(word)[0]
        assert amap.tokens[find_token(amap, word)] == piece, word


def test_dtype_beside_a_loaded_model_is_refused(tiny):
    """attention_map(text, model=bertkit.load(...), dtype="bfloat16") ran the model as loaded (float32) and
    said nothing; as for embed, where and in what a loaded model runs was decided when it was loaded."""
    import copy

    from bertkit.runtime.loading import load

    model, tok = tiny
    loaded = load((copy.deepcopy(model), tok))  # the fast path swaps layers in place: a copy
    with pytest.raises(BertkitError, match=r"model is already loaded \(on cpu, float32\): dtype= applies when "
                                           r"attention_map loads it; pass it to bertkit.load\(\) instead"):
        attention_map("The cat sat.", model=loaded, dtype="bfloat16")
    assert attention_map("The cat sat.", model=loaded).weights.shape[0] == 3


def test_pair_segments_and_bad_input(tiny):
    pair = attention_map("The cat sat.", "It was tired.", model=tiny)
    assert pair.tokens == ["[CLS]", "the", "cat", "sat", ".", "[SEP]", "it", "was", "tired", ".", "[SEP]"]
    assert pair.sentence_b_start == 6
    with pytest.raises(BertkitError, match="empty text"):
        attention_map("", model=tiny)
    with pytest.raises(BertkitError, match="pair.*empty"):
        attention_map("x", " ", model=tiny)
    with pytest.raises(BertkitError, match="has 602 tokens but the model takes at most 64"):
        attention_map("the hat " * 300, model=tiny)
    with pytest.raises(BertkitError, match="layer 3 is out of range"):
        pair.row(3, 0, 0)
    with pytest.raises(BertkitError, match="head 4 is out of range"):
        attention_html(pair, head=4)
    # the wrong type was once "empty text", an AttributeError on the pair, or numpy's IndexError
    with pytest.raises(BertkitError, match="text must be a str .* got list"):
        attention_map(["The cat sat.", "It was tired."], model=tiny)
    with pytest.raises(BertkitError, match="pair must be a str .* got int"):
        attention_map("x", 5, model=tiny)
    with pytest.raises(BertkitError, match=r"token 11 is out of range: the text has 11 tokens, numbered 0..10"):
        pair.row(0, 0, 11)
    with pytest.raises(BertkitError, match="head must be an int or 'mean', got 'max'"):
        pair.row(0, "max", 0)
    np.testing.assert_array_equal(pair.row(0, 0, -1), pair.row(0, 0, 10))  # a negative token counts from the end
    # and so does a negative layer, as in trace and embed (row, the page and the CLI refused -1)
    np.testing.assert_array_equal(pair.row(-1, 0, -1), pair.row(pair.num_layers - 1, 0, 10))
    with pytest.raises(BertkitError, match=r"layer -4 is out of range: this model has 3 layers, numbered 0..2 \(or -3..-1"):
        pair.row(-4, 0, 0)
    data = json.loads(re.search(r'application/json">(.*?)</script>', attention_html(pair, token=-1, layer=-1), re.S).group(1))
    assert (data["layer"], data["token"]) == (pair.num_layers - 1, 10)


def test_html_page_is_self_contained_and_carries_the_weights(amap):
    page = attention_html(amap, token=13, layer=2, head=5)
    # nothing to fetch: no external script, stylesheet, image or URL
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)
    assert "http://" not in page and "https://" not in page and "//cdn" not in page
    data = json.loads(re.search(r'<script id="attention-data" type="application/json">(.*?)</script>',
                                page, re.S).group(1))
    assert data["tokens"] == amap.tokens and (data["layer"], data["head"], data["token"]) == (2, 5, 13)
    weights = np.frombuffer(base64.b64decode(data["weights"]), dtype="<f4").reshape(amap.weights.shape)
    np.testing.assert_array_equal(weights, amap.weights)


@pytest.mark.parametrize("view", ["text", "head", "overview"])
def test_png_views(amap, tmp_path, view):
    import matplotlib.image

    path = save_png(amap, tmp_path / f"{view}.png", view=view, token=13, layer=1, head="mean")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 300
    assert pixels[..., :3].std() > 0.05  # not a blank picture


def test_bertviz_export_has_the_form_head_view_takes(amap, tmp_path):
    args = to_bertviz(amap)
    attention, tokens = args["attention"], args["tokens"]
    # bertviz.util.format_attention: a sequence of 4-d tensors [1, N, T, T], squeezed and stacked
    assert len(attention) == 6 and all(a.dim() == 4 and a.shape == (1, 12, 25, 25) for a in attention)
    stacked = torch.stack([a.squeeze(0) for a in attention])
    np.testing.assert_array_equal(stacked.numpy(), amap.weights)
    assert stacked.shape[-1] == len(tokens) and args["sentence_b_start"] is None
    loaded = load_bertviz(save_bertviz(amap, tmp_path / "bv.json"))
    assert loaded["tokens"] == amap.tokens and loaded["sentence_b_start"] is None
    np.testing.assert_array_equal(torch.stack([a.squeeze(0) for a in loaded["attention"]]).numpy(), amap.weights)


def test_cli_attention(tmp_path, capsys):
    from bertkit.cli import main

    page, png, bv = tmp_path / "page.html", tmp_path / "text.png", tmp_path / "bv.json"
    assert main(["attention", SENTENCE, "--token", "he", "-o", str(page), "--png", str(png),
                 "--bertviz", str(bv), "--layer", "3", "--head", "mean"]) == 0
    assert page.is_file() and png.is_file() and bv.is_file()
    data = json.loads(re.search(r'application/json">(.*?)</script>', page.read_text(), re.S).group(1))
    assert (data["token"], data["layer"], data["head"]) == (13, 3, "mean")
    # stdout names the three tokens "he" attends to most, from the weights the page holds
    row = np.frombuffer(base64.b64decode(data["weights"]), dtype=np.float32).reshape(
        data["layers"], data["heads"], len(data["tokens"]), -1)[3, :, 13].mean(0)
    top = np.argsort(-row)[:3]
    expected = ", ".join(f"{data['tokens'][j]} {row[j]:.2f}" for j in top)
    assert capsys.readouterr().out == f"'he' (token 13), layer 3, head mean: attends most to {expected}\n"
    assert main(["attention", SENTENCE, "--token", "zebra", "-o", str(page)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertkit: error: the token 'zebra' occurs nowhere") and "Traceback" not in err
    assert main(["attention", "", "-o", str(page)]) == 2
    assert main(["attention", "x", "--layer", "6", "-o", str(page)]) == 2
    assert "layer 6 is out of range" in capsys.readouterr().err
    assert main(["attention", SENTENCE, "--token", "he", "--layer", "-1", "-o", str(page), "--png", str(png)]) == 0
    assert capsys.readouterr().out.startswith("'he' (token 13), layer 5, head 0: attends most to ")


def test_an_occurrence_below_one_is_refused_not_counted_from_the_end(amap, tmp_path, capsys, monkeypatch):
    """--occurrence 0 showed the last 'to' and -1 the one before it (hits[occurrence - 1] counts from the end of
    a list), and --occurrence without --token was ignored: the page showed [CLS]."""
    from bertkit.cli import main

    hits = [i for i, t in enumerate(amap.tokens) if t == "to"]
    assert len(hits) == 2 and [find_token(amap, "to", occurrence=n) for n in (1, 2)] == hits
    for n in (0, -1):
        with pytest.raises(BertkitError, match=f"occurrence must be an int of at least 1, got {n}"):
            find_token(amap, "to", occurrence=n)
    # the command says so before the model runs
    monkeypatch.setattr("bertkit.explain.attention_view.attention_map", lambda *a, **k: pytest.fail("the model ran"))
    with pytest.raises(SystemExit) as stop:  # a count below 1, refused by the parser
        main(["attention", SENTENCE, "--token", "to", "--occurrence", "0", "-o", str(tmp_path / "p.html")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("bertkit: error: argument --occurrence: must be at least 1, got 0")
    assert main(["attention", SENTENCE, "--occurrence", "2", "-o", str(tmp_path / "p.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertkit: error: --occurrence 2 counts the occurrences of --token: give --token")
    assert len(err.strip().splitlines()) == 1


def test_a_view_without_a_png_is_refused_not_ignored(tmp_path, capsys, monkeypatch):
    """--view chooses the PNG's view (text, head, overview): without --png it changed nothing, silently (the
    page has every view), as --occurrence without --token did; with --png it applies (its default: text)."""
    from bertkit.cli import main

    monkeypatch.setattr("bertkit.explain.attention_view.attention_map", lambda *a, **k: pytest.fail("the model ran"))
    assert main(["attention", SENTENCE, "--view", "head", "-o", str(tmp_path / "p.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertkit: error: --view head chooses the PNG's view: give --png") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "p.html").exists()


# --- find_heads: where a token looks, over all layers and heads --------------------------


def _weight_by_hand(layer: int, token: str, target: str) -> tuple:
    """softmax(Q K^T / sqrt(D)) of every head of `layer`, recomputed from bertkit.trace's queries and keys
    (not from the attention weights find_heads reads): the weight `token` gives `target`, [N], and the tokens."""
    from bertkit import trace

    t = trace(SENTENCE, layer=layer)
    i, j = t.tokens.index(token), t.tokens.index(target)
    scores = (t.query @ t.key.transpose(1, 2))[:, i, :]  # [N, T]: what token i scores against every token
    return torch.softmax(scores / t.head_size ** 0.5, dim=-1)[:, j], t.num_heads


def test_find_heads_ranks_every_head_by_the_weight_recomputed_from_queries_and_keys():
    hits = find_heads(SENTENCE, "he", "bert")
    by_hand = torch.stack([_weight_by_hand(layer, "he", "bert")[0] for layer in range(6)])  # [L, N]
    assert len(hits) == by_hand.numel() == 6 * 12
    assert [h.weight for h in hits] == sorted((h.weight for h in hits), reverse=True)
    for hit in hits:
        assert hit.attended == "bert"
        assert hit.weight == pytest.approx(float(by_hand[hit.layer, hit.head]), abs=1e-5)
    best = divmod(int(by_hand.argmax()), by_hand.shape[1])
    assert (hits[0].layer, hits[0].head) == best  # the coreference head: layer 3, head 1 from 0
    assert hits[0].weight > 0.5  # more than half of "he" goes to "bert" in that one head


def test_find_heads_without_target_gives_each_heads_favourite(amap):
    hits = find_heads(SENTENCE, "it", top=5)
    it = find_token(amap, "it")
    assert len(hits) == 5
    for hit in hits:
        row = amap.weights[hit.layer, hit.head, it]
        assert hit.weight == pytest.approx(float(row.max())) and hit.attended == amap.tokens[int(row.argmax())]
    assert hits[0].weight == pytest.approx(float(amap.weights[:, :, it].max(axis=-1).max()))
    with pytest.raises(BertkitError, match="occurs nowhere"):
        find_heads(SENTENCE, "he", "zebra")


# --- a masked-LM folder (no pooler) traces and draws ----------------------------------------


def test_masked_lm_folder_without_pooler_traces_and_draws(tmp_path, capsys):
    from bertkit import trace
    from bertkit.cli import main
    from bertkit.model.config import BertConfig
    from bertkit.model.heads import BertForMaskedLM
    from bertkit.text.tokenizer import Tokenizer
    from safetensors.torch import load_file

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "."]
    config = BertConfig(vocab_size=len(vocab), hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
                        intermediate_size=13, max_position_embeddings=16)
    mlm = BertForMaskedLM(config, generator=torch.Generator().manual_seed(0)).eval()
    mlm.save_pretrained(tmp_path, tokenizer=Tokenizer(vocab))
    assert not any("pooler" in k for k in load_file(tmp_path / "model.safetensors"))  # the defect's folder
    ids = torch.tensor([[2, 5, 6, 7, 8, 5, 9, 10, 3]])
    with torch.no_grad():
        own = mlm(ids, output_hidden_states=True, output_attentions=True)
    t = trace("the cat sat on the mat.", layer=1, model=tmp_path)
    assert t.token_ids == ids[0].tolist()
    torch.testing.assert_close(t.hidden_states, torch.stack(own.hidden_states)[:, 0], atol=1e-5, rtol=0)
    torch.testing.assert_close(t.weights, own.attentions[1][0], atol=1e-6, rtol=0)
    amap = attention_map("the cat sat on the mat.", model=tmp_path)
    np.testing.assert_allclose(amap.weights, torch.stack(own.attentions)[:, 0].numpy(), atol=1e-6)
    page = tmp_path / "page.html"
    assert main(["attention", "the cat sat on the mat.", "--token", "cat", "--model", str(tmp_path),
                 "-o", str(page)]) == 0
    assert page.is_file() and "Traceback" not in capsys.readouterr().err


# --- offset_attention: the attention each head gives the previous / next token --------------


def _uniform_over_real(mask: torch.Tensor, layers: int = 1, heads: int = 1) -> torch.Tensor:
    """[L, B, N, T, T] attention spreading every row evenly over the real tokens."""
    rows = mask.float()[:, None, None, :] / mask.sum(1).float()[:, None, None, None]  # [B, 1, 1, T]
    B, T = mask.shape
    return rows.expand(B, heads, T, T)[None].expand(layers, B, heads, T, T)


def test_offset_attention_previous_token_head_scores_one():
    T = 6
    prev = torch.zeros(T, T)
    prev[0, 0] = 1.0
    prev[torch.arange(1, T), torch.arange(T - 1)] = 1.0  # each token looks at the one before it
    w = torch.stack([prev, torch.eye(T)])[None, None]  # [L=1, B=1, N=2, T, T]: head 0 previous, head 1 itself
    np.testing.assert_allclose(offset_attention(w, offset=-1), [[1.0, 0.0]])
    np.testing.assert_allclose(offset_attention(w, offset=+1), [[0.0, 0.0]])


def test_offset_attention_uniform_rows_give_one_over_length_and_skip_padding():
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    got = offset_attention(_uniform_over_real(mask, layers=2, heads=3), mask, offset=-1)
    # queries with a real previous token: 3 in the first sequence (weight 1/4 each), 5 in the second (1/6)
    expected = (3 * (1 / 4) + 5 * (1 / 6)) / 8
    np.testing.assert_allclose(got, np.full((2, 3), expected), rtol=1e-6)


def test_offset_attention_matches_a_loop_over_queries():
    g = torch.Generator().manual_seed(3)
    L, B, N, T = 2, 3, 2, 7
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 5:] = 0
    mask[2, 3:] = 0
    w = torch.rand(L, B, N, T, T, generator=g).softmax(-1)
    for offset in (-2, -1, 1, 3):
        expected = np.zeros((L, N))
        for layer in range(L):
            for head in range(N):
                vals = [w[layer, b, head, i, i + offset].item() for b in range(B) for i in range(T)
                        if 0 <= i + offset < T and mask[b, i] and mask[b, i + offset]]
                expected[layer, head] = np.mean(vals)
        np.testing.assert_allclose(offset_attention(list(w), mask, offset), expected, rtol=1e-5)


def test_offset_attention_finds_the_default_models_positional_heads():
    """Clark et al. 2019: trained BERTs have heads that attend to the previous or next token;
    a randomly initialised one spreads attention about evenly."""
    from bertkit.model.modeling import BertModel
    from bertkit.text.tokenizer import Tokenizer

    model, tok = BertModel.from_pretrained().eval(), Tokenizer.from_pretrained()
    texts = [SENTENCE, "The quick brown fox jumps over the lazy dog.", "It rained all day, so we stayed in."]
    enc = tok.encode_batch(texts, padding=True, return_tensors="pt")
    random = BertModel(model.config, generator=torch.Generator().manual_seed(0)).eval()
    with torch.no_grad():
        trained = model(enc["input_ids"], attention_mask=enc["attention_mask"], output_attentions=True).attentions
        untrained = random(enc["input_ids"], attention_mask=enc["attention_mask"], output_attentions=True).attentions
    assert offset_attention(trained, enc["attention_mask"], -1).max() > 0.9
    assert offset_attention(trained, enc["attention_mask"], +1).max() > 0.5
    uniform = (1 / enc["attention_mask"].sum(1).float()).mean().item()
    assert offset_attention(untrained, enc["attention_mask"], -1).max() < 2 * uniform


def test_offset_attention_rejects_bad_shapes():
    w = torch.full((1, 1, 1, 4, 4), 0.25)
    with pytest.raises(BertkitError, match="offset 4"):
        offset_attention(w, offset=4)
    with pytest.raises(BertkitError, match="attention_mask has shape"):
        offset_attention(w, torch.ones(2, 4), offset=1)
    with pytest.raises(BertkitError, match=r"L x \[B, N, T, T\]"):
        offset_attention(w[0], offset=1)


@pytest.mark.parametrize("name, save", [
    ("page.html", lambda amap, path: save_html(amap, path, 13, 1, 0)),
    ("heads.png", lambda amap, path: save_png(amap, path, view="head", token=13, layer=1, head=0, dpi=40)),
    ("bv.json", save_bertviz)])
def test_a_page_picture_or_bertviz_file_cut_by_a_full_disk_leaves_the_old_one(amap, tmp_path, monkeypatch, name,
                                                                              save):
    """bertkit attention wrote its HTML page, its PNG and its bertviz JSON in place (Path.write_text, savefig to
    the path): a full disk or a kill while writing left the first bytes where the earlier file stood, a page
    that ends mid-script, a PNG no viewer opens, JSON load_bertviz cannot read. The old file now stays byte for
    byte, nothing beside it, and the next write is whole."""
    import builtins
    import io

    from killed_write import stopping_open

    path = tmp_path / name
    path.write_bytes(b"the file an earlier run wrote\n")
    monkeypatch.setattr(builtins, "open", stopping_open(name, 300, None, io.open))
    monkeypatch.setattr(io, "open", builtins.open)
    with pytest.raises(OSError, match="No space left"):
        save(amap, path)
    monkeypatch.undo()
    assert path.read_bytes() == b"the file an earlier run wrote\n"  # was: the first 300 bytes of the new one
    assert [p.name for p in tmp_path.iterdir()] == [name]
    save(amap, path)
    if name.endswith(".png"):
        from PIL import Image

        assert Image.open(path).format == "PNG"
    elif name.endswith(".json"):
        assert load_bertviz(path)["tokens"] == list(amap.tokens)
    else:
        assert path.read_text(encoding="utf-8").rstrip().endswith("</html>")


def test_the_guides_he_numbers_are_these_weights(amap):
    """docs/guide.md section 3 prints the "he" sentence's weights (`find_heads` and `bertkit attention`):
    they must be the float32 weights of `amap`, which test_weights_equal_transformers holds to transformers,
    to the two decimals printed. (The page once showed a bf16 run's 0.57 for the float32 0.58.)"""
    from test_guide import PAGES, _decimals, _lines, console_commands, parse

    blocks = parse(PAGES[0].read_text(encoding="utf-8"))
    commands = [(cmd, out) for b in blocks if b.kind == "console" for cmd, out in console_commands(b.code)
                if cmd.startswith("bertkit attention ")]
    heads = next(b for b in blocks if b.kind == "python" and "find_heads(" in b.code)
    assert commands and heads.expected and f'he_text = "{SENTENCE}"' in heads.code, "the guide's 'he' example moved"

    def printed(shown: str, value: float) -> bool:  # `value` written to the decimals of `shown`
        return abs(float(shown) - value) <= 0.5 * 10.0 ** -_decimals(shown) + 1e-4

    for command, output in commands:
        argv = command.split()
        assert SENTENCE in command and argv[argv.index("--token") + 1] == "he"
        layer = int(argv[argv.index("--layer") + 1]) if "--layer" in argv else 0
        head = int(argv[argv.index("--head") + 1]) if "--head" in argv else 0
        row = amap.weights[layer, head, find_token(amap, "he")]
        shown = re.findall(r"(\S+) (\d\.\d+)", output.split("attends most to", 1)[1])
        order = np.argsort(-row, kind="stable")[:len(shown)]
        assert [t for t, _ in shown] == [amap.tokens[j] for j in order], command
        for (name, number), j in zip(shown, order):
            assert printed(number, row[j]), f"`{command}`: the guide prints {name} {number}, the weight is {row[j]:.4f}"
    for line in _lines(heads.expected):
        word, target, hits = re.match(r"'(\w+)' -> '(\w+)': (.*)", line).groups()
        for layer, head, number in re.findall(r"layer (\d+) head (\d+) (\d\.\d+)", hits):
            value = amap.weights[int(layer), int(head), find_token(amap, word), find_token(amap, target)]
            assert printed(number, value), f"{line}: layer {layer} head {head} is {value:.4f}"


def test_the_cli_shows_float32_weights_on_a_cpu_with_native_bf16(amap, tmp_path, monkeypatch, capsys):
    """`bertkit attention` shows the model's own weights, the float32 ones transformers and bertviz give (amap,
    held to transformers above), also where --dtype auto would pick bfloat16: on such a CPU it printed bert 0.57
    for the weight 0.58 (the guide once did). The CPU's bf16 is pretended here; auto is still asked for by name."""
    from bertkit.cli import main
    from bertkit.runtime import devices

    monkeypatch.setattr(devices, "native_bf16", lambda device=None: True)
    assert devices.auto_dtype() == torch.bfloat16  # what --dtype auto now picks
    bv = tmp_path / "bv.json"
    assert main(["attention", SENTENCE, "-o", str(tmp_path / "p.html"), "--bertviz", str(bv)]) == 0
    shown = np.stack([np.asarray(layer)[0] for layer in load_bertviz(bv)["attention"]])
    np.testing.assert_allclose(shown, amap.weights, atol=1e-6, rtol=0)
    capsys.readouterr()


def test_a_png_says_in_one_line_which_characters_its_fonts_lack(tmp_path):
    """matplotlib warns once per character its fonts have no glyph for: `bertkit attention` on a Chinese sentence
    printed a warning line per ideograph (hundreds for a paragraph), the picture showing boxes. One line now says
    how many and which, and where the text is drawn (the HTML page: the browser's fonts). Reference: the
    characters that matplotlib's own fonts for the default family lack (font_manager, ft2font); none, no line."""
    import warnings

    from matplotlib import font_manager, ft2font

    text = "北京是中国的首都北京"
    tokens = ["[CLS]", *text, "[SEP]"]
    T = len(tokens)
    amap = AttentionMap(tokens, np.full((1, 1, T, T), 1 / T, np.float32), [0] * T, text)
    props = font_manager.FontProperties()
    found = getattr(font_manager.fontManager, "_find_fonts_by_props", None)  # the fallback list (matplotlib >= 3.6)
    fonts = [ft2font.FT2Font(f) for f in (found(props) if found else [font_manager.findfont(props)])]
    missing = sorted({c for c in text if all(f.get_char_index(ord(c)) == 0 for f in fonts)})
    for view in ("text", "head"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            save_png(amap, tmp_path / f"{view}.png", view=view, dpi=30)
        said = [str(w.message) for w in caught if "glyph" in str(w.message).lower()]
        if not missing:
            assert said == []
            continue
        assert len(said) == 1, said
        assert said[0].startswith(f"the picture draws {len(missing)} characters as empty boxes")
        assert all(c in said[0] for c in missing) and "HTML page" in said[0]
