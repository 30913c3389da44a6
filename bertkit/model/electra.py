"""ELECTRA: pre-training by replaced-token detection.

Clark et al. 2020, "ELECTRA: Pre-training Text Encoders as Discriminators Rather
Than Generators" (section 2, figure 2). A small masked-LM *generator* fills the
masked positions with words sampled from its softmax ("plausible substitutions");
the *discriminator*, the model that goes on to fine-tuning, reads the corrupted
text and says for every token whether it was replaced. It learns from all real
tokens, not only the 15% that were masked.

    input_ids [B, T] (with [MASK]), labels [B, T] (the original id where masked, -100 elsewhere)
      -> generator -> MLM logits [M, V] at the M masked positions, mlm_loss
      -> sample M ids from softmax (no gradient) -> corrupted_ids [B, T]
      -> replaced [B, T] = corrupted_ids != original ids (a sample equal to the original is "original")
      -> discriminator -> one logit per token [B, T], binary cross-entropy over real tokens
      loss = mlm_loss + disc_weight * disc_loss                       (disc_weight: the paper's lambda, 50)

(lambda = 50: the paper's appendix A, "Pre-Training Details": the discriminator's binary loss runs much lower
than the generator's 30,000-way one, and 50 was chosen among 1, 10, 20, 50 and 100 in early experiments;
google-research/electra's configure_pretraining.py, `disc_weight = 50.0`.)

Both networks are BERT encoders (the layers of `bertkit.model.modeling`, reused), with
two changes of ELECTRA's published models: embeddings are `embedding_size` wide and
projected to `hidden_size` by `embeddings_project` where the two differ, and the
generator is smaller (hidden, heads and feed-forward a fraction of the
discriminator's, 1/4 by default: paper section 3.2). The two share one embedding
module (token, position and segment embeddings with their LayerNorm), as in the
original code; the generator's MLM decoder is tied to those word embeddings.

The model classes and their Hugging Face names (checkpoint keys in
bertkit.model.checkpoint.ELECTRA_TABLE). ELECTRA's encoder is a BertModel (one forward)
that embeds differently and has no pooler; its heads are BERT's, with ELECTRA's modules where
the published models have their own:

    ElectraModel                       BertModel: embeddings [B, T, E] -> projection -> layers; no pooler
    ElectraForPreTraining              the discriminator: logits [B, T] (> 0: replaced)
    ElectraForMaskedLM                 BertForMaskedLM with GeneratorHead: logits [B, T, V] / [M, V] with labels
    ElectraForSequenceClassification   BertForSequenceClassification with ElectraClassificationHead on the first token
    ElectraForTokenClassification      BertForTokenClassification: a linear layer on every token
    ElectraForQuestionAnswering        BertForQuestionAnswering: start/end logits [B, T]
    (ElectraPretrainingModel, generator + discriminator, is in bertkit.model.electra_pretraining)

A pre-training output directory holds the discriminator (ElectraForPreTraining, the
model fine-tuning and features load) at its top and the generator
(ElectraForMaskedLM) in `generator/`: both are ordinary Hugging Face directories.

Deviations from the paper's code: the generator keeps the discriminator's head size
(64 in every published shape) and scales the number of heads, so hidden_size =
heads x head size may round (ELECTRA-Base at 1/4: 3 heads, hidden 192); its feed-
forward keeps the discriminator's ratio to hidden. Replacements are sampled with
torch.multinomial from a float32 softmax instead of by the Gumbel trick (the same
distribution). Which positions are masked and how is the masking code's business (an ELECTRA
run shows them 85% [MASK], 15% kept, as the reference: bertkit.pretraining.run_config.REPLACEMENT);
every labelled position is sampled and replaced. The reference draws the positions with
replacement (tf.random.categorical), so a full 128-token row has ~17.7 distinct masked
positions of its 19; here exactly 19 (BERT's choice of a subset).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.model.config import ELECTRA_PRESETS, IGNORE_INDEX, BertConfig
from bertkit.errors import BertkitError, int_at_least
from bertkit.model.heads import (BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification,
                                 BertForTokenClassification, encode, check_labels, classifier_dropout, untied_decoder)
from bertkit.model.modeling import (BertEmbeddings, BertEncoder, BertModel, BertPreTrainedModel, activation,
                                    init_weights)

PRESETS = ELECTRA_PRESETS  # the discriminators of the paper's table 6 (bertkit.model.config)


# --- config -------------------------------------------------------------------------


@dataclass
class ElectraConfig(BertConfig):
    """BertConfig plus `embedding_size`; defaults are ELECTRA-Small's discriminator (as HF's).

    HF's `summary_*` keys (used by its multiple-choice head, not here) ride along in `extra`;
    `classifier_pooling` is "cls" only: ELECTRA's classification head reads the first token.
    """

    model_type: ClassVar[str] = "electra"  # the config.json model_type; picks the checkpoint layout

    hidden_size: int = 256
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    embedding_size: int = 128

    def validate(self) -> None:
        super().validate()
        int_at_least(self.embedding_size, 1, "ElectraConfig.embedding_size", says="a positive integer")
        # refused, not ignored: `finetune classify --pooling mean` once trained a first-token classifier under
        # a config.json saying "mean" (and transformers reads an ELECTRA classifier's first token regardless)
        if self.classifier_pooling != "cls":
            raise BertkitError(
                f"ElectraConfig.classifier_pooling is {self.classifier_pooling!r}, but ELECTRA's classification head "
                "reads the first token (as transformers' ElectraClassificationHead): leave --pooling at cls for an "
                "ELECTRA model"
            )

    @classmethod
    def preset(cls, name: str, **overrides) -> "ElectraConfig":
        """A discriminator shape of the paper: small, base, large (any field can be overridden)."""
        if name not in PRESETS:
            raise BertkitError(f"unknown ElectraConfig preset {name!r}; choose one of {list(PRESETS)}")
        layers, hidden, heads, embedding, _ = PRESETS[name]
        values = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                      intermediate_size=4 * hidden, embedding_size=embedding)
        return cls(**{**values, **overrides})

    def generator_config(self, size: float = 0.25) -> "ElectraConfig":
        """The generator for this discriminator: `size` of its heads (head size kept, at least one),
        hidden = heads x head size, the feed-forward in the same ratio; layers and embeddings equal."""
        if not (0.0 < size <= 1.0):
            raise BertkitError(f"the generator size is a fraction of the discriminator's in (0, 1], got {size!r}")
        heads = max(1, round(self.num_attention_heads * size))
        hidden = heads * self.head_size
        intermediate = max(1, round(self.intermediate_size * hidden / self.hidden_size))
        return self.replace(hidden_size=hidden, num_attention_heads=heads, intermediate_size=intermediate,
                            architectures=None)

    @classmethod
    def from_dict(cls, values: dict) -> "ElectraConfig":
        values = dict(values)
        kind = values.pop("model_type", "electra")
        if kind != "electra":
            raise BertkitError(
                f"this config is for model_type {kind!r}, not 'electra': load it with the BERT classes "
                "(bertkit.BertModel, BertForMaskedLM, ...)"
            )
        if values.get("classifier_pooling") == "mean":
            # what `finetune classify --pooling mean` wrote before it was refused: the head was trained on the
            # first token all the same, so the folder is read as it was trained, not refused at every load
            warnings.warn("this ELECTRA config.json says classifier_pooling 'mean', which ELECTRA's head never "
                          "used: read as 'cls', the first token it was trained on", stacklevel=2)
            values["classifier_pooling"] = "cls"
        return super().from_dict(values)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "model_type": "electra"}


# --- the encoder ----------------------------------------------------------------------


class ElectraEmbeddings(BertEmbeddings):
    """BERT's embeddings (same forward) at width E = embedding_size instead of H."""

    def __init__(self, config: ElectraConfig):
        super().__init__(config, width=config.embedding_size)


class ElectraPreTrainedModel(BertPreTrainedModel):
    """What every ELECTRA class shares: an ElectraConfig, the encoder under `electra`, and
    loading/saving in HF's ELECTRA format."""

    config_class = ElectraConfig  # what checkpoint.load_pretrained reads config.json as
    base_model_prefix = "electra"

    def __init__(self, config: ElectraConfig):
        if not isinstance(config, ElectraConfig):
            raise BertkitError(f"expected an ElectraConfig, got {type(config).__name__}; try ElectraConfig.preset('small')")
        super().__init__(config)


class ElectraModel(BertModel, ElectraPreTrainedModel):
    """embeddings [B, T, E] -> (embeddings_project, where E != H) [B, T, H] -> L BERT layers.

    BertModel with ELECTRA's embeddings and no pooler: its forward (BertModel's) takes the same
    arguments and returns a BertOutput with pooler_output None (ELECTRA's heads read the first
    token or every token).
    """

    def __init__(self, config: ElectraConfig, generator: torch.Generator | None = None):
        ElectraPreTrainedModel.__init__(self, config)
        self.embeddings = ElectraEmbeddings(config)
        project = config.embedding_size != config.hidden_size
        self.embeddings_project = nn.Linear(config.embedding_size, config.hidden_size) if project else None
        self.encoder = BertEncoder(config)
        self.pooler = None
        init_weights(self, config.initializer_range, generator)

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        x = self.embeddings(input_ids, token_type_ids)  # [B, T, E]
        return x if self.embeddings_project is None else self.embeddings_project(x)  # [B, T, E] -> [B, T, H]


# --- heads ---------------------------------------------------------------------------------


class DiscriminatorHead(nn.Module):
    """Replaced or original, per token: dense H -> H, the config's activation, dense H -> 1
    (HF ElectraDiscriminatorPredictions)."""

    def __init__(self, config: ElectraConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(self.act(self.dense(x))).squeeze(-1)  # [B, T, H] -> [B, T]


class GeneratorHead(nn.Module):
    """The generator's MLM head: dense H -> E, GELU (always, as in HF), LayerNorm(E), then the
    word embeddings [V, E] transposed (tied) plus a bias per vocabulary entry
    (HF ElectraGeneratorPredictions + generator_lm_head)."""

    def __init__(self, config: ElectraConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.layer_norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder = untied_decoder(config, config.embedding_size)  # None: tied (tie_word_embeddings)

    def forward(self, x: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        x = self.layer_norm(F.gelu(self.dense(x)))  # [..., H] -> [..., E]
        return F.linear(x, word_embeddings, self.bias)  # [..., E] x [V, E]^T -> [..., V]


class ClassificationHead(nn.Module):
    """HF ElectraClassificationHead: the first token's vector, dropout, dense H -> H, GELU (not
    BERT's tanh pooler), dropout, out_proj H -> num_labels."""

    def __init__(self, config: ElectraConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = classifier_dropout(config)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.dense(self.dropout(x[:, 0])))  # [B, T, H] -> [B, H]
        return self.out_proj(self.dropout(x))  # [B, num_labels]


@dataclass
class DiscriminatorOutput:
    """ElectraForPreTraining: one logit per token (> 0: replaced); loss with labels."""

    loss: torch.Tensor | None
    logits: torch.Tensor  # [B, T]
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def discriminator_loss(logits: torch.Tensor, replaced: torch.Tensor, attention_mask: torch.Tensor | None):
    """Mean binary cross-entropy over the real tokens (padding gets no loss), [B, T] -> []."""
    if attention_mask is None:
        return F.binary_cross_entropy_with_logits(logits, replaced.to(logits.dtype))
    real = attention_mask.bool()
    return F.binary_cross_entropy_with_logits(logits[real], replaced[real].to(logits.dtype))


class ElectraForPreTraining(ElectraPreTrainedModel):
    """The discriminator: for every token, was it replaced? labels [B, T]: 1 replaced, 0 original."""

    def __init__(self, config: ElectraConfig, generator: torch.Generator | None = None):
        super().__init__(config)
        self.electra = ElectraModel(config, generator=generator)
        self.discriminator_predictions = DiscriminatorHead(config)
        init_weights(self.discriminator_predictions, config.initializer_range, generator)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> DiscriminatorOutput:
        out = encode(self, input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        logits = self.discriminator_predictions(out.last_hidden_state)  # [B, T]
        loss = None
        if labels is not None:
            check_labels(labels, logits.shape, "labels (1 replaced / 0 original per token)", 2, integer=False)
            loss = discriminator_loss(logits, labels, attention_mask)
        return DiscriminatorOutput(loss, logits, out.hidden_states, out.attentions)


# The generator and the fine-tuning heads are BERT's (their forward, losses and outputs) on the
# ELECTRA encoder; each builds its modules under HF ELECTRA's names (bertkit.model.checkpoint).


class ElectraForMaskedLM(BertForMaskedLM, ElectraPreTrainedModel):
    """The generator: BertForMaskedLM with ELECTRA's head (GeneratorHead: H -> E, decoder tied to the
    [V, E] word embeddings). With labels, logits only at the labelled positions ([M, V]); without, [B, T, V]."""

    def __init__(self, config: ElectraConfig, generator: torch.Generator | None = None):
        ElectraPreTrainedModel.__init__(self, config)
        self.electra = ElectraModel(config, generator=generator)
        self.generator_predictions = GeneratorHead(config)
        init_weights(self.generator_predictions, config.initializer_range, generator)

    @property
    def mlm(self) -> GeneratorHead:
        """The head BertForMaskedLM.forward calls, under HF ELECTRA's name."""
        return self.generator_predictions


class ElectraForSequenceClassification(BertForSequenceClassification, ElectraPreTrainedModel):
    """BertForSequenceClassification (its loss and problem types) with ElectraClassificationHead on
    the first token instead of the pooler."""

    def __init__(self, config: ElectraConfig, generator: torch.Generator | None = None):
        ElectraPreTrainedModel.__init__(self, config)
        self.electra = ElectraModel(config, generator=generator)
        self.classifier = ClassificationHead(config)
        init_weights(self.classifier, config.initializer_range, generator)

    def scores(self, out, attention_mask) -> torch.Tensor:
        return self.classifier(out.last_hidden_state)  # [B, T, H] -> [B, num_labels]


class ElectraForTokenClassification(BertForTokenClassification, ElectraPreTrainedModel):
    """BertForTokenClassification on the ELECTRA encoder: a linear layer on every token's final vector."""

    def __init__(self, config: ElectraConfig, generator: torch.Generator | None = None):
        ElectraPreTrainedModel.__init__(self, config)
        self.electra = ElectraModel(config, generator=generator)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        init_weights(self.classifier, config.initializer_range, generator)


class ElectraForQuestionAnswering(BertForQuestionAnswering, ElectraPreTrainedModel):
    """BertForQuestionAnswering on the ELECTRA encoder: start/end logits [B, T]."""

    def __init__(self, config: ElectraConfig, generator: torch.Generator | None = None):
        ElectraPreTrainedModel.__init__(self, config)
        self.electra = ElectraModel(config, generator=generator)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        init_weights(self.qa_outputs, config.initializer_range, generator)


HEADS = (ElectraForPreTraining, ElectraForMaskedLM, ElectraForSequenceClassification,
         ElectraForTokenClassification, ElectraForQuestionAnswering)
