"""SentencePiece tokenisation in-graph: tensorflow-text's SentencePiece op over a `Vocab`'s model.

The counterpart of `tokenization.GraphFullTokenizer` for a SentencePiece vocabulary, with the same
interface (`tokenize(tf.string [batch]) -> tf.RaggedTensor int32 [batch, (tokens)]`), so the
dataset builder, fine-tuning and the exported `serve_text` run the same graph. The model's own
normalisation (stored in the model: NFKC, case folding if it was trained so) applies; electra-tf
adds nothing but dropping bytes that are not UTF-8 (as the WordPiece path does), since the op
would otherwise see them. Ids are the model's, unchanged: `sentencepiece_vocab` checked that
[PAD] is 0 and found the other specials. No BOS/EOS are added (the caller adds [CLS]/[SEP]) and
sampling is off (`nbest_size=0`): the same text always gives the same ids.
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_text as tf_text

from electra_tf.data.text.basic_tokenizer import drop_invalid_utf8


class GraphSentencePieceTokenizer(tf.Module):
    """Text to SentencePiece ids as one `tf.function`.

    Tracks into a SavedModel (the model is a captured resource); loading it needs
    `import tensorflow_text` first, to register the ops.

    Args:
        model: bytes. A serialized SentencePiece model (`Vocab.model`).
    """

    def __init__(self, model: bytes, name=None):
        super().__init__(name=name)
        self._sentencepiece = tf_text.SentencepieceTokenizer(
            model=model, out_type=tf.int32, nbest_size=0, add_bos=False, add_eos=False)
        self.vocab_size = int(self._sentencepiece.vocab_size())

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def tokenize(self, strings: tf.Tensor) -> tf.RaggedTensor:
        """SentencePiece ids of each string, without [CLS]/[SEP].

        Args:
            strings: tf.string [batch], UTF-8 text (undecodable bytes are dropped).

        Returns:
            tf.RaggedTensor of tf.int32 [batch, (tokens)] (row_splits tf.int64).
        """
        ragged = self._sentencepiece.tokenize(drop_invalid_utf8(strings))
        return tf.RaggedTensor.from_row_splits(
            ragged.flat_values, tf.cast(ragged.row_splits, tf.int64), validate=False)
