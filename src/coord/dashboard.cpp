// GET / (a self-contained page: inline CSS and JS, nothing fetched from elsewhere) and GET /api/dashboard
// (the summary it polls every 2 s: coverage per layer x range and over the last hour, nodes with role,
// status, last heartbeat, holdings, load, pairs/s and audits, backbones with tokens/s). Public, with no
// tokens and no addresses; with the admin token (the page takes it from its URL fragment, #admin=TOKEN,
// which browsers never send) the nodes' addresses too.
#include <map>

#include "coord/coordinator_impl.h"

namespace essaim::coord {

using json = nlohmann::json;

namespace {

std::string range_text(const CatalogueSlice& s) {
  return "L" + std::to_string(s.layer) + ":" + std::to_string(s.expert_first) + "-" +
         std::to_string(s.expert_first + s.expert_count - 1);
}

json coverage_grid(const Catalogue& cat, const std::vector<int64_t>& h, int64_t replicas) {
  std::map<int64_t, json> layers;
  for (size_t i = 0; i < cat.slices.size(); ++i) {
    const CatalogueSlice& s = cat.slices[i];
    if (!layers.count(s.layer)) layers[s.layer] = json::array();
    layers[s.layer].push_back({{"expert_first", s.expert_first}, {"expert_count", s.expert_count}, {"holders", h[i]},
                               {"scarce", h[i] < replicas}});
  }
  json grid = json::array();
  for (auto& [layer, ranges] : layers) grid.push_back({{"layer", layer}, {"ranges", ranges}});
  return grid;
}

}  // namespace

void Coordinator::Impl::note_coverage(int64_t now_ms, const std::vector<int64_t>& holders) {
  CoverageSample s{.t_ms = now_ms, .slices = int64_t(holders.size()), .uncovered = 0, .under_replicated = 0};
  for (int64_t x : holders) {
    s.uncovered += x == 0;
    s.under_replicated += x < cfg.replicas;
  }
  history.coverage(now_ms, s);
}

json Coordinator::Impl::dashboard_json(bool with_addresses) {
  Result<std::vector<NodeRow>> nodes = store->list_nodes();
  Result<std::vector<HoldingRow>> holdings = store->list_holdings();
  Result<std::vector<WorkRow>> work = store->list_work();
  if (!nodes || !holdings || !work) return {{"error", {{"message", "the store failed"}, {"code", "store_error"}}}};
  const int64_t now_ms = now();
  const std::vector<int64_t> h = count_holders(cat, *nodes, *holdings, now_ms, cfg.heartbeat_s);
  note_coverage(now_ms, h);
  std::map<std::string, WorkRow> w;
  for (const WorkRow& r : *work) w[r.node_id] = r;
  std::map<std::string, json> held;  // a stale node's holdings are listed too: the page strikes them out
  for (const HoldingRow& r : *holdings) {
    if (std::optional<size_t> i = cat.find(r.layer, r.expert_first, r.expert_count)) {
      held[r.node_id].push_back(range_text(cat.slices[*i]));
    }
  }
  const std::map<std::string, double> pairs_s = history.pairs_per_s(now_ms), tokens_s = history.tokens_per_s(now_ms);
  json list = json::array(), backbones = json::array();
  for (const NodeRow& n : *nodes) {
    const WorkRow r = w.count(n.node_id) ? w[n.node_id] : WorkRow{};
    json row = {{"node_id", n.node_id}, {"name", n.name}, {"role", n.role},
                {"status", node_status(n, now_ms, cfg.heartbeat_s)},
                {"last_seen_s", n.last_heartbeat_ms > 0 ? json(double(now_ms - n.last_heartbeat_ms) / 1000) : json(nullptr)},
                {"load", n.load}, {"holdings", held.count(n.node_id) ? held[n.node_id] : json::array()},
                {"pairs_per_s", pairs_s.count(n.node_id) ? pairs_s.at(n.node_id) : 0.0},
                {"pairs_credited", r.pairs_credited}, {"audits", r.audits}, {"audits_failed", r.audits_failed},
                {"withheld", r.withheld}};
    if (with_addresses) row["address"] = n.address;
    if (n.role == "backbone") {
      backbones.push_back({{"name", n.name}, {"tokens_per_s", tokens_s.count(n.node_id) ? tokens_s.at(n.node_id) : 0.0}});
    }
    list.push_back(std::move(row));
  }
  if (tokens_s.count("admin")) backbones.push_back({{"name", "admin token"}, {"tokens_per_s", tokens_s.at("admin")}});
  return {{"model_identity", cat.model_identity}, {"architecture", cat.architecture}, {"replicas", cfg.replicas},
          {"n_experts", cat.n_experts}, {"heartbeat_s", cfg.heartbeat_s}, {"now_ms", now_ms},
          {"layers", coverage_grid(cat, h, cfg.replicas)}, {"nodes", list}, {"backbones", backbones},
          {"coverage_history", history.coverage_strip(now_ms)}};
}

// Kept whole: the page is one HTML document (markup, style and script) in a raw string, not code.
std::string dashboard_html() {
  return R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>essaim coordinator</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;background:#fafafa;color:#222}
h1{font-size:1.3em} h2{font-size:1.05em;margin-top:1.5em}
table{border-collapse:collapse} td,th{padding:2px 6px;border:1px solid #ccc;font-size:12px}
#grid td{min-width:2.2em;text-align:center} td.scarce{outline:2px solid #c00}
#status{color:#666;font-size:12px}
tr[data-status=stale] td,tr[data-status=dropped] td,tr[data-status=revoked] td{color:#999}
td.struck{text-decoration:line-through}
td.st-stale,td.st-dropped,td.st-revoked{background:#f4d6d6;font-weight:bold}
#strip{position:relative;width:720px;height:22px;background:#eee;border:1px solid #ccc}
#strip span.tick{position:absolute;top:0;height:22px}
.axis{width:720px;display:flex;justify-content:space-between;font-size:11px;color:#666}
</style></head><body>
<h1>essaim coordinator</h1>
<div id="model"></div><div id="status">loading…</div>
<h2>Coverage (holders per layer × expert range; red outline: fewer than the wanted replicas)</h2>
<table id="grid"></table>
<h2>Coverage over the last hour (green: every range has its replicas · amber: some below · red: some with no holder)</h2>
<div id="strip"></div><div class="axis"><span>−60 min</span><span>−30 min</span><span>now</span></div>
<div id="strip-summary" style="font-size:12px;color:#666"></div>
<h2>Workers</h2>
<table id="nodes"><thead><tr><th>node</th><th>name</th><th>role</th><th>status</th><th>last seen</th><th>address</th>
<th>load</th><th>holdings</th><th>pairs/s</th><th>pairs credited</th><th>audits</th><th>failed</th><th>withheld</th></tr></thead><tbody></tbody></table>
<h2>Backbones</h2>
<table id="backbones"><thead><tr><th>node</th><th>name</th><th>role</th><th>status</th><th>tokens/s</th></tr></thead><tbody></tbody></table>
<script>
const admin = new URLSearchParams(location.hash.slice(1)).get('admin');
function cell(tr, text, cls) { const td = document.createElement('td'); td.textContent = text; if (cls) td.className = cls; tr.appendChild(td); return td; }
function colour(h, r) { if (h === 0) return '#f4b6b6'; const f = Math.min(1, h / Math.max(1, r)); return 'rgb(' + Math.round(255 - 120 * f) + ',' + Math.round(230 - 20 * f) + ',' + Math.round(200 - 120 * f) + ')'; }
function ago(s) { if (s === null) return 'never'; return s < 120 ? s.toFixed(1) + ' s ago' : Math.round(s / 60) + ' min ago'; }
function grid(d) {
  const grid = document.getElementById('grid'); grid.replaceChildren();
  const head = document.createElement('tr'); cell(head, 'layer');
  if (d.layers.length) for (const r of d.layers[0].ranges) cell(head, r.expert_first + '–' + (r.expert_first + r.expert_count - 1));
  grid.appendChild(head);
  for (const l of d.layers) {
    const tr = document.createElement('tr'); tr.className = 'layer'; cell(tr, 'L' + l.layer);
    for (const r of l.ranges) { const td = cell(tr, String(r.holders), r.scarce ? 'scarce' : ''); td.style.background = colour(r.holders, d.replicas); td.title = 'experts ' + r.expert_first + '+' + r.expert_count; }
    grid.appendChild(tr);
  }
}
function strip(d) {
  const el = document.getElementById('strip'); el.replaceChildren();
  const hour = 3600 * 1000, h = d.coverage_history;
  for (let i = 0; i < h.length; ++i) {
    const s = h[i], end = i + 1 < h.length ? h[i + 1].t_ms : d.now_ms;
    const x = Math.max(0, (s.t_ms - (d.now_ms - hour)) / hour * 720), w = Math.max(1, (end - s.t_ms) / hour * 720);
    const t = document.createElement('span'); t.className = 'tick';
    t.dataset.state = s.uncovered > 0 ? 'uncovered' : s.under_replicated > 0 ? 'under' : 'full';
    t.style.left = x + 'px'; t.style.width = w + 'px';
    t.style.background = s.uncovered > 0 ? '#d33' : s.under_replicated > 0 ? '#e9a23b' : '#3a3';
    t.title = new Date(s.t_ms).toLocaleTimeString() + ': ' + s.uncovered + ' uncovered, ' + s.under_replicated + ' below replicas of ' + s.slices;
    el.appendChild(t);
  }
  const holes = h.filter(s => s.uncovered > 0).length;
  document.getElementById('strip-summary').textContent = h.length + ' samples; ' + holes + ' with a range no one held';
}
function nodes(d) {
  const body = document.querySelector('#nodes tbody'); body.replaceChildren();
  const bb = document.querySelector('#backbones tbody'); bb.replaceChildren();
  const rates = new Map(d.backbones.map(b => [b.name, b.tokens_per_s]));
  for (const n of d.nodes) {
    const tr = document.createElement('tr'); tr.className = 'node'; tr.dataset.status = n.status; tr.dataset.role = n.role;
    if (n.role === 'backbone') {  // a backbone never heartbeats: its state is whether it reported lately
      const rate = rates.get(n.name) || 0, state = n.status === 'revoked' ? 'revoked' : rate > 0 ? 'reporting' : 'idle';
      tr.dataset.status = state;
      for (const v of [n.node_id, n.name, n.role]) cell(tr, String(v));
      cell(tr, state, 'st-' + state); cell(tr, rate.toFixed(1), 'tokens');
      bb.appendChild(tr); continue;
    }
    for (const v of [n.node_id, n.name, n.role]) cell(tr, String(v));
    cell(tr, n.status, 'st-' + n.status); cell(tr, ago(n.last_seen_s), 'seen');
    cell(tr, n.address === undefined ? '(admin only)' : n.address || '—', 'address');
    // A node that is not active serves nothing: what it last said it held is struck out.
    cell(tr, n.load.toFixed(2)); cell(tr, n.holdings.join(' ') || '—', n.status === 'active' ? 'holdings' : 'holdings struck');
    cell(tr, n.pairs_per_s.toFixed(1), 'pairs');
    for (const v of [n.pairs_credited, n.audits, n.audits_failed, n.withheld]) cell(tr, String(v));
    body.appendChild(tr);
  }
  for (const b of d.backbones) if (b.name === 'admin token') {
    const tr = document.createElement('tr'); tr.className = 'admin-backbone';
    for (const v of ['—', b.name, 'admin', '—']) cell(tr, v);
    cell(tr, b.tokens_per_s.toFixed(1), 'tokens'); bb.appendChild(tr);
  }
}
async function refresh() {
  try {
    const opts = {cache: 'no-store'}; if (admin) opts.headers = {Authorization: 'Bearer ' + admin};
    const d = await (await fetch('/api/dashboard', opts)).json();
    document.getElementById('model').textContent = d.architecture + ' · model ' + d.model_identity.slice(0, 16) + '… · ' + d.replicas + ' replicas wanted · heartbeat ' + d.heartbeat_s + ' s';
    grid(d); strip(d); nodes(d);
    document.getElementById('status').textContent = 'updated ' + new Date().toLocaleTimeString() + ' · ' + d.nodes.length + ' nodes';
  } catch (e) { document.getElementById('status').textContent = 'coordinator unreachable: ' + e; }
}
refresh(); setInterval(refresh, 2000);
</script></body></html>
)HTML";
}

}  // namespace essaim::coord
