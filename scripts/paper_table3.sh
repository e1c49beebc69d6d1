#!/usr/bin/env bash
# Paper Table 3: CROWN's certified lower bounds on MNIST 3x[1024] networks with ReLU (CROWN-Ada),
# tanh, sigmoid and arctan activations, every norm, with average time per image. The paper's
# CIFAR 6x[2048] networks are not shipped. The report has one row per (network, norm, target).
#
#   NUM_IMAGES=100 scripts/paper_table3.sh       # the paper's 100 images (default 20)
#
# Environment: OUT (default paper_results/table3), NUM_IMAGES, METHODS (default crown-paper,
# the paper's lines, so the table is the paper's as printed; crown adds the default lines,
# tighter for tanh, sigmoid and arctan (docs/methods.md), the same for ReLU; alpha-crown
# optimised slopes for ReLU, optimised tangent points for the others),
# NORMS (inf,2,1), TARGETS (runner-up,random,least), and CROWN, ATTACK, PLOT as in
# scripts/paper_lib.sh. Writes OUT/mnist_3x1024[_act].csv and OUT/table3.md/.tex.
set -euo pipefail

OUT="${OUT:-paper_results/table3}"
NUM_IMAGES="${NUM_IMAGES:-20}"
METHODS="${METHODS:-crown-paper}"
NORMS="${NORMS:-inf,2,1}"
TARGETS="${TARGETS:-runner-up,random,least}"
source "$(dirname "${BASH_SOURCE[0]}")/paper_lib.sh"

csvs=()
for net in mnist_3x1024 mnist_3x1024_tanh mnist_3x1024_sigmoid mnist_3x1024_arctan; do
    methods="$METHODS"
    run_certify "$net.h5" "$OUT/$net.csv" "$methods" "$NORMS"
    csvs+=("$OUT/$net.csv")
done
run_report table3 "${csvs[@]}"
