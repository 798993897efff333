#!/usr/bin/env python3
"""The loops of a cubin's SASS that hold an opcode, with their sizes and opcode mix (no GPU needed).

A loop is a backward branch and what lies between its target and it; ptxas's `@!PT LDS`
placeholders (never executed, put before LDGSTS) are not counted. perf-notes quotes these counts:
instructions a gather pass (LDGSTS), a fa2 key loop, an fa3 consumer's key loop (HGMMA).

  bench/sass_loops.py CUBIN [OPCODE (default HGMMA)] [--most N] [--mix]
"""
import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys


def find_cuobjdump():
    """The toolkit's cuobjdump, else PyPI's nvidia-cuda-cuobjdump (scripts/setup.sh installs it)."""
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "bin", "cuobjdump")):
            return os.path.join(root, "bin", "cuobjdump")
    if shutil.which("cuobjdump"):
        return shutil.which("cuobjdump")
    try:
        import nvidia.cu13  # noqa: F401 (PyPI wheel)
        for path in nvidia.cu13.__path__:
            found = glob.glob(os.path.join(path, "bin", "cuobjdump"))
            if found:
                return found[0]
    except ImportError:
        pass
    sys.exit("sass_loops: cuobjdump not found (CUDA toolkit bin/ or PyPI nvidia-cuda-cuobjdump)")


def instructions(cubin):
    sass = subprocess.run([find_cuobjdump(), "-sass", cubin], capture_output=True, text=True, check=True).stdout
    out = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def loops_holding(program, opcode):
    at = {address: i for i, (address, _) in enumerate(program)}
    found = {}
    for end, (address, text) in enumerate(program):
        m = re.search(r"BRA (?:\S+ )?0x([0-9a-f]+)", text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= address or target not in at:
            continue
        body = [t for _, t in program[at[target]:end + 1] if not t.startswith("@!PT LDS")]
        if any(opcode in t for t in body):
            found[(target, address)] = body
    return sorted(found.items(), key=lambda item: len(item[1]))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cubin")
    parser.add_argument("opcode", nargs="?", default="HGMMA")
    parser.add_argument("--most", type=int, default=4, help="loops to list, innermost first")
    parser.add_argument("--mix", action="store_true", help="each loop's opcode histogram")
    args = parser.parse_args()
    for (start, end), body in loops_holding(instructions(args.cubin), args.opcode)[: args.most]:
        count = sum(args.opcode in t for t in body)
        print(f"loop 0x{start:x}-0x{end:x}: {len(body)} instructions, {count} {args.opcode}")
        if args.mix:
            mix = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body)
            print("   ", ", ".join(f"{op} {n}" for op, n in mix.most_common()))


if __name__ == "__main__":
    main()
