#!/usr/bin/env bash
# Installs omni-core and every plugin under plugins/ into the current Python (editable).
# --test also installs what the test suite needs: espeak-ng (speech for ASR tests), OpenBLAS (for
# MLX on Linux), Chromium (the playground's browser tests drive it through Playwright, which cannot
# download a browser of its own here) and the test packages.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
# pip's own progress bars on a terminal; one line per step either way
if [[ -t 1 ]]; then PIP=("$PY" -m pip install --disable-pip-version-check); else PIP=("$PY" -m pip install --quiet --disable-pip-version-check); fi
step() { echo "setup: $*"; }

if [[ "${1:-}" == "--test" ]] && { ! command -v espeak-ng >/dev/null 2>&1 || ! ldconfig -p | grep -q libopenblas; }; then
  step "installing espeak-ng, sox and OpenBLAS (apt-get)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq espeak-ng sox libopenblas0-pthread >/dev/null
fi
# Where the system has no chromium package, the browser tests skip saying so: setup goes on.
if [[ "${1:-}" == "--test" ]] && ! command -v chromium >/dev/null 2>&1; then
  step "installing Chromium (apt-get)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
    || step "Chromium could not be installed: the playground's browser tests will skip"
fi

# A torch already present is kept; otherwise the pinned CPU build (an unpinned torch pulls GBs of CUDA wheels).
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  step "installing torch 2.13.0 (CPU build)"
  "${PIP[@]}" "torch==2.13.0"
fi

# omni-core's realtime extra serves the WebSocket endpoints (websockets, Silero VAD); --test adds
# its ray extra apart, below: Ray has no wheel for some platforms, and its tests skip without it
packages=(-e "./core[realtime]")
for plugin in plugins/*/; do
  [[ -f "$plugin/pyproject.toml" ]] && packages+=(-e "./$plugin")
done
step "installing omni-core and the plugins under plugins/ (editable)"
"${PIP[@]}" "${packages[@]}"

if [[ "${1:-}" == "--test" ]]; then
  step "installing Ray (omni-core's ray extra: the Ray placement tests run a local two-node cluster)"
  "${PIP[@]}" -e "./core[ray]" || step "Ray could not be installed here: the Ray placement tests will skip"
  step "installing the test packages (requirements-test.txt)"
  "${PIP[@]}" -r requirements-test.txt
fi
step "done: omni plugins list shows what is installed"
