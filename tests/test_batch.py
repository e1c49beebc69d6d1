"""Batch work: --resume after SIGKILL, --shard + merge, --format jsonl, the provenance sidecar,
rows with status error / timeout and exit code 3."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import ROOT, model_path
from crown_cli.io.result_files import shard_indices
from crown_cli.certification.certifier import Certificate, Certifier
from crown_cli.cli import cli
from crown_cli.io.results import COLUMNS, read_rows

SMALL = model_path("mnist_2x20.h5")
KEY = ("image", "target_type", "target", "norm", "method")


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def certify(out, *extra, model=SMALL):
    return run("certify", "--model", model, "-q", "-o", out, *extra)


def strip(rows):
    """Rows without time_s (the only column that differs between identical runs)."""
    return [{k: v for k, v in r.items() if k != "time_s"} for r in rows]


def keys(rows):
    return [tuple(r[k] for k in KEY) for r in rows]


def read_jsonl(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def sidecar(path):
    with open(f"{path}.json", encoding="utf-8") as fh:
        return json.load(fh)


# ----------------------------------------------------------------------------- resume


def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path):
    # 15 images x 24 rows of a small network: long enough to be killed mid-run, quick to finish
    args = ["--model", SMALL, "-n", "15", "--norm", "inf,2,1", "--method", "crown,fast-lin",
            "--target", "runner-up,random,least,untargeted", "-q"]
    total = 15 * 24
    killed = tmp_path / "killed.csv"
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "crown_cli", "certify", *args, "-o", str(killed)],
                            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if killed.exists() and killed.read_bytes().count(b"\n") > 30:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_before = killed.read_bytes().count(b"\n") - 1  # whole rows (a partial last line is cut)
    assert 30 <= n_before < total
    assert sidecar(killed)["complete"] is False and sidecar(killed)["runs"][0]["ended"] is None

    res = run("certify", *args, "-o", killed, "--resume")
    assert res.exit_code == 0, res.output
    full = tmp_path / "full.csv"
    assert run("certify", *args, "-o", full).exit_code == 0

    got, want = read_rows(killed), read_rows(full)
    assert len(got) == total and len(set(keys(got))) == total  # no duplicates
    assert strip(got) == strip(want)
    assert {r["status"] for r in got} >= {"certified", "misclassified"}
    side = sidecar(killed)
    assert side["complete"] is True and side["rows"] == total and len(side["runs"]) == 2
    assert side["runs"][1]["rows_before"] == n_before
    assert side["runs"][1]["skipped_rows"] == n_before
    assert side["runs"][1]["rows_written"] == total - n_before


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_resume_cuts_a_partial_last_line_and_completes_the_file(tmp_path, fmt):
    args = ["-n", "6", "--target", "runner-up,random", "--format", fmt]
    full, cut = tmp_path / f"full.{fmt}", tmp_path / f"cut.{fmt}"
    assert certify(full, *args).exit_code == 0
    data = full.read_bytes()
    lines = data.split(b"\n")
    keep = b"\n".join(lines[:5]) + b"\n" + lines[5][:17]  # 4 or 5 whole rows, then half a line
    cut.write_bytes(keep)
    shutil.copy(f"{full}.json", f"{cut}.json")
    res = certify(cut, *args, "--resume")
    assert res.exit_code == 0, res.output
    if fmt == "csv":
        assert strip(read_rows(cut)) == strip(read_rows(full))
    else:
        assert strip(read_jsonl(cut)) == strip(read_jsonl(full))
    assert len(cut.read_bytes().split(b"\n")) == len(lines)


def test_auto_kernels_count_only_the_rows_a_resume_has_left(tmp_path):
    # 8 rows of the 3x[1024] model are past the numpy kernels' budget, the 3 left after a
    # resume are within it (cli.choose_kernels): each run's kernels are in the sidecar
    big = model_path("mnist_3x1024.h5")
    full, part = tmp_path / "full.csv", tmp_path / "part.csv"
    assert certify(full, "-n", "8", model=big).exit_code == 0
    assert [r["kernels"] for r in sidecar(full)["runs"]] == ["numba"]
    lines = full.read_bytes().split(b"\n")
    part.write_bytes(b"\n".join(lines[:6]) + b"\n")  # header and 5 rows
    shutil.copy(f"{full}.json", f"{part}.json")
    res = certify(part, "-n", "8", "--resume", model=big)
    assert res.exit_code == 0, res.output
    assert [r["kernels"] for r in sidecar(part)["runs"]] == ["numba", "numpy"]
    got, want = read_rows(part), read_rows(full)
    assert keys(got) == keys(want)
    for g, w in zip(got, want):  # the kernels differ only in the order of float64 sums
        assert float(g["eps"]) == pytest.approx(float(w["eps"]), rel=2 * float(w["rtol"]))


def test_resuming_a_complete_file_writes_nothing(tmp_path):
    out = tmp_path / "r.csv"
    assert certify(out, "-n", "3").exit_code == 0
    before = out.read_bytes()
    res = run("certify", "--model", SMALL, "-n", "3", "-o", out, "--resume")
    assert res.exit_code == 0, res.output
    assert out.read_bytes() == before
    assert "0 rows for 3 images" in res.stderr and "3 rows already there" in res.stderr


def test_resume_without_a_file_starts_one(tmp_path):
    out = tmp_path / "new.csv"
    assert certify(out, "-n", "2", "--resume").exit_code == 0
    assert len(read_rows(out)) == 2 and sidecar(out)["complete"] is True


@pytest.mark.parametrize("extra,message", [
    (["--rtol", "1e-3"], "other settings: --rtol 0.0001 vs 0.001 (file vs this run)"),
    (["--norm", "2"], 'other settings: --norm "inf" vs "2"'),
    (["-n", "5"], "other settings: --num-images 3 vs 5"),
    (["--shard", "1/2"], 'other settings: --shard null vs "1/2"'),
])
def test_resume_with_other_settings_is_refused(tmp_path, extra, message):
    out = tmp_path / "r.csv"
    assert certify(out, "-n", "3").exit_code == 0
    before = out.read_bytes()
    res = run("certify", "--model", SMALL, "-n", "3", "-o", out, "--resume", *extra)
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"crown: error: --resume: {out} was made with ")
    assert message in lines[0]
    assert out.read_bytes() == before


def test_resume_in_another_format_is_refused(tmp_path):
    # a name without .csv/.jsonl: --format decides, and the sidecar records it
    out = tmp_path / "r.rows"
    assert certify(out, "-n", "3").exit_code == 0
    before = out.read_bytes()
    res = run("certify", "--model", SMALL, "-n", "3", "-o", out, "--resume", "--format", "jsonl")
    assert res.exit_code == 2
    assert 'other settings: --format "csv" vs "jsonl"' in res.output
    assert out.read_bytes() == before


def test_resume_with_another_model_is_refused(tmp_path):
    out = tmp_path / "r.csv"
    assert certify(out, "-n", "2").exit_code == 0
    sha = hashlib.sha256(open(SMALL, "rb").read()).hexdigest()
    other = hashlib.sha256(open(model_path("mnist_3x20.h5"), "rb").read()).hexdigest()
    res = run("certify", "--model", model_path("mnist_3x20.h5"), "-n", "2", "-o", out, "--resume")
    assert res.exit_code == 2
    assert f'other settings: model SHA-256 "{sha}" vs "{other}"' in res.output


@pytest.mark.parametrize("args,message", [
    (["-o", "{t}/r.csv", "--resume", "--overwrite"],
     "crown: error: --resume: cannot be combined with --overwrite (choose one)"),
    (["--resume"], "crown: error: --resume: needs an --output file, not stdout"),
    (["-o", "{t}/nosidecar.csv", "--resume"],
     "crown: error: {t}/nosidecar.csv: no provenance sidecar {t}/nosidecar.csv.json "
     "(needed to check the settings)"),
    (["-o", "{t}/r.csv", "--shard", "2"],
     "crown: error: --shard: expected K/N with whole numbers, e.g. 2/8, got '2'"),
    (["-o", "{t}/r.csv", "--shard", "4/3"], "crown: error: --shard: need 1 <= K <= N, got 4/3"),
    (["-o", "{t}/r.csv", "--shard", "0/3"], "crown: error: --shard: need 1 <= K <= N, got 0/3"),
])
def test_bad_batch_options(tmp_path, args, message):
    t = str(tmp_path)
    (tmp_path / "nosidecar.csv").write_text("precious\n")
    res = run("certify", "--model", SMALL, "-n", "2", *[a.format(t=t) for a in args])
    assert res.exit_code == 2
    assert res.output == message.format(t=t) + "\n"
    assert (tmp_path / "nosidecar.csv").read_text() == "precious\n"
    assert not (tmp_path / "r.csv").exists() and not (tmp_path / "r.csv.json").exists()


# ----------------------------------------------------------------------------- shards and merge


def test_shards_are_round_robin():
    assert shard_indices(range(3, 13), (2, 3)) == [4, 7, 10]
    parts = [shard_indices(range(100), (k, 7)) for k in range(1, 8)]
    assert sorted(i for p in parts for i in p) == list(range(100))


def test_a_shard_with_no_image_says_so(tmp_path):
    """More shards than images: the empty shard writes its header, exit code 0, and a note
    saying that none of the images falls in it (before: silent)."""
    out = tmp_path / "r.csv"
    res = run("certify", "--model", SMALL, "-n", "1", "--shard", "2/2", "-o", out)
    assert res.exit_code == 0
    assert "crown: note: --shard 2/2: none of the 1 images 0..0 falls in this shard" in res.stderr
    assert read_rows(out) == []


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_merged_shards_equal_the_unsharded_run(tmp_path, fmt):
    args = ["--start", "2", "-n", "11", "--target", "random,runner-up", "--norm", "inf,1",
            "--format", fmt]
    whole = tmp_path / f"whole.{fmt}"
    assert certify(whole, *args).exit_code == 0
    parts = [tmp_path / f"part{k}.{fmt}" for k in (1, 2, 3)]
    for k, p in enumerate(parts, start=1):
        assert certify(p, *args, "--shard", f"{k}/3").exit_code == 0
    merged = tmp_path / f"merged.{fmt}"
    res = run("merge", parts[2], parts[0], parts[1], "-o", merged)  # any order of parts
    assert res.exit_code == 0, res.output
    assert f"merged 3 parts: 44 rows for 11 images -> {merged}" in res.stderr
    read = read_rows if fmt == "csv" else read_jsonl
    assert strip(read(merged)) == strip(read(whole))
    assert len(strip(read(parts[1]))) == 4 * 4  # images 3, 6, 9, 12 (round robin)
    side = sidecar(merged)
    assert side["rows"] == 44 and side["complete"] is True
    assert side["settings"] == sidecar(whole)["settings"]
    assert [os.path.basename(p["file"]) for p in side["coverage"]["merged_from"]] == \
        [f"part3.{fmt}", f"part1.{fmt}", f"part2.{fmt}"]


@pytest.fixture
def two_parts(tmp_path):
    for k in (1, 2):
        assert certify(tmp_path / f"p{k}.csv", "-n", "6", "--shard", f"{k}/2").exit_code == 0
    return tmp_path


def _merge_error(*args):
    res = run("merge", *args)
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("crown: error: ")
    return lines[0][len("crown: error: "):]


def test_merge_refuses_overlap(two_parts):
    t = two_parts
    shutil.copy(t / "p1.csv", t / "again.csv")
    shutil.copy(t / "p1.csv.json", t / "again.csv.json")
    msg = _merge_error(t / "p1.csv", t / "p2.csv", t / "again.csv", "-o", t / "m.csv")
    assert msg == (f"{t / 'again.csv'}: row (image, target_type, target, norm, method) = "
                   f"('0', 'runner-up', '3', 'inf', 'crown') is also in {t / 'p1.csv'}; "
                   "parts must not overlap")
    assert not (t / "m.csv").exists()


def test_merge_refuses_other_settings_or_model(two_parts):
    t = two_parts
    assert certify(t / "q.csv", "-n", "6", "--shard", "2/2", "--rtol", "1e-3").exit_code == 0
    msg = _merge_error(t / "p1.csv", t / "q.csv", "-o", t / "m.csv")
    assert msg == f"{t / 'q.csv'}: made with other settings than {t / 'p1.csv'}: --rtol 0.0001 vs 0.001"
    assert certify(t / "o.csv", "-n", "6", "--shard", "2/2", model=model_path("mnist_3x20.h5")).exit_code == 0
    assert "made with other settings than" in _merge_error(t / "p1.csv", t / "o.csv", "-o", t / "m.csv")
    assert "model SHA-256" in _merge_error(t / "p1.csv", t / "o.csv", "-o", t / "m.csv")


def test_merge_refuses_incomplete_or_edited_parts(two_parts):
    t = two_parts
    side = sidecar(t / "p2.csv")
    side["complete"] = False
    (t / "p2.csv.json").write_text(json.dumps(side))
    assert _merge_error(t / "p1.csv", t / "p2.csv", "-o", t / "m.csv") == (
        f"{t / 'p2.csv'}: the run that wrote it did not finish; complete it with crown certify "
        "--resume first")
    text = (t / "p1.csv").read_text().splitlines()
    (t / "p1.csv").write_text("\n".join(text[:-1]) + "\n")
    assert _merge_error(t / "p1.csv", "-o", t / "m.csv") == (
        f"{t / 'p1.csv'}: holds 2 rows but its sidecar records 3; the file was changed after the run")
    os.remove(t / "p1.csv.json")
    assert "no provenance sidecar" in _merge_error(t / "p1.csv", "-o", t / "m.csv")


def test_merge_warns_about_missing_shards_and_keeps_existing_output(two_parts):
    t = two_parts
    (t / "m.csv").write_text("precious\n")
    assert "m.csv: output file exists" in _merge_error(t / "p1.csv", "-o", t / "m.csv")
    assert (t / "m.csv").read_text() == "precious\n"
    res = run("merge", t / "p1.csv", "-o", t / "m.csv", "--overwrite")
    assert res.exit_code == 0
    assert "crown: warning: shards 2/2 are not among the parts" in res.stderr
    with open(str(t / "m.csv") + ".json") as fh:  # the sidecar records the gap too
        cov = json.load(fh)["coverage"]
    assert cov["shards_missing"] == "shards 2/2 are not among the parts"
    assert run("merge", t / "p1.csv", t / "p2.csv", "-o", t / "m.csv", "--overwrite").exit_code == 0
    with open(str(t / "m.csv") + ".json") as fh:
        assert "shards_missing" not in json.load(fh)["coverage"]


# ----------------------------------------------------------------------------- formats, provenance


def test_jsonl_rows_hold_the_csv_values_exactly(tmp_path):
    args = ["-n", "5", "--target", "runner-up,untargeted", "--norm", "2"]
    assert certify(tmp_path / "r.csv", *args).exit_code == 0
    assert certify(tmp_path / "r.jsonl", *args, "--format", "jsonl").exit_code == 0
    csv_rows, json_rows = read_rows(tmp_path / "r.csv"), read_jsonl(tmp_path / "r.jsonl")
    assert len(json_rows) == len(csv_rows) == 10
    for c, j in zip(csv_rows, json_rows):
        assert list(j) == list(COLUMNS)
        assert isinstance(j["image"], int) and j["norm"] == "2"
        if j["target_type"] == "untargeted":
            assert j["target"] is None and c["target"] == ""
        if j["status"] == "certified":
            assert isinstance(j["eps"], float) and j["eps"] == float(c["eps"]) and repr(j["eps"]) == c["eps"]
        else:
            assert j["eps"] is None and c["eps"] == ""


def test_provenance_sidecar(tmp_path):
    out = tmp_path / "r.csv"
    assert certify(out, "-n", "4", "--shard", "2/2", "--target-seed", "7",
                   "--kernels", "numba").exit_code == 0
    side = sidecar(out)
    sha = hashlib.sha256(open(SMALL, "rb").read()).hexdigest()
    assert side["model"] == {"path": os.path.abspath(SMALL), "sha256": sha}
    assert side["settings"]["model SHA-256"] == sha and side["settings"]["--target-seed"] == 7
    assert side["coverage"]["options"] == {"--start": 0, "--num-images": 4, "--shard": "2/2"}
    assert (side["coverage"]["first_image"], side["coverage"]["last_image"]) == (1, 3)
    assert side["rows"] == 2 and side["complete"] is True and side["failed_rows"] == 0
    assert side["options"]["--output"] == str(out) and side["options"]["--quiet"] is True
    (r,) = side["runs"]
    assert r["started"] <= r["ended"] and r["rows_written"] == 2
    assert r["versions"]["numpy"] == np.__version__ and r["versions"]["crown_cli"]
    assert {"numba", "scipy", "python"} <= set(r["versions"])
    assert r["kernels"] == "numba" and "--kernels" not in side["settings"]
    assert isinstance(r["threads"]["numba"], int) and r["threads"]["numba"] >= 1
    assert not list(tmp_path.glob("*.tmp*"))  # atomic writes leave no temporaries


def test_resume_with_other_kernels_is_accepted_and_recorded(tmp_path):
    out = tmp_path / "r.csv"
    assert certify(out, "-n", "4", "--kernels", "numpy").exit_code == 0
    full = read_rows(str(out))
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:3]))  # as if killed after 2 rows
    res = certify(out, "-n", "4", "--kernels", "numba", "--resume")
    assert res.exit_code == 0, res.output
    rows = read_rows(str(out))
    assert keys(rows) == keys(full)
    for r, f in zip(rows, full):  # the same radii within the search tolerance
        assert float(r["eps"]) == pytest.approx(float(f["eps"]), rel=float(f["rtol"]))
    side = sidecar(out)
    assert [r["kernels"] for r in side["runs"]] == ["numpy", "numba"]
    assert side["options"]["--kernels"] == "numba" and "--kernels" not in side["settings"]


def test_stdout_output_has_no_sidecar(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = run("certify", "--model", SMALL, "-n", "2", "--format", "jsonl", "-q")
    assert res.exit_code == 0
    assert [json.loads(line)["image"] for line in res.stdout.splitlines()] == [0, 1]
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- failed rows, exit 3


def test_a_row_that_raises_gets_status_error_and_exit_3(tmp_path, monkeypatch):
    real = Certifier.certify

    def flaky(self, x0, c, targets):
        if self.norm == "2" and c == 1:  # image 2 is a correctly classified "1"
            raise FloatingPointError("boom")
        return real(self, x0, c, targets)

    monkeypatch.setattr(Certifier, "certify", flaky)
    out = tmp_path / "r.csv"
    res = run("certify", "--model", SMALL, "-n", "4", "--norm", "inf,2", "-o", out)
    assert res.exit_code == 3
    assert ("crown: row failed: image 2, target runner-up 2, norm 2, method crown: "
            "FloatingPointError: boom") in res.stderr
    assert "1 rows FAILED (status error)" in res.stderr and "timed out" not in res.stderr
    rows = read_rows(out)
    assert len(rows) == 8
    assert [(r["image"], r["norm"]) for r in rows if r["status"] == "error"] == [("2", "2")]
    assert all(r["eps"] for r in rows if r["status"] != "error")
    assert sidecar(out)["failed_rows"] == 1 and sidecar(out)["complete"] is True
    monkeypatch.setattr(Certifier, "certify", real)
    again = run("certify", "--model", SMALL, "-n", "4", "--norm", "inf,2", "-o", out, "--resume")
    assert again.exit_code == 3  # the file still holds a failed row


def test_a_timeout_row_counts_as_failed(tmp_path, monkeypatch):
    def slow(self, x0, c, targets):
        return Certificate(0.0, -1.0, 1.0, 3, "timeout", 0.5)

    monkeypatch.setattr(Certifier, "certify", slow)
    res = run("certify", "--model", SMALL, "-n", "2", "-o", tmp_path / "r.csv", "-q")
    assert res.exit_code == 3 and res.output == ""
    assert [r["status"] for r in read_rows(tmp_path / "r.csv")] == ["timeout", "timeout"]


def test_resume_refuses_a_malformed_file_and_leaves_it_alone(tmp_path):
    out = tmp_path / "r.csv"
    assert certify(out, "-n", "4").exit_code == 0
    lines = out.read_text().splitlines(keepends=True)
    lines[2] = "3,oops\n"
    out.write_text("".join(lines) + "4,7,7,3,runn")  # and a partial last line
    before = out.read_bytes()
    side_before = (tmp_path / "r.csv.json").read_bytes()
    res = run("certify", "--model", SMALL, "-n", "4", "-o", out, "--resume")
    assert res.exit_code == 2
    assert res.output == f"crown: error: {out}: line 3 is malformed (expected {len(COLUMNS)} fields)\n"
    assert out.read_bytes() == before and (tmp_path / "r.csv.json").read_bytes() == side_before
