"""ptxas resource report (registers, spills, shared memory) of kernel variants, without a GPU.

    python scripts/ptxas_report.py                          # the deepseek-v4-flash kernel variants
    python scripts/ptxas_report.py compress:ratio=4,head_dim=512,store=v4 store:head_dim=128,fmt=idx_fp8
    python scripts/ptxas_report.py -D FC_DECODE_WAVES=2     # extra -D flags (A/B knobs)

Renders each variant's kernel TU exactly as the JIT does (templates/, jit_kernel/), compiles it to
a cubin for sm_90a with ``-Xptxas -v`` and prints one line per kernel: registers, stack frame,
spill stores/loads, static shared memory. Needs nvcc (``CUDA_HOME`` or ``/usr/local/cuda``); the
same flags as the JIT build. Nothing is cached or loaded.
"""

from __future__ import annotations

import argparse
import os
import re
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


def _demangle(names: list[str]) -> dict[str, str]:
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return dict(zip(names, out.splitlines()))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


def report(spec: str, defines: list[str], nvcc: str) -> list[str]:
    family, params = fam.parse_spec(spec)
    f = fam.get_family(family)
    rows = f.expand(params) if len(params) < len(f.space) else [params]
    lines: list[str] = []
    for p in rows:
        key = f.key("cuda:9.0a", **p)
        kernel = [text for name, text in render_sources(key, f).items() if name.endswith(".cu")][0]
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "kernel.cu"
            src.write_text(kernel)
            cmd = [nvcc, *BASE_CUDA_FLAGS, *target_flags(key.target), *f.cuda_flags, *(f"-D{d}" for d in defines),
                   f"-I{kernel_include_dir()}", "-cubin", "-Xptxas", "-v", "-o", str(Path(tmp) / "k.cubin"), str(src)]
            res = subprocess.run(cmd, capture_output=True, text=True)
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
        names = _demangle(list(per))
        lines.append(key.describe())
        for mangled, d in per.items():
            if "regs" not in d and "sst" not in d:
                continue
            short = re.sub(r"flashcompress::|\(flashcompress::\w+\)|compress::", "", names[mangled])[:150]
            lines.append(f"  {d.get('regs', '-'):>4} regs  frame {d.get('frame', '0'):>4}  spill {d.get('sst', '0')}/{d.get('sld', '0')}"
                         f"  smem {d.get('smem', '0'):>6}  {short}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("specs", nargs="*", help="family:key=value,... (default: the deepseek-v4-flash kernels)")
    ap.add_argument("-D", dest="defines", action="append", default=[], help="extra preprocessor definition")
    args = ap.parse_args(argv)
    nvcc = str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
    specs = args.specs or ["store:dtype=f32", "compress:in_dtype=f32,state_dtype=f32,out_dtype=f32"]
    for spec in specs:
        family, params = fam.parse_spec(spec)
        if not params and family == "compress":
            spec = "compress:in_dtype=f32,state_dtype=f32,out_dtype=f32"
        for line in report(spec, args.defines, nvcc):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
