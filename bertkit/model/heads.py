"""Task heads on top of the encoder: BERT's pre-training heads and its fine-tuning heads.

Devlin et al. 2019, section 3.1 (masked LM, next sentence prediction) and figure 4
(fine-tuning: a classifier on [CLS] for sentences and pairs, on every token for
tagging, start/end vectors for SQuAD spans, one score per choice for SWAG). Each
head is a small module after `self.bert` (a BertModel); names, checkpoint keys and
losses follow transformers so their checkpoints load here (bertkit.model.checkpoint).

Shapes (legend in bertkit.model.modeling): input_ids [B, T] ([B, C, T] for multiple
choice, C choices). Labels use -100 for positions to ignore. Every forward returns
a dataclass whose `loss` is None when no labels were given.

    head                               logits                        loss
    BertForPreTraining                 prediction [B, T, V] / [M, V]  mean MLM CE + mean NSP CE
                                       seq_relationship [B, 2]
    BertForMaskedLM                    [B, T, V] / [M, V]             mean CE over labelled tokens
    BertForNextSentencePrediction      [B, 2]                         CE (0 = B follows A, 1 = random)
    BertForSequenceClassification      [B, num_labels]                MSE (1 label) / CE / BCE (multi-label)
    BertForTokenClassification         [B, T, num_labels]             CE over labelled tokens
    BertForQuestionAnswering           start, end [B, T]              (CE start + CE end) / 2
    BertForMultipleChoice              [B, C]                         CE over choices

Masked LM with labels: the vocabulary projection (the largest matmul in BERT,
[., H] x [H, V]) runs only at the M positions whose label is not -100, as in the
original run_pretraining.py (`gather_indexes`). The logits are then [M, V], rows
in the order of `labels[labels != -100]` (batch-major, then position). Without
labels they are [B, T, V]. A batch with no labelled position has MLM loss 0 (not
NaN as a mean over nothing would be).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.model.config import IGNORE_INDEX, BertConfig
from bertkit.model.cross_entropy import cross_entropy
from bertkit.model.dropout import Dropout
from bertkit.errors import BertkitError
from bertkit.model.modeling import (BertModel, BertPreTrainedModel, activation, init_weights,
                                    pool_sentence)


@dataclass
class HeadOutput:
    """Loss (None without labels), logits, and the encoder's per-layer outputs if requested."""

    loss: torch.Tensor | None
    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class PreTrainingOutput:
    """BertForPreTraining: loss = mlm_loss + nsp_loss (each a mean), and both heads' logits."""

    loss: torch.Tensor | None
    prediction_logits: torch.Tensor  # [B, T, V], or [M, V] at the labelled positions when labels are given
    seq_relationship_logits: torch.Tensor  # [B, 2]
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class QuestionAnsweringOutput:
    """Span scores: the answer starts at argmax start_logits and ends at argmax end_logits."""

    loss: torch.Tensor | None
    start_logits: torch.Tensor  # [B, T]
    end_logits: torch.Tensor  # [B, T]
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


# --- the pieces --------------------------------------------------------------------


class MaskedLMHead(nn.Module):
    """transform (dense H -> H, gelu, LayerNorm), then the decoder: the word-embedding
    matrix transposed (tied, not a copy) plus a bias per vocabulary entry. With
    `tie_word_embeddings` false (a checkpoint trained so) the decoder is a [V, H] matrix of its own."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder = untied_decoder(config, config.hidden_size)

    def forward(self, x: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        x = self.layer_norm(self.act(self.transform(x)))  # [..., H]
        return F.linear(x, word_embeddings, self.bias)  # [..., H] x [V, H]^T -> [..., V]


def untied_decoder(config: BertConfig, width: int) -> nn.Linear | None:
    """The masked-LM decoder [V, width] of a model whose config unties it from the word embeddings; None when tied."""
    return None if config.tie_word_embeddings else nn.Linear(width, config.vocab_size, bias=False)


def check_labels(labels: torch.Tensor, shape: tuple, name: str, num_classes: int | None = None, *,
                 integer: bool | None = None) -> None:
    """Labels must be a tensor matching the batch and, for classes, lie in [0, num_classes) or be -100.
    integer (default: whether there are classes): they index, so they must be integers (a float or
    bool tensor fails inside cross-entropy, after the forward pass)."""
    if not isinstance(labels, torch.Tensor):
        raise BertkitError(f"{name} must be a torch tensor of shape {tuple(shape)}, got {type(labels).__name__} "
                           "(wrap it in torch.tensor(...))")
    if tuple(labels.shape) != tuple(shape):
        raise BertkitError(f"{name} must have shape {tuple(shape)}, got {tuple(labels.shape)}")
    if (num_classes is not None if integer is None else integer) and (
            labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool):
        raise BertkitError(f"{name} must be integer ids (torch.long), got {labels.dtype}: use labels.long()")
    if num_classes is not None:
        kept = labels[labels != IGNORE_INDEX]
        if kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= num_classes):
            raise BertkitError(
                f"{name} must be class ids in [0, {num_classes}) or {IGNORE_INDEX} (ignored), "
                f"found {int(kept.min()) if int(kept.min()) < 0 else int(kept.max())}"
            )


def masked_lm(head: MaskedLMHead, word_embeddings, sequence_output, labels):
    """(logits, loss): all positions without labels; only the labelled ones with labels. The decoder is
    `word_embeddings` [V, H] (tied), or the head's own matrix when it has one."""
    if head.decoder is not None:
        word_embeddings = head.decoder.weight
    if labels is None:
        return head(sequence_output, word_embeddings), None  # [B, T, V]
    check_labels(labels, sequence_output.shape[:2], "labels (masked LM)", word_embeddings.shape[0])
    selected = labels != IGNORE_INDEX  # [B, T]
    logits = head(sequence_output[selected], word_embeddings)  # [M, H] -> [M, V]
    if logits.shape[0] == 0:
        return logits, logits.sum()  # nothing to predict: loss 0, still attached to the graph
    return logits, cross_entropy(logits, labels[selected])  # F.cross_entropy's loss, in cache-sized blocks


def classifier_dropout(config: BertConfig) -> Dropout:
    p = config.classifier_dropout
    return Dropout(config.hidden_dropout_prob if p is None else p)


def encode(model, input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions):
    """The encoder's forward in a head (`model.bert`, or ELECTRA's `model.electra`)."""
    return model.base_model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                      output_hidden_states=output_hidden_states, output_attentions=output_attentions)


# --- pre-training heads --------------------------------------------------------------


class BertForPreTraining(BertPreTrainedModel):
    """Masked LM + next sentence prediction, trained together (paper section 3.1)."""

    def __init__(self, config: BertConfig, generator: torch.Generator | None = None):
        super().__init__(config)
        self.bert = BertModel(config, generator=generator)
        self.mlm = MaskedLMHead(config)
        self.nsp = nn.Linear(config.hidden_size, 2)  # pooled [CLS] -> is-next / random
        init_weights(nn.ModuleList([self.mlm, self.nsp]), config.initializer_range, generator)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                next_sentence_label=None, output_hidden_states=False, output_attentions=False):
        out = encode(self, input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        words = self.base_model.embeddings.word_embeddings.weight
        prediction_logits, mlm_loss = masked_lm(self.mlm, words, out.last_hidden_state, labels)
        nsp_logits = self.nsp(out.pooler_output)  # [B, 2]
        nsp_loss = None
        if next_sentence_label is not None:
            check_labels(next_sentence_label, nsp_logits.shape[:1], "next_sentence_label", 2)
            nsp_loss = F.cross_entropy(nsp_logits, next_sentence_label)
        parts = [x for x in (mlm_loss, nsp_loss) if x is not None]
        return PreTrainingOutput(
            loss=sum(parts[1:], parts[0]) if parts else None,
            prediction_logits=prediction_logits,
            seq_relationship_logits=nsp_logits,
            mlm_loss=mlm_loss,
            nsp_loss=nsp_loss,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
        )


class BertForMaskedLM(BertPreTrainedModel):
    """Masked LM alone (no pooler, no NSP), e.g. for RoBERTa-style pre-training or fill-mask."""

    def __init__(self, config: BertConfig, generator: torch.Generator | None = None):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False, generator=generator)
        self.mlm = MaskedLMHead(config)
        init_weights(self.mlm, config.initializer_range, generator)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False):
        out = encode(self, input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        words = self.base_model.embeddings.word_embeddings.weight  # [V, H] (ELECTRA: [V, E])
        logits, loss = masked_lm(self.mlm, words, out.last_hidden_state, labels)
        return HeadOutput(loss, logits, out.hidden_states, out.attentions)


class BertForNextSentencePrediction(BertPreTrainedModel):
    """Is segment B the sentence that follows A (label 0) or a random one (label 1)?"""

    def __init__(self, config: BertConfig, generator: torch.Generator | None = None):
        super().__init__(config)
        self.bert = BertModel(config, generator=generator)
        self.nsp = nn.Linear(config.hidden_size, 2)
        init_weights(self.nsp, config.initializer_range, generator)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False):
        out = encode(self, input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        logits = self.nsp(out.pooler_output)  # [B, 2]
        loss = None
        if labels is not None:
            check_labels(labels, logits.shape[:1], "labels (next sentence)", 2)
            loss = F.cross_entropy(logits, labels)
        return HeadOutput(loss, logits, out.hidden_states, out.attentions)


# --- fine-tuning heads -----------------------------------------------------------------


def sequence_loss(logits: torch.Tensor, labels: torch.Tensor, kind: str) -> torch.Tensor:
    """The loss of a sequence classifier's logits [B, K] for one problem type (see below)."""
    B, K = logits.shape
    if kind == "regression":
        check_labels(labels.reshape(-1), (B * K,), "labels (regression)")
        return F.mse_loss(logits.reshape(-1), labels.reshape(-1).to(logits.dtype))
    if kind == "single_label_classification":
        check_labels(labels, (B,), "labels", K)
        return F.cross_entropy(logits, labels)
    check_labels(labels, (B, K), "labels (multi-label, 0/1 per class)")
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))


class BertForSequenceClassification(BertPreTrainedModel):
    """A linear layer on the pooled [CLS] vector: sentence or pair classification/regression.

    With config.classifier_pooling "mean" the layer reads the average of the last layer's
    token vectors instead (no pooler): for encoders whose [CLS] vector was never trained
    to summarise the sentence (MLM-only pre-training; see docs/pretraining.md).

    The loss follows config.problem_type, or when it is None (the one rule, config.problem_type_of):
    num_labels == 1 -> regression (MSE on float labels [B]); integer labels -> single-label
    cross-entropy; float labels [B, num_labels] -> multi-label (sigmoid + binary cross-entropy).
    """

    def __init__(self, config: BertConfig, generator: torch.Generator | None = None):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=config.classifier_pooling == "cls", generator=generator)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        init_weights(self.classifier, config.initializer_range, generator)

    def problem_type(self, labels: torch.Tensor) -> str:
        """config.problem_type, or the one rule's choice by the labels' dtype (config.problem_type_of)."""
        if not isinstance(labels, torch.Tensor):  # its dtype decides the loss: checked before it is read
            raise BertkitError(f"labels must be a torch tensor, got {type(labels).__name__} "
                               "(wrap it in torch.tensor(...))")
        return self.config.problem_type_for(float_labels=labels.dtype.is_floating_point)

    def scores(self, out, attention_mask) -> torch.Tensor:
        """The classifier on the pooled [CLS] vector (or the tokens' mean): [B, num_labels]."""
        hidden = out.last_hidden_state
        pooled = out.pooler_output if self.bert.pooler is not None else pool_sentence(hidden, attention_mask)
        return self.classifier(self.dropout(pooled))  # [B, H] -> [B, num_labels]

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False):
        out = encode(self, input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        logits = self.scores(out, attention_mask)  # [B, num_labels]
        loss = None if labels is None else sequence_loss(logits, labels, self.problem_type(labels))
        return HeadOutput(loss, logits, out.hidden_states, out.attentions)


class BertForTokenClassification(BertPreTrainedModel):
    """A linear layer on every token's final vector: tagging (e.g. named entities)."""

    def __init__(self, config: BertConfig, generator: torch.Generator | None = None):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False, generator=generator)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        init_weights(self.classifier, config.initializer_range, generator)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False):
        out = encode(self, input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        logits = self.classifier(self.dropout(out.last_hidden_state))  # [B, T, num_labels]
        loss = None if labels is None else token_loss(logits, labels)
        return HeadOutput(loss, logits, out.hidden_states, out.attentions)


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over [B, T, K] per-token scores; IGNORE_INDEX labels (padding, word pieces
    after a word's first) count nothing."""
    K = logits.shape[-1]
    check_labels(labels, logits.shape[:2], "labels (per token)", K)
    return F.cross_entropy(logits.reshape(-1, K), labels.reshape(-1), ignore_index=IGNORE_INDEX)


def span_loss(start_logits, end_logits, start_positions, end_positions) -> torch.Tensor:
    """(CE start + CE end) / 2 over [B, T] scores; positions outside the window (the answer
    truncated away) are clamped to T and ignored."""
    B, T = start_logits.shape
    for name, positions in (("start_positions", start_positions), ("end_positions", end_positions)):
        flat = positions.reshape(-1) if isinstance(positions, torch.Tensor) else positions  # [B] or [B, 1]
        check_labels(flat, (B,), name, integer=True)
    start = start_positions.reshape(-1).clamp(0, T)
    end = end_positions.reshape(-1).clamp(0, T)
    return (F.cross_entropy(start_logits, start, ignore_index=T) + F.cross_entropy(end_logits, end, ignore_index=T)) / 2


class BertForQuestionAnswering(BertPreTrainedModel):
    """Span extraction (SQuAD): a start score and an end score for every token."""

    def __init__(self, config: BertConfig, generator: torch.Generator | None = None):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False, generator=generator)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)  # [start, end] per token
        init_weights(self.qa_outputs, config.initializer_range, generator)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None,
                end_positions=None, output_hidden_states=False, output_attentions=False):
        out = encode(self, input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        logits = self.qa_outputs(out.last_hidden_state)  # [B, T, 2]
        start_logits, end_logits = logits.unbind(dim=-1)  # 2 x [B, T]
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = span_loss(start_logits, end_logits, start_positions, end_positions)
        return QuestionAnsweringOutput(loss, start_logits.contiguous(), end_logits.contiguous(),
                                       out.hidden_states, out.attentions)


class BertForMultipleChoice(BertPreTrainedModel):
    """One score per (context, choice) pair from the pooled [CLS]; softmax over the C choices."""

    def __init__(self, config: BertConfig, generator: torch.Generator | None = None):
        super().__init__(config)
        self.bert = BertModel(config, generator=generator)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        init_weights(self.classifier, config.initializer_range, generator)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False):
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 3:
            got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise BertkitError(f"multiple choice input_ids must be [batch, choices, seq_len], got {got}")
        B, C, T = input_ids.shape
        flat = [x.reshape(B * C, T) if isinstance(x, torch.Tensor) and x.shape == input_ids.shape else x
                for x in (input_ids, attention_mask, token_type_ids)]  # [B, C, T] -> [B*C, T]
        out = encode(self, *flat, output_hidden_states, output_attentions)
        logits = self.classifier(self.dropout(out.pooler_output)).view(B, C)  # [B*C, 1] -> [B, C]
        loss = None
        if labels is not None:
            check_labels(labels, (B,), "labels (index of the right choice)", C)
            loss = F.cross_entropy(logits, labels)
        return HeadOutput(loss, logits, out.hidden_states, out.attentions)


HEADS = (BertForPreTraining, BertForMaskedLM, BertForNextSentencePrediction, BertForSequenceClassification,
         BertForTokenClassification, BertForQuestionAnswering, BertForMultipleChoice)
