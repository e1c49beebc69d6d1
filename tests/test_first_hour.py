"""Issue 24, "the first hour": the mistakes a new user makes get one clear line and the right
exit code, and the subcommands agree on what an option means. One test (at least) per item of
the issue, each asserting the message and the exit code."""
import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import ROOT, error_line, interrupt_row_writes, model_path
from crown_cli.cli import cli

SMALL = model_path("mnist_2x20.h5")
BIG = model_path("mnist_3x1024.h5")
ACASXU = os.path.join(ROOT, "tests", "fixtures", "ACASXU_run2a_1_1_batch_2000.onnx")
CLI_DOC = os.path.join(ROOT, "docs", "cli.md")


def run(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


def certify(*args):
    return run("certify", "--model", SMALL, *args)


# ------------------------------------------------------------------------------ output paths


def test_output_in_a_missing_directory(tmp_path):
    out = tmp_path / "no" / "such" / "dir" / "out.csv"
    res = certify("-n", 1, "-o", out)
    assert res.exit_code == 2
    assert f"{out}: output directory {out.parent} does not exist" in error_line(res)
    assert not (tmp_path / "no").exists()


def test_verify_instances_output_in_a_missing_directory(tmp_path):
    spec = tmp_path / "p.vnnlib"
    spec.write_text(_acas_spec([0.0] * 5, [0.01] * 5))
    inst = tmp_path / "list.csv"
    inst.write_text(f"{ACASXU},{spec},10\n")
    out = tmp_path / "missing" / "v.csv"
    res = run("verify", "--instances", inst, "-o", out)
    assert res.exit_code == 2
    assert "output directory" in error_line(res) and "does not exist" in res.stderr
    assert not out.parent.exists()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_output_where_no_file_can_be_created():
    res = certify("-n", 1, "-o", "/proc/x.csv")
    assert res.exit_code == 2
    assert "/proc/x.csv: cannot create files in /proc" in error_line(res)


@pytest.mark.parametrize("extra", [[], ["--overwrite"]])
def test_output_that_is_a_directory(tmp_path, extra):
    d = tmp_path / "SOMEDIR"
    d.mkdir()
    res = certify("-n", 1, "-o", d, *extra)
    assert res.exit_code == 2
    assert f"{d}: is a directory; give a file name for the output file" in error_line(res)
    assert sorted(os.listdir(tmp_path)) == ["SOMEDIR"]  # no SOMEDIR.json left behind
    assert os.listdir(d) == []


# ------------------------------------------------------------------------------ image files


def test_npz_with_no_images(tmp_path):
    p = tmp_path / "empty.npz"
    np.savez(p, x=np.zeros((0, 784)), y=np.zeros(0, dtype=np.int64))
    res = certify("-n", 1, "--images", p)
    assert res.exit_code == 2
    assert f"{p}: contains no images ('x' has shape (0, 784))" in error_line(res)


def _idx(path, magic, dims, payload):
    with open(path, "wb") as fh:
        fh.write(magic.to_bytes(4, "big"))
        for d in dims:
            fh.write(int(d).to_bytes(4, "big"))
        fh.write(np.asarray(payload, dtype=np.uint8).tobytes())


@pytest.fixture
def idx_images(tmp_path):
    p = tmp_path / "imgs-idx3-ubyte"
    _idx(p, 0x00000803, (3, 28, 28), np.zeros(3 * 784))
    return p


def test_idx_labels_file_missing(tmp_path, idx_images):
    res = certify("-n", 1, "--images", idx_images, "--labels", tmp_path / "nope")
    assert res.exit_code == 2
    assert f"{tmp_path / 'nope'}: labels file not found" in error_line(res)


def test_idx_labels_file_of_the_wrong_kind(tmp_path, idx_images):
    lab = tmp_path / "labels"
    _idx(lab, 0x00000803, (3, 28, 28), np.zeros(3 * 784))  # an images file given as labels
    res = certify("-n", 1, "--images", idx_images, "--labels", lab)
    assert res.exit_code == 2
    line = error_line(res)
    assert f"{lab}: not an IDX labels file (magic number 0x00000803 says 3 dimensions" in line
    assert "truncated" not in line


def test_label_out_of_range_blames_the_labels_file(tmp_path, idx_images):
    lab = tmp_path / "labels"
    _idx(lab, 0x00000801, (3,), [1, 200, 2])
    res = certify("-n", 1, "--images", idx_images, "--labels", lab)
    assert res.exit_code == 2
    line = error_line(res)
    assert f"{lab}: label 200 of image 1 is outside 0..9" in line
    assert f"{idx_images}:" not in line


def test_num_images_beyond_the_file_is_said_once():
    res = certify("-n", 1000000000, "--start", 98, "-q")
    assert res.exit_code == 0
    notes = [l for l in res.stderr.splitlines() if "--num-images" in l]
    assert notes == ["crown: note: --num-images 1000000000: default MNIST images holds 100 "
                     "images, so images 98..99 (2) are certified"]
    assert len(list(csv.DictReader(io.StringIO(res.stdout)))) == 2
    assert "--num-images" not in certify("-n", 2, "-q").stderr  # within the file: no note


# ------------------------------------------------------------------------------ --eps0


@pytest.mark.parametrize("args", [["--eps0", "inf"], ["--eps0", "1e200", "--search", "bisect"],
                                  ["--eps0", "nan"]])
def test_eps0_that_cannot_be_searched_is_refused(args):
    res = certify("-n", 1, *args)
    assert res.exit_code == 2
    assert "--eps0: must be > 0 and at most --max-eps (10000)" in error_line(res)
    assert res.stdout == ""


def test_max_eps_beyond_float_range_is_refused():
    res = certify("-n", 1, "--eps0", "1e200", "--max-eps", "1e200", "--search", "bisect")
    assert res.exit_code == 2
    assert "--max-eps: must be > 0 and at most 1e+30, got 1e+200" in error_line(res)


def test_eps0_changes_only_the_evaluations():
    """What the reference says: within --rtol the same radius from any allowed --eps0."""
    eps = []
    for args in ([], ["--eps0", "1e4", "--search", "bisect"], ["--eps0", "1e-30"]):
        res = certify("-n", 1, "-q", *args)
        assert res.exit_code == 0, res.output
        (row,) = csv.DictReader(io.StringIO(res.stdout))
        assert row["status"] == "certified"
        eps.append(float(row["eps"]))
    assert max(eps) / min(eps) - 1 < 2e-4


# ------------------------------------------------------------------------------ Ctrl-C


@pytest.mark.slow
def test_ctrl_c_exits_130_with_a_resume_hint_and_a_true_sidecar(tmp_path):
    out = tmp_path / "r.csv"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "crown_cli", "certify", "--model", BIG, "-n", "20", "-o", str(out)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300  # a safety net only; nothing is timed
        while not (out.exists() and out.read_text().count("\n") >= 2):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no row written"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert 1 <= len(rows) < 20
    assert "Aborted!" not in err and "Traceback" not in err
    assert (f"crown: interrupted; {out} holds {len(rows)} finished row"
            f"{'' if len(rows) == 1 else 's'}; run the same command with --resume to continue it"
            ) in err
    side = json.loads((tmp_path / "r.csv.json").read_text())
    assert side["rows"] == len(rows) and side["complete"] is False
    assert side["runs"][-1]["rows_written"] == len(rows) and side["runs"][-1]["ended"]
    # the hint is right: the same command with --resume completes the file
    res = run("certify", "--model", BIG, "-n", 20, "-o", out, "--resume", "-q")
    assert res.exit_code == 0, res.output
    assert len(list(csv.DictReader(open(out)))) == 20
    assert json.loads((tmp_path / "r.csv.json").read_text())["complete"] is True


def test_ctrl_c_just_after_a_row_is_written_counts_that_row(tmp_path, monkeypatch):
    """A real SIGINT that arrives the moment a row has reached the file (before it was
    counted; the slow tier's subprocess test met this once): the hint and the sidecar still
    count that row."""
    from crown_cli.io import result_files

    real, calls = result_files.RowWriter.write, []

    def write(self, row):
        real(self, row)
        calls.append(row)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(result_files.RowWriter, "write", write)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a worker ignores it
    # another thread that does not block SIGINT (as numba's and BLAS's): the kernel may
    # deliver the signal to it, so that blocking it in the main thread holds nothing back
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        out = tmp_path / "r.csv"
        res = certify("-n", 5, "-o", out)
    finally:
        signal.signal(signal.SIGINT, previous)
        stop.set()
    assert res.exit_code == 130
    assert len(list(csv.DictReader(open(out)))) == 2
    assert f"crown: interrupted; {out} holds 2 finished rows" in res.stderr
    side = json.loads((tmp_path / "r.csv.json").read_text())
    assert side["rows"] == 2 and side["runs"][-1]["rows_written"] == 2


def test_ctrl_c_in_a_cli_runner_run(tmp_path, monkeypatch):
    """The same path without a subprocess: the second row's write is interrupted."""
    from crown_cli.io import result_files

    real = interrupt_row_writes(monkeypatch)
    out = tmp_path / "r.csv"
    res = certify("-n", 5, "-o", out, "--overwrite")
    assert res.exit_code == 130
    assert (f"crown: interrupted; {out} holds 2 finished rows; run the same command with "
            "--resume (instead of --overwrite) to continue it") in res.stderr
    side = json.loads((tmp_path / "r.csv.json").read_text())
    assert side["rows"] == 2 and side["runs"][-1]["rows_written"] == 2
    monkeypatch.setattr(result_files.RowWriter, "write", real)
    res = certify("-n", 5, "-o", out, "--resume", "-q")
    assert res.exit_code == 0 and len(list(csv.DictReader(open(out)))) == 5


# ------------------------------------------------------------------------------ formats


def test_jsonl_extension_gives_jsonl_and_report_reads_it(tmp_path):
    out = tmp_path / "x.jsonl"
    assert certify("-n", 2, "-q", "-o", out).exit_code == 0
    first = out.read_text().splitlines()[0]
    assert json.loads(first)["image"] == 0
    assert json.loads((tmp_path / "x.jsonl.json").read_text())["options"]["--format"] == "jsonl"
    res = run("report", out)
    assert res.exit_code == 0, res.output
    assert "| mnist_2x20 | l_inf | runner-up | 2 |" in res.stdout


def test_format_contradicting_the_extension_is_refused(tmp_path):
    res = certify("-n", 1, "-o", tmp_path / "x.jsonl", "--format", "csv")
    assert res.exit_code == 2
    assert "x.jsonl: --format csv but the name ends in .jsonl" in error_line(res)
    assert os.listdir(tmp_path) == []


def test_report_reads_the_format_the_sidecar_names(tmp_path):
    out = tmp_path / "rows.out"  # no telling extension
    assert certify("-n", 2, "-q", "-o", out, "--format", "jsonl").exit_code == 0
    res = run("report", out)
    assert res.exit_code == 0, res.output
    assert "| 2 |" in res.stdout


def test_verify_spec_refuses_format(tmp_path):
    spec = tmp_path / "p.vnnlib"
    spec.write_text(_acas_spec([0.0] * 5, [0.01] * 5))
    res = run("verify", "--model", ACASXU, "--spec", spec, "--format", "jsonl")
    assert res.exit_code == 2
    assert "--format: only with --instances" in error_line(res)


# ------------------------------------------------------------------------------ VNN-LIB


def _acas_spec(lo, hi, extra=""):
    out = [f"(declare-const X_{i} Real)" for i in range(5)]
    out += [f"(declare-const Y_{j} Real)" for j in range(5)]
    for i in range(5):
        out += [f"(assert (>= X_{i} {lo[i]!r}))", f"(assert (<= X_{i} {hi[i]!r}))"]
    out.append("(assert (<= Y_0 -1000.0))")
    return "\n".join(out) + "\n" + extra


def test_empty_input_box_is_warned_about(tmp_path):
    spec = tmp_path / "p.vnnlib"
    spec.write_text(_acas_spec([0.0, 0.5, 0, 0, 0], [0.01, 0.2, 0.01, 0.01, 0.01]))
    res = run("verify", "--model", ACASXU, "--spec", spec, "-q")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0] == "unsat"
    assert (f"crown: warning: {spec}: the input box is empty (X_1 has lower bound 0.5 above "
            "its upper bound 0.2): no input can violate the property, so it holds trivially "
            "(unsat)") in res.stderr


def test_empty_input_box_warned_in_instance_runs(tmp_path):
    spec = tmp_path / "p.vnnlib"
    spec.write_text(_acas_spec([0.0, 0.5, 0, 0, 0], [0.01, 0.2, 0.01, 0.01, 0.01]))
    inst = tmp_path / "list.csv"
    inst.write_text(f"{ACASXU},{spec},10\n")
    res = run("verify", "--instances", inst, "-o", tmp_path / "v.csv", "-q")
    assert res.exit_code == 0, res.output
    assert "the input box is empty (X_1 has lower bound 0.5" in res.stderr


def test_cli_reference_documents_strict_and_empty_boxes():
    text = open(CLI_DOC, encoding="utf-8").read()
    assert "strict" in text and "`<`" in text and "empty" in text


# ------------------------------------------------------------------------------ help and report


def test_alpha_iters_help_states_the_real_default():
    from crown_cli.certification.certifier import ALPHA_ITERS

    res = run("certify", "--help")
    assert res.exit_code == 0
    assert f"(default {ALPHA_ITERS};" in " ".join(res.stdout.split())


def test_report_on_a_verify_result_file(tmp_path):
    f = tmp_path / "v.csv"
    f.write_text("index,instance,onnx,vnnlib,timeout,verdict,time_s,stage,margin,cases,"
                 "cases_proven,domains,peak_domains,counterexample\n"
                 "0,a,a.onnx,a.vnnlib,10,unsat,0.1,crown,0.5,1,1,,,\n")
    res = run("report", f)
    assert res.exit_code == 2
    assert (f"{f}: is a crown verify result file (one verdict per instance); crown report "
            "tables the rows of crown certify") in error_line(res)


@pytest.fixture
def two_norms(tmp_path):
    out = tmp_path / "mnist_2x20.csv"
    res = certify("-n", 3, "--norm", "inf,2", "--method", "crown,fast-lin", "-o", out)
    assert res.exit_code == 0, res.output
    return out, res


def test_summary_gives_one_figure_per_norm_and_method(two_norms):
    _, res = two_norms
    line = [l for l in res.stderr.splitlines() if "mean certified eps" in l][0]
    found = re.findall(r"(l_inf|l_2) (crown|fast-lin) ([0-9.e-]+) over (\d+) rows", line)
    assert [(n, m, k) for n, m, _, k in found] == [
        ("l_inf", "crown", "3"), ("l_inf", "fast-lin", "3"), ("l_2", "crown", "3"),
        ("l_2", "fast-lin", "3")]
    rows = list(csv.DictReader(open(two_norms[0])))
    for n, m, mean, _ in found:
        eps = [float(r["eps"]) for r in rows if r["method"] == m
               and r["norm"] == {"l_inf": "inf", "l_2": "2"}[n]]
        assert float(mean) == pytest.approx(np.mean(eps), rel=1e-4)


def test_report_csv_and_json_and_columns(two_norms):
    out, _ = two_norms
    res = run("report", out, "--format", "csv", "--columns", "network,norm,CROWN,crown-s-image")
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert list(rows[0]) == ["network", "norm", "CROWN", "CROWN s/image"]
    assert [r["norm"] for r in rows] == ["l_2", "l_inf"]
    eps = [float(r["eps"]) for r in csv.DictReader(open(out))
           if r["method"] == "crown" and r["norm"] == "inf"]
    assert float(rows[1]["CROWN"]) == pytest.approx(np.mean(eps), rel=1e-12)  # unrounded
    res = run("report", out, "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["rows"][1]["network"] == "mnist_2x20" and doc["rows"][1]["images"] == 3
    assert isinstance(doc["rows"][1]["CROWN vs Fast-Lin"], float)
    res = run("report", out, "--columns", "network,nonsense")
    assert res.exit_code == 2
    assert "--columns: no column 'nonsense' in this report (columns: network, norm" in \
        error_line(res)


def test_report_plot_has_whole_image_numbers(two_norms, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    seen = []
    real = matplotlib.figure.Figure.savefig

    def savefig(self, *a, **k):
        for ax in self.axes:
            if ax.get_visible():
                seen.append(list(ax.get_xticks()))
        return real(self, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    res = run("report", two_norms[0], "--plot", tmp_path / "p.png")
    assert res.exit_code == 0, res.output
    assert seen and all(float(t).is_integer() for ticks in seen for t in ticks)


def test_report_output_is_not_replaced_without_overwrite(two_norms, tmp_path):
    out, _ = two_norms
    table = tmp_path / "t.md"
    table.write_text("mine\n")
    res = run("report", out, "-o", table)
    assert res.exit_code == 2
    assert f"{table}: output file exists; pass --overwrite to replace it" in error_line(res)
    assert table.read_text() == "mine\n"
    assert run("report", out, "-o", table, "--overwrite").exit_code == 0
    assert table.read_text().startswith("| network |")


def test_resume_help_says_how_to_add_images():
    text = " ".join(run("certify", "--help").stdout.split())
    assert "cannot extend a finished run to more images" in text and "crown merge" in text


def test_shell_completion_works_and_is_documented():
    env = dict(os.environ, _CROWN_COMPLETE="bash_source",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "crown_cli"], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0 and "_CROWN_COMPLETE" in out.stdout and "complete" in out.stdout
    assert "_CROWN_COMPLETE=bash_source crown" in open(CLI_DOC, encoding="utf-8").read()


# ------------------------------------------------------------------------------ one meaning per name


def test_target_seed_and_its_old_spelling(tmp_path):
    new = certify("-n", 4, "--target", "random", "--target-seed", 3, "-q")
    old = certify("-n", 4, "--target", "random", "--seed", 3, "-q")
    assert new.exit_code == old.exit_code == 0

    def targets(res):
        return [(r["image"], r["target"], r["eps"]) for r in csv.DictReader(io.StringIO(res.stdout))]

    assert targets(new) == targets(old) and len(targets(new)) == 4
    assert "--seed" not in new.stderr
    assert old.stderr.strip() == ("crown: warning: --seed is deprecated in crown certify; "
                                  "use --target-seed")
    both = certify("-n", 1, "--seed", 3, "--target-seed", 4)
    assert both.exit_code == 2
    assert "--seed: is the old spelling of --target-seed; give only --target-seed" in \
        both.stderr


def test_resume_of_a_file_made_with_the_old_option_names(tmp_path):
    out = tmp_path / "r.csv"
    assert certify("-n", 3, "--target", "random", "--target-seed", 3, "-o", out, "-q").exit_code == 0
    side_path = tmp_path / "r.csv.json"
    side = json.loads(side_path.read_text())
    for block in ("settings", "options"):  # what an earlier version wrote
        side[block] = {("--seed" if k == "--target-seed" else k): v for k, v in side[block].items()}
    side_path.write_text(json.dumps(side))
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:2]) + "\n")
    res = certify("-n", 3, "--target", "random", "--target-seed", 3, "-o", out, "--resume", "-q")
    assert res.exit_code == 0, res.output
    assert len(list(csv.DictReader(open(out)))) == 3


def test_verify_stages_and_attack_seed_and_their_old_spellings(tmp_path):
    spec = tmp_path / "p.vnnlib"
    spec.write_text(_acas_spec([0.0] * 5, [0.01] * 5))
    new = run("verify", "--model", ACASXU, "--spec", spec, "--stages", "crown",
              "--attack-seed", 1, "-q")
    old = run("verify", "--model", ACASXU, "--spec", spec, "--method", "crown", "--seed", 1, "-q")
    assert new.exit_code == old.exit_code == 0, old.output
    assert new.stdout == old.stdout and new.stderr == ""  # the verdict line only
    assert "crown: warning: --method is deprecated in crown verify; use --stages" in old.stderr
    assert "crown: warning: --seed is deprecated in crown verify; use --attack-seed" in old.stderr
    res = run("verify", "--model", ACASXU, "--spec", spec, "--stages", "magic")
    assert res.exit_code == 2 and "--stages: unknown value 'magic'" in error_line(res)


def test_verbose_and_quiet_on_every_command_that_runs(two_norms, tmp_path):
    out, _ = two_norms
    v = certify("-n", 2, "-v")
    assert v.exit_code == 0
    assert "crown: image 0 runner-up 3 inf crown: certified eps " in v.stderr
    warned = run("report", out, out)  # the same rows twice: a warning
    assert warned.exit_code == 0 and "crown: warning:" in warned.stderr
    quiet = run("report", out, out, "-q")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    verbose = run("report", out, "-v")
    assert f"crown: {out}: 12 rows" in verbose.stderr
    for command in ("certify", "verify", "merge", "report"):
        text = run(command, "--help").stdout
        assert "-v, --verbose" in text and "-q, --quiet" in text, command


def test_same_metavars_everywhere():
    for command, options in (("certify", ("--model FILE", "--images FILE", "-o, --output FILE",
                                          "--num-images N", "--target-seed N")),
                             ("verify", ("--model FILE", "--spec FILE", "--instances FILE",
                                         "-o, --output FILE", "--root DIR", "--attack-seed N")),
                             ("merge", ("FILE...", "-o, --output FILE")),
                             ("report", ("FILE...", "-o, --output FILE", "--plot FILE")),
                             ("inspect", ("--model FILE",))):
        text = run(command, "--help").stdout
        for opt in options:
            assert opt in text, (command, opt)
        assert " PATH" not in text and " TEXT" not in text.split("Options:")[0], command


# ------------------------------------------------------------------------------ exit codes


def _exit_table():
    text = open(CLI_DOC, encoding="utf-8").read()
    section = text.split("## Errors and exit codes", 1)[1].split("\n## ", 1)[0]
    return section, dict(re.findall(r"^\| (\d+) \| (.*) \|$", section, re.M))


def test_exit_code_table_matches_the_commands(tmp_path):
    section, table = _exit_table()
    assert set(table) == {"0", "1", "2", "3", "130", "141"}
    assert "usage" in table["2"] and "interrupted" in table["130"].lower()
    # 2: a usage error (click's multi-line form) and a bad value (crown's one line)
    usage = run("certify", "--model", SMALL, "--no-such-option")
    assert usage.exit_code == 2 and "Usage: " in usage.stderr and "No such option" in usage.stderr
    assert "click" in section and "Usage:" in section
    bad = certify("--rtol", "5")
    assert bad.exit_code == 2 and "--rtol: must lie in (0, 1)" in error_line(bad)
    # 3: finished with failed rows
    assert certify("-n", 1, "--method", "exact", "--timeout", "1e-6", "-q").exit_code == 3


def test_ctrl_c_inside_a_numba_kernel_is_still_an_interrupt(tmp_path, monkeypatch):
    """A SIGINT during a numba kernel surfaces as a SystemError whose context is the
    KeyboardInterrupt; the per-image handler must not record it as an error row."""
    from crown_cli.certification import certifier

    real = certifier.Certifier.certify
    calls = []

    def certify_(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise SystemError("<built-in function x> returned a result with an exception set")
        return real(self, *a, **k)

    monkeypatch.setattr(certifier.Certifier, "certify", certify_)
    out = tmp_path / "r.csv"
    res = certify("-n", 5, "-o", out, "--overwrite")
    assert res.exit_code == 130, res.output
    assert "holds 1 finished row;" in res.output
