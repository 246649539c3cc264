#!/usr/bin/env bash
# Runs a Python test with the interpreter of the Hugging Face virtual
# environment: $DTRAIN_HF_PYTHON, else DEFAULT (the build's hf-venv).
# Exits 77 (skip) when there is none.
#   hf_python.sh DEFAULT SCRIPT ARGS...
py=${DTRAIN_HF_PYTHON:-$1}
shift
if [ ! -x "$py" ]; then
  echo "SKIP: no Python at $py (DTRAIN_WITH_HF=1 bash launch/setup.sh makes build/hf-venv)"
  exit 77
fi
exec "$py" "$@"
