"""Task heads: transformers-initialised models of every head type, saved by transformers,
load into ours and give the same logits and losses; plus the heads' own rules."""

import copy
import json

import numpy as np
import pytest
import torch

import bertkit
from bertkit import BertConfig, BertkitError
from bertkit.model.checkpoint import hf_state_dict
from bertkit.model.heads import HEADS

HF_TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=37, max_position_embeddings=40, type_vocab_size=2)
B, T, C = 3, 11, 3


def batch(seed=0, shape=(B, T)):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 99, shape, generator=g)
    mask = torch.ones(shape, dtype=torch.long)
    mask.view(-1, shape[-1])[1, 7:] = 0
    mask.view(-1, shape[-1])[2, 4:] = 0
    types = torch.zeros(shape, dtype=torch.long)
    types[..., 5:] = 1
    return ids * mask, mask, types * mask


def labels_for(name, ids, mask):
    g = torch.Generator().manual_seed(1)
    if name in ("BertForPreTraining", "BertForMaskedLM"):
        mlm = torch.full(ids.shape, -100)
        picks = (torch.rand(ids.shape, generator=g) < 0.3) & mask.bool()
        picks[0, 1] = True
        mlm[picks] = torch.randint(0, 99, (int(picks.sum()),), generator=g)
        if name == "BertForPreTraining":
            return dict(labels=mlm, next_sentence_label=torch.tensor([0, 1, 1]))
        return dict(labels=mlm)
    if name == "BertForNextSentencePrediction":
        return dict(labels=torch.tensor([1, 0, 1]))
    if name == "BertForSequenceClassification":
        return dict(labels=torch.tensor([2, 0, 1]))
    if name == "BertForTokenClassification":
        tags = torch.randint(0, 3, ids.shape, generator=g)
        return dict(labels=tags.masked_fill(mask == 0, -100))
    if name == "BertForQuestionAnswering":
        return dict(start_positions=torch.tensor([1, 3, 50]), end_positions=torch.tensor([4, 3, 2]))
    if name == "BertForMultipleChoice":
        return dict(labels=torch.tensor([2]))
    raise KeyError(name)


def main_logits(out):
    for name in ("logits", "prediction_logits", "start_logits"):
        value = getattr(out, name, None)
        if value is not None:
            return value
    raise AssertionError


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory, transformers_mod):
    """Every transformers head, randomly initialised and saved by transformers."""
    out = {}
    for cls in HEADS:
        torch.manual_seed(0)
        num_labels = 2 if cls.__name__ == "BertForQuestionAnswering" else 3
        config = transformers_mod.BertConfig(**HF_TINY, num_labels=num_labels)
        model = getattr(transformers_mod, cls.__name__)(config).eval()
        with torch.no_grad():  # transformers zero-initialises some biases: make them matter
            for p in model.parameters():
                if p.dim() == 1 and not p.any():
                    p.normal_(0.0, 0.02)
        directory = tmp_path_factory.mktemp(cls.__name__)
        model.save_pretrained(str(directory))
        out[cls.__name__] = (model, directory)
    return out


@pytest.mark.oracle
@pytest.mark.parametrize("cls", HEADS, ids=lambda c: c.__name__)
def test_transformers_heads_load_with_identical_logits_and_losses(hf_checkpoints, cls):
    name = cls.__name__
    hf_model, directory = hf_checkpoints[name]
    ours = cls.from_pretrained(directory)
    assert type(ours) is cls and not ours.training
    assert not ours.load_report.problems, ours.load_report.describe()
    shape = (1, C, T) if name == "BertForMultipleChoice" else (B, T)
    ids, mask, types = batch(shape=shape)
    labels = labels_for(name, ids, mask)
    with torch.no_grad():
        ref = hf_model(input_ids=ids, attention_mask=mask, token_type_ids=types, **labels)
        plain = ours(ids, mask, types)  # without labels: full logits
        got = ours(ids, mask, types, **labels)
    assert plain.loss is None
    ref_logits = main_logits(ref)
    torch.testing.assert_close(main_logits(plain), ref_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.loss, ref.loss, atol=1e-5, rtol=1e-6)
    if name in ("BertForPreTraining", "BertForMaskedLM"):
        # with labels, the vocabulary projection runs only at the labelled positions
        picked = labels["labels"] != -100
        torch.testing.assert_close(main_logits(got), ref_logits[picked], atol=1e-5, rtol=0)
        assert main_logits(got).shape == (int(picked.sum()), 99)
    else:
        torch.testing.assert_close(main_logits(got), ref_logits, atol=1e-5, rtol=0)
    if name == "BertForPreTraining":
        torch.testing.assert_close(got.seq_relationship_logits, ref.seq_relationship_logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(got.mlm_loss + got.nsp_loss, got.loss)
    if name == "BertForQuestionAnswering":
        torch.testing.assert_close(got.end_logits, ref.end_logits, atol=1e-5, rtol=0)


def grads_by_hf_name(model) -> dict:
    """Each parameter's gradient under its Hugging Face name (the checkpoint table splits qkv)."""
    shadow = copy.deepcopy(model)
    with torch.no_grad():
        for p, q in zip(shadow.parameters(), model.parameters()):
            p.copy_(torch.zeros_like(q) if q.grad is None else q.grad)
    return hf_state_dict(shadow)


def assert_same_gradients(ours, hf_model, ids, mask, types, labels) -> None:
    """One backward of each model's loss on the batch; every weight's gradient compared by its HF name."""
    hf_model(input_ids=ids, attention_mask=mask, token_type_ids=types, **labels).loss.backward()
    ours(ids, mask, types, **labels).loss.backward()
    theirs = {n: p.grad for n, p in hf_model.named_parameters()}
    got = grads_by_hf_name(ours)
    assert set(got) == set(theirs)
    for key, grad in got.items():
        torch.testing.assert_close(grad, theirs[key], atol=1e-6, rtol=1e-4, msg=lambda m, key=key: f"{key}: {m}")


@pytest.mark.oracle
@pytest.mark.parametrize("cls", HEADS, ids=lambda c: c.__name__)
def test_gradients_match_transformers(hf_checkpoints, cls):
    """What a hand-written training step sees: the same gradient for every weight as transformers
    (dropout off). QA's loss reaches padded positions, so this holds only if the [PAD] embedding
    row gets no gradient, as transformers' `padding_idx` makes it."""
    name = cls.__name__
    hf_model, directory = hf_checkpoints[name]
    hf_model = copy.deepcopy(hf_model)
    ours = cls.from_pretrained(directory)
    shape = (1, C, T) if name == "BertForMultipleChoice" else (B, T)
    ids, mask, types = batch(shape=shape)
    assert_same_gradients(ours, hf_model, ids, mask, types, labels_for(name, ids, mask))


@pytest.mark.oracle
@pytest.mark.parametrize("problem, labels", [
    ("regression", torch.tensor([0.5, -1.0, 2.0])),
    ("multi_label_classification", torch.tensor([[1.0, 0, 1], [0, 0, 0], [0, 1, 1]])),
])
def test_sequence_classification_losses_match_transformers(tmp_path, transformers_mod, problem, labels):
    num_labels = 1 if problem == "regression" else 3
    torch.manual_seed(0)
    hf = transformers_mod.BertForSequenceClassification(
        transformers_mod.BertConfig(**HF_TINY, num_labels=num_labels)).eval()
    hf.save_pretrained(str(tmp_path))
    ours = bertkit.BertForSequenceClassification.from_pretrained(tmp_path)
    assert ours.config.problem_type is None  # inferred from num_labels and the labels' dtype, as in transformers
    ids, mask, types = batch()
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
        got = ours(ids, mask, types, labels=labels)
    torch.testing.assert_close(got.loss, ref.loss, atol=1e-6, rtol=1e-6)
    assert ref.loss.item() > 0


def test_losses_by_hand():
    config = BertConfig(**HF_TINY, num_labels=1)
    model = bertkit.BertForSequenceClassification(config, generator=torch.Generator().manual_seed(0)).eval()
    ids, mask, types = batch()
    with torch.no_grad():
        out = model(ids, mask, types, labels=torch.tensor([1.0, 2.0, 3.0]))
    assert out.logits.shape == (B, 1)
    expected = ((out.logits.squeeze(1) - torch.tensor([1.0, 2.0, 3.0])) ** 2).mean()
    torch.testing.assert_close(out.loss, expected)

    qa = bertkit.BertForQuestionAnswering(BertConfig(**HF_TINY), generator=torch.Generator().manual_seed(0)).eval()
    with torch.no_grad():
        out = qa(ids, mask, types, start_positions=torch.tensor([1, 2, 99]), end_positions=torch.tensor([3, 2, 99]))
    logp_s, logp_e = out.start_logits.log_softmax(-1), out.end_logits.log_softmax(-1)
    # the third example's answer lies outside the window: ignored by both losses
    expected = -((logp_s[0, 1] + logp_s[1, 2]) / 2 + (logp_e[0, 3] + logp_e[1, 2]) / 2) / 2
    torch.testing.assert_close(out.loss, expected)


def test_mlm_decoder_is_tied_to_word_embeddings():
    model = bertkit.BertForMaskedLM(BertConfig(**HF_TINY), generator=torch.Generator().manual_seed(0))
    ids, mask, types = batch()
    labels = torch.full(ids.shape, -100)
    labels[0, 2] = 5
    model(ids, mask, types, labels=labels).loss.backward()
    grad = model.bert.embeddings.word_embeddings.weight.grad
    # only id 5 is a target, but every row gets gradient through the shared decoder (softmax over V)
    assert grad[ids.unique()].abs().sum() > 0 and grad[98].abs().sum() > 0 and 98 not in ids
    names = [n for n, _ in model.named_parameters()]
    assert not any("decoder" in n for n in names)


def test_no_labelled_position_gives_zero_mlm_loss():
    model = bertkit.BertForPreTraining(BertConfig(**HF_TINY), generator=torch.Generator().manual_seed(0))
    ids, mask, types = batch()
    out = model(ids, mask, types, labels=torch.full(ids.shape, -100), next_sentence_label=torch.tensor([0, 1, 0]))
    assert out.mlm_loss.item() == 0 and out.prediction_logits.shape == (0, 99)
    torch.testing.assert_close(out.loss, out.nsp_loss)
    out.loss.backward()  # still a graph


def test_multiple_choice_scores_choices_independently():
    model = bertkit.BertForMultipleChoice(BertConfig(**HF_TINY), generator=torch.Generator().manual_seed(0)).eval()
    ids, mask, types = batch(shape=(2, C, T))
    with torch.no_grad():
        logits = model(ids, mask, types).logits
        single = model(ids[1:, 2:], mask[1:, 2:], types[1:, 2:]).logits  # one example, one choice
    assert logits.shape == (2, C)
    torch.testing.assert_close(single[0, 0], logits[1, 2], atol=1e-6, rtol=0)


def test_heads_reject_bad_labels():
    config = BertConfig(**HF_TINY, num_labels=3)
    g = torch.Generator().manual_seed(0)
    ids, mask, types = batch()
    seq = bertkit.BertForSequenceClassification(config, generator=g)
    with pytest.raises(BertkitError, match=r"class ids in \[0, 3\)"):
        seq(ids, mask, labels=torch.tensor([0, 3, 1]))
    with pytest.raises(BertkitError, match="must have shape"):
        seq(ids, mask, labels=torch.tensor([0, 1]))
    tok = bertkit.BertForTokenClassification(config, generator=g)
    with pytest.raises(BertkitError, match="must have shape"):
        tok(ids, mask, labels=torch.zeros(B, T + 1, dtype=torch.long))
    mlm = bertkit.BertForMaskedLM(config, generator=g)
    with pytest.raises(BertkitError, match=r"\[0, 99\)"):
        mlm(ids, mask, labels=torch.full(ids.shape, 99))
    mc = bertkit.BertForMultipleChoice(config, generator=g)
    with pytest.raises(BertkitError, match=r"\[batch, choices, seq_len\]"):
        mc(ids)


def test_heads_name_labels_of_the_wrong_kind():
    """A list, a numpy array, or float/bool class ids: once an AttributeError in the head or a
    RuntimeError from inside cross-entropy; now the label's name, what it must be, and the fix."""
    config = BertConfig(**HF_TINY, num_labels=3)
    g = torch.Generator().manual_seed(0)
    ids, mask, _ = batch()
    seq = bertkit.BertForSequenceClassification(config, generator=g)
    with pytest.raises(BertkitError, match=r"labels must be a torch tensor, got list \(wrap it in torch.tensor"):
        seq(ids, mask, labels=[0, 1, 2])
    with pytest.raises(BertkitError, match="labels must be a torch tensor, got ndarray"):
        seq(ids, mask, labels=np.array([0, 1, 2]))
    with pytest.raises(BertkitError, match=r"labels must be integer ids \(torch.long\), got torch.bool"):
        seq(ids, mask, labels=torch.tensor([True, False, True]))
    tok = bertkit.BertForTokenClassification(config, generator=g)
    with pytest.raises(BertkitError, match=r"labels \(per token\) must be integer ids .* got torch.float32"):
        tok(ids, mask, labels=torch.zeros(B, T))
    mlm = bertkit.BertForMaskedLM(config, generator=g)
    with pytest.raises(BertkitError, match=r"labels \(masked LM\) must be integer ids"):
        mlm(ids, mask, labels=torch.zeros(B, T))
    qa = bertkit.BertForQuestionAnswering(config, generator=g)
    with pytest.raises(BertkitError, match="start_positions must be a torch tensor of shape \\(3,\\), got list"):
        qa(ids, mask, start_positions=[1, 2, 3], end_positions=torch.tensor([1, 2, 3]))
    with pytest.raises(BertkitError, match="end_positions must be integer ids"):
        qa(ids, mask, start_positions=torch.tensor([1, 2, 3]), end_positions=torch.tensor([1.0, 2.0, 3.0]))
    # what stays float: regression and multi-label targets
    assert bertkit.BertForSequenceClassification(config.replace(num_labels=1), generator=g)(
        ids, mask, labels=torch.tensor([0.5, 1.0, 2.0])).loss.isfinite()
    assert seq(ids, mask, labels=torch.tensor([[0.0, 1.0, 1.0]] * B)).loss.isfinite()


def test_label_names_travel_with_the_config(tmp_path):
    config = BertConfig(**HF_TINY, id2label={0: "O", 1: "B-PER", 2: "I-PER"})
    model = bertkit.BertForTokenClassification(config, generator=torch.Generator().manual_seed(0))
    model.save_pretrained(tmp_path)
    loaded = bertkit.BertForTokenClassification.from_pretrained(tmp_path)
    assert loaded.config.labels == ["O", "B-PER", "I-PER"] and loaded.config.label2id["B-PER"] == 1
    assert loaded.classifier.out_features == 3


def test_mean_pooling_classifies_the_average_of_the_real_tokens(tmp_path):
    config = BertConfig(**HF_TINY, num_labels=3, classifier_pooling="mean")
    model = bertkit.BertForSequenceClassification(config, generator=torch.Generator().manual_seed(0)).eval()
    assert model.bert.pooler is None  # nothing reads it
    ids, mask, types = batch()
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, token_type_ids=types).logits
        hidden = model.bert(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        # by hand, one row at a time: the average of the vectors of the row's real tokens
        expected = torch.stack([model.classifier(hidden[b, mask[b].bool()].mean(0)) for b in range(B)])
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)
        # padding changes nothing: row 2 alone, without its padded tail, scores the same
        n = int(mask[2].sum())
        alone = model(ids[2:, :n], attention_mask=mask[2:, :n], token_type_ids=types[2:, :n]).logits
        torch.testing.assert_close(alone, logits[2:], rtol=1e-5, atol=1e-6)

    # the setting travels in config.json, which a [CLS] model's does not mention
    model.save_pretrained(tmp_path / "mean")
    assert BertConfig.from_pretrained(tmp_path / "mean").classifier_pooling == "mean"
    bertkit.BertForSequenceClassification(BertConfig(**HF_TINY)).save_pretrained(tmp_path / "cls")
    assert "classifier_pooling" not in (tmp_path / "cls" / "config.json").read_text()
    with torch.no_grad():
        again = bertkit.BertForSequenceClassification.from_pretrained(tmp_path / "mean").eval()
        torch.testing.assert_close(again(ids, attention_mask=mask, token_type_ids=types).logits, logits)
    # a [CLS] checkpoint (with its pooler) fine-tunes with mean pooling: the pooler is left unused
    switched = bertkit.BertForSequenceClassification.from_pretrained(tmp_path / "cls", classifier_pooling="mean")
    assert switched.bert.pooler is None and "pooler.dense.weight" in switched.load_report.unused
    with pytest.raises(BertkitError, match="classifier_pooling 'max' is unknown"):
        BertConfig(**HF_TINY, classifier_pooling="max")


# Which problem a sequence classifier has (its loss, how its logits are read) is decided by one rule, model.config's;
# the head (training), checkpoint.task_info (a Hugging Face checkpoint's task) and distillation (its soft loss) ask it.
# The table: every num_labels 1-3 with each problem_type a config.json may name, or none.
PROBLEM_CONFIGS = [(n, named) for n in (1, 2, 3)
                   for named in (None, "regression", "single_label_classification", "multi_label_classification")]


def hf_problem_type(transformers_mod, num_labels: int, named, labels: torch.Tensor) -> str:
    """transformers' decision: its config refuses what it cannot train (ValueError), its forward decides a problem
    type it is not told from num_labels and the labels' dtype, before any loss (which may not fit the labels)."""
    model = transformers_mod.BertForSequenceClassification(transformers_mod.BertConfig(**HF_TINY, num_labels=num_labels,
                                                                                       problem_type=named))
    try:
        model(input_ids=torch.ones(len(labels), 4, dtype=torch.long), labels=labels)
    except (RuntimeError, ValueError):  # the loss: decided already
        pass
    return model.config.problem_type


@pytest.mark.oracle
@pytest.mark.parametrize("n, named", PROBLEM_CONFIGS)
def test_the_problem_type_is_decided_once_as_transformers_decides_it(tmp_path, transformers_mod, n, named):
    from bertkit.distill.logits import problem_kind
    from bertkit.model.checkpoint import task_info
    from bertkit.tasks.registry import TASKS

    integer, floats = torch.tensor([0, n - 1]), torch.tensor([[0.0] * n, [1.0] * n]).squeeze(-1)
    config = {**HF_TINY, "num_labels": n, "problem_type": named, "architectures": ["BertForSequenceClassification"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    try:
        expected = hf_problem_type(transformers_mod, n, named, integer)
    except ValueError:  # transformers refuses the config: so does BertConfig (the head's, the teacher's), and task_info
        for read in (lambda: BertConfig.from_dict(config), lambda: task_info(tmp_path)):
            with pytest.raises(BertkitError, match="num_labels"):
                read()
        return
    ours = BertConfig.from_dict(config)
    head = bertkit.BertForSequenceClassification(ours)
    # a saved model read without labels (task_info, distillation's teacher) is read as integer labels are
    assert (head.problem_type(integer), problem_kind(ours), TASKS[task_info(tmp_path)["task"]].problem_type) == \
        (expected,) * 3
    assert head.problem_type(floats) == hf_problem_type(transformers_mod, n, named, floats)
