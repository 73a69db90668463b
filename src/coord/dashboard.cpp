// GET / (a self-contained page: inline CSS and JS, nothing fetched from elsewhere) and GET /api/dashboard
// (the public summary it polls every 2 s: coverage per layer x range, nodes with status, load and rewards;
// no tokens, no addresses).
#include <map>

#include "coord/coordinator_impl.h"

namespace essaim::coord {

using json = nlohmann::json;

json Coordinator::Impl::dashboard_json() {
  Result<std::vector<NodeRow>> nodes = store->list_nodes();
  Result<std::vector<HoldingRow>> holdings = store->list_holdings();
  Result<std::vector<WorkRow>> work = store->list_work();
  if (!nodes || !holdings || !work) return {{"error", {{"message", "the store failed"}, {"code", "store_error"}}}};
  const int64_t now_ms = now();
  const std::vector<int64_t> h = count_holders(cat, *nodes, *holdings, now_ms, cfg.heartbeat_s);
  std::map<int64_t, json> layers;
  for (size_t i = 0; i < cat.slices.size(); ++i) {
    const CatalogueSlice& s = cat.slices[i];
    if (!layers.count(s.layer)) layers[s.layer] = json::array();
    layers[s.layer].push_back({{"expert_first", s.expert_first}, {"expert_count", s.expert_count}, {"holders", h[i]},
                               {"scarce", h[i] < cfg.replicas}});
  }
  json grid = json::array();
  for (auto& [layer, ranges] : layers) grid.push_back({{"layer", layer}, {"ranges", ranges}});
  std::map<std::string, WorkRow> w;
  for (const WorkRow& r : *work) w[r.node_id] = r;
  std::map<std::string, int64_t> held;
  for (const HoldingRow& r : *holdings) ++held[r.node_id];
  json list = json::array();
  for (const NodeRow& n : *nodes) {
    const WorkRow r = w.count(n.node_id) ? w[n.node_id] : WorkRow{};
    list.push_back({{"node_id", n.node_id}, {"name", n.name}, {"status", node_status(n, now_ms, cfg.heartbeat_s)},
                    {"load", n.load}, {"holdings", held[n.node_id]}, {"pairs_credited", r.pairs_credited},
                    {"audits", r.audits}, {"audits_failed", r.audits_failed}, {"withheld", r.withheld}});
  }
  return {{"model_identity", cat.model_identity}, {"architecture", cat.architecture}, {"replicas", cfg.replicas},
          {"n_experts", cat.n_experts}, {"layers", grid}, {"nodes", list}};
}

std::string dashboard_html() {
  return R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>essaim coordinator</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;background:#fafafa;color:#222}
h1{font-size:1.3em} h2{font-size:1.05em;margin-top:1.5em}
table{border-collapse:collapse} td,th{padding:2px 6px;border:1px solid #ccc;font-size:12px}
#grid td{min-width:2.2em;text-align:center} td.scarce{outline:2px solid #c00}
#status{color:#666;font-size:12px}
</style></head><body>
<h1>essaim coordinator</h1>
<div id="model"></div><div id="status">loading…</div>
<h2>Coverage (holders per layer × expert range; red outline: fewer than the wanted replicas)</h2>
<table id="grid"></table>
<h2>Nodes</h2>
<table id="nodes"><thead><tr><th>node</th><th>name</th><th>status</th><th>load</th><th>holdings</th>
<th>pairs credited</th><th>audits</th><th>failed</th><th>withheld</th></tr></thead><tbody></tbody></table>
<script>
function cell(tr, text, cls) { const td = document.createElement('td'); td.textContent = text; if (cls) td.className = cls; tr.appendChild(td); return td; }
function colour(h, r) { if (h === 0) return '#f4b6b6'; const f = Math.min(1, h / Math.max(1, r)); return 'rgb(' + Math.round(255 - 120 * f) + ',' + Math.round(230 - 20 * f) + ',' + Math.round(200 - 120 * f) + ')'; }
async function refresh() {
  try {
    const d = await (await fetch('/api/dashboard', {cache: 'no-store'})).json();
    document.getElementById('model').textContent = d.architecture + ' · model ' + d.model_identity.slice(0, 16) + '… · ' + d.replicas + ' replicas wanted';
    const grid = document.getElementById('grid'); grid.replaceChildren();
    const head = document.createElement('tr'); cell(head, 'layer');
    if (d.layers.length) for (const r of d.layers[0].ranges) cell(head, r.expert_first + '–' + (r.expert_first + r.expert_count - 1));
    grid.appendChild(head);
    for (const l of d.layers) {
      const tr = document.createElement('tr'); tr.className = 'layer'; cell(tr, 'L' + l.layer);
      for (const r of l.ranges) { const td = cell(tr, String(r.holders), r.scarce ? 'scarce' : ''); td.style.background = colour(r.holders, d.replicas); td.title = 'experts ' + r.expert_first + '+' + r.expert_count; }
      grid.appendChild(tr);
    }
    const body = document.querySelector('#nodes tbody'); body.replaceChildren();
    for (const n of d.nodes) {
      const tr = document.createElement('tr'); tr.className = 'node'; tr.dataset.status = n.status;
      for (const v of [n.node_id, n.name, n.status, n.load.toFixed(2), n.holdings, n.pairs_credited, n.audits, n.audits_failed, n.withheld]) cell(tr, String(v));
      body.appendChild(tr);
    }
    document.getElementById('status').textContent = 'updated ' + new Date().toLocaleTimeString() + ' · ' + d.nodes.length + ' nodes';
  } catch (e) { document.getElementById('status').textContent = 'coordinator unreachable: ' + e; }
}
refresh(); setInterval(refresh, 2000);
</script></body></html>
)HTML";
}

}  // namespace essaim::coord
