# SPDX-License-Identifier: MIT
"""Fixtures: archives built with this build's ulpack CLI (env ULPACK), read
through the package over its libulpack.so (env ULPACK_LIB)."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
ULPACK = os.environ.get("ULPACK") or os.path.join(TOP, "build", "ulpack")
TORCH_RUN = os.path.join(TOP, "tests", "data", "torch", "run")


def ulpack(*args, **kw):
    return subprocess.run([ULPACK, *map(str, args)], check=True, stdout=subprocess.PIPE, **kw).stdout


@pytest.fixture(scope="session")
def src(tmp_path_factory):
    """A synthetic run of 4 steps (bf16 safetensors, several chunks in its
    largest tensors) and the torch.save run of tests/data."""
    d = tmp_path_factory.mktemp("src")
    ulpack("synth", d / "run", "--steps", "4", "--dim", "256")
    shutil.copytree(TORCH_RUN, d / "trun")
    return d


@pytest.fixture(scope="session")
def archive_dir(src, tmp_path_factory):
    a = tmp_path_factory.mktemp("arch") / "a"
    ulpack("init", a)
    ulpack("import", a, src / "run", "--prefix", "run")
    ulpack("import", a, src / "trun", "--prefix", "trun")
    return a


@pytest.fixture
def ar(archive_dir):
    import ulpack as u
    a = u.open_archive(archive_dir)
    yield a
    a.close()


def have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False
