"""``crown verify``: VNN-LIB properties on a network, one property (``--spec``) or a
benchmark's instance list (``--instances``)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import click

from crown_cli.commands.common import (CrownError, _deprecated, _handle_errors, _run_job, _split,
                                      check_memory_budget, memory_budget_option)
from crown_cli.errors import InputError


VERIFY_NOT_SETTINGS = {"--model", "--spec", "--instances", "--root", "--output", "--overwrite",
                       "--resume", "--quiet", "--verbose", "--debug", "--shard", "--format",
                       "--memory-budget", "--proof"}


@click.command()
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
@click.option("--stages", "method", default="crown,alpha-crown,hull", show_default=True,
              metavar="LIST",
              help="Bound stages after the attack, cheap to strong (comma-separated); "
                   "alpha-crown on ReLU, leaky ReLU, tanh, sigmoid and arctan networks; "
                   "hull (each neuron's convex hull over the box) on ReLU networks of one "
                   "hidden layer; was --method.")
@click.option("--attack-restarts", type=click.IntRange(min=1), default=64, show_default=True,
              metavar="N", help="PGD starting points per case of the property.")
@click.option("--attack-steps", type=click.IntRange(min=1), default=100, show_default=True,
              metavar="N", help="PGD steps per attack run.")
@click.option("--attack-time", type=float, default=None, metavar="SECONDS",
              help="Seconds for each of the two attack stages (default: 10% of the timeout, "
                   "at least 0.5).")
@click.option("--bab/--no-bab", default=True, show_default=True,
              help="Branch and bound after the bound stages (ReLU and leaky ReLU networks): "
                   "input splitting (up to 64 inputs) and ReLU splitting, raced by measured "
                   "progress. On a graph lowered to dense layers (a chain of convolutions, "
                   "pools, dense layers) the same; on other graphs input splitting (up to 64 "
                   "inputs) and ReLU splitting of the ReLU nodes.")
@click.option("--max-domains", type=click.IntRange(min=1), default=200_000, show_default=True,
              metavar="N",
              help="Cap on the open domains of the branch and bound (memory); reaching it "
                   "ends the instance with unknown.")
@click.option("--workers", type=click.IntRange(1, 2), default=None, metavar="N",
              help="Processes for branch and bound: 2 shares each round with a second "
                   "process (default: 2 on networks of one hidden layer of at most 128 "
                   "neurons when the machine has two cores, else 1; on other graphs 2, for "
                   "input and ReLU splitting). Use 1 when running several crown processes "
                   "at once.")
@click.option("--attack-seed", "seed", type=click.IntRange(min=0), default=0, show_default=True,
              metavar="N", help="Seed of the attack's random starts; was --seed.")
@click.option("--output", "-o", default="-", show_default=True, metavar="FILE",
              help="Result file ('-': stdout): the competition's result for --spec, result "
                   "rows for --instances (with a provenance sidecar <output>.json).")
@click.option("--format", "out_format", default=None, type=click.Choice(["csv", "jsonl"]),
              help="--instances: format of the --output file (default: from its extension, "
                   ".jsonl: jsonl, else csv).")
@click.option("--proof", "proof_path", default=None, metavar="FILE|DIR",
              help="Write a certificate of each unsat verdict (docs/proofs.md; ReLU chains of "
                   "dense layers, convolutions and pools, residual ReLU networks' crown "
                   "stage): to this file with --spec, into this "
                   "directory with --instances (one file per instance). `crown check` checks "
                   "them.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --output file.")
@click.option("--resume", is_flag=True,
              help="--instances: continue an existing --output, skipping instances it holds.")
@click.option("--shard", default=None, metavar="K/N",
              help="--instances: only the K-th of N round-robin parts of the list.")
@click.option("--verbose", "-v", is_flag=True, help="A log line per stage and instance, and the branch and "
                   "bound's status (open domains, worst bound, domains/s) every 2 s.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary line.")
@memory_budget_option
@_handle_errors
@_deprecated("--seed", "--attack-seed", "seed", type=click.IntRange(min=0))
@_deprecated("--method", "--stages", "method")
def verify(**given):
    """Decide VNN-LIB properties: sat (with a counterexample), unsat, unknown or timeout.

    Attack first (PGD towards the unsafe outputs inside the input box), then the bound
    stages on every case of the property. unsat only when every case is proven empty by a
    float64-verified bound; sat only with an input a float64 forward pass confirms. The
    property's X values are the network's inputs as they are (no image scaling). A graph
    network that lowers to dense layers (a chain of convolutions, pools and dense layers
    between activations of one type) runs all of this on its exact dense form; on other
    graphs (max pools, branches, several activation types) the attack, the crown and
    alpha-crown stages, and branch and bound: input splitting up to 64 inputs, ReLU
    splitting on graphs with ReLU nodes.

    Exit codes: 0 a verdict was written (any of sat, unsat, unknown, timeout), 1 internal
    error, 2 bad input or usage, 3 an instance ended in an error, 130 interrupted (Ctrl-C).
    """
    from crown_cli.verification.pipeline import BOUND_STAGES

    a = VerifyArgs(**given)
    stages = _split(a.method, "--stages", BOUND_STAGES)
    timeout, attack_time, memory_budget = a.timeout, a.attack_time, a.memory_budget
    if timeout is not None and not timeout > 0:
        raise InputError(f"--timeout: must be > 0, got {timeout}")
    if attack_time is not None and not attack_time >= 0:
        raise InputError(f"--attack-time: must be >= 0, got {attack_time}")
    options = dict(stages=tuple(stages), attack_restarts=a.attack_restarts,
                   attack_steps=a.attack_steps, seed=a.seed, attack_time=attack_time, bab=a.bab,
                   max_domains=a.max_domains)
    if a.workers is not None:
        options["workers"] = a.workers
    if a.proof_path is not None:
        options["proof"] = True
    check_memory_budget(memory_budget)
    if memory_budget is not None:
        options["memory_budget"] = memory_budget
    log = (lambda msg: click.echo(msg, err=True)) if a.verbose else None
    if a.instances_path is not None:
        if a.model_path is not None or a.spec_path is not None:
            raise InputError("--instances: cannot be combined with --model/--spec")
        return _verify_instances(a, options, log)
    if a.model_path is None or a.spec_path is None:
        raise InputError("verify: give --model and --spec, or --instances")
    for opt, val in (("--root", a.root), ("--resume", a.resume or None), ("--shard", a.shard),
                     ("--format", a.out_format)):
        if val is not None:
            raise InputError(f"{opt}: only with --instances")
    _verify_one(a, 300.0 if timeout is None else timeout, options, log)


@dataclass(frozen=True)
class VerifyArgs:
    """``crown verify``'s options as click hands them over: one field per option, named as
    its parameter in the decorators above."""

    model_path: Optional[str]
    spec_path: Optional[str]
    instances_path: Optional[str]
    root: Optional[str]
    timeout: Optional[float]
    method: str
    attack_restarts: int
    attack_steps: int
    attack_time: Optional[float]
    bab: bool
    max_domains: int
    workers: Optional[int]
    seed: int
    output: str
    proof_path: Optional[str]
    out_format: Optional[str]
    overwrite: bool
    resume: bool
    shard: Optional[str]
    verbose: bool
    quiet: bool
    memory_budget: Optional[float]


def _verify_one(a: VerifyArgs, timeout, options, log):
    """``--model`` and ``--spec``: the verdict in the competition's result format."""
    import os

    from crown_cli.verification.outcome import format_result
    from crown_cli.verification.runner import Loader, warm_up

    from crown_cli.io.result_files import check_output

    model_path, spec_path, output, quiet = a.model_path, a.spec_path, a.output, a.quiet
    check_output(output, a.overwrite, resumable=False)
    t0 = time.perf_counter()
    loader = Loader()
    v = loader.verifier(model_path, **options)
    t0 += warm_up(v)
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
    if a.proof_path is not None:
        from crown_cli.verification.proof import write_verdict_proof

        why = write_verdict_proof(verdict, v, model_path, spec_path, a.proof_path)
        if why:
            click.echo(f"crown: warning: {why}", err=True)
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
        if verdict.note:
            margin += f"; {verdict.note}"
        click.echo(f"crown: {verdict.result} ({verdict.stage}; {verdict.cases_proven} of "
                   f"{verdict.cases} cases proven{margin}) in {time.perf_counter() - t0:.2f} s",
                   err=True)


def _verify_instances(a: VerifyArgs, options, log):
    """``--instances``: a result row per instance of the list (or of its ``--shard``)."""
    from crown_cli.io import provenance as pv
    from crown_cli.io.result_files import (VERIFY_ROWS, OutputFile, ResultJob, format_for,
                                           parse_shard, shard_indices)
    from crown_cli.verification.runner import instances_sha256, read_instances, run_instances

    instances_path, output, shard, quiet = a.instances_path, a.output, a.shard, a.quiet
    out_format = format_for(output, a.out_format)
    click.get_current_context().params["out_format"] = out_format  # recorded in the sidecar
    instances = read_instances(instances_path, a.root)
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
    job = ResultJob(opts, OutputFile(output, out_format, a.overwrite, a.resume), settings,
                    inputs, coverage, VERIFY_ROWS)
    if a.proof_path is not None:
        import os

        os.makedirs(a.proof_path, exist_ok=True)
    _run_job(job, lambda write: run_instances(
        todo, write, job.skip, VERIFY_ROWS.key, timeout_cap=a.timeout, progress=not quiet,
        verifier_options=options, log=log, proof_dir=a.proof_path,
        warn=lambda msg: click.echo(f"crown: warning: {msg}", err=True)), "instance", output, quiet)
