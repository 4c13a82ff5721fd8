#!/usr/bin/env bash
# Wheels for a GPU machine that has torch, transformers and Triton but no package registry
# (Python 3.12, x86-64): the serving stack, the structured-output grammar library and the
# test-only clients. Run here, where pip reaches PyPI; carry `.whl/` there and start each
# command with `source .whl/setup.sh` (it installs into /tmp/site and sets PYTHONPATH).
# The versions are the ones the local venv resolved, so both machines run the same code.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DEST=.whl
# Serving (fastapi, uvicorn, pyzmq, msgspec, gguf and their needs the image lacks),
# structured output (xgrammar, apache-tvm-ffi), test clients (openai, jsonschema).
NAMES=(fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn
    annotated-doc opentelemetry-api pyzmq msgspec gguf xgrammar apache-tvm-ffi openai httpx2 httpcore2
    truststore jiter sniffio jsonschema
    jsonschema-specifications referencing rpds-py)
mkdir -p "$DEST"
specs=()
for name in "${NAMES[@]}"; do
    version=$("$PY" -m pip show "$name" 2>/dev/null | sed -n "s/^Version: //p" || true)
    specs+=("$name${version:+==$version}")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64 -d "$DEST" "${specs[@]}"
cat > "$DEST/setup.sh" <<'EOF'
# source .whl/setup.sh (on the GPU machine, from the repo root)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
EOF
du -sh "$DEST"
