#!/usr/bin/env bash
# Paper Figure 3: certified lower bounds on small ReLU networks (MNIST 2x[20] and 3x[20]) from
# CROWN(-Ada), CROWN-Quad, Fast-Lin, Fast-Lip and LP-Full, beside the exact minimum distortion
# (the paper used Reluplex; here a MILP) and the PGD attack's upper bound, with times.
# CROWN-Quad only applies to 2-layer networks, and LP-Full and exact only to the l_inf and l_1
# balls, so each network is run twice: those norms with every method (<net>.poly.csv), l_2
# without LP-Full and exact (<net>.l2.csv). The report joins them by network name.
#
#   scripts/paper_figure3.sh                     # 100 images, as in the paper
#
# Environment: OUT (default paper_results/figure3), NUM_IMAGES (100), METHODS (default
# crown,crown-quad,fast-lin,fast-lip,lp-full,exact; alpha-crown may be added; unsupported
# combinations are dropped as above), TARGETS (runner-up,random,least), TIMEOUT (seconds per image for exact,
# default 120), and CROWN, ATTACK, PLOT as in scripts/paper_lib.sh.
# Writes OUT/figure3.md/.tex (and OUT/figure3.png with PLOT=1).
set -euo pipefail

OUT="${OUT:-paper_results/figure3}"
NUM_IMAGES="${NUM_IMAGES:-100}"
METHODS="${METHODS:-crown,crown-quad,fast-lin,fast-lip,lp-full,exact}"
TARGETS="${TARGETS:-runner-up,random,least}"
TIMEOUT="${TIMEOUT:-120}"
source "$(dirname "${BASH_SOURCE[0]}")/paper_lib.sh"

csvs=()
for net in mnist_2x20 mnist_3x20; do
    methods="$METHODS"
    [[ "$net" == mnist_2x20 ]] || methods="$(keep_methods "$methods" crown-quad)"
    extra=()
    [[ ",$methods," == *,exact,* ]] && extra=(--timeout "$TIMEOUT")
    run_certify "$net.h5" "$OUT/$net.poly.csv" "$methods" inf,1 ${extra[@]+"${extra[@]}"}
    l2_methods="$(keep_methods "$methods" lp-full exact)"
    run_certify "$net.h5" "$OUT/$net.l2.csv" "$l2_methods" 2
    csvs+=("$OUT/$net.poly.csv")
    [[ -z "$l2_methods" ]] || csvs+=("$OUT/$net.l2.csv")
done
run_report figure3 "${csvs[@]}"
