"""fill-mask against transformers' fill-mask pipeline on the same random tiny weights (BERT MLM,
BERT pre-training, ELECTRA generator, an ELECTRA pre-training directory), and `electra show`
checked against the discriminator run by hand on what it reports."""

import json

import pytest
import torch

from bertkit import BertkitError
from bertkit.cli import main
from bertkit.model.checkpoint import GENERATOR_DIR
from bertkit.model.electra import ElectraConfig
from bertkit.model.electra_pretraining import ElectraPretrainingModel
from bertkit.explain.electra_view import show
from bertkit.explain.fill_mask import fill_mask
from bertkit.text.tokenizer import Tokenizer

WORDS = ["the", "man", "went", "to", "store", "park", "a", "dog", "ran", "##s", ".", ",", "cat", "sat", "on",
         "mat", "chef", "cooked", "ate", "meal", "big", "small", "red", "house", "tree"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
SHAPE = dict(vocab_size=len(VOCAB), hidden_size=24, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=32, hidden_dropout_prob=0.0)
ONE = "the man went to the [MASK] ."
TWO = "the [MASK] sat on the [MASK] ."


def _perturbed(model, scale=0.5):
    """Random weights with sharp enough logits that the top-k order is not a tie."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model.eval()


def _save(transformers_mod, model, directory):
    model.save_pretrained(directory)
    Tokenizer(VOCAB).save_pretrained(directory)
    return directory


def _pipeline_answers(transformers_mod, model, directory, text, k):
    tok = transformers_mod.BertTokenizerFast.from_pretrained(str(directory))
    fill = transformers_mod.pipeline("fill-mask", model=model, tokenizer=tok, top_k=k, device="cpu")
    out = fill(text)
    return out if isinstance(out[0], list) else [out]


def _assert_same(ours, theirs):
    assert len(ours) == len(theirs)
    for mine, ref in zip(ours, theirs):
        assert [c.id for c in mine] == [r["token"] for r in ref]
        assert [c.token for c in mine] == [VOCAB[r["token"]] for r in ref]
        for c, r in zip(mine, ref):
            assert abs(c.probability - r["score"]) < 1e-5


@pytest.mark.oracle
@pytest.mark.parametrize("kind", ["BertForMaskedLM", "BertForPreTraining", "ElectraForMaskedLM"])
@pytest.mark.parametrize("text", [ONE, TWO])
def test_same_predictions_as_the_transformers_pipeline(tmp_path, transformers_mod, kind, text):
    if kind.startswith("Electra"):
        config = transformers_mod.ElectraConfig(**SHAPE, embedding_size=12)
    else:
        config = transformers_mod.BertConfig(**SHAPE)
    hf = _perturbed(getattr(transformers_mod, kind)(config))
    directory = _save(transformers_mod, hf, tmp_path / "model")
    if kind == "BertForPreTraining":
        hf = transformers_mod.BertForMaskedLM.from_pretrained(str(directory)).eval()  # the pipeline's head
    ours = fill_mask(str(directory), text, top_k=4)
    _assert_same(ours, _pipeline_answers(transformers_mod, hf, directory, text, 4))
    assert all(sum(c.probability for c in row) <= 1 + 1e-6 for row in ours)  # a top-k of one softmax
    assert all(row[0].probability >= row[-1].probability for row in ours)


@pytest.mark.oracle
def test_a_text_longer_than_the_positions_is_cut_as_the_pipeline_cuts_it_and_said(tmp_path, transformers_mod):
    """A text of 3 x 32 tokens with its [MASK] in the first 32 was cut at the model's 32 positions and predicted
    with no word said: the words after the cut gave the mask no context. The predictions are the transformers
    pipeline's with truncation=True (the same cut), and one warning says how many tokens the text had."""
    hf = _perturbed(transformers_mod.BertForMaskedLM(transformers_mod.BertConfig(**SHAPE)))
    directory = _save(transformers_mod, hf, tmp_path / "model")
    text = "the [MASK] went to the store . " + "the dog ran to the park . " * 12
    n = len(Tokenizer.from_pretrained(directory).encode(text, truncation=False))
    assert n > 32
    with pytest.warns(UserWarning, match=rf"^the text has {n} tokens and the model reads 32: it predicted each") as said:
        ours = fill_mask(str(directory), text, top_k=4)
    assert len(said) == 1
    tok = transformers_mod.BertTokenizerFast.from_pretrained(str(directory))
    fill = transformers_mod.pipeline("fill-mask", model=hf, tokenizer=tok, top_k=4, device="cpu")
    _assert_same(ours, [fill(text, tokenizer_kwargs={"truncation": True, "max_length": 32})])


def _electra_run(tmp_path, seed=0):
    config = ElectraConfig(**SHAPE, embedding_size=12, attention_probs_dropout_prob=0.0)
    model = _perturbed(ElectraPretrainingModel(config, generator=torch.Generator().manual_seed(seed)), 0.3)
    model.save_pretrained(tmp_path / "electra", tokenizer=Tokenizer(VOCAB))
    return model, tmp_path / "electra"


@pytest.mark.oracle
def test_an_electra_pretraining_directory_predicts_with_its_generator(tmp_path, transformers_mod):
    _, directory = _electra_run(tmp_path)
    hf = transformers_mod.ElectraForMaskedLM.from_pretrained(str(directory / GENERATOR_DIR)).eval()
    _assert_same(fill_mask(str(directory), TWO, top_k=3),
                 _pipeline_answers(transformers_mod, hf, directory / GENERATOR_DIR, TWO, 3))


def test_checkpoints_without_an_mlm_head_say_so(tmp_path):
    from bertkit.model.electra import ElectraForPreTraining
    from bertkit.model.modeling import BertModel
    from bertkit.model.config import BertConfig

    BertModel(BertConfig(**SHAPE)).save_pretrained(tmp_path / "bert")
    Tokenizer(VOCAB).save_pretrained(tmp_path / "bert")
    with pytest.raises(BertkitError, match="no masked-LM head.*bare encoder"):
        fill_mask(str(tmp_path / "bert"), ONE)
    ElectraForPreTraining(ElectraConfig(**SHAPE, embedding_size=12)).save_pretrained(tmp_path / "disc")
    with pytest.raises(BertkitError, match="ELECTRA discriminator"):
        fill_mask(str(tmp_path / "disc"), ONE)
    _, directory = _electra_run(tmp_path)
    with pytest.raises(BertkitError, match=r"no \[MASK\]"):
        fill_mask(str(directory), "the man went to the store .")


def test_cli_fill_mask(tmp_path, capsys):
    _, directory = _electra_run(tmp_path)
    assert main(["fill-mask", str(directory), ONE, "--top-k", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ONE and out[1] == "[MASK]:" and len(out) == 5
    assert main(["fill-mask", str(directory), TWO, "--json", "--dtype", "float32"]) == 0  # exact: the library's
    rows = json.loads(capsys.readouterr().out)
    assert [len(r) for r in rows] == [5, 5] and rows == [[vars(c) for c in r] for r in fill_mask(str(directory), TWO)]
    assert main(["fill-mask", str(tmp_path / "nowhere"), ONE]) == 2
    assert "no model directory" in capsys.readouterr().err
    # a sentence alone (the README's habit of a default model): one line naming the missing MLM head
    assert main(["fill-mask", "The man went to the [MASK] ."]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "default model" in err and "has none" in err
    assert 'bertkit fill-mask runs/mlm "The man went to the [MASK] ."' in err
    assert main(["fill-mask", str(directory)]) == 2  # a model folder alone: the text is what is missing
    assert f"give the text after the model folder: bertkit fill-mask {directory}" in capsys.readouterr().err
    # the two swapped: "no model directory at the man went to the [MASK] ." named the sentence as a folder
    assert main(["fill-mask", ONE, str(directory)]) == 2
    assert f"the model folder comes first, then the text: bertkit fill-mask {directory} \"{ONE}\"" in capsys.readouterr().err
    assert main(["fill-mask", ""]) == 2  # an empty text alone: not "give the text after the model folder" of ""
    assert "has none" in capsys.readouterr().err
    assert main(["fill-mask", "the man went " * 30 + "[MASK] ."]) == 2  # longer than a file name: no OSError
    assert "has none" in capsys.readouterr().err
    # a [MASK] beyond the positions the model reads was cut off with the text: "no [MASK] in the text"
    limit = json.loads((directory / "config.json").read_text())["max_position_embeddings"]
    assert main(["fill-mask", str(directory), "the man went " * limit + "[MASK] ."]) == 2
    assert capsys.readouterr().err == (f"bertkit: error: every [MASK] lies past the first {min(limit, 512)} tokens, "
                                       "all the model reads: shorten the text\n")
    # one of two: it answered the first alone, "[MASK]:", as if the text had one
    assert main(["fill-mask", str(directory), "[MASK] " + "the man went " * (limit // 3) + "[MASK] ."]) == 2
    assert capsys.readouterr().err == (f"bertkit: error: 1 of the text's 2 [MASK]s lies past the first "
                                       f"{min(limit, 512)} tokens, all the model reads: shorten the text\n")


# --- electra show ------------------------------------------------------------------------------


def _discriminator_by_hand(model, tokens):
    ids = torch.tensor([[VOCAB.index(t) for t in tokens]])
    with torch.no_grad():
        return torch.sigmoid(model.discriminator(ids).logits)[0].tolist()


def test_show_reports_what_the_discriminator_read(tmp_path):
    model, directory = _electra_run(tmp_path)
    text = "the chef cooked the big red meal on the mat ."
    rows = show(str(directory), text, mask_prob=0.3, seed=1)
    tokens = ["[CLS]", *text.split(), "[SEP]"]
    assert [r.token for r in rows] == tokens
    masked = [i for i, r in enumerate(rows) if r.masked]
    assert len(masked) == 3 and 0 not in masked and len(rows) - 1 not in masked  # 30% of 10 words
    for r in rows:
        assert r.replaced == (r.shown != r.token) and (r.masked or r.shown == r.token)
    expected = _discriminator_by_hand(model.eval(), [r.shown for r in rows])
    assert max(abs(r.p_replaced - p) for r, p in zip(rows, expected)) < 1e-6
    assert rows == show(str(directory), text, mask_prob=0.3, seed=1)  # seeded


def test_show_never_masks_a_token_pre_training_never_chooses(tmp_path):
    # an [UNK] (a word the vocabulary lacks) was masked, which pre-training's masking never does
    from bertkit.pretraining.masking import MaskVocab

    model, directory = _electra_run(tmp_path)
    text = "the zebra sat on the qwerty mat ."  # zebra, qwerty: [UNK]
    rows = show(str(directory), text, mask_prob=1.0, seed=0)
    assert [r.token for r in rows].count("[UNK]") == 2
    never = MaskVocab.from_tokens(VOCAB).special_ids  # pre-training's rule, the reference
    assert [r.masked for r in rows] == [VOCAB.index(r.token) not in never for r in rows]


def test_show_uses_the_texts_own_masks_or_none(tmp_path):
    model, directory = _electra_run(tmp_path)
    rows = show(str(directory), "the [MASK] sat on the mat .")
    assert [r.masked for r in rows] == [False, False, True, False, False, False, False, False, False]
    as_written = show(str(directory), "the chef ate the meal .", mask_prob=0)
    assert not any(r.masked or r.replaced for r in as_written)
    expected = _discriminator_by_hand(model.eval(), [r.token for r in as_written])
    assert max(abs(r.p_replaced - p) for r, p in zip(as_written, expected)) < 1e-6


def test_cli_electra_show(tmp_path, capsys):
    _, directory = _electra_run(tmp_path)
    assert main(["electra", "show", str(directory), "the dog ran to the park .", "--seed", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["token", "discriminator", "read", "p(replaced)"] and len(out) == 1 + 9
    assert main(["electra", "show", str(directory / GENERATOR_DIR), "the dog"]) == 2
    assert "no generator/ subfolder" in capsys.readouterr().err
    # past the model's positions it judged the first ones and dropped the rest without a word
    assert main(["electra", "show", str(directory), "the dog ran to the park . " * 5]) == 2
    assert capsys.readouterr().err == ("bertkit: error: the text has 37 tokens but the model reads at most 32: "
                                       "electra show judges one pass, so shorten the text\n")


def test_cli_fill_mask_shows_the_pair_its_masks_are_counted_in(tmp_path, capsys):
    """With --pair the blocks ran to "[MASK] #3" under a header that showed the first text alone."""
    _, directory = _electra_run(tmp_path)
    assert main(["fill-mask", str(directory), ONE, "--pair", "the [MASK] went home .", "--top-k", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [ONE, "pair: the [MASK] went home ."] and out[2] == "[MASK] #1:" and "[MASK] #2:" in out
