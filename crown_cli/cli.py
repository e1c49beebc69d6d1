"""The ``crown`` command line: loads files, calls the engine once per image, writes rows."""
from __future__ import annotations

import functools
import time
from typing import List

import click
import numpy as np

from . import __version__
from .errors import InputError



class CrownError(click.ClickException):
    """A one-line error with exit code 2 (bad input) or 1 (internal error)."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file=None):
        click.echo(f"crown: error: {self.format_message()}", err=True)


def _handle_errors(fn):
    """Turn InputError into a one-line message and exit code 2; ``--debug`` keeps tracebacks."""

    @click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
    @functools.wraps(fn)
    def wrapper(*args, debug=False, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            if debug:
                raise
            raise CrownError(str(exc)) from None
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:  # a bug: keep it short unless asked
            if debug:
                raise
            raise CrownError(
                f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)",
                exit_code=1,
            ) from None

    return wrapper


def _split(value: str, option: str, choices) -> List[str]:
    out = []
    for part in str(value).split(","):
        part = part.strip().lower()
        if part not in choices:
            raise InputError(f"{option}: unknown value '{part}' (choose from {', '.join(choices)})")
        if part not in out:
            out.append(part)
    return out


# --kernels auto: the numpy kernels while their estimated extra time stays below what loading
# numba costs. Measured on the shipped ReLU networks (2 cores, idle; README "Benchmark"):
# numba's one-off cost ~1.05 s; the numpy kernels' extra time per certification (image x
# target type x norm x method) 68-112 ms for mnist_3x1024 (l_inf..l_1), 229-272 ms for
# mnist_4x1024, 1-3.4 ms for the 20-neuron networks: about 0.085-0.11 s per 10**6 of
# substitution_size, plus ~3 ms (NUMPY_BASE in the same unit) of per-call overhead.
# NUMPY_BUDGET is ~2/3 of the break-even point at the slower rate (under load the ratio of the
# two was ~1.5x less favourable: about break-even there).
NUMPY_BASE = 30_000
NUMPY_BUDGET = 6_000_000


def substitution_size(shapes) -> int:
    """Rows x columns the relaxation kernels sweep in one bound evaluation of an MLP whose
    weight matrices have ``shapes`` (outputs, inputs): every hidden layer k >= 1 is
    back-substituted through the hidden layers below it (the margin's few rows are ignored)."""
    hidden = [s[0] for s in shapes[:-1]]
    return sum(n * sum(hidden[:k]) for k, n in enumerate(hidden) if k >= 1)


def choose_kernels(requested: str, activation: str, shapes, runs: int) -> str:
    """The kernels of a certify run: ``requested``, or for 'auto' numpy when the activation
    has a numpy relaxation and ``runs`` certifications fit NUMPY_BUDGET, else numba.
    InputError for numpy kernels on an activation whose relaxation needs numba."""
    from .relaxations import NUMPY_TWINS

    if requested == "numpy" and activation not in NUMPY_TWINS:
        raise InputError(f"--kernels numpy: the {activation} relaxation needs numba (numpy "
                         f"has {', '.join(NUMPY_TWINS)}); use --kernels numba or auto")
    if requested != "auto":
        return requested
    cheap = runs * (substitution_size(shapes) + NUMPY_BASE) <= NUMPY_BUDGET
    return "numpy" if activation in NUMPY_TWINS and cheap else "numba"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="crown")
def cli():
    """Certified robustness lower bounds for MLP classifiers (CROWN, NeurIPS 2018)."""


@cli.command()
@click.option("--model", "model_path", required=True, type=click.Path(dir_okay=True),
              help="Model file: NPZ, HDF5 (W0.., b0..) or Keras model.save() HDF5.")
@click.option("--activation", default=None, help="Override the activation read from the model file.")
@_handle_errors
def inspect(model_path, activation):
    """Print a model's layers, activation, parameter count and input size."""
    from .model_io import load_model

    mlp = load_model(model_path, activation)
    sizes = mlp.sizes
    click.echo(f"model:       {model_path}")
    click.echo(f"activation:  {mlp.activation}" + (f" (alpha={mlp.alpha:g})" if mlp.alpha is not None else ""))
    click.echo(f"input size:  {mlp.input_size}")
    click.echo(f"classes:     {mlp.num_classes}")
    click.echo(f"layers:      {len(mlp.weights)} weight layers ({'-'.join(map(str, sizes))})")
    names = mlp.layer_names or [f"layer_{k}" for k in range(len(mlp.weights))]
    for k, (name, w) in enumerate(zip(names, mlp.weights)):
        act = mlp.activation if k < len(mlp.weights) - 1 else "logits"
        click.echo(f"  {name:<12} {w.shape[1]:>6} -> {w.shape[0]:<6} {act}")
    click.echo(f"parameters:  {mlp.num_parameters:,}")


@cli.command()
@click.option("--model", "model_path", required=True, type=click.Path(dir_okay=True),
              help="Model file: NPZ, HDF5 (W0.., b0..) or Keras model.save() HDF5.")
@click.option("--images", "images_path", default=None,
              help="Image file: NPZ (x, y), MNIST IDX (gz or raw) or CIFAR CSV. "
                   "Default: the first 100 MNIST test images shipped with crown.")
@click.option("--labels", "labels_path", default=None, help="Labels IDX file for IDX images "
              "(default: the labels file beside the images).")
@click.option("--num-images", "-n", type=click.IntRange(min=1), default=None,
              help="Number of images to process (default: all from --start on).")
@click.option("--start", type=click.IntRange(min=0), default=0, show_default=True,
              help="Index of the first image.")
@click.option("--norm", default="inf", show_default=True,
              help="l_p norm of the ball: inf, 2 or 1 (comma-separated list allowed).")
@click.option("--method", default="crown", show_default=True,
              help="crown (adaptive ReLU lower bound), fast-lin, crown-quad (quadratic bounds, "
                   "2-layer ReLU only), alpha-crown (optimised ReLU lower slopes; ReLU and leaky "
                   "ReLU), fast-lip, op-norm, lp-full or exact (comma-separated list allowed).")
@click.option("--alpha-iters", type=int, default=None,
              help="alpha-crown: most gradient steps per optimisation (default 20; early "
                   "stopping usually ends sooner; 0: CROWN's slopes).")
@click.option("--alpha-lr", type=float, default=None,
              help="alpha-crown: Adam step size on the slopes (default 0.5).")
@click.option("--timeout", type=float, default=600.0, show_default=True,
              help="Seconds per image and target type for --method exact and lp-full "
                   "(status 'timeout', no eps).")
@click.option("--target", "target_spec", default="runner-up", show_default=True,
              help="runner-up, random, least or untargeted (comma-separated list allowed).")
@click.option("--seed", type=int, default=1215, show_default=True,
              help="Seed of the random-target draw (Python random, as in the paper).")
@click.option("--activation", default=None, help="Override the activation read from the model file.")
@click.option("--search", default="interp", show_default=True,
              type=click.Choice(["interp", "bisect"]),
              help="Radius search: bracketing + quadratic interpolation, or plain bisection.")
@click.option("--precision", default="mixed", show_default=True,
              type=click.Choice(["mixed", "float64"]),
              help="mixed: float32 products steer the search, the reported eps is verified in "
                   "float64; float64: every evaluation in float64.")
@click.option("--rtol", type=float, default=1e-4, show_default=True,
              help="Relative width of the final bracket [certified, not certified].")
@click.option("--eps0", type=float, default=None,
              help="First radius tried (default: a fraction of each image's first-order "
                   "distance; with --search bisect and other methods the paper's, by norm and "
                   "input size).")
@click.option("--max-eps", type=float, default=1e4, show_default=True,
              help="Largest radius searched; rows certified there get status 'capped'.")
@click.option("--attack", "attack", default="none", show_default=True,
              type=click.Choice(["none", "pgd"]),
              help="pgd: also run a PGD attack per row and write the smallest adversarial "
                   "distortion it verified (an upper bound) to attack_eps.")
@click.option("--attack-steps", type=click.IntRange(min=1), default=None,
              help="PGD steps per attack run (default 20).")
@click.option("--attack-restarts", type=click.IntRange(min=1), default=None,
              help="PGD starting points per radius (default 2).")
@click.option("--attack-seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the attack's random starts.")
@click.option("--output", "-o", default="-", show_default=True,
              help="Result file to write ('-': stdout); a provenance sidecar <output>.json goes beside it.")
@click.option("--format", "out_format", default="csv", show_default=True,
              type=click.Choice(["csv", "jsonl"]), help="Result file format.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --output file.")
@click.option("--resume", is_flag=True,
              help="Continue an existing --output: skip the rows already there, append the rest.")
@click.option("--shard", default=None, metavar="K/N",
              help="Only the K-th of N round-robin parts of the images (K = 1..N), for job arrays.")
@click.option("--kernels", default="auto", show_default=True,
              type=click.Choice(["auto", "numba", "numpy"]),
              help="Bound kernels: numba (compiled; loading them costs ~1 s once per run), "
                   "numpy (no start-up cost, slower per image; ReLU and leaky ReLU networks "
                   "only) or auto (numpy for short jobs on such networks, else numba).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary line.")
@_handle_errors
def certify(model_path, images_path, labels_path, num_images, start, norm, method, alpha_iters,
            alpha_lr, timeout,
            target_spec, seed, activation, search, precision, rtol, eps0, max_eps, attack,
            attack_steps, attack_restarts, attack_seed, output, out_format, overwrite, resume,
            shard, kernels, quiet):
    """Certify each image against the chosen targets and write one CSV row per (image, target).

    Exit codes: 0 all rows done, 1 internal error, 2 bad input, 3 finished but some rows
    have status error or timeout (counting rows already in a resumed file).
    """
    from .batch import OutputJob, parse_shard, shard_indices
    from .provenance import option_values
    from .certify import Certifier, parse_norm
    from .crown import using_kernels
    from .methods import names as other_method_names
    from .images import load_images
    from .model_io import load_model
    from .runner import certify_images
    from .targets import check_random_possible, parse_target_types

    norms = [parse_norm(n) for n in _split(norm, "--norm", ("inf", "2", "1", "l1", "l2", "linf"))]
    methods = _split(method, "--method", ("crown", "fast-lin", "crown-quad", "alpha-crown")
                     + other_method_names())
    if "alpha-crown" not in methods and (alpha_iters is not None or alpha_lr is not None):
        raise InputError("--alpha-iters/--alpha-lr: need --method alpha-crown")
    if alpha_iters is not None and alpha_iters < 0:
        raise InputError(f"--alpha-iters: must be >= 0, got {alpha_iters}")
    if alpha_lr is not None and not (np.isfinite(alpha_lr) and alpha_lr > 0):
        raise InputError(f"--alpha-lr: must be > 0, got {alpha_lr}")
    from .certify import ALPHA_ITERS, ALPHA_LR

    alpha_opts = {"alpha_iters": ALPHA_ITERS if alpha_iters is None else alpha_iters,
                  "alpha_lr": ALPHA_LR if alpha_lr is None else alpha_lr}
    if not timeout > 0:
        raise InputError(f"--timeout: must be > 0, got {timeout}")
    target_types = parse_target_types(target_spec)
    if not rtol > 0 or not rtol < 1:
        raise InputError(f"--rtol: must lie in (0, 1), got {rtol}")
    if eps0 is not None and not eps0 > 0:
        raise InputError(f"--eps0: must be > 0, got {eps0}")
    if not max_eps > 0:
        raise InputError(f"--max-eps: must be > 0, got {max_eps}")

    mlp = load_model(model_path, activation)
    x, y = load_images(images_path, labels_path)
    where = images_path or "default MNIST images"
    if x.shape[1] != mlp.input_size:
        raise InputError(
            f"{where}: images have {x.shape[1]} values each but the model {model_path} "
            f"expects {mlp.input_size} inputs"
        )
    if start >= x.shape[0]:
        raise InputError(f"--start: {start} is past the last image ({x.shape[0]} images in {where})")
    if np.any(y < 0) or np.any(y >= mlp.num_classes):
        raise InputError(f"{where}: labels must lie in 0..{mlp.num_classes - 1}")
    check_random_possible(mlp.num_classes, target_types)
    stop = x.shape[0] if num_images is None else min(x.shape[0], start + num_images)
    indices = shard_indices(range(start, stop), parse_shard(shard))
    job = OutputJob(option_values(click.get_current_context()), output, out_format, overwrite,
                    resume, model_path, mlp, images_path, x, y, indices)
    # rows a resumed file already holds are skipped: they cost no certification
    runs = len(indices) * len(target_types) * len(norms) * len(methods) - job.rows_present()
    kernels = choose_kernels(kernels, mlp.activation, [w.shape for w in mlp.weights], runs)
    # the engine's switch is process-wide: restore it when this command ends
    click.get_current_context().with_resource(using_kernels(kernels))

    certifiers = [
        Certifier(mlp.weights, mlp.biases, mlp.activation, norm=n, method=m, search=search,
                  rtol=rtol, eps0=eps0, eps_max=max_eps, precision=precision, alpha=mlp.alpha,
                  timeout=timeout, **(alpha_opts if m == "alpha-crown" else {}))
        for n in norms for m in methods
    ]
    attacks = None
    if attack == "pgd":
        from .attack import DEFAULT_RESTARTS, DEFAULT_STEPS, PGDAttack

        attacks = {n: PGDAttack(mlp.weights, mlp.biases, mlp.activation, norm=n, alpha=mlp.alpha,
                                steps=attack_steps or DEFAULT_STEPS,
                                restarts=attack_restarts or DEFAULT_RESTARTS, eps_max=max_eps)
                   for n in norms}
    elif attack_steps is not None or attack_restarts is not None:
        raise InputError("--attack-steps/--attack-restarts: need --attack pgd")
    t0 = time.perf_counter()
    summary = None
    writer = job.open()  # checks a resumed file's rows; raises before anything is written
    try:
        with writer:
            summary = certify_images(certifiers, x, y, indices, target_types, seed,
                                     writer.write, progress=not quiet, skip=job.skip,
                                     attacks=attacks, attack_seed=attack_seed,
                                     warn=lambda msg: click.echo(msg, err=True))
    finally:
        failed = job.finish(summary, complete=summary is not None)
    for message in summary.errors:
        click.echo(f"crown: row failed: {message}", err=True)
    if not quiet:
        click.echo(summary.line(time.perf_counter() - t0, output), err=True)
    if failed:
        raise click.exceptions.Exit(3)


@cli.command()
@click.argument("parts", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--output", "-o", required=True, help="Merged result file ('-': stdout).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --output file.")
@click.option("--quiet", "-q", is_flag=True, help="No summary line.")
@_handle_errors
def merge(parts, output, overwrite, quiet):
    """Merge result files of --shard runs into one, in image order.

    The parts must agree (model SHA-256 and every result-affecting option, from their
    sidecars), be complete and not overlap. Exit code 3 if the merged rows include failed ones.
    """
    from .batch import merge_files, missing_shards

    merged = merge_files(list(parts), output, overwrite)
    note = missing_shards(merged)
    if note:
        click.echo(f"crown: warning: {note}", err=True)
    if not quiet:
        dest = "stdout" if output == "-" else output
        click.echo(f"crown: merged {len(parts)} parts: {merged['rows']} rows for "
                   f"{merged['coverage']['images']} images -> {dest}", err=True)
    if merged["failed_rows"]:
        raise click.exceptions.Exit(3)


@cli.command()
@click.argument("results", nargs=-1, required=True)
@click.option("--format", "fmt", default="markdown", show_default=True,
              type=click.Choice(["markdown", "latex"]), help="Table format.")
@click.option("--plot", "plot_path", default=None,
              help="Also draw certified eps per image and the attack's bound (needs matplotlib).")
@click.option("--output", "-o", default="-", show_default=True,
              help="File for the table ('-': stdout); replaced if it exists.")
@_handle_errors
def report(results, fmt, plot_path, output):
    """Average result files (CSV or JSON Lines) into the paper's table layout."""
    from .report import aggregate, plot_report, read_results, render_latex, render_markdown

    rows = []
    for path in results:
        found = read_results(path)
        if not found:
            click.echo(f"crown: warning: {path}: no rows", err=True)
        rows += found
    rep = aggregate(rows)
    text = render_latex(rep) if fmt == "latex" else render_markdown(rep)
    if plot_path:
        plot_report(rep, plot_path)
    if output == "-":
        click.echo(text, nl=False)
    else:
        try:
            with open(output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise InputError(f"{output}: cannot write ({exc.strerror})") from None
    for msg in rep.warnings:
        click.echo(f"crown: warning: {msg}", err=True)


def main():
    cli(prog_name="crown")


if __name__ == "__main__":
    main()
