# Sourced by scripts/install-dynamo.sh, install-aiperf.sh and install-vllm.sh (not run).
#
# pinned_install VENV CONSTRAINTS_FILE ARGS...: install ARGS into VENV with the
# pinned versions, binary wheels only. uv installs them (in parallel: ~10 s
# where pip took ~100 s with an empty cache); pip is the fallback where uv
# cannot be installed.
pinned_install() {
  local venv="$1" constraints="$2"
  shift 2
  if [[ -x "$venv/bin/uv" ]] ||
     "$venv/bin/pip" install --quiet --disable-pip-version-check uv >/dev/null 2>&1; then
    "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" --only-binary :all: \
      -c "$constraints" "$@"
  else
    "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: \
      -c "$constraints" "$@"
  fi
}
