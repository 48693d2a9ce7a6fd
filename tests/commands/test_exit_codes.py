"""The tools moved out of the library modules follow the common exit convention
(`electra_tf.cli.run_cli`): 0 done, 2 a user error in one line on stderr, 130 on Ctrl-C."""

import pytest

from electra_tf.cli import EXIT_INTERRUPTED, EXIT_USER_ERROR
from electra_tf.commands import build_corpus_tasks, fetch_labelled
from electra_tf.finetuning import corpus_tasks


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def test_fetch_labelled_exits_130_on_ctrl_c(monkeypatch, capsys):
    monkeypatch.setattr(fetch_labelled, "fetch_labelled_data", _interrupt)
    assert fetch_labelled.main(["--data-dir", "unused"]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == f"{fetch_labelled.PROG}: interrupted\n"


def test_fetch_labelled_unknown_set_is_one_line_and_exit_2(tmp_path, capsys):
    assert fetch_labelled.main(["--data-dir", str(tmp_path), "no_such_set"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith(f"{fetch_labelled.PROG}: error: unknown labelled set 'no_such_set'")
    assert err.count("\n") == 1


def test_build_corpus_tasks_exits_130_on_ctrl_c(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(corpus_tasks, "build", _interrupt)
    assert build_corpus_tasks.main(["--output-dir", str(tmp_path)]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == f"{build_corpus_tasks.PROG}: interrupted\n"


@pytest.mark.parametrize("argv, message", [
    (["--tasks", "nope"], "unknown corpus task(s) ['nope']"),
    (["--corpus-dir", "EMPTY"], "only 0 documents"),
])
def test_build_corpus_tasks_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    (tmp_path / "empty").mkdir()
    argv = [str(tmp_path / "empty") if a == "EMPTY" else a for a in argv]
    assert build_corpus_tasks.main(["--output-dir", str(tmp_path / "out")] + argv) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith(f"{build_corpus_tasks.PROG}: error: ") and message in err, err
    assert err.count("\n") == 1
