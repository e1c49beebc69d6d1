"""A closed stdout pipe (`crown ... | head -1`) ends the command quietly: no message, no
traceback, no "Exception ignored" at interpreter exit; exit code 141 (128 + SIGPIPE)."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, model_path

ACASXU = os.path.join(ROOT, "tests", "fixtures", "ACASXU_run2a_1_1_batch_2000.onnx")


def _start(args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "crown_cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_certify_to_a_pipe_closed_after_one_line():
    # ~900 rows, more than a pipe buffer holds: the writer must still be writing when the
    # reader goes away, whatever the timing
    proc = _start(["certify", "--model", model_path("mnist_2x20.h5"), "--norm", "inf,2,1",
                   "--target", "runner-up,least,random", "-q", "-o", "-"])
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=300)
    assert first.startswith(b"image,label,predicted,target")
    assert err == ""
    assert rc == 141


@pytest.mark.parametrize("args,codes", [
    (["inspect", "--model", ACASXU], (141,)),
    (["--help"], (1, 141)),  # click's own output: click ends a broken pipe with code 1
])
def test_inspect_to_a_pipe_closed_before_it_writes(args, codes):
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the command starts
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "crown_cli", *args], cwd=ROOT, env=env,
                          stdout=w, stderr=subprocess.PIPE, timeout=120)
    os.close(w)
    assert proc.stderr.decode() == ""
    assert proc.returncode in codes
