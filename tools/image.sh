#!/usr/bin/env bash
# Build the image (Dockerfile) with Podman where no base image can be pulled: a Debian bookworm
# root made with debootstrap from the Debian mirror stands in for python:3.11-slim (the same
# Debian, with Debian's Python 3.11, pip, its headers and useradd), imported as
# localhost/luftpause-base:bookworm and passed as BASE_IMAGE.
#
#   tools/image.sh [TAG]          (default localhost/luftpause:dev; run as root)
#
# Needs podman, debootstrap (apt-get install podman debootstrap) and the Debian mirror and the
# package index (pip in the build stage); builds with --isolation chroot, which needs no OCI runtime.
# MIRROR overrides the Debian mirror (default http://deb.debian.org/debian). The host's CA bundle
# is copied into the base, so a TLS-intercepting proxy the host trusts is trusted in the build
# too. The base is built once and reused (BASE_REBUILD=1 builds it again).
#
# Where a registry can be reached, build from python:3.11-slim as usual: docker build . (or
# podman build .), no BASE_IMAGE.
set -Eeuo pipefail

cd "$(dirname "$0")/.."
tag=${1:-localhost/luftpause:dev}
base=localhost/luftpause-base:bookworm
mirror=${MIRROR:-http://deb.debian.org/debian}

for tool in podman debootstrap; do
    if ! command -v "$tool" >/dev/null; then
        echo "image: $tool is not installed (apt-get install podman debootstrap)" >&2
        exit 2
    fi
done

if [[ -n ${BASE_REBUILD:-} ]] || ! podman image exists "$base"; then
    root=$(mktemp -d)
    trap 'rm -rf "$root"' EXIT
    echo "image: debootstrap bookworm into $root (a few minutes)" >&2
    debootstrap --variant=minbase \
        --include=python3,python3-dev,python3-pip,python-is-python3,ca-certificates \
        bookworm "$root" "$mirror" >&2
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    # Debian marks its Python externally managed (PEP 668); the image is the environment.
    tar -C "$root" -c . | podman import \
        --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' --change 'CMD ["python3"]' - "$base" >/dev/null
    rm -rf "$root"
    trap - EXIT
fi

echo "image: building $tag from $base" >&2
podman build --isolation chroot --build-arg "BASE_IMAGE=$base" --tag "$tag" .
echo "image: built $tag" >&2
