"""notebooks/colab.ipynb, run headless as a Colab user runs it, outside Colab: its parameters cell set to the
quickstart (one epoch, fewer rows), the checkout installed by the notebook's own install cell (into a directory of
its own, not over the suite's), the Drive and secrets cells stepping aside, a push to the Hub stand-in; then the run
cell again, as after a runtime's death."""
from __future__ import annotations

import os
import re

import pytest

from tests.conftest import REPO
from tests.hub_server import serve_hub

pytestmark = [pytest.mark.train, pytest.mark.processes]  # a Jupyter kernel, and the `cryptotrain` commands it runs

NOTEBOOK = REPO / "notebooks" / "colab.ipynb"
TOKEN = "hf_colab_test_token"


def _text(cell) -> str:
    """What a cell printed and displayed, as one text, without terminal colours."""
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts += [str(value) for value in output.get("data", {}).values()]
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", "".join(parts))


def test_the_colab_notebook_runs_headless_then_its_run_cell_again(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="nbformat is in the dev extra")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is in the dev extra")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    parameters = next(cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", []))
    site, runs = tmp_path / "site", tmp_path / "cryptotrain"
    parameters.source = "\n".join([
        f'INSTALL = "--no-deps --target {site} {REPO}"',  # the checkout, as pip installs it, beside the suite's
        'CONFIG = "quickstart"', 'ARGS = "--pack auto"', 'DATA = "--set data.max_rows=600 --set train.epochs=1"',
        'HUB_REPO = "tester/colab"', 'DRIVE_DIR = "/nonexistent"', f'LOCAL_DIR = "{runs}"'])
    hf_home = tmp_path / "hf-home"
    hf_home.mkdir()
    (hf_home / ".agent_harnesses.json").write_text('{"standardEnvVars": [], "harnesses": {}}')
    with serve_hub(monkeypatch, TOKEN, tmp_path / "hf-cache") as hub:
        env = {**os.environ, "PYTHONPATH": str(site), "PATH": f"{site / 'bin'}{os.pathsep}{os.environ['PATH']}",
               "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1",
               "HF_HOME": str(hf_home), "TF_CPP_MIN_LOG_LEVEL": "3"}
        client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                         resources={"metadata": {"path": str(tmp_path)}})
        with client.setup_kernel(env=env):
            for index, cell in enumerate(notebook.cells):
                client.execute_cell(cell, index)
            run = next(i for i, cell in enumerate(notebook.cells)
                       if cell.cell_type == "code" and "!cryptotrain run" in cell.source)
            first = _text(notebook.cells[run])
            client.execute_cell(notebook.cells[run], run)  # Run all again, after the runtime died: nothing to train
            again = _text(notebook.cells[run])
        pushed = hub.files("tester/colab")
    nbformat.write(notebook, tmp_path / "executed.ipynb")  # to look at when this fails
    outputs = {index: _text(cell) for index, cell in enumerate(notebook.cells) if cell.cell_type == "code"}
    said = "\n".join(outputs.values())
    assert (site / "trainer" / "bundled_configs" / "quickstart.yaml").is_file()  # installed from the checkout
    assert "packing (run --pack" in said  # doctor
    assert "4/4 jobs done" in first and "4/4 jobs done" in again
    assert "━" not in first  # plain lines in a notebook, no live bars
    assert "done in" in first and "done in" not in again  # nothing trained again
    assert said.count("done") >= 4 and "<iframe srcdoc=" in said  # status; the report shown in the notebook
    assert sorted(path.split("/")[0] for path in pushed if path.endswith("/model.keras")) == ["BTCUSDT", "BTCUSDT",
                                                                                              "ETHUSDT", "ETHUSDT"]
    assert "1 finished" not in said and "4 finished jobs" in said and "expected_high" in said  # predict's forecast
    assert TOKEN not in said
