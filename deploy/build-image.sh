#!/usr/bin/env bash
# Build the Spate container image from deploy/Containerfile with podman, on a machine that
# reaches no container registry, only Debian's archive and PyPI (docs/deploy.md, "Container
# image"). As root:
#
#   deploy/build-image.sh              # -> localhost/spate:latest
#   SPATE_IMAGE=localhost/spate:test deploy/build-image.sh
#
# 1. installs podman and mmdebstrap with apt when they are missing;
# 2. makes the base image localhost/debian:bookworm-slim from deb.debian.org with mmdebstrap
#    (minbase; like Debian's own slim image: no docs, man pages, locales or apt translations,
#    dpkg without fsync while building images) when it is missing
#    (SPATE_BASE_IMAGE names another base; one not under localhost/ is pulled as usual);
# 3. runs `podman build -f deploy/Containerfile --build-arg BASE=<base>` with host networking
#    (no bridge or CNI needed while building), mounting the host's CA bundle for pip when the
#    host has one (PyPI behind a TLS-intercepting proxy).
#
# It touches no image but the two it names: the base image is reused once made; the previous
# build of SPATE_IMAGE is left untagged (podman's build cache), never removed.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${SPATE_IMAGE:-localhost/spate:latest}
BASE=${SPATE_BASE_IMAGE:-localhost/debian:bookworm-slim}
SUITE=bookworm
MIRROR=${SPATE_DEBIAN_MIRROR:-http://deb.debian.org}

say() { echo "build-image: $*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (rootful podman; CI and these machines run as root)"

need=()
command -v podman >/dev/null 2>&1 || need+=(podman crun runc conmon netavark)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
if [ ${#need[@]} -gt 0 ]; then
  say "apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" \
    >/dev/null
fi

# shellcheck source=deploy/podman-env.sh
source deploy/podman-env.sh
# overlay storage falls back to vfs where the kernel or the filesystem refuses it (slower)
if ! "${PODMAN[@]}" info >/dev/null 2>&1; then
  say "podman info failed with the default storage; trying the vfs driver"
  PODMAN+=(--storage-driver=vfs)
  "${PODMAN[@]}" info >/dev/null || die "podman does not work here (podman info above)"
fi

started=$(date +%s)
if [[ $BASE == localhost/* ]] && ! "${PODMAN[@]}" image exists "$BASE"; then
  say "making $BASE from $MIRROR with mmdebstrap (once; it is reused)"
  # the same sources as Debian's image: the release, its updates and security
  # into a file first: a failed mmdebstrap must not leave a broken image behind
  mkdir -p build
  tarball=build/debian-$SUITE-minbase.tar
  trap 'rm -f "$tarball"' EXIT
  mmdebstrap --variant=minbase --mode=root --format=tar \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='force-unsafe-io' \
    --aptopt='Acquire::Languages "none"' \
    --aptopt='Acquire::Retries "3"' \
    "$SUITE" "$tarball" \
    "deb $MIRROR/debian $SUITE main" \
    "deb $MIRROR/debian $SUITE-updates main" \
    "deb $MIRROR/debian-security $SUITE-security main"
  "${PODMAN[@]}" import --change 'CMD ["bash"]' \
    --message "mmdebstrap --variant=minbase $SUITE (deploy/build-image.sh)" "$tarball" "$BASE" \
    >/dev/null
  rm -f "$tarball"
  say "base image $BASE made in $(( $(date +%s) - started )) s"
fi

build=(--network host --build-arg "BASE=$BASE" "${PODMAN_LIMITS[@]}")
ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
if [ -f "$ca" ]; then
  build+=(--volume "$(readlink -f "$ca"):/run/spate-build-ca.crt:ro"
          --build-arg PIP_CERT=/run/spate-build-ca.crt)
fi
building=$(date +%s)
say "podman build -f deploy/Containerfile -t $IMAGE (base $BASE)"
"${PODMAN[@]}" build "${build[@]}" -f deploy/Containerfile -t "$IMAGE" .
say "built $IMAGE in $(( $(date +%s) - building )) s ($(( $(date +%s) - started )) s in all)"
