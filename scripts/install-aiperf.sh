#!/usr/bin/env bash
# Install AIPerf 0.13.0 (PyPI `aiperf`) into .aiperf/venv, for the `aiperf` tests
# (an exported Mooncake trace replayed against the built-in frontend).
#
# Idempotent: does nothing when the venv already holds exactly this version.
# Its own virtual environment, like Dynamo's: AIPerf pins versions (pyzmq 26.4,
# rich 14.1, pandas 2.3...) that must not meet the project's. All wheels are
# prebuilt; nothing is compiled. ~1.2 GB on disk, ~10 s with uv on a 2-core machine (pip: ~100 s).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${AIPERF_VENV:-$ROOT/.aiperf/venv}"
AIPERF_VERSION="0.13.0"
STAMP="$VENV/.shadow-proxy-aiperf-$AIPERF_VERSION"

# Exact versions resolved and tested together (pip freeze of a working venv).
CONSTRAINTS="
aiofiles==24.1.0
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
aiosqlite==0.22.1
alembic==1.20.1
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
attrs==26.1.0
blinker==1.9.0
brotli==1.2.1
certifi==2026.10.19.post1
cffi==2.1.1
charset-normalizer==3.5.3
choreographer==1.4.0
click==8.5.1
colorlog==6.12.0
contourpy==1.3.3
crick==0.0.8
cycler==0.12.1
cyclopts==4.25.3
dash==3.1.1
dash-bootstrap-components==2.0.4
datasets==5.2.0
dill==0.4.1
docstring_parser==0.18.0
fastapi==0.165.0
ffmpeg-python==0.2.0
filelock==4.3.1
Flask==3.1.3
fonttools==4.68.0
frozenlist==1.8.0
fsspec==2026.9.0
future==1.0.0
h11==0.16.0
hf-xet==1.8.0
httpcore==1.0.9
httptools==0.9.0
httpx==0.28.1
huggingface_hub==1.33.0
idna==3.20
importlib_metadata==10.2.0
iniconfig==2.3.1
iso8601==2.1.0
itsdangerous==2.2.0
Jinja2==3.1.6
jmespath==1.0.1
jsonpatch==1.48
jsonpointer==3.12
kaleido==1.2.0
kiwisolver==1.5.1
kopf==1.45.2
kubernetes_asyncio==32.3.2
lazy-importer==0.1.0
linkify-it-py==2.2.0
logistro==2.0.1
Mako==1.4.3
markdown-it-py==4.3.0
MarkupSafe==3.0.4
matplotlib==3.11.2
mdit-py-plugins==0.7.0
mdurl==0.1.2
msgspec==0.23.0
multidict==7.2.1
multiprocess==0.70.19
narwhals==2.29.0
nest-asyncio==1.6.0
numpy==2.4.6
nvidia-ml-py==13.615.71
opentelemetry-api==1.45.2
optuna==5.0.0
orjson==3.11.9
packaging==26.4
pandas==2.3.3
pillow==12.3.0
platformdirs==4.14.9
plotly==6.4.0
pluggy==1.7.0
prometheus_client==0.23.1
propcache==0.5.4
protobuf==7.36.2
psutil==7.0.0
pyarrow==26.0.1
pycparser==3.12
pydantic==2.14.4
pydantic-settings==2.16.3
pydantic_core==2.50.5
Pygments==2.21.0
pyparsing==3.3.3
pytest==9.2.0
pytest-timeout==2.4.0
python-dateutil==4.0.0
python-dotenv==1.2.4
python-json-logger==4.2.0
python-multipart==0.0.34
pytz==2026.6
PyYAML==6.0.4
pyzmq==26.4.0
regex==2026.11.19
requests==2.34.2
retrying==1.4.2
rich==14.1.0
rich-rst==2.2.0
ruamel.yaml==0.18.17
ruamel.yaml.clib==0.2.15
safetensors==0.8.0
scipy==1.17.1
seaborn==0.13.2
sentencepiece==0.2.3
setproctitle==1.3.8
shellingham==1.5.4
simplejson==4.3.0
six==1.17.0
soundfile==0.13.1
SQLAlchemy==2.1.9
starlette==1.10.0
starlette-compress==2.0.0
textual==5.3.0
tiktoken==0.14.0
tokenizers==0.23.3
tqdm==4.70.1
transformers==5.24.0
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
tzdata==2026.6
urllib3==2.8.0
uvicorn==0.54.0
uvloop==0.23.0
watchfiles==1.3.0
websockets==17.4
Werkzeug==3.1.9
xxhash==4.1.0
yarl==1.25.1
zipp==4.1.2
zstandard==0.25.0
"

if [[ -f "$STAMP" ]] && "$VENV/bin/aiperf" --version >/dev/null 2>&1; then
  echo "install-aiperf: $VENV already has aiperf $AIPERF_VERSION; nothing to do"
  exit 0
fi

PY="${AIPERF_BASE_PYTHON:-}"
if [[ -z "$PY" ]]; then
  for cand in python3.11 python3.12 python3.13 python3.10 python3; do
    if command -v "$cand" >/dev/null 2>&1 &&
       "$cand" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] < (3, 14)))' 2>/dev/null; then
      PY="$cand"; break
    fi
  done
fi
[[ -n "$PY" ]] || { echo "install-aiperf: need Python 3.10..3.13" >&2; exit 1; }

start=$(date +%s)
echo "install-aiperf: creating $VENV with $("$PY" --version 2>&1)"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
cfile="$(mktemp)"; trap 'rm -f "$cfile"' EXIT
printf '%s\n' "$CONSTRAINTS" > "$cfile"
# shellcheck source=scripts/pinned-install.sh
source "$ROOT/scripts/pinned-install.sh"
install() { pinned_install "$VENV" "$cfile" "$@"; }
echo "install-aiperf: install aiperf==$AIPERF_VERSION"
install "aiperf==$AIPERF_VERSION"
"$VENV/bin/aiperf" --version >/dev/null
touch "$STAMP"
echo "install-aiperf: done in $(( $(date +%s) - start ))s; $(du -sh "$VENV" | cut -f1) in $VENV"
