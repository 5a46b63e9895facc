#!/usr/bin/env bash
# Builds a stand-in for the python:3.11-slim base image from Debian packages, for a machine that can
# install Debian packages but cannot pull from a container registry. .ci/docker.sh uses it when the
# machine's own base-image tool is not there.
#
# The image: a minimal Debian bookworm root (debootstrap --variant=minbase, as the slim images are
# made) with Debian's Python 3.11, its headers (the official image has them too), venv and pip;
# `python` and `pip` on PATH as in the official image; pip allowed to install into the system
# interpreter (the Dockerfile's build stage does). The host's extra CA certificates are copied in, so
# that pip inside `docker build` trusts a TLS-intercepting proxy when the host does.
#
# usage: deploy/base-image.sh [TAG]     (default python:3.11-slim; MIRROR overrides the Debian mirror)
set -euo pipefail
TAG=${1:-python:3.11-slim}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
ROOTFS=$(mktemp -d /tmp/corral-base-rootfs.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT

command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
debootstrap --variant=minbase --include=ca-certificates,python3,python3-venv,python3-pip,python3.11-dev bookworm "$ROOTFS" "$MIRROR" >/dev/null

in_root() { env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 chroot "$ROOTFS" "$@"; }

if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$ROOTFS/etc/pip.conf"
fi
in_root /bin/sh -eu <<'EOF'
update-ca-certificates >/dev/null
# The official image's interpreter is the system's own: pip installs into it without complaint.
rm -f /usr/lib/python3.11/EXTERNALLY-MANAGED
ln -sf /usr/bin/python3 /usr/local/bin/python
ln -sf /usr/bin/pip3 /usr/local/bin/pip
python -c 'import ssl, sqlite3, venv, tomllib'
apt-get clean
rm -rf /var/lib/apt/lists/* /var/log/* /tmp/* /root/.cache
EOF
: >"$ROOTFS/etc/resolv.conf"

tar -C "$ROOTFS" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . |
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    -m "Debian bookworm minbase with Debian's Python 3.11 (stand-in for python:3.11-slim)" \
    - "$TAG" >/dev/null
echo "built $TAG"
