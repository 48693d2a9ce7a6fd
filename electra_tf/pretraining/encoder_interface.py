"""What `PretrainingModel` needs of an encoder, for electra-tf's own, keras-hub backbones or others.

The pretraining model takes any Keras layer mapping token ids to hidden states as its
discriminator or generator (`discriminator_encoder`, `generator_encoder`). These functions are
the whole contract: how such a layer is called (`sequence_output`), the word-embedding table the
MLM head is tied to (`word_embedding_table`) and the width of its output (`encoder_width`).
"""

from __future__ import annotations

from typing import Mapping

import keras_hub

from electra_tf.modeling.embeddings import DisentangledEmbeddings, ElectraEmbeddings


def _is_keras_hub_backbone(encoder) -> bool:
    return isinstance(encoder, keras_hub.models.Backbone)


def sequence_output(encoder, input_ids, input_mask, segment_ids, training):
    """Runs an encoder and returns its hidden states [batch_size, seq_length, hidden].

    electra-tf encoders and other layers get the official input names (`input_ids`,
    `input_mask`, `segment_ids`); keras-hub backbones get theirs (`token_ids`, `padding_mask`,
    `segment_ids`). The output may be a tensor or a dict holding `sequence_output`.
    """
    if _is_keras_hub_backbone(encoder):
        inputs = {"token_ids": input_ids, "padding_mask": input_mask}
        if "segment_ids" in encoder.input:
            inputs["segment_ids"] = segment_ids
        outputs = encoder(inputs, training=training)
    else:
        outputs = encoder({"input_ids": input_ids, "input_mask": input_mask,
                           "segment_ids": segment_ids}, training=training)
    if isinstance(outputs, Mapping):
        if "sequence_output" not in outputs:
            raise ValueError(f"encoder {encoder.name!r} returned keys {sorted(outputs)}; "
                             "expected 'sequence_output'")
        outputs = outputs["sequence_output"]
    return outputs


def word_embedding_table(encoder):
    """The [vocab_size, embedding_size] input-embedding variable the MLM head is tied to.

    Raises:
        ValueError: the encoder exposes no known word-embedding table.
    """
    embeddings = getattr(encoder, "embeddings", None)
    if isinstance(embeddings, DisentangledEmbeddings):  # GDES: the shared table (its shape)
        embeddings = embeddings.shared
    if isinstance(embeddings, ElectraEmbeddings):
        return embeddings.word_embeddings.embeddings
    token_embedding = getattr(encoder, "token_embedding", None)  # keras-hub backbones
    if token_embedding is not None:
        return token_embedding.embeddings
    raise ValueError(f"cannot find the word-embedding table of encoder {encoder.name!r}: give it "
                     "an `embeddings` (ElectraEmbeddings) or `token_embedding` attribute; the "
                     "generator's MLM head is tied to that table")


def encoder_width(encoder) -> int:
    """Hidden width of an encoder's sequence output."""
    for attribute in ("hidden_size", "hidden_dim"):
        width = getattr(encoder, attribute, None)
        if isinstance(width, int):
            return width
    raise ValueError(f"cannot tell the hidden width of encoder {encoder.name!r}: give it a "
                     "`hidden_size` or `hidden_dim` attribute")
