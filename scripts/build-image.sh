#!/usr/bin/env bash
# Builds the icecache container image with podman and smoke-tests it (docs/kubernetes.md, "Image").
#   scripts/build-image.sh [--prebuilt [BUILD_DIR]] [--no-smoke]
# Default: the multi-stage build (compiles in the image; slow on a small machine). --prebuilt:
# copies BUILD_DIR/bin's binaries (default build/, built by scripts/setup.sh) into the runtime
# stage instead. Environment: ICECACHE_IMAGE (default localhost/icecache:0.1.0, what the chart's
# values.yaml names), ICECACHE_BASE_IMAGE (default localhost/debian:12-local), ICECACHE_IMAGE_WORK (debootstrap root and logs, default
# /var/tmp/icecache-image), PODMAN_STORAGE_DRIVER (default vfs).
#
# No registry is reachable here, so the base is made locally: debootstrap a minimal Debian 12
# and `podman import` it as localhost/debian:12-local (once; reused while it exists).
# The smoke test runs the image's cluster on loopback: make a small random model inside the
# container, run `icecache cluster --device cpu --once` (router, prefill and decode processes; exits
# 0 once the router serves), then a cluster in the background and a generate through its router, as the non-root user with a read-only root filesystem and all
# capabilities dropped, like the chart's pods.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${ICECACHE_IMAGE:-localhost/icecache:0.1.0}
BASE=${ICECACHE_BASE_IMAGE:-localhost/debian:12-local}
WORK=${ICECACHE_IMAGE_WORK:-/var/tmp/icecache-image}
DRIVER=${PODMAN_STORAGE_DRIVER:-vfs}
BINARIES=build
SMOKE=1
PREBUILT_DIR=build
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) BINARIES=prebuilt; if [ $# -gt 1 ] && [ "${2#--}" = "$2" ]; then PREBUILT_DIR=$2; shift; fi ;;
    --no-smoke) SMOKE=0 ;;
    *) echo "usage: $0 [--prebuilt [BUILD_DIR]] [--no-smoke]"; exit 2 ;;
  esac
  shift
done

missing=()
for p in podman debootstrap runc; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
PODMAN=(podman --storage-driver="$DRIVER" --cgroup-manager=cgroupfs)

mkdir -p "$WORK"
if ! "${PODMAN[@]}" image exists "$BASE"; then
  if [ ! -x "$WORK/rootfs/usr/bin/apt-get" ]; then
    echo "build-image: debootstrap Debian 12 (minbase) into $WORK/rootfs"
    rm -rf "$WORK/rootfs"
    debootstrap --variant=minbase bookworm "$WORK/rootfs" http://deb.debian.org/debian > "$WORK/debootstrap.log" 2>&1
  fi
  echo "build-image: importing $BASE"
  # Without apt's lists and caches (each stage's apt-get update remakes them), docs, man pages and
  # message translations: 204 MB -> ~80 MB.
  tar -C "$WORK/rootfs" --exclude='./var/lib/apt/lists/*' --exclude='./var/cache/apt/*' \
    --exclude='./usr/share/doc/*' --exclude='./usr/share/man/*' --exclude='./usr/share/info/*' \
    --exclude='./usr/share/locale/*' -c . | "${PODMAN[@]}" import - "$BASE" > /dev/null
fi

if [ "$BINARIES" = prebuilt ]; then
  rm -rf .image-bin && mkdir -p .image-bin
  for b in icecache icecache-router icecache-prefill icecache-decode; do
    [ -x "$PREBUILT_DIR/bin/$b" ] || { echo "build-image: $PREBUILT_DIR/bin/$b missing (scripts/setup.sh)"; exit 1; }
    cp "$PREBUILT_DIR/bin/$b" .image-bin/
  done
  strip .image-bin/*
  # Libraries from outside Debian's paths (a -DICECACHE_CUDA=ON build links the CUDA runtime and
  # cuBLAS from /usr/local/cuda) travel along into /usr/local/lib/icecache. The GPU driver
  # (libcuda.so.1) is not bundled: the NVIDIA container runtime mounts the node's.
  mkdir -p .image-bin/lib
  for lib in $(ldd .image-bin/icecache* | awk '/=> \//{print $3}' | sort -u); do
    case "$(readlink -f "$lib")" in
      /lib/*|/usr/lib/*) ;;
      */libcuda.so*) ;;
      *) cp -L "$lib" .image-bin/lib/ && echo "build-image: bundling $lib" ;;
    esac
  done
  mkdir -p .image-bin/bin && mv .image-bin/icecache* .image-bin/bin/
fi

echo "build-image: building $IMAGE (binaries: $BINARIES)"
start=$(date +%s)
"${PODMAN[@]}" build --isolation=chroot --build-arg BASE="$BASE" --build-arg BINARIES="$BINARIES" \
  -f Containerfile -t "$IMAGE" . 2>&1 | tee "$WORK/build.log" | grep -E '^(STEP|COMMIT|Error|error)' || true
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "build-image: podman build failed ($WORK/build.log)"; exit 1; }
echo "build-image: built in $(( $(date +%s) - start )) s; $("${PODMAN[@]}" image inspect "$IMAGE" --format '{{.Size}}' | awk '{printf "%.0f MB", $1/1e6}')"
rm -rf .image-bin

if [ "$SMOKE" = 1 ]; then
  echo "build-image: smoke test (icecache cluster --once in the image, loopback)"
  # runc, not Debian's default crun: crun refuses hybrid cgroup v1/v2 hosts (this one). Limits
  # below the host's: a root without CAP_SYS_RESOURCE cannot give a container podman's defaults.
  "${PODMAN[@]}" run --runtime runc --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 --rm --network=none --read-only --cap-drop=ALL --security-opt=no-new-privileges \
    --tmpfs /tmp:rw,size=512m "$IMAGE" sh -c '
      set -e
      id
      icecache make-model --out /tmp/model --arch llama > /dev/null
      export UCX_TLS=tcp,sm,self UCX_NET_DEVICES=lo
      timeout 300 icecache cluster --model /tmp/model --port 50051 --device cpu --once
      icecache cluster --model /tmp/model --port 50051 --device cpu > /tmp/cluster.log 2>&1 &
      pid=$!
      i=0
      until icecache health --router 127.0.0.1:50051 > /dev/null 2>&1; do
        i=$((i + 1)); [ $i -lt 120 ] || { cat /tmp/cluster.log; exit 1; }; sleep 1
      done
      icecache generate --router 127.0.0.1:50051 --prompt "hello" --max-tokens 8 --ignore-eos
      kill -TERM $pid; wait $pid || true'
  echo "build-image: smoke test passed"
fi
