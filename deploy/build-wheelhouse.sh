#!/usr/bin/env bash
# Build the wheelhouse the images install from (with --no-index: nothing is
# downloaded inside a container build). Runs on the host, so the host's pip
# configuration (index, mirrors, certificates) applies.
#
#   deploy/build-wheelhouse.sh [FLAVOR]
#
# FLAVOR (default cpu) names the folder deploy/.wheelhouse/FLAVOR/ and the
# PyTorch build in it:
#   cpu     torch as pinned in constraints.txt (the CPU build on these machines)
#   cu*     e.g. cu126: torch of the same version from PyTorch's CUDA index
#           (https://download.pytorch.org/whl/FLAVOR, or $FEDMASK_TORCH_INDEX),
#           for a GPU edge-client image: make images TORCH_FLAVOR=cu126
# Only the runtime dependencies go in (no dev tools), pinned by constraints.txt,
# and, in deploy/.wheelhouse/project/, the fedmask wheel itself. Idempotent:
# pip skips wheels already there.
set -euo pipefail
cd "$(dirname "$0")/.."
FLAVOR="${1:-cpu}"
PYTHON="${PYTHON:-python3}"
OUT="deploy/.wheelhouse/$FLAVOR"
mkdir -p "$OUT"
extra=()
constraints=constraints.txt
if [[ "$FLAVOR" != cpu ]]; then
    index="${FEDMASK_TORCH_INDEX:-https://download.pytorch.org/whl/$FLAVOR}"
    torch_version="$(sed -n 's/^torch==\([^+ ]*\).*/\1/p' constraints.txt)"
    # The CUDA wheel is versioned torch==X+FLAVOR: constrain to that instead.
    constraints="$(mktemp)"
    trap 'rm -f "$constraints"' EXIT
    sed "s/^torch==.*/torch==${torch_version}+${FLAVOR}/" constraints.txt > "$constraints"
    extra=(--extra-index-url "$index")
fi
"$PYTHON" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$OUT" \
    -c "$constraints" "${extra[@]}" . 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
# The project wheel lives apart (deploy/.wheelhouse/project/): the images
# install the dependencies in one layer and fedmask in a later one.
mkdir -p deploy/.wheelhouse/project
rm -f deploy/.wheelhouse/project/fedmask-*.whl
mv "$OUT"/fedmask-*.whl deploy/.wheelhouse/project/
# The list of dependency wheels and their hashes, rewritten only when it
# changes: the runtime image is rebuilt when this file is newer (Makefile).
list="deploy/.wheelhouse/$FLAVOR.list"
(cd "$OUT" && sha256sum -- *.whl) > "$list.new"
if cmp -s "$list.new" "$list"; then rm -f "$list.new"; else mv "$list.new" "$list"; fi
echo "wheelhouse $OUT: $(ls "$OUT"/*.whl | wc -l) wheels, $(du -sh "$OUT" | cut -f1)"
