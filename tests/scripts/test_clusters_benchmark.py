"""benchmarks/clusters.py: every cluster and pass of both encoders is timed, bad flags fail."""

import re

import pytest

from benchmarks import clusters


def test_every_cluster_and_pass_is_reported(capsys):
    clusters.main(["--batch", "2", "--seq-length", "8", "--reps", "1", "--calls", "1"])
    out = capsys.readouterr().out
    assert "batch 2 x L 8, dropout 0.1 (hash)" in out
    for encoder in clusters.ENCODERS:
        for cluster in clusters.CLUSTERS:
            for step_pass in clusters.PASSES:
                assert re.search(rf"^{encoder}\s+{cluster}\s+{step_pass}\s+\d+\.\d+\s+\d+\.\d+$",
                                 out, re.M), (encoder, cluster, step_pass)
    assert re.search(r"^all block clusters: \d+\.\d ms per training step", out, re.M)


@pytest.mark.parametrize("flag", ["--calls", "--reps", "--seq-length"])
def test_non_positive_counts_are_rejected(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        clusters.main([flag, "0"])
    assert exit_info.value.code == 2
    assert "expected a positive integer, got '0'" in capsys.readouterr().err
