#!/usr/bin/env bash
# Install the real Dynamo frontend + mocker (PyPI ai-dynamo 1.6.1) into .dynamo/venv.
#
# Idempotent: does nothing when the venv already holds exactly these versions.
# ai-dynamo's dependency `aisimulate` cannot be built offline and the mocker does
# not need it (only --ais-perf-model does), so ai-dynamo goes in with --no-deps
# and its other requirements are installed explicitly, pinned below.
# All wheels are prebuilt (manylinux); nothing is compiled. ~150 MB download,
# ~700 MB on disk, ~15 s with uv on a 2-core machine (pip: ~60 s).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DYNAMO_VENV:-$ROOT/.dynamo/venv}"
DYNAMO_VERSION="1.6.1"
STAMP="$VENV/.shadow-proxy-dynamo-$DYNAMO_VERSION"

# Exact versions resolved and tested together (pip freeze of a working venv).
CONSTRAINTS="
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
attrs==26.1.0
certifi==2026.10.19.post1
cffi==2.1.1
charset-normalizer==3.5.3
click==8.5.1
cryptography==50.0.2
durationpy==0.11
filelock==4.3.1
frozenlist==1.8.0
fsspec==2026.9.0
google-auth==2.63.0
h11==0.16.0
hf-xet==1.8.0
httpcore2==2.16.2
httpx2==2.16.2
huggingface_hub==2.4.0
idna==3.20
kubernetes==32.0.1
markdown-it-py==4.3.0
mdurl==0.1.2
msgspec==0.23.0
multidict==7.2.1
numpy==2.4.6
oauthlib==4.0.1
packaging==26.4
prometheus_client==0.26.0
propcache==0.5.4
pyasn1==0.6.5
pyasn1_modules==0.4.2
pycparser==3.12
pydantic==2.13.5
pydantic_core==2.46.5
Pygments==2.21.0
python-dateutil==4.0.0
PyYAML==6.0.4
pyzmq==27.3.0
redis==8.1.0
regex==2026.11.19
requests==2.34.2
requests-oauthlib==2.0.0
rich==15.0.0
safetensors==0.8.0
shellingham==1.5.4
six==1.17.0
tokenizers==0.23.3
tqdm==4.70.1
transformers==5.24.0
truststore==0.10.5
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
tzdata==2026.6
urllib3==2.8.0
uvloop==0.23.0
websocket-client==1.9.2
yarl==1.25.1
zstandard==0.25.0
"

# ai-dynamo 1.6.1 Requires-Dist, minus aisimulate.
DYNAMO_REQS=(
  "aiohttp>=3.14.3,<4.0" "certifi>=2026.10.19" "kubernetes>=32.0.1,<33.0.0" "msgspec>=0.19.0"
  "prometheus-client>=0.23.1,<1.0" "pyzmq>=26.0.0" "redis>=6.2.0,<9.0.0" "tqdm>=4.0.0"
  "transformers>=4.56.0" "typing-extensions>=4.10.0" "zstandard>=0.23.0,<1.0"
)

if [[ -f "$STAMP" ]] && "$VENV/bin/python" -c "import dynamo.frontend, dynamo.mocker" 2>/dev/null; then
  echo "install-dynamo: $VENV already has ai-dynamo $DYNAMO_VERSION; nothing to do"
  exit 0
fi

PY="${DYNAMO_BASE_PYTHON:-}"
if [[ -z "$PY" ]]; then
  for cand in python3.11 python3.12 python3.13 python3.10 python3; do
    if command -v "$cand" >/dev/null 2>&1 &&
       "$cand" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] < (3, 14)))' 2>/dev/null; then
      PY="$cand"; break
    fi
  done
fi
[[ -n "$PY" ]] || { echo "install-dynamo: need Python 3.10..3.13" >&2; exit 1; }

start=$(date +%s)
echo "install-dynamo: creating $VENV with $("$PY" --version 2>&1)"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
cfile="$(mktemp)"; trap 'rm -f "$cfile"' EXIT
printf '%s\n' "$CONSTRAINTS" > "$cfile"
# shellcheck source=scripts/pinned-install.sh
source "$ROOT/scripts/pinned-install.sh"
install() { pinned_install "$VENV" "$cfile" "$@"; }
echo "install-dynamo: install ai-dynamo-runtime==$DYNAMO_VERSION"
install "ai-dynamo-runtime==$DYNAMO_VERSION"
echo "install-dynamo: install --no-deps ai-dynamo==$DYNAMO_VERSION"
install --no-deps "ai-dynamo==$DYNAMO_VERSION"
echo "install-dynamo: install ai-dynamo's requirements except aisimulate"
install "${DYNAMO_REQS[@]}"
"$VENV/bin/python" -c "import dynamo.frontend, dynamo.mocker"
touch "$STAMP"
echo "install-dynamo: done in $(( $(date +%s) - start ))s; $(du -sh "$VENV" | cut -f1) in $VENV"
