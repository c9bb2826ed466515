"""ptxas resource report (registers, spills, shared memory) of kernel variants, without a GPU.

    python scripts/ptxas_report.py                          # every fp32 store / compress variant
    python scripts/ptxas_report.py compress:ratio=4,head_dim=512,store=v4 store:head_dim=128,fmt=idx_fp8
    python scripts/ptxas_report.py -D NAME=VALUE            # extra -D flags (A/B of a header knob)

Renders each variant's kernel TU exactly as the JIT does (templates/, jit_kernel/), compiles it to
a cubin for sm_90a with ``-Xptxas -v`` and prints one line per kernel: registers, stack frame,
spill stores/loads, static shared memory. Needs nvcc (``CUDA_HOME`` or ``/usr/local/cuda``); the
same flags as the JIT build. Nothing is cached or loaded.

With ``--sass`` (needs ``nvdisasm``: on PATH, or ``NVDISASM=/path/to/nvdisasm``) each line also
gives the kernel's static SASS instruction count and its memory instructions (LDG / STG / LDS /
STS / LDGSTS): a proxy for the work per row of the unrolled pooling loops.
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


def _sass_counts(cubin: Path, nvdisasm: str) -> dict[str, tuple[int, int]]:
    """Static (instructions, memory instructions) per mangled function of a cubin."""
    out = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    counts: dict[str, list[int]] = {}
    cur = None
    for line in out.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            cur = m.group(1)
            counts[cur] = [0, 0]
            continue
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if cur is not None and m:
            op = m.group(1)
            if op == "NOP":
                continue
            counts[cur][0] += 1
            counts[cur][1] += op.split(".")[0] in ("LDG", "STG", "LDS", "STS", "LDGSTS", "LD", "ST", "LDSM")
    return {k: (v[0], v[1]) for k, v in counts.items()}


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
            n_sass = f"  sass {sass[mangled][0]:>5} ({sass[mangled][1]:>4} mem)" if mangled in sass else ""
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
