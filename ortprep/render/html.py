"""One self-contained HTML page per model: the placement picture.

The graph is drawn top to bottom, nodes ranked by depth and edges routed around them (the layout
is @dagrejs/dagre, vendored in ``vendor/`` with its licence and inlined, so the page needs no
network), each node coloured by where it runs on the target EP (predicted by check, and actual
where load ran), EP partitions outlined, EP<->CPU copies drawn in red. The bodies of If/Loop/Scan
nodes are boxes inside their node, open or closed with a click. Beside the drawing, the findings
grouped by cause, each with its node count; clicking a cause shows and highlights its nodes.

Usable on large graphs: chains of nodes with one input and one output and the same placement are
one box (opened with a click), the view pans (drag) and zooms (wheel), a search box finds a node
by name. Dagre's ranking recurses as deep as the graph is long and takes about a second per
1,000 boxes, so a graph of more boxes than ``DAGRE_MAX`` (a 10,000-node model) is laid out by the
page's own linear layered layout (longest-path ranks, barycentre order) instead; the page says
which drew it, and how long it took (``window.ortprepLayout``).

The page carries its data as JSON (``<script id="ortprep-data">``): every node of the model,
those inside bodies included, with its placement on each target.

A pure function of the report: the check step puts the graph (nodes, edges, bodies) and each
target's partitions into its record (``graph``, ``partition_groups``); nothing here reads a model.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Iterator
from importlib import resources
from typing import Any

from ortprep.render.run_page import page_name, run_page
from ortprep.report import placement_of, proven_placement, step_report

PALETTE = ["#15803d", "#1d4ed8", "#7e22ce", "#0f766e", "#a16207", "#be185d", "#4338ca", "#065f46"]
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


@functools.lru_cache(maxsize=1)
def layout_library() -> str:
    """The vendored dagre (dist/dagre.min.js of @dagrejs/dagre), its licence comment kept, its
    source-map line dropped (the page has no map beside it)."""
    text = (resources.files("ortprep.render") / "vendor" / "dagre.min.js").read_text(encoding="utf-8")
    return "\n".join(line for line in text.splitlines() if not line.startswith("//# sourceMappingURL"))


def all_nodes(view: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of a graph view, those inside If/Loop/Scan bodies included (depth first)."""
    for node in view["nodes"]:
        yield node
        for body in node.get("bodies") or []:
            yield from all_nodes(body)


def causes(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings grouped by cause: the same code and reason, whatever node and op they name
    (the 13 Erf nodes an EP has no kernel for are one cause; so are the 464 nodes of every op
    that QNN refuses for one dynamic shape). Each cause: {"code", "severity", "text" (the message
    without the node and op it names), "nodes", "ops" (op type -> nodes), "findings", "fixes"
    (the distinct fixes)}; worst first, then by node count."""
    groups: dict[tuple, dict[str, Any]] = {}
    for finding in findings:
        node = finding.get("node")
        text = finding["message"]
        prefix = f"node '{node}' ("
        if node and text.startswith(prefix) and ") " in text[len(prefix):]:
            text = text[text.index(") ", len(prefix)) + 2:]
        key = (finding["code"], finding["severity"], text)
        group = groups.setdefault(key, {"code": finding["code"], "severity": finding["severity"], "text": text,
                                        "nodes": [], "ops": {}, "findings": 0, "fixes": []})
        group["findings"] += 1
        if node and node not in group["nodes"]:
            group["nodes"].append(node)
            op = finding.get("op_type") or "?"
            group["ops"][op] = group["ops"].get(op, 0) + 1
        if finding.get("fix") and finding["fix"] not in group["fixes"]:
            group["fixes"].append(finding["fix"])
    return sorted(groups.values(), key=lambda g: (SEVERITY_ORDER.get(g["severity"], 3), -len(g["nodes"]), g["code"]))


STYLE = """
body{margin:0;font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1d2433;background:#f6f7f9}
header{padding:8px 16px;background:#1d2433;color:#fff;display:flex;gap:14px;align-items:center;flex-wrap:wrap}
header h1{font-size:16px;margin:0;font-weight:600}
header input,header select,header button{font:inherit;font-size:13px;padding:3px 6px}
header label{font-size:13px}
header .timing{font-size:11px;color:#cbd5e1}
main{display:flex;height:calc(100vh - 72px)}
.view{flex:1;overflow:hidden;position:relative;background:#fff;cursor:grab}
.view.dragging{cursor:grabbing}
aside{width:400px;overflow:auto;padding:10px 14px;border-left:1px solid #d8dce3;font-size:13px}
aside h2{font-size:14px;margin:14px 0 6px}
svg#graph{width:100%;height:100%;display:block}
.node>rect{stroke:#4b5563;stroke-width:1}
.node.ep>rect{fill:#b7e4c7;stroke-width:2.5}
.node.cpu>rect{fill:#f9c6a8;stroke:#c2410c;stroke-width:2}
.node.actual-cpu>rect{stroke-dasharray:4 2;stroke:#b91c1c;stroke-width:2.5}
.node.actual-ep>rect{stroke:#15803d}
.node.chain>rect{stroke-width:2;cursor:pointer}
.node.chain>rect.behind{fill:#e5e7eb;stroke:#9ca3af;stroke-width:1}
.node.container>rect{cursor:pointer}
.node.container.open>rect.frame{fill:#f8fafc;fill-opacity:.6}
.node.container.ep.open>rect.frame{fill:#ecfdf3}
.node.container.cpu.open>rect.frame{fill:#fff4ed}
.body>rect{fill:#fff;stroke:#94a3b8;stroke-dasharray:3 2}
.body>text{font-size:10px;fill:#475569;font-style:italic}
.node.hit>rect{stroke:#2563eb;stroke-width:4}
.node.highlight>rect{stroke:#7c3aed;stroke-width:5}
.node text{font-size:11px;fill:#111827;pointer-events:none}
.node text.name{fill:#4b5563;font-size:9px}
.edge{fill:none;stroke:#9ca3af;stroke-width:1.2}
.edge.copy{stroke:#dc2626;stroke-width:2.4}
.legend span{display:inline-block;padding:0 6px;margin-right:4px;border:1px solid #4b5563;border-radius:3px;
  font-size:12px}
.cause{margin:6px 0;padding:6px 8px;border-left:4px solid #9ca3af;background:#fff;cursor:pointer;list-style:none}
.cause.error{border-color:#dc2626}.cause.warning{border-color:#d97706}
.cause.none{cursor:default}
.cause.active{background:#ede9fe}
.cause .count{display:inline-block;min-width:2.2em;font-weight:700}
.cause code{font-weight:600}
.cause small.ops{color:#475569}
ul.causes{padding:0;margin:0}
.fallback a{cursor:pointer;color:#2563eb}
.summary td{padding:1px 8px 1px 0}
"""

SCRIPT = r"""
(function(){
'use strict';
var data=JSON.parse(document.getElementById('ortprep-data').textContent);
var NODE_W=150,NODE_H=30,CHAIN_MIN=4,DAGRE_MAX=1500,PAD=10,HEAD=22,OPEN_ALL=2000;
var view=document.querySelector('.view'),svg=document.getElementById('graph'),select=document.getElementById('target');
var constants=document.getElementById('constants');
var parentOf={},opOf={},total=0;
(function index(g,parent){g.nodes.forEach(function(n){total++;opOf[n.name]=n.op_type;if(parent)parentOf[n.name]=parent;
  (n.bodies||[]).forEach(function(b){index(b,n.name)});});})(data.graph,null);
var opened={},split={},target=null,current=-1,box=[0,0,1,1],size=[1,1];
function isOpen(name){return name in opened?opened[name]:total<=OPEN_ALL;}
function esc(s){return String(s).replace(/[&<>"']/g,function(c){return {'&':'&amp;','<':'&lt;','>':'&gt;',
  '"':'&quot;',"'":'&#39;'}[c]});}
function place(n){return target.placement[n]||'ep';}
function real(n){return target.actual?(target.actual[n]||''):'';}
/* boxes: single nodes, or chains (one parent, one child, same placement) of CHAIN_MIN or more */
function units(g){
  var n=g.nodes.length,parents=[],children=[],i;
  for(i=0;i<n;i++){parents.push([]);children.push([]);}
  g.edges.forEach(function(e){parents[e[1]].push(e[0]);children[e[0]].push(e[1]);});
  function key(i){var m=g.nodes[i].name;return place(m)+'|'+real(m);}
  function chainable(i){return !g.nodes[i].bodies&&!split[g.nodes[i].name];}
  var seen=new Uint8Array(n),list=[];
  /* Constant nodes (ORT folds them into initializers, no EP runs them) are hidden unless asked for */
  var hidden=new Uint8Array(n);if(!constants.checked)for(i=0;i<n;
    i++)if(g.nodes[i].op_type==='Constant'&&!split[g.nodes[i].name])hidden[i]=seen[i]=1;
  for(var s=0;s<n;s++){if(seen[s])continue;var run=[s];seen[s]=1;
    if(chainable(s)){var x=s;while(children[x].length===1){var c=children[x][0];
      if(parents[c].length!==1||seen[c]||!chainable(c)||key(c)!==key(s))break;run.push(c);seen[c]=1;x=c;}}
    if(run.length>=CHAIN_MIN)list.push(run);else run.forEach(function(m){list.push([m]);});}
  var unitOf=new Int32Array(n).fill(-1);list.forEach(function(m,u){m.forEach(function(k){unitOf[k]=u;});});
  var seenEdge={},edges=[];
  g.edges.forEach(function(e){var a=unitOf[e[0]],b=unitOf[e[1]],k=a+','+b;if(a>=0&&b>=0&&a!==b&&!seenEdge[k]){
    seenEdge[k]=1;edges.push([a,b]);}});
  return {members:list,edges:edges};
}
function withDagre(sizes,edges){
  var g=new dagre.graphlib.Graph();g.setGraph({rankdir:'TB',nodesep:18,ranksep:26,edgesep:8,marginx:8,marginy:8});
  g.setDefaultEdgeLabel(function(){return {};});
  sizes.forEach(function(s,i){g.setNode(String(i),{width:s[0],height:s[1]});});
  edges.forEach(function(e){g.setEdge(String(e[0]),String(e[1]));});
  dagre.layout(g);
  var pos=sizes.map(function(s,i){var p=g.node(String(i));return [p.x-s[0]/2,p.y-s[1]/2];});
  var routes=edges.map(function(e){return g.edge(String(e[0]),String(e[1])).points.map(function(p){return [p.x,p.y];
    });});
  var gr=g.graph();return {pos:pos,routes:routes,width:gr.width,height:gr.height,engine:'dagre'};
}
/* linear: ranks by longest path (the boxes come in topological order), two barycentre sweeps */
function layered(sizes,edges){
  var n=sizes.length,parents=[],children=[],rank=new Int32Array(n),i,r;
  for(i=0;i<n;i++){parents.push([]);children.push([]);}
  edges.forEach(function(e){parents[e[1]].push(e[0]);children[e[0]].push(e[1]);});
  var ranks=0;for(i=0;i<n;i++){parents[i].forEach(function(p){if(rank[p]+1>rank[i])rank[i]=rank[p]+1;});
    if(rank[i]+1>ranks)ranks=rank[i]+1;}
  var rows=[];for(r=0;r<ranks;r++)rows.push([]);for(i=0;i<n;i++)rows[rank[i]].push(i);
  var order=new Float64Array(n);rows.forEach(function(row){row.forEach(function(u,k){order[u]=k;});});
  function sweep(down){for(var r=down?1:ranks-2;down?r<ranks:r>=0;r+=down?1:-1){var row=rows[r];
    var bary=row.map(function(u){var ns=down?parents[u]:children[u];if(!ns.length)return order[u];
      var t=0;ns.forEach(function(p){t+=order[p];});return t/ns.length;});
    var idx=row.map(function(u,k){return k;});idx.sort(function(a,b){return bary[a]-bary[b]||a-b;});
    rows[r]=idx.map(function(k){return row[k];});rows[r].forEach(function(u,k){order[u]=k;});}}
  sweep(true);sweep(false);sweep(true);
  var x=new Float64Array(n),y=new Float64Array(n),top=8,width=0,GAP=18,RGAP=30;
  rows.forEach(function(row){var h=0,right=8;row.forEach(function(u){
      var want=8;if(parents[u].length){var t=0;parents[u].forEach(function(p){t+=x[p]+sizes[p][0]/2;});
        want=t/parents[u].length-sizes[u][0]/2;}
      x[u]=Math.max(want,right);right=x[u]+sizes[u][0]+GAP;if(sizes[u][1]>h)h=sizes[u][1];});
    row.forEach(function(u){y[u]=top;});if(right>width)width=right;top+=h+RGAP;});
  var pos=[];for(i=0;i<n;i++)pos.push([x[i],y[i]]);
  var routes=edges.map(function(e){var a=e[0],b=e[1];return [[x[a]+sizes[a][0]/2,y[a]+sizes[a][1]],
    [x[b]+sizes[b][0]/2,y[b]]];});
  return {pos:pos,routes:routes,width:width+8,height:top,engine:'layered'};
}
var engines={};
/* a graph (the main one or a body): its boxes, each open container with its bodies laid out first */
function lay(g){
  var u=units(g),inner=[];
  var sizes=u.members.map(function(m,k){var node=g.nodes[m[0]];
    if(m.length===1&&node.bodies&&isOpen(node.name)){
      var bodies=node.bodies.map(function(b){var l=lay(b);l.attribute=b.attribute;return l;});inner[k]=bodies;
      var w=PAD,h=0;bodies.forEach(function(b){w+=b.width+PAD;h=Math.max(h,b.height);});
      return [Math.max(w,NODE_W),h+HEAD+HEAD/2+PAD];}
    return [NODE_W,NODE_H];});
  var l=null;
  if(sizes.length<=DAGRE_MAX&&window.dagre){try{l=withDagre(sizes,u.edges);}catch(e){l=null;}}
  if(!l)l=layered(sizes,u.edges);
  engines[l.engine]=(engines[l.engine]||0)+1;
  l.graph=g;l.members=u.members;l.edges=u.edges;l.sizes=sizes;l.inner=inner;
  return l;
}
function draw(l){
  var g=l.graph,out=[];
  l.edges.forEach(function(e,k){
    var a=g.nodes[l.members[e[0]].slice(-1)[0]].name,b=g.nodes[l.members[e[1]][0]].name;
    var pa=place(a),pb=place(b),copy=pa!==pb&&(pa==='cpu'||pb==='cpu');
    var pts=l.routes[k],d='M'+pts[0][0]+' '+pts[0][1];
    if(pts.length===2){var my=(pts[0][1]+pts[1][1])/2;
      d+=' C'+pts[0][0]+' '+my+' '+pts[1][0]+' '+my+' '+pts[1][0]+' '+pts[1][1];}
    else for(var i=1;i<pts.length;i++)d+=' L'+pts[i][0]+' '+pts[i][1];
    out.push('<path class="edge'+(copy?' copy':'')+'" d="'+d+'" marker-end="url(#arrow)"/>');});
  l.members.forEach(function(m,k){
    var first=g.nodes[m[0]],name=first.name,where=place(name),act=real(name),p=l.pos[k],s=l.sizes[k];
    var container=m.length===1&&first.bodies,open=container&&l.inner[k];
    var cls=['node',where];if(act)cls.push('actual-'+act);if(m.length>1)cls.push('chain');
    if(container)cls.push('container');if(open)cls.push('open');
    var part=target.partition_of[name],
      stroke=part!==undefined&&!act?' style="stroke:'+data.palette[part%data.palette.length]+'"':'';
    var names=m.map(function(i){return g.nodes[i].name;});
    var ops={};names.forEach(function(n){ops[opOf[n]]=1;});var kinds=Object.keys(ops);
    var label=m.length>1?(kinds.length===1?kinds[0]+' x'+m.length:m.length+' nodes'):first.op_type;
    if(container&&!open){var inside=0;(function c(n){(n.bodies||[]).forEach(function(b){b.nodes.forEach(function(x){
      inside++;c(x);});});})(first);label+=' \u25B8 '+inside+' inside';}
    var attr=m.length>1?'data-nodes="'+esc(JSON.stringify(names))+'"':'data-node="'+esc(name)+'"';
    var title=names.slice(0,30).map(function(n){return n+' ('+opOf[n]+')';}).join('\n')+(names.length>30?'\n...':'');
    out.push('<g class="'+cls.join(' ')+'" '+attr+' data-placement="'+where+'"'+(act?' data-actual="'+act+'"':'')+
      (part!==undefined?' data-partition="'+part+'"':'')+' transform="translate('+p[0]+','+p[1]+')"><title>'+
        esc(title)+'</title>');
    if(m.length>1)out.push('<rect class="behind" x="4" y="4" width="'+s[0]+'" height="'+s[1]+'" rx="4"/>');
    out.push('<rect'+(open?' class="frame"':'')+' width="'+s[0]+'" height="'+s[1]+'" rx="4"'+stroke+'/>');
    if(open){
      out.push('<text x="6" y="14">'+esc(first.op_type+' \u25BE '+name)+'</text>');
      var bx=PAD;l.inner[k].forEach(function(b){
        out.push('<g class="body" data-attribute="'+esc(b.attribute)+'" transform="translate('+bx+','+HEAD+')">'+
          '<rect width="'+b.width+'" height="'+(b.height+HEAD/2)+'" rx="3"/><text x="4" y="10">'+esc(b.attribute)+
            '</text>'+
          '<g transform="translate(0,'+HEAD/2+')">'+draw(b)+'</g></g>');bx+=b.width+PAD;});
    }else{
      out.push('<text x="6" y="13">'+esc(label.slice(0,
        26))+'</text><text class="name" x="6" y="25">'+esc(name.length>26?'\u2026'+name.slice(-25):name)+'</text>');
    }
    out.push('</g>');});
  return out.join('');
}
function render(){
  var t0=performance.now();engines={};
  var l=lay(data.graph);var t1=performance.now();
  svg.innerHTML='<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="6" markerHeight="6" '+
    'orient="auto">'+
    '<path d="M0 0L8 4L0 8z" fill="#9ca3af"/></marker></defs><g class="root">'+draw(l)+'</g>';
  var t2=performance.now();size=[l.width,l.height];
  var boxes=svg.querySelectorAll('g.node').length;
  window.ortprepLayout={nodes:total,boxes:boxes,engines:engines,layout_ms:Math.round(t1-t0),draw_ms:Math.round(t2-t1)};
  document.getElementById('timing').textContent=total+' nodes in '+boxes+' boxes; laid out by '+
    Object.keys(engines).join(' + ')+
    ' in '+Math.round(t1-t0)+' ms';
}
function apply(){svg.setAttribute('viewBox',box.join(' '));}
function fit(all){
  var r=view.getBoundingClientRect(),W=size[0],H=size[1],k=Math.max(W/r.width,H/r.height);
  if(all||k<=2){k=Math.max(k,1);box=[(W-r.width*k)/2,(H-r.height*k)/2,r.width*k,r.height*k];}
  else{k=Math.min(2,Math.max(1,W/r.width));box=[(W-r.width*k)/2,0,r.width*k,r.height*k];}
  apply();
}
function offset(el){var x=0,y=0;for(var e=el;e&&e!==svg;e=e.parentNode){
  var t=e.getAttribute&&e.getAttribute('transform');
  var m=t&&/translate\(([-\d.e]+),([-\d.e]+)\)/.exec(t);if(m){x+=+m[1];y+=+m[2];}}return [x,y];}
function zoomTo(els){if(!els.length)return;var x0=1e12,y0=1e12,x1=-1e12,y1=-1e12;
  els.forEach(function(el){var o=offset(el),r=el.querySelector('rect');var w=+r.getAttribute('width'),
    h=+r.getAttribute('height');
    x0=Math.min(x0,o[0]);y0=Math.min(y0,o[1]);x1=Math.max(x1,o[0]+w);y1=Math.max(y1,o[1]+h);});
  var v=view.getBoundingClientRect(),k=Math.max((x1-x0+80)/v.width,(y1-y0+80)/v.height,1);
  box=[(x0+x1)/2-v.width*k/2,(y0+y1)/2-v.height*k/2,v.width*k,v.height*k];apply();}
/* make these nodes drawn as themselves: open the bodies around them, take them out of chains */
function reveal(names){var changed=false;names.forEach(function(n){
  if(!split[n]){split[n]=true;changed=true;}
  for(var p=parentOf[n];p;p=parentOf[p]){if(!isOpen(p)){opened[p]=true;changed=true;}}});
  if(changed)render();}
function elementsOf(names){var want={};names.forEach(function(n){want[n]=1;});
  return Array.prototype.filter.call(svg.querySelectorAll('g.node'),function(g){
    return g.dataset.node?want[g.dataset.node]:JSON.parse(g.dataset.nodes).some(function(n){return want[n];});});}
function find(text){
  var q=text.toLowerCase(),name=null;for(var n in opOf){if(n.toLowerCase().indexOf(q)>=0){name=n;break;}}
  svg.querySelectorAll('.hit').forEach(function(g){g.classList.remove('hit');});
  if(name===null)return false;reveal([name]);var els=elementsOf([name]);
  els.forEach(function(g){g.classList.add('hit');});zoomTo(els);return true;}
function showCause(li){
  var active=li.classList.contains('active');
  document.querySelectorAll('.cause.active').forEach(function(c){c.classList.remove('active');});
  svg.querySelectorAll('.highlight').forEach(function(g){g.classList.remove('highlight');});
  if(active)return;var names=JSON.parse(li.dataset.nodes);if(!names.length)return;
  li.classList.add('active');reveal(names);var els=elementsOf(names);
  els.forEach(function(g){g.classList.add('highlight');});zoomTo(els);}
function show(index){current=+index;target=data.targets[current];target.partition_of={};
  (target.partition_groups||[]).forEach(function(group,k){group.forEach(function(n){target.partition_of[n]=k;});});
  render();fit(false);
  document.querySelectorAll('.target-info').forEach(function(e){e.style.display=+e.dataset.section===current?'block':'none';});}
svg.addEventListener('click',function(e){if(moved)return;var g=e.target.closest&&e.target.closest('g.node');
  if(!g)return;
  if(g.classList.contains('chain')){JSON.parse(g.dataset.nodes).forEach(function(n){split[n]=true;});keep(render);}
  else if(g.classList.contains('container')&&(!g.classList.contains('open')||e.target.parentNode===g)){
    opened[g.dataset.node]=!g.classList.contains('open');keep(render);}});
function keep(f){var b=box.slice();f();box=b;apply();}
document.getElementById('fit').addEventListener('click',function(){fit(true);});
view.addEventListener('wheel',function(e){e.preventDefault();var r=svg.getBoundingClientRect();
  var fx=(e.clientX-r.left)/r.width,fy=(e.clientY-r.top)/r.height,k=e.deltaY<0?0.8:1.25;
  var w=box[2]*k,h=box[3]*k;box=[box[0]+(box[2]-w)*fx,box[1]+(box[3]-h)*fy,w,h];apply();},{passive:false});
var drag=null,moved=false;
view.addEventListener('mousedown',function(e){drag=[e.clientX,e.clientY];moved=false;view.classList.add('dragging');});
window.addEventListener('mouseup',function(){drag=null;view.classList.remove('dragging');});
window.addEventListener('mousemove',function(e){if(!drag)return;var r=svg.getBoundingClientRect();
  if(Math.abs(e.clientX-drag[0])+Math.abs(e.clientY-drag[1])>2)moved=true;
  box[0]-=(e.clientX-drag[0])*box[2]/r.width;box[1]-=(e.clientY-drag[1])*box[3]/r.height;drag=[e.clientX,e.clientY];apply();});
document.getElementById('search').addEventListener('keydown',function(e){if(e.key==='Enter')find(e.target.value);});
document.querySelectorAll('[data-find]').forEach(function(a){a.addEventListener('click',function(){find(a.dataset.find);});});
document.querySelectorAll('.cause').forEach(function(li){li.addEventListener('click',function(){showCause(li);});});
select.addEventListener('change',function(){show(select.value);});
constants.addEventListener('change',function(){render();fit(false);});
show(0);
var wanted=/^#find=(.+)$/.exec(location.hash);if(wanted)find(decodeURIComponent(wanted[1]));
})();
"""


def _plural(text: str) -> str:
    """A cause's text said of several nodes (the catalogue's messages speak of one)."""
    for one, several in (
        ("is not supported", "are not supported"),
        ("runs on ", "run on "),
        ("it falls back", "they fall back"),
    ):
        text = text.replace(one, several, 1)
    return text


def _panel(index: int, target: dict[str, Any]) -> str:
    summary = target.get("summary") or {}
    rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>" for k, v in summary.items())
    fallback = sorted(target.get("fallback_all") or (n for n, p in target["placement"].items() if p == "cpu"))
    grouped = causes(target.get("findings", []))
    items = []
    for number, cause in enumerate(grouped):
        count = len(cause["nodes"])
        ops = sorted(cause["ops"].items(), key=lambda item: (-item[1], item[0]))
        what = _plural(cause["text"]) if count > 1 else cause["text"]
        breakdown = (
            ", ".join(f"{op} {n}" for op, n in ops[:6]) + (f", {len(ops) - 6} more op types" if len(ops) > 6 else "")
            if count > 1
            else f"{cause['nodes'][0]} ({ops[0][0]})"
            if count
            else ""
        )
        fixes = cause["fixes"][:3] + ([f"... {len(cause['fixes']) - 3} more"] if len(cause["fixes"]) > 3 else [])
        items.append(f'<li class="cause {cause["severity"]}{"" if count else " none"}" data-cause="{number}" '
                     f'data-count="{count}" data-code="{html.escape(cause["code"])}" '
                     f'data-nodes="{html.escape(json.dumps(cause["nodes"]))}"><span class="count">{count or "-"}</span>'
                     f'<code>{html.escape(cause["code"])}</code> {html.escape(what)}'
                     + (f'<br><small class="ops">{html.escape(breakdown)}</small>' if breakdown else "")
                     + "".join(f"<br><small>fix: {html.escape(fix)}</small>" for fix in fixes) + "</li>")
    cpu_list = "".join(f'<li><a data-find="{html.escape(n)}">{html.escape(n)}</a></li>' for n in fallback[:500])
    more = f"<li>... and {len(fallback) - 500} more</li>" if len(fallback) > 500 else ""
    findings = sum(c["findings"] for c in grouped)
    return (
        f'<div class="target-info" data-section="{index}"><h2>{html.escape(target["name"])}: '
        f'{html.escape(target["ep"])}</h2>'
        f'<table class="summary">{rows}</table>'
        f"<h2>Findings by cause ({len(grouped)} causes, {findings} findings)</h2>"
        f'<ul class="causes">{"".join(items) or "<li>none</li>"}</ul>'
        f'<details class="fallback"><summary>Fallback to the CPU ({len(fallback)} nodes)</summary>'
        f"<ul>{cpu_list}{more}</ul></details></div>"
    )


def render_page(model: str, view: dict[str, Any], targets: list[dict[str, Any]], title: str | None = None) -> str:
    """The page for ``model`` from its graph ``view`` (a check record's ``graph``). Each target:
    {"name", "ep", "placement": {node: "ep"|"cpu"}, "actual": {node: "ep"|"cpu"} or None,
    "partition_groups": [[node, ...], ...], "findings": [...], "summary": {...}}; placements
    name the nodes of bodies too."""
    payload = {
        "model": model,
        "graph": view,
        "palette": PALETTE,
        "targets": [{k: t.get(k) for k in ("name", "ep", "placement", "actual", "partition_groups")} for t in targets],
    }
    options = "".join(f'<option value="{i}">{html.escape(t["name"])} ({html.escape(t["ep"])})</option>'
                      for i, t in enumerate(targets))
    panels = "".join(_panel(index, target) for index, target in enumerate(targets))
    legend = (
        '<div class="legend"><span style="background:#b7e4c7">on the EP</span><span style="background:#f9c6a8">CPU '
        'fallback</span><span style="border-style:dashed;border-color:#b91c1c">CPU when run</span>'
        '<span style="border-color:#dc2626;border-width:2px">red edge: EP&#8596;CPU copy</span>'
        '<span style="border-color:#1d4ed8;border-width:2px">outline: EP partition</span>'
        '<span style="border-style:dashed">box: If/Loop body (click)</span></div>'
    )
    data = json.dumps(payload).replace("</", "<\\/")
    name = html.escape(title or _file_name(model))
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{name} - ortprep</title>'
        f"<style>{STYLE}</style></head><body><header><h1>{name}</h1>"
        f'<label>target <select id="target">{options}</select></label>'
        f'<input id="search" placeholder="find a node by name (Enter)" size="28"><button id="fit">whole graph</button>'
        f'<label title="ORT folds them into initializers"><input type="checkbox" id="constants"> Constant nodes</label>'
        f'<span class="timing" id="timing"></span>{legend}</header>'
        f'<main><div class="view"><svg id="graph" xmlns="http://www.w3.org/2000/svg"></svg></div><aside>{panels}</aside></main>'
        f'<script type="application/json" id="ortprep-data">{data}</script>'
        f"<script>{layout_library()}</script><script>{SCRIPT}</script></body></html>"
    )


def _file_name(model: str) -> str:
    return model.replace("\\", "/").rsplit("/", 1)[-1]


def target_from_check(view: dict[str, Any], name: str, result: dict[str, Any], findings: list[dict[str, Any]],
                      load: dict[str, Any] | None = None) -> dict[str, Any]:
    """A page target from a check result (and the load result of the same EP, when one ran)."""
    names = [node["name"] for node in all_nodes(view)]
    fallback = set(result.get("fallback_nodes") or [])
    placement = {n: ("cpu" if n in fallback else "ep") for n in names}
    proof = result.get("proof") or {}
    on_cpu = (
        load.get("fallback_nodes")
        if load is not None and load.get("status") in ("ok", "fallback")
        else proof.get("fallback_nodes")
        if proof.get("status") == "created"
        else None
    )  # (--prove: the session's)
    on_cpu = set(on_cpu) if on_cpu is not None else None
    actual = {n: ("cpu" if n in on_cpu else "ep") for n in names} if on_cpu is not None else None
    placed = proven_placement(result) if proof.get("status") == "created" else None
    real = " (the real session)" if placed and placed["proven"] else ""
    figures = placed if real else {"on_ep": result.get("supported_nodes"), "nodes": result.get("nodes"),
                                   "partitions": result.get("partitions"), "copies": result.get("copies")}
    summary = {
        "verdict": f"{result.get('verdict')}{real}",
        "nodes on the EP": f"{figures['on_ep']}/{figures['nodes']}{real}",
        "partitions": figures["partitions"],
        "copies per run": figures["copies"],
        "MACs on the EP": f"{result['mac_share']:.1%}" if result.get("mac_share") is not None else "-",
    }
    if "predicted_verdict" in result and proof.get("status") not in (None, "unavailable", "not proven"):
        summary["check predicted"] = (
            f"{result['predicted_verdict']}, {result.get('supported_nodes')}/{result.get('nodes')} "
            f"nodes, {result.get('partitions')} partition(s)"
        )
        if proof.get("status") != "created":
            summary["real session"] = f"{proof.get('status')}: {str(proof.get('message') or '')[:300]}"
    if load is not None:
        summary["load"] = load.get("status")
    return {"name": name, "ep": result["ep"], "placement": placement, "actual": actual, "summary": summary,
            "partition_groups": result.get("partition_groups") or [],
            "fallback_all": sorted(fallback),
            "findings": [f for f in findings if f.get("target") in (None, result["ep"])]}


def check_page(record: dict[str, Any]) -> str:
    """The page of one check record (made with ``--html``, so it holds the graph)."""
    view = record["graph"]
    targets = [target_from_check(view, r["ep"], r, record["findings"]) for r in record["results"]]
    return render_page(record.get("model") or "model", view, targets)


def repo_pages(document: dict[str, Any]) -> dict[str, str]:
    """The pages of a repository run (file name -> page): the run's report page (``index.html``,
    or ``ortprep-run.html`` where a model's page takes that name), and one placement page per
    model, a section per target; models whose check records hold no graph (no check step ran)
    get none."""
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
            pages[page_name(model)] = render_page(runs[0]["model_path"], view, targets, title=model)
    index = "index.html" if "index.html" not in pages else "ortprep-run.html"
    return {index: run_page(document, pages), **pages}
