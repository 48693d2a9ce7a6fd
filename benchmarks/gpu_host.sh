# Sourced by the GPU scripts (gpu_session.sh, gpu_finetune.sh), in the repo root, with $PYTHON
# set: what every device call does before its work.

# Keras and keras-hub from .gpu_wheels (benchmarks/gpu_bundle.sh) onto PYTHONPATH, where the
# machine's Python lacks Keras (the lent GPU's image); nothing otherwise.
install_gpu_wheels() {
  if ! "$PYTHON" -c "import keras" 2>/dev/null && ls .gpu_wheels/*.whl >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/site .gpu_wheels/*.whl && export PYTHONPATH=/tmp/site
  fi
}

# The machine's record for info.txt: date, GPU, JAX / Keras / keras-hub versions and devices,
# the commit, the CPU's AVX-512 / AMX flags, the load.
machine_record() {
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  "$PYTHON" -c "import jax, keras, keras_hub; print('jax', jax.__version__, jax.devices()); \
print('keras', keras.__version__, 'keras_hub', keras_hub.__version__)" 2>&1
  git log -1 --format='commit %h' 2>/dev/null || true
  grep -o 'avx512[a-z_0-9]*\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  uptime
}
