"""--device and --dtype for embed, predict and attention (library parameters and CLI flags).

CUDA tests run where torch sees a GPU and skip cleanly elsewhere; bfloat16 on a CPU
without native bf16 must warn (once) and still give the float32 answer to bf16 precision.
"""

import warnings

import numpy as np
import pytest
import torch

import bertkit
import bertkit.runtime.devices
import bertkit.runtime.devices as D
from bertkit.errors import BertkitError
from bertkit.cli import main
from test_finetune import sentiment_run, tiny  # noqa: F401

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TEXTS = ["The quick brown fox jumps over the lazy dog.", "A short one.", "Paris is the capital of France."]


def cosines(a, b):
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_embed_in_bfloat16_on_the_cpu_is_close_and_says_so(monkeypatch):
    monkeypatch.setattr(bertkit.runtime.devices, "_warned_bf16", False)
    ref = bertkit.embed(TEXTS, device="cpu", dtype="float32")
    if bertkit.runtime.devices.cpu_features().native_bf16:
        got = bertkit.embed(TEXTS, device="cpu", dtype="bfloat16")
    else:
        with pytest.warns(UserWarning, match="emulated"):
            got = bertkit.embed(TEXTS, device="cpu", dtype="bfloat16")
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert cosines(got, ref).min() > 0.99
    assert not np.array_equal(got, ref)  # it did run in bfloat16


def test_cli_device_and_dtype_flags(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bertkit.runtime.devices, "_warned_bf16", True)  # the warning has its own test
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
    monkeypatch.setattr(bertkit.runtime.devices, "_warned_bf16", True)
    d, _ = sentiment_run
    texts = ["the food was great .", "the movie was awful .", "this day was fine ."]
    ref = bertkit.predict(d / "out", texts, device="cpu")
    half = bertkit.predict(d / "out", texts, device="cpu", dtype="bfloat16")
    assert [p["label"] for p in half] == [p["label"] for p in ref] == ["pos", "neg", "pos"]
    for a, b in zip(half, ref):
        assert a["probabilities"]["pos"] == pytest.approx(b["probabilities"]["pos"], abs=0.05)


def test_a_loaded_model_moves_only_when_asked():
    loaded = bertkit.load(head="encoder")
    model, tok = loaded.model, loaded.tokenizer
    assert bertkit.load((model, tok)).model is model and model.embeddings.word_embeddings.weight.dtype == torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bf16 advice: not the point here
        assert bertkit.load((model, tok), device="cpu", dtype="bfloat16").dtype == torch.bfloat16
    assert model.embeddings.word_embeddings.weight.dtype == torch.bfloat16


def test_a_pair_without_its_model_or_tokenizer_is_refused_at_once():
    """(model, None) once loaded and failed at the first text; (None, tok) with an AttributeError inside."""
    tok = bertkit.Tokenizer.from_pretrained()
    model = bertkit.BertModel(bertkit.BertConfig.preset("tiny"))
    with pytest.raises(BertkitError, match=r"needs a torch model and its tokenizer, got \(BertModel, NoneType\)"):
        bertkit.load((model, None))
    with pytest.raises(BertkitError, match=r"got \(NoneType, Tokenizer\)"):
        bertkit.load((None, tok))


@cuda
def test_embed_on_cuda_matches_the_cpu():
    ref = bertkit.embed(TEXTS, device="cpu")
    got = bertkit.embed(TEXTS, device="cuda")
    np.testing.assert_allclose(got, ref, atol=1e-4)
    half = bertkit.embed(TEXTS, device="cuda", dtype="bfloat16")
    assert cosines(half, ref).min() > 0.99


@cuda
def test_predict_and_attention_on_cuda(sentiment_run):  # noqa: F811
    from bertkit.explain.attention_view import attention_map

    d, _ = sentiment_run
    texts = ["the food was great .", "the movie was awful ."]
    ref, got = (bertkit.predict(d / "out", texts, device=dev) for dev in ("cpu", "cuda"))
    for a, b in zip(got, ref):
        assert a["label"] == b["label"]
        assert a["probabilities"]["pos"] == pytest.approx(b["probabilities"]["pos"], abs=1e-4)
    on_gpu, on_cpu = (attention_map("The cat sat on the mat.", device=dev).weights for dev in ("cuda", "cpu"))
    np.testing.assert_allclose(on_gpu, on_cpu, atol=1e-4)


# --- the CPU, devices and dtypes: bertkit.runtime.devices ---------------------------------------------------


def test_cpu_features_read_proc_cpuinfo():
    cpu = D.cpu_features()
    assert cpu.capability == torch.backends.cpu.get_cpu_capability()
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        pytest.skip("no /proc/cpuinfo here")
    flags = set(next(line for line in text.splitlines() if line.startswith(("flags", "Features"))).split(":")[1].split())
    assert set(cpu.flags) == flags & set(D.FLAGS)
    assert cpu.native_bf16 == bool({"avx512_bf16", "amx_bf16"} & flags)
    line = cpu.describe()
    assert cpu.capability in line and ("bf16 native" if cpu.native_bf16 else "bf16 emulated") in line


def fake_cpu(*flags):
    return D.CpuFeatures("Test CPU", "GenuineIntel", 2, "AVX2", tuple(flags), True)


def test_bfloat16_warns_once_where_the_cpu_only_emulates_it(monkeypatch):
    monkeypatch.setattr(D, "cpu_features", lambda: fake_cpu("avx2", "fma"))
    monkeypatch.setattr(D, "_warned_bf16", False)
    with pytest.warns(UserWarning, match="emulated.*use float32"):
        assert D.resolve_dtype("bfloat16") == torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert D.resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16  # once only
        assert D.resolve_dtype(None) == torch.float32


def test_bf16_training_warns_where_the_cpu_only_emulates_it(monkeypatch):
    from bertkit.training.loop import autocast_for

    monkeypatch.setattr(D, "cpu_features", lambda: fake_cpu("avx2", "fma"))
    monkeypatch.setattr(D, "_warned_bf16", False)
    with pytest.warns(UserWarning, match="emulated.*--precision fp32"):
        autocast_for("bf16", "cpu")
    monkeypatch.setattr(D, "cpu_features", lambda: fake_cpu("avx2", "amx_bf16"))
    monkeypatch.setattr(D, "_warned_bf16", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with autocast_for("bf16", "cpu")():
            assert torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_bfloat16_is_quiet_where_the_cpu_has_it(monkeypatch):
    for flag in ("avx512_bf16", "amx_bf16"):
        monkeypatch.setattr(D, "cpu_features", lambda: fake_cpu("avx2", flag))
        monkeypatch.setattr(D, "_warned_bf16", False)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert D.resolve_dtype("bfloat16") == torch.bfloat16
    with pytest.raises(BertkitError, match="use auto, float32 or bfloat16"):
        D.resolve_dtype("float16")


def test_devices():
    assert D.resolve_device("cpu") == torch.device("cpu")
    assert D.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(BertkitError, match="use auto, cpu or cuda"):
        D.resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(BertkitError, match="no CUDA GPU"):
            D.resolve_device("cuda")




def test_auto_precision_follows_the_cpu_flags(monkeypatch):
    """The rule: bf16 where the CPU multiplies it natively (AMX, AVX512-BF16), float32 where it is emulated."""
    for flags, expected in ((("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8"), torch.bfloat16),
                            (("avx2", "avx512f", "avx512_bf16"), torch.bfloat16),
                            (("avx2", "fma"), torch.float32)):
        monkeypatch.setattr(D, "cpu_features", lambda flags=flags: fake_cpu(*flags))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # auto never picks an emulated precision, so never warns
            assert D.resolve_dtype("auto", torch.device("cpu")) == expected
            assert D.resolve_dtype("auto") == expected
        assert D.resolve_dtype(None) == torch.float32  # the Python API's default stays exact


def test_auto_precision_on_this_machine_is_faithful():
    """auto on this CPU gives vectors within cosine 0.999 of float32 (bf16 where native, else float32 itself)."""
    texts = TEXTS + ["The bank of the river was muddy after the rain.", "She deposited the cheque at the bank."]
    ref = bertkit.embed(texts, device="cpu", dtype="float32")
    got = bertkit.embed(texts, device="cpu", dtype="auto")
    assert cosines(got, ref).min() > 0.999
    if not D.cpu_features().native_bf16:
        np.testing.assert_array_equal(got, ref)  # auto is float32 here: exact


def test_placement_is_decided_once_with_int8s_rule():
    cpu = torch.device("cpu")
    # int8 means the CPU in float32 activations: "auto" resolves to them, anything else is refused by name
    assert D.placement("auto", "auto", int8=True) == (cpu, torch.float32)
    with pytest.raises(BertkitError, match="an int8 model: int8 runs on the CPU in float32"):
        D.placement("cpu", "bfloat16", int8=True, what="an int8 model")
    # a model already in memory stays where it is unless a device is named
    assert D.placement(None, None, on=torch.device("meta")) == (torch.device("meta"), torch.float32)
    assert D.placement("cpu", "float32", on=torch.device("meta")) == (cpu, torch.float32)


def test_int8_with_bfloat16_is_refused_before_the_emulated_bf16_warning(monkeypatch):
    """`embed --int8 --dtype bfloat16` on a CPU that emulates bf16 printed the warning that bf16 is slow here
    (and so used it up for the session) and then refused the combination: the refusal alone is the answer."""
    monkeypatch.setattr(D, "cpu_features", lambda: fake_cpu("avx2", "fma"))
    monkeypatch.setattr(D, "_warned_bf16", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for dtype in ("bfloat16", "bf16", torch.bfloat16):
            with pytest.raises(BertkitError, match="int8 runs on the CPU in float32"):
                D.placement("cpu", dtype, int8=True)
        with pytest.raises(BertkitError, match="unknown dtype 'float16'"):
            D.placement("cpu", "float16", int8=True)
        assert D.placement("cpu", "fp32", int8=True) == (torch.device("cpu"), torch.float32)
    assert D._warned_bf16 is False


@pytest.mark.parametrize("major, native", [(7, False), (8, True)])
def test_auto_picks_bf16_only_on_a_gpu_that_multiplies_it_natively(monkeypatch, major, native):
    """A T4 or V100 (compute capability 7.x) has no bf16 tensor cores; torch.cuda.is_bf16_supported() still says
    True there by default (it can emulate bf16), so --dtype auto picked bfloat16 on such a GPU: emulated, slow.
    Native bf16 starts with Ampere (8.x), as torch's own including_emulation=False says. The GPU is faked: torch's
    answer is computed from its device properties."""
    from types import SimpleNamespace

    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(major=major))
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)  # it can emulate bf16
    cuda = torch.device("cuda")
    assert D.native_bf16(cuda) is native
    assert D.auto_dtype(cuda) == (torch.bfloat16 if native else torch.float32)


def test_bfloat16_warns_once_on_a_gpu_that_only_emulates_it(monkeypatch):
    """--dtype bfloat16 (or --precision bf16) on a T4 ran emulated bf16 without a word; the CPU's warning was
    CPU-only. The GPU is faked through torch's device properties (a T4: 7.5; an A100: 8.0)."""
    from types import SimpleNamespace

    from bertkit.training.loop import autocast_for

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)
    monkeypatch.setattr(D, "_warned_bf16", False)
    t4 = SimpleNamespace(major=7, minor=5, name="Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: t4)
    with pytest.warns(UserWarning, match=r"Tesla T4, compute capability 7\.5.*emulated.*--precision fp16"):
        autocast_for("bf16", "cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert D.resolve_dtype("bfloat16", cuda) == torch.bfloat16  # once only
        monkeypatch.setattr(D, "_warned_bf16", False)
        a100 = SimpleNamespace(major=8, minor=0, name="A100")
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: a100)
        assert D.resolve_dtype("bfloat16", cuda) == torch.bfloat16  # native: quiet
