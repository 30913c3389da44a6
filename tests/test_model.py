"""BertConfig and BertModel: parity with transformers, the two attention paths,
gradients, training, precision, initialisation and bad input."""

import json
import math

import pytest
import torch

from bertkit import BertConfig, BertkitError, BertModel
from bertkit.model.modeling import additive_mask, fused_kernels

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=40, type_vocab_size=2)


def tiny_model(seed=0, **overrides):
    return BertModel(BertConfig(**{**TINY, **overrides}), generator=torch.Generator().manual_seed(seed)).eval()


def padded_batch(seed=0, B=4, T=13, vocab=99):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (B, T), generator=g)
    lengths = [T, 9, 5, 1][:B]
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    ids = ids * mask  # padding id 0 after the real tokens
    types = torch.zeros(B, T, dtype=torch.long)
    types[:, T // 2:] = 1
    return ids, mask, types * mask


# --- parity with transformers on the default model and real sentences ---------------------


@pytest.fixture(scope="module")
def real_batch(shared_data, default_model_dir):
    from bertkit.text.tokenizer import Tokenizer

    header, *rows = (shared_data / "mrpc" / "dev.tsv").read_text(encoding="utf-8").split("\n")
    pairs = [dict(zip(header.split("\t"), r.split("\t"))) for r in rows[:6]]
    sst = (shared_data / "sst2" / "dev.tsv").read_text(encoding="utf-8").split("\n")[1:7]
    tok = Tokenizer.from_pretrained(default_model_dir)
    singles = tok.encode_batch([s.split("\t")[0] for s in sst], return_tensors="pt")
    pair = tok.encode_batch([p["sentence1"] for p in pairs], [p["sentence2"] for p in pairs], return_tensors="pt")
    return [{k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")} for enc in (singles, pair)]


@pytest.fixture(scope="module")
def oracle_models(transformers_mod, default_model_dir):
    load = transformers_mod.BertModel.from_pretrained
    return {impl: load(str(default_model_dir), attn_implementation=impl).eval() for impl in ("eager", "sdpa")}


@pytest.fixture(scope="module")
def oracle_model(oracle_models):
    return oracle_models["eager"]


@pytest.fixture(scope="module")
def default_model():
    return BertModel.from_pretrained()


@pytest.fixture(scope="module")
def fast_default_model():
    from bertkit.runtime.fast import accelerate, decide

    return accelerate(BertModel.from_pretrained(), decide(onednn=True))  # oneDNN, whichever kernel won the race here


@pytest.mark.oracle
@pytest.mark.data
@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "f.linear"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_default_model_matches_transformers(real_batch, oracle_models, default_model, fast_default_model, attn,
                                            onednn):
    """Each of our paths against transformers' same path, every layer, within 1e-5 at the real
    tokens. The plain model (nn.Linear: the kernels transformers uses) matches at padding
    positions too; after bertkit.runtime.fast.accelerate (oneDNN matmuls) padding outputs, which
    nothing reads, differ by summation order (~1e-4) and only real tokens are compared.
    Against the other attention path: real tokens only, as padding differs by summation
    order there too."""
    model = fast_default_model if onednn else default_model
    model.config.attn_implementation = attn
    other = {"sdpa": "eager", "eager": "sdpa"}[attn]
    try:
        for batch in real_batch:
            real = batch["attention_mask"].bool()
            where = slice(None) if not onednn else real
            assert not real.all(), "the batch must contain padding"
            with torch.no_grad():
                ref = oracle_models[attn](**batch, output_hidden_states=True)
                ref_other = oracle_models[other](**batch)
                ours = model(**batch, output_hidden_states=True)
            torch.testing.assert_close(ours.last_hidden_state[where], ref.last_hidden_state[where], atol=1e-5, rtol=0)
            torch.testing.assert_close(ours.pooler_output, ref.pooler_output, atol=1e-5, rtol=0)
            torch.testing.assert_close(ours.last_hidden_state[real], ref_other.last_hidden_state[real], atol=1e-5, rtol=0)
            torch.testing.assert_close(ours.pooler_output, ref_other.pooler_output, atol=1e-5, rtol=0)
            assert len(ours.hidden_states) == model.config.num_hidden_layers + 1
            for a, b in zip(ours.hidden_states, ref.hidden_states):
                torch.testing.assert_close(a[where], b[where], atol=1e-5, rtol=0)
            assert ours.attentions is None
    finally:
        model.config.attn_implementation = "sdpa"


@pytest.mark.oracle
@pytest.mark.data
def test_attentions_match_transformers(real_batch, oracle_model, default_model):
    batch = real_batch[1]
    with torch.no_grad():
        ref = oracle_model(**batch, output_attentions=True)
        ours = default_model(**batch, output_attentions=True)
    B, T = batch["input_ids"].shape
    assert len(ours.attentions) == 6
    real = batch["attention_mask"].bool()
    for a, b in zip(ours.attentions, ref.attentions):
        assert a.shape == (B, 12, T, T)
        # the rows of real query tokens (padding queries' rows are never read; see above)
        torch.testing.assert_close(a.transpose(1, 2)[real], b.transpose(1, 2)[real], atol=1e-5, rtol=0)
    # padding keys get no weight and every row is a distribution
    pad = batch["attention_mask"] == 0
    assert ours.attentions[0].permute(0, 3, 1, 2)[pad].abs().max() == 0
    torch.testing.assert_close(ours.attentions[-1].sum(-1), torch.ones(B, 12, T))


# --- the two attention paths, padding, dropout ----------------------------------------------


def test_the_plain_model_runs_the_fused_kernel_unless_weights_are_asked_for(monkeypatch):
    """No shape threshold in the model: "sdpa" is the fused kernel at any size (the shape rule
    that sends small inputs to the explicit path is bertkit.runtime.fast's, tested there)."""
    model = tiny_model()
    ids, mask, types = padded_batch()  # 4 x 13: tiny
    calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or real_sdpa(*a, **k))
    with torch.no_grad():
        model(ids, mask, types)
        assert len(calls) == 2  # one per layer
        model(ids, mask, types, output_attentions=True)
        assert len(calls) == 2  # the explicit path


def test_explicit_and_fused_paths_agree_with_padding():
    model = tiny_model()
    ids, mask, types = padded_batch()
    with torch.no_grad():
        fused = model(ids, mask, types)
        explicit = model(ids, mask, types, output_attentions=True, output_hidden_states=True)
    torch.testing.assert_close(fused.last_hidden_state, explicit.last_hidden_state, atol=1e-6, rtol=0)
    torch.testing.assert_close(fused.pooler_output, explicit.pooler_output, atol=1e-6, rtol=0)
    assert [a.shape for a in explicit.attentions] == [(4, 4, 13, 13)] * 2
    assert [h.shape for h in explicit.hidden_states] == [(4, 13, 32)] * 3


def test_attention_weights_by_hand():
    """One layer, one head, identity-like weights: softmax(q.k / sqrt(D)) over real keys only."""
    model = tiny_model(num_hidden_layers=1)
    ids, mask, types = padded_batch(B=2, T=6)
    layer = model.encoder.layers[0].attention
    with torch.no_grad():
        x = model.embeddings(ids, types)
        q, k, _ = layer.qkv(x).view(2, 6, 3, 4, 8).permute(2, 0, 3, 1, 4)
        expected = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(mask[:, None, None, :] == 0, -math.inf).softmax(-1)
        got = model(ids, mask, types, output_attentions=True).attentions[0]
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_padding_does_not_change_real_tokens():
    model = tiny_model(seed=3)
    ids, mask, types = padded_batch(seed=3)
    with torch.no_grad():
        batched = model(ids, mask, types).last_hidden_state
        for b in range(ids.shape[0]):
            n = int(mask[b].sum())
            alone = model(ids[b:b + 1, :n], None, types[b:b + 1, :n]).last_hidden_state
            torch.testing.assert_close(batched[b:b + 1, :n], alone, atol=1e-5, rtol=0)


def test_fully_padded_row_is_finite_in_every_dtype():
    ids, mask, types = padded_batch()
    mask[3] = 0  # a row with no real token at all
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        m = tiny_model().to(dtype)
        for explicit in (False, True):
            with torch.no_grad():
                out = m(ids, mask, types, output_attentions=explicit)
            assert torch.isfinite(out.last_hidden_state).all(), (dtype, explicit)
    assert additive_mask(torch.ones(2, 3), torch.float32) is None  # nothing masked: no mask at all
    assert additive_mask(mask, torch.float16).min() == torch.finfo(torch.float16).min


def test_dropout_only_in_training():
    model = tiny_model()
    ids, mask, types = padded_batch()
    with torch.no_grad():
        a = model(ids, mask, types).last_hidden_state
        b = model(ids, mask, types).last_hidden_state
        model.train()
        torch.manual_seed(0)
        c = model(ids, mask, types).last_hidden_state
    assert torch.equal(a, b)
    assert not torch.allclose(a, c, atol=1e-3)


def test_token_type_default_is_segment_a():
    model = tiny_model()
    ids, mask, _ = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask).last_hidden_state,
                                   model(ids, mask, torch.zeros_like(ids)).last_hidden_state, atol=0, rtol=0)


def test_pool_false_skips_only_the_pooler():
    """pool=False (what embedding passes) leaves the token vectors exactly as they were and
    computes no pooler output; the pooler's output is tanh(W h_[CLS] + b) otherwise."""
    model = tiny_model()
    ids, mask, types = padded_batch()
    with torch.no_grad():
        full = model(ids, mask, types)
        tokens = model(ids, mask, types, pool=False)
        pooled = torch.tanh(model.pooler.dense(full.last_hidden_state[:, 0]))
    assert tokens.pooler_output is None
    assert torch.equal(tokens.last_hidden_state, full.last_hidden_state)
    torch.testing.assert_close(full.pooler_output, pooled, atol=0, rtol=0)


# --- gradients, training, checkpointing ---------------------------------------------------


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_gradcheck_tiny(attn):
    config = BertConfig(vocab_size=11, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=9, max_position_embeddings=8, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, attn_implementation=attn)
    model = BertModel(config, generator=torch.Generator().manual_seed(0)).double()
    ids = torch.tensor([[1, 5, 7, 2], [3, 4, 0, 0]])
    mask = (ids != 0).long()
    names = ["encoder.layers.0.attention.qkv.bias", "embeddings.layer_norm.weight", "pooler.dense.bias"]
    params = dict(model.named_parameters())

    def f(*values):
        out = torch.func.functional_call(model, {**params, **dict(zip(names, values))}, (ids, mask))
        return out.last_hidden_state.sum(-1), out.pooler_output

    inputs = tuple(params[n].detach().clone().requires_grad_() for n in names)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, fast_mode=True)


def test_training_a_tiny_model_lowers_the_loss():
    from bertkit import BertForSequenceClassification

    config = BertConfig(**TINY, num_labels=3)
    model = BertForSequenceClassification(config, generator=torch.Generator().manual_seed(0)).train()
    ids, mask, types = padded_batch(B=4, T=10)
    labels = torch.tensor([0, 2, 1, 2])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(0)  # dropout masks
    losses = []
    for _ in range(20):
        loss = model(ids, mask, types, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_gradient_checkpointing_gives_the_same_gradients():
    config = BertConfig(**TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    grads, kept = [], []
    for checkpointing in (False, True):
        model = BertModel(config, generator=torch.Generator().manual_seed(0)).train()
        model.set_gradient_checkpointing(checkpointing)
        ids, mask, types = padded_batch()
        saved = []  # what autograd keeps for backward: with checkpointing, only the layers' inputs
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            out = model(ids, mask, types)
        kept.append(sum(saved))
        (out.last_hidden_state.square().mean() + out.pooler_output.sum()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert kept[1] < kept[0] / 3, kept
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-5)


# --- reduced precision ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inference_stays_close(default_model, dtype):
    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained()
    batch = tok.encode_batch(["The quick brown fox jumps over the lazy dog.", "Short one."], return_tensors="pt")
    batch = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        ref = default_model(**batch).last_hidden_state
        half = BertModel.from_pretrained().to(dtype)
        out = half(**batch).last_hidden_state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = default_model(**batch).last_hidden_state
    assert out.dtype == dtype
    real = batch["attention_mask"].bool()
    for got in (out, auto):
        cos = torch.nn.functional.cosine_similarity(got.float()[real], ref[real], dim=-1)
        assert cos.min() > 0.99, cos.min()


# --- initialisation ----------------------------------------------------------------------------


def test_initialisation_follows_bert_and_the_generator():
    config = BertConfig.preset("mini", vocab_size=1000)
    a = BertModel(config, generator=torch.Generator().manual_seed(7))
    b = BertModel(config, generator=torch.Generator().manual_seed(7))
    c = BertModel(config, generator=torch.Generator().manual_seed(8))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.embeddings.word_embeddings.weight, c.embeddings.word_embeddings.weight)
    w = a.encoder.layers[1].intermediate.weight
    assert abs(w.mean().item()) < 1e-3 and abs(w.std().item() - 0.02) < 1e-3
    assert abs(a.embeddings.word_embeddings.weight.std().item() - 0.02) < 1e-3
    assert torch.count_nonzero(a.encoder.layers[0].attention.qkv.bias) == 0
    assert torch.all(a.encoder.layers[0].output_norm.weight == 1)
    assert torch.count_nonzero(a.embeddings.layer_norm.bias) == 0
    # the [PAD] row starts at zero, as transformers' _init_weights leaves it (it never gets a gradient)
    pad = config.pad_token_id
    assert torch.count_nonzero(a.embeddings.word_embeddings.weight[pad]) == 0
    assert torch.count_nonzero(a.embeddings.word_embeddings.weight[pad + 1]) == config.hidden_size


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("make, words", [
    (lambda: (torch.tensor([[1, 2, 99]]),), "outside the vocabulary"),
    (lambda: (torch.tensor([[1, -3, 2]]),), "outside the vocabulary"),
    (lambda: (torch.ones(1, 41, dtype=torch.long),), "exceeds max_position_embeddings=40"),
    (lambda: (torch.ones(2, 5, dtype=torch.long), torch.ones(2, 4)), "attention_mask has shape (2, 4)"),
    (lambda: (torch.ones(2, 5, dtype=torch.long), None, torch.ones(5, dtype=torch.long)), "token_type_ids has shape"),
    (lambda: (torch.ones(2, 5, dtype=torch.long), None, torch.full((2, 5), 2)), "token_type_ids must be in [0, 2)"),
    (lambda: (torch.ones(5, dtype=torch.long),), "unsqueeze(0)"),
    (lambda: (torch.ones(2, 5),), "integer token ids"),
    (lambda: ([[1, 2, 3]],), "[batch, seq_len] tensor"),
    (lambda: (torch.ones(2, 0, dtype=torch.long),), "empty"),
])
def test_bad_input_is_a_clear_error(make, words):
    model = tiny_model()
    with pytest.raises(BertkitError) as err:
        model(*make())
    assert words in str(err.value)


def test_a_sentence_pair_for_a_one_segment_model_says_so():
    """type_vocab_size 1 (RoBERTa-style checkpoints in BERT's layout): `attention --pair`, a pair task's predict
    said "token_type_ids must be in [0, 1) (segment A/B), found 1", which names no way out."""
    model = BertModel(BertConfig(**{**TINY, "type_vocab_size": 1}), generator=torch.Generator().manual_seed(0))
    types = torch.tensor([[0, 0, 0, 1, 1]])
    with pytest.raises(BertkitError, match=r"one segment \(type_vocab_size 1\).*no sentence pair.*one text"):
        model(torch.ones(1, 5, dtype=torch.long), None, types)


# --- config ---------------------------------------------------------------------------------------


def test_presets_match_the_published_shapes():
    shapes = {name: (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size)
              for name in ("tiny", "mini", "small", "medium", "base", "large")
              for c in [BertConfig.preset(name)]}
    assert shapes == {"tiny": (2, 128, 2, 512), "mini": (4, 256, 4, 1024), "small": (4, 512, 8, 2048),
                      "medium": (8, 512, 8, 2048), "base": (12, 768, 12, 3072), "large": (24, 1024, 16, 4096)}
    assert BertConfig() == BertConfig.preset("base")
    base = BertModel(BertConfig.preset("base"))
    assert base.num_parameters() == 109_482_240  # bert-base-uncased, as published (110M)


@pytest.mark.parametrize("kwargs, words", [
    (dict(hidden_size=30, num_attention_heads=4), "divisible by num_attention_heads"),
    (dict(vocab_size=0), "vocab_size must be a positive integer"),
    (dict(hidden_dropout_prob=1.5), "hidden_dropout_prob must be in [0, 1)"),
    (dict(hidden_act="mish"), "hidden_act 'mish' is not supported"),
    (dict(problem_type="ranking"), "problem_type 'ranking'"),
    (dict(attn_implementation="flash"), "attn_implementation 'flash'"),
])
def test_config_validation(kwargs, words):
    with pytest.raises(BertkitError) as err:
        BertConfig(**kwargs)
    assert words in str(err.value)
    with pytest.raises(BertkitError, match="unknown BertConfig preset"):
        BertConfig.preset("huge")


def test_config_json_round_trip_and_hf_config(tmp_path, default_model_dir):
    config = BertConfig.preset("small", num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"},
                                problem_type="single_label_classification")
    config.to_json_file(tmp_path / "config.json")
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["id2label"] == {"0": "neg", "1": "neu", "2": "pos"} and data["model_type"] == "bert"
    assert BertConfig.from_json_file(tmp_path / "config.json") == config
    assert BertConfig.from_dict(config.to_dict()).label2id == {"neg": 0, "neu": 1, "pos": 2}
    hf = BertConfig.from_pretrained(default_model_dir)  # written by transformers 4.8
    assert (hf.num_hidden_layers, hf.hidden_size, hf.num_attention_heads, hf.intermediate_size) == (6, 384, 12, 1536)
    assert hf.extra == {} and hf.gradient_checkpointing is False and hf.architectures == ["BertModel"]


@pytest.mark.oracle
def test_transformers_reads_our_config(tmp_path, transformers_mod):
    config = BertConfig(**TINY, num_labels=3, id2label={0: "a", 1: "b", 2: "c"}, problem_type="regression")
    config.to_json_file(tmp_path / "config.json")
    hf = transformers_mod.BertConfig.from_pretrained(str(tmp_path))
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_act", "problem_type"):
        assert getattr(hf, name) == getattr(config, name), name
    assert hf.id2label == {0: "a", 1: "b", 2: "c"} and hf.num_labels == 3


@pytest.mark.parametrize("text, words", [
    ("{not json", "not valid JSON"),
    ('{"model_type": "roberta"}', "model_type 'roberta'"),
    ('{"is_decoder": true}', "decoder"),
    ('{"position_embedding_type": "relative_key"}', "relative_key"),
    ('{"hidden_size": "big"}', 'hidden_size must be a whole number, got "big"'),
])
def test_bad_config_json(tmp_path, text, words):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(BertkitError) as err:
        BertConfig.from_pretrained(tmp_path)
    assert words in str(err.value)


def test_from_dict_takes_a_dict_only():
    """dict([]) is {}: a list (e.g. a JSON array read by mistake) once gave the default config silently."""
    with pytest.raises(BertkitError, match="a config must be a dict of settings, got list"):
        BertConfig.from_dict([])


def test_a_cuda_forward_leaves_cudnn_attention_out_and_restores_the_flags():
    """cuDNN's attention builds a plan per new padded shape (docs/benchmarks.md "On a GPU"): on a CUDA device the
    fused path runs with FlashAttention, memory-efficient and math only, and torch's own flags come back after."""
    flags = (torch.backends.cuda.cudnn_sdp_enabled, torch.backends.cuda.mem_efficient_sdp_enabled,
             torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.math_sdp_enabled)
    before = [f() for f in flags]
    with fused_kernels(torch.device("cuda")):
        assert [f() for f in flags] == [False, True, True, True]
    assert [f() for f in flags] == before
    with fused_kernels(torch.device("cpu")):  # the CPU's kernels are chosen by torch as before
        assert [f() for f in flags] == before


def test_a_compiled_training_forward_is_one_graph():
    """`pretrain run --compile` on an H200 compiled the model in pieces: torch.compile (dynamo) stops its graph at
    every read of a tensor on the host and at every op it cannot trace, and runs what lies between eagerly. The
    forward had 17 such breaks in training on the CPU: the input check's range reads, the mask's "anything
    padded?" read, and each dropout's in-place draw (the CPU's cheaper mask and its chunked attention). Compiled,
    the forward now leaves the check to eager runs, always builds the mask and drops through torch's own traced
    ops: no break, on a padded batch with dropout on."""
    from bertkit.model.heads import BertForPreTraining

    model = BertForPreTraining(BertConfig(**TINY), generator=torch.Generator().manual_seed(0)).train()
    ids, mask, types = padded_batch()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(ids, mask, types)
    assert explained.graph_break_count == 0, [str(b.reason).splitlines()[0] for b in explained.break_reasons]
    assert explained.graph_count == 1
