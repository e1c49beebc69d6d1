#!/usr/bin/env bash
# Paper Table 2: certified lower bounds of Fast-Lin, Fast-Lip and CROWN(-Ada) on a large ReLU
# network, every norm, three target types, with average time per image and CROWN's
# improvement over Fast-Lin. The paper uses MNIST 4x[1024] (and CIFAR 7x[1024], which needs the
# CIFAR-10 training set, not available here); this runs the shipped MNIST 3x[1024] and 4x[1024]
# ReLU networks.
#
#   NUM_IMAGES=100 scripts/paper_table2.sh       # the paper's 100 images (default 20)
#
# Environment: OUT (default paper_results/table2), NUM_IMAGES, METHODS (default
# fast-lin,fast-lip,crown; add alpha-crown for the README's alpha-CROWN table), NORMS (inf,2,1), TARGETS (runner-up,random,least), and CROWN,
# ATTACK, PLOT as in scripts/paper_lib.sh. Writes OUT/mnist_{3,4}x1024.csv, OUT/table2.md/.tex.
set -euo pipefail

OUT="${OUT:-paper_results/table2}"
NUM_IMAGES="${NUM_IMAGES:-20}"
METHODS="${METHODS:-fast-lin,fast-lip,crown}"
NORMS="${NORMS:-inf,2,1}"
TARGETS="${TARGETS:-runner-up,random,least}"
source "$(dirname "${BASH_SOURCE[0]}")/paper_lib.sh"

run_certify mnist_3x1024.h5 "$OUT/mnist_3x1024.csv" "$METHODS" "$NORMS"
run_certify mnist_4x1024.h5 "$OUT/mnist_4x1024.csv" "$METHODS" "$NORMS"
run_report table2 "$OUT/mnist_3x1024.csv" "$OUT/mnist_4x1024.csv"
