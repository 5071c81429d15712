#!/usr/bin/env bash
# Make the Dockerfile's base image (FROM python:3.11-slim) locally, for hosts that reach PyPI but no
# container registry. Debian bookworm (minbase) by debootstrap, python3 3.11 in a venv at /opt/py
# first on PATH (so `python` and `pip` exist as in the official image), this host's CA
# certificates trusted (pip reaches PyPI through them), imported into podman under both names the
# FROM line may resolve to. Run as root. Idempotent: an existing image or cached rootfs is reused.
#   bash scripts/container-base.sh            # installs podman, runc, debootstrap if missing
# The rootfs is cached under $MEMEST_CONTAINER_CACHE (default /var/cache/memest-container); to
# remake the image (new CA certificates, say), remove that folder and `podman rmi` both names.
set -euo pipefail
IMAGE=docker.io/library/python:3.11-slim
ALIAS=localhost/python:3.11-slim
CACHE=${MEMEST_CONTAINER_CACHE:-/var/cache/memest-container}
ROOTFS=$CACHE/rootfs
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
VENV_PATH=/opt/py/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

log() { echo "container-base: $*" >&2; }

install_tools() {
  local need=()
  command -v podman >/dev/null 2>&1 || need+=(podman)
  command -v runc >/dev/null 2>&1 || need+=(runc)
  command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
  [ ${#need[@]} -eq 0 ] && return 0
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

image_exists() { podman image exists "$1" 2>/dev/null; }

# debootstrap into a scratch folder, renamed only when complete: an interrupted run leaves no
# half-made rootfs behind for the next run to trust.
make_rootfs() {
  [ -f "$ROOTFS/.memest-complete" ] && return 0
  log "debootstrap bookworm into $ROOTFS"
  rm -rf "$ROOTFS.partial" "$ROOTFS"
  mkdir -p "$CACHE"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$ROOTFS.partial" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
    || { log "debootstrap failed; see $CACHE/debootstrap.log"; exit 1; }
  configure_rootfs "$ROOTFS.partial"
  touch "$ROOTFS.partial/.memest-complete"
  mv "$ROOTFS.partial" "$ROOTFS"
}

configure_rootfs() {
  local root=$1
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  fi
  chroot "$root" update-ca-certificates >/dev/null 2>&1
  chroot "$root" python3 -m venv /opt/py
  printf '[global]\ncert = %s\n' "$CA_BUNDLE" >"$root/etc/pip.conf"
  rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*
}

import_image() {
  log "importing $ROOTFS as $IMAGE"
  tar -C "$ROOTFS" --exclude=./.memest-complete -c . | podman import --quiet \
    --change "ENV PATH=$VENV_PATH" \
    --change "ENV PIP_CERT=$CA_BUNDLE" \
    --change "ENV LANG=C.UTF-8" \
    --change 'CMD ["python3"]' \
    - "$IMAGE" >/dev/null
}

main() {
  if [ "$(id -u)" -ne 0 ]; then
    log "run as root (debootstrap, chroot and rootful podman need it)"
    exit 2
  fi
  install_tools
  if ! image_exists "$IMAGE"; then
    make_rootfs
    import_image
  fi
  image_exists "$ALIAS" || podman tag "$IMAGE" "$ALIAS"
  log "$IMAGE ready"
}

main "$@"
