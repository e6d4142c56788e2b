#!/usr/bin/env bash
# Build the base image from Debian packages (mmdebstrap + podman import), for
# machines that reach no container registry. Real users pass nothing and get
# the Dockerfile's default base (an official slim Python image).
#
#   deploy/base/build-base.sh [TAG [EXTRA_PACKAGES]]  (default fedmask-base:bookworm)
#
# The image is Debian bookworm's minbase plus python3 (3.11), python3-venv,
# ca-certificates and libpq5: what the fedmask image's build and final stages
# need. EXTRA_PACKAGES (comma-separated) are added: `make images` builds the
# local PostgreSQL image's base with postgresql-15. Idempotent: does nothing when TAG already exists (FEDMASK_REBUILD_BASE=1
# forces a rebuild).
set -euo pipefail
TAG="${1:-fedmask-base:bookworm}"
EXTRA="${2:-}"
MIRROR="${FEDMASK_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
if [[ "${FEDMASK_REBUILD_BASE:-0}" != 1 ]] && podman image exists "$TAG"; then
    echo "base image $TAG exists"
    exit 0
fi
command -v mmdebstrap >/dev/null || { echo "build-base: mmdebstrap is not installed (apt-get install mmdebstrap)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mmdebstrap --variant=minbase --quiet \
    --include=python3,python3-venv,ca-certificates,libpq5${EXTRA:+,$EXTRA} \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$tmp/rootfs.tar" "$MIRROR"
podman import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/usr/bin/python3"]' \
    "$tmp/rootfs.tar" "$TAG"
echo "built base image $TAG"
