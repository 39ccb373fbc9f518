"""The set-up promises: tools/preflight.py refuses exactly the Pythons constraints.txt was not checked
on, with a message a newcomer can act on; pyproject.toml, environment.yml and the README state that same
range; constraints.txt is complete for the Python running the suite (make installs it with --no-deps).

The full install on Debian's stock python3 is too slow for the suite; .ci/run does it once.
"""

import importlib.util
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PREFLIGHT = ROOT / "tools" / "preflight.py"
# Interpreters a newcomer may have: Debian's stock one, and pyenv's of several minors where present.
CANDIDATE_PYTHONS = [Path("/usr/bin/python3"), *sorted(Path("/root/.pyenv/versions").glob("3.*/bin/python3"))]


def load_preflight():
    spec = importlib.util.spec_from_file_location("preflight", PREFLIGHT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


preflight = load_preflight()
SUPPORTED = preflight.supported_versions()


def minor_of(python: Path) -> tuple[int, int]:
    """The interpreter's own (major, minor), asked of it, not of the preflight."""
    out = subprocess.run(
        [str(python), "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True, timeout=60
    )
    major, minor = out.stdout.split()
    return int(major), int(minor)


def pinned() -> dict[str, Requirement]:
    """constraints.txt's pins that apply to the running Python (their markers evaluated), by canonical name."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate():
                pins[canonicalize_name(requirement.name)] = requirement
    return pins


def test_supported_versions_are_consecutive_minors():
    # A range such as requires-python can only state consecutive minors.
    assert [(3, SUPPORTED[0][1] + i) for i in range(len(SUPPORTED))] == SUPPORTED


@pytest.mark.parametrize("python", [p for p in CANDIDATE_PYTHONS if p.exists()] or [Path(sys.executable)], ids=str)
def test_preflight_accepts_exactly_the_supported_minors(python):
    found = minor_of(python)
    if found < (3, 6):
        pytest.skip("the preflight promises a message from Python 3.6 on")
    run = subprocess.run([str(python), str(PREFLIGHT)], capture_output=True, text=True, timeout=60)
    if found in SUPPORTED:
        assert run.returncode == 0, run.stderr
        assert "is supported" in run.stdout
    else:
        assert run.returncode == 1
        message = run.stderr
        assert f"Python {found[0]}.{found[1]}." in message
        assert "Supported: Python " + ", ".join(f"{a}.{b}" for a, b in SUPPORTED) in message
        for remedy in ("make install PYTHON=python3.", "pyenv install", "environment.yml"):
            assert remedy in message


def test_version_problem_is_decided_by_the_minor_alone():
    # Debian 12's 3.11.2 is in: the pins were chosen for 3.11.0 on (soupsieve 4 needs 3.11.5).
    assert preflight.version_problem((3, 11, 2), SUPPORTED) is None
    below = (SUPPORTED[0][0], SUPPORTED[0][1] - 1, 13)
    above = (SUPPORTED[-1][0], SUPPORTED[-1][1] + 1, 0)
    for version in (below, above):
        assert f"Python {version[0]}.{version[1]}.{version[2]} " in preflight.version_problem(version, SUPPORTED)


def test_a_python_without_ensurepip_is_told_to_install_the_venv_package(monkeypatch):
    # Debian and Ubuntu ship venv's ensurepip in pythonX.Y-venv; None in sys.modules makes the import fail.
    monkeypatch.setattr(sys, "prefix", sys.base_prefix)
    monkeypatch.setitem(sys.modules, "ensurepip", None)
    message = preflight.venv_problem()
    assert "venv/ensurepip" in message
    assert f"apt install python{sys.version_info[0]}.{sys.version_info[1]}-venv" in message


def test_requires_python_environment_yml_and_readme_state_the_supported_range():
    requires = re.search(r'^requires-python = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    spec = SpecifierSet(requires.group(1))
    first, last = SUPPORTED[0], SUPPORTED[-1]
    for major, minor in [*SUPPORTED, (first[0], first[1] - 1), (last[0], last[1] + 1)]:
        for micro in (0, 99):
            assert (Version(f"{major}.{minor}.{micro}") in spec) == ((major, minor) in SUPPORTED), spec
    conda_python = re.search(r"^\s*-\s*python\s*([<>=!,.\d\s]+)$", (ROOT / "environment.yml").read_text(), re.M)
    assert conda_python and SpecifierSet(conda_python.group(1).replace(" ", "")) == spec
    names = [f"{major}.{minor}" for major, minor in SUPPORTED]
    assert f"Python **{', '.join(names[:-1])} or {names[-1]}**" in (ROOT / "README.md").read_text()


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def test_the_running_environment_holds_the_pinned_versions():
    # The suite runs in what make installed: a pin that is not what is installed was never verified.
    wrong = {
        name: (str(requirement.specifier), installed_version(name))
        for name, requirement in pinned().items()
        if installed_version(name) is None
        or not requirement.specifier.contains(installed_version(name), prereleases=True)
    }
    assert not wrong


def test_constraints_list_every_dependency_of_the_project_and_torch():
    # make installs constraints.txt with --no-deps: whatever is missing here would be missing there.
    # Walks the installed metadata from the project with its dev extra, each package with the extras asked of it.
    pins = pinned()
    queue, seen, missing = [("hyper-parallel-workbook", {"dev"})], set(), set()
    while queue:
        parent, extras = queue.pop()
        for line in metadata.requires(parent) or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker and not any(marker.evaluate({"extra": extra}) for extra in extras | {""}):
                continue
            name = canonicalize_name(requirement.name)
            key = (name, frozenset(requirement.extras))
            if key in seen:
                continue
            seen.add(key)
            if name != "torch" and name not in pins:
                missing.add(f"{name} (needed by {parent})")
            elif installed_version(name) is not None:
                queue.append((name, set(requirement.extras)))
    assert len(seen) > len(pins) / 2  # the walk reached the dependency tree, not just the first level
    assert not missing
