#!/usr/bin/env bash
# Rebuild .whl/ (the wheels `make gpu-check` installs on the offline GPU machine:
# Python 3.12, manylinux x86_64) from scripts/gpu_check_wheels.txt, exactly that list.
#
#     bash scripts/gpu_check_wheels.sh [DIR]      # DIR defaults to .whl in the repository root
#
# Downloads into a temp folder first and replaces DIR only when every wheel came,
# so a failed download leaves the old folder as it was. PYTHON=python3 by default.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
list="$repo/scripts/gpu_check_wheels.txt"
dest="${1:-$repo/.whl}"
python="${PYTHON:-python3}"

mapfile -t pins < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$list" | grep -v '^$')
tmp="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-wheels.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done

for pin in "${pins[@]}"; do
    "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp "${platforms[@]}" -d "$tmp" "$pin"
done

got=$(find "$tmp" -maxdepth 1 -name '*.whl' | wc -l)
if [ "$got" -ne "${#pins[@]}" ]; then
    echo "expected ${#pins[@]} wheels, got $got in $tmp" >&2
    exit 1
fi
rm -rf "$dest"
mkdir -p "$dest"
mv "$tmp"/*.whl "$dest"/
echo "$got wheels in $dest ($(du -sh "$dest" | cut -f1))"
