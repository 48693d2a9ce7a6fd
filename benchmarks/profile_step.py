"""Profile: where one ELECTRA pretraining step on JAX spends its time (issue 45's breakdown).

Captures a `jax.profiler` trace of a few `fit()` steps of the model `benchmarks/gpu_step.py`
times (the same sizes, batches and `--tiny` model), with the compiled step's optimized HLO dumped
beside it (XLA_FLAGS --xla_dump_to), and turns the trace into a table of categories:

    matmul            dense / dot kernels (cuBLAS gemms on a GPU) outside attention
    vocab_matmul      the generator's [B*N, E] x [E, V] projection onto the vocabulary and its
                      gradients (generator_predictions' dot_general with the tied table)
    attention         the attention core (scores, mask, softmax, dropout, context: the
                      `attention` name scope of transformer_layer.py's keras.ops block; cuDNN
                      fused attention custom calls)
    layernorm_gelu    fusions holding an erf (GELU) or an rsqrt (LayerNorm)
    dropout_rng       fusions hashing dropout bits (xor / shifts) inside the encoders
    embedding_grad    scatter-adds into the embedding tables (the lookups' gradients)
    gumbel_sampling   the `fake_data` layer: the hashed Gumbel noise over [B, N, V], the argmax,
                      the scatter of the samples
    masking           the `masking` layer (dynamic masking)
    optimizer         the `adamw` name scope (AdamW's update of every variable)
    layout            copies, transposes, broadcasts left unfused
    other             everything else (losses, metrics, the clip norm, ...)
    host_gap          wall time of the traced steps with no XLA op running (the host's work
                      between and around the compiled calls: Keras' loop, dispatch, transfers)

An event is an XLA op of the trace (args `hlo_op`, `hlo_module`: on a GPU the kernels of the
device streams, on a CPU the thunks on the host's XLA threads); its category is read off the
dumped HLO: the op's opcode, the opcodes of the computation it calls (a fusion's body), their
custom-call targets and their `op_name` metadata (the JAX name stack: Keras layer names,
jvp/transpose for forward/backward, `adamw`). Rules are tried in the order above (`CATEGORIES`),
the first that matches wins. Per category: time per step (op time summed: on a CPU, ops on
several threads overlap, so the op times can add up to more than the wall time), its share of
all op time, and the number of ops.

    python benchmarks/profile_step.py --tiny --out-dir /tmp/prof          # CPU smoke (~1 min)
    python benchmarks/profile_step.py --size small --dtype bfloat16 --batch 128 \
        --out-dir $OUT/profile_small                                      # on the GPU
    python benchmarks/profile_step.py --parse-only /tmp/prof              # re-read a capture

Writes OUT_DIR/trace/ (the profiler's files, perfetto_trace.json.gz among them), OUT_DIR/hlo/
(the train step's optimized HLO text only), OUT_DIR/breakdown.json, and prints the table.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import re
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

# Ordered: the first category whose rule matches an op wins (see the module docstring).
CATEGORIES = ("attention", "gumbel_sampling", "vocab_matmul", "matmul", "embedding_grad",
              "optimizer", "masking", "layernorm_gelu", "dropout_rng", "layout", "other")
HOST_GAP = "host_gap"
_MATMUL_OPCODES = {"dot", "convolution"}
_MATMUL_TARGETS = ("gemm", "matmul", "cublas")
_ATTENTION_TARGETS = ("fmha", "flash", "attention")
_LAYOUT_OPCODES = {"copy", "transpose", "broadcast", "bitcast", "reshape", "slice",
                   "concatenate", "pad", "copy-start", "copy-done", "dynamic-slice",
                   "dynamic-update-slice", "parameter", "tuple", "get-tuple-element", "iota"}
# Name-stack pieces: the attention core's scope, the MLM head's projection onto the table.
_ATTENTION_SCOPE = re.compile(r"/attention(/|$)")
_VOCAB_MATMUL = re.compile(r"generator_predictions\)*/dot_general")


# ------------------------------------------------------------------------------------------------
# Reading the optimized HLO
# ------------------------------------------------------------------------------------------------
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (.*)$")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")


def _opcode(rest: str) -> str:
    """The opcode of an instruction's right-hand side: `f32[2]{0} add(a, b), ...` -> add (the
    shape may be a tuple in parentheses)."""
    rest = rest.lstrip()
    if rest.startswith("("):
        depth = 0
        for i, c in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(c, 0)
            if depth == 0:
                rest = rest[i + 1:]
                break
    else:
        rest = rest.split(" ", 1)[1] if " " in rest else ""
    return rest.lstrip().split("(", 1)[0].strip()


def parse_hlo(text: str) -> dict:
    """{instruction name: {"opcode", "op_name", "target", "calls": [computation names],
    "computation"}} of every computation of an HLO module's text, plus "__computations__":
    {computation name: [instruction names]}."""
    ops, computations, current = {}, {}, None
    for line in text.splitlines():
        match = _INSTRUCTION.match(line)
        if match and current is not None:
            name, rest = match.groups()
            meta = re.search(r'op_name="([^"]*)"', rest)
            target = re.search(r'custom_call_target="([^"]*)"', rest)
            calls = re.findall(r"(?:calls|body|condition|to_apply|branch_computations)="
                               r"\{?%?([\w.\-]+(?:,\s*%?[\w.\-]+)*)\}?", rest)
            ops[name] = {"opcode": _opcode(rest), "op_name": meta.group(1) if meta else "",
                         "target": target.group(1) if target else "",
                         "calls": [c.strip().lstrip("%") for group in calls
                                   for c in group.split(",")],
                         "computation": current}
            computations.setdefault(current, []).append(name)
            continue
        header = None if match else _COMPUTATION.match(line)
        if header:
            current = header.group(1)
            computations.setdefault(current, [])
    ops["__computations__"] = computations
    return ops


def _closure(ops: dict, name: str, seen=None) -> list:
    """The instruction `name` and every instruction of the computations it calls, transitively
    (a fusion's body, a while loop's body and condition: not the loop's own ops, which the trace
    shows one by one)."""
    seen = set() if seen is None else seen
    out = [ops[name]]
    if ops[name]["opcode"] == "while":
        return out  # its body's ops are events of their own
    for computation in ops[name]["calls"]:
        if computation in seen:
            continue
        seen.add(computation)
        for inner in ops["__computations__"].get(computation, []):
            out.extend(_closure(ops, inner, seen))
    return out


def categorize(ops: dict, name: str) -> str:
    """The category (`CATEGORIES`) of the HLO instruction `name` of a parsed module."""
    if name not in ops:
        return "other"
    parts = _closure(ops, name)
    opcodes = {p["opcode"] for p in parts}
    names = [p["op_name"] for p in parts if p["op_name"]]
    targets = " ".join(p["target"].lower() for p in parts)
    has_matmul = bool(opcodes & _MATMUL_OPCODES) or any(t in targets for t in _MATMUL_TARGETS)
    if any(_ATTENTION_SCOPE.search(n) for n in names) or any(
            t in targets for t in _ATTENTION_TARGETS):
        return "attention"
    if any("fake_data" in n for n in names):
        return "gumbel_sampling"
    if has_matmul:
        return "vocab_matmul" if any(_VOCAB_MATMUL.search(n) for n in names) else "matmul"
    if "scatter" in opcodes and (any("embeddings" in n for n in names)
                                 or not any("take_along_axis" in n for n in names)):
        return "embedding_grad"
    if any("/adamw/" in n or "/optimizer/" in n for n in names):
        return "optimizer"
    if any("/masking" in n or "(masking)" in n for n in names):
        return "masking"
    if opcodes & {"erf", "rsqrt"} or any("LayerNorm" in n for n in names):
        return "layernorm_gelu"
    if opcodes & {"xor", "shift-right-logical", "shift-right-arithmetic"} and any(
            "layer_" in n or "embeddings" in n for n in names):
        return "dropout_rng"
    if opcodes <= _LAYOUT_OPCODES | {"fusion"}:
        return "layout"
    return "other"


def load_hlo(hlo_dir: str) -> dict:
    """{module name (as the trace's `hlo_module` says it): parsed HLO} of the dumped
    `*after_optimizations.txt` files (several compiles of one name: their ops merged, the
    first file's op winning a clash)."""
    modules = {}
    for path in sorted(glob.glob(os.path.join(hlo_dir, "*after_optimizations.txt"))):
        base = os.path.basename(path)
        module = re.sub(r"^module_\d+\.", "", base).split(".", 1)[0]
        with open(path, encoding="utf-8") as f:
            parsed = parse_hlo(f.read())
        merged = modules.setdefault(module, {"__computations__": {}})
        for key, value in parsed.items():
            if key == "__computations__":
                for comp, names in value.items():
                    merged["__computations__"].setdefault(comp, names)
            else:
                merged.setdefault(key, value)
    return modules


# ------------------------------------------------------------------------------------------------
# Reading the trace
# ------------------------------------------------------------------------------------------------
def load_events(trace_dir: str) -> list:
    """The XLA op events (complete events with an `hlo_op` arg) of the newest
    perfetto_trace.json.gz under `trace_dir`: [(module, op, start us, duration us, pid)]."""
    files = sorted(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"),
                             recursive=True), key=os.path.getmtime)
    if not files:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {trace_dir}")
    with gzip.open(files[-1], "rt", encoding="utf-8") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    out = []
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") == "X" and "hlo_op" in args and not e["name"].startswith("end: "):
            out.append((args.get("hlo_module", ""), args["hlo_op"], float(e["ts"]),
                        float(e.get("dur", 0.0)), e.get("pid")))
    return out


def _union_length(intervals) -> float:
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def op_name(ops, name: str) -> str:
    """The `op_name` metadata of an instruction, or of the first instruction inside it that has
    one (a fusion wrapper's own metadata can be empty)."""
    if not ops or name not in ops:
        return ""
    return next((p["op_name"] for p in _closure(ops, name) if p["op_name"]), "")


def _scope(op_name: str) -> str:
    """An op's place in the model for the JSON's `scopes`: forward/backward and the first two
    name-stack levels (`backward electra/layer_N`, `forward fake_data`, `adamw`)."""
    if not op_name:
        return "(no metadata)"
    parts = op_name.split(";")[0].split("/")[1:]  # drop the jit(...) root
    direction = ("backward " if parts and parts[0].startswith("transpose(") else
                 "forward " if parts and parts[0].startswith("jvp(") else "")
    parts = [re.sub(r"^(transpose\()?jvp\((.*?)\)*$", r"\2", p) for p in parts[:2]]
    return direction + re.sub(r"layer_\d+", "layer_N", "/".join(p for p in parts if p))


def breakdown(out_dir: str, steps: int, train_module_pattern: str = "train") -> dict:
    """The per-category times of a capture in `out_dir` (trace/ and hlo/ as `capture` writes).

    Args:
        out_dir: the capture's folder.
        steps: training steps in the traced window (the times are divided by it).
        train_module_pattern: a regex; ops of modules not matching it (small helper jits: metric
            reads, casts) are one category each, "module:<name>".

    Returns:
        {"steps", "window_ms_per_step", "op_ms_per_step", "busy_ms_per_step",
         "host_gap_ms_per_step", "categories": {name: {"ms_per_step", "share_of_op_time",
         "ops"}}, "top_ops": [...], "unknown_ops"}.
    """
    modules = load_hlo(os.path.join(out_dir, "hlo"))
    events = load_events(os.path.join(out_dir, "trace"))
    if not events:
        raise ValueError(f"{out_dir}: the trace has no XLA op events")
    per_category, per_op, per_scope, unknown = {}, {}, {}, set()
    for module, op, _, duration, _ in events:
        if re.search(train_module_pattern, module):
            parsed = modules.get(module)
            if parsed is None or op not in parsed:
                unknown.add(f"{module}:{op}")
            category = categorize(parsed, op) if parsed else "other"
        else:
            category = f"module:{module}"
        entry = per_category.setdefault(category, {"us": 0.0, "ops": 0})
        entry["us"] += duration
        entry["ops"] += 1
        key = (category, module, op)
        per_op[key] = per_op.get(key, 0.0) + duration
        scope = _scope(op_name(modules.get(module), op))
        per_scope[scope] = per_scope.get(scope, 0.0) + duration
    window = max(s + d for _, _, s, d, _ in events) - min(s for _, _, s, _, _ in events)
    busy = _union_length([(s, s + d) for _, _, s, d, _ in events])
    op_total = sum(v["us"] for v in per_category.values())
    ms = lambda us: us / 1e3 / steps  # noqa: E731
    categories = {name: {"ms_per_step": ms(v["us"]), "share_of_op_time": v["us"] / op_total,
                         "ops": v["ops"] // steps}
                  for name, v in sorted(per_category.items(), key=lambda kv: -kv[1]["us"])}
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:25]
    return {"steps": steps, "window_ms_per_step": ms(window), "op_ms_per_step": ms(op_total),
            "busy_ms_per_step": ms(busy), "host_gap_ms_per_step": ms(window - busy),
            "categories": categories,
            "top_ops": [{"category": c, "module": m, "op": o, "ms_per_step": ms(us),
                         "opcode": (modules.get(m, {}).get(o) or {}).get("opcode"),
                         "op_name": op_name(modules.get(m), o)}
                        for (c, m, o), us in top],
            "scopes": {k: ms(v) for k, v in sorted(per_scope.items(), key=lambda kv: -kv[1])[:30]},
            # Which kernels the compiled step calls by name (cuBLAS gemms, cuDNN fused
            # attention "__cudnn$fmha...": whether fused_attention got cuDNN's kernel).
            "custom_call_targets": sorted({op["target"] for parsed in modules.values()
                                           for key, op in parsed.items()
                                           if key != "__computations__" and op["target"]}),
            "unknown_ops": sorted(unknown)[:50], "unknown_op_count": len(unknown)}


def markdown(result: dict) -> str:
    """The breakdown as a markdown table (host_gap as a row of its own, against the window)."""
    lines = ["| category | ms/step | share of op time | ops/step |", "|---|---:|---:|---:|"]
    for name, v in result["categories"].items():
        lines.append(f"| {name} | {v['ms_per_step']:.3f} | {100 * v['share_of_op_time']:.1f}% "
                     f"| {v['ops']} |")
    window = result["window_ms_per_step"]
    lines.append(f"| {HOST_GAP} (no op running) | {result['host_gap_ms_per_step']:.3f} | "
                 f"{100 * result['host_gap_ms_per_step'] / window:.1f}% of the window | |")
    lines.append(f"| (window: first op to last) | {window:.3f} | | |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# Capturing (in a child: XLA_FLAGS must be set before JAX starts)
# ------------------------------------------------------------------------------------------------
def capture(args) -> dict:
    """Builds the model as gpu_step.py's electra_tf_jax row does, compiles and runs one warm-up
    window, then traces `args.steps` steps (one fit() call)."""
    import jax
    import keras
    import numpy as np

    from benchmarks import gpu_step, pretrain_step
    from electra_tf.modeling import deferred_init
    from electra_tf.training.optimization import create_optimizer
    from electra_tf.training.pretrainer import ElectraPretrainer
    from electra_tf.vocab import SpecialTokens

    options, overrides = gpu_step.parse_variant(args.model_variant)
    config = gpu_step.pretraining_config(args.size, args.dtype, args.batch, False, args.tiny,
                                         overrides)
    keras.mixed_precision.set_global_policy(config.mixed_precision)
    keras.utils.set_random_seed(0)
    start = time.perf_counter()
    with deferred_init.deferred_variables():  # as the trainer builds it
        model = ElectraPretrainer.from_pretraining_config(
            config, SpecialTokens(**pretrain_step.SPECIAL), **options)
        model.build_from_sequence_length()
    model.compile(optimizer=create_optimizer(config).optimizer,
                  steps_per_execution=args.steps_per_execution)
    build = time.perf_counter() - start
    pool = pretrain_step.numpy_batches(args.batch, min(args.steps, 8), seed=1,
                                       **gpu_step.data_shape(config))
    rows = [pool[i % len(pool)] for i in range(args.steps)]
    data = {k: np.concatenate([b[k] for b in rows]).astype("int32") for k in pool[0]}

    def window():
        history = model.fit(data, batch_size=args.batch, epochs=1, shuffle=False, verbose=0)
        return float(history.history["loss"][-1])  # a host float: waits for the device

    start = time.perf_counter()
    window()  # compile + a warm window
    first = time.perf_counter() - start
    start = time.perf_counter()
    window()
    untraced = time.perf_counter() - start
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # Python frames would swamp the trace
    start = time.perf_counter()
    with jax.profiler.trace(os.path.join(args.out_dir, "trace"), create_perfetto_trace=True,
                            profiler_options=options):
        loss = window()
    traced = time.perf_counter() - start
    return {"build_seconds": build, "first_window_seconds": first,
            "untraced_window_ms_per_step": 1e3 * untraced / args.steps,
            "traced_window_ms_per_step": 1e3 * traced / args.steps, "loss": loss,
            "device": str(jax.devices()[0].device_kind), "platform": jax.devices()[0].platform,
            "versions": {"jax": jax.__version__, "keras": keras.__version__}}


def _prune_dump(dump_dir: str, hlo_dir: str, pattern: str) -> None:
    """Keeps the optimized HLO text of the modules matching `pattern` (into hlo/) and deletes
    the rest of XLA's dump (object files, LLVM IR, other passes: tens of MB)."""
    os.makedirs(hlo_dir, exist_ok=True)
    for path in glob.glob(os.path.join(dump_dir, "*")):
        base = os.path.basename(path)
        if base.endswith("after_optimizations.txt") and re.search(pattern, base):
            os.replace(path, os.path.join(hlo_dir, base))
    subprocess.run(["rm", "-rf", dump_dir], check=False)


def run(args) -> dict:
    """Captures in a child process, then parses; writes breakdown.json and returns it."""
    os.makedirs(args.out_dir, exist_ok=True)
    dump_dir = os.path.join(args.out_dir, "xla_dump")
    env = dict(os.environ, KERAS_BACKEND="jax", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               TF_CPP_MIN_LOG_LEVEL="2")
    env["XLA_FLAGS"] = " ".join(filter(None, [
        env.get("XLA_FLAGS", ""), f"--xla_dump_to={dump_dir}", "--xla_dump_hlo_as_text",
        f"--xla_dump_hlo_module_re={args.module_pattern}"]))
    if args.device == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
    result_file = os.path.join(args.out_dir, "capture.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--result-file", result_file]
    cmd += _forwarded(args)
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"capture failed (exit {proc.returncode}):\n"
                           + "\n".join(proc.stdout.strip().splitlines()[-20:]))
    _prune_dump(dump_dir, os.path.join(args.out_dir, "hlo"), args.module_pattern)
    with open(result_file, encoding="utf-8") as f:
        captured = json.load(f)
    result = breakdown(args.out_dir, args.steps, args.module_pattern)
    result.update(capture=captured, command=" ".join(
        [os.path.relpath(sys.argv[0], REPO_ROOT)] + sys.argv[1:]),
        settings={k: getattr(args, k) for k in (
            "size", "dtype", "batch", "steps", "steps_per_execution", "tiny", "device",
            "model_variant")})
    with open(os.path.join(args.out_dir, "breakdown.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    return result


def _forwarded(args) -> list:
    out = ["--size", args.size, "--dtype", args.dtype, "--batch", str(args.batch),
           "--steps", str(args.steps), "--steps-per-execution", str(args.steps_per_execution),
           "--out-dir", args.out_dir, "--device", args.device,
           "--model-variant", args.model_variant]
    return out + ["--tiny"] * args.tiny


def build_parser() -> argparse.ArgumentParser:
    from benchmarks.cli_types import positive_int

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=("small", "base"), default="small")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--batch", type=positive_int, default=128, help="Default: 128")
    parser.add_argument("--steps", type=positive_int, default=5,
                        help="steps traced (one fit() call). Default: 5")
    parser.add_argument("--steps-per-execution", type=positive_int, default=1,
                        help="steps per compiled call; must divide --steps. Default: 1")
    parser.add_argument("--tiny", action="store_true",
                        help="gpu_step.py's --tiny model (vocab 1,024, sequence 32), batch as "
                             "given: the host's per-step work shows")
    parser.add_argument("--model-variant", default="default",
                        help="the model's speed options as gpu_step.py --model-variants spells "
                             "one: '+'-joined default, pad128, noattndrop, fused (fused sets "
                             "the attention dropout to 0). Default: default")
    parser.add_argument("--device", choices=("auto", "cpu"), default="auto")
    parser.add_argument("--module-pattern", default="train",
                        help="regex of the compiled modules to dump and categorize. "
                             "Default: train")
    parser.add_argument("--timeout", type=float, default=540.0,
                        help="seconds before the capture is abandoned. Default: 540")
    parser.add_argument("--out-dir", help="the capture's folder")
    parser.add_argument("--parse-only", metavar="DIR",
                        help="re-read an earlier capture's folder (its capture.json's settings)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        for name in ("tensorflow", "tensorflow_text"):  # as on the GPU machine
            sys.modules[name] = None
        result = capture(args)
        with open(args.result_file, "w", encoding="utf-8") as f:
            json.dump(result, f)
        return 0
    if args.parse_only:
        with open(os.path.join(args.parse_only, "breakdown.json"), encoding="utf-8") as f:
            steps = json.load(f)["steps"]
        result = breakdown(args.parse_only, steps, args.module_pattern)
    else:
        if not args.out_dir:
            raise SystemExit("give --out-dir (or --parse-only DIR)")
        if args.steps % args.steps_per_execution:
            raise SystemExit("--steps-per-execution must divide --steps")
        result = run(args)
    print(markdown(result))
    print(f"per step: window {result['window_ms_per_step']:.3f} ms, ops busy "
          f"{result['busy_ms_per_step']:.3f} ms, op time {result['op_ms_per_step']:.3f} ms; "
          f"{result['unknown_op_count']} op names not found in the HLO")
    return 0


if __name__ == "__main__":
    sys.exit(main())
