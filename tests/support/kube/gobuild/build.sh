#!/usr/bin/env bash
# Builds the real control plane's binaries from Go modules, or reuses them.
#
# Why a script of its own: `.ci/run` and tests/support/kube/real.py both call it, and a cold build is
# the long pole of CI (tens of minutes on 2 cores), so what it builds and where it keeps the
# result must be one thing. Binaries are cached by version outside the work tree, in
# ${JUPYTER_MN_KUBE_CACHE:-~/.cache/jupyter_mn/kube}/<component>-<version>/, and Go's own
# GOCACHE/GOMODCACHE stay where Go keeps them, so a second run costs seconds.
#
# Usage: tests/support/kube/gobuild/build.sh            build what is missing, print the cache folder
#        tests/support/kube/gobuild/build.sh --cached   print it if everything is built, else exit 1
# Environment: JUPYTER_MN_KUBE_CACHE, GOFLAGS (e.g. -p=1 where memory is short).
set -euo pipefail

KUBERNETES=v1.37.2
ETCD=v3.7.3
KUEUE=v0.17.0

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${JUPYTER_MN_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jupyter_mn/kube}
export CGO_ENABLED=0
binaries=("etcd-$ETCD/etcd" "kueue-$KUEUE/kueue")
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    binaries+=("kubernetes-$KUBERNETES/$cmd")
done
if [[ ${1:-} == --cached ]]; then
    for binary in "${binaries[@]}"; do
        [[ -x $cache/$binary ]] || exit 1
    done
    echo "$cache"
    exit 0
fi

# build NAME DEST MODULE_DIR PACKAGE LDFLAGS: go build into a temporary name, then rename, so
# that an interrupted build never leaves a binary that looks cached. -buildvcs=false: the
# wrapper modules sit in our git work tree, whose state says nothing about what is built.
build() {
    local name=$1 dest=$2 dir=$3 pkg=$4 ldflags=$5
    if [[ -x $dest/$name ]]; then
        return
    fi
    mkdir -p "$dest"
    local start=$SECONDS
    (cd "$dir" && go build -trimpath -buildvcs=false -ldflags "-s -w $ldflags" -o "$dest/.$name.tmp" "$pkg")
    mv "$dest/.$name.tmp" "$dest/$name"
    echo "built $name in $((SECONDS - start)) s ($(du -m "$dest/$name" | cut -f1) MiB)" >&2
}

major=${KUBERNETES#v}; major=${major%%.*}
minor=${KUBERNETES#v*.}; minor=${minor%%.*}
k8s_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    k8s_ldflags+=" -X $pkg.gitVersion=$KUBERNETES -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

build etcd "$cache/etcd-$ETCD" "$here/etcd" . ""
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    build "$cmd" "$cache/kubernetes-$KUBERNETES" "$here/kubernetes" "./$cmd" "$k8s_ldflags"
done
# Kueue's go.mod has no replace lines, so its own module builds as it is; a module-aware
# `go build pkg@version` does not exist, hence the throwaway GOBIN of `go install`.
if [[ ! -x $cache/kueue-$KUEUE/kueue ]]; then
    start=$SECONDS
    mkdir -p "$cache/kueue-$KUEUE"
    tmp=$(mktemp -d "$cache/kueue-$KUEUE/.gobin.XXXXXX")
    GOBIN=$tmp go install -trimpath \
        -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE" \
        "sigs.k8s.io/kueue/cmd/kueue@$KUEUE"
    mv "$tmp/kueue" "$cache/kueue-$KUEUE/kueue"
    rmdir "$tmp"
    echo "built kueue in $((SECONDS - start)) s" >&2
fi
echo "$cache"
