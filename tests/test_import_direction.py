"""Dependencies point one way (docs/design.md): read from the package's own imports, by `ast`.

Three checks. The packages are layered as docs/design.md's "Dependencies point one way" says
(`ABOVE`: what each package must not import); no module of electra_tf reaches itself again by
following imports (a module cycle); and an import inside a function (a lazy import) says why it is
lazy, `# lazy: REASON` on its line or on the line before it (or before the run of imports it
belongs to). Imports inside functions count in the first two checks as well: a lazy import
across the layers is still an arrow pointing up, and a cycle closed by one is still a cycle.

`PENDING_TRAINING` and `PENDING_LAZY_REASONS` are the exceptions left for the refactoring of
electra_tf/training/ (issue 46 item 1): each must still exist, so the sets shrink to empty
rather than go stale.
"""

import ast
import os
from typing import Dict, Iterable, Iterator, List, Optional, Set, Tuple

import electra_tf

PACKAGE_DIR = os.path.dirname(electra_tf.__file__)

# package -> the packages it must not import ("" is the top level of electra_tf). From
# docs/design.md: modeling/ knows nothing of the objective (pretraining/); the model knows
# nothing of the loop (training/ imports modeling/, pretraining/ and data/, never the reverse);
# finetuning/ and convert/ read runs through training/ (so training/ imports neither), and
# nothing in training/ or finetuning/ imports convert/; data/ is below sources/ (the registry
# downloads are not the data path); the tools in commands/ are on top of everything; config/ (the
# run's configuration, pure Python) imports only the top-level modules, below every package.
_LAYERS_ABOVE_TRAINING = ("finetuning", "convert", "commands")
ABOVE = {
    "modeling": ("pretraining", "training", *_LAYERS_ABOVE_TRAINING),
    "pretraining": ("training", *_LAYERS_ABOVE_TRAINING),
    "data": ("sources", "training", *_LAYERS_ABOVE_TRAINING),
    "training": _LAYERS_ABOVE_TRAINING,
    "finetuning": ("convert", "commands"),
    "convert": ("commands",),
    "sources": ("commands",),
    "": ("commands",),
    "config": ("modeling", "pretraining", "data", "training", "sources", *_LAYERS_ABOVE_TRAINING),
}
FORBIDDEN = {(room, target) for room, targets in ABOVE.items() for target in targets}

# Imports against the layering that electra_tf/training/ still has while issue 46 item 1 is
# under way: exact (importing module, imported module) pairs. Remove a pair once its import is
# gone (the test below fails until then); never add one. Empty: the learning probe has moved to
# finetuning/, and training/ imports nothing of finetuning/ now.
PENDING_TRAINING: Set[Tuple[str, str]] = set()

# Modules whose function-level imports need not say why yet: electra_tf/training/ is being
# refactored (issue 46 item 1), and its engineer removes this exemption. A prefix of module
# paths relative to the package.
PENDING_LAZY_REASONS: Tuple[str, ...] = ()
LAZY_MARK = "# lazy:"


def _modules() -> Iterator[Tuple[str, str]]:
    """(path relative to the package, its package: "" at the top level) of every module."""
    for directory, _, files in os.walk(PACKAGE_DIR):
        for name in sorted(files):
            if name.endswith(".py"):
                relative = os.path.relpath(os.path.join(directory, name), PACKAGE_DIR)
                parts = relative.split(os.sep)
                yield relative.replace(os.sep, "/"), parts[0] if len(parts) > 1 else ""


def _module_name(path: str) -> str:
    """electra_tf.x.y of the module at `path` (a package's __init__.py is the package)."""
    parts = ["electra_tf"] + path[:-len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(name: str) -> str:
    """The package ("" for the top level) of the module electra_tf.x[.y]."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and os.path.isdir(os.path.join(PACKAGE_DIR, parts[1])) else ""


def _is_module(name: str) -> bool:
    """Whether the dotted `name` (electra_tf.x.y) is a module or package of electra_tf."""
    path = os.path.join(PACKAGE_DIR, *name.split(".")[1:])
    return os.path.isdir(path) or os.path.isfile(path + ".py")


def _tree(path: str) -> ast.Module:
    with open(os.path.join(PACKAGE_DIR, path), encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def _names(node: ast.AST) -> List[str]:
    """The electra_tf modules an import statement imports: `from electra_tf.x import y` is
    electra_tf.x.y when y is a module, else electra_tf.x."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = [f"{node.module}.{alias.name}" if _is_module(f"{node.module}.{alias.name}")
                 else node.module for alias in node.names]
    else:
        return []  # (the package uses no relative imports: test_no_relative_imports)
    return [name for name in names if name == "electra_tf" or name.startswith("electra_tf.")]


def _imported(path: str) -> Iterator[str]:
    """Every electra_tf module `path` imports, at any depth."""
    for node in ast.walk(_tree(path)):
        yield from _names(node)


def _edges() -> List[Tuple[str, str, str, str]]:
    """(module path, its package, imported module, that module's package)."""
    return [(path, room, name, _package(name))
            for path, room in _modules() for name in _imported(path)]


def _graph() -> Dict[str, Set[str]]:
    """electra_tf.x.y -> the electra_tf modules it imports (itself left out)."""
    graph: Dict[str, Set[str]] = {}
    for path, _ in _modules():
        module = _module_name(path)
        graph.setdefault(module, set()).update(n for n in _imported(path) if n != module)
    return graph


# ==== Layering ====


def test_no_import_points_from_a_lower_package_to_a_higher_one():
    wrong = sorted({(_module_name(path), name) for path, room, name, target in _edges()
                    if (room, target) in FORBIDDEN} - PENDING_TRAINING)
    assert not wrong, "imports against the layering (docs/design.md):\n" + "\n".join(
        f"  {module} imports {name}" for module, name in wrong)


BACKEND_FOLDERS = ("electra_tf.training.tf", "electra_tf.training.portable")


def test_the_backends_do_not_import_each_other():
    """training/tf/ (TensorFlow) and training/portable/ (JAX / PyTorch) meet only in what
    training/ shares (the run, the npz checkpoint format, summaries): neither imports the other,
    so a JAX run loads no TensorFlow module of the package and a backend can change alone."""
    def folder(name):
        return next((f for f in BACKEND_FOLDERS if name == f or name.startswith(f + ".")), None)

    crossing = sorted((_module_name(path), name) for path, _ in _modules()
                      for name in _imported(path)
                      if folder(_module_name(path)) and folder(name)
                      and folder(name) != folder(_module_name(path)))
    assert not crossing, "backend folders importing each other:\n" + "\n".join(
        f"  {module} imports {name}" for module, name in crossing)


# The places where what training/ shares picks the running backend's code: Keras' training hooks
# (`ElectraPretrainer`: TensorFlow's step or JAX / PyTorch's) and the optimizers' fused
# TensorFlow update. Nothing else in training/ outside the backend folders imports them.
BACKEND_DISPATCH = {
    ("electra_tf.training.pretrainer", "electra_tf.training.portable.fit"),
    ("electra_tf.training.pretrainer", "electra_tf.training.tf.keras_fit"),
    ("electra_tf.training.optimization", "electra_tf.training.tf.update"),
    ("electra_tf.training.optimizers", "electra_tf.training.tf.update"),
}


def test_shared_training_modules_reach_a_backend_only_to_dispatch():
    def in_folder(name):
        return any(name == f or name.startswith(f + ".") for f in BACKEND_FOLDERS)

    edges = {(_module_name(path), name) for path, room in _modules() for name in _imported(path)
             if room == "training" and not in_folder(_module_name(path)) and in_folder(name)}
    assert edges == BACKEND_DISPATCH, (
        "shared training/ modules importing a backend folder beyond the dispatch points:\n"
        + "\n".join(f"  {m} imports {n}" for m, n in sorted(edges - BACKEND_DISPATCH))
        + "\ndispatch points no longer there (remove them):\n"
        + "\n".join(f"  {m} imports {n}" for m, n in sorted(BACKEND_DISPATCH - edges)))


def test_pending_training_edges_still_exist():
    """A pending edge that is gone must leave PENDING_TRAINING, so the set only shrinks."""
    edges = {(_module_name(path), name) for path, room, name, target in _edges()
             if (room, target) in FORBIDDEN}
    gone = sorted(PENDING_TRAINING - edges)
    assert not gone, ("these imports are gone (or no longer against the layering): remove them "
                      "from PENDING_TRAINING in tests/test_import_direction.py:\n" + "\n".join(
                          f"  {module} imports {name}" for module, name in gone))
    assert all(module.startswith("electra_tf.training.") for module, _ in PENDING_TRAINING)


def test_no_relative_imports():
    """Relative imports would escape the checks here."""
    relative = []
    for path, _ in _modules():
        relative += [f"{path}:{node.lineno}" for node in ast.walk(_tree(path))
                     if isinstance(node, ast.ImportFrom) and node.level]
    assert not relative, relative


# ==== Cycles ====


def _components(graph: Dict[str, Iterable[str]]) -> List[List[str]]:
    """The strongly connected components of `graph` with more than one module (each sorted,
    the list sorted): the modules that import each other in a circle. Tarjan's algorithm,
    iterative."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[List[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
            elif successor not in index:
                index[successor] = low[successor] = len(index)
                stack.append(successor)
                on_stack.add(successor)
                work.append((successor, iter(sorted(graph.get(successor, ())))))
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
    return sorted(components)


def _cycles(graph: Dict[str, Iterable[str]]) -> List[List[str]]:
    """One cycle (modules in import order, the first repeated at the end) per component."""
    return [_a_cycle(graph, component) for component in _components(graph)]


def _a_cycle(graph: Dict[str, Iterable[str]], component: List[str]) -> List[str]:
    """The shortest cycle through the component's first module (breadth first, inside it)."""
    start, members = component[0], set(component)
    parent: Dict[str, Optional[str]] = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for successor in sorted(graph.get(node, ())):
                if successor == start:
                    path = [node]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if successor in members and successor not in parent:
                    parent[successor] = node
                    following.append(successor)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def test_no_module_cycles():
    """No module reaches itself through imports, function-level ones included: a cycle closed
    by a lazy import still means neither module can be read (or moved) without the other."""
    graph = _graph()
    components = _components(graph)
    assert not components, (
        "module cycles in electra_tf (move the shared piece to where it belongs):\n" + "\n".join(
            f"  {' -> '.join(_a_cycle(graph, component))}"
            + (f" (the circle holds {', '.join(component)})" if len(component) > 2 else "")
            for component in components))


def test_a_cycle_is_reported_with_its_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert _components(graph) == [["a", "b", "c"], ["e", "e2"]]
    assert _cycles(graph) == [["a", "b", "c", "a"], ["e", "e2", "e"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


# ==== Lazy imports say why ====


def _lazy_imports(tree: ast.Module) -> Iterator[ast.stmt]:
    """The import statements of electra_tf modules inside a function (or lambda) of `tree`."""
    def walk(node: ast.AST, in_function: bool) -> Iterator[ast.stmt]:
        for child in ast.iter_child_nodes(node):
            if in_function and _names(child):
                yield child
            yield from walk(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    return walk(tree, False)


def _says_why(lines: List[str], node: ast.stmt, imports: Set[int]) -> bool:
    """Whether the import at `node` has LAZY_MARK on its own lines, or on the line just above it
    or above the run of import lines it belongs to (that line's comment may run over several)."""
    if any(LAZY_MARK in lines[i - 1] for i in range(node.lineno, node.end_lineno + 1)):
        return True
    line = node.lineno - 1
    while line in imports:  # up a run of consecutive import statements
        line -= 1
    if line >= 1 and LAZY_MARK in lines[line - 1]:
        return True
    while line >= 1 and lines[line - 1].strip().startswith("#"):  # up a comment's lines
        if LAZY_MARK in lines[line - 1]:
            return True
        line -= 1
    return False


def _unexplained(path: str) -> List[str]:
    """"path:line" of each lazy import of `path` that does not say why."""
    with open(os.path.join(PACKAGE_DIR, path), encoding="utf-8") as f:
        text = f.read()
    lines, tree = text.splitlines(), ast.parse(text, path)
    imports = {line for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
               for line in range(node.lineno, node.end_lineno + 1)}
    return [f"{path}:{node.lineno}" for node in _lazy_imports(tree)
            if not _says_why(lines, node, imports)]


def test_every_lazy_import_says_why():
    """An import inside a function hides a dependency until the function runs; the reason
    (`# lazy: TensorFlow is optional here`, `# lazy: avoids importing jax at CLI start`) tells a
    reader whether it may be hoisted."""
    missing = [where for path, _ in _modules() if not path.startswith(PENDING_LAZY_REASONS)
               for where in _unexplained(path)]
    assert not missing, (f"function-level imports without a `{LAZY_MARK} REASON` comment "
                         "(hoist them if there is none):\n" + "\n".join(f"  {m}" for m in missing))


def test_pending_lazy_reasons_are_still_needed():
    """An exempted folder whose lazy imports all say why must leave PENDING_LAZY_REASONS."""
    done = [prefix for prefix in PENDING_LAZY_REASONS
            if not any(_unexplained(path) for path, _ in _modules() if path.startswith(prefix))]
    assert not done, (f"{done}: every lazy import there says why: remove it from "
                      "PENDING_LAZY_REASONS in tests/test_import_direction.py")


def test_an_unexplained_lazy_import_is_found():
    lines = ["def f():", "    from electra_tf import atomic", "", "def g():",
             "    # lazy: TensorFlow is optional here", "    from electra_tf import errors",
             "    from electra_tf import cli", "    import os", "",
             "def h():", "    from electra_tf import locking  # lazy: a cycle", "",
             "def k():", "    # lazy: a reason that takes", "    # two lines", "    import os",
             "    from electra_tf import progress", "",
             "def m():", "    # not a reason", "", "    from electra_tf import precision", "",
             "from electra_tf import console"]
    text = "\n".join(lines) + "\n"
    tree = ast.parse(text)
    imports = {node.lineno for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))}
    unexplained = [node.lineno for node in _lazy_imports(tree)
                   if not _says_why(text.splitlines(), node, imports)]
    assert unexplained == [2, 22]
