"""Refuse, in a second and before any download, a Python that `make install` cannot set up.

`make install` runs this with the interpreter that will create or fill `.venv`. It checks what the
install needs from that interpreter: a version that constraints.txt supports (its
``# supported-python:`` line, the versions whose pins were installed and checked) and the ``venv``
and ``ensurepip`` modules (Debian and Ubuntu ship them apart, in python3-venv). On a refusal it
names the version found, the versions supported and how to get one, and exits 1.

It must run on whatever ``python3`` a newcomer has, so it uses the standard library only and no
syntax newer than Python 3.6 (f-strings, but no annotations, no walrus, no ``from __future__``):
an old interpreter gets the message, not a SyntaxError.
"""

import os
import sys

CONSTRAINTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "constraints.txt")
SUPPORTED_MARK = "# supported-python:"


def supported_versions(constraints_path=CONSTRAINTS):
    """The (major, minor) pairs on the ``# supported-python:`` line of the constraints file, in order."""
    with open(constraints_path) as lines:
        for line in lines:
            if line.startswith(SUPPORTED_MARK):
                words = line[len(SUPPORTED_MARK) :].split()
                return [tuple(int(part) for part in word.split(".")) for word in words]
    raise RuntimeError(
        f"{constraints_path} has no '{SUPPORTED_MARK} 3.X ...' line: it names the Pythons its pins were checked on"
    )


def dotted(version):
    return ".".join(str(part) for part in version)


def how_to_get_one(supported):
    """The ways to point `make` at a supported Python, newest supported version as the example."""
    example = dotted(supported[-1])
    return [
        f"  make install PYTHON=python{example}   (or another supported pythonX.Y on PATH)",
        f'  pyenv install {example} && make install PYTHON="$(pyenv prefix {example})/bin/python"',
        "  conda env create -f environment.yml && conda activate hyper-parallel && make install PYTHON=python",
    ]


def version_problem(found, supported):
    """A message if the (major, minor, micro) ``found`` is not a supported minor version, else None."""
    if tuple(found[:2]) in supported:
        return None
    names = ", ".join(map(dotted, supported))
    lines = [
        f"Python {dotted(found[:3])} ({sys.executable}) cannot install this workbook.",
        f"Supported: Python {names} (the versions constraints.txt was checked on; pyproject.toml's requires-python).",
    ]
    if sys.prefix != getattr(sys, "base_prefix", sys.prefix):
        lines.append(f"This is the interpreter of the existing virtual environment {sys.prefix}: remove it first.")
    lines.append("Get a supported one and point make at it, e.g.:")
    return "\n".join(lines + how_to_get_one(supported))


def venv_problem():
    """A message if this interpreter cannot make a virtual environment with pip in it, else None."""
    inside_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    try:
        import venv  # noqa: F401

        if not inside_venv:
            import ensurepip

            ensurepip.version()
        else:
            import pip  # noqa: F401
    except Exception as error:
        module = "pip" if inside_venv else "venv/ensurepip"
        minor = dotted(sys.version_info[:2])
        return (
            f"Python {dotted(sys.version_info[:3])} ({sys.executable}) has no working {module}"
            f" ({type(error).__name__}: {error}).\n"
            f"Debian/Ubuntu: apt install python{minor}-venv; elsewhere use a python.org, pyenv or conda build."
        )
    return None


def main():
    supported = supported_versions()
    problem = version_problem(tuple(sys.version_info[:3]), supported) or venv_problem()
    if problem:
        sys.stderr.write("preflight: " + problem + "\n")
        return 1
    names = ", ".join(map(dotted, supported))
    print(
        f"preflight: Python {dotted(sys.version_info[:3])} ({sys.executable}) is supported ({names}); venv and pip are there."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
