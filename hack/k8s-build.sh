# Sourced by hack/controlplane-bins.sh and hack/node-bins.sh: builds
# Kubernetes commands of release $K8S_VERSION from the Go module proxy
# into $BIN, in a wrapper module under $WORK/k8s that imports the commands
# in $CMDS. kubernetes' go.mod maps its staging modules to ./staging; the
# wrapper maps each to the published v0.x module of the same release
# instead. The caller defines log.

# go-build.sh beside this file: the sourcing script may have changed folder.
K8S_BUILD_HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# k8s_wrapper MODULE: (re)writes the wrapper module when $CMDS changed.
k8s_wrapper() {
  local d="$WORK/k8s"
  [ -f "$d/.ready" ] && [ "$(cat "$d/.ready")" = "${CMDS[*]}" ] && return
  rm -rf "$d"; mkdir -p "$d"
  local minor="v0.${K8S_VERSION#v1.}"
  cat >"$d/go.mod" <<MOD
module $1
go 1.25
require k8s.io/kubernetes $K8S_VERSION
MOD
  (cd "$d" && go mod download -json k8s.io/kubernetes@"$K8S_VERSION" >/dev/null)
  local kmod; kmod=$(cd "$d" && go mod download -json k8s.io/kubernetes@"$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  grep -E '^\s*k8s.io/[a-z0-9-]+ => \./staging' "$kmod" | awk '{print $1}' | sort -u | while read -r m; do
    echo "replace $m => $m $minor" >>"$d/go.mod"
  done
  { printf '//go:build tools\npackage tools\nimport (\n'; printf '_ "k8s.io/kubernetes/cmd/%s"\n' "${CMDS[@]}"; printf ')\n'; } >"$d/tools.go"
  (cd "$d" && go mod tidy >/dev/null)
  echo "${CMDS[*]}" >"$d/.ready"
}

# build_k8s MODULE NAME: builds k8s.io/kubernetes/cmd/NAME into $BIN/NAME
# when it is missing, with the version stamped as the release's own are.
build_k8s() {
  local name=$2
  [ -x "$BIN/$name" ] && return
  k8s_wrapper "$1"
  log "building $name $K8S_VERSION (about 5 min cold, seconds warm)"
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
  ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  (cd "$WORK/k8s" && bash "$K8S_BUILD_HACK/go-build.sh" "$(basename "$0" .sh): $name" -trimpath -ldflags="$ld" -o "$BIN/$name.tmp" "k8s.io/kubernetes/cmd/$name")
  mv "$BIN/$name.tmp" "$BIN/$name"
}
