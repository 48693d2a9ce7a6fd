"""Reading hparams: `--hparams` text or file into a dict, unknown keys, value types.

What every strict config of electra-tf (`config.PretrainingConfig`, `finetuning.config`,
`probe_settings`) does with a user's hparams before it looks at their values: parse the JSON,
refuse a key it does not know (suggesting the closest valid one) and check each value against
the field's annotated type. `ConfigError` is the one error all of them raise.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import typing
from typing import Any, Mapping, Union

from electra_tf.errors import ElectraError

# TensorFlow's shapes and loop counters are int32: a batch of more elements, or more steps per
# call, overflows them (a traceback deep in TensorFlow), so such values are refused up front.
MAX_INT32 = 2**31 - 1
_MAX_FLOAT_INT = 2**1023  # ints past this do not convert to a float


class ConfigError(ElectraError, ValueError):
    """An hparam is unknown, has the wrong type or an invalid value."""


def parse_hparams(hparams: Union[None, str, Mapping[str, Any]]) -> dict:
    """Turns `--hparams` (JSON string, path to a .json file, or mapping) into a dict.

    Raises:
        ConfigError: the file is missing, the JSON is invalid, or it is not an object.
    """
    if hparams is None:
        return {}
    if isinstance(hparams, Mapping):
        return dict(hparams)
    text = hparams.strip()
    source = "--hparams"
    if text.endswith(".json") and not text.startswith("{"):
        if not os.path.isfile(text):
            raise ConfigError(f"hparams file not found: {text}")
        source = text
        try:
            with open(text, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise ConfigError(f"{source}: not a UTF-8 JSON file (byte offset {e.start})") from None
    try:
        parsed = json.loads(text) if text else {}
    except json.JSONDecodeError as e:
        raise ConfigError(f"{source}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from e
    except RecursionError:
        raise ConfigError(f"{source}: JSON nested too deeply (hparams are a flat object)") from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"{source}: expected a JSON object of hparams, got {type(parsed).__name__}")
    return parsed


def check_known_hparams(hparams: Mapping[str, Any], names) -> None:
    """Raises ConfigError for the first key not in `names`, suggesting the closest valid one."""
    for key in hparams:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"Unknown hparam {key!r}{hint}")


def coerce_hparam(key: str, value: Any, annotation: Any) -> Any:
    """Checks a value against a config field's annotated type (bool, int, float, str, Mapping,
    optionally Optional); ints are accepted for float fields, NaN and infinities are not.

    Raises:
        ConfigError: naming the hparam, the expected type and the value.
    """
    optional = typing.get_origin(annotation) is Union and type(None) in typing.get_args(annotation)
    if optional:
        if value is None:
            return None
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if annotation is bool:
        ok = isinstance(value, bool)
    elif annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and not (isinstance(value, int) or math.isfinite(value)) or (
                isinstance(value, int) and abs(value) > _MAX_FLOAT_INT):
            # JSON's NaN / Infinity (Python's json accepts them), or an int beyond float range
            raise ConfigError(f"hparam {key!r} must be a finite number, got {str(value)[:40]}")
        value = float(value) if ok else value
    elif annotation is str:
        ok = isinstance(value, str)
    else:  # Mapping
        ok = isinstance(value, Mapping)
    if not ok:
        name = getattr(annotation, "__name__", str(annotation))
        raise ConfigError(f"hparam {key!r} must be {name}{' or null' if optional else ''}, "
                          f"got {value!r} ({type(value).__name__})")
    return value

