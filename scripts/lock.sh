#!/usr/bin/env bash
# Regenerate the lock files in requirements/ from pyproject.toml (`make lock`).
#
#   dev.txt         the dev extra (tools, jinja2 and the test tools): `make`'s venv
#   image-lean.txt  the core dependencies: the lean image
#   image-full.txt  core + the jinja2 extra (transformers): the full image
#   image-tools.txt core + jinja2 + tools (numpy, numba, matplotlib, pyarrow):
#                   the tools image (shadow-replay as a live service, shadow-trace)
#   build.txt       pip and setuptools for the image's builder stage
#
# Every file pins exact versions with the sha256 of every wheel and sdist of
# that version (pip and uv install them with hash checking), resolved for any
# platform and Python >= 3.11 (--universal). dev.txt is resolved first and
# constrains the image files, so the images run the versions the tests ran.
# Pins already in a file are kept when they still fit (a new dependency or a
# changed bound moves only what it must); `make lock LOCK_ARGS=--upgrade`
# takes the newest versions that fit, `LOCK_ARGS='--upgrade-package NAME'` one.
set -euo pipefail
cd "$(dirname "$0")/.."
UV="${UV:-.venv/bin/uv}"
compile() {
  "$UV" pip compile --quiet --universal --python-version 3.11 --generate-hashes \
    --custom-compile-command "make lock" ${LOCK_ARGS:-} "$@"
}
compile --extra dev pyproject.toml -o requirements/dev.txt
compile -c requirements/dev.txt pyproject.toml -o requirements/image-lean.txt
compile -c requirements/dev.txt --extra jinja2 pyproject.toml -o requirements/image-full.txt
compile -c requirements/dev.txt --extra jinja2 --extra tools pyproject.toml \
  -o requirements/image-tools.txt
compile requirements/build.in -o requirements/build.txt
