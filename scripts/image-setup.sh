#!/usr/bin/env bash
# The image lane's machine (make image-test): Debian's podman, buildah, runc,
# catatonit (the init of podman's pods) and mmdebstrap; then a Debian bookworm
# base image made here with mmdebstrap and imported into podman, since no
# registry is reachable: the Dockerfile's BASE in the lane.
#
# Idempotent. The base is cached between runs on this machine: podman's image
# store keeps it (labelled with a hash of the mmdebstrap command, so a changed
# command makes it anew), and so does its tarball in $SHADOW_PROXY_IMAGE_CACHE.
# Fresh: 60-140 s (packages, mmdebstrap, import; more on a loaded machine);
# cached: under 1 s.
# Needs root (apt-get, mmdebstrap); podman reads $CONTAINERS_CONF.
set -euo pipefail

BASE_IMAGE="${SHADOW_PROXY_IMAGE_BASE:-localhost/shadow-proxy-base:bookworm}"
CACHE="${SHADOW_PROXY_IMAGE_CACHE:-/var/cache/shadow-proxy-image}"
PACKAGES=(podman buildah runc catatonit mmdebstrap)
MMDEBSTRAP=(mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm)
LABEL="io.shadow-proxy.base"

start=$(date +%s)
missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$package")
done
if (( ${#missing[@]} )); then
  echo "image-setup: installing ${missing[*]} from Debian"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" > /dev/null
fi

key="$(printf '%s\n' "${MMDEBSTRAP[*]}" | sha256sum | cut -c1-16)"
if [[ "$(podman image inspect --format "{{ index .Labels \"$LABEL\" }}" "$BASE_IMAGE" \
         2>/dev/null)" == "$key" ]]; then
  echo "image-setup: $BASE_IMAGE is cached ($(( $(date +%s) - start ))s)"
  exit 0
fi
tarball="$CACHE/bookworm-$key.tar"
if [[ ! -f "$tarball" ]]; then
  echo "image-setup: ${MMDEBSTRAP[*]}"
  mkdir -p "$CACHE"
  rm -f "$CACHE"/partial-*.tar
  "${MMDEBSTRAP[@]}" "$CACHE/partial-$key.tar" > "$CACHE/mmdebstrap.log" 2>&1 \
    || { tail -n 30 "$CACHE/mmdebstrap.log" >&2; exit 1; }
  mv "$CACHE/partial-$key.tar" "$tarball"
fi
podman import --quiet --change "LABEL $LABEL=$key" --change 'CMD ["python3"]' \
  "$tarball" "$BASE_IMAGE" > /dev/null
echo "image-setup: $BASE_IMAGE made from $tarball ($(( $(date +%s) - start ))s)"
