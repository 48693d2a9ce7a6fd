"""The converters' writes on a read-only or full disk: one line, exit status 2, nothing partial.

Real faults: a tmpfs remounted read-only (root cannot write either), a tmpfs filled up.
`to-google` wrote its checkpoint with TensorFlow's SaveV2, whose errors are not OSErrors: it
ended in a 37-line `PermissionDeniedError [Op:SaveV2]` traceback where `to-hf` and
`to-keras-hub` gave one line.
"""

import os

import pytest

from electra_tf.convert.__main__ import main as convert_main
from tests import convert_fixtures as cf
from tests import fault_fixtures as faults


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("writers")
    vocab = cf.text_vocab_path(str(root), real=False)
    return cf.make_model_dir(str(root), cf.tiny_hparams(cf.vocab_size_of(vocab)), vocab)[0]


def _convert(capsys, command, model_dir, out):
    code = convert_main(["--quiet", command, "--model-dir", model_dir, "--output-dir", out])
    return faults.one_error_line(code, capsys.readouterr().err,
                                 f"python -m electra_tf.convert {command}")


@pytest.mark.parametrize("command", ["to-google", "to-hf", "to-keras-hub"])
def test_export_into_a_read_only_directory_is_one_line(model_dir, tmp_path, capsys, command):
    with faults.small_filesystem(str(tmp_path / "disk"), size="4m") as disk:
        out = os.path.join(disk, "out")
        os.makedirs(out)
        faults.read_only(disk)
        line = _convert(capsys, command, model_dir, out)
        assert "Read-only file system" in line and out in line, line
        assert os.listdir(out) == []


def test_to_google_on_a_full_disk_is_one_line_and_leaves_no_partial_checkpoint(
        model_dir, tmp_path, capsys):
    with faults.small_filesystem(str(tmp_path / "disk"), size="4m") as disk:
        out = os.path.join(disk, "out")
        os.makedirs(out)
        filler = faults.fill(disk, 32 << 10)  # less than the weights (~1 MB)
        line = _convert(capsys, "to-google", model_dir, out)
        assert f"cannot write the checkpoint {out}/model.ckpt-1000 (" in line, line
        assert "No space left on device" in line, line
        assert os.listdir(out) == []  # no half checkpoint, no staging directory
        os.remove(filler)
        assert convert_main(["--quiet", "to-google", "--model-dir", model_dir,
                             "--output-dir", out]) == 0
        assert sorted(os.listdir(out)) == ["checkpoint", "model.ckpt-1000.data-00000-of-00001",
                                           "model.ckpt-1000.index", "vocab.txt"]


def test_to_hf_on_a_full_disk_is_one_line_and_leaves_no_partial_export(model_dir, tmp_path, capsys):
    # The files are written together (issue 47): a failure among them leaves none, so the rerun
    # is not refused for "already holds" files of a half export.
    with faults.small_filesystem(str(tmp_path / "disk"), size="4m") as disk:
        out = os.path.join(disk, "out")
        filler = faults.fill(disk, 512 << 10)  # room for the small files, not the weights (~2 MB)
        line = _convert(capsys, "to-hf", model_dir, out)
        assert "No space left on device" in line, line
        assert sorted(os.listdir(disk)) == ["filler"]  # no out/, no staging directory
        os.makedirs(out)  # into an existing directory: the same
        line = _convert(capsys, "to-hf", model_dir, out)
        assert "No space left on device" in line and os.listdir(out) == [], line
        os.remove(filler)
        assert convert_main(["--quiet", "to-hf", "--model-dir", model_dir, "--output-dir", out]) == 0
        assert "model.safetensors" in os.listdir(out)


def test_to_hf_files_all_get_the_umask_permissions(model_dir, tmp_path):
    # model.safetensors was 0600 (safetensors creates its file itself), the others 0644.
    umask = os.umask(0o022)
    os.umask(umask)
    out = str(tmp_path / "hf")
    assert convert_main(["--quiet", "to-hf", "--model-dir", model_dir, "--output-dir", out]) == 0
    modes = {name: oct(os.stat(os.path.join(out, name)).st_mode & 0o777) for name in os.listdir(out)}
    assert "model.safetensors" in modes
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes
    assert oct(os.stat(out).st_mode & 0o777) == oct(0o777 & ~umask)
