#!/usr/bin/env bash
# Installs omni-core and every plugin under plugins/ into the current Python (editable).
# --test also installs what the test suite needs: espeak-ng (speech for ASR tests), OpenBLAS (for
# MLX on Linux) and the test packages.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)

if [[ "${1:-}" == "--test" ]] && { ! command -v espeak-ng >/dev/null 2>&1 || ! ldconfig -p | grep -q libopenblas; }; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq espeak-ng sox libopenblas0-pthread >/dev/null
fi

# A torch already present is kept; otherwise the pinned CPU build (an unpinned torch pulls GBs of CUDA wheels).
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  "${PIP[@]}" "torch==2.13.0"
fi

packages=(-e ./core)
for plugin in plugins/*/; do
  [[ -f "$plugin/pyproject.toml" ]] && packages+=(-e "./$plugin")
done
"${PIP[@]}" "${packages[@]}"

if [[ "${1:-}" == "--test" ]]; then
  "${PIP[@]}" -r requirements-test.txt
fi
