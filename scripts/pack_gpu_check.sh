#!/usr/bin/env bash
# Pack the device check for a bare CUDA machine without network (torch and transformers are
# assumed there): recjudge's sources, scripts/gpu_check.py, the Qwen2.5 tokenizer and cp312
# manylinux wheels of what recjudge's judge path needs beyond them (xgrammar, pydantic).
# Usage: scripts/pack_gpu_check.sh DIR   (then copy DIR; its README.txt says how to run it)
set -euo pipefail
out=${1:?usage: scripts/pack_gpu_check.sh DIR}
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
mkdir -p "$out/scripts" "$out/tokenizer" "$out/wheels"
rm -rf "$out/src" && mkdir -p "$out/src"
(cd "$here/src" && find recjudge \( -name '*.py' -o -name '*.json' \) -not -path '*/__pycache__/*' \
  | tar -cf - -T -) | tar -xf - -C "$out/src"
cp "$here/scripts/gpu_check.py" "$out/scripts/"
tok=$("$py" -c 'from recjudge.bench._gpu_check import qwen_tokenizer; print(qwen_tokenizer())')
for f in tokenizer.json tokenizer_config.json chat_template.jinja; do
  [ -f "$tok/$f" ] && cp "$tok/$f" "$out/tokenizer/"
done
# The versions this checkout is locked to, as cp312 manylinux wheels (no dependencies:
# each one named).
pins=$("$py" - <<'PY'
from importlib.metadata import version
names = ["xgrammar", "apache-tvm-ffi", "pydantic", "pydantic-core", "annotated-types",
         "typing-inspection", "typing-extensions"]
found = []
for n in names:
    try:
        found.append(f"{n}=={version(n)}")
    except Exception:
        pass
print(" ".join(found))
PY
)
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$out/wheels" $pins
cat > "$out/README.txt" <<'TXT'
recjudge device check. On the GPU machine, from this folder:
  python3 -m pip install -q --no-index --no-deps --target /tmp/site wheels/*.whl
  PYTHONPATH=/tmp/site python3 scripts/gpu_check.py --out out
It prints (and writes to out/gpu_check.json) fast-engine vs generate() parity and judgments/s.
TXT
du -sh "$out"
