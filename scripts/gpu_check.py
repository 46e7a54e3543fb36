#!/usr/bin/env python3
"""The device check (``recjudge.bench._gpu_check``) as a script that runs from a packed
folder on a bare CUDA machine without network (``scripts/pack_gpu_check.sh`` makes it):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site wheels/*.whl
    PYTHONPATH=/tmp/site python3 scripts/gpu_check.py --out out

It builds Qwen2.5-1.5B's architecture with random weights on the GPU, reads the Qwen2.5
tokenizer from ``tokenizer/`` beside ``scripts/`` (or ``--tokenizer``), checks the engine
against naive ``generate()`` and prints judgments per second as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # the packed recjudge sources (a checkout's too)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default=None, help="folder with the Qwen2.5 tokenizer")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--users", type=int, default=10)
    ap.add_argument("--candidates", type=int, default=20)
    ap.add_argument("--history", type=int, default=50)
    ap.add_argument("--naive-users", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--layers", type=int, default=None, help="fewer layers: a quick look")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    # after sys.path names the packed sources (above), and after --help
    from recjudge.bench._gpu_check import gpu_check, qwen_tokenizer  # noqa: PLC0415

    packed = ROOT / "tokenizer"
    tokenizer = a.tokenizer or (packed if (packed / "tokenizer.json").exists() else None)
    r = gpu_check(
        tokenizer or qwen_tokenizer(), a.device, a.dtype, a.users, a.candidates, a.history,
        a.naive_users, max_new_tokens=a.max_new_tokens, layers=a.layers, out=a.out,
    )  # fmt: skip
    print(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
