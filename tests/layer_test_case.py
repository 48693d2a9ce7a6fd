"""Declarative tests of Keras layers, on every backend (after keras-hub's src/tests/test_case.py).

A test states a layer as data, `LayerCase(cls, init_kwargs, input_data, ...)`, and calls one
runner per property:

    CASE = LayerCase(DiscriminatorHead, {"hidden_size": 8},
                     {"sequence_output": np.ones((2, 5, 8), "float32")},
                     expected_output_shape=(2, 5))

    def test_layer(): run_layer_test(CASE)                    # build, eager and symbolic call
    def test_serialization(): run_serialization_test(CASE)    # get_config -> JSON -> from_config
    def test_saving(tmp_path): run_saving_test(CASE, tmp_path)  # .keras file, reloaded
    def test_other_backend(): run_backend_test("jax", [CASE])  # all three there + same outputs

`init_kwargs` must be JSON-clean (a backend child receives them as JSON, and every one must come
back unchanged from `get_config()`); `input_data` maps call-argument names to numpy arrays, or to
dicts of arrays (an encoder's inputs). This module imports neither TensorFlow nor pytest, so a JAX
or PyTorch child (tests/backends.py) runs the same runners.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

import keras
import numpy as np


@dataclasses.dataclass(frozen=True)
class LayerCase:
    """One layer under test.

    Attributes:
        cls: the Keras layer class.
        init_kwargs: constructor arguments (JSON-clean).
        input_data: call arguments by name: numpy arrays or dicts of arrays.
        expected_output_shape: shape of the output, or a dict of shapes for a dict output (a
            dict of such dicts for nested dicts).
        expected_output_dtype: dtype of every output, or a dict of dtypes (or of dtypes of a
            whole sub-dict) for a dict output; None means the layer's compute dtype.
        training: whether `call` takes `training` (then it is run with False and True).
        rtol, atol: tolerance of the cross-backend output comparison (`run_backend_test`).
    """
    cls: type
    init_kwargs: Dict[str, Any]
    input_data: Dict[str, Any]
    expected_output_shape: Any
    expected_output_dtype: Optional[str] = None
    training: bool = True
    rtol: float = 1e-5
    atol: float = 1e-6

    def build(self, **overrides) -> keras.layers.Layer:
        return self.cls(**{**self.init_kwargs, **overrides})

    def call(self, layer, training: bool = False, inputs: Optional[dict] = None):
        inputs = self.input_data if inputs is None else inputs
        if self.training:
            return layer(**inputs, training=training)
        return layer(**inputs)


def _numpy(structure):
    return keras.tree.map_structure(lambda t: np.asarray(keras.ops.convert_to_numpy(t)),
                                    structure)


def _seed_states(layer) -> list:
    """The layer's seed-generator states (integer non-trainable variables), in creation order."""
    return [v for v in layer.non_trainable_variables
            if "int" in keras.backend.standardize_dtype(v.dtype)]


def _flat(structure, path: str = "") -> Dict[str, Any]:
    """`structure`'s leaves by path ("/a/b"), the keys of its dicts sorted at every level: one
    order on every backend (`keras.tree` on PyTorch keeps a nested dict's insertion order)."""
    if isinstance(structure, Mapping):
        return {leaf_path: leaf for key in sorted(structure)
                for leaf_path, leaf in _flat(structure[key], f"{path}/{key}").items()}
    return {path: structure}


def _leaves(expected, like) -> list:
    """`expected`'s values in `_flat`'s order of an output shaped like `like`; a non-dict
    `expected` holds for the whole (sub)structure."""
    if isinstance(like, dict):
        return [leaf for key in sorted(like)
                for leaf in _leaves(expected[key] if isinstance(expected, dict) else expected,
                                    like[key])]
    return [expected]


def _shapes(expected_output_shape) -> List[tuple]:
    """The expected shapes in `_flat`'s order of the outputs."""
    return [tuple(shape) for shape in _flat(expected_output_shape).values()]


def _dtypes(expected_output_dtype, expected_output_shape) -> List[str]:
    """The expected dtypes in the order of `_shapes`."""
    return _leaves(expected_output_dtype, expected_output_shape)


def _assert_same(actual, expected, rtol=0.0, atol=0.0, what="output"):
    actual, expected = _flat(actual), _flat(expected)
    assert list(actual) == list(expected), (what, list(actual), list(expected))
    for path, value in actual.items():
        np.testing.assert_allclose(np.asarray(value, np.float64),
                                   np.asarray(expected[path], np.float64), rtol=rtol, atol=atol,
                                   err_msg=f"{what} {path}")


# --- In one process -----------------------------------------------------------------------------
def run_layer_test(case: LayerCase):
    """Builds the layer, checks the constructor arguments in its config, and the output's shape
    and dtype from an eager call (training False and True) and a symbolic call.

    Returns:
        The eager output of the training=False call, as numpy.
    """
    layer = case.build()
    config = layer.get_config()
    for name, value in case.init_kwargs.items():
        assert config.get(name) == value, (
            f"{case.cls.__name__}.get_config()[{name!r}] = {config.get(name)!r}, "
            f"constructed with {value!r}")
    paths = list(_flat(case.expected_output_shape))
    shapes = _shapes(case.expected_output_shape)
    dtypes = _dtypes(case.expected_output_dtype or layer.compute_dtype, case.expected_output_shape)
    calls = (False, True) if case.training else (False,)
    for training in calls:
        output = case.call(layer, training)
        flat = _flat(output)
        assert list(flat) == paths, (list(flat), paths, training)
        for tensor, shape, dtype in zip(flat.values(), shapes, dtypes):
            assert tuple(tensor.shape) == shape, (tuple(tensor.shape), shape, training)
            assert keras.backend.standardize_dtype(tensor.dtype) == dtype, (tensor.dtype, dtype)
        if not training:
            result = _numpy(output)
    symbolic = keras.tree.map_structure(lambda a: keras.KerasTensor(a.shape, str(a.dtype)),
                                        case.input_data)
    spec = _flat(case.call(layer, False, symbolic))
    assert list(spec) == paths, ("symbolic", list(spec), paths)
    for tensor, shape in zip(spec.values(), shapes):
        assert tuple(tensor.shape) == shape, ("symbolic", tuple(tensor.shape), shape)
    return result


def run_serialization_test(case: LayerCase):
    """get_config() survives JSON, from_config() rebuilds a layer with the same config (and
    keras' serialize / deserialize the same class), the same variables (by path) once called,
    which computes the same function.

    Returns:
        The layer rebuilt by from_config (given the original's weights), for checks of its
        attributes beyond the config.
    """
    layer = case.build()
    expected = case.call(layer)
    config = layer.get_config()
    assert json.loads(json.dumps(config)) == config, "get_config() is not JSON-clean"
    revived = case.cls.from_config(json.loads(json.dumps(config)))
    assert revived.get_config() == config
    deserialized = keras.saving.deserialize_keras_object(
        json.loads(json.dumps(keras.saving.serialize_keras_object(layer))))
    assert type(deserialized) is case.cls and deserialized.get_config() == config
    case.call(revived)  # builds every variable
    assert [v.path for v in revived.weights] == [v.path for v in layer.weights]
    revived.set_weights(layer.get_weights())
    _assert_same(_numpy(case.call(revived)), _numpy(expected), what="from_config")
    return revived


def _own_paths(layer) -> List[str]:
    """The paths of the layer's variables, less a leading `<layer name>/`: a model's sub-layers
    built by its first call are under its name scope, a loaded model's are built from its build
    config outside it (the same variables, one prefix less)."""
    prefix = layer.name + "/"
    return [v.path[len(prefix):] if v.path.startswith(prefix) else v.path for v in layer.weights]


def run_saving_test(case: LayerCase, directory):
    """The built layer saved as a .keras file and loaded back: same class, config, variable paths
    (`_own_paths`), weights and output."""
    layer = case.build()
    expected = _numpy(case.call(layer))
    path = os.path.join(str(directory), f"{case.cls.__name__}.keras")
    keras.saving.save_model(layer, path)
    restored = keras.saving.load_model(path)
    assert type(restored) is case.cls and restored.get_config() == layer.get_config()
    assert _own_paths(restored) == _own_paths(layer)
    for a, b in zip(restored.get_weights(), layer.get_weights()):
        np.testing.assert_array_equal(a, b)
    _assert_same(_numpy(case.call(restored)), expected, what=".keras reload")


def reference_outputs(case: LayerCase, seed: int = 0) -> Dict[str, Any]:
    """Builds `case` here with `keras.utils.set_random_seed(seed)`, and returns what
    `run_backend_test` hands another backend: weights, seed states and the outputs of a
    training=False and (if the layer takes it) a training=True call from those states."""
    keras.utils.set_random_seed(seed)
    layer = case.build()
    outputs = {"eval": _numpy(case.call(layer))}
    states = [keras.ops.convert_to_numpy(v) for v in _seed_states(layer)]
    if case.training:
        outputs["train"] = _numpy(case.call(layer, True))
    return {"weights": layer.get_weights(), "states": states, "outputs": outputs}


def check_on_this_backend(case: LayerCase, reference: Dict[str, Any], directory) -> None:
    """Runs every runner on this process's backend, then checks that the layer given the
    reference's weights and seed states computes the reference's outputs."""
    run_layer_test(case)
    run_serialization_test(case)
    run_saving_test(case, directory)
    layer = case.build()
    case.call(layer)
    layer.set_weights(reference["weights"])
    states = _seed_states(layer)
    assert len(states) == len(reference["states"])
    for variable, value in zip(states, reference["states"]):
        variable.assign(np.asarray(value).astype(keras.backend.standardize_dtype(variable.dtype)))
    backend = keras.backend.backend()
    _assert_same(_numpy(case.call(layer)), reference["outputs"]["eval"], case.rtol, case.atol,
                 f"{case.cls.__name__} training=False on {backend}")
    if case.training:
        _assert_same(_numpy(case.call(layer, True)), reference["outputs"]["train"], case.rtol,
                     case.atol, f"{case.cls.__name__} training=True on {backend}")


# --- On another backend -------------------------------------------------------------------------
def _flatten(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}/{key}", item, out)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _flatten(f"{prefix}/{i}", item, out)
    else:
        out[prefix] = np.asarray(value)


def _unflatten(arrays: Dict[str, np.ndarray], prefix: str, like):
    if isinstance(like, dict):
        return {key: _unflatten(arrays, f"{prefix}/{key}", item) for key, item in like.items()}
    if isinstance(like, (list, tuple)):
        return [_unflatten(arrays, f"{prefix}/{i}", item) for i, item in enumerate(like)]
    return arrays[prefix]


_CHILD = """
import json, tempfile
from tests import layer_test_case as ltc
spec = json.loads(str(inp["spec"]))
with tempfile.TemporaryDirectory() as directory:
    for i, entry in enumerate(spec):
        case = ltc.case_from_spec(entry, inp, f"case{i}")
        reference = ltc.reference_from_arrays(entry, inp, f"case{i}")
        ltc.check_on_this_backend(case, reference, directory)
out["checked"] = np.array(len(spec))
"""


def _spec(case: LayerCase, reference: Dict[str, Any], key: str, arrays: dict) -> dict:
    """`case` and its reference as JSON plus arrays (under `key/...` in `arrays`)."""
    _flatten(f"{key}/input", case.input_data, arrays)
    _flatten(f"{key}/weights", reference["weights"], arrays)
    _flatten(f"{key}/states", reference["states"], arrays)
    _flatten(f"{key}/outputs", reference["outputs"], arrays)
    fields = {f.name: getattr(case, f.name) for f in dataclasses.fields(case)
              if f.name not in ("cls", "input_data")}
    return {"cls": f"{case.cls.__module__}:{case.cls.__qualname__}", "fields": fields,
            "input_like": keras.tree.map_structure(lambda _: 0, case.input_data),
            "n_weights": len(reference["weights"]), "n_states": len(reference["states"]),
            "outputs_like": keras.tree.map_structure(lambda _: 0, reference["outputs"])}


def _shape_tuples(shape):
    """`shape` with the lists JSON made of its shape tuples turned back into tuples."""
    if isinstance(shape, dict):
        return {key: _shape_tuples(value) for key, value in shape.items()}
    return tuple(shape)


def case_from_spec(entry: dict, arrays: dict, key: str) -> LayerCase:
    module, name = entry["cls"].split(":")
    cls = getattr(importlib.import_module(module), name)
    fields = dict(entry["fields"])
    fields["expected_output_shape"] = _shape_tuples(fields["expected_output_shape"])
    return LayerCase(cls=cls, input_data=_unflatten(arrays, f"{key}/input", entry["input_like"]),
                     **fields)


def reference_from_arrays(entry: dict, arrays: dict, key: str) -> Dict[str, Any]:
    return {"weights": [arrays[f"{key}/weights/{i}"] for i in range(entry["n_weights"])],
            "states": [arrays[f"{key}/states/{i}"] for i in range(entry["n_states"])],
            "outputs": _unflatten(arrays, f"{key}/outputs", entry["outputs_like"])}


def run_backend_test(backend: str, cases: Sequence[LayerCase], seed: int = 0) -> None:
    """Every runner of every case on `backend` (one child process, TensorFlow unimportable), and
    each layer, given the weights and seed states built here, computes this process's outputs
    (training False and True) within the case's rtol / atol."""
    from tests import backends  # test-process only (it imports the TensorFlow fixtures)

    backends.require(backend)
    arrays: dict = {}
    spec: List[dict] = []
    for i, case in enumerate(cases):
        spec.append(_spec(case, reference_outputs(case, seed), f"case{i}", arrays))
    arrays["spec"] = np.array(json.dumps(spec))
    result = backends.run_on_backend(backend, _CHILD, arrays)
    assert int(result["checked"]) == len(cases)

