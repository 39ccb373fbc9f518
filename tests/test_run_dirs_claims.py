"""Run folders are claimed before anything in them is deleted or written, and scratch is private.

* A second launch into a folder another launch holds fails at once (``RunDirError``) and the first
  run's files are byte for byte what they were, on the pool path and the fresh-launch path alike.
* The scratch root is refused when it is not a private directory of this user (another owner, group
  or world writable, a symlink), with the folder named in the error.
"""

from __future__ import annotations

import os
import stat

import pytest

import launch
from launch.processes.run_dirs import RunDirError, claimed, new_scratch_dir, scratch_root

OTHER_UID = 65534  # nobody


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != ".launch.lock"}


@pytest.mark.distributed
@pytest.mark.parametrize("pool", [True, False])
def test_a_second_launch_into_a_claimed_folder_fails_and_leaves_the_first_runs_files(tmp_path, pool):
    out = tmp_path / "m4"
    first = launch.run("M4", world_size=2, dp_shard=2, steps=1, out=out, pool=pool)
    assert first.ok, first.error
    before = _files(out)
    assert {"metrics.json", "summary.json", "trace_rank0.json", "trace_rank1.json"} <= set(before)
    with claimed(out), pytest.raises(RunDirError, match="being written by another launch"):  # the first, running
        launch.run("M4", world_size=2, dp_shard=2, steps=2, out=out, pool=pool)
    assert _files(out) == before


@pytest.fixture
def scratch_env(tmp_path, monkeypatch):
    root = tmp_path / "scratch"
    monkeypatch.setenv("HYPER_PARALLEL_SCRATCH", str(root))
    return root


def test_a_fresh_scratch_root_is_private(scratch_env):
    directory = new_scratch_dir("hp-run-")
    assert directory.parent == scratch_env
    mode = stat.S_IMODE(os.stat(scratch_env).st_mode)
    assert mode & 0o077 == 0, oct(mode)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_a_group_or_world_writable_scratch_root_is_refused(scratch_env, mode):
    scratch_env.mkdir()
    os.chmod(scratch_env, mode)
    with pytest.raises(RunDirError, match=f"{scratch_env}.*writable by"):
        scratch_root()


@pytest.mark.skipif(os.getuid() != 0, reason="making a folder owned by another uid needs root")
def test_a_scratch_root_owned_by_another_user_is_refused(scratch_env):
    scratch_env.mkdir(mode=0o700)
    os.chown(scratch_env, OTHER_UID, OTHER_UID)
    with pytest.raises(RunDirError, match=f"owned by uid {OTHER_UID}"):
        new_scratch_dir("hp-run-")


def test_a_symlinked_scratch_root_is_refused(scratch_env, tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    scratch_env.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RunDirError, match="symbolic link"):
        scratch_root()
