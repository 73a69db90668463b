#!/usr/bin/env python3
"""Runs essaim-sim's experiments of docs/scale.md and plots them (matplotlib).

  /usr/bin/python3 docs/scale/experiments.py throughput [WORKERS [BACKBONES [LEAN]]]
      # tok/s and token latency vs workers; lists comma-separated (default 100,300,1000,3000,10000 and
      # 1,4,16), LEAN "plain", "lean" or "both" (default); runs whose JSON exists are kept, not run again
  /usr/bin/python3 docs/scale/experiments.py table        # the throughput table of docs/scale.md, as markdown
  /usr/bin/python3 docs/scale/experiments.py bottleneck [WORKERS [BACKBONES [LEAN]]]
      # one throughput cell (default 1,000 workers, 1 and 16 backbones, lean) with each part 10x faster
  /usr/bin/python3 docs/scale/experiments.py bottleneck_table
  /usr/bin/python3 docs/scale/experiments.py diurnal      # coverage over 24 h of diurnal churn
  /usr/bin/python3 docs/scale/experiments.py plot         # plots from the JSON already written

Each run's JSON report is written to docs/scale/runs/NAME.json (the scenario is inside it)."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SIM = os.environ.get("ESSAIM_SIM", os.path.join(ROOT, "build", "src", "sim", "essaim-sim"))
RUNS = os.path.join(HERE, "runs")


def run(name, scenario, args=()):
    os.makedirs(RUNS, exist_ok=True)
    path = os.path.join(RUNS, name + ".scenario.json")
    with open(path, "w") as f:
        json.dump(scenario, f)
    out = subprocess.run([SIM, "--scenario", path, "--json", *args], check=True, capture_output=True, text=True).stdout
    os.remove(path)
    with open(os.path.join(RUNS, name + ".json"), "w") as f:
        f.write(out)
    r = json.loads(out)
    print(name, "tok/s %.2f p50 %.2f s p99 %.2f s fallback %d wall %.1f s" % (
        r["tok_s"], r["token_latency_s"]["p50"], r["token_latency_s"]["p99"], r["pairs"]["fallback"], r["wall_s"]),
        flush=True)
    return r


def throughput_scenario(workers, backbones, lean):
    # No churn; the market asked for as many replicas as the budgets can hold (about one per 40 workers of
    # the default mix), so holders grow with the swarm; a burst of 4 decode steps every 2 minutes; slices
    # served as from a CDN (each download limited by the worker's downlink only).
    s = {"workers": workers, "backbones": backbones, "hours": 0.5, "warmup_s": 1200, "probe_every_s": 120,
         "probe_steps": 4, "replicas": max(2, workers // 40), "slice_server_mbps": 0,
         "coverage_every_s": 600,
         "classes": [{"name": "phone", "share": 0.6, "budget_mb": 1536, "speed": 0.5, "uplink_mbps": 10,
                      "downlink_mbps": 40, "rtt_ms": 40},
                     {"name": "laptop", "share": 0.35, "budget_mb": 6144, "speed": 2, "uplink_mbps": 20,
                      "downlink_mbps": 100, "rtt_ms": 20},
                     {"name": "gpu", "share": 0.05, "budget_mb": 20480, "speed": 30, "uplink_mbps": 100,
                      "downlink_mbps": 500, "rtt_ms": 10}]}
    if lean:
        s.update({"hot_cache_mb": 4096, "bf16_wire": True})
    return s


def throughput_name(workers, backbones, lean):
    return "throughput_w%d_b%d%s" % (workers, backbones, "_lean" if lean else "")


def throughput(workers="100,300,1000,3000,10000", backbones="1,4,16", lean="both"):
    leans = {"plain": (False,), "lean": (True,), "both": (False, True)}[lean]
    for w in (int(x) for x in workers.split(",")):
        for b in (int(x) for x in backbones.split(",")):
            for l in leans:
                if not os.path.exists(os.path.join(RUNS, throughput_name(w, b, l) + ".json")):
                    run(throughput_name(w, b, l), throughput_scenario(w, b, l))


# What each part would change if it were 10 times faster: a run of one throughput cell per variant.
BOTTLENECK_VARIANTS = {
    "worker_compute_x10": lambda s: [c.update(speed=c["speed"] * 10) for c in s["classes"]],
    "worker_uplink_x10": lambda s: [c.update(uplink_mbps=c["uplink_mbps"] * 10) for c in s["classes"]],
    "worker_rtt_div10": lambda s: [c.update(rtt_ms=c["rtt_ms"] / 10) for c in s["classes"]],
    "backbone_link_x10": lambda s: s.update(backbone_mbps=10000),
    "backbone_compute_x10": lambda s: s.update(backbone_layer_ms=0.05, backbone_row_us=2, backbone_speed=160),
    # Not a part made faster: 35 bursts measured instead of 5, to see what the replica choice's first
    # measurements of each new link cost.
    "measured_x7": lambda s: s.update(hours=1.5),
}


def bottleneck(workers="1000", backbones="1,16", lean="lean"):
    for w in (int(x) for x in workers.split(",")):
        for b in (int(x) for x in backbones.split(",")):
            for l in {"plain": (False,), "lean": (True,), "both": (False, True)}[lean]:
                for name, change in BOTTLENECK_VARIANTS.items():
                    path = "bottleneck_w%d_b%d%s_%s" % (w, b, "_lean" if l else "", name)
                    if os.path.exists(os.path.join(RUNS, path + ".json")):
                        continue
                    sc = throughput_scenario(w, b, l)
                    change(sc)
                    run(path, sc)


def bottleneck_table():
    print("| run | variant | tok/s | × | token latency p50 / p99 | pairs fallen back | wall |")
    print("|---|---|---|---|---|---|---|")
    for n in run_names("bottleneck_"):
        r = load(n)
        sc = r["scenario"]
        base = load(throughput_name(sc["workers"], sc["backbones"], sc["bf16_wire"]))
        variant = next(v for v in BOTTLENECK_VARIANTS if n.endswith(v))
        lat, pairs = r["token_latency_s"], r["pairs"]
        print("| %s workers, %d backbone%s%s | %s | %.2f (%.2f) | %.2f | %.1f / %.1f s | %.1f %% | %s |" % (
            "{:,}".format(sc["workers"]), sc["backbones"], "s" if sc["backbones"] > 1 else "",
            ", cache + bf16" if sc["bf16_wire"] else "", variant.replace("_", " "), r["tok_s"], base["tok_s"],
            r["tok_s"] / base["tok_s"], lat["p50"], lat["p99"], 100.0 * pairs["fallback"] / max(1, pairs["total"]),
            wall(r["wall_s"])))


def table():
    print("| workers | backbones | lean | replicas | tok/s (all backbones) | token latency p50 / p99 "
          "| pairs fallen back | slices with all replicas at 20 min | wall |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for n in run_names("throughput_"):
        r = load(n)
        sc = r["scenario"]
        rows.append((sc["workers"], sc["backbones"], sc["bf16_wire"], r))
    for w, b, lean, r in sorted(rows, key=lambda x: x[:3]):
        lat, pairs = r["token_latency_s"], r["pairs"]
        full = [p["replicated"] for p in r["coverage"]["points"] if p["t_s"] == r["scenario"]["warmup_s"]]
        print("| %s | %d | %s | %d | %.2f | %.1f / %.1f s | %.1f %% | %s | %s |" % (
            "{:,}".format(w), b, "4 GB hot cache + bf16" if lean else "—", r["scenario"]["replicas"], r["tok_s"],
            lat["p50"], lat["p99"], 100.0 * pairs["fallback"] / max(1, pairs["total"]),
            "%.2f" % full[0] if full else "—", wall(r["wall_s"])))


def wall(s):
    return "%d s" % round(s) if s < 120 else "%d min %02d s" % (s // 60, round(s % 60))


def diurnal(workers=1000):
    run("diurnal_w%d" % workers, {"hours": 24, "replicas": 2, "diurnal": True, "heartbeat_while_downloading": True,
                                   "probe_every_s": 900, "probe_steps": 2, "coverage_every_s": 900},
        ["--workers", str(workers)])


def run_names(prefix):
    """The runs written so far whose names start with prefix (not a run in progress's scenario file)."""
    return sorted(n[:-5] for n in os.listdir(RUNS)
                  if n.startswith(prefix) and n.endswith(".json") and not n.endswith(".scenario.json"))


def load(name):
    with open(os.path.join(RUNS, name + ".json")) as f:
        return json.load(f)


def plot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = run_names("throughput_")
    series = {}
    for n in names:
        r = load(n)
        key = (r["scenario"]["backbones"], r["scenario"]["bf16_wire"])
        series.setdefault(key, []).append((r["scenario"]["workers"], r["tok_s"], r["token_latency_s"]["p50"],
                                           r["token_latency_s"]["p99"]))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for k, ((bb, lean), pts) in enumerate(sorted(series.items())):
        pts.sort()
        label = "%d backbone%s%s" % (bb, "s" if bb > 1 else "", ", hot cache + bf16" if lean else "")
        color = "C%d" % k  # one colour per series, its p50 and p99 alike
        a.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=color, label=label)
        b.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", color=color, label=label + " p50")
        b.plot([p[0] for p in pts], [p[3] for p in pts], marker="x", linestyle="--", color=color, label=label + " p99")
    a.set_xscale("log"); a.set_xlabel("workers"); a.set_ylabel("aggregate tok/s"); a.legend(fontsize=7)
    b.set_xscale("log"); b.set_yscale("log"); b.set_xlabel("workers"); b.set_ylabel("token latency (s)")
    b.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "throughput.png"), dpi=110)
    for n in run_names("diurnal_"):
        r = load(n)
        pts = r["coverage"]["points"]
        fig, a = plt.subplots(figsize=(9, 3.5))
        t = [p["t_s"] / 3600 for p in pts]
        a.plot(t, [p["covered"] for p in pts], label="slices with >= 1 holder")
        a.plot(t, [p["replicated"] for p in pts], label="slices with >= 2 holders")
        a.set_ylim(0, 1.05); a.set_xlabel("hour"); a.set_ylabel("share of slices")
        a2 = a.twinx()
        a2.plot(t, [p["online"] for p in pts], color="grey", linestyle=":", label="workers online")
        a2.set_ylabel("workers online")
        a.legend(loc="lower left", fontsize=7); a2.legend(loc="lower right", fontsize=7)
        a.set_title("%s: %d workers, diurnal churn, 2 replicas" % (n, r["scenario"]["workers"]))
        fig.tight_layout()
        fig.savefig(os.path.join(HERE, n + ".png"), dpi=110)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "plot"
    {"throughput": throughput, "diurnal": diurnal, "plot": plot, "table": table, "bottleneck": bottleneck,
     "bottleneck_table": bottleneck_table}[what](*sys.argv[2:])
    if what in ("throughput", "diurnal"):
        plot()
