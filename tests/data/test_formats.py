"""Input formats: compressed streams, OpenWebText archives, JSON Lines, and every bad-input case.

Each bad input must be a counted skip that names the file and the line or member (in the reader's
problem records, the manifest and inputs.jsonl), keep everything else, and with
`bad_input="error"` become a one-line BuildError naming the same place.
"""

import bz2
import gzip
import io
import json
import lzma
import os
import tarfile

import pytest

from electra_tf.data.text import formats
from electra_tf.data.build.build_config import BuildConfig
from electra_tf.errors import BuildError
from electra_tf.data.build.builder import build_dataset
from electra_tf.data.text.corpus import CorpusFile, ReadStats

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
NUM_WORDS = 300
OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def text_of(docs):
    """Documents (lists of lines) as the plain-text format: blank line between documents."""
    return "\n\n".join("\n".join(doc) for doc in docs) + "\n"


def docs_for(seed, count=6):
    return [[" ".join(f"w{(seed * 31 + d * 7 + i * 3 + j) % NUM_WORDS}" for j in range(2 + i))
             for i in range(1 + d % 3)] for d in range(count)]


def corpus_file(path, root):
    return CorpusFile(os.path.relpath(path, root).replace(os.sep, "/"), str(path),
                      os.path.getsize(path))


def read(path, root, **settings):
    stats = ReadStats()
    batches = list(formats.iter_document_lines(corpus_file(path, root),
                                               formats.InputSettings(**settings), stats))
    return [line for batch in batches for line in batch], stats


def documents(lines):
    """Split reader output at "" markers into documents (lists of lines)."""
    return list(formats.iter_documents([lines]))


def only_problem(stats):
    assert len(stats.problems) == 1, stats.problems
    return next(iter(stats.problems.values()))


@pytest.fixture
def vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(SPECIALS + [f"w{i}" for i in range(NUM_WORDS)]) + "\n")
    return str(path)


def build(tmp_path, vocab_file, corpus, out="out", **kwargs):
    kwargs.setdefault("max_seq_length", 16)
    kwargs.setdefault("eval_fraction", 0.0)
    return build_dataset(BuildConfig(corpus_dir=str(corpus), vocab_file=vocab_file,
                                     output_dir=str(tmp_path / out), progress_interval=1e9,
                                     **kwargs))


# ------------------------------------------------------------------------------------------------
# Plain text, compressed
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_compressed_text_reads_like_the_plain_file(tmp_path, suffix):
    text = text_of(docs_for(1)) + "\n\n" + text_of(docs_for(2))
    (tmp_path / "plain.txt").write_text(text)
    with OPENERS[suffix](tmp_path / f"packed.txt{suffix}", "wt") as f:
        f.write(text)
    plain, plain_stats = read(tmp_path / "plain.txt", tmp_path)
    packed, packed_stats = read(tmp_path / f"packed.txt{suffix}", tmp_path)
    assert packed == plain and len(documents(packed)) == 12
    assert packed_stats.bytes_read == plain_stats.bytes_read == len(text.encode())
    assert not packed_stats.problems


def test_compressed_corpus_builds_with_the_plain_corpus_counts(tmp_path, vocab_file):
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    for i, suffix in enumerate([".gz", ".bz2", ".xz"]):
        text = text_of(docs_for(i, count=20))
        (plain / f"f{i}.txt").write_text(text)
        with OPENERS[suffix](packed / f"f{i}.txt{suffix}", "wt") as f:
            f.write(text)
    m1 = build(tmp_path, vocab_file, plain, "out_plain")
    m2 = build(tmp_path, vocab_file, packed, "out_packed")
    for key in ("documents", "sentences", "tokenized_tokens", "corpus_bytes", "lines"):
        assert m1["counts"][key] == m2["counts"][key], key
    assert m2["counts"]["input_problems"] == 0


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_truncated_compressed_stream_keeps_what_was_read_and_names_the_line(tmp_path, suffix):
    lines = [f"w{i % NUM_WORDS} w{(i * 7) % NUM_WORDS}" for i in range(20000)]
    data = io.BytesIO()
    # bzip2 decodes whole blocks only: level 1 (100 kB blocks) leaves a whole block before the cut.
    options = {"compresslevel": 1} if suffix == ".bz2" else {}
    with OPENERS[suffix](data, "wt", **options) as f:
        f.write("\n".join(lines) + "\n")
    blob = data.getvalue()
    path = tmp_path / f"cut.txt{suffix}"
    path.write_bytes(blob[:len(blob) * 2 // 3])
    got, stats = read(path, tmp_path)
    problem = only_problem(stats)
    assert problem["file"] == f"cut.txt{suffix}" and problem["problem"] == "damaged_stream"
    assert problem["first"].startswith("after line ")
    assert 0 < len(got) < len(lines) and got == lines[:len(got)]  # a clean prefix
    assert stats.damaged_files == 1


def test_content_not_name_decides_and_corrupt_streams_are_damaged(tmp_path):
    (tmp_path / "fake.txt.gz").write_text("w1 w2\n")  # text named .gz: read as the text it is
    got, stats = read(tmp_path / "fake.txt.gz", tmp_path)
    assert got == ["w1 w2"] and not stats.problems
    (tmp_path / "bad.txt").write_bytes(b"\x1f\x8b\x08\x00" + b"\xff" * 40)  # gzip, then garbage
    got, stats = read(tmp_path / "bad.txt", tmp_path)
    assert got == [] and only_problem(stats)["first"] == "after line 0"
    assert only_problem(stats)["problem"] == "damaged_stream"
    blob = bytearray(gzip.compress(b"w1 w2\nw3 w4\n"))
    blob[-8] ^= 0xFF  # the CRC32 in the trailer
    (tmp_path / "crc.txt.gz").write_bytes(bytes(blob))
    got, stats = read(tmp_path / "crc.txt.gz", tmp_path)
    assert got[:1] == ["w1 w2"]  # the data read before the check is kept
    assert "CRC check failed" in only_problem(stats)["detail"]


def test_invalid_utf8_is_replaced_counted_and_located(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"w1\nw2\nw3 \xff\xfe w4\nw5 \xc3\n")
    got, stats = read(tmp_path / "bad.txt", tmp_path)
    assert got == ["w1", "w2", "w3 \ufffd\ufffd w4", "w5 \ufffd"]
    problem = only_problem(stats)
    assert problem == {"file": "bad.txt", "problem": "invalid_utf8", "count": 3,
                       "first": "line 3", "detail": problem["detail"]}


# ------------------------------------------------------------------------------------------------
# OpenWebText
# ------------------------------------------------------------------------------------------------
def write_archive(path, members, mode="w:xz"):
    """A tar archive of text members {name: bytes}, in order (e.g. an OpenWebText .xz file)."""
    target = {"fileobj": path} if isinstance(path, io.BytesIO) else {"name": path}
    with tarfile.open(mode=mode, **target) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def owt_members(prefix, count, paragraphs=3):
    return {f"{prefix}-{i:03d}.txt": "\n\n".join(
        " ".join(f"w{(i * 13 + p * 5 + j) % NUM_WORDS}" for j in range(3 + p))
        for p in range(paragraphs)).encode() + b"\n" for i in range(count)}


def test_openwebtext_member_is_one_document_blank_lines_are_not_breaks(tmp_path):
    members = owt_members("0001", 5)
    write_archive(tmp_path / "urlsf_subset00-1_data.xz", members)
    got, stats = read(tmp_path / "urlsf_subset00-1_data.xz", tmp_path,
                      input_format="openwebtext")
    expected = [[line for line in data.decode().split("\n") if line] for data in members.values()]
    assert documents(got) == expected  # 5 documents of 3 paragraphs each
    assert not stats.problems


def test_openwebtext_builds_one_document_per_member(tmp_path, vocab_file):
    corpus = tmp_path / "openwebtext"
    corpus.mkdir()
    write_archive(corpus / "a_data.xz", owt_members("a", 40))
    write_archive(corpus / "b_data.xz", owt_members("b", 30))
    with tarfile.open(corpus / "c_data.xz", "w:xz") as tar:  # a directory member is skipped
        directory = tarfile.TarInfo("somedir")
        directory.type = tarfile.DIRTYPE
        tar.addfile(directory)
        info = tarfile.TarInfo("somedir/doc.txt")
        data = b"w1 w2 w3\n\nw4 w5\n"
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    manifest = build(tmp_path, vocab_file, corpus, input_format="openwebtext", max_seq_length=64)
    assert manifest["input_format"] == "openwebtext"
    assert manifest["counts"]["documents"] == 71
    assert manifest["counts"]["input_problems"] == 0


def test_openwebtext_truncated_archive_keeps_earlier_members(tmp_path):
    members = owt_members("t", 400, paragraphs=6)
    blob = io.BytesIO()
    write_archive(blob, members, mode="w:xz")
    path = tmp_path / "cut_data.xz"
    path.write_bytes(blob.getvalue()[:len(blob.getvalue()) // 2])
    got, stats = read(path, tmp_path, input_format="openwebtext")
    problem = only_problem(stats)
    assert problem["problem"] == "damaged_stream" and problem["file"] == "cut_data.xz"
    kept = documents(got)
    assert 0 < len(kept) < 400
    names = list(members)
    assert problem["first"].startswith("after member t-")
    last_named = problem["first"][len("after member "):]
    assert names.index(last_named) in (len(kept) - 1, len(kept))  # the one being read or the last
    expected = [[x for x in members[n].decode().split("\n") if x] for n in names[:len(kept)]]
    assert kept[:-1] == expected[:-1]  # all but the member cut mid-way are whole


def test_openwebtext_corrupt_member_header_is_skipped_others_kept(tmp_path):
    members = owt_members("h", 6)
    raw = io.BytesIO()
    write_archive(raw, members, mode="w")
    blob = bytearray(raw.getvalue())
    # Garble the header of the third member (its name field): the checksum no longer matches.
    third = blob.index(b"h-002.txt")
    blob[third:third + 5] = b"XXXXX"
    (tmp_path / "corrupt_data.xz").write_bytes(lzma.compress(bytes(blob)))
    got, stats = read(tmp_path / "corrupt_data.xz", tmp_path, input_format="openwebtext")
    names = [n for n in members if n != "h-002.txt"]
    assert documents(got) == [[x for x in members[n].decode().split("\n") if x] for n in names]
    problem = only_problem(stats)
    assert problem["problem"] == "bad_archive_member"
    assert problem["first"] == "member h-003.txt" and "corrupt member" in problem["detail"]
    assert stats.skipped_documents == 1


def test_openwebtext_non_archive_and_non_utf8_member(tmp_path):
    (tmp_path / "notes.xz").write_bytes(lzma.compress(b"just text, not a tar archive\n" * 50))
    got, stats = read(tmp_path / "notes.xz", tmp_path, input_format="openwebtext")
    assert got == [] and "not a tar archive" in only_problem(stats)["detail"]
    write_archive(tmp_path / "latin1_data.xz", {"ok.txt": b"w1 w2\n", "bad.txt": b"w3\ncaf\xe9\n"})
    got, stats = read(tmp_path / "latin1_data.xz", tmp_path, input_format="openwebtext")
    assert documents(got) == [["w1 w2"], ["w3", "caf\ufffd"]]
    problem = only_problem(stats)
    assert problem["problem"] == "invalid_utf8" and problem["first"] == "member bad.txt, line 2"


# ------------------------------------------------------------------------------------------------
# JSON Lines
# ------------------------------------------------------------------------------------------------
def test_jsonl_reads_the_configured_field_one_document_per_line(tmp_path):
    rows = [{"id": 1, "content": "w1 w2\n\nw3\n"}, {"id": 2, "content": "w4"},
            {"id": 3, "content": "  \n "}]
    (tmp_path / "dump.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    got, stats = read(tmp_path / "dump.jsonl", tmp_path, input_format="jsonl",
                      jsonl_text_field="content")
    assert documents(got) == [["w1 w2", "w3"], ["w4"]]  # an empty text is no document
    assert not stats.problems


def test_jsonl_bad_lines_are_skipped_counted_and_named(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "MAX_JSON_LINE_BYTES", 200)
    lines = [json.dumps({"text": "w1 w2"}).encode(),          # 1 good
             b'{"text": "w3", ',                               # 2 not JSON
             json.dumps({"body": "w4"}).encode(),              # 3 no field
             json.dumps({"text": 5}).encode(),                 # 4 field not a string
             json.dumps(["w5"]).encode(),                      # 5 not an object
             b'{"text": "w6 \xff"}',                           # 6 invalid UTF-8, kept
             json.dumps({"text": "w7 " * 100}).encode(),       # 7 over the line limit
             json.dumps({"text": "w8"}).encode(),              # 8 good
             json.dumps({"body": "w9"}).encode()]              # 9 no field
    (tmp_path / "dump.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    got, stats = read(tmp_path / "dump.jsonl", tmp_path, input_format="jsonl")
    assert documents(got) == [["w1 w2"], ["w6 \ufffd"], ["w8"]]
    problems = {p["problem"]: p for p in stats.problems.values()}
    assert {k: (p["first"], p["count"]) for k, p in problems.items()} == {
        "invalid_json": ("line 2", 1), "missing_text_field": ("line 3", 4),
        "invalid_utf8": ("line 6", 1), "line_too_long": ("line 7", 1)}
    assert "no field 'text'" in problems["missing_text_field"]["detail"]
    assert stats.skipped_documents == 6


def test_jsonl_truncated_gzip_keeps_whole_lines_before_the_cut(tmp_path):
    text = "".join(json.dumps({"text": f"w{i % NUM_WORDS} w{(i * 3) % NUM_WORDS}"}) + "\n"
                   for i in range(30000))
    blob = gzip.compress(text.encode())
    (tmp_path / "dump.jsonl.gz").write_bytes(blob[:len(blob) // 2])
    got, stats = read(tmp_path / "dump.jsonl.gz", tmp_path, input_format="jsonl")
    problem = only_problem(stats)
    assert problem["problem"] == "damaged_stream" and problem["first"].startswith("after line ")
    assert 0 < len(documents(got)) < 30000


# ------------------------------------------------------------------------------------------------
# In a build: manifest, inputs.jsonl, --bad-input error
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def mixed_jsonl_corpus(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    good = "".join(json.dumps({"text": " ".join(docs_for(i)[0])}) + "\n" for i in range(50))
    (corpus / "a.jsonl").write_text(good)
    (corpus / "b.jsonl").write_text(good + '{"title": "no text"}\n' + good)
    return corpus


def test_build_records_problems_in_manifest_and_inputs(tmp_path, vocab_file, mixed_jsonl_corpus):
    manifest = build(tmp_path, vocab_file, mixed_jsonl_corpus, input_format="jsonl")
    assert manifest["counts"]["documents"] == 150
    assert manifest["counts"]["skipped_documents"] == 1
    assert manifest["counts"]["input_problems"] == 1
    assert manifest["input_problems"] == [{
        "file": "b.jsonl", "problem": "missing_text_field", "count": 1, "first": "line 51",
        "detail": "no field 'text' (--jsonl-text-field text)"}]
    inputs = [json.loads(line) for line in open(tmp_path / "out" / "inputs.jsonl")]
    assert [e["file"] for e in inputs] == ["a.jsonl", "b.jsonl"]
    assert "problems" not in inputs[0] and inputs[1]["problems"][0]["first"] == "line 51"
    assert [e["documents"] for e in inputs] == [50, 100]


@pytest.mark.parametrize("num_processes", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_bad_input_error_stops_naming_file_and_line(tmp_path, vocab_file, mixed_jsonl_corpus,
                                                    num_processes):
    # With 2 processes the error crosses from a worker process as its one-line message.
    with pytest.raises(BuildError) as err:
        build(tmp_path, vocab_file, mixed_jsonl_corpus, input_format="jsonl", bad_input="error",
              num_processes=num_processes)
    message = str(err.value)
    assert "b.jsonl" in message and "line 51" in message and "missing_text_field" in message
    assert "\n" not in message
    assert not (tmp_path / "out").exists()  # nothing left behind


def test_a_failing_write_leaves_no_temporaries(tmp_path, vocab_file, mixed_jsonl_corpus,
                                               monkeypatch):
    from electra_tf.data.build import shuffle

    def full_disk(self, bucket):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shuffle.BucketWriter, "_flush", full_disk)
    # One line naming the directory and the cause (issue 13), and nothing left behind.
    with pytest.raises(BuildError, match=r"cannot write the shuffle's temporary files in .*"
                                         r"\(No space left on device\)"):
        build(tmp_path, vocab_file, mixed_jsonl_corpus, input_format="jsonl")
    assert not (tmp_path / "out").exists()


def test_a_failed_write_advises_overwrite_only_when_a_rerun_needs_it(
        tmp_path, vocab_file, mixed_jsonl_corpus, monkeypatch):
    from electra_tf.data.build import shuffle

    build(tmp_path, vocab_file, mixed_jsonl_corpus, "previous", input_format="jsonl")
    before = {n: (tmp_path / "previous" / n).read_bytes()
              for n in os.listdir(tmp_path / "previous")}

    def full_disk(self, bucket):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shuffle.BucketWriter, "_flush", full_disk)
    with pytest.raises(BuildError) as new_dir:  # nothing there before, nothing left
        build(tmp_path, vocab_file, mixed_jsonl_corpus, "new", input_format="jsonl")
    assert str(new_dir.value).endswith("and rerun") and not (tmp_path / "new").exists()
    with pytest.raises(BuildError) as replacing:  # the previous dataset stays, as it was
        build(tmp_path, vocab_file, mixed_jsonl_corpus, "previous", input_format="jsonl",
              overwrite=True)
    assert str(replacing.value).endswith("and rerun with --overwrite")
    assert {n: (tmp_path / "previous" / n).read_bytes()
            for n in os.listdir(tmp_path / "previous")} == before


def test_learn_vocab_refuses_other_formats(tmp_path, mixed_jsonl_corpus):
    with pytest.raises(BuildError, match="--learn-vocab reads uncompressed plain-text"):
        build_dataset(BuildConfig(corpus_dir=str(mixed_jsonl_corpus), input_format="jsonl",
                                  learn_vocab=100, output_dir=str(tmp_path / "d" / "out")))
