"""int8 inference (bertkit.runtime.quantization): which layers become int8, how close the
outputs stay, the saved format, and `int8=True` / `--int8` on embed and predict.

Tolerances, measured: on the tiny model (hidden 32, intermediate 37, 2 layers,
outputs up to ~3.5) int8 differs from float32 by <= 1e-3 (max abs, three seeds);
on the default model (all-MiniLM-L6-v2) sentence vectors of real text keep a
cosine of 0.94-0.98 with the float32 ones (STS-B dev Spearman loses 0.003:
bench/int8_accuracy.py).
"""

import shutil
import warnings

import numpy as np
import pytest
import torch

import bertkit
from bertkit import (BertConfig, BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification,
                     BertModel)
from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.runtime.fast import accelerate, decide
from bertkit.tasks.predict import predict
from bertkit.model.modeling import BertLayer
from bertkit.model.checkpoint import INT8_WEIGHTS
from bertkit.runtime.devices import holds_int8
from bertkit.runtime.quantization import Int8Linear, load_quantized, quantize, save_quantized
from test_finetune import sentiment_run, tiny  # noqa: F401

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

CONFIG = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                    max_position_embeddings=64)
HEADS = (BertModel, BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering)
REAL_TEXTS = ["The cat sat on the mat.", "A man is playing a guitar on stage.",
              "Stocks fell sharply after the quarterly report.", "I love this movie!"]


def tiny_model(cls=BertModel, seed=0):
    return cls(CONFIG, generator=torch.Generator().manual_seed(seed)).eval()


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 99, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # one padded row
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    return ids, mask, types


def first_output(model, seed=0):
    ids, mask, types = inputs(seed)
    with torch.no_grad():
        out = model(ids, attention_mask=mask, token_type_ids=types)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else (
        out.logits if hasattr(out, "logits") else out.start_logits)


@pytest.mark.parametrize("cls", HEADS)
def test_encoder_dense_layers_become_int8_and_the_rest_stays_float(cls):
    model = quantize(tiny_model(cls))
    layers = model.bert.encoder.layers if hasattr(model, "bert") else model.encoder.layers
    for layer in layers:
        for dense in (layer.attention.qkv, layer.attention.output, layer.intermediate, layer.output):
            assert isinstance(dense, DynamicInt8Linear)
            assert dense.weight().dtype == torch.qint8
            assert dense.weight().qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric)
        for norm in (layer.attention_norm, layer.output_norm):
            assert norm.weight.dtype == torch.float32
    int8 = sum(isinstance(m, DynamicInt8Linear) for m in model.modules())
    assert int8 == 4 * CONFIG.num_hidden_layers  # nothing outside the encoder's layers
    for m in model.modules():  # embeddings, pooler and head classifiers: float
        if isinstance(m, (torch.nn.Embedding, torch.nn.Linear, torch.nn.LayerNorm)):
            assert m.weight.dtype == torch.float32
    assert holds_int8(model) and not holds_int8(tiny_model(cls))


def test_int8_weights_are_per_output_channel_roundings_of_the_float_ones():
    model = tiny_model()
    weight = model.encoder.layers[0].intermediate.weight.detach().clone()  # [37, 32]
    q = quantize(model).encoder.layers[0].intermediate.weight()
    scales = q.q_per_channel_scales().float()
    # symmetric per row: the largest |w| of each row maps to ~127.5 steps
    torch.testing.assert_close(scales, weight.abs().amax(dim=1) / 127.5, rtol=1e-5, atol=1e-8)
    assert torch.all(q.q_per_channel_zero_points() == 0)
    error = (q.dequantize() - weight).abs()
    assert torch.all(error <= scales[:, None] / 2 + 1e-7)  # round to nearest step


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_outputs_stay_close_to_float32(seed):
    model = tiny_model(seed=seed)
    ref = first_output(model, seed)
    got = first_output(quantize(model), seed)
    diff = (got - ref).abs().max().item()
    assert 0 < diff < 3e-3  # quantized (not identical), measured <= 1e-3
    assert torch.nn.functional.cosine_similarity(got, ref, dim=-1).min() > 0.9999


def test_accelerate_after_quantize_and_quantize_after_accelerate_agree():
    plain = first_output(quantize(tiny_model()))
    # what embed/predict do: quantize, then accelerate (only the attention-path choice changes)
    torch.testing.assert_close(first_output(accelerate(quantize(tiny_model()))), plain, rtol=0, atol=1e-5)
    # an accelerated model's FastLinear layers are quantized like nn.Linear ones
    torch.testing.assert_close(first_output(quantize(accelerate(tiny_model()))), plain, rtol=0, atol=1e-5)


def layers_of(model):
    return model.bert.encoder.layers if hasattr(model, "bert") else model.encoder.layers


def dense_modules(model):
    return [d for layer in layers_of(model)
            for d in (layer.attention.qkv, layer.attention.output, layer.intermediate, layer.output)]


@pytest.fixture
def per_token(request):
    """Settings with the activation rule (bertkit.runtime.fast rule 5) forced to `request.param`,
    whatever this CPU has."""
    return decide(per_token=request.param)


@pytest.mark.parametrize("per_token", [False], indirect=True)
@pytest.mark.parametrize("cls", HEADS)
def test_per_call_int8_is_pytorchs_dynamic_int8_linear(cls, per_token):
    """One layer forward (BertLayer's) whatever the dense modules are: with one activation scale
    per call, ours against PyTorch's own dynamic int8 Linear on the same packed weights, bit for bit."""
    model = quantize(tiny_model(cls), per_token)
    assert all(type(layer) is BertLayer for layer in layers_of(model))
    assert all(type(d) is Int8Linear and not d.per_token for d in dense_modules(model))
    ours = first_output(model)
    for d in dense_modules(model):
        d.__class__ = DynamicInt8Linear  # PyTorch's forward, called by modeling.dense as a plain module
    assert torch.equal(first_output(model), ours)


@pytest.mark.parametrize("per_token", [True], indirect=True)
def test_per_token_int8_is_the_integer_arithmetic_done_by_hand(per_token):
    """q_t = round(127 x_t / max|x_t|) per token, int8 q_t . int8 w_o exact, times s_t s_o, plus b:
    recomputed in float64 (exact for these integers) and compared; a token's result does not
    depend on the other tokens of its batch. Where the CPU has VNNI or AMX only: without them oneDNN's int8
    matmul is not exact (on an AVX2-only Zen 3 0.07 off; AVX2's u8 x s8 instruction, vpmaddubsw, saturates its
    int16 pair sums), and bertkit picks per-call int8 there (rule 5), so the forced path is no user's."""
    if not decide().int8_per_token:
        pytest.skip("this CPU takes per-call int8 (FBGEMM): no VNNI or AMX, or no oneDNN")
    layer = quantize(tiny_model(), per_token).encoder.layers[0].intermediate  # [37, 32]
    assert layer.per_token
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(3)) * torch.tensor([0.1, 1, 30])[:, None, None][:2]
    w = layer.weight()
    amax = x.abs().amax(-1, keepdim=True).double()
    q = torch.round(x.double() * 127 / amax)
    assert q.abs().max() == 127
    acc = q @ w.int_repr().double().t()  # [2, 5, 37], integers
    ref = acc * amax / 127 * w.q_per_channel_scales().double() + layer.bias().double()
    with torch.no_grad():
        got = layer(x)
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
        assert torch.equal(layer(x[1:, 2:3]), got[1:, 2:3])  # alone or among others: the same numbers


def test_per_token_int8_runs_a_vnni_kernel_not_onednns_reference_one(capfd):
    """Where rule 5 picks per-token activations, oneDNN must multiply them with its VNNI/AMX int8
    kernel. Signed int8 activations sent it to its reference kernel (`ref_int8`) on a Zen 4 with
    avx512_vnni and no AMX: 60x slower than float32 (`embed --int8`, 11 s per sentence).
    oneDNN's verbose log names the kernel each matmul ran."""
    if not decide().int8_per_token:
        pytest.skip("this CPU takes per-call int8 (FBGEMM): no VNNI or AMX, or no oneDNN")
    layer = quantize(tiny_model(), decide()).encoder.layers[0].intermediate
    x = torch.randn(3, 7, 32, generator=torch.Generator().manual_seed(0))
    capfd.readouterr()
    with torch.no_grad(), torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        layer(x)
    kernels = [line.split(",")[6] for line in capfd.readouterr().out.splitlines()
               if line.startswith("onednn_verbose") and ",exec,cpu,matmul," in line]
    assert kernels and not any(k.startswith("ref") for k in kernels), kernels


def test_activation_rule_by_the_cpu():
    import dataclasses

    from bertkit.runtime.devices import cpu_features

    real = dataclasses.replace(cpu_features(), onednn=True)
    for flags, expected in ((("avx2", "fma", "avx512f", "avx512_vnni", "amx_int8"), True),  # AMX Xeon
                            (("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"), True),  # Zen 4
                            (("avx2", "fma", "avx_vnni"), True),  # Alder Lake
                            (("avx2", "fma", "avx512f"), False), (("avx2", "fma"), False)):
        assert decide(dataclasses.replace(real, flags=flags)).int8_per_token is expected, flags


FLOOR_TEXTS = REAL_TEXTS + ["it 's a charming and often affecting journey . ", "unflinchingly bleak and desperate ",
                            "the acting , costumes , music , cinematography and sound are all astounding given the "
                            "production 's austere locales ."]  # the last three: SST-2 dev sentences


@pytest.mark.parametrize("per_token", [True], indirect=True)
def test_per_token_int8_keeps_every_token_of_the_default_model(default_model_dir, per_token):
    """The minimum per-token cosine of the last hidden states, int8 against float32, on a fixed
    text set (one padded batch). Measured: per token 0.991, per call (7 bits) 0.914 on these
    texts; on the SST-2 dev set 0.982 and 0.821 against ONNX Runtime int8's 0.95
    (bench/int8_layers.py, bench/bench_model.py). The floor is ONNX Runtime's."""
    from bertkit.text.tokenizer import Tokenizer

    batch = Tokenizer.from_pretrained(default_model_dir).encode_batch(FLOOR_TEXTS, return_tensors="pt")
    batch = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    real = batch["attention_mask"].bool()
    assert not real.all()
    with torch.no_grad():
        ref = BertModel.from_pretrained(default_model_dir).eval()(**batch).last_hidden_state
        got = quantize(BertModel.from_pretrained(default_model_dir).eval(), per_token)(**batch).last_hidden_state
    cosine = torch.nn.functional.cosine_similarity(got[real], ref[real], dim=-1)
    assert 0.95 <= cosine.min() and cosine.mean() < 0.99999  # faithful, and quantized


def test_attention_weights_of_an_int8_model():
    model = quantize(tiny_model())
    ids, mask, types = inputs()
    with torch.no_grad():
        out = model(ids, attention_mask=mask, token_type_ids=types, output_attentions=True)
        fused = model(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    assert len(out.attentions) == CONFIG.num_hidden_layers
    assert out.attentions[0].shape == (3, CONFIG.num_attention_heads, 11, 11)
    torch.testing.assert_close(out.attentions[0].sum(-1), torch.ones(3, CONFIG.num_attention_heads, 11))
    assert torch.all(out.attentions[0][1, :, :, 7:] == 0)  # the padded row's padding gets no weight
    torch.testing.assert_close(out.last_hidden_state, fused, rtol=0, atol=1e-5)  # explicit vs fused attention


def test_quantize_and_accelerate_compose_in_either_order():
    for model in (accelerate(quantize(tiny_model())), quantize(accelerate(tiny_model()))):
        assert all(type(layer) is BertLayer for layer in layers_of(model))
        assert all(type(d) is Int8Linear for d in dense_modules(model))


@pytest.mark.parametrize("cls", [BertModel, BertForSequenceClassification, BertForQuestionAnswering])
def test_save_and_load_give_identical_outputs(cls, tmp_path):
    model = quantize(tiny_model(cls))
    save_quantized(model, tmp_path)
    assert (tmp_path / INT8_WEIGHTS).is_file() and not (tmp_path / "model.safetensors").exists()
    loaded = load_quantized(cls, tmp_path)
    assert holds_int8(loaded)
    assert all(type(d) is Int8Linear for d in dense_modules(loaded))
    assert torch.equal(first_output(loaded), first_output(model))


def test_a_saved_int8_masked_lm_loads_for_fill_mask(tmp_path, capsys):
    """`load(head="mlm")` looked for model.safetensors only: an int8 BertForMaskedLM folder said "no weights",
    while every other head asked for it (auto, encoder) said to load it as BertForMaskedLM."""
    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(94))])
    model = quantize(tiny_model(bertkit.BertForMaskedLM))
    save_quantized(model, tmp_path, tok)
    loaded = bertkit.load(tmp_path, head="mlm")
    assert loaded.precision == "int8" and type(loaded.model) is bertkit.BertForMaskedLM
    assert torch.equal(first_output(loaded.model), first_output(model))
    assert main(["fill-mask", str(tmp_path), "w3 [MASK] w7"]) == 0
    assert "[MASK]:" in capsys.readouterr().out


def test_a_saved_int8_electra_model_loads_back(tmp_path):
    """save_quantized wrote an int8 ElectraModel that load() read as a BERT config ("this config is for model_type
    'electra', not 'bert'"): the ELECTRA form of the class was skipped for int8 weights."""
    from bertkit.model.electra import ElectraConfig, ElectraModel
    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(94))])
    config = ElectraConfig(vocab_size=99, embedding_size=20, hidden_size=36, num_hidden_layers=2, num_attention_heads=6,
                           intermediate_size=37, max_position_embeddings=64)
    model = quantize(ElectraModel(config, generator=torch.Generator().manual_seed(0)).eval())
    save_quantized(model, tmp_path, tok)
    loaded = bertkit.load(tmp_path)
    assert loaded.precision == "int8" and type(loaded.model) is ElectraModel
    assert torch.equal(first_output(loaded.model), first_output(model))


def test_a_saved_int8_model_keeps_its_task_and_its_sentence_layout(tmp_path, capsys):
    """save_quantized wrote config.json, the weights and the vocabulary only. An int8 pair classifier loaded as a
    plain classifier ({"task": "classify", "inferred": true}: predict asked for the columns it was trained on and
    cut texts at the 64 positions, not the 8 tokens it was trained at); an int8 sentence model lost its
    normalisation (all-MiniLM-L6-v2's vectors came out with norm 6.2, not 1). Saved with the loaded folder's
    task and layout, the int8 folder predicts and embeds as the source folder does in int8."""
    import json

    from bertkit.model.sentence_layout import write_layout
    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(94))])
    pair, encoder = tmp_path / "pair", tmp_path / "encoder"
    tiny_model(BertForSequenceClassification).save_pretrained(pair, tokenizer=tok)
    (pair / "bertkit_task.json").write_text(json.dumps({"task": "pair", "max_length": 8, "stride": 0, "text_column": "q",
                                                        "text_pair_column": "p", "label_column": "label"}))
    tiny_model().save_pretrained(encoder, tokenizer=tok)
    write_layout(encoder, pooling="cls", normalize=True, max_seq_length=6, hidden_size=32)
    texts = tmp_path / "in.tsv"
    texts.write_text("q\tp\n" + "".join(f"w{i} w{i + 1} w{i + 2} w3 w4\tw{i + 5} w6 w7 w8 w9 w10\n" for i in range(6)))
    for source in (pair, encoder):
        loaded = bertkit.load(source, int8=True)
        save_quantized(loaded.model, tmp_path / f"{source.name}8", loaded.tokenizer, task=loaded.info,
                       layout=loaded.layout)
    assert bertkit.load(tmp_path / "pair8").info == bertkit.load(pair).info
    outputs = []
    for args in (["predict", str(pair), str(texts), "-o", "-", "--int8"], ["predict", str(tmp_path / "pair8"), str(texts), "-o", "-"]):
        assert main([*args, "--quiet"]) == 0, capsys.readouterr().err  # was: "several columns of text ... pass --text-column"
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == 7
    for args in (["--model", str(encoder), "--int8"], ["--model", str(tmp_path / "encoder8")]):
        assert main(["embed", str(texts), "-o", str(tmp_path / f"{len(args)}.npy"), "--column", "q", "--quiet", *args]) == 0
    from_source, saved = np.load(tmp_path / "3.npy"), np.load(tmp_path / "2.npy")
    np.testing.assert_allclose(np.linalg.norm(saved, axis=1), 1.0, atol=1e-5)  # was: mean-pooled, not normalised
    np.testing.assert_array_equal(saved, from_source)


def test_the_encoder_of_a_saved_int8_classifier_is_its_heads_encoder(tmp_path, capsys):
    """docs/deployment.md: `bertkit embed --model DIR` loads a save_quantized folder. For a fine-tuned classifier
    saved int8 it said "holds an int8 BertForSequenceClassification, not a BertModel", where the float classifier's
    folder gives its encoder: the encoder asked of an int8 head folder is now the head's own int8 encoder."""
    from bertkit.text.tokenizer import Tokenizer

    tok = Tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(94))])
    clf = quantize(tiny_model(BertForSequenceClassification))
    save_quantized(clf, tmp_path / "clf", tok)
    loaded = bertkit.load(tmp_path / "clf", head="encoder")
    assert loaded.precision == "int8" and type(loaded.model) is BertModel
    assert torch.equal(first_output(loaded.model), first_output(clf.bert))  # the classifier's encoder, bit for bit
    (tmp_path / "in.txt").write_text("w3 w7 w9\nw1 w2\n")
    assert main(["embed", str(tmp_path / "in.txt"), "-o", str(tmp_path / "v.npy"), "--model", str(tmp_path / "clf")]) == 0
    assert "computed in int8" in capsys.readouterr().err  # the message goes beside the progress bar
    # the task head is still what the folder loads as by default
    assert type(bertkit.load(tmp_path / "clf").model) is BertForSequenceClassification


def test_corrupt_mismatched_or_foreign_files_fail_with_a_named_error(tmp_path):
    model = quantize(tiny_model())
    save_quantized(model, tmp_path / "ok")
    # truncated
    shutil.copytree(tmp_path / "ok", tmp_path / "cut")
    data = (tmp_path / "cut" / INT8_WEIGHTS).read_bytes()
    (tmp_path / "cut" / INT8_WEIGHTS).write_bytes(data[: len(data) // 2])
    with pytest.raises(BertkitError, match="corrupt"):
        load_quantized(BertModel, tmp_path / "cut")
    # config.json says another size: the first tensor that disagrees is named
    shutil.copytree(tmp_path / "ok", tmp_path / "other")
    CONFIG.replace(intermediate_size=40).to_json_file(tmp_path / "other" / "config.json")
    with pytest.raises(BertkitError, match=r"intermediate\.weight_int8"):
        load_quantized(BertModel, tmp_path / "other")
    # a head's file read as another class
    with pytest.raises(BertkitError, match="holds an int8 BertForSequenceClassification, not a BertForToken"):
        save_quantized(quantize(tiny_model(BertForSequenceClassification)), tmp_path / "cls")
        load_quantized(BertForTokenClassification, tmp_path / "cls")
    # a float safetensors file under the int8 name
    from safetensors.torch import save_file

    (tmp_path / "foreign").mkdir()
    shutil.copy(tmp_path / "ok" / "config.json", tmp_path / "foreign")
    save_file({"x": torch.zeros(2)}, str(tmp_path / "foreign" / INT8_WEIGHTS))
    with pytest.raises(BertkitError, match="not a bertkit int8 model"):
        load_quantized(BertModel, tmp_path / "foreign")
    with pytest.raises(BertkitError, match="quantize"):
        save_quantized(tiny_model(), tmp_path / "float")


def test_quantize_refuses_what_int8_cannot_run():
    with pytest.raises(BertkitError, match="float32"):
        quantize(tiny_model().to(torch.bfloat16))
    with pytest.raises(BertkitError, match="bertkit model"):
        quantize(torch.nn.Linear(3, 3))
    with pytest.raises(BertkitError, match="SpeedSettings"):
        quantize(tiny_model(), "fast")


@pytest.mark.parametrize("per_token", [True, False], indirect=True)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_a_quantized_model_cast_afterwards_is_named_at_its_first_int8_layer(per_token, dtype):
    """quantize(model).to(bfloat16): the int8 layers still give float32 while the embeddings give
    bfloat16; once torch's "Expected attn_mask dtype to be bool or float or to match query dtype", 20
    frames deep in attention (per token), or a quantized kernel's (per call)."""
    model = quantize(tiny_model(), per_token).to(dtype)
    ids, mask, types = inputs()
    with torch.no_grad(), pytest.raises(BertkitError, match=f"int8 layers take float32 activations, got {dtype}: "
                                                            "the model was cast after quantize"):
        model(ids, attention_mask=mask, token_type_ids=types)


@pytest.mark.parametrize("per_token", [True, False], indirect=True)
def test_an_int8_model_runs_under_bf16_autocast(per_token):
    """Under autocast attention hands bfloat16 on; the int8 layers take it as float32 (per call it was
    "expected scalar type Float but found BFloat16")."""
    model = quantize(tiny_model(), per_token)
    ids, mask, types = inputs()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    cos = torch.nn.functional.cosine_similarity(got.float(), first_output(model), dim=-1)
    assert got.dtype == torch.float32 and cos[mask.bool()].min() > 0.99


@pytest.mark.parametrize("per_token", [True, False], indirect=True)
def test_an_int8_model_runs_outside_no_grad(per_token):
    """A plain call, autograd on (the embeddings' weights require grad): the same numbers as under
    no_grad; the per-token kernel's out= once refused it with a RuntimeError from inside torch."""
    model = quantize(tiny_model(), per_token)
    ids, mask, types = inputs()
    got = model(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    assert torch.equal(got.detach(), first_output(model))


# --- embed and predict with int8 ---------------------------------------------------------


def test_embed_int8_stays_close_to_float32_on_real_text(default_model_dir):
    float32 = bertkit.embed(REAL_TEXTS, normalize=True)
    int8 = bertkit.embed(REAL_TEXTS, normalize=True, int8=True)
    cosine = (float32 * int8).sum(axis=1)
    assert np.all(cosine > 0.9) and np.all(cosine < 0.9999)  # measured 0.94-0.98: quantized, and close
    # a loaded (model, tokenizer) pair is quantized the same way
    loaded = bertkit.load(default_model_dir)
    pair = (loaded.model, loaded.tokenizer)
    np.testing.assert_allclose(bertkit.embed(REAL_TEXTS, pair, normalize=True, int8=True), int8, atol=1e-5)


def test_embed_cli_int8_writes_the_library_vectors(tiny, tmp_path):  # noqa: F811
    src = tmp_path / "in.txt"
    src.write_text("the movie was good .\nthe film was bad\n")
    assert main(["embed", str(src), "-o", str(tmp_path / "v.npy"), "--model", str(tiny), "--int8", "--quiet"]) == 0
    expected = bertkit.embed(["the movie was good .", "the film was bad"], str(tiny), int8=True)
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), expected, atol=1e-6)
    # a saved int8 encoder is a model directory embed reads as it is
    save_quantized(quantize(BertModel.from_pretrained(tiny)), tmp_path / "int8", bertkit.Tokenizer.from_pretrained(tiny))
    np.testing.assert_array_equal(bertkit.embed(["the movie was good .", "the film was bad"], str(tmp_path / "int8")),
                                  expected)


def test_predict_int8_keeps_the_labels_and_loads_a_saved_int8_model(sentiment_run, tmp_path, capsys):  # noqa: F811
    d, _ = sentiment_run
    texts = [line.split("\t")[0] for line in (d / "dev.tsv").read_text().splitlines()[1:]]
    float32 = predict(d / "out", texts)
    int8 = predict(d / "out", texts, int8=True)
    agree = np.mean([a["label"] == b["label"] for a, b in zip(float32, int8)])
    assert agree >= 0.9
    gap = max(abs(a["probabilities"][k] - b["probabilities"][k]) for a, b in zip(float32, int8) for k in a["probabilities"])
    assert 0 < gap < 0.1
    # saved int8, with the task file beside it, predicts exactly what int8=True does
    from bertkit.tasks.predict import load_task_model

    loaded = load_task_model(d / "out", int8=True)
    model, tok = loaded.model, loaded.tokenizer
    save_quantized(model, tmp_path / "int8", tok)
    shutil.copy(d / "out" / "bertkit_task.json", tmp_path / "int8")
    assert predict(tmp_path / "int8", texts) == int8
    # the CLI flag: evaluate mode on the labelled dev file
    assert main(["predict", str(d / "out"), str(d / "dev.tsv"), "-o", str(tmp_path / "p.tsv"), "--int8"]) == 0
    assert "accuracy" in capsys.readouterr().out


def test_load_names_fast_settings_of_the_wrong_type():
    """load(fast="yes") once said "accelerate's settings must be ..." (a name the caller never used) for a
    directory, and was silently ignored for a (model, tokenizer) pair."""
    with pytest.raises(BertkitError, match="fast must be True, False or a SpeedSettings .* got str"):
        bertkit.load(fast="yes")
    with pytest.raises(BertkitError, match="fast must be True, False or a SpeedSettings"):
        bertkit.load((tiny_model(), bertkit.Tokenizer.from_pretrained()), fast="yes")


def test_dense_ops_is_quantize_then_accelerate_in_one_step():
    from bertkit.runtime.fast import FastLinear
    from bertkit.runtime.quantization import dense_ops

    ids, mask, types = inputs()

    def run(model):
        with torch.inference_mode():
            return model(ids, attention_mask=mask, token_type_ids=types).last_hidden_state

    expected = run(accelerate(quantize(tiny_model())))
    model = dense_ops(tiny_model(), int8=True, fast=True)
    torch.testing.assert_close(run(model), expected, rtol=0, atol=0)
    assert isinstance(model.pooler.dense, FastLinear) and holds_int8(model)
    again = dense_ops(model, int8=True, fast=True)  # already int8: nothing is quantized twice
    torch.testing.assert_close(run(again), expected, rtol=0, atol=0)
    plain = dense_ops(tiny_model(), int8=False, fast=False)
    assert not holds_int8(plain) and type(plain.pooler.dense) is torch.nn.Linear
    # one value of settings reaches both kinds of layer: per call int8, dense layers on F.linear
    settings = decide(onednn=False, per_token=False)
    forced = dense_ops(tiny_model(), int8=True, fast=True, settings=settings)
    assert forced.pooler.dense.speed is settings and not any(d.per_token for d in dense_modules(forced))
    torch.testing.assert_close(run(forced), run(accelerate(quantize(tiny_model(), settings), settings)), rtol=0, atol=0)


def test_an_int8_save_cut_short_leaves_the_folders_old_weights(tmp_path, monkeypatch):
    """save_quantized wrote model.int8.safetensors in place: a save cut short over a folder left half a file
    where a whole model stood. It goes through the one atomic writer now (`checkpoint.save_tensors`)."""
    import bertkit.model.checkpoint as checkpoint

    model = quantize(tiny_model(seed=0))
    save_quantized(model, tmp_path)
    before = (tmp_path / INT8_WEIGHTS).read_bytes()
    real_save = checkpoint.save_file

    def cut_short(tensors, filename, metadata=None):
        real_save(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(100)
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_file", cut_short)
    with pytest.raises(KeyboardInterrupt):
        save_quantized(quantize(tiny_model(seed=1)), tmp_path)
    assert (tmp_path / INT8_WEIGHTS).read_bytes() == before
    assert torch.equal(first_output(load_quantized(BertModel, tmp_path)), first_output(model))
