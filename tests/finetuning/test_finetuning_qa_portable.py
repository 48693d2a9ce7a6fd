"""QA without TensorFlow (issue 48, item 1): the records featurised with the TF-free tokenizer
(`portable_tokenization.PortableTokenizer`) and the n-best decoding with its Python
BasicTokenizer equal the TensorFlow run's, on the corpus questions of the end-to-end tests and
on contexts with accents, CJK, control characters, [UNK] words and long words. The head's
losses and predictions on JAX and PyTorch are in test_finetuning_backends.py."""

import json
import os

import numpy as np
import pytest

from electra_tf.data.text.portable_tokenization import PortableTokenizer
from electra_tf.data.text.tokenization import Tokenizer
from electra_tf.finetuning.qa.data import read_mrqa, read_squad
from electra_tf.finetuning.qa.decoding import BasicTokenCache, Decoder
from electra_tf.finetuning.qa.features import featurize
from electra_tf.vocab import load_vocab
from tests.finetuning_fixtures import REAL_VOCAB, corpus_tasks_dir, need_real_data

# Contexts whose normalisation is not plain ASCII lower-casing: accents (stripped), CJK
# (spaced out), a control character (deleted), non-ASCII punctuation, a word longer than
# WordPiece's 200 characters ([UNK]) and characters outside the vocab ([UNK]).
UNICODE_CONTEXTS = [
    "Zürich's Café Ørsted opened in 1895 — the CAFÉ served crème brûlée.",
    "東京 is Japan's capital; 北京 is China's (since 1949).",
    "The\x00 con\u0301trol\tcharacters « vanish » here… and \u2028 here ¿right?",
    "A " + "x" * 205 + " word and ☃ snowmen ☃ are unknown: ΣΊΣΥΦΟΣ ΟΔΥΣΣΕΎΣ.",
]


def _unicode_squad(path):
    paragraphs = []
    for index, context in enumerate(UNICODE_CONTEXTS):
        words = context.split()
        answer = words[len(words) // 2]
        paragraphs.append({"context": context, "qas": [
            {"id": f"u{index}", "question": f"Qué «{words[0]}» {words[-1]}?",
             "is_impossible": False,
             "answers": [{"text": answer, "answer_start": context.index(answer)}]},
            {"id": f"n{index}", "question": "ñ who 東?", "is_impossible": True, "answers": []}]})
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": "2.0", "data": [{"title": "u", "paragraphs": paragraphs}]}, f)
    return str(path)


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    """{name: QASplit}: SQuAD 2.0 and MRQA corpus questions (train, dev) and the unicode set."""
    need_real_data()
    raw = corpus_tasks_dir(str(tmp_path_factory.mktemp("qa_raw")), ["squad", "newsqa"],
                           num_train=80, num_dev=40)
    out = {}
    for split in ("train", "dev"):
        out[f"squad_{split}"] = read_squad(os.path.join(raw, "squad", f"{split}.json"), split,
                                           v2=True)
        out[f"newsqa_{split}"] = read_mrqa(os.path.join(raw, "newsqa", f"{split}.jsonl"), split)
        out[f"unicode_{split}"] = read_squad(
            _unicode_squad(tmp_path_factory.mktemp("unicode") / "u.json"), split, v2=True)
    return out


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_portable_tokenizer_gives_the_tensorflow_runs_qa_records(splits, do_lower_case):
    vocab = load_vocab(REAL_VOCAB)
    in_graph = Tokenizer(vocab, do_lower_case=do_lower_case)
    portable = PortableTokenizer(vocab, do_lower_case=do_lower_case)
    for name, split in splits.items():
        training = name.endswith("_train")
        # Short windows and a short stride: several windows per question, answers cut off.
        tf_features, features = (featurize(split.examples, tokenizer, 48, 12, 10, training)
                                 for tokenizer in (in_graph, portable))
        if not name.startswith("unicode"):
            assert len(features.windows) > len(split.examples), name  # several windows each
        assert features.arrays.keys() == tf_features.arrays.keys()
        for key, array in features.arrays.items():
            assert array.dtype == tf_features.arrays[key].dtype, (name, key)
            np.testing.assert_array_equal(array, tf_features.arrays[key], err_msg=f"{name} {key}")
        for mine, theirs in zip(features.windows + features.doc_tokens,
                                tf_features.windows + tf_features.doc_tokens, strict=True):
            for a, b in zip(mine, theirs, strict=True):
                np.testing.assert_array_equal(a, b, err_msg=name)
        if training and name.startswith("squad"):
            assert features.arrays["start_positions"].any()  # answers inside windows
    assert any(vocab.tokens[i] == "[UNK]" for i in
               featurize(splits["unicode_dev"].examples, portable, 48, 12, 10, False)
               .arrays["input_ids"].ravel())


def test_python_basic_tokens_decode_as_the_graphs(splits):
    """Random head outputs over the dev records: the same n-best texts and null odds with the
    Python BasicTokenizer as with the in-graph one (get_final_text projects through them)."""
    vocab = load_vocab(REAL_VOCAB)
    tokenizer = PortableTokenizer(vocab)
    texts = list(UNICODE_CONTEXTS) + [e.paragraph.context for e in
                                            splits["squad_dev"].examples]
    caches = [BasicTokenCache(True, True, in_graph=flag) for flag in (True, False)]
    assert caches[1](texts[0]) == caches[0](texts[0])
    caches[0].prefetch(texts)
    assert [caches[1](t) for t in texts] == [caches[0](t) for t in texts]
    rng = np.random.default_rng(0)
    for name in ("squad_dev", "unicode_dev"):
        split = splits[name]
        features = featurize(split.examples, tokenizer, 48, 12, 10, False)
        n, seq, beam = len(features.windows), 48, 6
        outputs = {"start_top_index": rng.integers(0, seq, (n, beam)),
                   "end_top_index": rng.integers(0, seq, (n, beam, beam)),
                   "start_top_log_probs": -rng.random((n, beam)).astype(np.float32),
                   "end_top_log_probs": -rng.random((n, beam, beam)).astype(np.float32),
                   "answerable_logit": rng.normal(size=n).astype(np.float32)}
        decoded = [Decoder([e.paragraph.words for e in split.examples], features.doc_tokens,
                           features.windows, vocab.tokens, cache, True, True, True, 20, 30)
                   .decode(outputs, features.arrays["input_ids"]) for cache in caches]
        assert [p.nbest for p in decoded[1]] == [p.nbest for p in decoded[0]]
        assert [p.null_odds for p in decoded[1]] == [p.null_odds for p in decoded[0]]
        assert sum(p.text not in ("", "empty") for p in decoded[1]) > len(split.examples) // 2
