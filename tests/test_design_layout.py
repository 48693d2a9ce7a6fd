"""docs/design.md's layout tree names every module of electra_tf (issue 36: the tree stays current).

A module is named by its file name (`record_reader.py`); the tools in commands/ by their stem on
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


def _unnamed(tree: str):
    commands_line = tree[tree.index("commands/"):tree.index("console.py")]
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
                named = re.search(rf"(?<![\w/]){re.escape(name)}", tree)
            if not named:
                yield "/".join(parts + [name])


def test_every_module_is_in_the_layout_tree():
    assert list(_unnamed(_layout_tree())) == []


def test_a_module_missing_from_the_tree_is_reported():
    tree = _layout_tree().replace("record_reader.py", "record_rxader.py")
    assert list(_unnamed(tree)) == ["data/record_reader.py"]
