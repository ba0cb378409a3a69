"""The package's layers: every import inside spartune (at module level or inside a function)
goes down the layers, never up, and no two modules import each other, however indirectly."""
import ast
from pathlib import Path

import spartune

ROOT = Path(spartune.__file__).parent

# lowest first; a module may import its own layer and those below it
LAYERS = [
    {"versions", "epilogue", "formats"},
    {"reference", "prune"},
    {"tune"},
    {"kernels", "backends"},
    {"dispatch"},
    {"ops"},
    {"library", "fusion"},
    {"nn"},
    {"bench"},
    {"cli"},
]
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """spartune modules that `path` imports, as dotted names."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    known = {_module_name(p) for p in ROOT.rglob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("spartune"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("spartune"):
                target = node.module
            else:
                continue
            for a in node.names:  # `from . import ops` imports a module; `from .x import f`, module x
                found.add(f"{target}.{a.name}" if f"{target}.{a.name}" in known else target)
    return {t for t in found if t in known and t != name}


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in ROOT.rglob("*.py")}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LEVEL.get(parts[1]) if len(parts) > 1 else None


def test_every_top_level_module_has_a_layer():
    top = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
           if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    assert top <= set(LEVEL), f"give these a layer in LAYERS: {sorted(top - set(LEVEL))}"


def test_imports_go_down_the_layers():
    upward = [(m, t) for m, targets in _graph().items() for t in targets
              if _layer(m) is not None and _layer(t) is not None and _layer(t) > _layer(m)]
    assert not upward, f"imports that run back up the layers: {upward}"


def test_no_import_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m):  # depth-first search; a grey node met again closes a cycle
        state[m] = 1
        path.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(t):] + [t]))
            if t not in state:
                visit(t)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_checks_can_fail(monkeypatch):
    """On a graph with an upward import that closes a cycle, both checks fail."""
    import sys

    import pytest

    fake = {"spartune.tune.a": {"spartune.ops"}, "spartune.ops": {"spartune.tune.a"}}
    monkeypatch.setattr(sys.modules[__name__], "_graph", lambda: fake)
    with pytest.raises(AssertionError, match="back up"):
        test_imports_go_down_the_layers()
    with pytest.raises(AssertionError, match="cycle"):
        test_no_import_cycle()
