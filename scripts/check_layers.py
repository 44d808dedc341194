#!/usr/bin/env python3
"""Check dpro's import layers (docs/architecture.md): exit 1 on an import that runs up
the layers, between two packages of one layer, or around a cycle of modules.

Every import counts for the layers, also those inside functions (dpro imports lazily to
keep ``import dpro`` free of work) and those only for type hints; a cycle is one of
imports that run (not those under ``if TYPE_CHECKING:``). Usage: ``python scripts/check_layers.py [ROOT]``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

#: low to high; a package imports only itself and packages of lower layers
LAYERS: list[list[str]] = [
    ["dpro.errors"],
    ["dpro.jsonio", "dpro.progress", "dpro.contracts", "dpro.executor", "dpro.resultcache", "dpro.sizes",
     "dpro.compiled", "dpro.ports"],
    ["dpro.gtrace"],
    ["dpro.importers", "dpro.alignment", "dpro.graph", "dpro.apply"],
    ["dpro.loader", "dpro.replayer", "dpro.profiler"],
    ["dpro.optimizer"],
    ["dpro.job", "dpro.passes"],
    ["dpro.oracle", "dpro.whatif"],
    ["dpro.report"],
    ["dpro.cli_imports"],
    ["dpro.cli"],
    ["dpro.entry"],
    ["dpro.__main__"],
]
#: ``dpro/__init__.py``: the lazy facade (dpro.open, dpro.Recorder) names the layers above it
FACADE = "dpro"


def modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for every module of the ``dpro`` package under ``root``."""
    out = {}
    for f in sorted((root / "dpro").rglob("*.py")):
        parts = list(f.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def _type_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (never run)."""
    out: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            out |= {id(x) for b in n.body for x in ast.walk(b)}
    return out


def imports(name: str, f: Path, known: dict[str, Path], *, typing: bool = True) -> set[str]:
    """The dpro modules ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``);
    with ``typing=False`` not those under ``if TYPE_CHECKING:``."""
    out: set[str] = set()
    pkg = name if f.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(f.read_text(), str(f))
    skip = set() if typing else _type_only(tree)
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name.split(".")[0] == "dpro"}
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                base = ".".join(up + ([base] if base else []))
            if base.split(".")[0] != "dpro":
                continue
            for a in n.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in known else base)
    return {m for m in out if m != name}


def package(mod: str) -> str:
    """The layered package a module belongs to (``dpro.optimizer.passes.base`` -> ``dpro.optimizer``)."""
    for layer in LAYERS:
        for p in layer:
            if mod == p or mod.startswith(p + "."):
                return p
    return mod


def layer_of(pkg: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if pkg in layer), None)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def violations(root: Path) -> list[str]:
    """Every breach of the layers and every cycle, one line each."""
    known = modules(root)
    graph = {m: imports(m, f, known) for m, f in known.items()}
    out = []
    for m, deps in sorted(graph.items()):
        if m == FACADE:
            continue
        pm = package(m)
        lm = layer_of(pm)
        if lm is None:
            out.append(f"{m}: package {pm} is in no layer (scripts/check_layers.py LAYERS)")
            continue
        for d in sorted(deps):
            pd = package(d)
            if pd == pm:
                continue
            ld = layer_of(pd)
            if ld is None or ld > lm:
                out.append(f"{m} imports {d}: up the layers ({pm} is below {pd})")
            elif ld == lm:
                out.append(f"{m} imports {d}: {pm} and {pd} are in one layer and must not import each other")
    # a cycle of imports that run (type-only imports are allowed to close a loop)
    run = {m: imports(m, f, known, typing=False) for m, f in known.items()}
    out += [f"import cycle: {' -> '.join(c)}" for c in cycles(run)]
    return out


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    bad = violations(root)
    for line in bad:
        print(line)
    print(f"check_layers: {len(bad)} problem(s) in {len(modules(root))} modules")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
