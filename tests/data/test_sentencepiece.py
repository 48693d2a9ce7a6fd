"""SentencePiece vocabularies: learning (--learn-spm), the BERT special mapping, the in-graph
tokenizer, the builder's --spm-model and the manifest checksum the trainer checks."""

import dataclasses
import os

import pytest

pytest.importorskip("sentencepiece")
import sentencepiece  # noqa: E402

from electra_tf.data.build.build_config import BuildConfig, resolve_config  # noqa: E402
from electra_tf.data.build.builder import build_dataset  # noqa: E402
from electra_tf.data.records.integrity import validate_dataset  # noqa: E402
from electra_tf.data.text.spm_learning import learn_spm  # noqa: E402
from electra_tf.data.text.tokenization import Tokenizer  # noqa: E402
from electra_tf.errors import BuildError  # noqa: E402
from electra_tf.errors import DataError, ElectraError  # noqa: E402
from electra_tf.vocab import VocabError, load_vocab  # noqa: E402
from tests.spm_fixtures import SAMPLE_TEXTS, train_model, write_corpus  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(str(tmp_path_factory.mktemp("spm_corpus")))


@pytest.fixture(scope="module")
def learned(corpus, tmp_path_factory):
    return learn_spm([corpus], 150, str(tmp_path_factory.mktemp("spm") / "spm.model"))


def test_learned_model_has_the_bert_layout(learned):
    assert learned.kind == "sentencepiece"
    assert learned.tokens[:5] == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    assert tuple(learned.special) == (0, 1, 2, 3, 4)
    processor = sentencepiece.SentencePieceProcessor(model_proto=learned.model)
    assert [processor.IsControl(i) for i in (2, 3, 4)] == [True] * 3
    assert processor.bos_id() == -1 and processor.eos_id() == -1


def test_learning_is_deterministic(corpus, learned, tmp_path):
    again = learn_spm([corpus], 150, str(tmp_path / "again.model"))
    assert again.sha256 == learned.sha256


def test_learning_rejects_sizes_without_room(corpus, tmp_path):
    with pytest.raises(ValueError, match="above 5"):
        learn_spm([corpus], 5, str(tmp_path / "x.model"))


def test_in_graph_ids_equal_sentencepiece(learned):
    processor = sentencepiece.SentencePieceProcessor(model_proto=learned.model)
    tokenizer = Tokenizer(learned)
    ids, splits = tokenizer.encode_batch(SAMPLE_TEXTS)
    for i, text in enumerate(SAMPLE_TEXTS):
        assert ids[splits[i]:splits[i + 1]].tolist() == processor.EncodeAsIds(text), text
    # Case folding (--do-lower-case's rule) and NFKC come from the model itself.
    assert tokenizer.encode("The FOX") == tokenizer.encode("the fox")
    assert not tokenizer.do_lower_case and not tokenizer.strip_accents  # nothing done before it
    # Undecodable bytes are dropped, as on the WordPiece path.
    assert tokenizer.encode(b"the \xff fox") == tokenizer.encode("the  fox")
    # The literal text "[MASK]" is not the [MASK] id (control symbols never come from text).
    assert 4 not in tokenizer.encode("a [MASK] b [CLS]")


def test_conventional_names_are_mapped(corpus, tmp_path):
    path = train_model(str(tmp_path / "conv.model"), corpus, pad_id=0, unk_id=1, bos_id=2,
                       eos_id=3, user_defined_symbols="<mask>")
    vocab = load_vocab(path)
    assert [vocab.tokens[i] for i in vocab.special] == ["<pad>", "<unk>", "<s>", "</s>", "<mask>"]


def test_missing_specials_are_one_line_errors(corpus, tmp_path):
    default = train_model(str(tmp_path / "default.model"), corpus)  # no pad, no mask
    with pytest.raises(VocabError) as info:
        load_vocab(default)
    message = str(info.value)
    assert "\n" not in message and "default.model" in message
    assert "[PAD] as [PAD] or <pad>" in message and "[MASK] as [MASK] or <mask>" in message
    assert "--learn-spm" in message
    padded_late = train_model(str(tmp_path / "late.model"), corpus, unk_id=0, pad_id=3,
                              bos_id=1, eos_id=2, user_defined_symbols="[MASK]")
    with pytest.raises(VocabError, match=r"pad piece '<pad>' is id 3, but ELECTRA pads with id 0"):
        load_vocab(padded_late)


def test_not_a_model_is_a_one_line_error(tmp_path):
    path = tmp_path / "broken.model"
    path.write_bytes(b"\x0a\x05hello garbage")
    with pytest.raises(VocabError, match="broken.model is not a SentencePiece model"):
        load_vocab(str(path))


def _build(tmp_path, corpus, **kwargs):
    corpus_dir = os.path.dirname(corpus)
    config = BuildConfig(corpus_dir=corpus_dir, max_seq_length=32, eval_fraction=0.1,
                         output_dir=str(tmp_path / "data" / "pretrain_tfrecords"), **kwargs)
    return config, build_dataset(config)


def test_build_with_learn_spm_records_the_model(corpus, tmp_path):
    config, manifest = _build(tmp_path, corpus, learn_spm=150)
    model = tmp_path / "data" / "spm.model"
    vocab = load_vocab(str(model))
    assert manifest["vocab"]["kind"] == "sentencepiece"
    assert manifest["vocab"]["sha256"] == vocab.sha256
    assert manifest["vocab"]["learned"] is True
    assert manifest["vocab"]["special_ids"]["mask_id"] == 4
    assert manifest["counts"]["examples"] > 0
    # The trainer's check: the same model passes, another model's checksum is refused.
    pattern = str(tmp_path / "data" / "pretrain_tfrecords" / "pretrain_data.tfrecord*")
    validate_dataset(pattern, max_seq_length=32, vocab_sha256=vocab.sha256, vocab_size=vocab.size)
    other = learn_spm([corpus], 100, str(tmp_path / "other.model"))
    with pytest.raises(DataError, match="spm.model .sha256 .*differs from the given vocab"):
        validate_dataset(pattern, max_seq_length=32, vocab_sha256=other.sha256,
                         vocab_size=vocab.size)
    with pytest.raises(BuildError, match="spm.model exists; pass --overwrite"):
        build_dataset(dataclasses.replace(config, output_dir=str(tmp_path / "data" / "again")))
    # --spm-model reads it back: same shards.
    _, again = _build(tmp_path / "b", corpus, spm_model=str(model))
    assert again["vocab"]["sha256"] == vocab.sha256 and again["vocab"]["learned"] is False
    assert again["splits"]["train"]["examples"] == manifest["splits"]["train"]["examples"]


def test_flag_errors(corpus, tmp_path):
    vocab_txt = tmp_path / "vocab.txt"
    vocab_txt.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n", encoding="utf-8")
    with pytest.raises(BuildError, match="exclude each other"):
        resolve_config(BuildConfig(spm_model="x.model", vocab_file=str(vocab_txt)))
    with pytest.raises(BuildError, match="exclude each other"):
        resolve_config(BuildConfig(learn_spm=100, learn_vocab=100))
    with pytest.raises(BuildError, match="--learn-spm must be a vocab size above 5"):
        resolve_config(BuildConfig(learn_spm=3))
    with pytest.raises(ElectraError, match="is not a SentencePiece model"):
        _build(tmp_path, corpus, spm_model=str(vocab_txt))


def test_cli_flags_reach_the_config_and_help(learned):
    from electra_tf.commands import build_dataset as command
    from electra_tf.commands.finetune import build_parser as finetune_parser, with_spm_model

    args, _ = command.parse_args(["--spm-model", "m.model", "--learn-spm", "300"])
    settings = vars(args)
    for key in ("quiet", "verbose", "runner"):
        settings.pop(key)
    config = BuildConfig(**settings)
    assert (config.spm_model, config.learn_spm) == ("m.model", 300)
    text = command.build_parser().format_help()
    assert "--spm-model FILE" in text and "--learn-spm SIZE" in text
    assert "--spm-model FILE" in finetune_parser().format_help()
    assert with_spm_model('{"task_names": ["sst"]}', learned.path) == {
        "task_names": ["sst"], "vocab_file": learned.path}
    with pytest.raises(VocabError, match="exclude each other"):
        with_spm_model({"vocab_file": "v.txt"}, learned.path)
