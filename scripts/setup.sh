#!/usr/bin/env bash
# Sets smol up on a fresh Debian machine and shows it working: installs the
# build and test dependencies (Debian packages; PyPI packages for the
# cross-checks and the server test), builds smol in build/, fetches SmolLM2-135M-Instruct into
# models/ and generates text with it.
#
#   scripts/setup.sh            everything, ending with a generated answer
#   scripts/setup.sh --no-run   everything but the generation (CI uses this)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
run_demo=1
[ "${1:-}" = "--no-run" ] && run_demo=0

scripts/install-packages.sh build-essential cmake git python3 python3-pip python3-venv \
    clang-format cmake-format doctest-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev \
    pkg-config chromium chromium-driver nginx

# The cross-check scripts read GGUF with the independent `gguf` package; the
# server test talks to smol-server through the official `openai` client; the
# chat-template test renders with Python's `jinja2` as the truth; the
# converter's test writes Hugging Face checkpoints with `safetensors`,
# tokenizes with HF's `tokenizers` and trains Gemma's tokenizer.model with
# `sentencepiece`; structured output is validated by
# `jsonschema`; the chat page's test drives Chromium (Debian's chromium and
# chromium-driver) through `selenium`.
py_packages="gguf numpy openai jinja2 safetensors tokenizers sentencepiece jsonschema selenium"
if ! python3 -c "import gguf, numpy, openai, jinja2, safetensors, tokenizers, sentencepiece, jsonschema, selenium" 2>/dev/null; then
    echo "setup: installing the Python packages $py_packages"
    # shellcheck disable=SC2086
    python3 -m pip install --quiet $py_packages 2>/dev/null ||
        python3 -m pip install --quiet --break-system-packages $py_packages
fi

# llama.cpp's tokenizer suite and chat-template corpus, read by the tests
# from the llama-cpp-python sdist (downloaded by name from PyPI, unpacked).
scripts/peers.sh --sources "${SMOL_PEERS_DIR:-/work/peers}"

scripts/fetch-model.sh
scripts/fetch-model.sh gemma3-270m # a real Q4_K_M file for the dequantization check

echo "setup: building smol (Release) in build/"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${SMOL_CMAKE_ARGS:-} >/dev/null
cmake --build build -j"$(nproc)"

if [ "$run_demo" = 1 ]; then
    echo
    ./build/examples/smol-cli --chat -p "Write a haiku about small language models." -n 64
fi
