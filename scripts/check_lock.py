"""Fail if a package pinned in the lock file lacks a dependency (``pip check``, restricted).

Weight and data packages are installed ``--no-deps`` on purpose (we read their files and never
import them), so their unmet requirements are not errors; everything in the lock must be whole.
"""

import re
import subprocess
import sys

lock = sys.argv[1]
with open(lock) as f:
    pinned = {
        re.split(r"[=<>\[ ;]", line, maxsplit=1)[0].lower().replace("_", "-")
        for line in f
        if line[:1].isalnum()
    }
out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
bad = [
    line
    for line in out.stdout.splitlines()
    if line.split(" ", 1)[0].lower().replace("_", "-") in pinned
]
if bad:
    print("\n".join(bad), file=sys.stderr)
    print(f"setup: {lock} is incomplete; run make lock", file=sys.stderr)
    sys.exit(1)
