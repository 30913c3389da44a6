"""--device and --dtype for embed, predict and attention (library parameters and CLI flags).

CUDA tests run where torch sees a GPU and skip cleanly elsewhere; bfloat16 on a CPU
without native bf16 must warn (once) and still give the float32 answer to bf16 precision.
"""

import warnings

import numpy as np
import pytest
import torch

import bertkit
import bertkit.fast
from bertkit.cli import main
from test_finetune import sentiment_run, tiny  # noqa: F401

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TEXTS = ["The quick brown fox jumps over the lazy dog.", "A short one.", "Paris is the capital of France."]


def cosines(a, b):
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_embed_in_bfloat16_on_the_cpu_is_close_and_says_so(monkeypatch):
    monkeypatch.setattr(bertkit.fast, "_warned_bf16", False)
    ref = bertkit.embed(TEXTS, device="cpu", dtype="float32")
    if bertkit.fast.cpu_features().native_bf16:
        got = bertkit.embed(TEXTS, device="cpu", dtype="bfloat16")
    else:
        with pytest.warns(UserWarning, match="emulated"):
            got = bertkit.embed(TEXTS, device="cpu", dtype="bfloat16")
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert cosines(got, ref).min() > 0.99
    assert not np.array_equal(got, ref)  # it did run in bfloat16


def test_cli_device_and_dtype_flags(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bertkit.fast, "_warned_bf16", True)  # the warning has its own test
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    assert main(["embed", str(src), "-o", str(tmp_path / "v.npy"), "--device", "cpu", "--dtype", "bfloat16",
                 "--quiet"]) == 0
    assert np.load(tmp_path / "v.npy").shape == (3, 384)
    assert main(["attention", "The cat sat.", "-o", str(tmp_path / "a.html"), "--device", "cpu"]) == 0
    if not torch.cuda.is_available():
        capsys.readouterr()
        for argv in (["embed", str(src), "-o", str(tmp_path / "w.npy")], ["attention", "The cat sat.", "-o",
                                                                          str(tmp_path / "b.html")]):
            assert main([*argv, "--device", "cuda"]) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and "no CUDA GPU" in err
    with pytest.raises(SystemExit):
        main(["embed", str(src), "-o", str(tmp_path / "v.npy"), "--dtype", "float16"])  # not a choice


def test_predict_device_and_dtype(sentiment_run, monkeypatch):  # noqa: F811
    monkeypatch.setattr(bertkit.fast, "_warned_bf16", True)
    d, _ = sentiment_run
    texts = ["the food was great .", "the movie was awful .", "this day was fine ."]
    ref = bertkit.predict(d / "out", texts, device="cpu")
    half = bertkit.predict(d / "out", texts, device="cpu", dtype="bfloat16")
    assert [p["label"] for p in half] == [p["label"] for p in ref] == ["pos", "neg", "pos"]
    for a, b in zip(half, ref):
        assert a["probabilities"]["pos"] == pytest.approx(b["probabilities"]["pos"], abs=0.05)


def test_a_loaded_model_moves_only_when_asked():
    from bertkit.features import from_pretrained, load_model

    model, tok = from_pretrained()
    net, _ = load_model((model, tok))
    assert net is model and model.embeddings.word_embeddings.weight.dtype == torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bf16 advice: not the point here
        load_model((model, tok), device="cpu", dtype="bfloat16")
    assert model.embeddings.word_embeddings.weight.dtype == torch.bfloat16


@cuda
def test_embed_on_cuda_matches_the_cpu():
    ref = bertkit.embed(TEXTS, device="cpu")
    got = bertkit.embed(TEXTS, device="cuda")
    np.testing.assert_allclose(got, ref, atol=1e-4)
    half = bertkit.embed(TEXTS, device="cuda", dtype="bfloat16")
    assert cosines(half, ref).min() > 0.99


@cuda
def test_predict_and_attention_on_cuda(sentiment_run):  # noqa: F811
    from bertkit.attention_view import attention_map

    d, _ = sentiment_run
    texts = ["the food was great .", "the movie was awful ."]
    ref, got = (bertkit.predict(d / "out", texts, device=dev) for dev in ("cpu", "cuda"))
    for a, b in zip(got, ref):
        assert a["label"] == b["label"]
        assert a["probabilities"]["pos"] == pytest.approx(b["probabilities"]["pos"], abs=1e-4)
    on_gpu, on_cpu = (attention_map("The cat sat on the mat.", device=dev).weights for dev in ("cuda", "cpu"))
    np.testing.assert_allclose(on_gpu, on_cpu, atol=1e-4)
