#!/usr/bin/env bash
# essaim against llama.cpp and ik_llama.cpp on the same files: `essaim bench` and each peer's llama-bench,
# alternating round by round in one process tree, on the synth q35-122b files (qwen35moe 4 layers: 3 Gated
# DeltaNet + 1 attention; qwen3moe 2 layers; Q4_K_M). Prints one JSON document: per file and engine the
# median over rounds of pp and tg tokens/s, essaim's fraction of the read bandwidth, and essaim / peer — as
# the ratio of the medians ("ratios") and as the median of each round's ratio ("paired_ratios") — and every
# round's figures ("per_round").
#
#   scripts/bench-vs-llama.sh                          # 3 rounds, 2 threads, -p 512 -n 64, -r 1 per round
#   ROUNDS=5 THREADS=2 scripts/bench-vs-llama.sh --essaim build/src/cli/essaim
#   scripts/bench-vs-llama.sh --model a.gguf --model b.gguf
#   ESSAIM_ARGS=--no-mmap scripts/bench-vs-llama.sh       # extra flags for essaim bench
#
# The peers are tools to compare with, never part of essaim's build, tests or CI: a peer whose llama-bench
# is absent is reported as absent. They come from ../shared/tools/llama-cpp-reference [--ik] (builds them
# outside the project, ~10 min each) or from $LLAMA_BENCH / $IK_LLAMA_BENCH. ik_llama.cpp runs with
# `-rtr 1` (its run-time repacking). Synth files are written once into $DATA_DIR (same options, same bytes).
# On a CPU with AMX the stock llama.cpp build (GGML_NATIVE) may crash in its AMX matrix path; build it again
# from the same sources with CMAKE_C_FLAGS/CMAKE_CXX_FLAGS="-mno-amx-int8 -mno-amx-tile -mno-amx-bf16" into
# another directory and point $LLAMA_BENCH at that llama-bench (docs/engine.md, "Decode prefetch on an Intel
# machine").
set -euo pipefail
cd "$(dirname "$0")/.."
ESSAIM=build/src/cli/essaim
DATA_DIR=${DATA_DIR:-/var/tmp/essaim-bench}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
P=${P:-512}
N=${N:-64}
REPS=${REPS:-1}
MODELS=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --essaim) ESSAIM=$2; shift 2;;
    --model) MODELS+=("$2"); shift 2;;
    *) echo "usage: $0 [--essaim BIN] [--model FILE]...  (env: ROUNDS THREADS P N REPS DATA_DIR ESSAIM_ARGS)" >&2; exit 2;;
  esac
done
command -v jq >/dev/null || { echo "bench-vs-llama: needs jq (scripts/install-deps.sh)" >&2; exit 1; }
[[ -x $ESSAIM ]] || { echo "bench-vs-llama: no essaim binary at $ESSAIM (build it first)" >&2; exit 1; }

REF=${LLAMA_REF_DIR:-/var/tmp/llama-cpp-reference}
LLAMA_BENCH=${LLAMA_BENCH:-$REF/build/bin/llama-bench}
IK_LLAMA_BENCH=${IK_LLAMA_BENCH:-$REF/ik/build/bin/llama-bench}

if [[ ${#MODELS[@]} == 0 ]]; then
  mkdir -p "$DATA_DIR"
  for spec in "qwen35moe 4" "qwen3moe 2"; do
    read -r arch layers <<<"$spec"
    f=$DATA_DIR/$arch-q35-122b-${layers}l-q4_k_m.gguf
    if [[ ! -f $f ]]; then
      "$ESSAIM" synth --arch "$arch" --preset q35-122b --layers "$layers" --types q4_k_m -o "$f.part" >&2
      mv "$f.part" "$f"
    fi
    MODELS+=("$f")
  done
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# One round of one engine on one file -> one JSON line {engine, pp, tg[, read_gb_per_s, mapped_in_2mib_pages,
# fraction]}; the summary keeps essaim's least share of the model mapped in 2 MiB pages over the rounds
# (a mapped decode is slow below ~90 %: docs/engine.md, "The mapped file in 2 MiB pages").
run_essaim() {
  "$ESSAIM" bench -m "$1" -p "$P" -n "$N" -r "$REPS" -t "$THREADS" ${ESSAIM_ARGS:-} --json |
    jq -c --arg p "pp$P" --arg n "tg$N" '{engine: "essaim", isa: .isa,
      pp: (.tests[] | select(.test == $p) | .avg_ts), tg: (.tests[] | select(.test == $n) | .avg_ts),
      read_gb_per_s: .read_gb_per_s_best, mapped_in_2mib_pages: .mapped_in_2mib_pages,
      fraction_of_read_bandwidth: (.tests[] | select(.test == $n) | .fraction_of_read_bandwidth)}'
}
run_llama() {  # engine name, binary, file, extra flags
  local name=$1 bin=$2 file=$3
  shift 3
  "$bin" -m "$file" -p "$P" -n "$N" -r "$REPS" -t "$THREADS" "$@" -o json 2>/dev/null |
    jq -c --arg e "$name" '{engine: $e,
      pp: (map(select(.n_prompt > 0 and .n_gen == 0)) | .[0].avg_ts),
      tg: (map(select(.n_gen > 0 and .n_prompt == 0)) | .[0].avg_ts)}'
}

for file in "${MODELS[@]}"; do
  out=$TMP/$(basename "$file").jsonl
  : >"$out"
  for ((r = 1; r <= ROUNDS; r++)); do
    echo "bench-vs-llama: $(basename "$file") round $r/$ROUNDS" >&2
    run_essaim "$file" | jq -c --argjson r "$r" '. + {round: $r}' >>"$out"
    [[ -x $LLAMA_BENCH ]] && run_llama llama.cpp "$LLAMA_BENCH" "$file" | jq -c --argjson r "$r" '. + {round: $r}' >>"$out"
    [[ -x $IK_LLAMA_BENCH ]] && run_llama ik_llama.cpp "$IK_LLAMA_BENCH" "$file" -rtr 1 |
      jq -c --argjson r "$r" '. + {round: $r}' >>"$out"
  done
  jq -s --arg file "$file" --argjson llama "$([[ -x $LLAMA_BENCH ]] && echo true || echo false)" \
        --argjson ik "$([[ -x $IK_LLAMA_BENCH ]] && echo true || echo false)" '
    def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
                        else (.[length / 2 - 1] + .[length / 2]) / 2 end;
    def med(e; k): [.[] | select(.engine == e) | .[k] | select(. != null)] | median;
    def ratio(a; b): if a == null or b == null then null else a / b end;
    # essaim / engine e within each round (the engines of a round ran minutes apart, not hours), then the
    # median over rounds: steadier than the ratio of medians when the host drifts between rounds.
    def paired(e; k): [group_by(.round)[] | ([.[] | select(.engine == "essaim") | .[k]][0]) as $a
                        | ([.[] | select(.engine == e) | .[k]][0]) as $b
                        | select($a != null and $b != null) | $a / $b] | median;
    . as $rows
    | {file: $file, rounds: ($rows | map(select(.engine == "essaim")) | length),
       essaim: {pp: med("essaim"; "pp"), tg: med("essaim"; "tg"), isa: ($rows[0].isa),
                read_gb_per_s: med("essaim"; "read_gb_per_s"),
                mapped_in_2mib_pages_least: ([$rows[] | select(.engine == "essaim") | .mapped_in_2mib_pages
                                              | select(. != null)] | min),
                fraction_of_read_bandwidth: med("essaim"; "fraction_of_read_bandwidth")},
       llama_cpp: (if $llama then {pp: med("llama.cpp"; "pp"), tg: med("llama.cpp"; "tg")} else "absent" end),
       ik_llama_cpp_rtr: (if $ik then {pp: med("ik_llama.cpp"; "pp"), tg: med("ik_llama.cpp"; "tg")} else "absent" end)}
    | .ratios = {pp_vs_llama_cpp: (if $llama then ratio(.essaim.pp; .llama_cpp.pp) else null end),
                 tg_vs_llama_cpp: (if $llama then ratio(.essaim.tg; .llama_cpp.tg) else null end),
                 pp_vs_ik_llama_cpp: (if $ik then ratio(.essaim.pp; .ik_llama_cpp_rtr.pp) else null end),
                 tg_vs_ik_llama_cpp: (if $ik then ratio(.essaim.tg; .ik_llama_cpp_rtr.tg) else null end)}
    | .paired_ratios = {pp_vs_llama_cpp: (if $llama then ($rows | paired("llama.cpp"; "pp")) else null end),
                        tg_vs_llama_cpp: (if $llama then ($rows | paired("llama.cpp"; "tg")) else null end),
                        pp_vs_ik_llama_cpp: (if $ik then ($rows | paired("ik_llama.cpp"; "pp")) else null end),
                        tg_vs_ik_llama_cpp: (if $ik then ($rows | paired("ik_llama.cpp"; "tg")) else null end)}
    # Every round as measured, so a spread can be read back (the medians hide which engine moved).
    | .per_round = [$rows | group_by(.round)[] | {round: .[0].round,
                     engines: map({key: .engine, value: {pp, tg}}) | from_entries}]
  ' "$out" >"$out.summary"
done
jq -s --arg threads "$THREADS" --arg p "$P" --arg n "$N" --arg cpu "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')" \
  '{benchmark: "essaim vs llama.cpp / ik_llama.cpp", cpu: $cpu, threads: ($threads | tonumber),
    n_prompt: ($p | tonumber), n_gen: ($n | tonumber), files: .}' "$TMP"/*.summary
