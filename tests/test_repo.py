"""The CI gate of a model repository: config, gates, JUnit/Markdown/HTML, baselines and diffs,
shards and merges, init. Real models, real check (and load on the QNN simulator for init)."""

from __future__ import annotations

import html as html_lib
import json
import re
import shutil
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import models
from cli_helpers import invoke
from conftest import SAMPLES


def mlp(middle: str = "Relu", seed: int = 0) -> onnx.ModelProto:
    """x -> MatMul -> MIDDLE -> MatMul, static shapes. QNN takes Relu, not Erf."""
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"),
         helper.make_node(middle, ["h"], ["a"], name="act"),
         helper.make_node("MatMul", ["a", "W2"], ["y"], name="fc2")],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "W1"),
         numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W2")])
    return models.make(graph)


CONFIG = """output_dir = "build"

[[models]]
path = "models/*.onnx"

[targets.cpu]
ep = "cpu"

[targets.npu]
ep = "qnn"
min_node_share = {share}

[[steps]]
run = "check"
"""


def repository(tmp_path: Path, share: float = 0.95) -> Path:
    folder = tmp_path / "repo"
    (folder / "models").mkdir(parents=True)
    onnx.save_model(mlp("Relu", 1), str(folder / "models" / "relu_mlp.onnx"))
    onnx.save_model(mlp("Erf", 2), str(folder / "models" / "erf_mlp.onnx"))
    onnx.save_model(mlp("Sigmoid", 3), str(folder / "models" / "sigmoid_mlp.onnx"))
    (folder / "ortprep.toml").write_text(CONFIG.format(share=share))
    return folder


def test_model_repository_gate(tmp_path):
    folder = repository(tmp_path)
    junit, markdown = tmp_path / "junit.xml", tmp_path / "summary.md"
    result = invoke("run", folder, "--junit", junit, "--markdown", markdown, "--report", tmp_path / "report.json")
    assert result.exit_code == 1, result.stdout
    suites = ElementTree.parse(junit).getroot()
    cases = suites.findall(".//testcase")
    assert len(cases) == 6  # 3 models x 2 targets x 1 step
    failed = [c for c in cases if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["models/erf_mlp.onnx :: 1. check :: npu"]
    assert "min_node_share" in failed[0].find("failure").get("message")
    text = markdown.read_text()
    assert "`models/erf_mlp.onnx` | npu | gate min_node_share (check)" in text
    assert "66.7% of the nodes on the EP, below 95% (CPU: act)" in text
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["schema"] == "ortprep.run/2" and report["kind"] == "repository"
    assert report["summary"] == {"pairs": 6, "passed": 5, "failed": 1, "errors": 0}
    # the gate relaxed: the same repository passes
    (folder / "ortprep.toml").write_text(CONFIG.format(share=0.5))
    assert invoke("run", folder).exit_code == 0


def test_a_target_names_its_device(tmp_path):
    """device = on a target reaches every step of it: the check record names the SoC it chose."""
    folder = repository(tmp_path)
    text = (folder / "ortprep.toml").read_text().replace('ep = "qnn"\n', 'ep = "qnn"\ndevice = "sm8650"\n')
    (folder / "ortprep.toml").write_text(text)
    report = invoke("run", folder, "--json").json()
    npu = [run for run in report["runs"] if run["target"] == "npu"]
    devices = {step["report"]["results"][0]["device"]["name"] for run in npu for step in run["steps"]}
    assert devices == {"8gen3"}
    assert all("device" not in step["report"]["results"][0] for run in report["runs"] if run["target"] == "cpu"
               for step in run["steps"])


def test_pyproject_table_and_github_outputs(tmp_path):
    folder = repository(tmp_path)
    text = (folder / "ortprep.toml").read_text()
    (folder / "ortprep.toml").unlink()
    body = re.sub(r"^\[(\[?)", lambda m: f"[{m.group(1)}tool.ortprep.", text, flags=re.M)
    (folder / "pyproject.toml").write_text('[project]\nname = "zoo"\n\n[tool.ortprep]\n' + body)
    summary = tmp_path / "step_summary.md"
    summary.write_text("earlier content\n")
    result = invoke(
        "run", folder / "pyproject.toml", env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    )
    assert result.exit_code == 1
    assert "::error file=models/erf_mlp.onnx,title=ortprep npu%3A gate min_node_share (check)::" in result.stdout
    appended = summary.read_text()
    assert appended.startswith("earlier content\n") and "## ortprep: failed (5 of 6" in appended


@pytest.mark.parametrize(
    "edit, key, line",
    [
        ('[targets.npu]\nep = "qnn"\nmin_node_sharez = 0.5\n', "targets.npu.min_node_sharez: unknown key", 11),
        ('[targets.npu]\nep = "qnn"\nmin_node_share = "high"\n', "targets.npu.min_node_share: must be a number", 11),
        ('[targets.npu]\nep = "qnn"\nmax_partitions = 1.5\n', "targets.npu.max_partitions: must be an integer", 11),
        ('[targets.npu]\nep = "qnn"\ndevice = "8gen9"\n', "targets.npu.device: unknown qnn device '8gen9'", 11),
        (
            '[targets.npu]\nep = "openvino-cpu"\ndevice = "8gen3"\n',
            "targets.npu.device: --device names a device of qnn",
            11,
        ),
    ],
)
def test_config_errors_name_key_and_line(tmp_path, edit, key, line):
    folder = repository(tmp_path)
    text = (folder / "ortprep.toml").read_text()
    text = re.sub(r'\[targets\.npu\]\nep = "qnn"\nmin_node_share = 0.95\n', edit, text)
    (folder / "ortprep.toml").write_text(text)
    result = invoke("run", folder, "--json")
    assert result.exit_code == 2
    assert f"ortprep.toml:{line}: {key}" in result.stderr
    assert json.loads(result.stdout)["exit_code"] == 2
    assert not (folder / "build").exists()  # nothing ran


def test_glob_matching_nothing(tmp_path):
    folder = repository(tmp_path)
    (folder / "ortprep.toml").write_text(CONFIG.format(share=0.5).replace("models/*.onnx", "nets/*.onnx"))
    result = invoke("run", folder)
    assert result.exit_code == 2
    assert "ortprep.toml:4: models.path: 'nets/*.onnx' matches no file" in result.stderr


def test_ignore_needs_a_reason_and_a_known_code(tmp_path):
    folder = repository(tmp_path)
    base = CONFIG.format(share=0.5)
    (folder / "ortprep.toml").write_text(base + '\n[ignore]\nEP001 = ""\n')
    assert "ignore.EP001: needs a written reason" in invoke("run", folder).stderr
    (folder / "ortprep.toml").write_text(base + '\n[ignore]\nXYZ999 = "no such code"\n')
    assert "ignore.XYZ999: unknown finding code" in invoke("run", folder).stderr


def test_ignored_code_does_not_fail_a_step(tmp_path):
    folder = repository(tmp_path)
    strict = 'fail_on = "warning"\n' + CONFIG.format(share=0.0)
    (folder / "ortprep.toml").write_text(strict)
    record = invoke("run", folder, "--json").json()
    erf = next(r for r in record["runs"] if r["model"] == "models/erf_mlp.onnx" and r["target"] == "npu")
    assert erf["steps"][0]["status"] == "failed"  # EP001 (warning): Erf is not on QNN
    assert "EP001" in {f["code"] for f in erf["steps"][0]["report"]["findings"]}
    reasons = ('\n[ignore]\nEP001 = "Erf runs on the CPU on purpose"\nEP006 = "the CPU island is accepted with EP001"\n'
               'QNN001 = "float models are fine on the HTP simulator here"\n')
    (folder / "ortprep.toml").write_text(strict + reasons)
    record = invoke("run", folder, "--json").json()
    assert record["passed"] is True


def test_baseline_and_diff_name_the_node_that_moved(tmp_path):
    folder = repository(tmp_path, share=0.5)
    base = tmp_path / "base.json"
    assert invoke("run", folder, "--report", base).exit_code == 0
    # a change: the Relu model's activation becomes Erf, which QNN does not take
    onnx.save_model(mlp("Erf", 1), str(folder / "models" / "relu_mlp.onnx"))
    new = tmp_path / "new.json"
    result = invoke("run", folder, "--baseline", base, "--report", new, "--json")
    assert result.exit_code == 1
    regressions = result.json()["regressions"]
    moved = [r for r in regressions if r["kind"] == "fallback"]
    assert len(moved) == 1 and moved[0]["model"] == "models/relu_mlp.onnx" and moved[0]["target"] == "npu"
    assert moved[0]["nodes"][0]["node"] == "act" and moved[0]["nodes"][0]["reason"].startswith("EP001")
    assert any(r["kind"] == "coverage" for r in regressions)
    diff = invoke("diff", base, new, "--json")
    assert diff.exit_code == 1
    moves = diff.json()["moves"]
    assert moves == [{"model": "models/relu_mlp.onnx", "target": "npu", "node": "act", "from": "qnn", "to": "cpu",
                      "reason": moves[0]["reason"]}]
    assert "Erf" in moves[0]["reason"]
    human = invoke("diff", base, new)
    assert "act" in human.stdout and "qnn -> cpu" in human.stdout


def test_shards_merge_to_the_unsharded_verdict(tmp_path):
    folder = tmp_path / "zoo"
    (folder / "models").mkdir(parents=True)
    for index in range(10):
        onnx.save_model(mlp("Erf" if index == 3 else "Relu", index), str(folder / "models" / f"net{index:02d}.onnx"))
    (folder / "ortprep.toml").write_text(CONFIG.format(share=0.9).replace('[targets.cpu]\nep = "cpu"\n\n', ""))
    whole = invoke("run", folder, "--json", "-j", "2")
    assert whole.exit_code == 1
    reports = []
    for shard in ("1/2", "2/2"):
        path = tmp_path / f"shard{shard[0]}.json"
        invoke("run", folder, "--shard", shard, "--report", path)
        reports.append(path)
    counts = [len(json.loads(p.read_text())["runs"]) for p in reports]
    assert sum(counts) == 10 and all(counts)
    merged = invoke("merge", *reports, "--json", "--junit", tmp_path / "merged.xml")
    document = merged.json()
    assert sorted(r["model"] for r in document["runs"]) == [f"models/net{i:02d}.onnx" for i in range(10)]
    assert document["passed"] == whole.json()["passed"] is False
    assert merged.exit_code == whole.exit_code == 1
    assert [r["passed"] for r in document["runs"]] == [r["passed"] for r in whole.json()["runs"]]
    assert len(ElementTree.parse(tmp_path / "merged.xml").getroot().findall(".//testcase")) == 10
    # the shards ran without --html: merge --html still draws every model, from its file
    pages = tmp_path / "pages"
    assert invoke("merge", *reports, "--html", pages).exit_code == 1
    assert len(list(pages.iterdir())) == 11  # and index.html, the run's report page
    assert "act" in page_names((pages / "models__net03.html").read_text())
    # the reports stay as written
    assert "graph" not in json.loads(reports[0].read_text())["runs"][0]["steps"][0]["report"]
    # a pair in two reports is refused
    assert invoke("merge", reports[0], reports[0]).exit_code == 2


def test_the_python_api_writes_the_check_page(tmp_path):
    """The page is written by the pipeline, so the library gets it as the command line does."""
    import ortprep

    page = tmp_path / "page.html"
    result = ortprep.run_step("check", SAMPLES / "control_flow.onnx", eps=["qnn"], html=page)
    assert result.artifacts == [str(page)] and page.is_file()
    assert '<svg id="graph"' in page.read_text() and page_names(page.read_text())


def page_data(text: str) -> dict:
    """The JSON a placement page carries (what its script draws)."""
    return json.loads(re.search(r'<script type="application/json" id="ortprep-data">(.*?)</script>', text, re.S)
                      .group(1).replace("<\\/", "</"))


def page_names(text: str) -> set[str]:
    def walk(view):
        for node in view["nodes"]:
            yield node["name"]
            for body in node.get("bodies", []):
                yield from walk(body)
    return set(walk(page_data(text)["graph"]))


def test_html_page_names_every_node_and_marks_the_fallbacks(tmp_path):
    """The page's data holds every node, those in If/Loop bodies too, each target's placement of
    each is the JSON's fallback list, and the findings are grouped by cause (the drawing itself is
    tested in a browser: tests/test_html_browser.py)."""
    page = tmp_path / "page.html"
    result = invoke("check", SAMPLES / "control_flow.onnx", "--ep", "qnn", "--ep", "dml", "--html", page, "--json")
    record = result.json()
    text = page.read_text()
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text  # self-contained
    assert "dagre" in text and "sourceMappingURL" not in text  # the layout library is inlined, nothing fetched
    data = page_data(text)
    every = {"choose", "repeat", "then_add", "else_mul", "body_cond", "body_add"}
    assert page_names(text) == every
    bodies = {n["name"]: [b["attribute"] for b in n.get("bodies", [])] for n in data["graph"]["nodes"]}
    assert bodies == {"choose": ["else_branch", "then_branch"], "repeat": ["body"]}
    for index, result_ in enumerate(record["results"]):
        placement = data["targets"][index]["placement"]
        assert set(placement) == every
        assert {n for n, where in placement.items() if where == "cpu"} == set(result_["fallback_nodes"])
        panel = re.search(
            rf'<div class="target-info" data-section="{index}">.*?</div>\s*(?=<div class="target-info"|</aside>)',
            text,
            re.S,
        ).group(0)
        assert set(re.findall(r'<li><a data-find="([^"]*)"', panel)) == set(result_["fallback_nodes"])
        # one entry per cause; each names its nodes, and together they name every finding's node
        findings = [f for f in record["findings"] if f["target"] in (None, result_["ep"])]
        causes = re.findall(r'<li class="cause [^"]*" data-cause="\d+" data-count="(\d+)" data-code="([^"]*)" '
                            r'data-nodes="([^"]*)"', panel)
        named = [json.loads(html_lib.unescape(nodes)) for _count, _code, nodes in causes]
        assert [int(count) for count, _code, _nodes in causes] == [len(n) for n in named]
        assert sorted(n for nodes in named for n in nodes) == sorted(f["node"] for f in findings if f["node"])
        assert len(causes) == len({(f["code"], f["message"].split(") ", 1)[-1] if f["node"] else f["message"])
                                   for f in findings})
    assert any(r["fallback_nodes"] for r in record["results"]), "the sample should have a fallback on one target"


def test_findings_are_grouped_by_cause():
    from ortprep.render.html import causes

    def finding(node, op, reason, code="EP001"):
        return {"code": code, "severity": "warning", "node": node, "op_type": op, "fix": f"replace {op}",
                "message": f"node '{node}' (ai.onnx:{op}) is not supported by qnn: {reason}; it falls back to the CPU"}

    found = causes(
        [finding(f"erf{i}", "Erf", "qnn has no ai.onnx:Erf") for i in range(13)]
        + [finding("n1", "Add", "QNN needs a static shape"), finding("n2", "Conv", "QNN needs a static shape")]
        + [
            {
                "code": "EP006",
                "severity": "warning",
                "node": None,
                "op_type": None,
                "fix": None,
                "message": "qnn: 15 of 20 nodes fall back",
            }
        ]
    )
    assert [(c["code"], len(c["nodes"]), c["findings"]) for c in found] == [
        ("EP001", 13, 13),
        ("EP001", 2, 2),
        ("EP006", 0, 1),
    ]
    assert found[0]["text"] == "is not supported by qnn: qnn has no ai.onnx:Erf; it falls back to the CPU"
    assert found[1]["ops"] == {"Add": 1, "Conv": 1} and found[1]["fixes"] == ["replace Add", "replace Conv"]


def test_html_for_a_run_and_a_large_graph(tmp_path):
    folder = repository(tmp_path, share=0.5)
    out = tmp_path / "pages"
    assert invoke("run", folder, "--html", out).exit_code == 0
    pages = sorted(p.name for p in out.iterdir())
    assert pages == ["index.html", "models__erf_mlp.html", "models__relu_mlp.html", "models__sigmoid_mlp.html"]
    assert "act" in page_names((out / "models__erf_mlp.html").read_text())
    # the report page: models x targets, each model linked to its placement page
    document = invoke("run", folder, "--json").json()
    index = (out / "index.html").read_text()
    for run in document["runs"]:
        cell = re.search(
            rf'<td class="(pass|fail)" data-model="{re.escape(run["model"])}" data-target="{run["target"]}">(.*?)</td>',
            index,
            re.S,
        )
        assert cell and cell.group(1) == ("pass" if run["passed"] else "fail")
        check = next(
            r for s in run["steps"] if s["run"] == "check" for r in s["report"]["results"] if r["ep"] == run["ep"]
        )
        assert check["verdict"] in cell.group(2) and f"{check['node_share']:.1%}" in cell.group(2)
    for page in pages[1:]:
        assert f'<a href="{page}">' in index
    # 5,000 nodes: every name is in the page's data, and the page stays small (the browser test draws it)
    from ortprep.eps.partition import graph_view
    from ortprep.render.html import render_page

    chain = helper.make_graph(
        [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"relu{i}") for i in range(5000)],
        "chain",
        [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("t5000", TensorProto.FLOAT, [1, 4])],
    )
    placement = {f"relu{i}": ("cpu" if 2000 <= i < 2003 else "ep") for i in range(5000)}
    html_text = render_page("chain.onnx", graph_view(chain), [{"name": "npu", "ep": "qnn", "placement": placement,
                                                              "actual": None, "findings": [], "summary": {}}])
    assert page_names(html_text) == set(placement)
    assert len(html_text) < 2_000_000


def test_run_page_draws_the_sensitivity_of_a_quantized_model():
    """Per-tensor noise bars from the quantize search's ranking, the tensors whose nodes were kept
    in float marked, the kept nodes listed with their reason; load's status and cosine in the cell."""
    from ortprep.render.run_page import run_page

    quantize = {"verify": {"cosine": 0.9931, "passed": True, "norm_ratio": 1.01}, "quantized_ops": 12,
                "excluded_nodes": [{"name": "head", "op_type": "MatMul", "reason": "the search: noise 0.4"}],
                "search": {"ranked": [{"pass": 1, "tensor": "logits", "nodes": ["head"], "noise": 0.4},
                                      {"pass": 1, "tensor": "hidden", "nodes": ["mm1"], "noise": 0.1},
                                      {"pass": 1, "tensor": "embed", "nodes": ["gather"], "noise": 0.01}]}}
    load = {"results": [{"ep": "cpu", "status": "ok", "cosine": 0.99999}]}
    document = {"passed": True, "summary": {"pairs": 1, "passed": 1}, "config": "ortprep.toml", "runs": [
        {"model": "models/lm.onnx", "target": "cpu", "ep": "cpu", "passed": True, "gates": [],
         "steps": [{"run": "quantize", "name": "quantize", "status": "passed", "report": quantize},
                   {"run": "load", "name": "load", "status": "passed", "report": load}]}]}
    text = run_page(document, set())
    bars = re.findall(r'<g class="tensor( kept)?" data-tensor="([^"]*)">', text)
    assert bars == [(" kept", "logits"), ("", "hidden"), ("", "embed")]
    widths = [float(w) for w in re.findall(r'<rect class="bar[^"]*" x="\d+" y="\d+" width="([\d.]+)"', text)]
    assert widths[0] > widths[1] > widths[2]
    assert "<code>head</code> (MatMul): the search: noise 0.4" in text
    assert "load: ok, cosine 0.99999" in text and "quantize: cosine 0.99310, passed" in text
    assert "<a href" not in text  # no placement page was written for it


def test_init_then_run(tmp_path):
    folder = tmp_path / "fresh"
    (folder / "models").mkdir(parents=True)
    onnx.save_model(mlp("Relu", 5), str(folder / "models" / "a.onnx"))
    onnx.save_model(mlp("Sigmoid", 6), str(folder / "models" / "b.onnx"))
    created = invoke("init", folder)
    assert created.exit_code == 0 and (folder / "ortprep.toml").exists()
    text = (folder / "ortprep.toml").read_text()
    assert 'path = "models/*.onnx"' in text and "[targets.cpu]" in text and "# The gates." in text
    result = invoke("run", folder, "--json")
    assert result.exit_code == 0, result.stdout[-2000:]
    record = result.json()
    assert record["summary"]["pairs"] >= 2 and record["passed"]
    assert invoke("init", folder).exit_code == 2  # not over an existing config without --force
    shutil.rmtree(folder / "build", ignore_errors=True)


def test_placement_gates_and_the_precommit_hook(tmp_path):
    folder = repository(tmp_path, share=0.0)
    text = (folder / "ortprep.toml").read_text().replace(
        "min_node_share = 0.0",
        "min_node_share = 0.0\nmax_partitions = 1\nmax_fallback_nodes = 0\nno_cpu_island = true\nmin_mac_share = 0.5",
    )
    (folder / "ortprep.toml").write_text(text)
    record = invoke("run", folder, "--json").json()
    erf = next(r for r in record["runs"] if r["model"] == "models/erf_mlp.onnx" and r["target"] == "npu")
    gates = {g["gate"]: g for g in erf["gates"]}
    assert gates["max_partitions"]["value"] == 2 and not gates["max_partitions"]["passed"]
    assert gates["max_fallback_nodes"]["value"] == 1 and not gates["max_fallback_nodes"]["passed"]
    assert gates["no_cpu_island"]["value"] == ["act"] and not gates["no_cpu_island"]["passed"]
    assert gates["min_mac_share"]["passed"]  # both MatMuls are on the EP
    relu = next(r for r in record["runs"] if r["model"] == "models/relu_mlp.onnx" and r["target"] == "npu")
    assert all(g["passed"] for g in relu["gates"])
    # the pre-commit hook runs the config on the changed files only
    import ortprep

    assert invoke("hook", folder / "models" / "relu_mlp.onnx", "--config", folder).exit_code == 0
    assert invoke("hook", folder / "models" / "erf_mlp.onnx", "--config", folder).exit_code == 1
    document = ortprep.run_pipeline(folder)  # the Python API: the same document as --json
    assert document["summary"] == record["summary"]


def test_a_bad_step_in_the_third_target_stops_before_any_model_is_touched(tmp_path):
    """Every step is validated for every target before anything runs. compile takes its EP from the
    target: fine for qnn and openvino-cpu, refused for cpu, the third target. The refusal comes from
    validation (exit 2, file:line, the target named) before any output folder is made."""
    folder = tmp_path / "repo"
    (folder / "models").mkdir(parents=True)
    onnx.save_model(mlp("Relu", 7), str(folder / "models" / "a.onnx"))
    (folder / "ortprep.toml").write_text("""output_dir = "build"

[[models]]
path = "models/*.onnx"

[targets.a]
ep = "qnn"

[targets.b]
ep = "openvino-cpu"

[targets.c]
ep = "cpu"

[[steps]]
run = "check"

[[steps]]
run = "compile"
""")
    result = invoke("run", folder, "--json")
    assert result.exit_code == 2, result.stdout[-1000:]
    assert (
        "ortprep.toml:18: step 2 (compile): " in result.stderr
        and "target c" in result.stderr
        and "not cpu" in result.stderr
    )
    assert not (folder / "build").exists()
    # the first two targets alone are a valid config
    (folder / "ortprep.toml").write_text((folder / "ortprep.toml").read_text().replace('[targets.c]\nep = "cpu"\n', ""))
    from ortprep.config import load_repository

    assert [t.name for t in load_repository(folder).targets] == ["a", "b"]


def test_run_on_workers_leaves_no_process_and_no_file(tmp_path):
    """run -j 2 as a user runs it: every pair worker and the ORT worker beside each end with the
    run, and their logs with them."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    folder = repository(tmp_path)
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "ortprep", "run", str(folder), "-j", "2", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert done.returncode == 1 and json.loads(done.stdout)["summary"]["pairs"] == 6
    # (ONNX Runtime itself keeps $TMPDIR/.ses, its telemetry session id: not ortprep's)
    assert [p.name for p in temp.iterdir() if p.name != ".ses"] == []


def test_a_target_can_prove_its_verdicts(tmp_path):
    """prove = true on a target: its check steps build the real session (QNN's simulator here), so
    the pair's verdict and gates stand on the session, and the report shows the prediction beside."""
    pytest.importorskip("onnxruntime_qnn", reason="the QNN simulator comes with onnxruntime-qnn (make install adds it)")
    folder = repository(tmp_path, share=0.5)
    text = (folder / "ortprep.toml").read_text().replace('ep = "qnn"\n', 'ep = "qnn"\nprove = true\n')
    (folder / "ortprep.toml").write_text(text)
    record = invoke("run", folder, "--json").json()
    npu = [r for r in record["runs"] if r["target"] == "npu"]
    cpu = [r for r in record["runs"] if r["target"] == "cpu"]
    assert all(r["steps"][0]["report"]["results"][0]["proof"]["status"] == "created" for r in npu)
    assert all("proof" not in r["steps"][0]["report"]["results"][0] for r in cpu)
    for run in npu:  # the gate judges the real session's share, not the prediction's
        proof = run["steps"][0]["report"]["results"][0]["proof"]
        share = next(g for g in run["gates"] if g["gate"] == "min_node_share")
        assert share["value"] == round(proof["nodes_on_ep"] / proof["nodes_total"], 4)
    (folder / "ortprep.toml").write_text(text.replace("prove = true", "prove = 1"))
    bad = invoke("run", folder)
    assert bad.exit_code == 2 and "targets.npu.prove: must be true or false" in bad.stderr


def test_the_check_page_shows_the_real_sessions_placement_where_it_was_proven(tmp_path):
    """check --prove: the page's summary is the real session's (verdict, nodes on the EP, marked
    so), check's prediction beside it, and the nodes drawn with the session's placement; a session
    that is not created is said with the EP's words (the console's row and answer do the same)."""
    import ortprep
    from ortprep.render.html import target_from_check

    page = tmp_path / "page.html"
    result = ortprep.run_step("check", SAMPLES / "cnn.onnx", eps=["cpu"], prove=True, html=page)
    text = page.read_text()
    record = result.data["results"][0]
    assert record["proof"]["status"] == "created"
    target = page_data(text)["targets"][0]
    assert target["actual"] is not None and set(target["actual"].values()) == {"ep"}
    assert "full (the real session)" in text and "check predicted" in text
    # the same record, its session not created: the verdict is the session's, the EP's words shown
    failed = {**record, "verdict": "none", "proof": {"status": "failed", "message": "QNN graph finalize failed"}}
    view = {"nodes": [{"name": n["name"]} for n in page_data(text)["graph"]["nodes"]]}
    summary = target_from_check(view, "cnn", failed, [])["summary"]
    assert summary["verdict"] == "none" and summary["real session"] == "failed: QNN graph finalize failed"
    assert summary["check predicted"].startswith(f"{record['predicted_verdict']}, ")
