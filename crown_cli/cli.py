"""The ``crown`` command line: loads files, calls the engine once per image, writes rows."""
from __future__ import annotations

import functools
import os
import sys
import time
from typing import List

import click
import numpy as np

from crown_cli import __version__
from crown_cli.errors import InputError



class CrownError(click.ClickException):
    """A one-line error with exit code 2 (bad input) or 1 (internal error)."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file=None):
        click.echo(f"crown: error: {self.format_message()}", err=True)


# Exit code of a run stopped by Ctrl-C (SIGINT): 128 + 2, what a shell reports.
EXIT_INTERRUPTED = 130

# Exit code when stdout's reader has gone (`crown ... | head -1`): 128 + SIGPIPE, what a shell
# reports for a Unix tool killed by the signal.
EXIT_BROKEN_PIPE = 141


def _stdout_to_devnull() -> None:
    """Point file descriptor 1 at /dev/null, so that the interpreter's last flush of the
    buffered stdout cannot fail again ("Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (tests' CliRunner)
        pass


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
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt:  # Ctrl-C before any row was written (see _run_job for after)
            click.echo("crown: interrupted", err=True)
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:  # the reader of stdout has gone: stop quietly
            _stdout_to_devnull()
            raise click.exceptions.Exit(EXIT_BROKEN_PIPE) from None
        except Exception as exc:  # a bug: keep it short unless asked
            if debug:
                raise
            raise CrownError(
                f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)",
                exit_code=1,
            ) from None

    return wrapper


def _deprecated(old: str, new: str, dest: str, **option_kw):
    """Keep the spelling ``old`` of option ``new`` (parameter ``dest``) working, hidden from
    --help, with a deprecation note on stderr; giving both is refused. The value is recorded
    under ``new`` (the sidecar's options)."""
    hidden = "deprecated_" + dest

    def decorate(fn):
        @click.option(old, hidden, default=None, hidden=True, **option_kw)
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            value = kwargs.pop(hidden)
            ctx = click.get_current_context()
            ctx.params.pop(hidden, None)
            if value is not None:
                source = ctx.get_parameter_source(dest)
                if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
                    raise InputError(f"{old}: is the old spelling of {new}; give only {new}")
                click.echo(f"crown: warning: {old} is deprecated in crown {ctx.info_name}; "
                           f"use {new}", err=True)
                kwargs[dest] = ctx.params[dest] = value
            return fn(*args, **kwargs)

        return wrapper

    return decorate


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
    from crown_cli.activations import supporting

    NUMPY_TWINS = supporting("numpy_twin")

    if requested == "numpy" and activation not in NUMPY_TWINS:
        raise InputError(f"--kernels numpy: the {activation} relaxation needs numba (numpy "
                         f"has {', '.join(NUMPY_TWINS)}); use --kernels numba or auto")
    if requested != "auto":
        return requested
    cheap = runs * (substitution_size(shapes) + NUMPY_BASE) <= NUMPY_BUDGET
    return "numpy" if activation in NUMPY_TWINS and cheap else "numba"


# Largest --eps0 / --max-eps: radii far beyond any image's size (inputs lie in [-0.5, 0.5]),
# and far from where the bounds' float32 and float64 products overflow (about 1e150 on the
# shipped networks: --eps0 1e200 gave eps 0.0 after 400 evaluations).
MAX_RADIUS = 1e30


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="crown")
def cli():
    """Certified robustness lower bounds for MLP classifiers (CROWN, NeurIPS 2018)."""


@cli.command()
@click.option("--model", "model_path", required=True, type=click.Path(dir_okay=True), metavar="FILE",
              help="Model file: NPZ, HDF5 (W0.., b0..), Keras model.save() HDF5 or .keras, or .onnx.")
@click.option("--activation", default=None, metavar="NAME",
              help="Override the activation read from the model file.")
@_handle_errors
def inspect(model_path, activation):
    """Print a model's layers, activation, parameter count and input size."""
    from crown_cli.io.models import load_model

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
        if k == len(mlp.weights) - 1 and mlp.output_activation is not None:
            act = f"logits -> {mlp.output_activation}"
        click.echo(f"  {name:<12} {w.shape[1]:>6} -> {w.shape[0]:<6} {act}")
    click.echo(f"parameters:  {mlp.num_parameters:,}")


@cli.command()
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
              help="crown (adaptive ReLU lower bound), fast-lin, crown-quad (quadratic bounds, "
                   "2-layer ReLU only), alpha-crown (optimised ReLU lower slopes, ReLU and leaky "
                   "ReLU; optimised tangent points, tanh, sigmoid, arctan), fast-lip, op-norm, "
                   "lp-full or exact (comma-separated list allowed).")
@click.option("--alpha-iters", type=int, default=None, metavar="N",
              help="alpha-crown: most gradient steps per optimisation (default 25; early "
                   "stopping usually ends sooner; 0: CROWN's slopes).")
@click.option("--alpha-lr", type=float, default=None, metavar="LR",
              help="alpha-crown: Adam step size on the slopes (default 0.5; 0.1 for the "
                   "tangent points of tanh, sigmoid, arctan).")
@click.option("--timeout", type=float, default=600.0, show_default=True, metavar="SECONDS",
              help="Seconds per image and target type for --method exact and lp-full "
                   "(status 'timeout', no eps).")
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
@click.option("--kernels", default="auto", show_default=True,
              type=click.Choice(["auto", "numba", "numpy"]),
              help="Bound kernels: numba (compiled; loading them costs ~1 s once per run), "
                   "numpy (no start-up cost, slower per image; ReLU and leaky ReLU networks "
                   "only) or auto (numpy for short jobs on such networks, else numba).")
@click.option("--verbose", "-v", is_flag=True, help="A log line per row on stderr.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary line.")
@_handle_errors
@_deprecated("--seed", "--target-seed", "seed", type=int)
def certify(model_path, images_path, labels_path, num_images, start, norm, method, alpha_iters,
            alpha_lr, timeout,
            target_spec, seed, activation, search, precision, rtol, eps0, max_eps, attack,
            attack_steps, attack_restarts, attack_seed, output, out_format, overwrite, resume,
            shard, kernels, verbose, quiet):
    """Certify each image against the chosen targets and write one CSV row per (image, target).

    Exit codes: 0 all rows done, 1 internal error, 2 bad input or usage, 3 finished but some
    rows have status error or timeout (counting rows already in a resumed file), 130
    interrupted (Ctrl-C; the rows written are kept, --resume continues).
    """
    from crown_cli.io.result_files import OutputJob, format_for, parse_shard, shard_indices
    from crown_cli.io.provenance import option_values
    from crown_cli.certification.certifier import Certifier, parse_norm
    from crown_cli.engine.kernels import using_kernels
    from crown_cli.certification.methods import names as other_method_names
    from crown_cli.io.images import labels_source, load_images
    from crown_cli.io.models import load_model
    from crown_cli.certification.runner import certify_images
    from crown_cli.certification.targets import check_random_possible, parse_target_types

    norms = [parse_norm(n) for n in _split(norm, "--norm", ("inf", "2", "1", "l1", "l2", "linf"))]
    methods = _split(method, "--method", ("crown", "fast-lin", "crown-quad", "alpha-crown")
                     + other_method_names())
    if "alpha-crown" not in methods and (alpha_iters is not None or alpha_lr is not None):
        raise InputError("--alpha-iters/--alpha-lr: need --method alpha-crown")
    if alpha_iters is not None and alpha_iters < 0:
        raise InputError(f"--alpha-iters: must be >= 0, got {alpha_iters}")
    if alpha_lr is not None and not (np.isfinite(alpha_lr) and alpha_lr > 0):
        raise InputError(f"--alpha-lr: must be > 0, got {alpha_lr}")
    from crown_cli.certification.certifier import ALPHA_ITERS

    # --alpha-lr unset: the Certifier's default for the network's activation
    alpha_opts = {"alpha_iters": ALPHA_ITERS if alpha_iters is None else alpha_iters,
                  "alpha_lr": alpha_lr}
    if not timeout > 0:
        raise InputError(f"--timeout: must be > 0, got {timeout}")
    target_types = parse_target_types(target_spec)
    if not rtol > 0 or not rtol < 1:
        raise InputError(f"--rtol: must lie in (0, 1), got {rtol}")
    if not (max_eps > 0 and max_eps <= MAX_RADIUS):
        raise InputError(f"--max-eps: must be > 0 and at most {MAX_RADIUS:g}, got {max_eps}")
    if eps0 is not None and not (eps0 > 0 and eps0 <= max_eps):
        raise InputError(f"--eps0: must be > 0 and at most --max-eps ({max_eps:g}), got {eps0}")
    out_format = format_for(output, out_format)
    click.get_current_context().params["out_format"] = out_format  # recorded in the sidecar

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
    bad = np.flatnonzero((y < 0) | (y >= mlp.num_classes))
    if bad.size:
        raise InputError(f"{labels_source(images_path, labels_path)}: label {y[bad[0]]} of image "
                         f"{bad[0]} is outside 0..{mlp.num_classes - 1} (the model "
                         f"{model_path} has {mlp.num_classes} classes)")
    check_random_possible(mlp.num_classes, target_types)
    stop = x.shape[0] if num_images is None else min(x.shape[0], start + num_images)
    if num_images is not None and start + num_images > x.shape[0]:
        click.echo(f"crown: note: --num-images {num_images}: {where} holds {x.shape[0]} images, "
                   f"so images {start}..{x.shape[0] - 1} ({x.shape[0] - start}) are certified",
                   err=True)
    indices = shard_indices(range(start, stop), parse_shard(shard))
    job = OutputJob(option_values(click.get_current_context()), output, out_format, overwrite,
                    resume, model_path, mlp, images_path, x, y, indices)
    # rows a resumed file already holds are skipped: they cost no certification
    runs = len(indices) * len(target_types) * len(norms) * len(methods) - job.rows_present()
    # an order-preserving output activation is skipped (the logits' margins decide the class);
    # another one (a ReLU on the logits) becomes a hidden layer the engine bounds
    weights, biases = mlp.margin_layers()
    kernels = choose_kernels(kernels, mlp.activation, [w.shape for w in weights], runs)
    # the engine's switch is process-wide: restore it when this command ends
    click.get_current_context().with_resource(using_kernels(kernels))

    certifiers = [
        Certifier(weights, biases, mlp.activation, norm=n, method=m, search=search,
                  rtol=rtol, eps0=eps0, eps_max=max_eps, precision=precision, alpha=mlp.alpha,
                  timeout=timeout, **(alpha_opts if m == "alpha-crown" else {}))
        for n in norms for m in methods
    ]
    attacks = None
    if attack == "pgd":
        from crown_cli.certification.attack import DEFAULT_RESTARTS, DEFAULT_STEPS, PGDAttack

        attacks = {n: PGDAttack(weights, biases, mlp.activation, norm=n, alpha=mlp.alpha,
                                steps=attack_steps or DEFAULT_STEPS,
                                restarts=attack_restarts or DEFAULT_RESTARTS, eps_max=max_eps)
                   for n in norms}
    elif attack_steps is not None or attack_restarts is not None:
        raise InputError("--attack-steps/--attack-restarts: need --attack pgd")
    def logged(write):
        if not verbose:
            return write

        def write_and_log(row):
            write(row)
            eps = "" if row.get("eps") is None else f" eps {row['eps']!r}"
            click.echo(f"crown: image {row['image']} {row['target_type']} {row['target']} "
                       f"{row['norm']} {row['method']}: {row['status']}{eps}", err=True)

        return write_and_log

    _run_job(job, lambda write: certify_images(
        certifiers, x, y, indices, target_types, seed, logged(write), progress=not quiet and not verbose,
        skip=job.skip, attacks=attacks, attack_seed=attack_seed,
        warn=lambda msg: click.echo(msg, err=True)), "row", output, quiet)


def _run_job(job, run, what: str, output: str, quiet: bool) -> None:
    """Open ``job``'s writer, ``run(write)`` -> summary, finish the sidecar even if the run
    raised, report failed rows and the summary line; exit 3 when rows failed."""
    t0 = time.perf_counter()
    summary = None
    interrupted = False
    writer = job.open()  # checks a resumed file's rows; raises before anything is written
    try:
        with writer:
            summary = run(job.counting(writer.write))
    except KeyboardInterrupt:  # Ctrl-C: the rows written stay; the sidecar says how many
        interrupted = True
    finally:
        failed = job.finish(summary, complete=summary is not None)
    if interrupted:
        def count(n):
            return f"{n} finished {what}" + ("" if n == 1 else "s")

        if output == "-":
            click.echo(f"crown: interrupted after {count(job.written)}", err=True)
        else:
            click.echo(f"crown: interrupted; {output} holds {count(job.rows_before + job.written)}"
                       f"; run the same command with --resume"
                       + (" (instead of --overwrite)" if job.overwrite else "")
                       + " to continue it", err=True)
        raise click.exceptions.Exit(EXIT_INTERRUPTED)
    for message in summary.errors:
        click.echo(f"crown: {what} failed: {message}", err=True)
    if not quiet:
        click.echo(summary.line(time.perf_counter() - t0, output), err=True)
    if failed:
        raise click.exceptions.Exit(3)


VERIFY_NOT_SETTINGS = {"--model", "--spec", "--instances", "--root", "--output", "--overwrite",
                       "--resume", "--quiet", "--verbose", "--debug", "--shard", "--format"}


@cli.command()
@click.option("--model", "model_path", default=None, metavar="FILE",
              help="Network (ONNX, or any model file crown reads) for one property.")
@click.option("--spec", "spec_path", default=None, metavar="FILE",
              help="VNN-LIB property for --model.")
@click.option("--instances", "instances_path", default=None, metavar="FILE",
              help="Competition instance list (CSV lines onnx,vnnlib,timeout) to run instead.")
@click.option("--root", default=None, metavar="DIR",
              help="Directory the instance list's paths are relative to (default: its own).")
@click.option("--timeout", type=float, default=None, metavar="SECONDS",
              help="Seconds for --model/--spec (default 300); with --instances a cap on each "
                   "instance's own timeout.")
@click.option("--stages", "method", default="crown,alpha-crown", show_default=True,
              metavar="LIST",
              help="Bound stages after the attack, cheap to strong (comma-separated); "
                   "alpha-crown on ReLU, leaky ReLU, tanh, sigmoid and arctan networks; "
                   "was --method.")
@click.option("--attack-restarts", type=click.IntRange(min=1), default=64, show_default=True,
              metavar="N", help="PGD starting points per case of the property.")
@click.option("--attack-steps", type=click.IntRange(min=1), default=100, show_default=True,
              metavar="N", help="PGD steps per attack run.")
@click.option("--attack-time", type=float, default=None, metavar="SECONDS",
              help="Seconds for each of the two attack stages (default: 10% of the timeout, "
                   "at least 0.5).")
@click.option("--bab/--no-bab", default=True, show_default=True,
              help="Branch and bound after the bound stages (ReLU and leaky ReLU networks): "
                   "input splitting up to 16 inputs, ReLU splitting above.")
@click.option("--max-domains", type=click.IntRange(min=1), default=200_000, show_default=True,
              metavar="N",
              help="Cap on the open domains of the branch and bound (memory); reaching it "
                   "ends the instance with unknown.")
@click.option("--attack-seed", "seed", type=click.IntRange(min=0), default=0, show_default=True,
              metavar="N", help="Seed of the attack's random starts; was --seed.")
@click.option("--output", "-o", default="-", show_default=True, metavar="FILE",
              help="Result file ('-': stdout): the competition's result for --spec, result "
                   "rows for --instances (with a provenance sidecar <output>.json).")
@click.option("--format", "out_format", default=None, type=click.Choice(["csv", "jsonl"]),
              help="--instances: format of the --output file (default: from its extension, "
                   ".jsonl: jsonl, else csv).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --output file.")
@click.option("--resume", is_flag=True,
              help="--instances: continue an existing --output, skipping instances it holds.")
@click.option("--shard", default=None, metavar="K/N",
              help="--instances: only the K-th of N round-robin parts of the list.")
@click.option("--verbose", "-v", is_flag=True, help="A log line per stage and instance, and the branch and "
                   "bound's status (open domains, worst bound, domains/s) every 2 s.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary line.")
@_handle_errors
@_deprecated("--seed", "--attack-seed", "seed", type=click.IntRange(min=0))
@_deprecated("--method", "--stages", "method")
def verify(model_path, spec_path, instances_path, root, timeout, method, attack_restarts,
           attack_steps, attack_time, bab, max_domains, seed, output, out_format, overwrite,
           resume, shard, verbose, quiet):
    """Decide VNN-LIB properties: sat (with a counterexample), unsat, unknown or timeout.

    Attack first (PGD towards the unsafe outputs inside the input box), then the bound
    stages on every case of the property. unsat only when every case is proven empty by a
    float64-verified bound; sat only with an input a float64 forward pass confirms. The
    property's X values are the network's inputs as they are (no image scaling).

    Exit codes: 0 a verdict was written (any of sat, unsat, unknown, timeout), 1 internal
    error, 2 bad input or usage, 3 an instance ended in an error, 130 interrupted (Ctrl-C).
    """
    from crown_cli.verification.pipeline import BOUND_STAGES

    stages = _split(method, "--stages", BOUND_STAGES)
    if timeout is not None and not timeout > 0:
        raise InputError(f"--timeout: must be > 0, got {timeout}")
    if attack_time is not None and not attack_time >= 0:
        raise InputError(f"--attack-time: must be >= 0, got {attack_time}")
    options = dict(stages=tuple(stages), attack_restarts=attack_restarts,
                   attack_steps=attack_steps, seed=seed, attack_time=attack_time, bab=bab,
                   max_domains=max_domains)
    log = (lambda msg: click.echo(msg, err=True)) if verbose else None
    if instances_path is not None:
        if model_path is not None or spec_path is not None:
            raise InputError("--instances: cannot be combined with --model/--spec")
        return _verify_instances(instances_path, root, timeout, options, output, out_format,
                                 overwrite, resume, shard, quiet, log)
    if model_path is None or spec_path is None:
        raise InputError("verify: give --model and --spec, or --instances")
    for opt, val in (("--root", root), ("--resume", resume or None), ("--shard", shard),
                     ("--format", out_format)):
        if val is not None:
            raise InputError(f"{opt}: only with --instances")
    _verify_one(model_path, spec_path, 300.0 if timeout is None else timeout, options, output,
                overwrite, quiet, log)


def _verify_one(model_path, spec_path, timeout, options, output, overwrite, quiet, log):
    import os

    from crown_cli.verification.pipeline import format_result
    from crown_cli.verification.runner import Loader

    from crown_cli.io.result_files import check_output

    check_output(output, overwrite, resumable=False)
    t0 = time.perf_counter()
    loader = Loader()
    v = loader.verifier(model_path, **options)
    prop = loader.property(spec_path, v.n_inputs, v.n_outputs)
    for message in prop.warnings:
        click.echo(f"crown: warning: {message}", err=True)
    from crown_cli.io.progress import terminal_bar

    # a status line: seconds used of the timeout, and the branch and bound's status
    bar = terminal_bar(not quiet and log is None, total=round(timeout), unit="s",
                       desc="verify", bar_format="{desc}: {n:.0f}/{total:.0f} s |{bar}| {postfix}")

    def status(text):
        bar.n = min(bar.total, time.perf_counter() - t0)
        bar.set_postfix_str(text)  # refreshes the line

    try:
        verdict = v.verify(prop, max(0.0, timeout - (time.perf_counter() - t0)), log=log,
                           status=status if bar is not None else None)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - the instance failed: exit 3, no result file
        raise CrownError(f"{spec_path}: instance ended in an error: {type(exc).__name__}: {exc}",
                         exit_code=3) from None
    finally:
        if bar is not None:
            bar.close()
    text = format_result(verdict)
    if output == "-":
        click.echo(text, nl=False)
    else:
        tmp = f"{output}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, output)
    if not quiet:
        margin = "" if verdict.margin is None else f", bound margin {verdict.margin:.6g}"
        if verdict.domains:
            margin += f", {verdict.domains} domains (peak {verdict.peak_domains} open)"
        click.echo(f"crown: {verdict.result} ({verdict.stage}; {verdict.cases_proven} of "
                   f"{verdict.cases} cases proven{margin}) in {time.perf_counter() - t0:.2f} s",
                   err=True)


def _verify_instances(instances_path, root, timeout, options, output, out_format, overwrite,
                      resume, shard, quiet, log):
    from crown_cli.io import provenance as pv
    from crown_cli.io.result_files import (VERIFY_ROWS, ResultJob, format_for, parse_shard,
                                           shard_indices)
    from crown_cli.verification.runner import instances_sha256, read_instances, run_instances

    out_format = format_for(output, out_format)
    click.get_current_context().params["out_format"] = out_format  # recorded in the sidecar
    instances = read_instances(instances_path, root)
    chosen = shard_indices(range(len(instances)), parse_shard(shard))
    todo = [instances[i] for i in chosen]
    opts = pv.option_values(click.get_current_context())
    settings, inputs, coverage = {}, {}, {}
    if output != "-":
        import os

        settings = {"instances SHA-256": instances_sha256(instances_path, instances)}
        settings.update({k: v for k, v in opts.items() if k not in VERIFY_NOT_SETTINGS})
        settings = pv._jsonable(settings)
        inputs = {"instances": {"path": os.path.abspath(instances_path),
                                "root": os.path.abspath(todo[0].root) if todo else None,
                                "count": len(instances)}}
        coverage = {"options": {"--shard": shard}, "images": len(chosen),
                    "first_image": chosen[0] if chosen else None,
                    "last_image": chosen[-1] if chosen else None}
    job = ResultJob(opts, output, out_format, overwrite, resume, settings, inputs, coverage,
                    VERIFY_ROWS)
    _run_job(job, lambda write: run_instances(
        todo, write, job.skip, VERIFY_ROWS.key, timeout_cap=timeout, progress=not quiet,
        verifier_options=options, log=log,
        warn=lambda msg: click.echo(f"crown: warning: {msg}", err=True)), "instance", output, quiet)


@cli.command()
@click.argument("parts", nargs=-1, required=True, type=click.Path(dir_okay=False),
                metavar="FILE...")
@click.option("--output", "-o", required=True, metavar="FILE",
              help="Merged result file ('-': stdout).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --output file.")
@click.option("--verbose", "-v", is_flag=True, help="A line per part: its rows and coverage.")
@click.option("--quiet", "-q", is_flag=True, help="No summary line.")
@_handle_errors
def merge(parts, output, overwrite, verbose, quiet):
    """Merge result files of --shard runs into one, in image order.

    The parts must agree (model SHA-256 and every result-affecting option, from their
    sidecars), be complete and not overlap. Exit code 3 if the merged rows include failed ones.
    """
    from crown_cli.io.result_files import merge_files, missing_shards

    merged = merge_files(list(parts), output, overwrite)
    if verbose:
        for part in merged["coverage"]["merged_from"]:
            cov = part.get("coverage") or {}
            shard = (cov.get("options") or {}).get("--shard")
            click.echo(f"crown: {part['file']}: {part['rows']} rows"
                       + (f", shard {shard}" if shard else ""), err=True)
    note = missing_shards(merged)
    if note:
        click.echo(f"crown: warning: {note}", err=True)
    if not quiet:
        dest = "stdout" if output == "-" else output
        click.echo(f"crown: merged {len(parts)} parts: {merged['rows']} rows for "
                   f"{merged['coverage']['images']} "
                   f"{'instances' if merged.get('kind') == 'verify' else 'images'} -> {dest}",
                   err=True)
    if merged["failed_rows"]:
        raise click.exceptions.Exit(3)


@cli.command()
@click.argument("results", nargs=-1, required=True, metavar="FILE...")
@click.option("--format", "fmt", default="markdown", show_default=True,
              type=click.Choice(["markdown", "latex", "csv", "json"]),
              help="Format of the --output: a markdown or LaTeX table, or CSV / JSON with the "
                   "numbers unrounded (for scripts).")
@click.option("--columns", default=None, metavar="LIST",
              help="Only these table columns, in this order (comma-separated names as in the "
                   "header, case and punctuation ignored: network,norm,crown,crown-s-image).")
@click.option("--plot", "plot_path", default=None, metavar="FILE",
              help="Also draw certified eps per image and the attack's bound (needs matplotlib).")
@click.option("--output", "-o", default="-", show_default=True, metavar="FILE",
              help="File for the table ('-': stdout).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --output or --plot file.")
@click.option("--verbose", "-v", is_flag=True, help="A line per result file read.")
@click.option("--quiet", "-q", is_flag=True, help="No warnings (errors are still printed).")
@_handle_errors
def report(results, fmt, columns, plot_path, output, overwrite, verbose, quiet):
    """Average crown certify result files (CSV or JSON Lines) into the paper's table layout."""
    from crown_cli.io.report import RENDERERS, aggregate, plot_report, read_results
    from crown_cli.io.result_files import check_output

    check_output(output, overwrite, resumable=False)
    if plot_path:
        check_output(plot_path, overwrite, resumable=False, what="plot file")
    warn = (lambda msg: None) if quiet else (lambda msg: click.echo(f"crown: warning: {msg}",
                                                                     err=True))
    rows = []
    for path in results:
        found = read_results(path)
        if verbose:
            click.echo(f"crown: {path}: {len(found)} rows", err=True)
        if not found:
            warn(f"{path}: no rows")
        rows += found
    rep = aggregate(rows)
    chosen = [c.strip() for c in columns.split(",") if c.strip()] if columns else None
    text = RENDERERS[fmt](rep, chosen)
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
        warn(msg)


def main():
    try:
        cli(prog_name="crown")
    except SystemExit as done:
        # flush here, not at interpreter exit: output still buffered when the reader of a pipe
        # has gone must end quietly like the rest (see _handle_errors)
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _stdout_to_devnull()
            raise SystemExit(EXIT_BROKEN_PIPE) from None
        raise


if __name__ == "__main__":
    main()
