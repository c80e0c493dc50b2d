#!/usr/bin/env bash
# Release luftpause: build the image, tag it with the version and `latest`, push both, then tag
# the commit in git and push the tag.
#
#   tools/release.sh vX.Y.Z
#
# Environment:
#   REGISTRY   where the image goes (default ghcr.io/luftpause); the image is $REGISTRY/luftpause
#   DRY_RUN=1  print every command (prefixed "+ ") instead of running it; the checks still run
#   REMOTE     the git remote the tag is pushed to (default origin)
#
# Refuses (exit 2) a version that is not vX.Y.Z, and (exit 1) a working tree with uncommitted or
# untracked files (`git status --porcelain` not empty: commit or stash them, the image must be
# built from exactly the tagged commit) or a tag that already exists.
# Deploy a release with: LUFTPAUSE_IMAGE=$REGISTRY/luftpause LUFTPAUSE_VERSION=vX.Y.Z docker compose up -d
set -euo pipefail

usage() { echo "usage: $0 vX.Y.Z   (REGISTRY=..., DRY_RUN=1)" >&2; }

if [[ $# -ne 1 ]]; then
    usage
    exit 2
fi
version=$1
if [[ ! $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$ ]]; then
    echo "release: '$version' is not a version of the form vX.Y.Z (e.g. v0.2.0)" >&2
    usage
    exit 2
fi

cd "$(dirname "$0")/.."
registry=${REGISTRY:-ghcr.io/luftpause}
registry=${registry%/}
remote=${REMOTE:-origin}
image="$registry/luftpause"

dirty=$(git status --porcelain)
if [[ -n $dirty ]]; then
    echo "release: the working tree is not clean; commit or stash these first:" >&2
    echo "$dirty" >&2
    exit 1
fi
if git rev-parse -q --verify "refs/tags/$version" >/dev/null; then
    echo "release: tag $version already exists" >&2
    exit 1
fi
revision=$(git rev-parse HEAD)

run() {
    if [[ ${DRY_RUN:-} == 1 ]]; then
        printf '+'
        printf ' %q' "$@"
        printf '\n'
    else
        "$@"
    fi
}

run docker build \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.revision=$revision" \
    --tag "$image:$version" --tag "$image:latest" .
run docker push "$image:$version"
run docker push "$image:latest"
run git tag --annotate "$version" --message "luftpause $version"
run git push "$remote" "$version"
