"""Sources, scalers, heads and the labels of candles describe themselves: no module that shows or uses them
compares a source's, a scaler's or a label's kind with a name spelled out, and no module outside trainer/heads asks
which kind a head is (a new kind is one class, in its own module)."""
from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO
from trainer.heads import Head

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


# ----------------------------------------------------------------------------- heads
HEAD_FLAGS = {"candle", "har", "quantiles", "har_head", "range_output"}  # what only a head of one kind has
HEAD_CLASSES = {kind.__name__ for kind in Head.kinds.values()}
OUTSIDE_HEADS = sorted(str(p.relative_to(REPO)) for p in (REPO / "trainer").rglob("*.py")
                       if "heads" not in p.relative_to(REPO / "trainer").parts)


def head_switches(source: str) -> list[str]:
    """Each place that asks which kind a head is: a read of what only one kind has (HEAD_FLAGS), a comparison of a
    kind with a head kind's name, an isinstance of a head kind's class."""
    return [f"line {node.lineno}: {ast.unparse(node)}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr in HEAD_FLAGS
            or isinstance(node, ast.Compare) and any(_head_kind(side) for side in (node.left, *node.comparators))
            or isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
            and len(node.args) == 2 and bool(_names(node.args[1]) & HEAD_CLASSES)]


def _head_kind(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_head_kind(e) for e in node.elts)
    return isinstance(node, ast.Constant) and node.value in Head.kinds


@pytest.mark.parametrize("module", OUTSIDE_HEADS)
def test_no_module_outside_the_heads_asks_which_kind_a_head_is(module):
    assert head_switches((REPO / module).read_text()) == []


def test_the_check_finds_head_switches():
    assert head_switches("if head.har: pass\nx = [h for h in heads if h.quantiles]") == [
        "line 1: head.har", "line 2: h.quantiles"]
    assert len(head_switches('if head.kind == "har_candle": pass\ny = spec.kind in ("candle", "plain")')) == 2
    assert head_switches("z = isinstance(head, HarCandleHead)") == ["line 1: isinstance(head, HarCandleHead)"]
    assert head_switches("head.columns; head.outputs; head.spec.point(x); kind == 'lstm'") == []
