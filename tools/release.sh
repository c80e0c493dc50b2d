#!/usr/bin/env bash
# Release luftpause: tag the commit in git, build the sdist and the manylinux wheel from it and
# check them (tools/dist.sh, into dist/vX.Y.Z/), build the image, push the git tag, then push the
# image tagged with the version (and `latest` when this is the newest release). Uploading the sdist
# and wheel to the package index stays a manual step: the last line printed says how
# (twine upload dist/vX.Y.Z/*, with your own index token).
#
#   tools/release.sh vX.Y.Z
#
# Versions: the version lives in pyproject.toml ([project] version = "X.Y.Z"); bump it there and
# commit first, then release with the same number prefixed by "v". A tag that does not match
# pyproject.toml is refused.
#
# Environment:
#   REGISTRY   where the image goes (default ghcr.io/luftpause); the image is $REGISTRY/luftpause
#   DRY_RUN    1 (or true/yes/on): print every command (prefixed "+ ") instead of running it; the
#              checks still run. Unset, empty, 0 (or false/no/off): a real release. Any other
#              value is refused (exit 2), so a typo never publishes.
#   REMOTE     the git remote the tag is pushed to and checked against (default origin)
#   PYTHON     the interpreter tools/dist.sh builds the wheel with (default .venv/bin/python)
#
# Order, so that a failure never leaves an image without its tag: the local git tag is created
# first (removed again if the dist or the image build fails), the git tag is pushed before any
# image (the push fails if someone else took the version meanwhile), then the images. `latest` moves only when
# the version is newer than every vX.Y.Z tag already on the remote or here.
#
# Refuses (exit 2) a version that is not vX.Y.Z or an unknown DRY_RUN, and (exit 1) a working tree
# with uncommitted or untracked files (`git status --porcelain` not empty: the image must be built
# from exactly the tagged commit), a tag that already exists here or on the remote, a remote that
# cannot be reached, or a version differing from pyproject.toml's.
# Deploy a release with: LUFTPAUSE_IMAGE=$REGISTRY/luftpause LUFTPAUSE_VERSION=vX.Y.Z docker compose up -d
set -Eeuo pipefail

usage() { echo "usage: $0 vX.Y.Z   (REGISTRY=..., REMOTE=..., DRY_RUN=1)" >&2; }
semver='^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$'

if [[ $# -ne 1 ]]; then
    usage
    exit 2
fi
version=$1
if [[ ! $version =~ $semver ]]; then
    echo "release: '$version' is not a version of the form vX.Y.Z (e.g. v0.2.0)" >&2
    usage
    exit 2
fi

case "$(printf '%s' "${DRY_RUN:-}" | tr '[:upper:]' '[:lower:]')" in
    "" | 0 | false | no | off) dry_run=0 ;;
    1 | true | yes | on) dry_run=1 ;;
    *)
        echo "release: DRY_RUN='${DRY_RUN}' is neither 1/true/yes/on (dry run) nor empty/0/false/no/off (release)" >&2
        exit 2
        ;;
esac

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

# pyproject.toml's [project] version, read without a TOML library: the first `version = "..."`
# line inside the [project] table.
project_version=$(awk '
    /^\[/ { in_project = ($0 ~ /^\[project\][[:space:]]*$/) }
    in_project && /^[[:space:]]*version[[:space:]]*=/ {
        sub(/^[^=]*=[[:space:]]*"/, ""); sub(/".*$/, ""); print; exit
    }' pyproject.toml 2>/dev/null || true)
if [[ "v$project_version" != "$version" ]]; then
    echo "release: $version does not match pyproject.toml's version '${project_version:-<none>}';" \
        "set [project] version = \"${version#v}\" there and commit it first" >&2
    exit 1
fi

if git rev-parse -q --verify "refs/tags/$version" >/dev/null; then
    echo "release: tag $version already exists" >&2
    exit 1
fi
if ! remote_tags=$(git ls-remote --tags --refs "$remote"); then
    echo "release: cannot list the tags of remote '$remote' (set REMOTE=...)" >&2
    exit 1
fi
remote_tags=$(printf '%s\n' "$remote_tags" | sed -n 's#^[0-9a-f]*[[:space:]]*refs/tags/##p')
if printf '%s\n' "$remote_tags" | grep -qxF -- "$version"; then
    echo "release: tag $version already exists on remote '$remote'" >&2
    exit 1
fi

# newer A B: true when vA.B.C A is strictly newer than B (numeric per part, semver order).
newer() {
    local a b i
    IFS=. read -r -a a <<<"${1#v}"
    IFS=. read -r -a b <<<"${2#v}"
    for i in 0 1 2; do
        if ((10#${a[i]} != 10#${b[i]})); then
            ((10#${a[i]} > 10#${b[i]}))
            return
        fi
    done
    return 1
}
newest=""
while read -r tag; do
    if [[ $tag =~ $semver ]] && { [[ -z $newest ]] || newer "$tag" "$newest"; }; then
        newest=$tag
    fi
done < <(printf '%s\n' "$remote_tags"; git tag --list 'v*')
tags=(--tag "$image:$version")
if [[ -z $newest ]] || newer "$version" "$newest"; then
    move_latest=1
    tags+=(--tag "$image:latest")
else
    move_latest=0
    echo "release: $version is older than $newest; $image:latest stays where it is" >&2
fi
revision=$(git rev-parse HEAD)

run() {
    if ((dry_run)); then
        printf '+'
        printf ' %q' "$@"
        printf '\n'
    else
        "$@"
    fi
}

run git tag --annotate "$version" --message "luftpause $version"
# Until the tag is on the remote, a failure takes the local tag back so the release can be rerun.
tag_pushed=0
untag() {
    if ((!tag_pushed && !dry_run)); then
        git tag --delete "$version" >/dev/null 2>&1 || true
        echo "release: failed before the tag was pushed; local tag $version removed" >&2
    fi
}
trap untag ERR
run tools/dist.sh "dist/$version"
run docker build \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.revision=$revision" \
    "${tags[@]}" .
run git push "$remote" "refs/tags/$version"
tag_pushed=1
trap - ERR
run docker push "$image:$version"
if ((move_latest)); then
    run docker push "$image:latest"
fi
echo "release: $version is out; upload its sdist and wheel to the package index yourself:" \
    "twine upload dist/$version/*" >&2
