#!/usr/bin/env bash
# Wheels for benchmarks/gpu_step.py on a GPU machine without network or TensorFlow.
#
# That machine (the device tool's nvidia-h100-x1 / nvidia-h200 image) has Python 3.12 with
# jax[cuda], torch, transformers, numpy, ml-dtypes, h5py, absl-py, rich, packaging, regex,
# tokenizers and sentencepiece, but not Keras. What electra-tf's JAX path imports on top of those,
# read off a run with TensorFlow blocked: keras and its namex and optree (binary: built for the
# target Python), and keras-hub (kagglehub is optional there; tensorflow-text is not imported on
# JAX). electra_tf itself runs from the repo tree. Nothing from TensorFlow is fetched.
#
# Here, in the repo root:   bash benchmarks/gpu_bundle.sh            # -> .gpu_wheels/ (ignored)
#   GPU_PYTHON=3.11 bash benchmarks/gpu_bundle.sh   # wheels for another Python (a local test)
#
# Then, on the GPU machine (the device tool: carry [".gpu_wheels"]; its python3 is itself a
# virtualenv, so a `venv --system-site-packages` made from it would lose torch and jax: the
# wheels go to a --target folder on PYTHONPATH instead), from the repo root:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu_wheels/*.whl && PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 benchmarks/gpu_step.py --out $OUT/gpu_step.json
set -euo pipefail
cd "$(dirname "$0")/.."

DEST=${GPU_WHEELS:-.gpu_wheels}  # another folder: e.g. for a local test
GPU_PYTHON=${GPU_PYTHON:-3.12}
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
LIMIT_MIB=64  # what the device tool carries in one call, working tree included

# keras and keras-hub as requirements.txt pins them; namex and optree as tested with them here.
pin() { grep -E "^$1==" requirements.txt | head -1; }
PACKAGES=("$(pin keras)" "$(pin keras-hub)" "namex==0.1.0" "optree==0.20.0")

rm -rf "$DEST"
mkdir -p "$DEST"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version "$GPU_PYTHON" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST" "${PACKAGES[@]}"

ls -l "$DEST"
BYTES=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
echo "bundle: $(ls "$DEST"/*.whl | wc -l) wheels, $((BYTES / 1024)) KiB (limit ${LIMIT_MIB} MiB) for Python $GPU_PYTHON"
if [ "$BYTES" -ge $((LIMIT_MIB * 1024 * 1024)) ]; then
    echo "bundle over ${LIMIT_MIB} MiB" >&2
    exit 1
fi
cat <<'EOF'
on the GPU machine (carry .gpu_wheels), from the repo root:
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu_wheels/*.whl && PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 benchmarks/gpu_step.py --out $OUT/gpu_step.json
EOF
