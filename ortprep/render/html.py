"""One self-contained HTML page per model: the graph drawn as SVG, each node coloured by where it
runs on the target EP (predicted by check, and actual where load ran), EP partitions outlined,
fallback nodes and EP<->CPU copies marked, the findings beside it. No network: the styles and the
script are inline, the fonts are the reader's own.

Usable on large graphs: chains of nodes with one input and one output and the same placement are
drawn as one box (its nodes listed in it and findable), the view pans (drag) and zooms (wheel),
and a search box finds a node by name.

The page carries its data as JSON (``<script id="ortprep-data">``); every node of the main graph
is in it, and every node is either a ``<g class="node">`` or listed in a chain's ``data-nodes``.

A pure function of the report: the check step puts the graph (nodes, edges) and each target's
partitions into its record (``graph``, ``partition_groups``); nothing here reads a model.
"""

from __future__ import annotations

import html
import json
from typing import Any

from ortprep.report import placement_of, step_report

NODE_W, NODE_H, GAP_X, GAP_Y = 150, 30, 40, 14
PALETTE = ["#15803d", "#1d4ed8", "#7e22ce", "#0f766e", "#a16207", "#be185d", "#4338ca", "#065f46"]
CHAIN_MIN = 4  # chains of at least this many nodes are drawn as one box


def layout(view: dict[str, Any], placement: dict[str, str]) -> dict[str, Any]:
    """Boxes (single nodes or chains), their positions, and the edges between boxes."""
    names = [node["name"] for node in view["nodes"]]
    parents: list[list[int]] = [[] for _ in names]
    children: list[list[int]] = [[] for _ in names]
    for parent, child in view["edges"]:
        parents[child].append(parent)
        children[parent].append(child)
    # chains: a run of nodes each the only child of the one before and the only parent of the next
    box_of = list(range(len(names)))
    boxes: list[list[int]] = []
    seen = set()
    for start in range(len(names)):
        if start in seen:
            continue
        run = [start]
        seen.add(start)
        node = start
        while (len(children[node]) == 1 and len(parents[children[node][0]]) == 1
               and placement.get(names[children[node][0]]) == placement.get(names[start]) and children[node][0] not in seen):
            node = children[node][0]
            run.append(node)
            seen.add(node)
        if len(run) >= CHAIN_MIN:
            boxes.append(run)
        else:
            boxes.extend([[member] for member in run])
    for index, members in enumerate(boxes):
        for member in members:
            box_of[member] = index
    # layers: longest path from the inputs, over boxes
    depth = [0] * len(boxes)
    order = sorted(range(len(boxes)), key=lambda b: min(boxes[b]))
    for box in order:  # node order is topological (the checker made sure), so boxes in first-member order are too
        for member in boxes[box]:
            for parent in parents[member]:
                if box_of[parent] != box:
                    depth[box] = max(depth[box], depth[box_of[parent]] + 1)
    rows: dict[int, int] = {}
    positions = []
    for box in order:
        row = rows.get(depth[box], 0)
        rows[depth[box]] = row + 1
        positions.append((box, depth[box] * (NODE_W + GAP_X) + 20, row * (NODE_H + GAP_Y) + 20))
    position = {box: (x, y) for box, x, y in positions}
    edges = sorted({(box_of[p], box_of[c]) for c, ps in enumerate(parents) for p in ps if box_of[p] != box_of[c]})
    return {"names": names, "boxes": boxes, "position": position, "edges": edges,
            "width": (max(depth, default=0) + 1) * (NODE_W + GAP_X) + 40,
            "height": (max(rows.values(), default=1)) * (NODE_H + GAP_Y) + 40}


def _svg(view: dict[str, Any], target: dict[str, Any], section: int) -> str:
    predicted = target["placement"]
    actual = target.get("actual") or {}
    drawn = layout(view, predicted)
    names, boxes, position = drawn["names"], drawn["boxes"], drawn["position"]
    ops = {node["name"]: node["op_type"] for node in view["nodes"]}
    out = [f'<svg class="graph" id="graph-{section}" viewBox="0 0 {drawn["width"]} {drawn["height"]}" '
           f'data-width="{drawn["width"]}" data-height="{drawn["height"]}" xmlns="http://www.w3.org/2000/svg">']
    # partitions: every EP node is outlined in its partition's colour (and carries its index)
    partition_of = {name: index for index, group in enumerate(target.get("partition_groups") or []) for name in group}
    for a, b in drawn["edges"]:
        (xa, ya), (xb, yb) = position[a], position[b]
        place_a = predicted.get(names[boxes[a][-1]])
        place_b = predicted.get(names[boxes[b][0]])
        copy = place_a != place_b and "cpu" in (place_a, place_b)
        out.append(f'<path class="edge{" copy" if copy else ""}" d="M{xa + NODE_W} {ya + NODE_H / 2} C{xa + NODE_W + GAP_X / 2} '
                   f'{ya + NODE_H / 2} {xb - GAP_X / 2} {yb + NODE_H / 2} {xb} {yb + NODE_H / 2}"/>')
    for index, members in enumerate(boxes):
        x, y = position[index]
        first = names[members[0]]
        where = predicted.get(first, "ep")
        real = actual.get(first)
        classes = ["node", where] + ([f"actual-{real}"] if real else []) + (["chain"] if len(members) > 1 else [])
        label = (f"{ops[first]} x{len(members)}" if len(members) > 1 and len({ops[names[m]] for m in members}) == 1
                 else f"{len(members)} nodes" if len(members) > 1 else ops[first])
        member_names = " ".join(html.escape(names[m]) for m in members)
        title = "\n".join(f"{names[m]} ({ops[names[m]]})" for m in members[:30]) + ("\n..." if len(members) > 30 else "")
        data = f'data-node="{html.escape(first)}"' if len(members) == 1 else f'data-nodes="{member_names}"'
        part = partition_of.get(first)
        outline = f' style="stroke:{PALETTE[part % len(PALETTE)]}"' if part is not None and not real else ""
        out.append(f'<g class="{" ".join(classes)}" {data} data-placement="{where}"'
                   + (f' data-actual="{real}"' if real else "")
                   + (f' data-partition="{part}"' if part is not None else "")
                   + f' transform="translate({x},{y})"><title>{html.escape(title)}</title>'
                   f'<rect width="{NODE_W}" height="{NODE_H}" rx="4"{outline}/>'
                   f'<text x="6" y="13">{html.escape(label[:22])}</text>'
                   f'<text class="name" x="6" y="25">{html.escape(first[:24])}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


STYLE = """
body{margin:0;font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1d2433;background:#f6f7f9}
header{padding:10px 16px;background:#1d2433;color:#fff;display:flex;gap:16px;align-items:center;flex-wrap:wrap}
header h1{font-size:16px;margin:0;font-weight:600}
header input,header select{font:inherit;padding:3px 6px}
main{display:flex;height:calc(100vh - 52px)}
.view{flex:1;overflow:hidden;position:relative;background:#fff;cursor:grab}
.view.dragging{cursor:grabbing}
aside{width:380px;overflow:auto;padding:12px 14px;border-left:1px solid #d8dce3;font-size:13px}
aside h2{font-size:14px;margin:14px 0 6px}
svg.graph{width:100%;height:100%;display:none}
svg.graph.shown{display:block}
.node rect{stroke:#4b5563;stroke-width:1}
.node.ep rect{fill:#b7e4c7;stroke-width:2.5}
.node.cpu rect{fill:#f9c6a8;stroke:#c2410c;stroke-width:2}
.node.actual-cpu rect{stroke-dasharray:4 2;stroke:#b91c1c;stroke-width:2.5}
.node.actual-ep rect{stroke:#15803d}
.node.chain rect{stroke-width:2}
.node.hit rect{stroke:#2563eb;stroke-width:4}
.node text{font-size:11px;fill:#111827;pointer-events:none}
.node text.name{fill:#4b5563;font-size:9px}
.edge{fill:none;stroke:#9ca3af;stroke-width:1.2}
.edge.copy{stroke:#dc2626;stroke-width:2.2}
.legend span{display:inline-block;padding:1px 6px;margin-right:6px;border:1px solid #4b5563;border-radius:3px}
.finding{margin:6px 0;padding:6px 8px;border-left:4px solid #9ca3af;background:#fff}
.finding.error{border-color:#dc2626}.finding.warning{border-color:#d97706}
.finding code{font-weight:600}
.finding a{cursor:pointer;color:#2563eb}
.summary td{padding:1px 8px 1px 0}
"""

SCRIPT = """
(function(){
  var data=JSON.parse(document.getElementById('ortprep-data').textContent);
  var view=document.querySelector('.view');var select=document.getElementById('target');
  var current=null, box=null;
  function show(index){
    document.querySelectorAll('svg.graph').forEach(function(s){s.classList.remove('shown')});
    current=document.getElementById('graph-'+index);current.classList.add('shown');
    fit(false);
    document.querySelectorAll('.target-info').forEach(function(e){e.style.display=e.dataset.section==index?'block':'none'});
  }
  function apply(){current.setAttribute('viewBox',box.join(' '));}
  function fit(all){ /* all: the whole graph; else 1:1 from the start (readable), centred on the rows */
    var r=view.getBoundingClientRect(),W=+current.dataset.width,H=+current.dataset.height;
    if(all||(W<=r.width&&H<=r.height)){var k=Math.max(W/r.width,H/r.height);box=[0,0,r.width*k,r.height*k];}
    else{box=[0,Math.max(0,(H-r.height)/2),r.width,r.height];}
    apply();
  }
  document.getElementById('fit').addEventListener('click',function(){fit(true)});
  view.addEventListener('wheel',function(e){e.preventDefault();var r=current.getBoundingClientRect();
    var fx=(e.clientX-r.left)/r.width,fy=(e.clientY-r.top)/r.height,k=e.deltaY<0?0.8:1.25;
    var w=box[2]*k,h=box[3]*k;box=[box[0]+(box[2]-w)*fx,box[1]+(box[3]-h)*fy,w,h];apply();},{passive:false});
  var drag=null;
  view.addEventListener('mousedown',function(e){drag=[e.clientX,e.clientY];view.classList.add('dragging');});
  window.addEventListener('mouseup',function(){drag=null;view.classList.remove('dragging');});
  window.addEventListener('mousemove',function(e){if(!drag)return;var r=current.getBoundingClientRect();
    box[0]-=(e.clientX-drag[0])*box[2]/r.width;box[1]-=(e.clientY-drag[1])*box[3]/r.height;drag=[e.clientX,e.clientY];apply();});
  function find(name){
    document.querySelectorAll('.hit').forEach(function(n){n.classList.remove('hit')});
    var hit=null;current.querySelectorAll('g.node').forEach(function(g){
      var names=(g.dataset.node?[g.dataset.node]:g.dataset.nodes.split(' '));
      if(!hit&&names.some(function(n){return n.toLowerCase().indexOf(name.toLowerCase())>=0}))hit=g;});
    if(!hit)return false;hit.classList.add('hit');
    var m=/translate\\(([-\\d.]+),([-\\d.]+)\\)/.exec(hit.getAttribute('transform'));
    var w=Math.min(box[2],1200),h=box[3]*w/box[2];box=[+m[1]-w/2,+m[2]-h/2,w,h];apply();return true;
  }
  document.getElementById('search').addEventListener('keydown',function(e){if(e.key==='Enter')find(e.target.value);});
  document.querySelectorAll('[data-find]').forEach(function(a){a.addEventListener('click',function(){find(a.dataset.find)})});
  select.addEventListener('change',function(){show(select.value)});
  show(0);
  var wanted=/^#find=(.+)$/.exec(location.hash); if(wanted)find(decodeURIComponent(wanted[1]));
})();
"""


def render_page(model: str, view: dict[str, Any], targets: list[dict[str, Any]], title: str | None = None) -> str:
    """The page for ``model`` from its graph ``view`` (a check record's ``graph``). Each target:
    {"name", "ep", "placement": {node: "ep"|"cpu"}, "actual": {node: "ep"|"cpu"} or None,
    "partition_groups": [[node, ...], ...], "findings": [...], "summary": {...}}."""
    payload = {"model": model, "nodes": view["nodes"],
               "targets": [{k: t.get(k) for k in ("name", "ep", "placement", "actual", "summary")} for t in targets]}
    options = "".join(f'<option value="{i}">{html.escape(t["name"])} ({html.escape(t["ep"])})</option>'
                      for i, t in enumerate(targets))
    svgs = "\n".join(_svg(view, target, index) for index, target in enumerate(targets))
    panels = []
    for index, target in enumerate(targets):
        summary = target.get("summary") or {}
        rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>" for k, v in summary.items())
        fallback = sorted(target.get("fallback_all") or (n for n, p in target["placement"].items() if p == "cpu"))
        items = []
        for finding in target.get("findings", []):
            node = finding.get("node")
            link = f' <a data-find="{html.escape(node)}">show {html.escape(node)}</a>' if node else ""
            fix = f"<br><small>fix: {html.escape(finding['fix'])}</small>" if finding.get("fix") else ""
            items.append(f'<div class="finding {finding["severity"]}"><code>{finding["code"]}</code> '
                         f'{html.escape(finding["message"])}{link}{fix}</div>')
        cpu_list = "".join(f'<li><a data-find="{html.escape(n)}">{html.escape(n)}</a></li>' for n in fallback[:200])
        panels.append(
            f'<div class="target-info" data-section="{index}"><h2>{html.escape(target["name"])}: {html.escape(target["ep"])}</h2>'
            f'<table class="summary">{rows}</table>'
            f'<h2>Fallback to the CPU ({len(fallback)})</h2><ul class="fallback">{cpu_list}</ul>'
            f'<h2>Findings ({len(items)})</h2>{"".join(items) or "<p>none</p>"}</div>')
    legend = ('<div class="legend"><span style="background:#b7e4c7">on the EP</span><span style="background:#f9c6a8">CPU '
              'fallback</span><span style="border-style:dashed;border-color:#b91c1c">CPU when run</span>'
              '<span style="border-color:#dc2626">red edge: EP&#8596;CPU copy</span>'
              '<span style="border-color:#1d4ed8;border-width:2px">outline colour: EP partition</span></div>')
    data = json.dumps(payload).replace("</", "<\\/")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title or _file_name(model))} - ortprep</title>'
            f'<style>{STYLE}</style></head><body><header><h1>{html.escape(title or _file_name(model))}</h1>'
            f'<label>target <select id="target">{options}</select></label>'
            f'<input id="search" placeholder="find a node by name (Enter)" size="30"><button id="fit">whole graph</button>'
            f'{legend}</header>'
            f'<main><div class="view">{svgs}</div><aside>{"".join(panels)}</aside></main>'
            f'<script type="application/json" id="ortprep-data">{data}</script><script>{SCRIPT}</script></body></html>')


def _file_name(model: str) -> str:
    return model.replace("\\", "/").rsplit("/", 1)[-1]


def target_from_check(view: dict[str, Any], name: str, result: dict[str, Any], findings: list[dict[str, Any]],
                      load: dict[str, Any] | None = None) -> dict[str, Any]:
    """A page target from a check result (and the load result of the same EP, when one ran)."""
    names = [node["name"] for node in view["nodes"]]
    fallback = set(result.get("fallback_nodes") or [])
    placement = {n: ("cpu" if n in fallback else "ep") for n in names}
    actual = None
    if load is not None and load.get("status") in ("ok", "fallback") and load.get("fallback_nodes") is not None:
        on_cpu = set(load.get("fallback_nodes") or [])
        actual = {n: ("cpu" if n in on_cpu else "ep") for n in names}
    summary = {"verdict": result.get("verdict"), "nodes on the EP": f"{result.get('supported_nodes')}/{result.get('nodes')}",
               "partitions": result.get("partitions"), "copies per run": result.get("copies"),
               "MACs on the EP": f"{result['mac_share']:.1%}" if result.get("mac_share") is not None else "-"}
    if load is not None:
        summary["load"] = load.get("status")
    return {"name": name, "ep": result["ep"], "placement": placement, "actual": actual, "summary": summary,
            "partition_groups": result.get("partition_groups") or [],
            "fallback_all": sorted(fallback),  # subgraph nodes too (the drawing shows the main graph)
            "findings": [f for f in findings if f.get("target") in (None, result["ep"])]}


def check_page(record: dict[str, Any]) -> str:
    """The page of one check record (made with ``--html``, so it holds the graph)."""
    view = record["graph"]
    targets = [target_from_check(view, r["ep"], r, record["findings"]) for r in record["results"]]
    return render_page(record.get("model") or "model", view, targets)


def repo_pages(document: dict[str, Any]) -> dict[str, str]:
    """One page per model of a repository run (file name -> page), a section per target; models
    whose check records hold no graph (no check step ran) get none."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for run in document["runs"]:
        by_model.setdefault(run["model"], []).append(run)
    pages = {}
    for model, runs in sorted(by_model.items()):
        targets, view = [], None
        for run in runs:
            result = placement_of(run)
            check = step_report(run.get("steps", []), "check")
            if result is None or not (check or {}).get("graph"):
                continue
            view = check["graph"]
            loaded = next((r for r in (step_report(run.get("steps", []), "load") or {}).get("results", [])
                           if r.get("ep") == run["ep"]), None)
            targets.append(target_from_check(view, run["target"], result, check["findings"], loaded))
        if targets:
            pages[model.replace("/", "__").removesuffix(".onnx") + ".html"] = render_page(runs[0]["model_path"], view, targets,
                                                                                      title=model)
    return pages
