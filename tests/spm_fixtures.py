"""A few KB of multilingual text and SentencePiece models trained on it, written by the tests."""

import os
import random

# Text like users bring: Danish, German, French accents, Korean, Japanese, Chinese, emoji.
WORDS = ("the quick brown fox jumps over the lazy dog and runs home again "
         "København smørrebrød æble øl Straße über Größe café naïve résumé déjà vu "
         "한국어 문장 입니다 서울 사람 日本語 東京 です 中文 字符 北京 "
         "emoji 😀 🎉 👍🏽 data model training 2024 3.14").split()
# Held-out text for parity checks: unseen words, mixed case, punctuation, runs of spaces.
SAMPLE_TEXTS = [
    "The Quick brown FOX, jumps!",
    "København er Danmarks hovedstad; smørrebrød og øl.",
    "Größe über alles — café naïve résumé, déjà vu.",
    "한국어 문장입니다. 서울 사람!",
    "日本語のテキスト、東京です。中文字符北京",
    "emoji 😀🎉 👍🏽 and ﬁ ligature ＡＢＣ full-width",
    "  leading   and trailing   spaces  ",
    "tabs\tand\nnewlines",
    "",
    "unseen Zürich ŽŠČ Ελληνικά ελληνικά العربية",
]


def write_corpus(directory, lines=600, seed=0):
    """Writes directory/corpus.txt: `lines` sentences of WORDS, a blank line every 20 (~40 KB)."""
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(seed)
    path = os.path.join(directory, "corpus.txt")
    with open(path, "w", encoding="utf-8") as f:
        for i in range(lines):
            f.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))) + "\n")
            if i % 20 == 19:
                f.write("\n")
    return path


def train_model(path, corpus, vocab_size=120, **options):
    """Trains a SentencePiece model at `path` with `sentencepiece` options (for mapping tests)."""
    import sentencepiece

    prefix = path[:-len(".model")]
    settings = dict(input=corpus, model_prefix=prefix, vocab_size=vocab_size,
                    hard_vocab_limit=False, num_threads=1, minloglevel=2)
    settings.update(options)
    sentencepiece.SentencePieceTrainer.Train(**settings)
    return path
