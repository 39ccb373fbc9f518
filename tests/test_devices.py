"""Nothing in the library assumes the CPU (users have GPUs; this machine and CI do not).

* A grep: no module of ``hyper_parallel`` but ``devices`` writes a device or backend name as a string literal
  or calls ``.cpu()`` / ``.cuda()``, except to branch on a device it was given (``x.device.type == "cpu"``)
  and the few choices listed in ``ALLOWED`` with their reason.
* Every recipe that runs on one rank is built and trained while torch's default device is ``meta``
  (tests/workers/device_cases.py): an allocation without a device lands there instead of on the run's device,
  as on a GPU it would land on the CPU, and the run fails or shows it.
* The device choice itself, with torch told there is a GPU.
"""

from __future__ import annotations

import io
import json
import tokenize
from pathlib import Path

import pytest

from hyper_parallel import devices
from launch.processes.supervisor import torchrun

PACKAGE = Path(__file__).resolve().parents[1] / "hyper_parallel"
DEVICE_NAMES = {"cpu", "cuda", "nccl", "gloo"}
COMPARISONS = ("==", "!=")
ALLOWED = {
    # fully_shard's default mesh and device, the same choice as devices.default_device_type / device_of;
    # hyper_parallel/fsdp belongs to another branch of work, which may route them through devices
    ("fsdp/api.py", 'device = "cuda" if torch.cuda.is_available() else "cpu"'),
}


def device_literals(source: str, relative: str) -> list[tuple[int, str]]:
    """(line number, line) of each device name written as a string or a ``.cpu()`` / ``.cuda()`` call in
    ``source`` (the module at ``relative`` inside the package)."""
    lines = source.splitlines()
    found = []
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for index, token in enumerate(tokens):
        text = token.string
        literal = token.type == tokenize.STRING and text.strip("\"'") in DEVICE_NAMES and not text.startswith('"""')
        method = (
            token.type == tokenize.NAME
            and text in ("cpu", "cuda")
            and index > 0
            and tokens[index - 1].string == "."
            and index + 1 < len(tokens)
            and tokens[index + 1].string == "("
        )
        if literal or method:
            line = lines[token.start[0] - 1]
            if literal and any(op in line for op in COMPARISONS):
                continue  # branching on a device the code was given
            if (relative, line.strip()) in ALLOWED:
                continue
            found.append((token.start[0], line.strip()))
    return found


def test_no_module_but_devices_names_a_device():
    offending = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(PACKAGE))
        if path.name != "devices.py" and (hits := device_literals(path.read_text(), relative)):
            offending[relative] = hits
    assert not offending, offending


def test_the_grep_sees_a_hard_coded_device():
    sample = 'import torch\nx = torch.zeros(2, device="cpu")\ny = x.cuda()\nok = x.device.type == "cpu"\n"""cpu"""\n'
    assert [line for line, _ in device_literals(sample, "sample.py")] == [2, 3]


def test_device_choice_follows_what_torch_sees(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert (devices.default_device_type(), devices.backend_for(devices.default_device_type())) == ("cpu", "gloo")
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert (devices.default_device_type(), devices.backend_for(devices.default_device_type())) == ("cuda", "nccl")
    with pytest.raises(ValueError, match="no backend known"):
        devices.backend_for("tpu")


@pytest.mark.distributed
def test_recipes_put_every_tensor_on_the_run_device(tmp_path):
    result = torchrun("tests/workers/device_cases.py", 1, timeout=900, run_dir=tmp_path)
    assert result.ok, result.error
    cases = json.loads((tmp_path / "device_rank0.json").read_text())
    assert len(cases) >= 10, sorted(cases)  # the A, B and C tiers run on one rank
    for name, case in cases.items():
        assert "error" not in case, (name, case.get("error"))
        assert case["ok"] and case["devices"] == [case["run_device"]], (name, case)
