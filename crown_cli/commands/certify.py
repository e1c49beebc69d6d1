"""``crown certify``: certified radii of a model on a file of images, one result row per
(image, norm, method, target)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import click
import numpy as np

from crown_cli.certification.runner import attack_for, certifier_for, choose_kernels
from crown_cli.commands.common import (MAX_RADIUS, _deprecated, _handle_errors, _run_job, _split,
                                      check_memory_budget, memory_budget_option)
from crown_cli.errors import InputError


@click.command()
@click.option("--model", "model_path", required=True, type=click.Path(dir_okay=True), metavar="FILE",
              help="Model file: NPZ, HDF5 (W0.., b0..), Keras model.save() HDF5 or .keras, or .onnx.")
@click.option("--images", "images_path", default=None, metavar="FILE",
              help="Image file: NPZ (x, y), MNIST IDX (gz or raw) or CIFAR CSV. "
                   "Default: the first 100 MNIST test images shipped with crown.")
@click.option("--labels", "labels_path", default=None, metavar="FILE", help="Labels IDX file for IDX images "
              "(default: the labels file beside the images).")
@click.option("--num-images", "-n", type=click.IntRange(min=1), default=None, metavar="N",
              help="Number of images to process (default: all from --start on).")
@click.option("--start", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Index of the first image.")
@click.option("--norm", default="inf", show_default=True, metavar="LIST",
              help="l_p norm of the ball: inf, 2 or 1 (comma-separated list allowed).")
@click.option("--method", default="crown", show_default=True, metavar="LIST",
              help="crown (adaptive ReLU lower bound; least-area tangents for tanh, sigmoid, "
                   "arctan), crown-paper (the paper's lines), fast-lin, crown-quad (quadratic bounds, "
                   "2-layer ReLU only), alpha-crown (optimised ReLU lower slopes, ReLU and leaky "
                   "ReLU; optimised tangent points, tanh, sigmoid, arctan), fast-lip, op-norm, "
                   "lp-full or exact (comma-separated list allowed).")
@click.option("--alpha-iters", type=int, default=None, metavar="N",
              help="alpha-crown: most gradient steps per optimisation (default 25; early "
                   "stopping usually ends sooner; 0: CROWN's slopes). Graph networks: 20 "
                   "(the intermediate bounds' optimisations stop early, the margin rows' "
                   "do not).")
@click.option("--alpha-lr", type=float, default=None, metavar="LR",
              help="alpha-crown: Adam step size on the slopes (default 0.5; 0.05 for the "
                   "tangent points of tanh, sigmoid, arctan; 0.1 on graph networks).")
@click.option("--timeout", type=float, default=600.0, show_default=True, metavar="SECONDS",
              help="Seconds per image and target type for --method exact and lp-full "
                   "(status 'timeout', no eps) and on graph networks (status 'timeout', the "
                   "largest radius proven before it).")
@click.option("--target", "target_spec", default="runner-up", show_default=True,
              metavar="LIST",
              help="runner-up, random, least or untargeted (comma-separated list allowed).")
@click.option("--target-seed", "seed", type=int, default=1215, show_default=True, metavar="N",
              help="Seed of the random-target draw (Python random, as in the paper); was --seed.")
@click.option("--activation", default=None, metavar="NAME",
              help="Override the activation read from the model file.")
@click.option("--search", default="interp", show_default=True,
              type=click.Choice(["interp", "bisect"]),
              help="Radius search: bracketing + quadratic interpolation, or plain bisection.")
@click.option("--precision", default="mixed", show_default=True,
              type=click.Choice(["mixed", "float64"]),
              help="mixed: float32 products steer the search, the reported eps is verified in "
                   "float64; float64: every evaluation in float64.")
@click.option("--rtol", type=float, default=1e-4, show_default=True, metavar="RTOL",
              help="Relative width of the final bracket [certified, not certified].")
@click.option("--eps0", type=float, default=None, metavar="EPS",
              help="First radius tried, at most --max-eps (default: a fraction of each image's "
                   "first-order distance; with --search bisect and other methods the paper's, "
                   "by norm and input size). Only the number of evaluations depends on it.")
@click.option("--max-eps", type=float, default=1e4, show_default=True, metavar="EPS",
              help=f"Largest radius searched (at most {MAX_RADIUS:g}); rows certified there get "
                   "status 'capped'.")
@click.option("--attack", "attack", default="none", show_default=True,
              type=click.Choice(["none", "pgd"]),
              help="pgd: also run a PGD attack per row and write the smallest adversarial "
                   "distortion it verified (an upper bound) to attack_eps.")
@click.option("--attack-steps", type=click.IntRange(min=1), default=None, metavar="N",
              help="PGD steps per attack run (default 20).")
@click.option("--attack-restarts", type=click.IntRange(min=1), default=None, metavar="N",
              help="PGD starting points per radius (default 2).")
@click.option("--attack-seed", type=click.IntRange(min=0), default=0, show_default=True,
              metavar="N", help="Seed of the attack's random starts.")
@click.option("--proof", "proof_path", default=None, metavar="DIR",
              help="Write a certificate of each certified row to DIR, checked by crown check "
                   "(docs/proofs.md; --norm inf, 2 or 1; --method crown or alpha-crown on dense "
                   "ReLU networks in HDF5 or NPZ files and ONNX chains lowered to them, crown on "
                   "other ONNX ReLU networks; NPZ or IDX "
                   "images).")
@click.option("--output", "-o", default="-", show_default=True, metavar="FILE",
              help="Result file to write ('-': stdout); a provenance sidecar <output>.json goes beside it.")
@click.option("--format", "out_format", default=None, type=click.Choice(["csv", "jsonl"]),
              help="Format of the --output file (default: from its extension, .jsonl: jsonl, "
                   "else csv).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --output file.")
@click.option("--resume", is_flag=True,
              help="Continue an existing --output of an interrupted run with the same options: "
                   "skip the rows already there, append the rest. It cannot extend a finished "
                   "run to more images: write those to another file (--start, --num-images) "
                   "and join the two with crown merge.")
@click.option("--shard", default=None, metavar="K/N",
              help="Only the K-th of N round-robin parts of the images (K = 1..N), for job arrays.")
@click.option("--workers", type=click.IntRange(1, 2), default=None, metavar="N",
              help="Processes: 2 certifies every other image in a forked second process, "
                   "each on one thread, the rows written in order by this one (a radius may "
                   "move in its last digits, within --rtol, as BLAS on one thread sums in "
                   "another order). Default: 2 on graph networks when the machine has two "
                   "cores, else 1; 1 with --proof. Use 1 when running several crown "
                   "processes at once.")
@click.option("--kernels", default="auto", show_default=True,
              type=click.Choice(["auto", "numba", "numpy"]),
              help="Bound kernels: numba (compiled; loading them costs ~1 s once per run), "
                   "numpy (no start-up cost, slower per image; ReLU and leaky ReLU networks "
                   "only) or auto (numpy for short jobs on such networks, else numba).")
@click.option("--verbose", "-v", is_flag=True, help="A log line per row on stderr.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary line.")
@memory_budget_option
@_handle_errors
@_deprecated("--seed", "--target-seed", "seed", type=int)
def certify(**options):
    """Certify each image against the chosen targets and write one result row (CSV or JSON
    Lines) per (image, norm, method, target).

    Exit codes: 0 all rows done, 1 internal error, 2 bad input or usage, 3 finished but some
    rows have status error or timeout (counting rows already in a resumed file), 130
    interrupted (Ctrl-C; the rows written are kept, --resume continues).
    """
    from crown_cli.io.result_files import (OutputFile, OutputJob, format_for, parse_shard,
                                           shard_indices)
    from crown_cli.io.provenance import option_values
    from crown_cli.certification.runner import AttackRuns, certify_images

    a = CertifyArgs(**options)
    norms, methods, target_types = _checked(a)
    out_format = format_for(a.output, a.out_format)
    click.get_current_context().params["out_format"] = out_format  # recorded in the sidecar
    net, graph, x, y, where = _network_and_images(a, methods, target_types)
    start, num_images = a.start, a.num_images
    stop = x.shape[0] if num_images is None else min(x.shape[0], start + num_images)
    if num_images is not None and start + num_images > x.shape[0]:
        click.echo(f"crown: note: --num-images {num_images}: {where} holds {x.shape[0]} images, "
                   f"so images {start}..{x.shape[0] - 1} ({x.shape[0] - start}) are certified",
                   err=True)
    indices = shard_indices(range(start, stop), parse_shard(a.shard))
    if len(indices) == 0:  # a shard past the images (more shards than images)
        click.echo(f"crown: note: --shard {a.shard}: none of the {stop - start} images "
                   f"{start}..{stop - 1} falls in this shard; no rows", err=True)
    job = OutputJob(option_values(click.get_current_context()),
                    OutputFile(a.output, out_format, a.overwrite, a.resume), a.model_path,
                    net if graph is None else _GraphInfo(graph), a.images_path, x, y, indices)
    if a.attack == "none" and (a.attack_steps is not None or a.attack_restarts is not None):
        raise InputError("--attack-steps/--attack-restarts: need --attack pgd")
    # rows a resumed file already holds are skipped: they cost no certification
    runs = len(indices) * len(target_types) * len(norms) * len(methods) - job.rows_present()
    certifiers, attacks = _certifiers(a, None if graph is not None else net, graph, norms,
                                      methods, runs)
    proofs = None
    if a.proof_path is not None:
        from crown_cli.certification.proofs import ProofWriter, check_scope

        weights = None if graph is not None else net.margin_layers()[0]
        read = check_scope(norms, methods, a.model_path, None if graph is not None else net,
                           graph, weights, a.images_path)
        proofs = ProofWriter(a.proof_path, a.model_path, a.images_path, a.labels_path, read,
                             lambda msg: click.echo(msg, err=True))
        for cert in certifiers:
            cert.record_proof = True
            cert.proof_writer = proofs

    def run(write):
        summary = certify_images(
            certifiers, x, y, indices, target_types, a.seed, _logged(write, a.verbose),
            progress=not a.quiet and not a.verbose, skip=job.skip,
            attacks=None if attacks is None else AttackRuns(
                attacks, a.attack_seed, lambda msg: click.echo(msg, err=True)),
            workers=a.workers if a.workers is not None else (2 if graph is not None else 1))
        if proofs is not None and not a.quiet:
            click.echo(proofs.summary(), err=True)
        note = misclassified_note(summary, x[indices] if len(indices) else x[:0])
        if note:
            click.echo(f"crown: warning: {note}", err=True)
        return summary

    _run_job(job, run, "row", a.output, a.quiet)


@dataclass(frozen=True)
class CertifyArgs:
    """``crown certify``'s options as click hands them over: one field per option, named as
    its parameter in the decorators above."""

    model_path: str
    images_path: Optional[str]
    labels_path: Optional[str]
    num_images: Optional[int]
    start: int
    norm: str
    method: str
    alpha_iters: Optional[int]
    alpha_lr: Optional[float]
    timeout: float
    target_spec: str
    seed: int
    activation: Optional[str]
    search: str
    precision: str
    rtol: float
    eps0: Optional[float]
    max_eps: float
    attack: str
    attack_steps: Optional[int]
    attack_restarts: Optional[int]
    attack_seed: int
    proof_path: Optional[str]
    output: str
    out_format: Optional[str]
    overwrite: bool
    resume: bool
    shard: Optional[str]
    workers: Optional[int]
    kernels: str
    verbose: bool
    quiet: bool
    memory_budget: Optional[float]


def _checked(a: CertifyArgs):
    """The options' checks that need no file, in the order the CLI has always made them:
    (norms, methods, target types)."""
    from crown_cli.certification.certifier import method_names, parse_norm
    from crown_cli.certification.targets import parse_target_types

    norms = [parse_norm(n) for n in _split(a.norm, "--norm", ("inf", "2", "1", "l1", "l2",
                                                               "linf"))]
    methods = _split(a.method, "--method", method_names())
    alpha_iters, alpha_lr = a.alpha_iters, a.alpha_lr
    if "alpha-crown" not in methods and (alpha_iters is not None or alpha_lr is not None):
        raise InputError("--alpha-iters/--alpha-lr: need --method alpha-crown")
    if alpha_iters is not None and alpha_iters < 0:
        raise InputError(f"--alpha-iters: must be >= 0, got {alpha_iters}")
    if alpha_lr is not None and not (np.isfinite(alpha_lr) and alpha_lr > 0):
        raise InputError(f"--alpha-lr: must be > 0, got {alpha_lr}")
    if not a.timeout > 0:
        raise InputError(f"--timeout: must be > 0, got {a.timeout}")
    target_types = parse_target_types(a.target_spec)
    rtol, max_eps, eps0 = a.rtol, a.max_eps, a.eps0
    if not rtol > 0 or not rtol < 1:
        raise InputError(f"--rtol: must lie in (0, 1), got {rtol}")
    if not (max_eps > 0 and max_eps <= MAX_RADIUS):
        raise InputError(f"--max-eps: must be > 0 and at most {MAX_RADIUS:g}, got {max_eps}")
    if eps0 is not None and not (eps0 > 0 and eps0 <= max_eps):
        raise InputError(f"--eps0: must be > 0 and at most --max-eps ({max_eps:g}), got {eps0}")
    return norms, methods, target_types


def _network_and_images(a: CertifyArgs, methods, target_types):
    """The network (an MLP, a graph's exact dense form, or the graph) and the images in its
    input layout, checked against each other: (net, graph or None, x, y, where)."""
    from crown_cli.certification.targets import check_random_possible
    from crown_cli.io.images import labels_source, load_images
    from crown_cli.io.networks import engine_form, load_network

    model_path, images_path = a.model_path, a.images_path
    check_memory_budget(a.memory_budget)
    mlp, graph, layout = engine_form(load_network(model_path, a.activation,
                                                  memory_budget=a.memory_budget))
    net = graph if mlp is None else mlp
    x, y = load_images(images_path, a.labels_path)
    top = float(np.max(x)) if x.size else 0.0
    if images_path is not None and top > 2.0:  # (a float NPZ of 0..255 pixels, say)
        click.echo(f"crown: note: {images_path}: image values reach {top:g}; "
                   "they are taken in the model's own units (only uint8 pixels are scaled, to "
                   "pixel / 255 - 0.5), so the radii are in those units too", err=True)
    if layout is not None and x.shape[1] == layout.input_size:
        # a chain of affine segments: its exact dense form runs every method on the dense
        # engine; its input is the graph's, so the images go to the model's layout
        from crown_cli.certification.graph_certifier import to_graph_layout

        x = to_graph_layout(layout, x)
    where = images_path or "default MNIST images"
    n_inputs = net.input_size
    n_classes = net.num_classes if graph is None else graph.output_size
    if n_classes < 2:  # an ONNX chain lowered to one output, or a graph with one output
        raise InputError(f"{model_path}: the output has {n_classes} value, need >= 2 classes")
    if x.shape[1] != n_inputs:
        from crown_cli.io.images import shipped_images_hint

        raise InputError(
            f"{where}: images have {x.shape[1]} values each but the model {model_path} "
            f"expects {n_inputs} inputs" + ("" if images_path else shipped_images_hint(n_inputs))
        )
    if graph is not None:
        from crown_cli.certification.graph_certifier import check_graph_method, to_graph_layout

        for m in methods:
            check_graph_method(m, model_path)
        x = to_graph_layout(graph, x)  # crown's (H, W, C) images in the model's own layout
    if a.start >= x.shape[0]:
        raise InputError(f"--start: {a.start} is past the last image ({x.shape[0]} images in "
                         f"{where})")
    bad = np.flatnonzero((y < 0) | (y >= n_classes))
    if bad.size:
        raise InputError(f"{labels_source(images_path, a.labels_path)}: label {y[bad[0]]} of "
                         f"image {bad[0]} is outside 0..{n_classes - 1} (the model "
                         f"{model_path} has {n_classes} classes)")
    check_random_possible(n_classes, target_types)
    return net, graph, x, y, where


def _certifiers(a: CertifyArgs, mlp, graph, norms, methods, runs: int):
    """A certifier per (norm, method) on the network's engine (``certification.runner.
    certifier_for``), and the PGD attacks per norm (``--attack pgd``, else None). On the dense
    engine the kernels are chosen for ``runs`` certifications and switched on until the
    command ends."""
    if graph is None:
        from crown_cli.engine.kernels import using_kernels

        kernels = choose_kernels(a.kernels, mlp.activation,
                                 [w.shape for w in mlp.margin_layers()[0]], runs)
        # the engine's switch is process-wide: restore it when this command ends
        click.get_current_context().with_resource(using_kernels(kernels))
    certifiers = [certifier_for(mlp, graph, n, m, a.alpha_iters, a.alpha_lr, search=a.search,
                                rtol=a.rtol, eps0=a.eps0, eps_max=a.max_eps,
                                precision=a.precision, timeout=a.timeout)
                  for n in norms for m in methods]
    attacks = None if a.attack != "pgd" else {
        n: attack_for(mlp, graph, n, a.attack_steps, a.attack_restarts, a.max_eps)
        for n in norms}
    return certifiers, attacks


def misclassified_note(summary, x) -> str:
    """A hint at the input scaling when every image of a run (at least 2) is misclassified:
    the usual cause is a model trained on other input values than the images' (crown's are
    pixel / 255 - 0.5); "" otherwise."""
    if summary.images < 2 or summary.misclassified < summary.images:
        return ""
    return (f"all {summary.images} images are misclassified; check the input scaling: these "
            f"images lie in [{x.min():.3g}, {x.max():.3g}] (crown scales pixels to pixel / 255 "
            f"- 0.5); a model trained on [0, 1] or on normalised inputs needs images in its own "
            f"scale (a float NPZ, --images) or its normalisation in the graph (docs/formats.md)")


def _logged(write, verbose):
    """``write``, and with --verbose a log line per row on stderr."""
    if not verbose:
        return write

    def write_and_log(row):
        write(row)
        eps = "" if row.get("eps") is None else f" eps {row['eps']!r}"
        click.echo(f"crown: image {row['image']} {row['target_type']} {row['target']} "
                   f"{row['norm']} {row['method']}: {row['status']}{eps}", err=True)

    return write_and_log


class _GraphInfo:
    """What the provenance sidecar records of a graph network (its activations per node)."""

    def __init__(self, graph):
        acts = sorted(set(graph.activations()))
        self.activation = ",".join(acts) if acts else "linear"
        self.alpha = None
