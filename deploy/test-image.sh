#!/usr/bin/env bash
# The container image for real (docs/deploy.md, "Container image"): builds it with
# deploy/build-image.sh (the base image from Debian's archive once), then tools/image_smoke.py
# runs three node containers and a gateway container from it, one network namespace per
# "host" with the shipped deploy/config files, publishes with confirms and consumes through the
# gateway from the host's venv (spate.client over python-qpid-proton), loses a host, and stops
# every container. As root; exits non-zero on any failure. CI runs it (.ci/run).
#
#   deploy/test-image.sh                          # build + test localhost/spate:latest
#   SPATE_IMAGE_SKIP_BUILD=1 deploy/test-image.sh # test the image already built
#
# Its containers are named spate-image-test-<pid>-<host> and labelled
# spate.image-test=<pid>; the trap removes them (and only them) however it exits.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${SPATE_IMAGE:-localhost/spate:latest}
export SPATE_IMAGE=$IMAGE
RUN_ID=$$
# shellcheck source=deploy/podman-env.sh
source deploy/podman-env.sh

smoke=
cleanup() {
  # the driver first (SIGTERM: it removes its containers and namespaces itself), then any
  # container of this run still there
  if [ -n "$smoke" ] && kill -0 "$smoke" 2>/dev/null; then
    kill -TERM "$smoke" 2>/dev/null || true
    wait "$smoke" 2>/dev/null || true
  fi
  local ids
  ids=$("${PODMAN[@]}" ps --all --quiet --filter "label=spate.image-test=$RUN_ID" 2>/dev/null \
    || true)
  if [ -n "$ids" ]; then
    # shellcheck disable=SC2086
    "${PODMAN[@]}" rm --force --time 5 $ids >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

started=$(date +%s)
[ -x .venv/bin/python ] || bash tools/bootstrap.sh
if [ -z "${SPATE_IMAGE_SKIP_BUILD:-}" ]; then
  deploy/build-image.sh
fi
built=$(date +%s)
# in the background, so a signal to this script runs the trap at once
.venv/bin/python tools/image_smoke.py --image "$IMAGE" --run-id "$RUN_ID" &
smoke=$!
wait "$smoke"
smoke=
echo "test-image: passed: build $(( built - started )) s, run $(( $(date +%s) - built )) s"
