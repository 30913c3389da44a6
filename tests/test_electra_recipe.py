"""ELECTRA pre-training as google-research/electra does it, through what `bertkit pretrain run --method electra`
builds: its masks and its named shapes.

- Masking (pretrain/pretrain_helpers.py `mask`): 15% of the tokens, round(L x 0.15) per row as BERT's budget,
  and each shown as [MASK] where `tf.random.uniform([B, N]) < 0.85`, as itself elsewhere: no random token.
  BERT's 80/10/10 stays BERT's. The shares are checked on the run's own batches of real prepared text, with
  tolerances of 4.5 binomial standard deviations.
- Shapes: `--config electra-small` is ELECTRA-Small's discriminator (transformers' ElectraConfig defaults and
  google/electra-small-discriminator's config.json, its numbers written below: nothing is downloaded) with the
  generator of run_pretraining.py's get_generator_config at 1/4; `--config small` keeps meaning BERT-small and
  says so.
"""

import json
import math

import pytest
import torch

from bertkit import BertkitError
from bertkit.cli import build_parser
from bertkit.options import from_args
from bertkit.pretraining.held_out import open_prepared
from bertkit.pretraining.prepare import PrepareConfig, prepare
from bertkit.pretraining.run_config import RunConfig
from bertkit.pretraining.train import build_model, namesake_note
from pretrain_support import BOOKS, make_prepared_data

MASK_ID = 103  # [MASK] in the default model's vocabulary, which prepare uses


@pytest.fixture(scope="module")
def dynamic_data(shared_data, tmp_path_factory):
    return make_prepared_data(shared_data, tmp_path_factory.mktemp("dynamic"), objective="none")


@pytest.fixture(scope="module")
def static_data(shared_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("static")
    corpus = tmp / "corpus"
    corpus.mkdir()
    for name in BOOKS:
        text = (shared_data / "pretrain_corpus" / "gutenberg" / name).read_text(encoding="utf-8")
        (corpus / name).write_text(text[:25_000], encoding="utf-8")
    cfg = PrepareConfig(max_seq_length=32, objective="none", dynamic_masking=False, dupe_factor=1,
                        documents="file", workers=1, seed=3)
    prepare([corpus], tmp / "data", cfg, progress=False)
    return tmp / "data"


def run_batches(data, method, batches=60, **flags):
    """The run's training batches: its collate over its training instances, each seeded by its position
    (as BatchStream draws them)."""
    cfg = RunConfig(data=str(data), method=method, eval_every=0, **flags).validate()
    _, train_set, _, collate, _ = open_prepared(cfg, cfg.seed)
    n = len(train_set)
    return [collate([train_set[(b * 32 + i) % n] for i in range(32)], torch.Generator().manual_seed(b))
            for b in range(batches)]


def shown(batches):
    """Counts of what the masked positions were shown as: [MASK], the token itself, another token."""
    counts = {"mask": 0, "kept": 0, "random": 0, "rows": 0}
    for batch in batches:
        chosen = batch["labels"] != -100
        seen, original = batch["input_ids"][chosen], batch["labels"][chosen]
        counts["mask"] += int((seen == MASK_ID).sum())
        counts["kept"] += int((seen == original).sum())
        counts["random"] += int(((seen != MASK_ID) & (seen != original)).sum())
        lengths = batch["attention_mask"].sum(1)
        # the budget of pretrain_helpers.mask: max(1, min(N, round(L * 0.15))), L counting [CLS] and [SEP]
        budget = torch.round(lengths.double() * 0.15).long().clamp(1, 20)
        assert torch.equal(chosen.sum(1), budget)
        counts["rows"] += len(lengths)
    return counts


def assert_share(count, total, p):
    """count/total within 4.5 binomial standard deviations of p (exactly p where p is 0 or 1)."""
    sd = math.sqrt(p * (1 - p) / total)
    assert abs(count / total - p) <= 4.5 * sd, (count, total, p, sd)


@pytest.mark.parametrize("data", ["dynamic_data", "static_data"])
def test_electra_masks_85_percent_as_mask_and_keeps_the_rest(data, request):
    """On main the ELECTRA run masked as BERT: ~10% of its masked positions showed a random token."""
    counts = shown(run_batches(request.getfixturevalue(data), "electra"))
    total = counts["mask"] + counts["kept"] + counts["random"]
    assert total > 5_000
    assert counts["random"] == 0
    assert_share(counts["mask"], total, 0.85)
    assert_share(counts["kept"], total, 0.15)


@pytest.mark.parametrize("data", ["dynamic_data", "static_data"])
def test_bert_masking_is_unchanged_80_10_10(data, request):
    """MLM runs get the very batches the collator made before the ELECTRA rule existed, 80/10/10."""
    path = request.getfixturevalue(data)
    batches = run_batches(path, "bert", batches=40)
    cfg = RunConfig(data=str(path), eval_every=0)
    _, train_set, _, _, _ = open_prepared(cfg, cfg.seed)
    from bertkit.pretraining.dataset import PretrainingDataset

    before = PretrainingDataset(path, seed=cfg.seed).collator(seed=cfg.seed)  # no rule given: what it always did
    for b, batch in enumerate(batches[:5]):
        again = before([train_set[(b * 32 + i) % len(train_set)] for i in range(32)], torch.Generator().manual_seed(b))
        assert all(torch.equal(batch[k], again[k]) for k in batch)
    counts = shown(batches)
    total = counts["mask"] + counts["kept"] + counts["random"]
    # a random token equal to the original (1 in ~30,000) counts as kept
    for kind, p in (("mask", 0.8), ("kept", 0.1), ("random", 0.1)):
        assert_share(counts[kind], total, p)


def test_static_electra_masks_keep_the_prepared_positions(static_data):
    electra, bert = run_batches(static_data, "electra", batches=3), run_batches(static_data, "bert", batches=3)
    for a, b in zip(electra, bert):
        assert torch.equal(a["labels"], b["labels"])
        unchosen = a["labels"] == -100
        assert torch.equal(a["input_ids"][unchosen], b["input_ids"][unchosen])


def test_the_replacement_shares_can_be_set_and_are_checked(dynamic_data):
    counts = shown(run_batches(dynamic_data, "electra", batches=20, mask_replace_prob=0.8, random_replace_prob=0.1))
    total = counts["mask"] + counts["kept"] + counts["random"]
    assert_share(counts["random"], total, 0.1)  # the old ELECTRA masking, for comparing with runs made by it
    with pytest.raises(BertkitError, match="--mask-replace-prob 0.95 and --random-replace-prob 0.1"):
        RunConfig(data=str(dynamic_data), mask_replace_prob=0.95).validate()


def test_an_electra_run_saved_before_the_rule_resumes_masking_as_it_ran(tmp_path, dynamic_data):
    """Its run_config.json has no replacement shares: it masked 80/10/10, and goes on so."""
    out = tmp_path / "run"
    out.mkdir()
    saved = RunConfig(data=str(dynamic_data), output=str(out), method="electra").to_dict()
    del saved["mask_replace_prob"], saved["random_replace_prob"]
    (out / "run_config.json").write_text(json.dumps(saved))
    args = build_parser().parse_args(["pretrain", "run", str(dynamic_data), "-o", str(out), "--resume"])
    assert from_args(args, RunConfig).replacement() == (0.8, 0.1)
    fresh = build_parser().parse_args(["pretrain", "run", str(dynamic_data), "-o", str(tmp_path / "new"),
                                       "--method", "electra"])
    assert from_args(fresh, RunConfig).replacement() == (0.85, 0.0)


# --- named shapes -------------------------------------------------------------------------------------

# google/electra-small-discriminator's config.json (the released model; transformers' ElectraConfig defaults)
ELECTRA_SMALL = dict(embedding_size=128, hidden_size=256, num_hidden_layers=12, num_attention_heads=4,
                     intermediate_size=1024, max_position_embeddings=512, type_vocab_size=2, hidden_act="gelu",
                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.02,
                     layer_norm_eps=1e-12)


@pytest.mark.oracle
def test_electra_small_is_the_papers_electra_small(transformers_mod, tmp_path):
    model = build_model(RunConfig(data=str(tmp_path), method="electra", config="electra-small"), vocab_size=30522,
                        objective="none")
    disc, gen = model.discriminator.config, model.generator.config
    assert {k: getattr(disc, k) for k in ELECTRA_SMALL} == ELECTRA_SMALL
    oracle = transformers_mod.ElectraConfig()
    assert {k: getattr(disc, k) for k in ELECTRA_SMALL} == {k: getattr(oracle, k) for k in ELECTRA_SMALL}
    # run_pretraining.py get_generator_config at generator_hidden_size 0.25: hidden round(256 x 0.25) = 64,
    # heads max(1, 64 // 64) = 1, intermediate 4 x 64; layers and the shared 128-wide embeddings unchanged
    assert (gen.hidden_size, gen.num_attention_heads, gen.intermediate_size) == (64, 1, 256)
    assert (gen.num_hidden_layers, gen.embedding_size) == (12, 128)
    assert model.generator.electra.embeddings is model.discriminator.electra.embeddings


def test_electra_base_and_large_take_the_papers_generators(tmp_path):
    """Table 6: generator 1/3 of ELECTRA-Base (google/electra-base-generator: hidden 256, 4 heads, 1024), 1/4 of
    ELECTRA-Large (google/electra-large-generator: the same)."""
    from bertkit.model.electra import ElectraConfig

    for name, (layers, hidden, embedding) in {"base": (12, 768, 768), "large": (24, 1024, 1024)}.items():
        cfg = RunConfig(data=str(tmp_path), method="electra", config=f"electra-{name}").validate()
        disc = ElectraConfig.preset(name)
        gen = disc.generator_config(cfg.generator_fraction())
        assert (disc.num_hidden_layers, disc.hidden_size, disc.embedding_size) == (layers, hidden, embedding)
        assert (gen.hidden_size, gen.num_attention_heads, gen.intermediate_size) == (256, 4, 1024), name


def test_small_with_electra_stays_bert_small_and_says_so(tmp_path):
    cfg = RunConfig(data=str(tmp_path), method="electra", config="small")
    model = build_model(cfg, vocab_size=1000, objective="none")
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.embedding_size) == (4, 512, 512)
    note = namesake_note(cfg)
    assert "BERT-small's shape (4 layers, hidden 512" in note and "--config electra-small" in note
    assert "generator 0.333) is --config electra-base" in namesake_note(RunConfig(data="d", method="electra",
                                                                                  config="base"))
    assert namesake_note(RunConfig(data="d", method="electra", config="large")) is None  # the same model
    with pytest.raises(BertkitError, match="--config electra-small is the ELECTRA paper's discriminator: pre-train "
                                           "it with --method electra"):
        RunConfig(data=str(tmp_path), config="electra-small").validate()


# google-research/electra configure_pretraining.py (PretrainingConfig), transcribed: "small" takes the file's own
# values (learning_rate 5e-4, train_batch_size 128), "base" and "large" its commented block ("see Table 6 in the
# paper": learning_rate 2e-4, train_batch_size 256 and 2048); all: num_warmup_steps 10000 of num_train_steps
# 1000000, weight_decay_rate 0.01; model/optimization.py's AdamWeightDecayOptimizer epsilon 1e-6.
ELECTRA_RUNS = {"small": (5e-4, 128), "base": (2e-4, 256), "large": (2e-4, 2048)}


def parsed(data, *flags):
    return from_args(build_parser().parse_args(["pretrain", "run", str(data), *flags]), RunConfig)


def test_an_electra_preset_runs_at_the_reference_settings_and_a_given_flag_wins(tmp_path):
    """`--config electra-small` ran at BERT's run defaults (learning rate 1e-4, batch 32), not ELECTRA's."""
    for name, (learning_rate, batch) in ELECTRA_RUNS.items():
        cfg = parsed(tmp_path, "--method", "electra", "--config", f"electra-{name}")
        assert (cfg.optim.learning_rate, cfg.batch_size) == (learning_rate, batch), name
        assert (cfg.optim.warmup_ratio, cfg.optim.weight_decay, cfg.optim.adam_epsilon) == (10000 / 1000000, 0.01,
                                                                                             1e-6)
    given = parsed(tmp_path, "--method", "electra", "--config", "electra-base", "--learning-rate", "1e-3",
                   "--batch-size", "256", "--weight-decay", "0")
    assert (given.optim.learning_rate, given.batch_size, given.optim.weight_decay) == (1e-3, 256, 0)
    from bertkit.pretraining.run_config import preset_note

    note = preset_note(given)
    assert "--learning-rate 0.001 (given; electra-base's 0.0002)" in note
    assert "--batch-size 256 (electra-base's)" in note and "--weight-decay 0 (given; electra-base's 0.01)" in note
    bert = parsed(tmp_path, "--method", "electra", "--config", "small")  # BERT-small's shape: BERT's run
    assert (bert.optim.learning_rate, bert.batch_size) == (1e-4, 32) and preset_note(bert) is None
    # --resume goes on with the settings the run saved (one started at batch 32 keeps it)
    out = tmp_path / "run"
    out.mkdir()
    saved = RunConfig(data=str(tmp_path), output=str(out), method="electra", config="electra-small")
    saved.save(out / "run_config.json")
    resumed = parsed(tmp_path, "-o", str(out), "--resume")
    assert (resumed.optim.learning_rate, resumed.batch_size) == (1e-4, 32)


# --- fine-tuning the discriminator with layer-wise rates -----------------------------------------------

def test_finetune_classify_takes_electras_layerwise_rates(tmp_path):
    """`finetune classify --layerwise-lr-decay 0.8` (ELECTRA's fine-tuning): after one AdamW step from the
    discriminator, each tensor moved by at most its rate, 1e-3 x 0.8^(num_layers + 2 - depth), and the largest
    move reaches it (Adam's first step is the rate times the gradient's sign)."""
    from safetensors.torch import load_file

    from bertkit.cli import main
    from bertkit.model.electra import ElectraConfig, ElectraForPreTraining
    from bertkit.text.tokenizer import Tokenizer

    words = "the movie food was good bad great awful very fine poor".split()
    (tmp_path / "disc").mkdir()
    (tmp_path / "disc" / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    config = ElectraConfig(vocab_size=16, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=20, embedding_size=8, max_position_embeddings=16)
    ElectraForPreTraining(config, generator=torch.Generator().manual_seed(0)).save_pretrained(
        tmp_path / "disc", tokenizer=Tokenizer.from_pretrained(tmp_path / "disc" / "vocab.txt"))
    rows = [f"the {w} was {'good' if i % 2 else 'bad'}\t{i % 2}" for i, w in enumerate(["movie", "food"] * 4)]
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    code = main(["finetune", "classify", "--model", str(tmp_path / "disc"), "--train", str(tmp_path / "train.tsv"),
                 "--text-column", "sentence", "--output", str(tmp_path / "ft"), "--max-steps", "1", "--batch-size",
                 "8", "--learning-rate", "1e-3", "--warmup-ratio", "0", "--schedule", "constant", "--weight-decay",
                 "0", "--adam-epsilon", "1e-15", "--layerwise-lr-decay", "0.8", "--no-progress", "--seed", "1"])
    assert code == 0
    before, after = load_file(tmp_path / "disc" / "model.safetensors"), load_file(tmp_path / "ft" / "model.safetensors")
    scales = {"embeddings": 0.8 ** 4, "layer.0.": 0.8 ** 3, "layer.1.": 0.8 ** 2}  # the head: 1 (new, not compared)
    for name, weight in before.items():
        where = next((k for k in scales if k in name), None)
        if where is None or name.endswith("key.bias"):  # softmax ignores a shift of every score: no gradient
            continue
        moved = (after[name] - weight).abs().max().item()
        assert moved == pytest.approx(1e-3 * scales[where], rel=1e-2), name  # next scale: 20% away
