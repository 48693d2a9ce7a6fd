"""The time from process start to the end of the first training step on JAX (issue 45), in
phases: importing JAX and Keras, importing electra_tf, building the model (constructor and
`build_from_sequence_length`), `compile()`, the first `fit()` step (XLA compiles the step), and a
second step for scale. The model is `gpu_step.py`'s (its sizes, batch, float32 or bf16), built as
the trainer builds it (`--build deferred`: `deferred_init`) or as it was built before issue 45
(`--build eager`: an eager forward pass, every initializer op by op), each in a fresh process.

    python benchmarks/first_step.py --size small --build eager,deferred --rounds 2

Each (size, build, round) is one child process with TensorFlow unimportable; the table is printed
and `--out` writes the JSON. JAX's persistent compilation cache is off in the children unless
`--cache DIR` is given (then a second round of the same build reads what the first compiled).
"""

import argparse
import json
import os
import subprocess
import sys
import time

_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
for name in ("tensorflow", "tensorflow_text"):
    sys.modules[name] = None
size, build, dtype, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
import jax, keras, numpy as np
t_jax = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[5])))
import gpu_step, pretrain_step
from keras import ops
from electra_tf.modeling import deferred_init
from electra_tf.training.portable import support as portable_support
from electra_tf.training.optimization import create_optimizer
from electra_tf.training.pretrainer import ElectraPretrainer
from electra_tf.vocab import SpecialTokens
t_electra = time.perf_counter()
if os.environ.get("ELECTRA_TF_JAX_COMPILATION_CACHE", "off") != "off":
    portable_support.use_compilation_cache("jax")
config = gpu_step.pretraining_config("small" if size == "tiny" else size, dtype, batch, False,
                                     tiny=size == "tiny")
keras.mixed_precision.set_global_policy(config.mixed_precision)
keras.utils.set_random_seed(0)
t1 = time.perf_counter()
if build == "eager":
    model = ElectraPretrainer.from_pretraining_config(config, SpecialTokens(**gpu_step.SPECIAL))
    dummy = ops.ones((1, 8), "int32")
    model({"input_ids": dummy * model._special.cls_id, "input_mask": dummy,
           "segment_ids": dummy * 0}, seed=ops.zeros((2,), "int32"), training=False)
else:
    with deferred_init.deferred_variables():
        model = ElectraPretrainer.from_pretraining_config(config,
                                                          SpecialTokens(**gpu_step.SPECIAL))
        model.build_from_sequence_length()
t2 = time.perf_counter()
model.compile(optimizer=create_optimizer(config).optimizer)
t3 = time.perf_counter()
pool = pretrain_step.numpy_batches(batch, 2, seed=1, **gpu_step.data_shape(config))
losses = []
for b in pool:
    history = model.fit({k: v.astype("int32") for k, v in b.items()}, batch_size=batch,
                        epochs=1, shuffle=False, verbose=0)
    losses.append(float(history.history["loss"][-1]))  # waits for the device
    if len(losses) == 1:
        t4 = time.perf_counter()
t5 = time.perf_counter()
print("RESULT " + json.dumps({
    "import_jax_keras": t_jax - t0, "import_electra_tf": t_electra - t_jax,
    "model_build": t2 - t1,
    "compile_call": t3 - t2, "first_step": t4 - t3, "second_step": t5 - t4,
    "start_to_first_step": t4 - t0, "losses": losses, "device": str(jax.devices()[0]),
    "jax": jax.__version__, "keras": keras.__version__}))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="small", help="tiny, small, base (comma-separated)")
    parser.add_argument("--build", default="eager,deferred")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cache", default=None, help="a JAX compilation cache directory")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, KERAS_BACKEND="jax",
               PYTHONPATH=os.path.dirname(here) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               ELECTRA_TF_JAX_COMPILATION_CACHE=args.cache or "off")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    rows = []
    for size in args.size.split(","):
        for r in range(args.rounds):
            for build in args.build.split(","):  # alternating: load changes hit both alike
                start = time.time()
                proc = subprocess.run([sys.executable, "-c", _CHILD, size, build, args.dtype,
                                       str(args.batch), os.path.join(here, "gpu_step.py")],
                                      env=env, capture_output=True, text=True)
                lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
                if proc.returncode or not lines:
                    print(proc.stderr[-3000:], file=sys.stderr)
                    return 1
                row = dict(json.loads(lines[-1][7:]), size=size, build=build, round=r,
                           loadavg=open("/proc/loadavg").read().split()[:3]
                           if os.path.exists("/proc/loadavg") else None,
                           wall=time.time() - start)
                rows.append(row)
                print(f"{size} {build} round {r}: " + ", ".join(
                    f"{k} {row[k]:.1f} s" for k in ("import_jax_keras", "import_electra_tf",
                                                    "model_build", "compile_call", "first_step",
                                                    "second_step", "start_to_first_step"))
                      + f"; loss {row['losses'][0]:.4f}; load {row['loadavg']}", flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"argv": sys.argv, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
