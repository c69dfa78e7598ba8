#!/usr/bin/env bash
# Prints the version packages and binaries are built as: a semver the
# package manager can order. The tag when HEAD is tagged (v0.2.0), else a
# pre-release of the next patch version after the newest release tag
# (vX.Y.Z, no pre-release) HEAD contains: after v0.2.0 that is
# v0.2.1-dev.<UTC date>.<commit>, which sorts above v0.2.0 and below
# v0.2.1, with .dirty when the tree has uncommitted changes. Without a
# release tag the next version is v0.2.0 (NEXT_VERSION overrides either).
#
#   hack/version.sh [REPO_DIR]     (default this repository)
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
semver='^v([0-9]+)\.([0-9]+)\.([0-9]+)$'
last=$(git tag --merged HEAD --list 'v*' --sort=-v:refname 2>/dev/null | grep -E "$semver" | head -n1 || true)
if [ -n "${NEXT_VERSION:-}" ]; then
  NEXT=$NEXT_VERSION
elif [[ $last =~ $semver ]]; then
  NEXT="v${BASH_REMATCH[1]}.${BASH_REMATCH[2]}.$((BASH_REMATCH[3] + 1))"
else
  NEXT=v0.2.0
fi
if tag=$(git describe --tags --exact-match 2>/dev/null) && [[ $tag =~ ^v[0-9]+\.[0-9]+\.[0-9]+ ]]; then
  v=$tag
else
  sha=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  # A semver pre-release identifier of digits only may not start with 0.
  [[ $sha =~ ^[0-9]+$ ]] && sha="g$sha"
  v="$NEXT-dev.$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d 2>/dev/null || date -u +%Y%m%d).$sha"
fi
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  case $v in *-*) v="$v.dirty" ;; *) v="$v-dirty" ;; esac
fi
echo "$v"
