"""trainer's packages depend one way (docs/architecture.md, "Dependency direction"): every import in trainer/, those
inside functions and under TYPE_CHECKING too, read with ast. `python tests/test_architecture.py` prints the
package-level graph and any circles."""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

TRAINER = Path(__file__).resolve().parents[1] / "trainer"

# Bottom first: a package may import those below it, never those above it or beside it (on the same line).
# A top-level module (config.py, cli.py, ...) counts as a package of its own; `trainer` is trainer/__init__.py.
DIRECTION = (
    ("trainer", "errors", "files", "formatting", "retries", "specs"),
    ("heads",),
    ("data",),
    ("model",),
    ("evaluation",),
    ("config",),
    ("run",),
    ("publish",),
    ("report",),
    ("cli",),
    ("__main__",),
)


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted (trainer.data.sources)
    target: str  # the imported module of trainer, dotted
    where: str  # file:line

    def __str__(self) -> str:
        return f"{self.where}: {self.source} imports {self.target}"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package(module: str) -> str:
    """The package a module belongs to: trainer.data.sources -> data, trainer.config -> config, trainer -> trainer."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports(root: Path = TRAINER) -> list[Import]:
    """Every import of a module of `root` by a module of `root`, wherever it stands (in a function, under
    TYPE_CHECKING), relative ones resolved; each names the module it imports (a name imported from a package's
    __init__ counts as importing the package)."""
    paths = sorted(root.rglob("*.py"))
    modules = {module_name(path, root) for path in paths}
    found = []
    for path in paths:
        source = module_name(path, root)
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = source.split(".")[: len(source.split(".")) - node.level + is_package]
                    base = ".".join(anchor + ([base] if base else []))
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                         for alias in node.names]
                if not node.module and base != source:  # `from . import x` reads x from the package's __init__ first
                    names.append(base)
            else:
                continue
            for name in dict.fromkeys(names):
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != source:
                    found.append(Import(source, name, f"{path.relative_to(root.parent)}:{node.lineno}"))
    return found


def package_edges(found: list[Import]) -> dict[tuple[str, str], list[Import]]:
    edges: dict[tuple[str, str], list[Import]] = {}
    for imp in found:
        pair = (package(imp.source), package(imp.target))
        if pair[0] != pair[1]:
            edges.setdefault(pair, []).append(imp)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for child in sorted(edges.get(node, ())):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def layer(name: str) -> int:
    return next((i for i, names in enumerate(DIRECTION) if name in names), len(DIRECTION))


# ----------------------------------------------------------------------------- the rules, each a list of what breaks it
def unplaced(root: Path = TRAINER) -> list[str]:
    packages = {package(module_name(path, root)) for path in root.rglob("*.py")}
    return sorted(packages - {name for names in DIRECTION for name in names})


def against_direction(found: list[Import]) -> list[str]:
    """Imports of a package on the same line of DIRECTION or above."""
    return [str(imp) for (source, target), imps in package_edges(found).items() if layer(target) >= layer(source)
            for imp in imps]


def two_way_ties(found: list[Import]) -> list[str]:
    edges = package_edges(found)
    return [f"{a} <-> {b}: " + "; ".join(map(str, edges[a, b] + edges[b, a]))
            for a, b in edges if a < b and (b, a) in edges]


def module_circles(found: list[Import]) -> list[str]:
    """Circles of imports between the modules of one package, each with the imports that close it."""
    within = [imp for imp in found if package(imp.source) == package(imp.target)]
    graph: dict[str, set[str]] = {}
    for imp in within:
        graph.setdefault(imp.source, set()).add(imp.target)
    return [" -> ".join(component) + ": " + "; ".join(str(imp) for imp in within
                                                      if imp.source in component and imp.target in component)
            for component in cycles(graph)]


# ----------------------------------------------------------------------------- trainer keeps them
def test_every_package_has_its_place_in_the_direction():
    assert not unplaced(), f"not in DIRECTION (tests/test_architecture.py): {', '.join(unplaced())}"


def test_no_import_goes_against_the_direction():
    against = against_direction(imports())
    assert not against, "imports against the dependency direction (docs/architecture.md):\n" + "\n".join(against)


def test_no_two_packages_import_each_other():
    ties = two_way_ties(imports())
    assert not ties, "packages that import each other:\n" + "\n".join(ties)


def test_no_import_circle_between_the_modules_of_a_package():
    circles = module_circles(imports())
    assert not circles, "import circles within a package:\n" + "\n".join(circles)


def test_each_rule_names_the_import_that_breaks_it(tmp_path):
    """The reader and the rules on a made-up trainer: imports inside a function and under TYPE_CHECKING count,
    relative ones are resolved, and each finding names the file and line."""
    root = tmp_path / "trainer"
    files = {
        "__init__.py": "",
        "errors.py": "",
        "config.py": "from .data import load\n",
        "data/__init__.py": "def load():\n    from ..config import x\n",  # a two-way tie, against the direction
        "data/sources.py": "from . import binance\n",
        "data/binance.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sources import y\n",
        "model/__init__.py": "",
        "model/training.py": "import trainer.errors\nfrom ..data import sources\n",  # both allowed
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)

    found = imports(root)
    pairs = {(imp.source, imp.target) for imp in found}
    assert ("trainer.model.training", "trainer.errors") in pairs
    assert ("trainer.data.sources", "trainer.data") in pairs  # `from . import binance` runs data/__init__ first
    assert against_direction(found) == ["trainer/data/__init__.py:2: trainer.data imports trainer.config"]
    assert two_way_ties(found) == ["config <-> data: trainer/config.py:1: trainer.config imports trainer.data; "
                                   "trainer/data/__init__.py:2: trainer.data imports trainer.config"]
    assert module_circles(found) == [
        "trainer.data.binance -> trainer.data.sources: trainer/data/binance.py:3: trainer.data.binance imports "
        "trainer.data.sources; trainer/data/sources.py:1: trainer.data.sources imports trainer.data.binance"]


# ----------------------------------------------------------------------------- the suite keeps its own
def fixtures(path: Path) -> set[str]:
    """The fixtures a test file defines at its top level."""
    return {node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.FunctionDef)
            and any("fixture" in ast.unparse(decorator) for decorator in node.decorator_list)}


def test_no_fixture_of_a_test_module_shadows_one_of_conftest():
    """A module's fixture named as one of tests/conftest.py's would hide it from that module's tests, with another
    type (conftest also marks the tests that use `trained_run`)."""
    tests = Path(__file__).resolve().parent
    shared = fixtures(tests / "conftest.py")
    shadows = {str(path.relative_to(tests)): sorted(fixtures(path) & shared)
               for path in sorted(tests.rglob("test_*.py")) if fixtures(path) & shared}
    assert not shadows, f"fixtures named as tests/conftest.py's: {shadows}"


def main() -> None:
    found = imports()
    edges = package_edges(found)
    graph: dict[str, set[str]] = {}
    for source, target in sorted(edges):
        graph.setdefault(source, set()).add(target)
        both = " <->" if (target, source) in edges else ""
        print(f"{source} -> {target}{both}  ({len(edges[source, target])} imports, e.g. {edges[source, target][0]})")
    print("package circles:", cycles(graph) or "none")
    for line in against_direction(found):
        print("against the direction:", line)
    print("module circles:", "\n".join(module_circles(found)) or "none")


if __name__ == "__main__":
    sys.exit(main())
