# Shared by scripts/paper_*.sh: sourced, not run. Expects OUT, NUM_IMAGES, TARGETS to be set.
#
# CROWN   the crown command (default `crown`; from a checkout: CROWN="python -m crown_cli")
# ATTACK  pgd (default) adds the PGD upper bound to every row; none skips it
# PLOT    1 also draws <name>.png with `crown report --plot` (needs matplotlib)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
read -r -a CROWN_CMD <<< "${CROWN:-crown}"
ATTACK="${ATTACK:-pgd}"
PLOT="${PLOT:-0}"
mkdir -p "$OUT"

# keep_methods LIST DROP...: LIST (comma-separated) without the DROP methods
keep_methods() {
    local list="$1" m all out=()
    shift
    IFS=, read -r -a all <<< "$list"
    for m in "${all[@]}"; do
        [[ " $* " == *" $m "* ]] || out+=("$m")
    done
    (IFS=,; echo "${out[*]}")
}

# run_certify MODEL CSV METHODS NORMS [more certify options]: one CSV of rows
run_certify() {
    local model="$1" csv="$2" methods="$3" norms="$4"
    shift 4
    if [[ -z "$methods" ]]; then
        echo "== $model, norms $norms: no method left to run, skipped" >&2
        return
    fi
    local attack=()
    [[ "$ATTACK" == none ]] || attack=(--attack "$ATTACK")
    echo "== $model: --method $methods --norm $norms --target $TARGETS -n $NUM_IMAGES -> $csv" >&2
    "${CROWN_CMD[@]}" certify --model "$ROOT/models/$model" -n "$NUM_IMAGES" \
        --method "$methods" --norm "$norms" --target "$TARGETS" \
        ${attack[@]+"${attack[@]}"} -o "$csv" --overwrite "$@"
}

# run_report NAME CSV...: $OUT/NAME.md and $OUT/NAME.tex (and $OUT/NAME.png with PLOT=1)
run_report() {
    local name="$1"
    shift
    local plot=()
    [[ "$PLOT" == 1 ]] && plot=(--plot "$OUT/$name.png")
    "${CROWN_CMD[@]}" report "$@" --overwrite -o "$OUT/$name.md" ${plot[@]+"${plot[@]}"}
    "${CROWN_CMD[@]}" report "$@" --format latex --overwrite -o "$OUT/$name.tex"
    echo "== wrote $OUT/$name.md and $OUT/$name.tex" >&2
    cat "$OUT/$name.md"
}
