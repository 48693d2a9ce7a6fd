"""Streaming corpus reading: listing, line semantics, junk handling, bounded memory."""

import os
import subprocess
import sys
import textwrap

import pytest

from electra_tf.data.text.corpus import (CorpusError, ReadStats, decode_utf8, iter_line_batches,
                                    list_corpus_files)
from tests import pretraining_fixtures as fx


def read_lines(path, **kwargs):
    stats = ReadStats()
    lines = [line for batch in iter_line_batches(str(path), stats, **kwargs) for line in batch]
    return lines, stats


def test_list_corpus_files_sorted_recursive_hidden_skipped(tmp_path):
    (tmp_path / "b.txt").write_text("b\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "z.txt").write_text("z\n")
    (tmp_path / ".hidden.txt").write_text("h\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "x").write_text("x\n")
    files = list_corpus_files(str(tmp_path))
    assert [f.relpath for f in files] == ["a/z.txt", "b.txt"]
    assert files[0].size == 2 and files[0].path == str(tmp_path / "a" / "z.txt")


def test_list_corpus_files_errors(tmp_path):
    with pytest.raises(CorpusError, match="corpus dir .*missing.* does not exist"):
        list_corpus_files(str(tmp_path / "missing"))
    with pytest.raises(CorpusError, match="contains no files"):
        list_corpus_files(str(tmp_path))
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(CorpusError, match="is not a directory"):
        list_corpus_files(str(tmp_path / "f.txt"))
    os.symlink(str(tmp_path / "nowhere"), str(tmp_path / "dangling.txt"))
    with pytest.raises(CorpusError, match="cannot read corpus file .*dangling.txt"):
        list_corpus_files(str(tmp_path))
    os.remove(tmp_path / "dangling.txt")
    os.mkfifo(str(tmp_path / "fifo"))
    with pytest.raises(CorpusError, match="fifo is not a regular file"):
        list_corpus_files(str(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read a chmod-000 file")
def test_list_corpus_files_unreadable(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text("x\n")
    path.chmod(0)
    try:
        with pytest.raises(CorpusError, match="cannot read corpus file .*secret.txt"):
            list_corpus_files(str(tmp_path))
    finally:
        path.chmod(0o644)


def test_lines_are_stripped_blank_kept_last_line_without_newline(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"  one two \n\n   \nthree\r\nfour")
    lines, stats = read_lines(path)
    assert lines == ["one two", "", "", "three", "four"]
    assert stats.lines == 5 and stats.blank_lines == 2 and stats.crlf_line_ends == 1
    assert stats.bytes_read == path.stat().st_size


def test_split_only_on_newline_like_gfile(tmp_path):
    # \r, \x0b, \x0c, \x1c, U+2028 are not line breaks for the official reader.
    path = tmp_path / "c.txt"
    path.write_bytes("a\rb\x0bc\x0cd\x1ce\u2028f\n".encode())
    lines, _ = read_lines(path)
    assert lines == ["a\rb\x0bc\x0cd\x1ce\u2028f"]


def test_bom_invalid_utf8_and_nul_are_counted(tmp_path):
    path = tmp_path / "junk.txt"
    path.write_bytes(b"\xef\xbb\xbfhello\n" + b"bad \xff\xfe byte\n" + b"nul\x00here\n"
                     + b"cut \xe2\x82\n")
    lines, stats = read_lines(path)
    assert lines == ["hello", "bad \ufffd\ufffd byte", "nul\x00here", "cut \ufffd"]
    assert stats.bom_files == 1
    assert stats.undecodable_bytes == 4  # \xff, \xfe and the truncated 2-byte sequence
    assert stats.nul_bytes == 1


def test_decode_utf8_counts_only_replaced_bytes():
    stats = ReadStats()
    assert decode_utf8("é\ufffd".encode(), stats) == "é\ufffd"  # a real U+FFFD is not counted
    assert stats.undecodable_bytes == 0
    assert decode_utf8(b"a\x80\x80b", stats) == "a\ufffd\ufffdb"
    assert stats.undecodable_bytes == 2


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 7, 64, 1 << 20])
def test_chunk_size_does_not_change_lines_or_counts(tmp_path, chunk_bytes):
    path = tmp_path / "c.txt"
    data = "Ünïcödé line\r\n\nsecond ☃ line\r\n  \n" * 5 + "tail"
    path.write_bytes(data.encode())
    lines, stats = read_lines(path, chunk_bytes=chunk_bytes)
    assert lines == [l.strip() for l in data.split("\n")]
    assert stats.crlf_line_ends == 10 and stats.undecodable_bytes == 0


def test_long_lines_are_split_at_char_boundaries_and_counted_once(tmp_path):
    path = tmp_path / "c.txt"
    long_line = "ab☃" * 50 + "word " * 40  # 450 + 200 bytes
    path.write_bytes(("short\n" + long_line + "\nlast\n" + "x" * 250).encode())
    for chunk_bytes in (16, 1 << 20):
        lines, stats = read_lines(path, chunk_bytes=chunk_bytes, max_line_bytes=100)
        assert lines[0] == "short"
        assert stats.lines_split == 2  # the long line and the unterminated last one
        assert stats.undecodable_bytes == 0  # no UTF-8 sequence was cut
        assert all(len(line.encode()) <= 100 for line in lines)
        i = lines.index("last")
        assert "".join(lines[1:i]).replace(" ", "") == long_line.replace(" ", "")
        assert "".join(lines[i + 1:]) == "x" * 250


def test_memory_stays_bounded_on_a_large_file_with_a_10mb_line(tmp_path):
    # ~200 MB file whose 10 MB line has no newline; reading it must not raise peak RSS by more
    # than a few tens of MB (it holds about one chunk plus one partial line).
    script = textwrap.dedent(f"""
        import resource, sys
        sys.path.insert(0, {fx.REPO_ROOT!r})
        from electra_tf.data.text.corpus import iter_line_batches, ReadStats
        path = {str(tmp_path / "big.txt")!r}
        block = b"the quick brown fox jumps over the lazy dog\\n" * 20000
        with open(path, "wb") as f:
            for i in range(200 * 2 ** 20 // len(block)):
                f.write(block)
                if i == 50:
                    f.write(b"x" * (10 * 2 ** 20))
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        stats = ReadStats()
        for lines in iter_line_batches(path, stats):
            pass
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(stats.bytes_read, stats.lines_split, (peak - base) // 1024)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    bytes_read, lines_split, delta_mb = map(int, out.stdout.split())
    assert bytes_read > 200 * 2 ** 20
    assert lines_split == 1
    assert delta_mb < 40, f"peak RSS grew by {delta_mb} MB"
