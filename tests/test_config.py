"""PretrainingConfig: official defaults, construction order, strictness (parity item 35)."""

import json

import pytest

from electra_tf.config import PretrainingConfig
from electra_tf.config.hparams import ConfigError
from electra_tf.config.model_config import get_bert_config, get_generator_config


def make(hparams=None):
    return PretrainingConfig.create("m", "/data", hparams)


def test_official_defaults_and_paths():
    c = make()
    assert (c.learning_rate, c.mask_prob, c.gen_weight, c.disc_weight) == (5e-4, 0.15, 1.0, 50.0)
    assert (c.num_warmup_steps, c.num_train_steps, c.train_batch_size) == (10000, 1000000, 128)
    assert c.embedding_size == 128  # forced for small
    assert c.max_predictions_per_seq == 19
    assert c.pretrain_tfrecords == "/data/pretrain_tfrecords/pretrain_data.tfrecord*"
    assert c.eval_tfrecords == "/data/pretrain_tfrecords/eval_data.tfrecord*"
    assert c.vocab_file == "/data/vocab.txt"
    assert c.model_dir == "/data/models/m"


@pytest.mark.parametrize("mask_prob,seq,expected", [
    (0.15, 128, 19), (0.15, 256, 39), (0.15, 512, 79), (0.25, 512, 130)])
def test_max_predictions_derived_after_overrides(mask_prob, seq, expected):
    c = make({"mask_prob": mask_prob, "max_seq_length": seq})
    assert c.max_predictions_per_seq == expected


def test_max_predictions_can_be_set_explicitly():
    assert make({"max_predictions_per_seq": 7}).max_predictions_per_seq == 7


def test_size_table_and_generator_fractions():
    small = make()
    bert = get_bert_config(small)
    assert (bert.hidden_size, bert.num_hidden_layers, bert.num_attention_heads,
            bert.intermediate_size, bert.embedding_size) == (256, 12, 4, 1024, 128)
    gen = get_generator_config(small, bert)
    assert (gen.hidden_size, gen.num_hidden_layers, gen.num_attention_heads,
            gen.intermediate_size, gen.embedding_size) == (64, 12, 1, 256, 128)

    base = make({"model_size": "base"})
    bert = get_bert_config(base)
    gen = get_generator_config(base, bert)
    assert (bert.hidden_size, bert.num_attention_heads, bert.embedding_size) == (768, 12, 768)
    assert (gen.hidden_size, gen.num_attention_heads, gen.intermediate_size) == (256, 4, 1024)

    large = make({"model_size": "large"})
    bert = get_bert_config(large)
    gen = get_generator_config(large, bert)
    assert (bert.hidden_size, bert.num_hidden_layers, bert.num_attention_heads) == (1024, 24, 16)
    assert (gen.hidden_size, gen.num_hidden_layers) == (256, 24)


def test_paper_presets_for_base_and_large_user_values_win():
    base = make({"model_size": "base"})
    assert (base.max_seq_length, base.learning_rate, base.train_batch_size) == (512, 2e-4, 256)
    assert base.max_predictions_per_seq == 79
    large = make({"model_size": "large"})
    assert (large.mask_prob, large.train_batch_size, large.max_predictions_per_seq) == (0.25, 2048, 130)
    custom = make({"model_size": "base", "max_seq_length": 128, "learning_rate": 1e-4})
    assert (custom.max_seq_length, custom.learning_rate, custom.max_predictions_per_seq) == (128, 1e-4, 19)


def test_overrides_apply_twice_rederiving_heads_and_ffn():
    c = make({"model_hparam_overrides": {"hidden_size": 512}})
    bert = get_bert_config(c)
    assert (bert.hidden_size, bert.num_attention_heads, bert.intermediate_size) == (512, 8, 2048)
    c = make({"model_hparam_overrides": {"hidden_size": 512, "num_attention_heads": 2}})
    assert get_bert_config(c).num_attention_heads == 2


def test_debug_mode():
    c = make({"debug": True})
    assert (c.train_batch_size, c.num_train_steps, c.eval_batch_size, c.iterations_per_loop,
            c.num_eval_steps) == (8, 20, 4, 1, 2)
    bert = get_bert_config(c)
    assert (bert.num_hidden_layers, bert.hidden_size, bert.intermediate_size,
            bert.num_attention_heads) == (3, 144, 576, 4)
    gen = get_generator_config(c, bert)
    assert (gen.hidden_size, gen.num_attention_heads, gen.intermediate_size) == (36, 1, 144)
    assert make({"debug": True, "train_batch_size": 16}).train_batch_size == 16


def test_untied_generator_embeddings_use_generator_width():
    c = make({"untied_generator_embeddings": True})
    gen = get_generator_config(c, get_bert_config(c))
    assert gen.embedding_size == gen.hidden_size == 64


@pytest.mark.parametrize("hparams,message", [
    ({"learnin_rate": 1e-4}, "Unknown hparam 'learnin_rate'; did you mean 'learning_rate'"),
    ({"learning_rate": "fast"}, "'learning_rate' must be float"),
    ({"do_train": "false"}, "'do_train' must be bool"),
    ({"num_train_steps": 1.5}, "'num_train_steps' must be int"),
    ({"model_size": "huge"}, "model_size must be one of small, base, large"),
    ({"mask_prob": 0.0}, "mask_prob must be in (0, 1]"),
    ({"electric_objective": True}, "not supported"),
    ({"do_train": False, "do_eval": False, "do_export": False}, "nothing to do"),
    ({"strategy": "horovod"}, "strategy must be one of auto, one_device, mirrored, multi_worker, tpu"),
    ({"mixed_precision": "fp8"}, "mixed_precision must be one of auto, float32, mixed_bfloat16, mixed_float16"),
    ({"optimizer": "sgd"}, "optimizer must be one of adamw, lamb"),
    ({"masking": "span"}, "masking must be one of random, whole_word, got 'span'"),
    ({"whole_word_masking": True, "masking": "random"},
     "hparams whole_word_masking=true (deprecated: masking 'whole_word') and masking='random' "
     "disagree: give masking only"),
    ({"whole_word_masking": "yes"}, "hparam 'whole_word_masking' must be bool"),
    ({"model_hparam_overrides": {"hiden_size": 3}}, "unknown key(s) in model_hparam_overrides: hiden_size"),
    ({"model_hparam_overrides": {"hidden_size": 100, "num_attention_heads": 3}}, "not a multiple"),
    ({"model_size": "base", "model_hparam_overrides": {"hidden_size": 512}},
     "generator (derived by generator_hidden_size=0.33333"),
    ({"max_seq_length": 1024}, "max_seq_length must be in [8, 512]"),
    ({"model_name": "x"}, "set by the command line"),
])
def test_bad_hparams_are_clear_errors(hparams, message):
    with pytest.raises(ConfigError) as e:
        make(hparams)
    assert message in str(e.value)


def test_hparams_from_json_string_and_file(tmp_path):
    assert make('{"learning_rate": 1e-3}').learning_rate == 1e-3
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"num_train_steps": 7}))
    assert make(str(path)).num_train_steps == 7
    with pytest.raises(ConfigError, match="hparams file not found"):
        make(str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="invalid JSON at line 1"):
        make('{"learning_rate": }')


def test_save_load_round_trip(tmp_path):
    c = make({"model_size": "base", "model_hparam_overrides": {"hidden_size": 384}, "seed": 3})
    path = str(tmp_path / "config.json")
    c.save(path)
    loaded = PretrainingConfig.load(path)
    assert loaded == c
    d = json.loads(open(path).read())
    d["bogus"] = 1
    with pytest.raises(ConfigError, match="Unknown hparam 'bogus'"):
        PretrainingConfig.from_dict(d)


def test_binary_hparams_file_is_a_config_error(tmp_path):
    path = tmp_path / "h.json"
    path.write_bytes(b"\x80\x04\x95 pickle-ish bytes")
    with pytest.raises(ConfigError, match="not a UTF-8 JSON file"):
        make(str(path))


@pytest.mark.parametrize("whole_words, masking", [(True, "whole_word"), (False, "random")])
def test_whole_word_masking_is_a_deprecated_alias_of_masking(tmp_path, whole_words, masking):
    assert make().masking == "random"
    assert make({"whole_word_masking": whole_words}).masking == masking
    assert make({"whole_word_masking": whole_words, "masking": masking}).masking == masking
    # A config.json written before `masking` (a run resumed, evaluated or exported) loads as the
    # same masking, and is written back with `masking` only.
    saved = make({"masking": masking}).to_dict()
    old = dict(saved, whole_word_masking=whole_words)
    del old["masking"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old))
    loaded = PretrainingConfig.load(str(path))
    assert loaded == make({"masking": masking})
    assert "whole_word_masking" not in loaded.to_dict() and loaded.to_dict()["masking"] == masking
