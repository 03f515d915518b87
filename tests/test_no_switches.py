"""Sources, scalers and the labels of candles describe themselves: no module that shows or uses them compares
a source's, a scaler's or a label's kind with a name spelled out (a new kind is one class, in its own module)."""
from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO

KIND_NAMES = {"source", "scaler", "kind"}  # what data.source, window.scaler and a label's prefix are read as
MODULES = ["trainer/report/html.py", "trainer/data/windows.py", "trainer/data/scalers.py", "trainer/publish/cards.py"]


def switches(source: str) -> list[str]:
    """Each comparison of something named source, scaler or kind with a string literal (or a tuple of them)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for left, op, right in zip(operands, node.ops, operands[1:]):
            named = [side for side in (left, right) if _names(side) & KIND_NAMES]
            if isinstance(op, (ast.Eq, ast.NotEq)) and named and (_literal(left) or _literal(right)) \
                    or isinstance(op, (ast.In, ast.NotIn)) and _names(left) & KIND_NAMES and _literal(right):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _names(node: ast.AST) -> set[str]:
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            names.add(sub.attr)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):  # d["source"], d.get("source")
            names.add(sub.value)
    return names


def _literal(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_literal(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


@pytest.mark.parametrize("module", MODULES)
def test_no_switch_on_a_source_scaler_or_label_kind(module):
    assert switches((REPO / module).read_text()) == []


def test_the_check_finds_such_switches():
    assert switches('if data.get("source") == "synthetic": pass') == [
        "line 1: data.get('source') == 'synthetic'"]
    assert len(switches('kind, _, where = label.partition(":")\nx = kind in ("local", "freqtrade")')) == 1
    assert len(switches('if kind == "standard": pass\nelif self.kind == "minmax": pass')) == 2
    assert switches('x = framing(c) == "level"; y = kind in Scaler.kinds; z = "scaler" in saved') == []
