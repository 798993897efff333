# Scratch (fa2perf): prints the instructions of a cubin (cuobjdump -sass) with branch labels
# renumbered by first appearance, so two builds of the same code compare equal.
import re, subprocess, sys
DIS = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/nvidia/cu13/bin/cuobjdump"
text = subprocess.run([DIS, "-sass", sys.argv[1]], capture_output=True, text=True, check=True).stdout
names = {}
def rename(m):
    return names.setdefault(m.group(0), f".L{len(names)}")
for line in text.splitlines():
    if re.search(r"/\*[0-9a-f]{4,}\*/", line) or re.match(r"\s*\.L_x_\d+:", line):
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)
        print(re.sub(r"\.L_x_\d+", rename, line).strip())
