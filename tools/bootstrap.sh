#!/usr/bin/env bash
# Installs everything Spate needs on a fresh Debian machine: system packages, the venv, the Python
# packages (python-qpid-proton compiled WITH TLS), generated gRPC code and the Node.js test client.
# Idempotent: each step is skipped when its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv

need_apt=()
# libqpid-proton11-dev + gcc: the C load client used by benchmarks/ and tests/benchmarks/;
# gcc + python3-dev: spate.gateway._fastsend, the consumers' run sends (ADR 0030);
# iproute2 + nftables + iptables: the chaos suite's network namespaces, cuts (chaos/netns.py) and
# NFQUEUE rules for its user-space netem (chaos/netem.py)
# prometheus: promtool and the server, which tests/integration/test_metrics.py runs against a
# dev cluster (the scrape config in deploy/prometheus/)
for pkg in libssl-dev pkg-config libqpid-proton11-dev gcc python3-dev iproute2 nftables iptables prometheus; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
# Java 17 runs Spark for the connector's tests (tests/spark, spate.spark)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: apt-get install ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip setuptools wheel
fi
stamp="$VENV/.spate-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ]; then
  echo "bootstrap: pip install -e .[dev,spark] (python-qpid-proton compiles from source, ~40 s;"
  echo "bootstrap: pyspark is a 435 MiB sdist, ~45 s more on a cold cache)"
  "$VENV/bin/pip" install -q -e '.[dev,spark]'
  touch "$stamp"
fi
if ! "$VENV/bin/python" -c 'import proton, sys; sys.exit(0 if proton.SSL.present() else 1)'; then
  echo "bootstrap: python-qpid-proton was built without TLS; rebuilding with libssl-dev present"
  "$VENV/bin/pip" install -q --no-cache-dir --force-reinstall --no-deps python-qpid-proton==0.40.0
  "$VENV/bin/python" -c 'import proton, sys; sys.exit(0 if proton.SSL.present() else 1)' \
    || { echo "bootstrap: proton.SSL.present() is still False" >&2; exit 1; }
fi

PATH="$PWD/$VENV/bin:$PATH" "$VENV/bin/python" tools/gen_proto.py

# the consumers' run sends in C (ADR 0030; Spate falls back to Python without it)
"$VENV/bin/python" tools/build_native.py --check >/dev/null || "$VENV/bin/python" tools/build_native.py

# the Event Hubs SDK's own samples (tests/eventhubs run them unchanged but for the connection
# string): they ship in its PyPI sdist, not in the wheel
samples="$VENV/azure-eventhub-samples"
if [ ! -f "$samples/send.py" ]; then
  echo "bootstrap: azure-eventhub 5.15.1 samples from its sdist into $samples"
  tmp=$(mktemp -d)
  "$VENV/bin/pip" download -q --no-deps --no-binary :all: -d "$tmp" azure-eventhub==5.15.1
  tar xzf "$tmp"/azure_eventhub-5.15.1.tar.gz -C "$tmp"
  mkdir -p "$samples"
  cp "$tmp"/azure_eventhub-5.15.1/samples/sync_samples/*.py "$samples"/
  rm -rf "$tmp"
fi

if [ -f tests/js/package.json ] && { [ ! -d tests/js/node_modules/rhea ] \
    || [ ! -d tests/js/node_modules/@azure/event-hubs ]; }; then
  echo "bootstrap: npm install (rhea, @azure/event-hubs) in tests/js"
  (cd tests/js && npm install --no-audit --no-fund --silent)
fi
