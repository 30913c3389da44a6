"""ELECTRA's pre-training model: generator and discriminator trained together.

Clark et al. 2020, section 2 (the step is drawn in `bertkit.model.electra`'s docstring):
the generator's MLM logits at the masked positions are sampled (no gradient), the
samples replace the masked tokens, and the discriminator says for every real token
whether it was replaced:

    loss = mlm_loss + disc_weight * disc_loss            (disc_weight: the paper's lambda, 50: appendix A,
                                                          "Pre-Training Details"; google-research/electra's
                                                          configure_pretraining.py, disc_weight = 50.0)

`ElectraPretrainingModel` holds the two networks of `bertkit.model.electra` with one
shared embedding module; `sample_replacements` and `corrupt` are the two steps
between them; `ElectraPretrainingOutput.counts` and `electra_metrics` are what
pre-training logs (generator accuracy, discriminator accuracy, precision and recall
on replaced tokens). A pre-training directory holds the discriminator at its top
and the generator in `generator/`; only the discriminator goes on to fine-tuning.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bertkit.model.checkpoint import (GENERATOR_DIR, load_state, read_config, read_weights,
                                      save_pretrained as save_checkpoint, saving)
from bertkit.model.electra import IGNORE_INDEX, ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining, discriminator_loss
from bertkit.errors import BertkitError


@dataclass
class ElectraPretrainingOutput:
    """One ELECTRA step. `loss` = mlm_loss + disc_weight * disc_loss; `counts()` gives the sums
    behind the metrics (they add up over micro-batches and processes)."""

    loss: torch.Tensor
    mlm_loss: torch.Tensor  # mean cross-entropy over the M masked positions
    disc_loss: torch.Tensor  # mean binary cross-entropy over the real tokens
    mlm_logits: torch.Tensor  # [M, V], rows in the order of labels[labels != -100]
    disc_logits: torch.Tensor  # [B, T], > 0: "replaced"
    corrupted_ids: torch.Tensor  # [B, T]: the discriminator's input
    replaced: torch.Tensor  # [B, T] bool: the discriminator's labels
    targets: torch.Tensor  # [M]: the original ids at the masked positions
    sampled: torch.Tensor  # [M]: the generator's samples there
    real: torch.Tensor  # [B, T] bool: not padding

    @torch.no_grad()
    def counts(self) -> dict[str, float]:
        """Sums for the metrics (`electra_metrics` turns them into rates)."""
        predicted = (self.disc_logits > 0) & self.real
        replaced = self.replaced & self.real
        return {
            "tokens": float(self.real.sum()),
            "mlm_correct": float((self.mlm_logits.argmax(-1) == self.targets).sum()),
            "mlm_total": float(self.targets.numel()),
            "disc_correct": float(((self.disc_logits > 0) == self.replaced)[self.real].sum()),
            "disc_total": float(self.real.sum()),
            "replaced_found": float((predicted & replaced).sum()),  # true positives
            "replaced_predicted": float(predicted.sum()),
            "replaced_total": float(replaced.sum()),
            "sampled_original": float((self.sampled == self.targets).sum()),
        }


def electra_metrics(counts: dict) -> dict[str, float]:
    """Rates from summed counts: generator MLM accuracy, discriminator accuracy, precision and
    recall on replaced tokens, and the fraction of samples equal to the original."""
    out = {}
    if counts.get("mlm_total"):
        out["mlm_acc"] = counts["mlm_correct"] / counts["mlm_total"]
        out["sampled_original"] = counts["sampled_original"] / counts["mlm_total"]
    if counts.get("disc_total"):
        out["disc_acc"] = counts["disc_correct"] / counts["disc_total"]
    if counts.get("replaced_predicted"):
        out["disc_precision"] = counts["replaced_found"] / counts["replaced_predicted"]
    if counts.get("replaced_total"):
        out["disc_recall"] = counts["replaced_found"] / counts["replaced_total"]
    return out


@torch.no_grad()
def sample_replacements(logits: torch.Tensor, rng: torch.Generator | None = None) -> torch.Tensor:
    """One id per row drawn from softmax(logits) [M, V] -> [M], in float32, without gradient."""
    if logits.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=logits.device)
    if rng is not None and rng.device.type != logits.device.type:
        raise BertkitError(
            f"the sampling generator is on {rng.device} but the model runs on {logits.device}: "
            f"create it with torch.Generator(device='{logits.device.type}')"
        )
    probs = logits.detach().float().softmax(dim=-1)  # [M, V]
    return torch.multinomial(probs, 1, generator=rng).squeeze(1)  # [M]


def corrupt(input_ids: torch.Tensor, labels: torch.Tensor, sampled: torch.Tensor):
    """(corrupted_ids, replaced): the masked positions take the samples; a position counts as
    replaced exactly when its token now differs from the original, [B, T] each."""
    masked = labels != IGNORE_INDEX  # [B, T]
    original = torch.where(masked, labels, input_ids)  # [B, T]: the text before masking
    corrupted = input_ids.clone()
    corrupted[masked] = sampled  # row-major, the order of the generator's [M, V] logits
    return corrupted, corrupted != original


class ElectraPretrainingModel(nn.Module):
    """Generator and discriminator trained together (the module docstring); only the
    discriminator goes on to fine-tuning.

    forward(input_ids, labels, attention_mask, token_type_ids, rng) -> ElectraPretrainingOutput.
    `rng` draws the replacements (a torch.Generator on the model's device; None: torch's global
    generator of that device, which a training checkpoint's RNG state already covers, so a resumed
    run draws the same replacements).
    """

    def __init__(self, config: ElectraConfig, generator_config: ElectraConfig | None = None, *,
                 disc_weight: float = 50.0, generator: torch.Generator | None = None):
        super().__init__()
        generator_config = generator_config or config.generator_config()
        _check_pair(config, generator_config)
        self.config = config
        self.disc_weight = float(disc_weight)
        self.discriminator = ElectraForPreTraining(config, generator=generator)
        self.generator = ElectraForMaskedLM(generator_config, generator=generator)
        # one embedding module, two owners: both state-dict names refer to the same tensors
        self.generator.electra.embeddings = self.discriminator.electra.embeddings

    def forward(self, input_ids, labels, attention_mask=None, token_type_ids=None,
                rng: torch.Generator | None = None, next_sentence_label=None,
                sample_seed: torch.Tensor | None = None) -> ElectraPretrainingOutput:
        if labels is None:
            raise BertkitError("ELECTRA pre-training needs labels: the original ids at the masked positions, -100 elsewhere")
        if next_sentence_label is not None:
            raise BertkitError(
                "ELECTRA has no sentence-pair task: prepare the data with --objective none (single segments)"
            )
        if rng is None and sample_seed is not None:
            # a seed that travels with the batch (see pretraining.train): the replacements are then a
            # function of the batch alone, the same on any rank, in any process, after any resume
            rng = torch.Generator(device=input_ids.device).manual_seed(int(sample_seed))
        gen = self.generator(input_ids, attention_mask, token_type_ids, labels=labels)  # logits [M, V]
        sampled = sample_replacements(gen.logits, rng)  # [M]
        corrupted, replaced = corrupt(input_ids, labels, sampled)  # [B, T] each
        disc_logits = self.discriminator(corrupted, attention_mask, token_type_ids).logits  # [B, T]
        disc_loss = discriminator_loss(disc_logits, replaced, attention_mask)
        real = attention_mask.bool() if attention_mask is not None else torch.ones_like(replaced)
        return ElectraPretrainingOutput(
            loss=gen.loss + self.disc_weight * disc_loss,
            mlm_loss=gen.loss,
            disc_loss=disc_loss,
            mlm_logits=gen.logits,
            disc_logits=disc_logits,
            corrupted_ids=corrupted,
            replaced=replaced,
            targets=labels[labels != IGNORE_INDEX],
            sampled=sampled,
            real=real,
        )

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # shared embeddings counted once

    def set_gradient_checkpointing(self, enabled: bool = True) -> None:
        self.discriminator.set_gradient_checkpointing(enabled)
        self.generator.set_gradient_checkpointing(enabled)

    def save_pretrained(self, directory, tokenizer=None) -> None:
        """The discriminator at `directory`, the generator in `directory/generator/`: two
        Hugging Face ELECTRA directories (each with the tokenizer's files, when given), saved as one (`saving`)."""
        with saving(directory):
            save_checkpoint(self.discriminator, directory, tokenizer=tokenizer)
            save_checkpoint(self.generator, Path(directory) / GENERATOR_DIR, tokenizer=tokenizer)

    @classmethod
    def from_pretrained(cls, directory, *, disc_weight: float = 50.0, config_json: dict | None = None,
                        **changes) -> "ElectraPretrainingModel":
        """Both networks from a directory `save_pretrained` wrote (strict; the embeddings the two
        files hold must be equal, as they are when trained together); `changes`: config fields both
        take (e.g. the dropout of a continued run); `config_json`: the top config.json as the caller read it."""
        directory = Path(directory)
        layout = f"the discriminator at its top, the generator in {GENERATOR_DIR}/"
        # once: its kind and the discriminator's settings are one file's
        values = read_config(directory) if config_json is None else config_json
        if values.get("model_type", "bert") != "electra":  # not a run that lost its generator: another kind of model
            raise BertkitError(f"{directory} holds a BERT model, not an ELECTRA pre-training run (`bertkit pretrain run "
                               f"--method electra` writes one: {layout}); a BERT masked LM's guesses: bertkit fill-mask")
        if (directory / GENERATOR_DIR).is_dir() and not (directory / GENERATOR_DIR / "config.json").is_file():
            raise BertkitError(f"{directory / GENERATOR_DIR / 'config.json'} is missing: the generator's folder is "
                               "incomplete (a run writes its config.json, weights and vocab.txt)")
        if not (directory / GENERATOR_DIR / "config.json").is_file():
            raise BertkitError(
                f"{directory} has no {GENERATOR_DIR}/ subfolder: an ELECTRA pre-training directory holds {layout}"
            )
        config = ElectraConfig.from_file_dict(values, directory / "config.json").replace(**changes)
        generator_config = ElectraConfig.from_pretrained(directory / GENERATOR_DIR).replace(**changes)
        _check_pair(config, generator_config, saved=directory)
        model = cls(config, generator_config, disc_weight=disc_weight)
        gen_state, gen_path = read_weights(directory / GENERATOR_DIR)
        model.generator.load_report = load_state(model.generator, gen_state, strict=True, source=str(gen_path))
        shared = {k: v.clone() for k, v in model.discriminator.electra.embeddings.state_dict().items()}
        disc_state, disc_path = read_weights(directory)
        model.discriminator.load_report = load_state(model.discriminator, disc_state, strict=True, source=str(disc_path))
        for name, value in model.discriminator.electra.embeddings.state_dict().items():
            if not torch.equal(value, shared[name]):
                raise BertkitError(
                    f"{disc_path} and {gen_path} hold different embeddings ({name}): generator and "
                    "discriminator were not trained together, so they cannot share them"
                )
        return model.eval()


def _check_pair(config: ElectraConfig, generator_config: ElectraConfig, saved=None) -> None:
    """The settings the shared embeddings need equal in both networks (`saved`: the directory they were read from,
    where the fix is another folder, not a Python call)."""
    for name in ("vocab_size", "embedding_size", "max_position_embeddings", "type_vocab_size"):
        a, b = getattr(config, name), getattr(generator_config, name)
        if a != b and saved is not None:
            raise BertkitError(
                f"{saved}: its {GENERATOR_DIR}/ and the discriminator differ in {name} (discriminator {a}, "
                f"generator {b}), which the two networks share: that {GENERATOR_DIR}/ is another run's"
            )
        if a != b:
            raise BertkitError(
                f"generator and discriminator share their embeddings, so {name} must be equal (discriminator {a}, "
                f"generator {b}); build the generator's config with config.generator_config(size)"
            )
