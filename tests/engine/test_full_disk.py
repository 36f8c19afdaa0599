"""A full disk says so (issue 29 item 6): a real ``python -m engine train`` whose run directory is on a
4 MB file system (a tmpfs mounted in a private mount namespace with ``unshare``, so nothing outside
the test sees it) fails at its first checkpoint with "no space left on device" and the checkpoint's
path, and leaves no temporary checkpoint behind. Before, it failed with torch's ``RuntimeError:
[enforce fail at inline_container.cc:672] . unexpected pos …`` and left the partial ``.tmp-*``
directory filling the disk."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT
from tests.helpers import tiny_run_config


def test_a_full_disk_at_a_checkpoint_names_itself_and_cleans_up(tmp_path):
    if shutil.which("unshare") is None:
        pytest.fail("this test needs util-linux's `unshare` (apt-get install util-linux)")
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {tmp_path}"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.fail(
            "this test mounts a small tmpfs in a private user and mount namespace; this kernel refuses "
            f"(`unshare -rm mount -t tmpfs`: {probe.stderr.decode().strip()}); enable unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1) or run as root"
        )
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(tiny_run_config(3, "full-disk", save_every=1)))
    disk = tmp_path / "disk"
    disk.mkdir()
    run_dir = disk / "run"
    train = [
        sys.executable,
        "-m",
        "engine",
        "train",
        str(cfg),
        "--quiet",
        "--set",
        f"train.output_dir={run_dir}",
    ]
    script = (
        f"mount -t tmpfs -o size=4m tmpfs {disk} || exit 90; "
        f'"$@"; echo "exit=$?"; echo "left:"; ls -a {run_dir}/checkpoints; df -k {disk} | tail -1'
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", *train],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    report = out.stdout + out.stderr
    assert "exit=0" not in out.stdout and "exit=" in out.stdout, report[-3000:]
    assert "no space left on device" in out.stderr, report[-3000:]
    assert f"{run_dir}/checkpoints/rl-000001" in out.stderr  # the path it could not write
    assert "unexpected pos" not in out.stderr.splitlines()[-1]
    left = out.stdout.split("left:", 1)[1].split()
    assert not [name for name in left if name.startswith(".tmp-")], left  # no partial checkpoint
