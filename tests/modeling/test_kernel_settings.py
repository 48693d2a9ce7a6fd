"""electra_tf.modeling.kernel_settings: the kernel switches, defined once and TensorFlow-free;
fused.py reads them there and re-exports none."""

import pytest

from electra_tf.modeling import fused, kernel_settings


def test_the_settings_have_one_address():
    # fused.py reads them from kernel_settings and defines none of its own (issue 36: one
    # address per name), so an assignment can only reach the one switch.
    for name in ("configure", "kernel_options", "use_xla", "KERNELS", "DROPOUT_RNG",
                 "SAMPLING_RNG", "DENSE_GRAD", "KERNEL_CHOICES", "DROPOUT_RNG_CHOICES",
                 "SAMPLING_RNG_CHOICES", "DENSE_GRAD_CHOICES", "DEFAULT_KERNELS",
                 "DEFAULT_DROPOUT_RNG", "DEFAULT_SAMPLING_RNG", "DEFAULT_DENSE_GRAD"):
        assert hasattr(kernel_settings, name), name
        assert not hasattr(fused, name), name
    with kernel_settings.kernel_options("tf", "philox", "philox", "matmul"):
        assert (kernel_settings.KERNELS, kernel_settings.DROPOUT_RNG,
                kernel_settings.SAMPLING_RNG, kernel_settings.DENSE_GRAD) == (
            "tf", "philox", "philox", "matmul")
    assert (kernel_settings.KERNELS, kernel_settings.DROPOUT_RNG, kernel_settings.SAMPLING_RNG,
            kernel_settings.DENSE_GRAD) == (
        kernel_settings.DEFAULT_KERNELS, kernel_settings.DEFAULT_DROPOUT_RNG,
        kernel_settings.DEFAULT_SAMPLING_RNG, kernel_settings.DEFAULT_DENSE_GRAD)


def test_ops_kernels_are_not_tensorflow_kernels(monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(kernel_settings, "KERNELS", "ops")
        assert not kernel_settings.use_tensorflow_kernels()
    assert kernel_settings.KERNELS == kernel_settings.DEFAULT_KERNELS


@pytest.mark.parametrize("kernels, training, xla, tensorflow", [
    ("xla", True, True, True), ("xla", False, False, True), ("tf", True, False, True),
    ("ops", True, False, False), ("ops", False, False, False)])
def test_kernel_choice_on_tensorflow(kernels, training, xla, tensorflow):
    with kernel_settings.kernel_options(kernels):
        assert kernel_settings.use_xla(training) is xla
        assert kernel_settings.use_tensorflow_kernels() is tensorflow


def test_unknown_choice_changes_nothing():
    before = kernel_settings.KERNELS
    with pytest.raises(ValueError, match="kernels must be one of tf, xla, ops, got 'cuda'"):
        kernel_settings.configure(kernels="cuda", dropout_rng="philox")
    assert kernel_settings.KERNELS == before
    assert kernel_settings.DROPOUT_RNG == kernel_settings.DEFAULT_DROPOUT_RNG
