#!/usr/bin/env bash
# Fails if any C/C++ or CMake file of the repository is not formatted with
# the repo's .clang-format and .cmake-format.yaml; prints the offenders.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
status=0
while IFS= read -r f; do
    if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
        echo "not clang-formatted: $f (run: clang-format -i $f)"
        status=1
    fi
done < <(git ls-files --cached --others --exclude-standard -- '*.h' '*.c' '*.c++' '*.cpp' '*.cu' '*.cuh')
while IFS= read -r f; do
    if ! cmake-format --check -c .cmake-format.yaml "$f" >/dev/null 2>&1; then
        echo "not cmake-formatted: $f (run: cmake-format -i -c .cmake-format.yaml $f)"
        status=1
    fi
done < <(git ls-files --cached --others --exclude-standard -- 'CMakeLists.txt' '*/CMakeLists.txt' '*.cmake')
[ $status = 0 ] && echo "format: every C/C++ and CMake file is formatted"
exit $status
