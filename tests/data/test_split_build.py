"""The held-out split end to end: keyed by content, sized in tokens, the same for a renamed,
reordered and gzipped copy of the corpus, duplicates on one side, old manifests still read."""

import gzip
import json
import random
import shutil

import pytest

from electra_tf.data.build.build_config import BuildConfig
from electra_tf.data.build.builder import build_dataset
from electra_tf.data.records.integrity import validate_dataset
from electra_tf.data.build.split import SHARE_TOLERANCE, document_key
from electra_tf.vocab import load_vocab
from tests.data.test_builder import SPECIALS, read_split, write_vocab

FRACTION = 0.05
WORDS_PER_DOC = 5  # document d is written with the words w{5d}..w{5d+4} only: its marker
NUM_DOCS = 300
BIG = 0  # the document 100x the others' size
DUP = 1  # the document written into two files


def document(d, num_words, draw=0):
    rng = random.Random(f"{d}/{draw}")
    words = [f"w{WORDS_PER_DOC * d + rng.randrange(WORDS_PER_DOC)}" for _ in range(num_words)]
    return [" ".join(words[i:i + 10]) for i in range(0, len(words), 10)]  # lines of 10 words


def key_below(d, num_words, below):
    """A text of document d whose key is below `below` (drawn until one is)."""
    draw = 0
    while document_key(document(d, num_words, draw)) >= below:
        draw += 1
    return document(d, num_words, draw)


@pytest.fixture(scope="module")
def documents():
    """{document: lines}: 298 documents of 10-30 words; BIG (2,000 words, 100x) has the smallest
    key, so a walk that did not skip it would hold out 25% of the tokens; DUP the next one."""
    docs = {d: document(d, random.Random(-d).randint(10, 30)) for d in range(2, NUM_DOCS)}
    lowest = min(document_key(lines) for lines in docs.values())
    docs[DUP] = key_below(DUP, 20, lowest)
    docs[BIG] = key_below(BIG, 2000, document_key(docs[DUP]))
    return docs


def write(path, docs, crlf=False, spaces=False):
    text = "\n\n".join("\n".join(line.replace(" ", "  ") if spaces else line for line in doc)
                       for doc in docs) + "\n"
    data = text.replace("\n", "\r\n" if crlf else "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" or "gz" in path.name else data)


@pytest.fixture(scope="module")
def builds(tmp_path_factory, documents):
    """The corpus and a renamed, reordered, partly gzipped, CRLF and re-spaced copy, built."""
    root = tmp_path_factory.mktemp("split_build")
    vocab = write_vocab(root / "vocab.txt")
    order = sorted(documents)
    first = root / "first"
    write(first / "part00.txt", [documents[d] for d in order[:100]])
    write(first / "part01.txt", [documents[d] for d in order[100:200]])
    write(first / "part02.txt", [documents[d] for d in order[200:]] + [documents[DUP]])
    copy = list(order) + [DUP]
    random.Random(5).shuffle(copy)
    second = root / "second"
    write(second / "a" / "zz.txt", [documents[d] for d in copy[:120]], crlf=True)
    write(second / "gzipped_as.txt", [documents[d] for d in copy[120:250]])  # gzip, .txt name
    write(second / "b.txt.gz", [documents[d] for d in copy[250:]], spaces=True)
    built = {}
    for name in ("first", "second"):
        config = BuildConfig(corpus_dir=str(root / name), vocab_file=vocab,
                             output_dir=str(root / f"out_{name}"), max_seq_length=32,
                             eval_fraction=FRACTION, num_out_files=2, seed=name == "second")
        built[name] = (build_dataset(config), config.output_dir)
    return vocab, built


def held_out(output_dir, split="eval"):
    """The documents whose words are in a split's examples."""
    base = len(SPECIALS) + 2
    return {(i - base) // WORDS_PER_DOC for ids, mask, _ in read_split(output_dir, split)
            for i in ids[1:sum(mask)] if i >= base}


def tokens_of(documents, docs):
    return sum(len(line.split()) for d in docs for line in documents[d])


def test_share_within_tolerance_with_one_document_100x_the_others(builds, documents):
    manifest, out = builds[1]["first"]
    evals = held_out(out)
    assert evals and not evals & held_out(out, "train")
    assert BIG not in evals  # the smallest key, but 25% of the tokens: skipped
    total = tokens_of(documents, documents) + tokens_of(documents, [DUP])
    held = tokens_of(documents, evals) + tokens_of(documents, [DUP] if DUP in evals else [])
    assert abs(held / total - FRACTION) <= SHARE_TOLERANCE * FRACTION
    split = manifest["eval_split"]
    assert split["token_fraction"] == held / total and split["within_tolerance"]
    assert (split["rule_version"], split["target_fraction"]) == (2, FRACTION)
    assert split["held_out_tokens"] == held and split["tokens"] == total
    assert split["held_out_documents"] == manifest["splits"]["eval"]["documents"]
    assert split["documents"] == NUM_DOCS + 1 and split["duplicate_documents"] == 1


def test_same_held_out_documents_for_a_renamed_reordered_gzipped_copy(builds):
    (first, out_first), (second, out_second) = builds[1]["first"], builds[1]["second"]
    assert held_out(out_second) == held_out(out_first)
    assert second["eval_split"] == first["eval_split"]
    assert second["splits"]["eval"]["documents"] == first["splits"]["eval"]["documents"]


def test_a_document_in_two_files_is_held_out_with_both_copies(builds):
    manifest, out = builds[1]["first"]
    assert DUP in held_out(out)  # the smallest key that fits: taken first
    assert DUP not in held_out(out, "train")  # neither copy leaks into train
    inputs = [json.loads(line) for line in open(f"{out}/inputs.jsonl")]
    assert inputs[0]["examples"]["eval"] and inputs[2]["examples"]["eval"]


def test_a_manifest_without_the_split_entry_still_verifies(builds, tmp_path):
    vocab_file, built = builds
    old = tmp_path / "old"
    shutil.copytree(built["first"][1], old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["eval_split"]  # as written before rule version 2
    (old / "manifest.json").write_text(json.dumps(manifest))
    vocab = load_vocab(vocab_file)
    for split, prefix in (("train", "pretrain_data"), ("eval", "eval_data")):
        summary = validate_dataset(f"{old}/{prefix}.tfrecord*", max_seq_length=32,
                                   vocab_sha256=vocab.sha256, vocab_size=vocab.size,
                                   split=split, verify=True)
        assert summary["num_examples"] == manifest["splits"][split]["examples"] > 0


def test_a_file_that_changed_since_its_survey_fails_naming_it(builds, tmp_path):
    from electra_tf.data.build.build_worker import FilePacker
    from electra_tf.errors import BuildError
    from electra_tf.data.text.corpus import CorpusFile, ReadStats
    from electra_tf.data.text.formats import InputSettings
    from electra_tf.data.build.packing import PackSettings, PackStats
    from electra_tf.data.build.split import FileSplit

    vocab = load_vocab(builds[0])
    packer = FilePacker(vocab, True, True, InputSettings(),
                        PackSettings(32, 0, FRACTION, vocab.special.unk_id), strict_input=False)
    path = tmp_path / "f.txt"
    path.write_text("w1 w2 w3\n\nw4 w5\n")
    corpus_file = CorpusFile("f.txt", str(path), path.stat().st_size)
    survey = packer.survey(corpus_file, lambda **counts: None)
    assert survey.tokens.tolist() == [3, 2]

    def pack(file_split):
        return [split for split, _ in packer.keyed_records(
            corpus_file, ReadStats(), PackStats(), lambda **counts: None, file_split)]

    assert pack(FileSplit(frozenset({1}), 2, 5)) == ["train", "eval"]
    path.write_text("w1 w2 w3\n\nw4 w5 w6\n")  # appended to after its survey
    with pytest.raises(BuildError, match=r"corpus file .*f\.txt changed while the dataset was "
                                         r"being built \(2 documents and 5 tokens when "
                                         r"surveyed, 2 and 6 when packed\)"):
        pack(FileSplit(frozenset({1}), 2, 5))
