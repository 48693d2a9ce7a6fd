"""Dependencies point one way (docs/design.md): read from the package's own imports, by `ast`.

pretraining/ and modeling/ never import training/ (the model knows nothing of the loop); data/
never imports sources/ or training/ (the data path is below both); nothing outside commands/
imports commands/ (the tools sit on top). Imports inside functions count as well: a lazy import
across the layers is still an arrow pointing up.
"""

import ast
import os
from typing import Iterator, List, Tuple

import electra_tf

PACKAGE_DIR = os.path.dirname(electra_tf.__file__)

# (package a module is in, package it must not import): "" is the top level of electra_tf.
FORBIDDEN = (
    ("pretraining", "training"),
    ("modeling", "training"),
    ("data", "sources"),
    ("data", "training"),
    *((room, "commands") for room in ("", "convert", "data", "finetuning", "modeling",
                                      "pretraining", "sources", "training")),
)


def _modules() -> Iterator[Tuple[str, str]]:
    """(path relative to the package, its package: "" at the top level) of every module."""
    for directory, _, files in os.walk(PACKAGE_DIR):
        for name in sorted(files):
            if name.endswith(".py"):
                relative = os.path.relpath(os.path.join(directory, name), PACKAGE_DIR)
                parts = relative.split(os.sep)
                yield relative.replace(os.sep, "/"), parts[0] if len(parts) > 1 else ""


def _is_module(name: str) -> bool:
    """Whether the dotted `name` (electra_tf.x.y) is a module or package of electra_tf."""
    path = os.path.join(PACKAGE_DIR, *name.split(".")[1:])
    return os.path.isdir(path) or os.path.isfile(path + ".py")


def _imported(path: str) -> Iterator[str]:
    """Every electra_tf module `path` imports: `from electra_tf.x import y` is electra_tf.x.y
    when y is a module, else electra_tf.x."""
    with open(os.path.join(PACKAGE_DIR, path), encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" if _is_module(f"{node.module}.{alias.name}")
                     else node.module for alias in node.names]
        else:
            continue  # (the package uses no relative imports: test_no_relative_imports)
        yield from (name for name in names if name.startswith("electra_tf."))


def _edges() -> List[Tuple[str, str, str, str]]:
    """(module path, its package, imported module, that module's package)."""
    return [(path, room, name, name.split(".")[1])
            for path, room in _modules() for name in _imported(path)]


def test_no_import_points_from_a_lower_package_to_a_higher_one():
    wrong = sorted({(path, name) for path, room, name, target in _edges()
                    if (room, target) in FORBIDDEN})
    assert not wrong, "imports against the layering (docs/design.md):\n" + "\n".join(
        f"  {path} imports {name}" for path, name in wrong)


def test_no_relative_imports():
    """Relative imports would escape the check above."""
    relative = []
    for path, _ in _modules():
        with open(os.path.join(PACKAGE_DIR, path), encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        relative += [f"{path}:{node.lineno}" for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.level]
    assert not relative, relative
