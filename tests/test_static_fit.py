"""`bertkit distill static --fit`: the table fitted to the model's sentence vectors (bertkit.distill.fit)."""

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import bertkit
from bertkit.cli import main
from bertkit.distill import layers, static as static_distill
from bertkit.distill.config import StaticDistillConfig
from bertkit.distill.fit import TableFit, fit_loss, mean_loss
from bertkit.distill.static import distill_static, pca, pca_basis, project
from bertkit.model.static import StaticEmbedding
from bertkit.runtime.loading import load

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the red car is fast", "birds fly over the sea",
         "she reads a long book", "rain falls on the roof", "the old man walks slowly", "kids play football outside",
         "a cup of hot tea", "stars shine at night"] * 3 + ["unaffable 東京 🦄 zzqxj"]


def test_fit_loss_is_the_hand_computed_mean_of_one_minus_cosine():
    weight = torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 0.5], [-1.0, 0.5, 2.0], [0.3, -0.7, 1.1], [2.0, 1.0, -1.0]])
    texts = [[1, 2], [3, 4, 4]]
    targets = np.array([[1.0, 0.0, 1.0], [0.5, -1.0, 2.0]], dtype=np.float32)
    want = []
    for ids, y in zip(texts, targets):  # by hand: each text's mean row, its cosine with the target
        m = weight.numpy()[ids].mean(axis=0)
        want.append(1 - m @ y / (np.linalg.norm(m) * np.linalg.norm(y)))
    model = TableFit(StaticEmbedding(weight))
    batch = {"input_ids": torch.tensor([[1, 2, 0], [3, 4, 4]]), "attention_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]),
             "labels": torch.from_numpy(targets)}
    assert abs(float(model(**batch).loss.detach()) - np.mean(want)) < 1e-6
    assert abs(mean_loss(model.static, texts, targets) - np.mean(want)) < 1e-6
    assert abs(float(fit_loss(torch.tensor([[2.0, 0.0]]), torch.tensor([[1.0, 1.0]]))) - (1 - 2 ** -0.5)) < 1e-7


def test_the_basis_projects_rows_as_pca_does():
    x = np.random.default_rng(0).normal(size=(50, 9)).astype(np.float32) * np.arange(1, 10)
    basis = pca_basis(x, 4)
    assert np.abs(project(x, basis) - pca(x, 4)).max() < 1e-5
    assert np.abs(basis[1].T @ basis[1] - np.eye(4)).max() < 1e-9  # orthonormal components


@pytest.fixture(scope="module")
def fitted(tiny_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("fit")
    (base / "fit.txt").write_text("\n".join(TEXTS) + "\n")
    config = StaticDistillConfig(dim=8, fit=str(base / "fit.txt"), fit_epochs=5, fit_batch_size=8,
                                 teacher_cache=str(base / "teacher.safetensors"))
    report = distill_static(tiny_dir, base / "out", config, progress=False, log=lambda line: None)
    plain = distill_static(tiny_dir, base / "plain", StaticDistillConfig(dim=8), progress=False)
    return base, config, report, plain


def test_the_fit_lowers_its_loss_and_keeps_the_rows_never_distilled_zero(fitted):
    base, _, report, _ = fitted
    assert report["fit_texts"] == len(TEXTS) and report["fit_loss_after"] < report["fit_loss_before"] / 2
    before, after = (load(base / name).model.embedding.weight.detach() for name in ("plain", "out"))
    tok = load(base / "out").tokenizer
    for token in ("[CLS]", "[SEP]", "[MASK]", "[UNK]", "[unused5]"):
        assert not after[tok.vocab[token]].any()
    seen = sorted(set(i for ids in tok.ids_lists(TEXTS) for i in ids) - {tok.unk_token_id})
    unseen = tok.vocab["zebra"]
    assert (after[seen] != before[seen]).any(dim=1).all() and torch.equal(after[unseen], before[unseen])


def test_the_targets_are_the_models_sentence_vectors_and_a_rerun_reads_them(fitted, tiny_dir):
    base, config, report, _ = fitted
    with safe_open(str(base / "teacher.safetensors"), framework="pt") as f:
        cached = f.get_tensor("vectors").numpy()
    assert np.abs(cached - bertkit.embed(TEXTS, tiny_dir, normalize=False)).max() < 1e-5
    lines = []
    again = distill_static(tiny_dir, base / "again", config, progress=False, log=lines.append)
    assert any("read from" in line for line in lines)  # the teacher skipped
    same = [load(base / name).model.embedding.weight.detach() for name in ("out", "again")]
    assert torch.equal(*same) and again["fit_loss_after"] == report["fit_loss_after"]  # seeded: the same table


def test_the_fitted_folder_loads_in_sentence_transformers_with_the_same_vectors(st, fitted):
    out = fitted[0] / "out"
    texts = TEXTS[:4] + ["Hello, World! naïve café"]
    assert np.abs(bertkit.embed(texts, out) - st.SentenceTransformer(str(out), device="cpu").encode(texts)).max() < 1e-6


def test_a_fit_stopped_midway_leaves_no_folder(tiny_dir, tmp_path, monkeypatch):
    (tmp_path / "fit.txt").write_text("a cat\na dog\n")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(static_distill, "fit_table", killed)
    with pytest.raises(KeyboardInterrupt):
        distill_static(tiny_dir, tmp_path / "out", StaticDistillConfig(dim=8, fit=str(tmp_path / "fit.txt")),
                       progress=False)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


@pytest.mark.parametrize("args, words", [
    (["--fit", "EMPTY"], "--fit"),
    (["--teacher-cache", "t.safetensors"], "give --fit FILE too"),
    (["--fit", "EMPTY", "--fit-epochs", "0"], "--fit-epochs and --fit-learning-rate must be > 0"),
])
def test_distill_static_fit_bad_input_is_one_line(tiny_dir, tmp_path, capsys, args, words):
    (tmp_path / "empty.txt").write_text("\n \n")
    args = [str(tmp_path / "empty.txt") if a == "EMPTY" else a for a in args]
    assert main(["distill", "static", str(tiny_dir), "-o", str(tmp_path / "out"), "--quiet", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and not (tmp_path / "out").exists()


def test_the_teachers_vectors_resume_after_the_last_chunk_written(tiny_dir, tmp_path, monkeypatch):
    teacher = load(tiny_dir, head="encoder")
    cache = tmp_path / "t.safetensors"
    whole = layers.cached_targets(teacher, TEXTS, 32, chunk=4)  # no file: computed, nothing written
    real, calls = layers.teacher_targets, []

    def killed_at_the_third_chunk(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(layers, "teacher_targets", killed_at_the_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        layers.cached_targets(teacher, TEXTS, 32, cache, chunk=4)
    part = tmp_path / "t.safetensors.part"  # the two chunks done, each in its own file: none written twice
    assert not cache.exists() and sorted(p.name for p in part.iterdir()) == ["000000.safetensors", "000001.safetensors"]
    assert np.array_equal(np.concatenate([load_file(p)["vectors"].numpy() for p in sorted(part.iterdir())]), whole[:8])
    monkeypatch.setattr(layers, "teacher_targets", real)
    lines = []
    got = layers.cached_targets(teacher, TEXTS, 32, cache, chunk=4, log=lines.append)
    assert any(f"8 of {len(TEXTS)} texts read" in line for line in lines)
    assert np.array_equal(got, whole) and np.abs(got - bertkit.embed(TEXTS, tiny_dir, normalize=False)).max() < 1e-5
    assert cache.is_file() and not (tmp_path / "t.safetensors.part").exists()


@pytest.mark.parametrize("start, flags, warned", [
    ("out", [], True),  # fitted, the static recipe's rate (0.05)
    ("out", ["--learning-rate", "0.01"], False),  # fitted, the rate that keeps the fit
    ("plain", [], False),  # not fitted: the recipe's rate is the right one
])
def test_training_a_fitted_table_at_the_recipes_rate_says_so(fitted, tmp_path, capsys, start, flags, warned):
    from bertkit.model.static import saved_about
    base = fitted[0]
    assert bool(saved_about(base / start).get("fit")) == (start == "out")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("anchor\tpositive\n" + "".join(f"{a}\t{b}\n" for a, b in zip(TEXTS[:10], TEXTS[1:11])))
    assert main(["finetune", "embed", "--static", "--train", str(pairs), "--model", str(base / start), "-o",
                 str(tmp_path / "ft"), "--no-progress", "--device", "cpu", "--batch-size", "4", *flags]) == 0
    out = capsys.readouterr().out
    assert ("was fitted to its model's sentence vectors" in out) == warned


@pytest.mark.parametrize("name,content,line", [
    ("fit.txt", "a cat sat\n\nthe dog ran\n\x01\x02\nbirds fly\n", 4),  # a blank line is not a text, but a line
    ("fit.tsv", "id\tsentence\n1\ta cat sat\n2\t\n3\t\u200b\x07\n", 4),
    ("fit.jsonl", '{"text": "a cat sat"}\n{"text": "\\u0001"}\n', 2)])
def test_a_fit_text_without_tokens_is_named_by_file_and_line_before_the_distillation(tiny_dir, tmp_path, capsys,
                                                                                      monkeypatch, name, content,
                                                                                      line):
    (tmp_path / name).write_text(content)

    def distilled(*args, **kwargs):  # the check comes first: nothing is distilled for a file that cannot be fitted
        raise AssertionError("distilled before the --fit file was checked")

    monkeypatch.setattr(static_distill, "teacher_vectors", distilled)
    assert main(["distill", "static", str(tiny_dir), "-o", str(tmp_path / "out"), "--quiet", "--dim", "8",
                 "--fit", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bertkit: error: {tmp_path / name}:{line}: text ") and "yields no tokens" in err
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()
