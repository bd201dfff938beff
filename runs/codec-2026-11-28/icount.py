"""Instructions per call of each statement, in processes of their own run in parallel: callgrind
collecting only inside functools.reduce, which calls the statement N times; less a bare run's.
usage: icount.py SETUPFILE N STMT..."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

setup, n, stmts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
py = sys.executable


def start(stmt: str) -> tuple[subprocess.Popen[bytes], str]:
    out = tempfile.mktemp(prefix="cg.", dir="/tmp/codec")
    code = (
        f"exec(open({setup!r}).read())\nimport functools\n"
        f"functools.reduce(lambda a, _: ({stmt}, a)[1], range({n}), None)\n"
    )
    p = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=functools_reduce",
            f"--callgrind-out-file={out}",
            py,
            "-c",
            code,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return p, out


def total(p: subprocess.Popen[bytes], out: str) -> tuple[int | None, str]:
    _, err = p.communicate()
    if p.returncode:
        return None, err.decode()[-500:]
    lines = Path(out).read_text().splitlines()
    t = next(int(line.split()[1]) for line in lines if line.startswith("totals:"))
    os.unlink(out)
    return t, ""


runs = [start("None")] + [start(s) for s in stmts]
base, _ = total(*runs[0])
assert base is not None, "the empty run failed"
for stmt, run in zip(stmts, runs[1:], strict=True):
    t, err = total(*run)
    print(
        f"{(t - base) / n:10.0f}  {stmt}" if t is not None else f"FAILED {stmt}: {err}", flush=True
    )
