"""benchmarks/dense_grad.py and benchmarks/clusters.py: everything they time is reported; bad flags
of every micro-benchmark of products (their parser is `alternating.product_parser`) fail."""

import re

import pytest

from benchmarks import attention_matmul, clusters, dense_grad


def test_dense_grad_reports_every_layer_and_form(capsys):
    dense_grad.main(["--batch", "1", "--seq-length", "4", "--reps", "1", "--calls", "1"])
    out = capsys.readouterr().out
    assert "rows 4 (batch 1 x L 4)" in out
    for layer in dense_grad.LAYERS:
        for form in dense_grad.FORMS:
            assert re.search(rf"^{re.escape(layer)}\s+{form}\s+\d+\.\d+\s+\d+\.\d+$", out, re.M), \
                (layer, form)
    assert re.search(r"^dx einsum saves -?\d+\.\d ms per training step", out, re.M)


def test_clusters_reports_every_cluster_and_pass(capsys):
    clusters.main(["--batch", "2", "--seq-length", "8", "--reps", "1", "--calls", "1"])
    out = capsys.readouterr().out
    assert "batch 2 x L 8, dropout 0.1 (hash)" in out
    for encoder in clusters.ENCODERS:
        for cluster in clusters.CLUSTERS:
            for step_pass in clusters.PASSES:
                assert re.search(rf"^{encoder}\s+{cluster}\s+{step_pass}\s+\d+\.\d+\s+\d+\.\d+$",
                                 out, re.M), (encoder, cluster, step_pass)
    assert re.search(r"^all block clusters: \d+\.\d ms per training step", out, re.M)


@pytest.mark.parametrize("benchmark,flag", [
    (dense_grad, "--calls"), (dense_grad, "--reps"), (dense_grad, "--batch"),
    (clusters, "--calls"), (clusters, "--reps"), (clusters, "--seq-length"),
    (attention_matmul, "--batch"), (attention_matmul, "--heads")])
def test_non_positive_counts_are_rejected(benchmark, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main([flag, "0"])
    assert exit_info.value.code == 2
    assert "expected a positive integer, got '0'" in capsys.readouterr().err
