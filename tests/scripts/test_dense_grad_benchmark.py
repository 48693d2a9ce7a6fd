"""benchmarks/dense_grad.py: every layer and product form is timed, and bad flags fail in one line."""

import re

import pytest

from benchmarks import dense_grad


def test_every_layer_and_form_is_reported(capsys):
    dense_grad.main(["--batch", "1", "--seq-length", "4", "--reps", "1", "--calls", "1"])
    out = capsys.readouterr().out
    assert "rows 4 (batch 1 x L 4)" in out
    for layer in dense_grad.LAYERS:
        for form in dense_grad.FORMS:
            assert re.search(rf"^{re.escape(layer)}\s+{form}\s+\d+\.\d+\s+\d+\.\d+$", out, re.M), \
                (layer, form)
    assert re.search(r"^dx einsum saves -?\d+\.\d ms per training step", out, re.M)


@pytest.mark.parametrize("flag", ["--calls", "--reps", "--batch"])
def test_non_positive_counts_are_rejected(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        dense_grad.main([flag, "0"])
    assert exit_info.value.code == 2
    assert "expected a positive integer, got '0'" in capsys.readouterr().err
