# Sourced by deploy/build-image.sh and deploy/test-image.sh: the podman command line that works
# on this machine, as root. Sets PODMAN (podman and its global options) and PODMAN_LIMITS
# (options for `podman build` and `podman run`), exported as SPATE_PODMAN and
# SPATE_PODMAN_LIMITS for tools/image_smoke.py.
#  - no systemd as init: podman manages cgroups itself (cgroupfs);
#  - cgroup v1 with a v2 hierarchy mounted too ("hybrid"): crun refuses it, runc runs;
#  - no CAP_SYS_RESOURCE (a sandboxed root): podman's default limits (nofile 1048576,
#    nproc 32768) cannot be set, so containers get the limits this shell has.
PODMAN=(podman)
[ -d /run/systemd/system ] || PODMAN+=(--cgroup-manager=cgroupfs)
if [ -d /sys/fs/cgroup/unified ] && [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
  command -v runc >/dev/null 2>&1 || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runc >/dev/null
  }
  PODMAN+=(--runtime=runc)
fi
PODMAN_LIMITS=()
cap_eff=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
if (( (16#$cap_eff >> 24 & 1) == 0 )); then
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
  PODMAN_LIMITS+=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
fi
export SPATE_PODMAN="${PODMAN[*]}" SPATE_PODMAN_LIMITS="${PODMAN_LIMITS[*]}"
