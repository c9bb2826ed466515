"""ptxas resource report (registers, spills, shared memory) of kernel variants, without a GPU.

    python scripts/ptxas_report.py                          # every fp32 store / compress variant
    python scripts/ptxas_report.py compress:ratio=4,head_dim=512,store=v4 store:head_dim=128,fmt=idx_fp8
    python scripts/ptxas_report.py -D NAME=VALUE            # extra -D flags (A/B of a header knob)

Renders each variant's kernel TU exactly as the JIT does (templates/, jit_kernel/), compiles it to
a cubin for sm_90a with ``-Xptxas -v`` and prints one line per kernel: registers, stack frame,
spill stores/loads, static shared memory. Needs nvcc (``CUDA_HOME`` or ``/usr/local/cuda``); the
same flags as the JIT build. Nothing is cached or loaded.

With ``--sass`` (needs ``nvdisasm``: on PATH, or ``NVDISASM=/path/to/nvdisasm``) each line also
gives the kernel's static SASS instruction count, its memory instructions (LDG / STG / LDS /
STS / LDGSTS) and ``hot``, the instructions on its common path (``hot_path``: slow-path blocks,
divergent-warp copies and repeated loop iterations left out), an estimate of what one warp of a
loop-free kernel executes (one row of the v41 c1 kernels, one row pair of the c2 prefill pool).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from flashcompress.jit import family as fam  # noqa: E402
from flashcompress.jit.flags import BASE_CUDA_FLAGS, target_flags  # noqa: E402
from flashcompress.jit.render import kernel_include_dir, render_sources  # noqa: E402

_LINE = re.compile(r"Compiling entry function '(?P<fn>[^']+)'|Function properties for (?P<fp>\S+)|"
                   r"(?P<frame>\d+) bytes stack frame, (?P<sst>\d+) bytes spill stores, (?P<sld>\d+) bytes spill loads|"
                   r"Used (?P<regs>\d+) registers(?:.*?(?P<smem>\d+) bytes smem)?")


def demangle(names: list[str]) -> dict[str, str]:
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return dict(zip(names, out.splitlines()))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


_INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?P<pred>@!?U?P\w+\s+)?(?P<op>[A-Z][A-Z0-9_.]*)(?P<rest>[^;]*);")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
_COLD_SKIP_MAX = 200  # a forward branch over at most this many instructions with a CALL / FCHK skips a slow path


def hot_path(items: list[tuple[str, str, bool, str]]) -> int:
    """Instructions on a function's common path (an estimate of what one warp executes): from the
    entry, straight on; unconditional branches followed; a conditional forward branch taken when it
    jumps over a short block holding a CALL or FCHK (a slow path: IEEE division, fp64 sqrt), else
    not; BRA.DIV (the divergent-warp copy of a shuffle sequence), predicated EXITs and backward
    branches (one loop iteration) not taken. `items`: ("L", label, _, _) or ("I", op, predicated, rest)."""
    labels = {v: i for i, (k, v, _, _) in enumerate(items) if k == "L"}
    i = n = 0
    while i < len(items) and n < 100000:
        kind, op, pred, rest = items[i]
        if kind == "L":
            i += 1
            continue
        n += 1
        if op.startswith(("EXIT", "RET")) and not pred:
            return n
        target = _TARGET.search(rest) if op.startswith("BRA") and not op.startswith("BRA.DIV") else None
        if target is None or target.group(1) not in labels:
            i += 1
            continue
        t = labels[target.group(1)]
        if not pred:
            i = t
            continue
        skipped = [o for k, o, _, _ in items[i + 1:t] if k == "I"]
        slow = t > i and len(skipped) <= _COLD_SKIP_MAX and any(o.startswith(("CALL", "FCHK")) for o in skipped)
        i = t if slow else i + 1
    return n


def _sass_counts(cubin: Path, nvdisasm: str) -> dict[str, tuple[int, int, int]]:
    """(static instructions, memory instructions, hot-path estimate) per mangled function of a cubin."""
    out = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    funcs: dict[str, list[tuple[str, str, bool, str]]] = {}
    cur = None
    for line in out.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        if cur is None:
            continue
        lab = _LABEL.match(line)
        if lab:
            funcs[cur].append(("L", lab.group(1), False, ""))
            continue
        m = _INSN.search(line)
        if m and m["op"] != "NOP":
            funcs[cur].append(("I", m["op"], m["pred"] is not None, m["rest"]))
    counts: dict[str, tuple[int, int, int]] = {}
    for name, items in funcs.items():
        ops = [op for k, op, _, _ in items if k == "I"]
        mem = sum(op.split(".")[0] in ("LDG", "STG", "LDS", "STS", "LDGSTS", "LD", "ST", "LDSM") for op in ops)
        counts[name] = (len(ops), mem, hot_path(items))
    return counts


def compile_tu(nvcc: str, f: "fam.Family", params: dict, out: Path, mode: list[str],
               defines: list[str] = (), target: str = "cuda:9.0a") -> subprocess.CompletedProcess:
    """Render a variant's kernel TU for `target` (default sm_90a) as the JIT does and compile it
    into `out` with `mode` (e.g. ["-cubin", "-Xptxas", "-v"] or ["-ptx"]); the finished nvcc process."""
    key = f.key(target, **params)
    kernel = [text for name, text in render_sources(key, f).items() if name.endswith(".cu")][0]
    src = out.with_suffix(".cu")
    src.write_text(kernel)
    cmd = [nvcc, *BASE_CUDA_FLAGS, *target_flags(key.target), *f.cuda_flags, *(f"-D{d}" for d in defines),
           f"-I{kernel_include_dir()}", *mode, "-o", str(out), str(src)]
    return subprocess.run(cmd, capture_output=True, text=True)


def report(spec: str, defines: list[str], nvcc: str, nvdisasm: str | None = None) -> list[str]:
    family, params = fam.parse_spec(spec)
    f = fam.get_family(family)
    rows = f.expand(params) if len(params) < len(f.space) else [params]
    lines: list[str] = []
    for p in rows:
        key = f.key("cuda:9.0a", **p)
        with tempfile.TemporaryDirectory() as tmp:
            cubin = Path(tmp) / "k.cubin"
            res = compile_tu(nvcc, f, p, cubin, ["-cubin", "-Xptxas", "-v"], defines)
            sass = _sass_counts(cubin, nvdisasm) if nvdisasm and res.returncode == 0 else {}
        if res.returncode != 0:
            errors = "\n".join(line for line in res.stderr.splitlines() if "error" in line)
            lines.append(f"{key.describe()}: build failed\n{errors[:3000]}")
            continue
        per: dict[str, dict[str, str]] = {}
        cur = None
        for line in res.stderr.splitlines():
            m = _LINE.search(line)
            if not m:
                continue
            if m["fn"] or m["fp"]:
                cur = m["fn"] or m["fp"]
                per.setdefault(cur, {})
            elif cur is not None:
                per[cur].update({k: v for k, v in m.groupdict().items() if v is not None and k not in ("fn", "fp")})
        names = demangle(list(per))
        lines.append(key.describe())
        for mangled, d in per.items():
            if "regs" not in d and "sst" not in d:
                continue
            short = re.sub(r"flashcompress::|\(flashcompress::\w+\)|compress::", "", names[mangled])[:150]
            n_sass = (f"  sass {sass[mangled][0]:>5} ({sass[mangled][1]:>4} mem, hot {sass[mangled][2]:>5})"
                      if mangled in sass else "")
            lines.append(f"  {d.get('regs', '-'):>4} regs  frame {d.get('frame', '0'):>4}  spill {d.get('sst', '0')}/{d.get('sld', '0')}"
                         f"  smem {d.get('smem', '0'):>6}{n_sass}  {short}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("specs", nargs="*", help="family:key=value,... (default: every fp32 store and compress variant, "
                                         "auto tiling)")
    ap.add_argument("-D", dest="defines", action="append", default=[], help="extra preprocessor definition")
    ap.add_argument("--sass", action="store_true", help="also count SASS instructions (needs nvdisasm)")
    args = ap.parse_args(argv)
    nvdisasm = None
    if args.sass:
        nvdisasm = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
        if not nvdisasm:
            ap.error("--sass needs nvdisasm on PATH or NVDISASM=/path/to/nvdisasm")
    nvcc = str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
    default_compress = "compress:in_dtype=f32,state_dtype=f32,out_dtype=f32,tiling=auto"
    specs = args.specs or ["store:dtype=f32", default_compress]
    for spec in specs:
        family, params = fam.parse_spec(spec)
        if not params and family == "compress":
            spec = default_compress
        for line in report(spec, args.defines, nvcc, nvdisasm):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
