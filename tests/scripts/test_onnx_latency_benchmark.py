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


def test_cpu_flags_name_avx512_else_what_the_cpu_has(tmp_path):
    """The CPU record read through `precision.read_cpu`: AVX-512 / AMX names, else AVX2 / FMA."""
    from benchmarks import onnx_latency

    def flags(line):
        path = tmp_path / "cpuinfo"
        path.write_text(f"model name\t: x\nflags\t\t: {line}\n")
        return onnx_latency.cpu_flags(str(path))

    assert flags("fpu avx2 fma avx512f avx512_bf16") == "avx512_bf16 avx512f"
    assert flags("fpu avx2 fma sse4_2") == "AVX2+FMA, no AVX-512"
    assert flags("fpu sse4_2") == "no AVX2, no AVX-512"
    assert onnx_latency.cpu_flags(str(tmp_path / "absent")) == "unknown"
