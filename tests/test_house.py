"""The house's shape: the import graph of ``src/vf_rl`` (module-level and deferred imports alike)
has no cycle and no import from a lower layer to a higher one, ``config/`` imports nothing else of
vf-rl, and ``src/`` carries no lab notebook (benchmark sections, result files, run names)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "vf_rl"

# lowest first: a module may import its own layer and the layers below it (docs/architecture.md)
LAYERS = ["vf_rl.parent_watch", "vf_rl.watchdog", "vf_rl.config", "vf_rl.env_api", "vf_rl.algorithm", "vf_rl.environments",
          "vf_rl.inference", "vf_rl.orchestrator", "vf_rl.trainer", "vf_rl.sft", "vf_rl.launcher", "vf_rl"]
# the one import that runs up, named in docs/architecture.md: the registry finds the built-in environments
UPWARD_ALLOWED = {("vf_rl.env_api.registry", "vf_rl.environments")}


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every vf_rl module -> the vf_rl modules it imports anywhere in its body."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def _layer(module: str) -> int:
    return max(i for i, layer in enumerate(LAYERS) if module == layer or module.startswith(layer + "."))


def test_import_graph_has_no_cycle():
    graph, state, cycles = _imports(), {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_import_runs_up_a_layer():
    up = [(a, b) for a, targets in _imports().items() for b in targets
          if _layer(b) > _layer(a) and not any(a == x and (b == y or b.startswith(y + ".")) for x, y in UPWARD_ALLOWED)
          and not b.startswith(a + ".")]  # a package's face hands on its own modules
    assert not up, "imports from a lower layer to a higher one: " + ", ".join(f"{a} -> {b}" for a, b in up)


def test_config_imports_nothing_else_of_vf_rl():
    outside = [(a, b) for a, targets in _imports().items() if a.startswith("vf_rl.config")
               for b in targets if not b.startswith("vf_rl.config")]
    assert not outside, outside


CITES = re.compile(r"RESULTS|benchmarks/results/|\b(?:[Ss]ection|[Rr]un|[Ss]top) \(?(?:a[a-z]|[a-z])\)|\bstop \d+\b")


def test_src_names_no_benchmark_section_result_file_or_run():
    hits = [f"{p.relative_to(SRC)}:{i}: {line.strip()[:80]}" for p in PACKAGE.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if CITES.search(line)]
    assert not hits, "src/ cites the lab notebook (say what the code does; numbers live in docs/benchmarks.md):\n" + \
        "\n".join(hits)


def test_every_module_opens_with_what_it_is():
    missing = [str(p.relative_to(SRC)) for p in PACKAGE.rglob("*.py")
               if ast.get_docstring(ast.parse(p.read_text())) is None and p.stat().st_size > 0]
    assert not missing, f"modules without an opening docstring: {missing}"
