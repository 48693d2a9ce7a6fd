"""docs/design.md's layout tree names every module of electra_tf (issue 36: the tree stays current).

A module is named by its file name at its folder's place in the tree (`record_reader.py` two spaces
under `records/`, which is under `data/`); the tools in commands/ by their stem on
the commands/ line, and the modules inside a fine-tuning family's folder (classification/, qa/,
...) by the folder, which the tree describes as a whole.
"""

import os
import re

import electra_tf

PACKAGE_DIR = os.path.dirname(electra_tf.__file__)
DESIGN = os.path.join(os.path.dirname(PACKAGE_DIR), "docs", "design.md")


def _layout_tree() -> str:
    with open(DESIGN, encoding="utf-8") as f:
        text = f.read()
    start = text.index("## Layout")
    return text[start:text.index("\n## ", start + 1)]


def _tree_paths(tree: str) -> set:
    """The paths the tree names under electra_tf/, read from its indentation (two spaces a level):
    `training/`, `training/tf/`, `training/tf/trainer.py`, ... A continuation line (text from the
    description column on) names nothing."""
    block = tree[tree.index("\nelectra_tf/\n") + 1:]
    paths, stack = set(), []
    for line in block.splitlines()[1:]:
        if not line.startswith("  ") or line.startswith("```"):
            break
        name = line.strip().split()[0] if line[:31].strip() else ""
        if not name:
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2 - 1
        stack[depth:] = [name]
        paths.add("".join(stack))
    return paths


def _unnamed(tree: str):
    commands_line = tree[tree.index("commands/"):tree.index("console.py")]
    paths = _tree_paths(tree)
    for directory, _, files in os.walk(PACKAGE_DIR):
        relative = os.path.relpath(directory, PACKAGE_DIR).replace(os.sep, "/")
        for name in sorted(files):
            if not name.endswith(".py") or name == "__init__.py":
                continue
            parts = [] if relative == "." else relative.split("/")
            if parts[:1] == ["commands"]:
                named = re.search(rf"\b{re.escape(name[:-3])}\b", commands_line)
            elif parts[:1] == ["finetuning"] and len(parts) == 2:
                named = f"{parts[1]}/" in tree
            else:
                named = "".join(p + "/" for p in parts) + name in paths
            if not named:
                yield "/".join(parts + [name])


def test_every_module_is_in_the_layout_tree():
    assert list(_unnamed(_layout_tree())) == []


def test_a_module_missing_from_the_tree_is_reported():
    tree = _layout_tree().replace("record_reader.py", "record_rxader.py")
    assert list(_unnamed(tree)) == ["data/records/record_reader.py"]


def test_a_module_at_the_wrong_place_in_the_tree_is_reported():
    """`trainer.py` is named under training/tf/ and training/portable/; under one only, the other
    one is reported (file names repeat across folders, so the place matters)."""
    tree = _layout_tree()
    start = tree.index("    portable/")
    moved = tree[:start] + tree[start:].replace("      trainer.py  ", "      trainxr.py  ", 1)
    assert list(_unnamed(moved)) == ["training/portable/trainer.py"]
