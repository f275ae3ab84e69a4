#!/usr/bin/env bash
# Set-up for `make bench` (idempotent): nginx (the C reference proxy), taskset
# and jemalloc (the worker's allocator, as the image has it) from Debian's
# packages when missing, and the Dynamo frontend + mocker
# (scripts/install-dynamo.sh) when the bench is asked for --frontend dynamo|both,
# and py-spy into .venv for --profile.
# Takes the bench's own arguments and looks only at --frontend, --regime and --profile
# (isolation-dynamo needs Dynamo; multiturn uses it with --frontend dynamo, and
# vLLM with --frontend vllm).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
frontend=builtin
profile=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --profile) profile=1; shift ;;
    --regime) [[ "${2:-}" == isolation-dynamo ]] && frontend=dynamo; shift 2 || shift ;;
    --regime=isolation-dynamo) frontend=dynamo; shift ;;
    --frontend) frontend="${2:-builtin}"; shift 2 || shift ;;
    --frontend=*) frontend="${1#--frontend=}"; shift ;;
    *) shift ;;
  esac
done

missing=()
command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]] || missing+=(nginx-light)
command -v taskset >/dev/null 2>&1 || missing+=(util-linux)
# jemalloc: the worker's allocator, as the image ships it (worker.malloc: auto).
/sbin/ldconfig -p 2>/dev/null | grep -q "libjemalloc.so.2 " || missing+=(libjemalloc2)
if [[ ${#missing[@]} -gt 0 ]]; then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  echo "bench/setup.sh: installing ${missing[*]} with apt-get"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [[ $profile -eq 1 ]] && [[ ! -x "$ROOT/.venv/bin/py-spy" ]]; then
  echo "bench/setup.sh: installing py-spy (sampling profiler) into .venv"
  "$ROOT/.venv/bin/python" -m pip install --quiet "py-spy>=0.3,<1"
fi

if [[ "$frontend" == dynamo || "$frontend" == both ]]; then
  "$ROOT/scripts/install-dynamo.sh"
fi
if [[ "$frontend" == vllm ]]; then
  make -C "$ROOT" vllm
fi
