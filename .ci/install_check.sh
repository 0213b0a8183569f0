#!/usr/bin/env bash
# `pip install .` into a clean virtual environment gives a working `gradleak`: the
# runtime dependencies declared in pyproject.toml suffice, and the package carries
# its assets and configs. requirements.txt's pins are the constraints (extras stripped,
# as constraints files cannot hold them), so torch resolves to the local CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
sed -e 's/\[[^]]*\]//' requirements.txt > "$work/constraints.txt"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check -c "$work/constraints.txt" "$root"
cd "$work"  # outside the checkout: the installed package, not the source tree, is imported
"$work/venv/bin/python" -c "import gradleak, sys; assert gradleak.__file__.startswith('$work'), gradleak.__file__"
"$work/venv/bin/gradleak" list attacks > /dev/null
"$work/venv/bin/gradleak" attack --dataset digits --model mlp --attack fc-analytic --batch-size 1 \
    --images 2 --lpips none --out "$work/run" --json > "$work/result.json"
"$work/venv/bin/python" - "$work/result.json" <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))
psnr = result["metrics"]["psnr"]
assert psnr > 40, result["metrics"]
print(f"pip install . works: fc-analytic on digits from the installed package, PSNR {psnr:.1f} dB")
PY
