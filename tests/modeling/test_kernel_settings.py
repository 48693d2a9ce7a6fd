"""electra_tf.modeling.kernel_settings: the switches defined once, TensorFlow-free, and
re-exported by fused.py (reads, assignments and pytest's monkeypatch all reach the one copy)."""

import pytest

from electra_tf.modeling import fused, kernel_settings


def test_fused_reexports_the_settings():
    for name in ("configure", "kernel_options", "use_xla", "KERNEL_CHOICES",
                 "DROPOUT_RNG_CHOICES", "SAMPLING_RNG_CHOICES", "DENSE_GRAD_CHOICES",
                 "DEFAULT_KERNELS", "DEFAULT_DROPOUT_RNG", "DEFAULT_SAMPLING_RNG",
                 "DEFAULT_DENSE_GRAD"):
        assert getattr(fused, name) is getattr(kernel_settings, name), name
    with kernel_settings.kernel_options("tf", "philox", "philox", "matmul"):
        assert (fused.KERNELS, fused.DROPOUT_RNG, fused.SAMPLING_RNG, fused.DENSE_GRAD) == (
            "tf", "philox", "philox", "matmul")


def test_assigning_through_fused_sets_the_one_switch(monkeypatch):
    before = kernel_settings.KERNELS
    with monkeypatch.context() as m:
        m.setattr(fused, "KERNELS", "ops")
        m.setattr(fused, "SAMPLING_RNG", "philox")
        assert (kernel_settings.KERNELS, kernel_settings.SAMPLING_RNG) == ("ops", "philox")
        assert not kernel_settings.use_tensorflow_kernels()
    # monkeypatch restored the switch itself, not a copy left in fused's namespace
    assert kernel_settings.KERNELS == before and "KERNELS" not in vars(fused)
    assert kernel_settings.SAMPLING_RNG == kernel_settings.DEFAULT_SAMPLING_RNG


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
