"""benchmarks/pretrain_step.py's record of the machine: the CPU flags that decide kernels and
precision, what "auto" picks there, and which matmul peaks it measures."""

from benchmarks import pretrain_step
from electra_tf import onednn, precision


def test_machine_info_records_flags_auto_precision_and_onednn():
    info = pretrain_step.machine_info()
    name, flags = precision.read_cpu()
    flags = flags or frozenset()
    assert info["cpu"] == name
    assert info["cpu_flags"] == [f for f in pretrain_step.RECORDED_CPU_FLAGS if f in flags]
    auto = precision.resolve("auto", precision.DeviceFacts("cpu", name, flags))
    assert info["auto_precision"] == {"policy": auto.policy, "reason": auto.reason}
    assert info["tf_enable_onednn_opts"] in ("0", "1", "", "TensorFlow's default")
    if onednn.wanted(flags):
        assert info["tf_enable_onednn_opts"] == "1"


def test_bfloat16_peak_is_measured_only_where_native():
    assert pretrain_step.peak_dtypes(["float32", "bfloat16"], frozenset({"avx2", "fma"})) \
        == ["float32"]
    for native in ("avx512_bf16", "amx_bf16"):
        assert pretrain_step.peak_dtypes(["float32", "bfloat16"], frozenset({native})) \
            == ["float32", "bfloat16"]
    assert pretrain_step.peak_dtypes(["bfloat16"], frozenset()) == []
