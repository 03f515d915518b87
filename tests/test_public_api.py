"""trainer/ uses Keras, TensorFlow and Ray through their public API only, so that a minor release cannot break it
without a test noticing: read from the source, no import of or attribute chain through a private module or name
(keras.src, tensorflow.python, ray._private, `_x`), no hidden keyword (`_x=`) to their functions, and no
inherited private member (`self._x` that the subclass of their class does not set or define itself). The few
uses no public API replaces are listed in ALLOWED, each kept in one place and watched by a test here."""
from __future__ import annotations

import ast
import inspect
import io
import secrets
from contextlib import redirect_stdout

import pytest

from tests.conftest import REPO

LIBRARIES = {"keras", "tensorflow", "ray"}
PRIVATE_MODULES = {"keras.src", "tensorflow.python"}  # no underscore, yet no part of the public API

# (file, private name) -> why no public API does it, and what fails when the library changes it.
ALLOWED = {
    ("trainer/run/distributed.py", "ray._private"): "Ray prints its cluster's error notices whatever log_to_driver "
    "says, and only ray._private.worker._worker_logs_enabled stops it: set in _show_ray_notices alone "
    "(test_ray_notices_are_silenced_by_the_one_switch_the_run_uses)",
    ("trainer/run/distributed.py", "_node_ip_address"): "ray.init's documented hidden option, for a Ray of the "
    "run's own that only this machine reaches; should Ray drop it, ray.init raises 'Unknown keyword argument(s)' "
    "and the run stops in one line (test_ray_init_still_takes_the_node_address_a_run_gives_its_own_ray)",
    ("trainer/model/device.py", "tensorflow.python"): "whether oneDNN runs, which no public API says: asked in "
    "onednn_runs alone (test_whether_onednn_runs_is_still_told_by_tensorflow)",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _first_private(dotted: str) -> str | None:
    """The dotted name up to its first private part: ray._private.worker -> ray._private; None if public."""
    parts = dotted.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if _private(parts[i - 1]) or prefix in PRIVATE_MODULES:
            return prefix
    return None


def _chain(node: ast.AST) -> list[str] | None:
    """a.b.c as ["a", "b", "c"]; None when it does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


class _Finder(ast.NodeVisitor):
    """Every use of a private part of LIBRARIES in one module, as (line, the private name, the code using it)."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str, str]] = []
        self.bound: dict[str, str] = {}  # a name bound to a library's module or to something from it -> its path

    def _check(self, node: ast.AST, dotted: str, code: str) -> None:
        if (private := _first_private(dotted)) is not None:
            self.found.append((node.lineno, private, code))

    def _resolved(self, node: ast.AST) -> str | None:
        """The library path an attribute chain or name stands for (tf.config -> tensorflow.config), else None."""
        chain = _chain(node)
        return ".".join([self.bound[chain[0]], *chain[1:]]) if chain and chain[0] in self.bound else None

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] in LIBRARIES:
                self.bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname \
                    else alias.name.split(".")[0]
                self._check(node, alias.name, f"import {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or (node.module or "").split(".")[0] not in LIBRARIES:
            return
        for alias in node.names:
            self.bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            self._check(node, f"{node.module}.{alias.name}", f"from {node.module} import {alias.name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if (dotted := self._resolved(node)) is not None:
            self._check(node, dotted, ast.unparse(node))  # the whole chain at once: not its inner attributes
        else:
            self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if self._resolved(node.func) is not None:
            for keyword in node.keywords:
                if keyword.arg and _private(keyword.arg):
                    self.found.append((node.lineno, keyword.arg, f"{ast.unparse(node.func)}({keyword.arg}=...)"))
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if any(self._resolved(base) is not None for base in node.bases):
            own = {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
            own |= {target.attr for sub in ast.walk(node) for target in _targets(sub) if _is_self_member(target)}
            for sub in ast.walk(node):
                if _is_self_member(sub) and _private(sub.attr) and sub.attr not in own:
                    self.found.append((sub.lineno, sub.attr, f"self.{sub.attr}, from {node.name}'s library base"))
        self.generic_visit(node)


def _is_self_member(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return [leaf for target in node.targets for leaf in ast.walk(target)]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return [node.target]
    return []


def private_uses(source: str) -> list[tuple[int, str, str]]:
    finder = _Finder()
    finder.visit(ast.parse(source))
    return finder.found


def test_trainer_uses_no_private_keras_tensorflow_or_ray_api_but_the_allowed_ones():
    found = {}
    for path in sorted((REPO / "trainer").rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        for line, name, what in private_uses(path.read_text()):
            found.setdefault((relative, name), []).append(f"{relative}:{line}: {what}")
    unexpected = [use for key, uses in found.items() if key not in ALLOWED for use in uses]
    assert unexpected == [], "private API (use the public one, or wrap it in one place with a test and list it " \
                             "in ALLOWED):\n" + "\n".join(unexpected)
    assert sorted(ALLOWED) == sorted(key for key in found if key in ALLOWED)  # none listed that is gone


@pytest.mark.parametrize("source, private", [
    ("import ray\nray._private.worker._worker_logs_enabled = False", "ray._private"),
    ("import ray._private.worker", "ray._private"),
    ("from keras.src.callbacks import monitor_callback", "keras.src"),
    ("import keras\nkeras.src.ops.less(1, 2)", "keras.src"),
    ("import tensorflow as tf\ntf._api.v2", "tensorflow._api"),
    ("from tensorflow.python.util import _pywrap_util_port", "tensorflow.python"),
    ("from tensorflow.python import pywrap_tfe", "tensorflow.python"),
    ("import ray\nray.init(_node_ip_address='127.0.0.1')", "_node_ip_address"),
    ("import keras\nclass Stop(keras.callbacks.EarlyStopping):\n"
     "    def on_epoch_end(self, epoch, logs=None):\n        return self._is_improvement(1.0, 2.0)", "_is_improvement"),
    ("from keras.callbacks import EarlyStopping\nclass Stop(EarlyStopping):\n"
     "    def stop(self):\n        self._set_monitor_op()", "_set_monitor_op"),
])
def test_each_kind_of_private_use_is_found(source, private):
    assert [name for _, name, _ in private_uses(source)] == [private]


@pytest.mark.parametrize("source", [
    "import keras\nkeras.callbacks.EarlyStopping(monitor='val_loss').monitor",
    "import keras\nclass Stop(keras.callbacks.EarlyStopping):\n"
    "    def __init__(self):\n        super().__init__()\n        self._resumed = None\n"
    "    def on_train_begin(self, logs=None):\n        return self._resumed, self._own()\n"
    "    def _own(self):\n        return self.__class__",
    "class Plain:\n    def go(self):\n        return self._anything",  # not a library's class
    "from . import _local\n_local._helper()",  # trainer's own private names are its own business
])
def test_public_use_and_own_private_members_are_not_found(source):
    assert private_uses(source) == []


def test_ray_notices_are_silenced_by_the_one_switch_the_run_uses():
    """The one private Ray switch (distributed._show_ray_notices): a notice such as "(raylet) A worker died"
    goes through Ray's printing of worker output, which prints nothing while the run drives Ray and prints it
    again afterwards. Fails when Ray renames the switch or prints its notices another way."""
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'cryptotrain[ray]'")
    from trainer.run.distributed import _show_ray_notices

    def printed() -> str:
        tag = secrets.token_hex(8).translate(str.maketrans("0123456789", "ghijklmnop"))  # no digit: Ray's
        line = f"A worker died or was killed while executing a task ({tag})"  # deduplication tells lines apart
        with redirect_stdout(io.StringIO()) as out:
            ray._private.worker.print_to_stdstream({"lines": [line], "pid": "raylet", "is_err": False},
                                                   ignore_prefix=False)
        return out.getvalue()

    try:
        _show_ray_notices(False)
        assert printed() == ""
    finally:
        _show_ray_notices(True)
    assert "A worker died" in printed()


def test_whether_onednn_runs_is_still_told_by_tensorflow():
    """The one private TensorFlow call (device.onednn_runs): fails when TensorFlow moves or renames it."""
    from trainer.model.device import onednn_runs

    assert isinstance(onednn_runs(), bool)


def test_ray_init_still_takes_the_node_address_a_run_gives_its_own_ray():
    """The one hidden ray.init option (distributed: a Ray of the run's own on 127.0.0.1): fails when Ray stops
    reading it, before a user's run would stop on 'Unknown keyword argument(s)'."""
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'cryptotrain[ray]'")
    assert 'kwargs.pop("_node_ip_address"' in inspect.getsource(ray.init)
