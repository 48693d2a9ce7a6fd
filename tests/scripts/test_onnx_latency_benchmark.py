"""benchmarks/onnx_latency.py: every engine is timed and sized, the two agree, bad flags fail."""

import pytest

from tests.extras import import_extra


@pytest.mark.slow
def test_reports_size_latency_and_agreement_of_every_engine(tmp_path):
    import_extra("onnxruntime", "onnx")
    import_extra("tf2onnx", "onnx")
    from benchmarks import onnx_latency

    result = onnx_latency.main(["--vocab-size", "64", "--num-layers", "1", "--seq-length", "16", "--warmup", "1",
                                "--rounds", "1", "--calls", "2", "--output", str(tmp_path / "r.json")])
    assert set(result["engines"]) == {"tensorflow_saved_model", "onnxruntime",
                                      "onnxruntime_no_spinning", "onnxruntime_1_thread"}
    for engine in result["engines"].values():
        assert engine["median_ms"] > 0 and engine["size_mb"] > 0
    assert result["max_abs_difference_replaced_probs"] <= 1e-4
    assert result["batch"] == 1 and result["seq_length"] == 16 and result["opset"] == 17
    assert (tmp_path / "r.json").is_file()


def test_non_positive_counts_are_rejected(capsys):
    from benchmarks import onnx_latency

    with pytest.raises(SystemExit) as exit_info:
        onnx_latency.main(["--calls", "0"])
    assert exit_info.value.code == 2 and "--calls" in capsys.readouterr().err
