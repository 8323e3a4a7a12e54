"""The placement page in a real browser: Chromium driven by Playwright. The page lays itself out
in the browser (dagre, inlined), so what it draws is only seen there.

Skipped, with the reason, where Playwright is not installed or no Chromium starts: the system's
(`chromium`, `chromium-browser`, `google-chrome`, or the one $ORTPREP_CHROMIUM names) is tried
first, then Playwright's own download (`playwright install chromium`).

The screenshots of three real models (a CNN, a transformer, a model with If) are written to
tmp_path; with ORTPREP_UPDATE_SCREENSHOTS=1 they replace those in docs/.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from conftest import ROOT, SAMPLES

WHEELS = ROOT / ".wheels"
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed (pip install playwright; the dev extra has it)")
    found = os.environ.get("ORTPREP_CHROMIUM") or next(
        (shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)), None)
    manager = sync_playwright().start()
    try:
        launched = manager.chromium.launch(executable_path=found, args=["--no-sandbox"])
    except Error as exc:
        manager.stop()
        reason = str(exc).strip().splitlines()[0]
        pytest.skip(f"no Chromium starts here ({found or 'no system Chromium; Playwright own download'}): {reason}")
    yield launched
    launched.close()
    manager.stop()


def open_page(browser, path: Path, width: int = 1400, height: int = 900):
    page = browser.new_page(viewport={"width": width, "height": height})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(path.as_uri())
    page.wait_for_function("window.ortprepLayout", timeout=120_000)
    assert not errors, errors
    return page


def drawn(page) -> dict[str, dict]:
    """Each node drawn as itself or in a chain: name -> {classes, chain}."""
    return page.evaluate("""() => {var out={};document.querySelectorAll('#graph g.node').forEach(function(g){
        var names=g.dataset.node?[g.dataset.node]:JSON.parse(g.dataset.nodes);
        names.forEach(function(n){out[n]={classes:g.getAttribute('class').split(' '),"""
        """chain:!g.dataset.node};});});return out;}""")


def highlighted(page) -> list[str]:
    return page.evaluate("""() => Array.prototype.map.call(document.querySelectorAll('#graph g.node.highlight'),
        function(g){return g.dataset.node||g.dataset.nodes;})""")


def causes_of(page) -> list[dict]:
    return page.evaluate(
        """() => Array.prototype.map.call(document.querySelectorAll('.target-info[data-section="0"] li.cause'),
        function(li){return {number:li.dataset.cause,count:+li.dataset.count,code:li.dataset.code,"""
        """nodes:JSON.parse(li.dataset.nodes)};})"""
    )


def check(model: Path, page: Path, eps: list[str]) -> dict:
    import ortprep

    result = ortprep.run_step("check", model, eps=eps, html=page)
    return result.to_record()


def test_control_flow_page_draws_bodies_fallbacks_and_causes(browser, tmp_path):
    """control_flow.onnx on QNN: the Loop and both nodes of its body fall back. Every node of the
    model is drawn once, the fallbacks with the CPU class; the If's branches are boxes inside the
    If's box, their nodes inside them; a copy edge joins EP and CPU; the findings are one entry per
    cause with its node count, and clicking one highlights exactly its nodes; a click closes a body."""
    html_path = tmp_path / "control_flow.html"
    record = check(SAMPLES / "control_flow.onnx", html_path, ["qnn"])
    fallback = set(record["results"][0]["fallback_nodes"])
    assert fallback == {"repeat", "body_cond", "body_add"}
    page = open_page(browser, html_path)
    nodes = drawn(page)
    assert set(nodes) == {"choose", "repeat", "then_add", "else_mul", "body_cond", "body_add"}
    assert {n for n, d in nodes.items() if "cpu" in d["classes"]} == fallback
    assert {n for n, d in nodes.items() if "ep" in d["classes"]} == {"choose", "then_add", "else_mul"}
    inside = page.evaluate(
        """() => {var out={};document.querySelectorAll('g.node.container > g.body').forEach(function(b){
        var frame=b.querySelector(':scope > rect').getBoundingClientRect();
        b.querySelectorAll('g.node').forEach(function(g){var r=g.querySelector('rect').getBoundingClientRect();
          out[g.dataset.node]={container:b.parentNode.dataset.node,body:b.dataset.attribute,
            within:r.left>=frame.left&&r.right<=frame.right&&r.top>=frame.top&&r.bottom<=frame.bottom};});});"""
        """return out;}"""
    )
    assert inside == {"then_add": {"container": "choose", "body": "then_branch", "within": True},
                      "else_mul": {"container": "choose", "body": "else_branch", "within": True},
                      "body_cond": {"container": "repeat", "body": "body", "within": True},
                      "body_add": {"container": "repeat", "body": "body", "within": True}}
    assert page.locator("#graph path.edge.copy").count() >= 1  # choose (EP) -> repeat (CPU)
    causes = causes_of(page)
    assert [c["count"] for c in causes] == [len(c["nodes"]) for c in causes]
    by_node = [c for c in causes if c["nodes"]]
    assert sorted(n for c in by_node for n in c["nodes"]) == sorted(fallback)
    assert len({tuple(c["nodes"]) for c in by_node}) == len(by_node)
    for number, cause in enumerate(causes):
        if cause["nodes"]:
            page.locator(f'.target-info[data-section="0"] li.cause[data-cause="{number}"]').click()
            assert sorted(highlighted(page)) == sorted(cause["nodes"])
    page.locator('.target-info[data-section="0"] li.cause.active').click()  # a second click clears it
    assert highlighted(page) == []
    # closes the body
    page.locator('#graph g.node.container[data-node="repeat"] > rect.frame').click(position={"x": 4, "y": 4})
    nodes = drawn(page)
    assert "body_add" not in nodes and "repeat" in nodes
    assert "inside" in page.locator('#graph g.node[data-node="repeat"] text').first.text_content()


def transformer_like(blocks: int) -> tuple:
    """A graph of ``blocks`` attention-like blocks (20 nodes each, branching: q/k/v, residuals),
    as a check record's graph view, and a placement with a fallback Softmax in every 7th block."""
    nodes, edges, placement = [], [], {}

    def add(op: str, *parents: int) -> int:
        nodes.append({"name": f"b{len(nodes) // 20}_{op.lower()}{len(nodes) % 20}", "op_type": op})
        edges.extend([parent, len(nodes) - 1] for parent in parents)
        return len(nodes) - 1

    x = add("Identity")
    for block in range(blocks):
        mean = add("ReduceMean", x)
        sub = add("Sub", x, mean)
        norm = add("Div", sub, add("Sqrt", add("ReduceMean", add("Mul", sub, sub))))
        q, k, v = (add("Reshape", add("MatMul", norm)) for _ in range(3))
        scores = add("Softmax", add("Div", add("MatMul", q, add("Transpose", k))))
        attention = add("MatMul", scores, v)
        out = add("Add", x, add("MatMul", add("Reshape", attention)))
        x = add("Add", out, add("Relu", out))
        if block % 7 == 3:
            placement[nodes[scores]["name"]] = "cpu"
    placement = {n["name"]: placement.get(n["name"], "ep") for n in nodes}
    return {"nodes": nodes, "edges": edges}, placement


@pytest.mark.parametrize("blocks", [50, 500])  # 1,000 and 10,000 nodes
def test_large_graphs_are_drawn_whole_and_searchable(browser, tmp_path, blocks):
    from ortprep.render.html import render_page

    view, placement = transformer_like(blocks)
    count = len(view["nodes"])
    path = tmp_path / f"large{count}.html"
    path.write_text(render_page(f"large{count}.onnx", view, [{"name": "npu", "ep": "qnn", "placement": placement,
                                                              "actual": None, "findings": [], "summary": {}}]))
    page = open_page(browser, path)
    timing = page.evaluate("window.ortprepLayout")
    print(f"\n{count} nodes: {timing}")
    nodes = drawn(page)
    assert set(nodes) == set(placement)  # every node, alone or in its chain
    assert {n for n, d in nodes.items() if "cpu" in d["classes"]} == {n for n, p in placement.items() if p == "cpu"}
    assert timing["layout_ms"] < 30_000
    target = view["nodes"][count // 2]["name"]
    page.fill("#search", target)
    page.press("#search", "Enter")
    assert page.evaluate(
        "() => Array.prototype.map.call(document.querySelectorAll('#graph g.node.hit'), g => g.dataset.node)"
    ) == [target]


REAL_MODELS = {
    # name: (wheel glob, file in the wheel, EPs, what it is)
    "cnn": ("rapidocr-3.10.0-*.whl", "rapidocr/models/PP-OCRv6_det_small.onnx", ["nnapi", "coreml"]),
    "transformer": ("rapidocr-3.10.0-*.whl", "rapidocr/models/PP-OCRv6_rec_small.onnx", ["nnapi", "coreml"]),
    "control-flow": ("silero_vad-6.2.1-*.whl", "silero_vad/data/silero_vad.onnx", ["nnapi", "coreml"]),
}


@pytest.mark.parametrize("kind", sorted(REAL_MODELS))
def test_real_models_pages_and_screenshots(browser, tmp_path, kind):
    """PP-OCRv6's text detector (a CNN), its recogniser (SVTR: attention blocks), and Silero VAD 5
    (its whole network inside nested If branches), on NNAPI: every fallback node is drawn with the
    CPU class (alone or in a chain of CPU nodes), the largest cause highlights exactly its nodes;
    a screenshot of each page."""
    pattern, member, eps = REAL_MODELS[kind]
    found = sorted(WHEELS.glob(pattern))
    if not found:
        pytest.skip(f"{pattern} is not in .wheels/ (make install downloads it)")
    with zipfile.ZipFile(found[0]) as wheel:
        wheel.extract(member, tmp_path)
    html_path = tmp_path / f"{kind}.html"
    record = check(tmp_path / member, html_path, eps)
    fallback = set(record["results"][0]["fallback_nodes"])
    assert fallback, "the screenshot should show a fallback"
    page = open_page(browser, html_path)
    nodes = drawn(page)
    assert fallback <= set(nodes)
    assert all("cpu" in nodes[n]["classes"] for n in fallback)
    if kind == "control-flow":
        # fallbacks drawn inside If bodies
        assert page.locator("#graph g.node.container.open g.body g.node.cpu").count() > 0
    causes = [c for c in causes_of(page) if c["nodes"]]
    largest = max(causes, key=lambda c: c["count"])
    number = largest["number"]
    timing = page.evaluate("window.ortprepLayout")
    print(f"\n{kind}: {timing}")
    page.locator(f'.target-info[data-section="0"] li.cause[data-cause="{number}"]').click()
    assert sorted(highlighted(page)) == sorted(largest["nodes"])
    page = open_page(browser, html_path)  # the screenshot: the page as it opens
    shot = (DOCS if os.environ.get("ORTPREP_UPDATE_SCREENSHOTS") else tmp_path) / f"html-placement-{kind}.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
