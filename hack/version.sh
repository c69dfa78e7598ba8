#!/usr/bin/env bash
# Prints the version packages and binaries are built as: a semver the
# package manager can order. The tag when HEAD is tagged (v0.2.0), else a
# pre-release of the next version: v0.2.0-dev.<UTC date>.<commit>, with
# .dirty when the tree has uncommitted changes.
set -euo pipefail
cd "$(dirname "$0")/.."
NEXT=${NEXT_VERSION:-v0.2.0}
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
