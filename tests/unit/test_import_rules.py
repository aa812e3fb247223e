"""Which packages may import the heavy third-party libraries, read from the source with ``ast``.

Each library stays in its own corner (docs/design/README.md, "Packages and imports"):
vLLM in the connector and the tools that drive engines, torch where KV tensors
are touched, CuPy in ``gpu/``, cffi in ``ssd/``, Numba in ``index/`` and the
redis client in ``remote/``. A vLLM worker imports the connector, so Numba
(slow to import, and its JIT unwanted there) must not be imported at module
level by anything the connector imports at module level: the index compiles
its kernels lazily.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "miniflex"

ALLOWED: dict[str, tuple[str, ...]] = {
    # the facade, and the tools that start engines (lazily): demo, serve, the bench harness
    "vllm": ("connector/", "tools/"),
    # KV tensors: movers, the worker half and the facade, the tools (toy models, tune, bench);
    # never the scheduler half (scheduler/), which holds metadata only
    "torch": ("connector/", "worker/", "gpu/", "tools/"),
    "cupy": ("gpu/",),
    "cffi": ("ssd/",),
    "numba": ("index/",),
    "redis": ("remote/",),  # the remote store's client; an optional extra
    "mooncake": ("remote/",),  # Mooncake Store's client; an optional extra
}

WORKER_ENTRY = "miniflex.connector.connector"
"""What a vLLM worker imports (``kv_connector_module_path`` is ``miniflex.connector``)."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(tree: ast.AST) -> Iterator[tuple[str, bool, int]]:
    """``(module, at module level, line)`` of every absolute import; imports under
    ``if TYPE_CHECKING:`` count as lazy (they never run)."""

    def walk(node: ast.AST, lazy: bool) -> Iterator[tuple[str, bool, int]]:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                inner = True
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, not inner, child.lineno
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                yield child.module, not inner, child.lineno
                for alias in child.names:  # ``from pkg import submodule``
                    yield f"{child.module}.{alias.name}", not inner, child.lineno
            yield from walk(child, inner)

    yield from walk(tree, False)


def _parsed() -> dict[str, tuple[Path, list[tuple[str, bool, int]]]]:
    return {
        name: (path, list(_imports(ast.parse(path.read_text()))))
        for name, path in _modules().items()
    }


def test_heavy_libraries_are_imported_only_where_allowed() -> None:
    bad = []
    for path, imports in _parsed().values():
        rel = path.relative_to(ROOT).as_posix()
        for module, _, line in imports:
            lib = module.split(".")[0]
            if lib in ALLOWED and not rel.startswith(ALLOWED[lib]):
                bad.append(f"miniflex/{rel}:{line} imports {module} (allowed in: {ALLOWED[lib]})")
    assert not bad, "forbidden imports:\n" + "\n".join(sorted(set(bad)))


def test_a_vllm_worker_does_not_import_numba() -> None:
    """Follow the module-level imports from the connector; none of them may import numba
    at module level (``index/_kernels.py`` is imported inside the function that compiles)."""
    parsed = _parsed()
    seen, todo, via = set(), [WORKER_ENTRY], {WORKER_ENTRY: WORKER_ENTRY}
    bad = []
    while todo:
        name = todo.pop()
        if name in seen or name not in parsed:
            continue
        seen.add(name)
        path, imports = parsed[name]
        for module, top, line in imports:
            if not top:
                continue
            if module.split(".")[0] == "numba":
                rel = path.relative_to(ROOT.parent).as_posix()
                bad.append(f"{rel}:{line} imports {module} at module level (via {via[name]})")
            parts = module.split(".")
            for i in range(1, len(parts) + 1):  # a package's __init__ runs first
                parent = ".".join(parts[:i])
                if parent in parsed and parent not in seen:
                    via.setdefault(parent, f"{via[name]} -> {parent}")
                    todo.append(parent)
    assert WORKER_ENTRY in seen and "miniflex.index.hashindex" in seen
    assert not bad, "numba is imported where a vLLM worker imports:\n" + "\n".join(bad)


LAYERS: dict[str, tuple[str, ...]] = {
    # each half of the connector stands on its own; only the facade (connector/) sees both
    "scheduler/": ("miniflex.connector", "miniflex.worker", "miniflex.tools.bench"),
    "worker/": ("miniflex.connector", "miniflex.scheduler", "miniflex.tools.bench"),
    # the layers under the halves import neither half, nor the facade
    "tiers/": ("miniflex.connector", "miniflex.scheduler", "miniflex.worker"),
    "remote/": ("miniflex.connector", "miniflex.scheduler", "miniflex.worker"),
    "gpu/": ("miniflex.connector", "miniflex.scheduler", "miniflex.worker"),
    "ssd/": ("miniflex.connector", "miniflex.scheduler", "miniflex.worker"),
    "index/": ("miniflex.connector", "miniflex.scheduler", "miniflex.worker"),
}


def test_the_halves_and_the_layers_under_them_never_import_upward() -> None:
    bad = []
    for path, imports in _parsed().values():
        rel = path.relative_to(ROOT).as_posix()
        banned = next((b for prefix, b in LAYERS.items() if rel.startswith(prefix)), ())
        for module, _, line in imports:
            if module.startswith(banned):
                bad.append(f"miniflex/{rel}:{line} imports {module}")
    assert not bad, "imports that go upward:\n" + "\n".join(sorted(set(bad)))


def test_nothing_in_the_library_imports_the_tools() -> None:
    """``miniflex/tools/`` (CLI, demo, serve, tune, inspect, toy models, the bench harness)
    stands above everything: an import of it from any other package, even a lazy one, is
    an arrow upward."""
    bad = []
    for path, imports in _parsed().values():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("tools/"):
            continue
        for module, _, line in imports:
            if module == "miniflex.tools" or module.startswith("miniflex.tools."):
                bad.append(f"miniflex/{rel}:{line} imports {module}")
    assert not bad, "imports of miniflex.tools from the library:\n" + "\n".join(sorted(bad))


def test_the_config_package_imports_only_the_base_modules() -> None:
    """The frozen config sits at the bottom, beside ``errors.py``: it imports no package of
    the library but itself."""
    base = ("miniflex.config", "miniflex.errors", "miniflex.units")
    bad = []
    for path, imports in _parsed().values():
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith("config/"):
            continue
        for module, _, line in imports:
            if module.startswith("miniflex.") and not module.startswith(base):
                bad.append(f"miniflex/{rel}:{line} imports {module}")
    assert not bad, "the config package imports upward:\n" + "\n".join(sorted(bad))


def _cycle_from(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """One path of imports that leads from ``start`` back to it, if there is one."""
    todo, seen = [(start, [start])], set()
    while todo:
        name, path = todo.pop()
        for dep in sorted(graph.get(name, ())):
            if dep == start:
                return [*path, start]
            if dep not in seen:
                seen.add(dep)
                todo.append((dep, [*path, dep]))
    return None


def test_no_module_imports_itself_round_a_circle() -> None:
    """Type-only imports (under ``TYPE_CHECKING``) and lazy ones count too: a circle is two
    modules that cannot be read, or moved, one without the other. A module's import of
    its own package (``from miniflex.connector import compat``) is not an edge to it."""
    parsed = _parsed()
    graph: dict[str, set[str]] = {}
    for name, (_, imports) in parsed.items():
        deps = graph.setdefault(name, set())
        for module, _, _ in imports:
            parts = module.split(".")
            target = next(
                (
                    ".".join(parts[:i])
                    for i in range(len(parts), 0, -1)
                    if ".".join(parts[:i]) in parsed
                ),
                None,
            )
            if target is not None and target != name and not name.startswith(target + "."):
                deps.add(target)
    circles = {" -> ".join(c) for name in graph if (c := _cycle_from(graph, name)) is not None}
    assert not circles, "import circles:\n" + "\n".join(sorted(circles))
