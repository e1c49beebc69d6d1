"""The ``crown`` command line: loads files, calls the engine once per image, writes rows.

The group and the short commands (``inspect``, ``merge``, ``report``) live here; ``certify``
and ``verify`` in :mod:`crown_cli.commands`.
"""
from __future__ import annotations

import sys

import click

from crown_cli import __version__
from crown_cli.commands.certify import certify
from crown_cli.commands.common import (EXIT_BROKEN_PIPE, _handle_errors, _stdout_to_devnull,
                                      check_memory_budget, memory_budget_option)
from crown_cli.commands.verify import verify
from crown_cli.errors import InputError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="crown")
def cli():
    """Certified robustness of neural-network classifiers with CROWN (NeurIPS 2018): MLPs and
    feed-forward graphs (convolutions, pooling, branches) from NPZ, HDF5, Keras or ONNX files.
    certify: certified radii per image; verify: VNN-LIB properties; report, merge, inspect."""
    from crown_cli.runtime import tune_allocator

    tune_allocator()


cli.add_command(certify)
cli.add_command(verify)


@cli.command()
@click.option("--model", "model_path", default=None, type=click.Path(dir_okay=True), metavar="FILE",
              help="Model file: NPZ, HDF5 (W0.., b0..), Keras model.save() HDF5 or .keras, or .onnx.")
@click.option("--activation", default=None, metavar="NAME",
              help="Override the activation read from the model file.")
@click.option("--operators", is_flag=True,
              help="List every ONNX operator the graph loader reads and how it is bounded.")
@memory_budget_option
@_handle_errors
def inspect(model_path, activation, operators, memory_budget):
    """Print a model's layers, activation, parameter count and input size (for a graph: its
    nodes, shapes, parameters and the ONNX operators folded into them); or, with
    --operators, the ONNX operators supported."""
    from crown_cli.io.networks import load_network

    if operators:
        from crown_cli.graph.onnx_ops import operator_table

        for op, how in operator_table():
            click.echo(f"{op:<20} {how}")
        return
    if model_path is None:
        raise click.UsageError("Missing option '--model' (or --operators).")
    check_memory_budget(memory_budget)
    net = load_network(model_path, activation, memory_budget=memory_budget)
    mlp = net.dense  # a chain of dense layers: its layers; else the graph's nodes
    if mlp is None:
        _inspect_graph(model_path, net)
        return
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


def _inspect_graph(model_path, g):
    acts = g.activations()
    inputs = ", ".join("x".join(map(str, g.nodes[i].shape)) for i in g.inputs)
    outputs = ", ".join("x".join(map(str, s)) for s in g.output_shapes)
    click.echo(f"model:       {model_path}")
    click.echo(f"graph:       {len(g.nodes)} nodes ({sum(n.kind == 'affine' for n in g.nodes)} "
               f"affine, {len(acts)} activations)")
    click.echo(f"activations: {', '.join(sorted(set(acts))) or 'none'}")
    click.echo(f"input size:  {g.input_size} ({inputs})")
    click.echo(f"outputs:     {g.output_size} ({outputs})")
    for line in g.summary():
        click.echo(line)
    click.echo(f"parameters:  {g.num_parameters:,}")
    from crown_cli.graph.lower import describe, lowered

    mlp = lowered(g)
    if mlp is not None:
        click.echo(f"engine:      runs on the dense engine: {describe(mlp)} "
                   f"({mlp.activation}; every method)")
    else:
        click.echo(f"engine:      runs on the graph engine (not lowered: {g.lowering[1]})")


@cli.command()
@click.option("--model", "model_path", default=None, metavar="FILE", help="ONNX, NPZ or Keras HDF5 model.")
@click.option("--spec", "spec_path", default=None, metavar="FILE", help="VNN-LIB property.")
@click.option("--instances", "instances_path", default=None, metavar="FILE",
              help="An instance list (onnx,vnnlib,timeout per line, relative to its folder).")
@click.option("--root", default=None, metavar="DIR",
              help="Directory the instance list's paths are relative to (default: its own).")
@click.option("--images", "images_path", default=None, metavar="FILE",
              help="With --model: check crown certify certificates of radii of images of this "
                   "file (NPZ or IDX).")
@click.option("--labels", "labels_path", default=None, metavar="FILE",
              help="Labels IDX file for IDX images (default: the labels file beside them).")
@click.option("--proof", "proof_path", required=True, metavar="FILE|DIR",
              help="The certificate (--model/--spec) or the folder of certificates "
                   "(--instances: {i:04d}_{onnx stem}_{vnnlib stem}.proof; --images: every "
                   "*.proof in it).")
@_handle_errors
def check(model_path, spec_path, instances_path, root, images_path, labels_path, proof_path):
    """Check crown verify certificates of unsat answers, or crown certify certificates of
    radii (--images), with an independent checker (docs/proofs.md). Exit 0: all accepted;
    1: some rejected; 2: bad input."""
    import os

    from crown_cli import check as checker

    if images_path is not None:
        if spec_path or instances_path or not model_path:
            raise click.UsageError("--images: give --model and --proof, not --spec/--instances")
        return _check_radii(checker, model_path, images_path, labels_path, proof_path)
    if labels_path is not None:
        raise click.UsageError("--labels: only with --images")
    if root is not None and instances_path is None:
        raise click.UsageError("--root: only with --instances")
    if instances_path is not None:
        if model_path or spec_path:
            raise InputError("--instances: cannot be combined with --model/--spec")
        from crown_cli.verification.runner import read_instances

        if not os.path.isdir(proof_path):
            raise InputError(f"{proof_path}: not a directory of certificates")
        jobs, instances = [], read_instances(instances_path, root)
        for inst in instances:
            name = os.path.join(proof_path, checker.proof_name(inst.index, inst.onnx, inst.vnnlib))
            if os.path.exists(name):
                jobs.append((inst.path("onnx"), inst.path("vnnlib"), name))
        if not jobs:
            raise InputError(f"{proof_path}: no certificate of any instance of {instances_path}")
        if len(jobs) < len(instances):
            click.echo(f"crown: {len(instances) - len(jobs)} of {len(instances)} instances have no "
                       f"certificate in {proof_path} (not checked)", err=True)
    elif model_path and spec_path:
        jobs = [(model_path, spec_path, proof_path)]
    else:
        raise click.UsageError("give --model and --spec, or --instances")

    def verdict(model, spec, proof):
        st = checker.check(model, spec, proof)
        return f"{st['cases']} cases, {st['nodes']} nodes"

    _report_checks(checker, [(job[2], lambda job=job: verdict(*job)) for job in jobs])


def _report_checks(checker, jobs):
    """Run each ``(proof, check)`` of ``jobs``: a line per certificate, ``accepted (what
    check() returned, time)`` or ``rejected: reason (time)``; bad input as the one-line error;
    exit 1 when some certificate is rejected."""
    import time

    rejected = 0
    for proof, run in jobs:
        t0 = time.perf_counter()
        try:
            what = run()
            click.echo(f"{proof}: accepted ({what}, {time.perf_counter() - t0:.2f} s)")
        except checker.Reject as exc:
            rejected += 1
            click.echo(f"{proof}: rejected: {exc} ({time.perf_counter() - t0:.2f} s)")
        except checker.CheckError as exc:
            raise InputError(str(exc)) from None
    if rejected:
        raise click.exceptions.Exit(1)


def _check_radii(checker, model_path, images_path, labels_path, proof_path):
    """``crown check --images``: every certificate of radii of the folder, or the one file."""
    import glob
    import os

    if os.path.isdir(proof_path):
        proofs = sorted(glob.glob(os.path.join(proof_path, "*.proof")))
        if not proofs:
            raise InputError(f"{proof_path}: no *.proof certificate in the folder")
    else:
        proofs = [proof_path]

    def verdict(proof):
        st = checker.check_certify(model_path, images_path, proof, labels_path)
        return (f"image {st['image']}, class {st['class']}, targets "
                f"{','.join(map(str, st['targets']))}, eps {st['eps']!r}")

    _report_checks(checker, [(p, lambda p=p: verdict(p)) for p in proofs])


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
    from crown_cli.io.result_files import merge_files

    merged = merge_files(list(parts), output, overwrite)
    if verbose:
        for part in merged["coverage"]["merged_from"]:
            cov = part.get("coverage") or {}
            shard = (cov.get("options") or {}).get("--shard")
            click.echo(f"crown: {part['file']}: {part['rows']} rows"
                       + (f", shard {shard}" if shard else ""), err=True)
    note = merged["coverage"].get("shards_missing")  # (merge_files' missing_shards)
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
@click.option("--format", "fmt", default=None,
              type=click.Choice(["markdown", "latex", "csv", "json"]),
              help="Format of the --output: a markdown or LaTeX table, or CSV / JSON with the "
                   "numbers unrounded (for scripts). Default: from the --output name's "
                   "extension (.md, .tex, .csv, .json), else markdown.")
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
    from crown_cli.io.report import RENDERERS, aggregate, plot_report, read_results, table_format
    from crown_cli.io.result_files import check_output

    fmt = table_format(output, fmt)
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
    except SystemExit:
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
