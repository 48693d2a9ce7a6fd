"""The Hugging Face export's tokenizer.json (written with `tokenizers`) and README model card.

The fast tokenizer must give the project tokenizer's ids on real text: every line of the
fetched default corpus's files (Wikipedia, news, Austen, FOLDOC: accents, quotes, dashes,
symbols) plus edge cases, under each lowercasing / accent setting.
"""

import glob
import itertools
import json
import os

import pytest

from electra_tf.convert import hf
from electra_tf.convert.hf_tokenizer import build_tokenizer
from electra_tf.data.text.tokenization import Tokenizer
from electra_tf.vocab import load_vocab
from tests import convert_fixtures as cf

REAL_CORPUS = os.path.join(cf.REPO_ROOT, "pretrain_data", "corpus")
LINES_PER_FILE = 300
EDGE_CASES = ["Café naïve résumé ÀÉÎÕÜ", "日本語のテキストと中文", "a\u0000b\tc\u200bd", "x" * 250,
              "don't stop—now… “quoted” (¼ + ½) Ω", "   ", "", "e\u0301 combining", "😀 emoji"]


def _real_text():
    if not os.path.isfile(cf.REAL_VOCAB) or not glob.glob(os.path.join(REAL_CORPUS, "*.txt")):
        pytest.skip("fetched default data absent: run `python pretrain_data/fetch.py`")
    lines = []
    for path in sorted(glob.glob(os.path.join(REAL_CORPUS, "*.txt"))):
        with open(path, encoding="utf-8") as f:
            lines += [line.rstrip("\n") for line in itertools.islice(f, LINES_PER_FILE)
                      if line.strip()]
    return lines + EDGE_CASES


@pytest.mark.parametrize("do_lower_case,strip_accents", [(True, True), (True, False), (False, True)])
def test_fast_tokenizer_ids_equal_the_project_tokenizer_on_real_text(do_lower_case, strip_accents):
    lines = _real_text()
    vocab = load_vocab(cf.REAL_VOCAB)
    ours = Tokenizer(vocab, do_lower_case=do_lower_case, strip_accents=strip_accents)
    fast = build_tokenizer(vocab, do_lower_case, strip_accents)
    ids, splits = ours.encode_batch(lines)
    encodings = fast.encode_batch(lines, add_special_tokens=False)
    differ = [line for i, (line, enc) in enumerate(zip(lines, encodings))
              if ids[splits[i]:splits[i + 1]].tolist() != enc.ids]
    assert len(lines) > 2000
    assert differ == [], differ[:5]
    # Accents matter: the settings give different ids on accented text.
    accented = fast.encode("Café résumé", add_special_tokens=False).ids
    assert accented == ours.encode("Café résumé")
    # Pairs get [CLS] A [SEP] B [SEP] with segment ids 0 then 1.
    pair = fast.encode("The cat.", "A dog.")
    special = vocab.special
    assert pair.ids == ([special.cls_id] + ours.encode("The cat.") + [special.sep_id]
                        + ours.encode("A dog.") + [special.sep_id])
    assert pair.type_ids == [0] * (len(ours.encode("The cat.")) + 2) + [1] * (
        len(ours.encode("A dog.")) + 1)


def test_to_hf_writes_tokenizer_json_and_a_model_card(tmp_path):
    transformers = pytest.importorskip("transformers")
    lines = _real_text()[:400]
    vocab_path = cf.REAL_VOCAB
    hparams = cf.tiny_hparams(cf.vocab_size_of(vocab_path))
    directory, _, _ = cf.make_model_dir(str(tmp_path), hparams, vocab_path, seed=1, step=300)
    with open(os.path.join(directory, "eval_results.txt"), "w") as f:
        f.write("disc_auc = 0.75\nglobal_step = 300\n")
    out = str(tmp_path / "hf")
    hf.export_hf(directory, out)
    assert sorted(os.listdir(out)) == sorted(set(hf.OUTPUTS) - {hf.SPM_MODEL_NAME})
    tokenizer = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tokenizer.is_fast and type(tokenizer).__name__ == "ElectraTokenizerFast"
    assert json.load(open(os.path.join(out, "tokenizer.json")))["model"]["type"] == "WordPiece"
    ours = Tokenizer(load_vocab(vocab_path))
    special = ours.vocab.special
    for line in lines:
        assert tokenizer(line)["input_ids"] == [special.cls_id] + ours.encode(line) + [special.sep_id]
    card = open(os.path.join(out, "README.md"), encoding="utf-8").read()
    assert card.startswith("---\nlibrary_name: transformers\n")
    for needle in ("| layers | 2 |", f"| hidden size | {cf.TINY['hidden_size']} |",
                   "| checkpoint step | 300 of", "| disc_auc | 0.75 |", "ElectraForPreTraining",
                   "## Data", "## Training", "| parameters |"):
        assert needle in card, needle
